//! What every training task shares: the run directory (fresh or resumed), progress
//! callbacks, stop requests (Ctrl-C, a step budget), and the files of named tensors with a
//! format tag that every checkpoint and weight file is.
//!
//! The language model ([`crate::lm`]) and translation ([`crate::mt`]) run their loops in
//! the same order on these pieces: data, model, optimizer, then per batch step / log /
//! checkpoint, per epoch validate / keep the best / checkpoint / plot, at the end test.

use crate::average::WeightAverage;
use crate::error::{Error, Result};
use crate::metrics::{self, Metric, Weights};
use std::time::Instant;
use transformer_model::Rng;

mod setup;
mod start;
mod task;

pub use setup::*;
pub use start::*;
pub use task::*;
pub use transformer_runtime::run_dir::*;

/// Trains `task` in the run directory `opts.out` (already opened with [`open_run`]), from
/// `saved` when resuming, with the settings of the task's configuration ([`RunSettings`]):
/// a fresh run's dropout starts from `seed + 1`, and `average_decay` > 0 validates a moving
/// average of the weights beside them, updated every [`AVERAGE_EVERY`] steps.
///
/// The loop, in a fixed order: per batch, stop if asked (saving a checkpoint), one step,
/// update the average, log when due, checkpoint every `checkpoint_interval` batches; per
/// epoch, validate the trained weights and the average, keep the better as the best model,
/// checkpoint, plot; at the end, test the best model.
pub fn run<T: Task, C>(
    task: &mut T,
    opts: &RunOptions<C>,
    saved: Option<Saved>,
    progress: &mut dyn Progress,
) -> Result<RunSummary> {
    let run = &opts.out;
    let settings = task.config().settings();
    let mut average = if settings.average_decay > 0.0 {
        let trained = task.trained();
        Some(WeightAverage::new(
            &trained.params,
            settings.average_decay,
            AVERAGE_EVERY,
            |pb| trained.config.build(pb),
        )?)
    } else {
        None
    };
    let mut state = RunState::new(settings.seed.wrapping_add(1));
    if let Some(mut saved) = saved {
        let path = checkpoint_path(run);
        match &mut average {
            Some(avg) => avg.restore(&mut saved.tensors, saved.state.step, &path)?,
            None => {
                crate::average::take_average(&mut saved.tensors);
            }
        }
        if let Some(adam) = task.adam() {
            adam.restore_checkpoint_state(&mut saved.tensors, &saved.meta, &path)?;
        }
        task.trained()
            .params
            .assign(&saved.tensors)
            .map_err(|e| Error::Checkpoint {
                path: path.clone(),
                msg: e.to_string(),
            })?;
        state = saved.state;
        if opts.dist.writes() {
            match state.metrics_records {
                Some(n) => metrics::truncate_to(&metrics_path(run), n)?,
                // Checkpoints written before the count was kept.
                None => metrics::truncate_after(&metrics_path(run), state.step)?,
            }
        }
        // A best figure of another measure than this run selects by is not comparable: the
        // next validation starts the record afresh.
        let selection = task.selection();
        let by = state.best_by.clone().unwrap_or_else(|| match selection {
            // Before chrF selection existed, a translation run's figure was BLEU.
            Selection::HigherScore(metrics::ScoreMetric::Chrf) => "bleu".into(),
            s => s.key().into(),
        });
        if by != selection.key() && state.best.is_some() {
            progress.line(&format!(
                "resume: the best model so far was chosen by validation {by}, this run chooses                  by {}: the next validation sets the record afresh",
                selection.key()
            ));
            state.best = None;
            state.best_trained = None;
        }
        let done = state.epoch - 1;
        check_epochs(run, &state, settings.epochs)?;
        if state.finished && state.epoch <= settings.epochs {
            state.finished = false;
            progress.line(&format!(
                "resume: the run was finished after {done} epochs; training to epoch {}, \
                 then testing again",
                settings.epochs
            ));
        }
        progress.line(&format!(
            "resuming {} at epoch {} batch {} (step {})",
            run.display(),
            state.epoch,
            state.next_batch,
            state.step
        ));
    }
    let dist = &opts.dist;
    let writer = dist.writes();
    // Batches per optimizer step: the run's, kept on resume whatever the processes.
    let per_rank = settings.accumulate.max(1);
    let global = per_rank * dist.size();
    check_global_batch(run, &state, per_rank, dist)?;
    state.global_batch = (global > 1).then_some(global);
    if dist.size() > 1 {
        let fix = "start every rank with the same command, files and environment";
        dist.check_same(
            "configuration",
            crate::dist::hash_bytes(task.config().to_toml().as_bytes()),
            fix,
        )?;
        dist.check_same("training data", task.data_hash(), fix)?;
        let vars = task.trained().params.vars();
        dist.check_same("initial weights", crate::dist::hash_vars(&vars)?, fix)?;
        dist.check_same(
            "run state",
            crate::dist::hash_bytes(serde_json::to_string(&state).unwrap_or_default().as_bytes()),
            "every rank must read the same checkpoint (a run directory on a shared file system)",
        )?;
        progress.line(&format!(
            "data parallel: {} processes, {per_rank} batch(es) each per step: global batch of \
             {global} batches; start weights, configuration and data agree on every rank",
            dist.size()
        ));
    } else if global > 1 {
        progress.line(&format!(
            "accumulate: {global} batches' gradients per optimizer step (global batch of {global} batches)"
        ));
    }
    let mut acc =
        (global > 1).then(|| crate::dist::Accumulator::new(&task.trained().params.vars()));
    let rng = Rng::from_state(state.rng.0, state.rng.1);
    let mut step_losses = Vec::new();
    let stopped = |state: RunState, step_losses: Vec<f64>| RunSummary {
        state,
        test_loss: None,
        step_losses,
    };
    let mut comm_seconds = 0.0;
    let mut stop_voted = false;

    while state.epoch <= settings.epochs {
        let epoch = state.epoch;
        let batches = task.start_epoch(epoch)?;
        let epoch_start = Instant::now();
        let mut log_start = Instant::now();
        let mut index = state.next_batch;
        while index < batches {
            let taken = step_losses.len();
            if opts.crash_after_steps == Some(taken) {
                return Ok(stopped(state, step_losses));
            }
            let asked = if acc.is_some() {
                stop_voted
            } else {
                opts.interrupted()
            };
            if opts.stop_after_steps == Some(taken) || asked {
                if writer {
                    save_run_checkpoint(run, task, average.as_ref(), &mut state)?;
                }
                progress.line(&format!(
                    "stopped: checkpoint saved after step {}",
                    state.step
                ));
                return Ok(stopped(state, step_losses));
            }
            let (s, last, weight) = match &mut acc {
                None => {
                    let (mut grads, s) = task.backward(index, &rng)?;
                    task.update(&mut grads, state.step)?;
                    (s, index, 1.0)
                }
                Some(acc) => {
                    let end = (index + global).min(batches);
                    let tokens: usize = (index..end).map(|i| task.batch_tokens(i)).sum();
                    acc.clear();
                    for i in
                        crate::dist::local_batches(index, batches, global, per_rank, dist.rank())
                    {
                        let r = crate::dist::micro_rng(state.rng.0, state.step, i - index);
                        let (mut grads, s) = task.backward(i, &r)?;
                        acc.add(&mut grads, s.tokens, s.loss, s.nll)?;
                    }
                    acc.vote_stop(opts.interrupted());
                    let mut r = acc.reduce(dist, tokens)?;
                    comm_seconds += r.seconds;
                    stop_voted = r.stop;
                    task.update(&mut r.grads, state.step)?;
                    let (loss, nll) = (r.loss, r.nll);
                    // The step counts in the log as its batches, each at the step's loss.
                    let n = (end - index) as f64;
                    state.log_batches += end - index - 1;
                    (StepStats { loss, nll, tokens }, end - 1, n)
                }
            };
            step_losses.push(s.loss);
            state.step += 1;
            if let Some(avg) = &mut average {
                avg.after_step(state.step, &task.trained().params)?;
            }
            state.next_batch = last + 1;
            state.rng = rng.state();
            state.log_loss_sum += s.loss * weight;
            state.log_nll_sum += s.nll * weight;
            state.log_batches += 1;
            state.log_tokens += s.tokens;
            progress.batch(epoch, last + 1, batches);
            crate::checkpoint::test_pause("TRANSFORMER_TEST_STEP_DELAY_MS");
            let log_due = (index..=last).any(|i| task.log_due(i, batches));
            if log_due {
                let seconds = log_start.elapsed().as_secs_f64();
                let (mut line, metric) = task.log_line(&LogWindow {
                    epoch,
                    index: last,
                    batches,
                    step: state.step,
                    loss_sum: state.log_loss_sum,
                    nll_sum: state.log_nll_sum,
                    count: state.log_batches,
                    tokens: state.log_tokens,
                    seconds,
                    per_step: global,
                });
                if dist.size() > 1 {
                    line.push_str(&format!(
                        " | tok/s per rank {:.0} | comm wait {:.0}%",
                        state.log_tokens as f64 / dist.size() as f64 / seconds.max(1e-9),
                        100.0 * comm_seconds / seconds.max(1e-9)
                    ));
                }
                comm_seconds = 0.0;
                progress.line(&line);
                if writer {
                    metrics::append(&metrics_path(run), &metric)?;
                }
                state.log_loss_sum = 0.0;
                state.log_nll_sum = 0.0;
                state.log_batches = 0;
                state.log_tokens = 0;
                log_start = Instant::now();
            }
            let every = settings.checkpoint_interval;
            if writer && every > 0 && (index..=last).any(|i| (i + 1).is_multiple_of(every)) {
                save_run_checkpoint(run, task, average.as_ref(), &mut state)?;
            }
            index = last + 1;
        }

        // Validation of the trained weights and of their average (split across the
        // processes); the better is the best model, kept by rank 0.
        let train_seconds = epoch_start.elapsed().as_secs_f64();
        let mut validated = vec![(Weights::Sgd, task.validate(&task.trained().model, dist)?)];
        if let Some(avg) = &average {
            validated.push((Weights::Average, task.validate(&avg.model, dist)?));
        }
        // Every process keeps the same record of the best (the test reads it); the writing
        // process alone logs and saves.
        let seconds = epoch_start.elapsed().as_secs_f64();
        if writer {
            let end = EpochEnd {
                epoch,
                seconds,
                train_seconds,
                validated: &validated,
            };
            for line in task.epoch_lines(&end) {
                progress.line(&line);
            }
        }
        for &(weights, v) in &validated {
            if writer {
                metrics::append(
                    &metrics_path(run),
                    &Metric::Valid {
                        step: state.step,
                        epoch,
                        loss: v.loss,
                        ppl: v.loss.exp(),
                        epoch_seconds: seconds,
                        weights,
                        scores: metrics::Scores::of(v.score),
                    },
                )?;
            }
            let params = match weights {
                Weights::Sgd => &task.trained().params,
                Weights::Average => &average.as_ref().expect("validated").params,
            };
            let selection = task.selection();
            let figure = selection.figure(&v);
            if let Some(file) = T::BEST_TRAINED_FILE {
                if average.is_some()
                    && weights == Weights::Sgd
                    && state
                        .best_trained
                        .is_none_or(|b| selection.better(figure, b))
                {
                    state.best_trained = Some(figure);
                    if writer {
                        task.trained().config.save(&run.join(file), params)?;
                    }
                }
            }
            if state.best.is_none_or(|b| selection.better(figure, b)) {
                state.best = Some(figure);
                state.best_by = Some(selection.key().into());
                state.best_weights = weights;
                state.best_epoch = epoch;
                if writer {
                    task.trained().config.save(&best_path(run), params)?;
                }
            }
        }
        state.epoch += 1;
        state.next_batch = 0;
        state.log_loss_sum = 0.0;
        state.log_nll_sum = 0.0;
        state.log_batches = 0;
        state.log_tokens = 0;
        if writer {
            save_run_checkpoint(run, task, average.as_ref(), &mut state)?;
            metrics::plot_svg(&metrics::read(&metrics_path(run))?, &run.join("loss.svg"))?;
        }
    }

    // Every process tests its share of the best model, which the writing process has just
    // saved: wait for it.
    dist.barrier();
    let (records, test_loss) = task.test(TestRun {
        run,
        state: &state,
        progress,
        dist,
    })?;
    if !writer {
        return Ok(stopped(state, step_losses));
    }
    if !state.finished {
        for m in &records {
            metrics::append(&metrics_path(run), m)?;
        }
        state.finished = true;
        save_run_checkpoint(run, task, average.as_ref(), &mut state)?;
    }
    metrics::plot_svg(&metrics::read(&metrics_path(run))?, &run.join("loss.svg"))?;
    Ok(RunSummary {
        state,
        test_loss,
        step_losses,
    })
}
