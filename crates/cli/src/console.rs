//! What a command shows while it works, and how it stops: log lines on stdout (and in
//! `--log-file`), the progress bar with ETA on stderr, warnings, and Ctrl-C / SIGTERM.

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use transformer_train::runner::Progress;

/// A progress that prints nothing (the ranks of an MPI job other than 0).
pub(crate) struct Quiet;

impl Progress for Quiet {
    fn line(&mut self, _line: &str) {}
}

/// Log lines to stdout; a progress bar with ETA on stderr when it is a terminal.
pub(crate) struct Console {
    pub(crate) bar: Option<ProgressBar>,
    /// `--log-file`: every log line is appended here too.
    log_file: Option<(PathBuf, std::fs::File)>,
    /// Standard output was closed by its reader (`| head`): log lines go on to the log file
    /// only, and training goes on.
    stdout_closed: bool,
}

impl Console {
    /// A console whose bar counts `unit` ("batches", "sentences").
    pub(crate) fn new(unit: &str) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(0);
            bar.set_style(
                ProgressStyle::with_template(&format!(
                    "{{msg}} [{{bar:40}}] {{pos}}/{{len}} {unit}, {{per_sec}}, eta {{eta}}"
                ))
                .expect("valid template")
                .progress_chars("=> "),
            );
            bar
        });
        Self {
            bar,
            log_file: None,
            stdout_closed: false,
        }
    }

    /// A console that also appends every log line to `path` (created if missing), the
    /// training commands' `--log-file`.
    pub(crate) fn with_log_file(mut self, path: Option<&Path>) -> Result<Self> {
        if let Some(path) = path {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("--log-file {}", path.display()))?;
            self.log_file = Some((path.to_path_buf(), file));
        }
        Ok(self)
    }

    /// Removes the bar.
    pub(crate) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Progress for Console {
    /// Prints `line` on stdout and appends it to the log file. The log is not the work: a
    /// stdout its reader has closed (`| head`, a `less` quit early) or a log file that
    /// cannot be written is said once on stderr and left, and training goes on.
    fn line(&mut self, line: &str) {
        if !self.stdout_closed {
            let closed = &mut self.stdout_closed;
            let logged_elsewhere = self.log_file.as_ref().map(|(p, _)| p.clone());
            let mut print = || {
                if let Err(e) = print_line(line) {
                    *closed = true;
                    let rest = match &logged_elsewhere {
                        Some(p) => format!("the log goes on in {}", p.display()),
                        None => "the log is no longer shown (--log-file PATH keeps it)".into(),
                    };
                    say_on_stderr(&format!(
                        "warning: cannot write the log to standard output ({e}); training goes \
                         on and {rest}"
                    ));
                }
            };
            match &self.bar {
                Some(bar) => bar.suspend(print),
                None => print(),
            }
        }
        if let Some((path, file)) = &mut self.log_file {
            use std::io::Write;
            if let Err(e) = writeln!(file, "{line}").and_then(|_| file.flush()) {
                say_on_stderr(&format!(
                    "warning: cannot write the log to {} ({e}); training goes on without it",
                    path.display()
                ));
                self.log_file = None;
            }
        }
    }

    fn batch(&mut self, epoch: usize, done: usize, total: usize) {
        if let Some(bar) = &self.bar {
            if bar.length() != Some(total as u64) {
                bar.set_length(total as u64);
            }
            bar.set_message(format!("epoch {epoch}"));
            bar.set_position(done as u64);
        }
    }
}

/// Writes `line` and a newline to stdout, an error (a closed pipe) returned, never a panic
/// as `println!` would.
pub(crate) fn print_line(line: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|_| out.flush())
}

/// Writes a line to stderr, ignoring a stderr that is closed too (`2>&1 | head`).
pub(crate) fn say_on_stderr(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// A flag set by the first Ctrl-C (training then checkpoints and stops after the current
/// batch); a second Ctrl-C exits at once.
pub(crate) fn interrupt_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    let installed = ctrlc::set_handler(move || {
        if f.swap(true, Ordering::SeqCst) {
            eprintln!("\ninterrupted twice: exiting without a new checkpoint");
            std::process::exit(130);
        }
        eprintln!(
            "\ninterrupt: saving a checkpoint after this batch (Ctrl-C again to quit now; \
             SIGTERM, from a scheduler or mpirun, does the same)"
        );
    });
    if let Err(e) = installed {
        eprintln!("warning: cannot catch Ctrl-C ({e}); an interrupt loses the batches since the last checkpoint");
    }
    flag
}

/// Prints a loaded run's note (weights taken from the checkpoint) as a warning.
pub(crate) fn warn_note(note: &Option<String>) {
    if let Some(n) = note {
        eprintln!("warning: {n}");
    }
}

/// At the end of a training command: with several processes, waits until every one has come
/// here (rank 0 has saved and said how to resume; the first process to exit with a failure
/// status makes `mpirun` end the others); then, after a run stopped by Ctrl-C or SIGTERM,
/// exits with status 130 as an interrupted command does.
pub(crate) fn exit_if_interrupted(flag: &AtomicBool, dist: &transformer_train::dist::Dist) {
    dist.barrier();
    if flag.load(Ordering::SeqCst) {
        std::process::exit(130);
    }
}
