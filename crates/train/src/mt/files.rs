//! Saving weights and loading a trained run ([`load_run`]).

use super::*;
use crate::average::CHECKPOINT_PREFIX as AVERAGE_PREFIX;
use crate::error::{Error, Result};
use crate::runner::{self, load_tagged, meta_json};
use candle_core::{DType, Device};
use std::path::Path;
use transformer_model::{ParamBuilder, Params};
use transformer_text::subword::{Subword, TextTokenizer};

/// Saves model weights with the model config needed to rebuild it.
pub fn save_weights(path: &Path, params: &Params, model: &MtModelConfig) -> Result<()> {
    runner::ModelConfig::save(model, path, params)
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
    // A tokenizer of another size than the weights' embeddings would fail mid-translation.
    let (src_vocab, tgt_vocab) = match &model_config {
        MtModelConfig::Transformer(c) => (c.src_vocab, c.tgt_vocab),
        MtModelConfig::Rnn(c) => (c.src_vocab, c.tgt_vocab),
    };
    let size = tokenizer.vocab_size();
    if src_vocab != size || tgt_vocab != size {
        return Err(Error::Usage(format!(
            "{}: tokenizer.json has {size} tokens but the weights in {} are for {src_vocab} \
             source and {tgt_vocab} target tokens: the tokenizer is not the one the run was \
             trained with (put that one back, or train anew)",
            run.display(),
            path.display()
        )));
    }
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
