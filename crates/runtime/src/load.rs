//! Loading a trained translation run ([`load_run`]): its tokenizer, configuration and
//! weights (best, int8 or the latest checkpoint's).

use crate::config::MtTrainConfig;
use crate::error::{Error, Result};
use crate::model::{MtModel, MtModelConfig};
use crate::run_dir::{
    self as runner, best_path, config_path, load_tagged, meta_json, AVERAGE_PREFIX,
};
use candle_core::{DType, Device};
use std::path::{Path, PathBuf};
use transformer_model::{ParamBuilder, Params};
use transformer_text::subword::{Subword, TextTokenizer};

/// Format tag of translation checkpoints.
pub const CHECKPOINT_FORMAT: &str = "transformer-mt-checkpoint/1";
/// Format tag of translation weight files.
pub const WEIGHTS_FORMAT: &str = "transformer-mt-weights/1";

/// `tokenizer.json` in the run directory `run`: the run's tokenizer.
pub fn tokenizer_path(run: &Path) -> PathBuf {
    run.join("tokenizer.json")
}

/// A trained translation model loaded from a run directory.
pub struct LoadedMt {
    /// The model, ready to translate.
    pub model: MtModel,
    /// Its parameters.
    pub params: Params,
    /// The run's training configuration (`config.toml`).
    pub config: MtTrainConfig,
    /// The model's configuration: the best weights' own, or derived from `config` when the
    /// weights come from a checkpoint.
    pub model_config: MtModelConfig,
    /// The run's tokenizer (`tokenizer.json`), for both languages.
    pub tokenizer: Subword,
    /// What the front end should tell the user about where the weights came from: set
    /// when there is no `best.safetensors` yet and the checkpoint's weights are used.
    pub note: Option<String>,
}

/// Loads a run's best weights (or its latest checkpoint's, before the first epoch ends).
pub fn load_run(run: &Path, device: &Device) -> Result<LoadedMt> {
    runner::check_run_exists(run, "`transformer mt train --out DIR`")?;
    if !tokenizer_path(run).exists() {
        let hint = if run.join("vocab.txt").exists() {
            " (it holds vocab.txt: a language-model run; use `transformer lm` with it)"
        } else {
            ""
        };
        return Err(Error::Usage(format!(
            "{}: no tokenizer.json, so not a translation run{hint}",
            run.display()
        )));
    }
    let tokenizer = Subword::load(&tokenizer_path(run))?;
    let config = MtTrainConfig::from_toml_file(&config_path(run))?;
    let (path, note) = runner::weights_file(run);
    if !path.exists() {
        return Err(Error::Usage(format!(
            "{}: no best.safetensors or checkpoint.safetensors yet",
            run.display()
        )));
    }
    let advise = |e| runner::with_fallback_advice(e, run, &path);
    let mut int8 = false;
    let (tensors, model_config) = if path == best_path(run) {
        let (tensors, meta) = crate::quantize::load_any(&path, device).map_err(advise)?;
        if crate::quantize::is_int8(&meta) {
            // A run written by `transformer mt quantize`: decoded in int8.
            int8 = true;
            (
                crate::quantize::dequantize(&path, tensors)?,
                meta_json(&path, &meta, "model")?,
            )
        } else {
            runner::check_format(&path, &meta, WEIGHTS_FORMAT).map_err(advise)?;
            (tensors, meta_json(&path, &meta, "model")?)
        }
    } else {
        let (mut tensors, _) = load_tagged(&path, CHECKPOINT_FORMAT, device)?;
        tensors.retain(|n, _| !n.starts_with("adam.") && !n.starts_with(AVERAGE_PREFIX));
        (tensors, config.model_config(tokenizer.vocab_size()))
    };
    let pb = ParamBuilder::new(DType::F32, device, 0);
    let mut model = MtModel::build(&pb, &model_config)?;
    let params = pb.params();
    params.assign(&tensors).map_err(|e| Error::Checkpoint {
        path: path.clone(),
        msg: e.to_string(),
    })?;
    if int8 {
        model.set_decode_precision(transformer_model::DecodePrecision::Int8 {
            output_layer: true,
        })?;
    }
    Ok(LoadedMt {
        model,
        params,
        config,
        model_config,
        tokenizer,
        note,
    })
}
