//! Progress callbacks, run options, and the configuration of a fresh or resumed run.

use super::*;
use crate::error::{Error, Result};
use candle_core::Device;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// How to run a task's training: its configuration, the run directory, and when to stop.
#[derive(Debug, Clone)]
pub struct RunOptions<C> {
    /// The task's configuration (ignored when resuming: the checkpoint's is used).
    pub config: C,
    /// The run directory.
    pub out: PathBuf,
    /// Continue the run in `out` from its checkpoint.
    pub resume: bool,
    /// Stop after this many optimizer steps in this invocation, saving a checkpoint
    /// (`--resume` continues exactly there).
    pub stop_after_steps: Option<usize>,
    /// Stop after this many steps without saving, as a killed process would (tests: resume
    /// then starts from the last periodic checkpoint).
    pub crash_after_steps: Option<usize>,
    /// When set (by a Ctrl-C handler, say), save a checkpoint after the current batch and
    /// return; `--resume` continues from there.
    pub interrupt: Option<Arc<AtomicBool>>,
    /// The device the model is built and trained on.
    pub device: Device,
    /// The settings of `config` the user gave for this invocation (flags, keys of a
    /// `--config` file), as opposed to defaults. On resume each is compared with the run's
    /// own configuration: one that may change on resume takes effect and the log says so, one
    /// that may not is an error ([`resume_config`]).
    pub given: Vec<Given>,
    /// The processes the run trains in ([`crate::dist`]): one by default; with several,
    /// rank 0 alone writes the run's files.
    pub dist: crate::dist::Dist,
}

/// A setting given for this invocation: its configuration key and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Given {
    /// The configuration key (`d_model`).
    pub key: String,
    /// Where it was given, as the user wrote it (`--d-model`, `d_model in --config x.toml`).
    pub from: String,
}

impl Given {
    /// A setting given as the flag `from`.
    pub fn new(key: &str, from: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            from: from.into(),
        }
    }

    /// The keys of the TOML file `path` (a `--config` file), each given as `KEY in --config
    /// PATH`.
    pub fn from_config_file(path: &Path) -> Result<Vec<Given>> {
        let table: toml::Table = read_toml_file(path)?;
        Ok(table
            .keys()
            .map(|k| Given::new(k, format!("{k} in --config {}", path.display())))
            .collect())
    }
}

/// A configuration as a TOML table, key by key as `config.toml` holds it (empty if it does
/// not serialize to a table), for comparing and merging settings by key.
pub fn toml_table<C: Serialize>(c: &C) -> toml::Table {
    match toml::Value::try_from(c) {
        Ok(toml::Value::Table(t)) => t,
        _ => toml::Table::new(),
    }
}

/// The configuration a resumed run continues with: the run's own (`saved`), with each
/// setting of `given` taken from `asked` where it differs and `may_change` lists it (the log
/// lines returned say what changed). A differing setting that may not change on resume is an
/// error listing every such setting, the run's value and what to do.
pub fn resume_config<C: Serialize + serde::de::DeserializeOwned>(
    run: &Path,
    saved: &C,
    asked: &C,
    given: &[Given],
    may_change: &[&str],
) -> Result<(C, Vec<String>)> {
    let (mut merged, asked) = (toml_table(saved), toml_table(asked));
    let show = |v: Option<&toml::Value>| v.map_or("none".to_string(), |v| v.to_string());
    let (mut notes, mut conflicts) = (Vec::new(), Vec::new());
    let mut seen = std::collections::HashSet::new();
    for g in given {
        if !seen.insert(&g.key) {
            continue;
        }
        let (old, new) = (merged.get(&g.key).cloned(), asked.get(&g.key).cloned());
        if old == new {
            continue;
        }
        if may_change.contains(&g.key.as_str()) {
            notes.push(format!(
                "resume: {} changes {} from {} to {}",
                g.from,
                g.key,
                show(old.as_ref()),
                show(new.as_ref())
            ));
            match new {
                Some(v) => merged.insert(g.key.clone(), v),
                None => merged.remove(&g.key),
            };
        } else {
            conflicts.push(format!(
                "  {}: {} (the run has {} = {})",
                g.from,
                show(new.as_ref()),
                g.key,
                show(old.as_ref())
            ));
        }
    }
    if !conflicts.is_empty() {
        return Err(Error::Usage(format!(
            "{}: --resume continues the run as it was configured, and these settings cannot \
             change on resume:\n{}\nDrop them (or give the run's values) to resume, or start a \
             new run with another --out. What may change on resume: {}.",
            run.display(),
            conflicts.join("\n"),
            may_change.join(", ")
        )));
    }
    let c = toml::Value::Table(merged)
        .try_into()
        .map_err(|e: toml::de::Error| Error::Config {
            path: config_path(run),
            msg: e.to_string(),
        })?;
    Ok((c, notes))
}

