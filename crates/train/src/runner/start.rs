//! How a run starts ([`train`]): the runner opens the run directory, reads the run's own
//! tokenizer back on resume, asks the task for its data, settles the precision and builds the
//! model, writes a fresh run's files, and hands the task its model; the task supplies the
//! hooks ([`Setup`]).

use super::*;
use crate::error::Result;
use std::path::Path;

/// A tokenizer a run keeps in its directory: a fresh run writes the one its data was
/// encoded with, a resumed run reads it back (and never makes another).
pub trait RunTokenizer: Sized {
    /// Reads the tokenizer of the run directory `run`.
    fn load_from(run: &Path) -> Result<Self>;
    /// Writes it into the run directory `run`.
    fn save_in(&self, run: &Path) -> Result<()>;
}

/// Implements [`RunTokenizer`] for a tokenizer type with `load(&Path)` and `save(&self,
/// &Path)`, kept in the run directory at `$path(run)`.
macro_rules! run_tokenizer_file {
    ($tokenizer:ty, $path:path) => {
        impl $crate::runner::RunTokenizer for $tokenizer {
            fn load_from(run: &std::path::Path) -> $crate::error::Result<Self> {
                Ok(<$tokenizer>::load(&$path(run))?)
            }
            fn save_in(&self, run: &std::path::Path) -> $crate::error::Result<()> {
                Ok(self.save(&$path(run))?)
            }
        }
    };
}
pub(crate) use run_tokenizer_file;

/// A task without a tokenizer (the copy task's symbols are its ids): nothing to keep.
impl RunTokenizer for () {
    fn load_from(_run: &Path) -> Result<()> {
        Ok(())
    }
    fn save_in(&self, _run: &Path) -> Result<()> {
        Ok(())
    }
}

/// The model a task asks the runner to build ([`Setup::model`]).
pub struct ModelPlan<M> {
    /// Its configuration.
    pub config: M,
    /// The output layer that decides whether bf16 pays here; `None`: train in the
    /// configuration's precision as it is.
    pub probe: Option<PrecisionProbe>,
    /// Without a probe, what the log says about the precision, if anything.
    pub precision_note: Option<String>,
}

impl<M> ModelPlan<M> {
    /// A model that trains in its configuration's precision, with nothing to log about it.
    pub fn new(config: M) -> Self {
        Self {
            config,
            probe: None,
            precision_note: None,
        }
    }
}

/// The start of a run as the runner asks a task for it ([`train`]): first its data (with
/// the run's own tokenizer when resuming), then the model to build for that data, then the
/// task itself around the built model. Everything else (the run directory, resume,
/// precision, seeding, `config.toml`, the tokenizer's file) is the runner's.
pub trait Setup {
    /// The task it starts.
    type Task: Task;
    /// The tokenizer the run keeps in its directory (`()` for none).
    type Tokenizer: RunTokenizer;
    /// What the task reads before its model is built: its data, encoded, with the tokenizer
    /// that encoded it ([`Self::tokenizer`]).
    type Data;

    /// Reads the task's data and encodes it: with `tokenizer`, the run's own, when resuming
    /// (`Some` exactly then); else with the one the task makes (from the data) or takes
    /// (from a model it starts from). May settle `config` (resolved paths, inherited
    /// settings) and log what it read. What else of the invocation it needs, the task's
    /// setup was made with.
    fn data(
        &mut self,
        config: &mut <Self::Task as Task>::Config,
        tokenizer: Option<Self::Tokenizer>,
        progress: &mut dyn Progress,
    ) -> Result<Self::Data>;

    /// The tokenizer `data` was encoded with (a fresh run writes it).
    fn tokenizer(data: &Self::Data) -> &Self::Tokenizer;

    /// The model to build for `data`.
    fn model(
        &self,
        config: &<Self::Task as Task>::Config,
        data: &Self::Data,
    ) -> Result<ModelPlan<<Self::Task as Task>::ModelConfig>>;

    /// Log lines about the built model, printed before its precision's (none by default).
    fn model_lines(
        &self,
        _config: &<Self::Task as Task>::Config,
        _trained: &Trained<<Self::Task as Task>::ModelConfig>,
    ) -> Vec<String> {
        Vec::new()
    }

    /// The task around its built model (fresh weights, or a resumed run's that the runner
    /// assigns next).
    fn task(
        self,
        config: <Self::Task as Task>::Config,
        data: Self::Data,
        trained: Trained<<Self::Task as Task>::ModelConfig>,
        device: &candle_core::Device,
    ) -> Result<Self::Task>;
}

/// Trains (or resumes) a task in the run directory `opts.out`: opens the run ([`open_run`]),
/// reads a resumed run's tokenizer, asks `setup` for the data and the model, settles the
/// precision and builds the model ([`start_model`]), writes a fresh run's tokenizer, and runs
/// the loop ([`run`]). Returns the task (for what it measured at the end) and the summary.
pub fn train<S: Setup>(
    mut setup: S,
    opts: &RunOptions<<S::Task as Task>::Config>,
    progress: &mut dyn Progress,
) -> Result<(S::Task, RunSummary)> {
    let run = &opts.out;
    let opened = open_run(opts, <S::Task as Task>::CHECKPOINT_FORMAT, progress)?;
    let (resuming, _lock) = (opened.resuming, opened.lock);
    let (mut config, saved) = (opened.config, opened.saved);
    let own = match resuming {
        true => Some(S::Tokenizer::load_from(run)?),
        false => None,
    };
    let data = setup.data(&mut config, own, progress)?;
    let plan = setup.model(&config, &data)?;
    let started = start_model(opts, resuming, &mut config, plan.config, plan.probe)?;
    if started.fresh {
        S::tokenizer(&data).save_in(run)?;
    }
    for line in setup.model_lines(&config, &started.trained) {
        progress.line(&line);
    }
    if let Some(line) = started.precision_line.or(plan.precision_note) {
        progress.line(&line);
    }
    let mut task = setup.task(config, data, started.trained, &opts.device)?;
    let summary = super::run(&mut task, opts, saved, progress)?;
    Ok((task, summary))
}
