//! Loading a trained translation run ([`load_run`]): its tokenizer, configuration and
//! weights (best, int8 or the latest checkpoint's).

use crate::config::MtTrainConfig;
use crate::error::{Error, Result};
use crate::model::{Alignment, EngineRules, MtModel, MtModelConfig};
use crate::run_dir::{
    self as runner, best_path, config_path, load_tagged, meta_json, AVERAGE_PREFIX,
};
use crate::vocab_map::{self, VocabMap};
use candle_core::{DType, Device};
use std::path::{Path, PathBuf};
use transformer_model::{DecodePrecision, ParamBuilder, Params};
use transformer_text::subword::{Subword, TextTokenizer};

/// Format tag of translation checkpoints.
pub const CHECKPOINT_FORMAT: &str = "transformer-mt-checkpoint/1";
/// Format tag of translation weight files.
pub const WEIGHTS_FORMAT: &str = "transformer-mt-weights/1";

/// `tokenizer.json` in the run directory `run`: the run's tokenizer.
pub fn tokenizer_path(run: &Path) -> PathBuf {
    run.join("tokenizer.json")
}

/// How a loaded model runs: the device, the decoding arithmetic and the output vocabulary.
/// It is given when the model is loaded ([`load_run`]), and the model is prepared for it
/// there, once: the choices that depend on the device (int8 decoding runs on the CPU's int8
/// kernels only) are made in that one place.
#[derive(Debug, Clone)]
pub struct Execution {
    /// Where the weights go and the arithmetic runs.
    pub device: Device,
    /// The decoding arithmetic asked for; `None`: the run's own (int8 for a run that
    /// `transformer mt quantize` wrote, f32 otherwise). Off the CPU decoding is f32 through
    /// the composed layers whatever the run's own is, and int8 asked for there is an error.
    pub decoding: Option<DecodePrecision>,
    /// Decode over each batch's candidate tokens under the run's vocabulary map
    /// ([`crate::vocab_map`], `vocab_map.json` in the run) instead of the whole vocabulary.
    pub restrict_vocab: bool,
}

impl Execution {
    /// The run as trained on `device`: its own decoding arithmetic, every output token.
    pub fn on(device: &Device) -> Self {
        Self {
            device: device.clone(),
            decoding: None,
            restrict_vocab: false,
        }
    }

    /// Refuses what `device` cannot run: int8 decoding off the CPU.
    pub fn check(&self) -> Result<()> {
        match self.decoding {
            Some(p @ DecodePrecision::Int8 { .. }) if !self.device.is_cpu() => {
                Err(Error::Usage(format!(
                    "--quantize {}: int8 decoding runs on the CPU's int8 kernels, not on {}: use \
                     --quantize none there, or --device cpu",
                    decoding_name(p),
                    device_name(&self.device)
                )))
            }
            _ => Ok(()),
        }
    }
}

/// The name of a decoding arithmetic as `--quantize` takes it: `none`, `int8`, `int8-layers`.
pub fn decoding_name(p: DecodePrecision) -> &'static str {
    match p {
        DecodePrecision::F32 => "none",
        DecodePrecision::Int8 { output_layer: true } => "int8",
        DecodePrecision::Int8 {
            output_layer: false,
        } => "int8-layers",
    }
}

/// A device as the command line names it: `cpu`, `cuda:0`.
pub fn device_name(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
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
    /// What decoding was prepared with, for the front end to print (`decoding: ...`): set
    /// when it is not plain f32 over the whole vocabulary, or differs from the run's own.
    pub decoding: Vec<String>,
}