/// Checks, on resume, that the files a run's configuration names exist: `paths` are
/// `(key, path)`; one missing and not given again for this invocation is an error that says
/// it comes from the run's `config.toml` and how to point elsewhere.
pub fn check_recorded_paths(
    run: &Path,
    paths: &[(&str, &Option<PathBuf>)],
    given: &[Given],
) -> Result<()> {
    for (key, p) in paths {
        let Some(p) = p else { continue };
        if p.exists() || given.iter().any(|g| g.key == *key) {
            continue;
        }
        return Err(Error::Usage(format!(
            "{}: no such file or folder; the run's configuration ({}) names it as {key}: if it \
             moved, pass --{} PATH again with --resume (the data's location may change on \
             resume)",
            p.display(),
            config_path(run).display(),
            key.replace('_', "-")
        )));
    }
    Ok(())
}

impl<C> RunOptions<C> {
    /// Whether the interrupt flag is raised.
    pub fn interrupted(&self) -> bool {
        self.interrupt
            .as_ref()
            .is_some_and(|f| f.load(Ordering::SeqCst))
    }
}

/// Optimizer steps between updates of the weight average: each update is one pass over all
/// the weights (2 reads, 1 write of every parameter, several ms for 12 M floats on a 2-core
/// machine), and a horizon of thousands of steps loses nothing by sampling every fourth
/// iterate.
pub const AVERAGE_EVERY: usize = 4;

/// A run directory opened for training by [`open_run`].
pub struct OpenedRun<C> {
    /// Whether the run continues from its checkpoint.
    pub resuming: bool,
    /// The configuration it trains with: the asked one for a fresh run; for a resumed run its
    /// own, with the settings that may change taken from the invocation.
    pub config: C,
    /// The checkpoint a resumed run continues from.
    pub saved: Option<Saved>,
    /// The run directory's lock, held by the writing process while the run trains.
    pub lock: Option<RunLock>,
}

/// A fresh run's start on the writing process: its configuration as training will use it
/// (`config`, resolved) as `config.toml`, and no `metrics.jsonl` left by an earlier attempt
/// that never reached a checkpoint; a resumed run keeps its own. Returns whether it wrote
/// them, for the task's own files of a fresh run.
pub fn write_fresh_config<C: RunConfig>(
    opts: &RunOptions<C>,
    resuming: bool,
    config: &C,
) -> Result<bool> {
    let fresh = opts.dist.writes() && !resuming;
    if fresh {
        crate::checkpoint::write_atomic(&config_path(&opts.out), config.to_toml().as_bytes())?;
        let _ = std::fs::remove_file(metrics_path(&opts.out));
    }
    Ok(fresh)
}

