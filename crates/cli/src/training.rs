//! The flow every training command shares (`lm train`, `mt train`): start the processes (one,
//! or an MPI job's), resolve the configuration, catch Ctrl-C and SIGTERM, show progress on
//! the writing process only, say how to resume a stopped run, and end every process together.

use crate::console::{exit_if_interrupted, interrupt_flag, Console, Quiet};
use anyhow::Result;
use candle_core::Device;
use std::path::Path;
use transformer_train::runner::{Given, Progress, RunOptions};

/// The flags every training command takes for how this invocation runs (not the run's
/// configuration): where to stop, where the log goes too.
#[derive(clap::Args, Debug, Clone)]
pub struct InvocationArgs {
    /// Stop after this many steps in this invocation (continue later with --resume).
    #[arg(long)]
    pub max_steps: Option<usize>,
    /// Append the training log to this file too (created if missing), beside stdout. The
    /// log on stdout is a view of the run, not its work: when stdout is closed (a `| head`
    /// or `less` that quit), training goes on and this file keeps the whole log.
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<std::path::PathBuf>,
}

/// The command line's part of a training command.
pub(crate) struct TrainCommand<'a> {
    /// The subcommand's group, as the resume line names it (`lm`, `mt`).
    pub name: &'a str,
    /// `--out`.
    pub out: &'a Path,
    /// `--resume`.
    pub resume: bool,
    /// `--max-steps`.
    pub max_steps: Option<usize>,
    /// Print the run directory at the end.
    pub show_run_dir: bool,
    /// `--log-file`: the log is appended there too.
    pub log_file: Option<&'a Path>,
}

/// What a task's training returned, for the command's last lines.
pub(crate) struct Trained {
    /// The run stopped before its end (Ctrl-C, SIGTERM, `--max-steps`) after this many steps,
    /// as the resume line counts them; `None`: it finished.
    pub stopped_after: Option<usize>,
}

/// Runs one training command: `resolve` gives the configuration and the settings the user
/// gave, `train` trains with the options built from them and the progress to report to.
pub(crate) fn run<C>(
    cmd: TrainCommand<'_>,
    device: Device,
    resolve: impl FnOnce() -> Result<(C, Vec<Given>)>,
    train: impl FnOnce(&RunOptions<C>, &mut dyn Progress) -> Result<Trained>,
) -> Result<()> {
    let procs = crate::dist::Processes::start()?;
    let dist = procs.dist.clone();
    let r = (|| -> Result<()> {
        let (config, given) = resolve()?;
        anyhow::ensure!(
            cmd.max_steps != Some(0),
            "--max-steps must be at least 1 (it stops this invocation after that many steps)"
        );
        let interrupt = interrupt_flag();
        let prints = dist.writes();
        let ranks = dist.clone();
        let opts = RunOptions {
            config,
            out: cmd.out.to_path_buf(),
            resume: cmd.resume,
            stop_after_steps: cmd.max_steps,
            crash_after_steps: None,
            dist,
            interrupt: Some(interrupt.clone()),
            device,
            given,
        };
        // The log file is the writing process's, as stdout is.
        let mut console = Console::new("batches").with_log_file(cmd.log_file.filter(|_| prints))?;
        let mut quiet = Quiet;
        let progress: &mut dyn Progress = if prints { &mut console } else { &mut quiet };
        let trained = train(&opts, progress);
        console.finish();
        let trained = trained?;
        if prints {
            if let Some(steps) = trained.stopped_after {
                console.line(&format!(
                    "stopped after {steps} steps; continue with: transformer {} train --out {} --resume",
                    cmd.name,
                    cmd.out.display()
                ));
            }
            if cmd.show_run_dir {
                console.line(&format!("run directory: {}", cmd.out.display()));
            }
        }
        exit_if_interrupted(&interrupt, &ranks);
        Ok(())
    })();
    procs.finish(r)
}