/// Loads a run's best weights (or its latest checkpoint's, before the first epoch ends) to
/// run as `how` says ([`Execution`]).
pub fn load_run(run: &Path, how: &Execution) -> Result<LoadedMt> {
    how.check()?;
    let device = &how.device;
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
        let (tensors, meta) = crate::checkpoint::load(&path, device).map_err(advise)?;
        if crate::int8_weights::is_int8(&meta) {
            // A run written by `transformer mt quantize`: decoded in int8.
            int8 = true;
            (
                crate::int8_weights::dequantize(&path, tensors)?,
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
    let (src_size, size) = (tokenizer.source_vocab_size(), tokenizer.vocab_size());
    if src_vocab != src_size || tgt_vocab != size {
        let has = match src_size == size {
            true => format!("{size} tokens"),
            false => format!("{src_size} source and {size} target tokens"),
        };
        return Err(Error::Usage(format!(
            "{}: tokenizer.json has {has} but the weights in {} are for {src_vocab} \
             source and {tgt_vocab} target tokens: the tokenizer is not the one the run was \
             trained with (put that one back, or train anew)",
            run.display(),
            path.display()
        )));
    }
    let own = if int8 || config.published.as_ref().is_some_and(|p| p.int8) {
        DecodePrecision::Int8 { output_layer: true }
    } else {
        DecodePrecision::F32
    };
    let mut decoding = Vec::new();
    let precision = if !device.is_cpu() {
        if own != DecodePrecision::F32 {
            decoding.push(format!(
                "decoding: f32 on {} (this run decodes in int8 on the CPU; its int8 kernels do \
                 not run on a GPU)",
                device_name(device)
            ));
        }
        DecodePrecision::F32
    } else {
        how.decoding.unwrap_or(own)
    };
    // How the model runs is fixed as it is built: its decoding arithmetic, its output
    // vocabulary.
    let mut pb = ParamBuilder::new(DType::F32, device, 0).with_decoding(precision);
    let mut restricted = None;
    if how.restrict_vocab {
        let map = restricted_vocab(run, tokenizer.vocab_size())?;
        restricted = Some(format!(
            "decoding: output vocabulary restricted to each batch's candidates ({} tokens for \
             every sentence and up to {} per source token, of {})",
            map.always.len(),
            map.by_source.iter().map(Vec::len).max().unwrap_or(0),
            map.vocab
        ));
        pb = pb.with_candidates(std::sync::Arc::new(map));
    }
    // Each parameter made from its loaded tensor (no second copy of the weights).
    let pb = pb.with_values(tensors);
    let mut model = MtModel::build(&pb, &model_config)?;
    pb.assign_rest().map_err(|e| Error::Checkpoint {
        path: path.clone(),
        msg: e.to_string(),
    })?;
    let params = pb.params();
    let mut tokenizer = tokenizer;
    if let Some(p) = &config.published {
        let mut rules = EngineRules::default();
        if !p.target_prefix.is_empty() {
            // Forced as CTranslate2 forces a target prefix (an unknown token as `<unk>`),
            // and removed from the text as Argos Translate removes it.
            rules.target_prefix = tokenizer.target_ids(&p.target_prefix);
            tokenizer = tokenizer.with_strip_prefix(Some(p.target_prefix.concat()));
            decoding.push(format!(
                "decoding: every translation starts with the target prefix {:?}",
                p.target_prefix
            ));
        }
        if p.replace_unknowns {
            let shape = model_config.arch().attention_shape();
            let (layer, heads) = p.alignment(shape.0, shape.1);
            rules.replace_unknowns = Some(Alignment {
                shape,
                layer,
                heads,
            });
        }
        model = model.with_engine_rules(rules);
    }
    if precision != DecodePrecision::F32 {
        decoding.push(format!("decoding: {}", model.describe_decoding()?));
    }
    decoding.extend(restricted);
    Ok(LoadedMt {
        model,
        params,
        config,
        model_config,
        tokenizer,
        note,
        decoding,
    })
}

/// The vocabulary map of `run` (`vocab_map.json`) for a vocabulary of `vocab` tokens.
fn restricted_vocab(run: &Path, vocab: usize) -> Result<VocabMap> {
    let path = run.join(vocab_map::FILE);
    if !path.exists() {
        return Err(Error::Usage(format!(
            "--restrict-vocab: {} has no {}; write it with `transformer mt vocab-map --run {}`",
            run.display(),
            vocab_map::FILE,
            run.display()
        )));
    }
    VocabMap::load(&path, vocab)
}