/// Opens `opts.out` for training: rank 0 creates and locks it (the other ranks read it); on
/// resume, loads the checkpoint (tagged `format`), takes its configuration, accepts what may
/// change from this invocation (each change a log line), checks the global batch and the
/// recorded input paths, and rewrites `config.toml` when something changed. What every task's
/// training starts with.
pub fn open_run<C: RunConfig>(
    opts: &RunOptions<C>,
    format: &str,
    progress: &mut dyn Progress,
) -> Result<OpenedRun<C>> {
    let run = &opts.out;
    let writer = opts.dist.writes();
    let (resuming, lock) = if writer {
        let (r, lock) = open_run_dir(run, opts.resume)?;
        (r, Some(lock))
    } else {
        (opts.resume, None)
    };
    let mut asked = opts.config.clone();
    asked.make_paths_absolute();
    if !resuming {
        return Ok(OpenedRun {
            resuming,
            config: asked,
            saved: None,
            lock,
        });
    }
    let saved = Saved::load(run, format, &opts.device)?;
    let text = saved.config_text(run)?;
    let mut own: C = toml::from_str(text).map_err(|e| Error::Checkpoint {
        path: checkpoint_path(run),
        msg: e.to_string(),
    })?;
    if predates_averaging(text) {
        own.without_averaging();
    }
    let may_change: Vec<&str> = RUNNER_MAY_CHANGE
        .iter()
        .chain(C::MAY_CHANGE_ON_RESUME)
        .copied()
        .collect();
    let (config, notes) = resume_config(run, &own, &asked, &opts.given, &may_change)?;
    // Every refusal comes before `config.toml` is rewritten: a refused resume changes
    // nothing on disk.
    check_epochs(run, &saved.state, config.settings().epochs)?;
    check_global_batch(run, &saved.state, config.settings().accumulate, &opts.dist)?;
    check_recorded_paths(run, &config.recorded_paths(), &opts.given)?;
    for n in &notes {
        progress.line(n);
    }
    if writer && !notes.is_empty() {
        crate::checkpoint::write_atomic(&config_path(run), config.to_toml().as_bytes())?;
    }
    Ok(OpenedRun {
        resuming,
        config,
        saved: Some(saved),
        lock,
    })
}

/// Refuses to resume a run that has trained more epochs than `epochs` asks for.
pub fn check_epochs(run: &Path, state: &RunState, epochs: usize) -> Result<()> {
    let done = state.epoch - 1;
    if epochs < done {
        return Err(Error::Usage(format!(
            "{}: the run has trained {done} epochs already: give --epochs {done} or more \
             to resume it",
            run.display()
        )));
    }
    Ok(())
}

/// The output layer that decides whether bf16 pays on this CPU ([`crate::precision::settle`]):
/// its rows per batch, width and vocabulary, and what bf16 covers in this task (for the log).
#[derive(Debug, Clone, Copy)]
pub struct PrecisionProbe {
    /// Rows of the output layer in one batch.
    pub rows: usize,
    /// The model width.
    pub d_model: usize,
    /// The vocabulary.
    pub vocab: usize,
    /// The products bf16 runs in, as the log names them.
    pub covers: &'static str,
}

/// A task's model about to train.
pub struct Started<M: ModelConfig> {
    /// The model, built to train in the run's settled precision.
    pub trained: Trained<M>,
    /// Whether this process wrote a fresh run's `config.toml` (then the task writes its own
    /// files of a fresh run too).
    pub fresh: bool,
    /// What to log about the precision, if anything.
    pub precision_line: Option<String>,
}

/// Starts a task's model: settles the run's training precision (a resumed run keeps its
/// own; a fresh run asking for bf16 takes it where `probe`'s output layer measures faster
/// in it, [`crate::precision::settle`]; without a probe, the configuration's as it is),
/// records it in `config`, writes a fresh run's `config.toml`
/// ([`write_fresh_config`]), and builds `model` to train in it from the run's seed: the one
/// place where a run's arithmetic is decided.
pub fn start_model<C: RunConfig, M: ModelConfig>(
    opts: &RunOptions<C>,
    resuming: bool,
    config: &mut C,
    model: M,
    probe: Option<PrecisionProbe>,
) -> Result<Started<M>> {
    let settings = config.settings();
    let (precision, precision_line) = match probe {
        Some(p) => {
            let shape = (p.rows, p.d_model, p.vocab);
            let (asked, measure) = (settings.precision, settings.measure_precision);
            let choice =
                crate::precision::settle(&opts.device, resuming, asked, measure, shape, p.covers)?;
            config.set_precision(choice.precision);
            (choice.precision, choice.line)
        }
        None => (settings.precision, None),
    };
    let fresh = write_fresh_config(opts, resuming, config)?;
    let trained = Trained::new(model, &opts.device, precision, settings.seed)?;
    Ok(Started {
        trained,
        fresh,
        precision_line,
    })
}
