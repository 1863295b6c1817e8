//! The run directory's files: paths, saving weights, loading a trained run ([`load_run`]).

use super::*;
use crate::average::CHECKPOINT_PREFIX as AVERAGE_PREFIX;
use crate::checkpoint;
use crate::error::{Error, Result};
use crate::runner::{self, check_format, RunState};
use candle_core::{DType, Device};
use std::path::{Path, PathBuf};
use transformer_model::{LmConfig, ParamBuilder, Params, TransformerLm};
use transformer_text::corpus::LineEnd;
use transformer_text::Vocab;

/// Where a run stands; saved in every checkpoint (the runner's, for every task).
pub type TrainState = RunState;

pub use crate::runner::{PrintProgress, Progress};

/// How to run [`train`].
pub type TrainOptions = crate::runner::RunOptions<LmTrainConfig>;

/// What a finished (or stopped) run reports (the test loss: mean cross-entropy, nats per
/// token).
pub type Summary = crate::runner::RunSummary;

pub use crate::runner::{best_path, checkpoint_path, config_path, metrics_path};

/// `vocab.txt` in the run directory `run`.
pub fn vocab_path(run: &Path) -> PathBuf {
    run.join("vocab.txt")
}
/// `best-sgd.safetensors` in the run directory `run`: the best SGD weights, kept apart
/// from `best.safetensors` when the weight average wins.
pub fn best_sgd_path(run: &Path) -> PathBuf {
    run.join("best-sgd.safetensors")
}

/// The default data folder: `../shared/data/wikitext-2` from the working directory, if it
/// exists.
pub fn default_data_dir() -> Option<PathBuf> {
    let p = PathBuf::from("../shared/data/wikitext-2");
    p.is_dir().then_some(p)
}

/// The language model's weight files hold its [`LmConfig`] ([`runner::ModelConfig::save`]).
impl runner::ModelConfig for LmConfig {
    type Model = TransformerLm;
    const WEIGHTS_FORMAT: &'static str = WEIGHTS_FORMAT;
    fn build(&self, pb: &ParamBuilder) -> transformer_model::Result<TransformerLm> {
        TransformerLm::new(pb, self)
    }
}

/// A trained model loaded from a run directory (its best weights, or the latest checkpoint
/// when no best model exists yet).
pub struct LoadedLm {
    /// The model, ready to evaluate or generate.
    pub model: TransformerLm,
    /// Its parameters.
    pub params: Params,
    /// Its configuration: the best weights' own, or derived from the run's configuration
    /// when the weights come from a checkpoint.
    pub config: LmConfig,
    /// The run's vocabulary (`vocab.txt`).
    pub vocab: Vocab,
    /// How the run's text was read (its `config.toml`; the newer tutorial's where there is
    /// none, as for imported models).
    pub line_end: LineEnd,
    /// What the front end should tell the user about where the weights came from: set
    /// when there is no `best.safetensors` yet and the checkpoint's weights are used.
    pub note: Option<String>,
}

/// Loads the model of the run directory `run` onto `device`: see [`LoadedLm`].
pub fn load_run(run: &Path, device: &Device) -> Result<LoadedLm> {
    runner::check_run_exists(
        run,
        "`transformer lm train --out DIR` or `transformer lm import-torch`",
    )?;
    let vocab = Vocab::load(&vocab_path(run))?;
    let line_end = if config_path(run).exists() {
        LmTrainConfig::from_toml_file(&config_path(run))?.line_end()
    } else {
        LineEnd::Dropped
    };
    let (path, note) = runner::weights_file(run);
    let format = if note.is_none() {
        WEIGHTS_FORMAT
    } else {
        CHECKPOINT_FORMAT
    };
    if !path.exists() {
        return Err(Error::Usage(format!(
            "{}: no best.safetensors or checkpoint.safetensors",
            run.display()
        )));
    }
    let (model, params, config) = load_model(&path, format, vocab.len(), device)
        .map_err(|e| runner::with_fallback_advice(e, run, &path))?;
    Ok(LoadedLm {
        model,
        params,
        config,
        vocab,
        line_end,
        note,
    })
}

/// The model in a weights file (`format` [`WEIGHTS_FORMAT`]) or a checkpoint
/// ([`CHECKPOINT_FORMAT`]; its SGD weights), checked against a vocabulary of `ntoken`.
pub(super) fn load_model(
    path: &Path,
    format: &str,
    ntoken: usize,
    device: &Device,
) -> Result<(TransformerLm, Params, LmConfig)> {
    let path = path.to_path_buf();
    let (mut tensors, meta) = checkpoint::load(&path, device)?;
    check_format(&path, &meta, format)?;
    tensors.retain(|name, _| !name.starts_with(AVERAGE_PREFIX));
    let config: LmConfig = if format == WEIGHTS_FORMAT {
        serde_json::from_str(meta.get("model").map(String::as_str).unwrap_or("")).map_err(|e| {
            Error::Checkpoint {
                path: path.clone(),
                msg: format!("model config: {e}"),
            }
        })?
    } else {
        let cfg: LmTrainConfig =
            toml::from_str(meta.get("config").map(String::as_str).unwrap_or("")).map_err(|e| {
                Error::Checkpoint {
                    path: path.clone(),
                    msg: format!("config: {e}"),
                }
            })?;
        cfg.model(ntoken)
    };
    if config.ntoken != ntoken {
        return Err(Error::Checkpoint {
            path,
            msg: format!(
                "the model has {} tokens but vocab.txt has {ntoken}",
                config.ntoken,
            ),
        });
    }
    let pb = ParamBuilder::new(DType::F32, device, 0);
    let model = TransformerLm::new(&pb, &config)?;
    let params = pb.params();
    params.assign(&tensors)?;
    Ok((model, params, config))
}
