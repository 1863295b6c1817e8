//! Published translation models turned into run directories (`transformer import`): every
//! command that takes a run then takes them. The readers:
//!
//! - [`ctranslate2`]: CTranslate2 model directories (`model.bin`, binary versions 1 to 6, and
//!   their vocabularies and `config.json`);
//! - [`argos`]: Argos Translate packages (`.argosmodel`: a CTranslate2 model, a SentencePiece
//!   model and the languages' metadata);
//! - [`marian`]: Hugging Face MarianMT directories (OPUS-MT).
//!
//! An imported run holds what a trained one does: `best.safetensors` (the weights under this
//! project's names; int8 for an int8 model), `tokenizer.json` (the model's own vocabularies
//! and SentencePiece models, [`transformer_text::published`]) and `config.toml`, whose
//! `[published]` table records the exact architecture, where it came from and whose search
//! rules it decodes by ([`crate::config::Published`]).

pub mod argos;
pub mod ctranslate2;
pub mod marian;
pub mod model_bin;

use crate::config::{Engine, MtTrainConfig, Published};
use crate::error::{Error, Result};
use crate::load::{tokenizer_path, WEIGHTS_FORMAT};
use crate::model::MtModelConfig;
use crate::run_dir::{best_path, config_path, read_text, save_tagged};
use candle_core::{Device, Tensor};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use transformer_model::Seq2SeqConfig;
use transformer_text::published::{PublishedTokenizer, Splitter};

pub use crate::config::Format;

impl Format {
    /// The name `--format` takes.
    pub fn name(self) -> &'static str {
        match self {
            Format::CTranslate2 => "ctranslate2",
            Format::Argos => "argos",
            Format::Marian => "marian",
        }
    }

    /// The format of `path`, told by its files: an `.argosmodel` zip or a folder with
    /// `metadata.json` and `model/` (Argos), a folder with `model.bin` (CTranslate2).
    pub fn detect(path: &Path) -> Result<Self> {
        if path.is_file() {
            let mut magic = [0u8; 4];
            let ok = std::fs::File::open(path)
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
                .is_ok();
            if ok && &magic == b"PK\x03\x04" {
                return Ok(Format::Argos);
            }
            return Err(Error::Usage(format!(
                "{}: not a model this program imports (a CTranslate2 model directory, or an \
                 Argos Translate .argosmodel package)",
                path.display()
            )));
        }
        if path.join("metadata.json").exists() && path.join("model").is_dir() {
            return Ok(Format::Argos);
        }
        if path.join("model.bin").exists() {
            return Ok(Format::CTranslate2);
        }
        if marian::is_marian(path) {
            return Ok(Format::Marian);
        }
        if !path.exists() {
            return Err(Error::Usage(format!(
                "{}: no such file or directory",
                path.display()
            )));
        }
        Err(Error::Usage(format!(
            "{}: not a CTranslate2 model directory (model.bin), an Argos Translate package \
             (metadata.json and model/) or a MarianMT directory (config.json of model_type \
             marian): give one of them, or --format",
            path.display()
        )))
    }

    /// Reads the model at `path` in this format.
    pub fn read(self, path: &Path) -> Result<Imported> {
        match self {
            Format::CTranslate2 => {
                ctranslate2::read(path, (Splitter::Whitespace, Splitter::Whitespace))
            }
            Format::Argos => argos::read(path),
            Format::Marian => marian::read(path),
        }
    }
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "ctranslate2" | "ct2" => Ok(Format::CTranslate2),
            "argos" => Ok(Format::Argos),
            "marian" | "opus-mt" => Ok(Format::Marian),
            _ => Err(format!(
                "unknown format {s:?}: use ctranslate2, argos or marian"
            )),
        }
    }
}

/// Weights under this project's parameter names: f32 values and a shape each.
#[derive(Debug, Clone, Default)]
pub struct Weights(BTreeMap<String, (Vec<f32>, Vec<usize>)>);

impl Weights {
    /// No weights.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `name` to `values` of shape `dims`.
    pub fn insert(&mut self, name: &str, values: Vec<f32>, dims: &[usize]) {
        self.0.insert(name.to_string(), (values, dims.to_vec()));
    }

    /// The values of `name`.
    pub fn get(&self, name: &str) -> Option<&[f32]> {
        self.0.get(name).map(|(v, _)| v.as_slice())
    }

    /// The weights as CPU tensors.
    pub fn tensors(&self) -> Result<Vec<(String, Tensor)>> {
        self.0
            .iter()
            .map(|(n, (v, d))| {
                Ok((
                    n.clone(),
                    Tensor::from_vec(v.clone(), d.as_slice(), &Device::Cpu)?,
                ))
            })
            .collect()
    }
}

/// A published model read into this project's terms.
#[derive(Debug, Clone)]
pub struct Imported {
    /// What it was read as.
    pub format: Format,
    /// Where it was read from.
    pub origin: PathBuf,
    /// The architecture.
    pub model: Seq2SeqConfig,
    /// The weights.
    pub weights: Weights,
    /// Whether its weights were stored in int8: the run then decodes in int8, from f32
    /// weights that are the stored ones dequantized as CTranslate2 does (so that `--quantize
    /// none` computes what CTranslate2's float32 arithmetic does, and int8 decoding finds
    /// the stored int8 values again).
    pub int8: bool,
    /// Its tokenizer.
    pub tokenizer: PublishedTokenizer,
    /// Its languages: (source code, source name, target code, target name), when it says.
    pub languages: Option<(String, String, String, String)>,
    /// Whose search rules it decodes by.
    pub engine: Engine,
    /// Its engine's default beam.
    pub beam: usize,
    /// Its engine's default length penalty.
    pub length_penalty: f64,
    /// Its engine's default length limit (see [`transformer_decode::SearchRules`]).
    pub max_length: usize,
    /// What was read, for the log.
    pub notes: Vec<String>,
    /// Target tokens every translation starts with ([`Published::target_prefix`]).
    pub target_prefix: Vec<String>,
    /// Unknown output tokens are replaced by source pieces ([`Published::replace_unknowns`]).
    pub replace_unknowns: bool,
    /// CTranslate2's `alignment_layer` and `alignment_heads` ([`Published::alignment`]).
    pub alignment: (i64, usize),
}

impl Imported {
    /// Writes the run directory `out` (which must not exist, or be empty).
    pub fn write_run(&self, out: &Path) -> Result<()> {
        if out.exists() && std::fs::read_dir(out).map_or(true, |mut d| d.next().is_some()) {
            return Err(Error::Usage(format!(
                "{}: exists and is not an empty directory; give a new directory for the \
                 imported run",
                out.display()
            )));
        }
        std::fs::create_dir_all(out).map_err(|source| Error::Io {
            path: out.into(),
            source,
        })?;
        let model = MtModelConfig::Transformer(self.model.clone());
        let meta = [(
            "model",
            serde_json::to_string(&model).expect("config serializes"),
        )];
        save_tagged(
            &best_path(out),
            &self.weights.tensors()?,
            WEIGHTS_FORMAT,
            meta,
        )?;
        let tok = serde_json::to_string(&self.tokenizer.to_json()).expect("json");
        crate::checkpoint::write_atomic(&tokenizer_path(out), tok.as_bytes())?;
        let config = self.config();
        let text = toml::to_string(&config).map_err(|e| Error::Config {
            path: config_path(out),
            msg: e.to_string(),
        })?;
        crate::checkpoint::write_atomic(&config_path(out), text.as_bytes())?;
        Ok(())
    }

    /// The run's `config.toml`: the model's sizes, languages and decoding defaults, and the
    /// `[published]` table.
    pub fn config(&self) -> MtTrainConfig {
        let t = &self.model.transformer;
        let (src_lang, tgt_lang) = match &self.languages {
            Some((s, _, t, _)) => (Some(s.clone()), Some(t.clone())),
            None => (None, None),
        };
        MtTrainConfig {
            src_lang,
            tgt_lang,
            share_embeddings: self.model.share_embeddings,
            d_model: t.d_model,
            nhead: t.nhead,
            encoder_layers: t.num_encoder_layers,
            decoder_layers: t.num_decoder_layers,
            dim_feedforward: t.dim_feedforward,
            norm_first: t.norm_first,
            vocab_size: self.model.tgt_vocab,
            beam: self.beam,
            length_penalty: self.length_penalty,
            max_len_a: 0.0,
            max_len_b: self.max_length,
            published: Some(Published {
                format: self.format,
                origin: crate::run_dir::absolute(&self.origin),
                engine: self.engine,
                language_names: self
                    .languages
                    .as_ref()
                    .map(|(_, s, _, t)| (s.clone(), t.clone())),
                pad: self.tokenizer.specials.pad,
                bos: self.tokenizer.specials.bos,
                eos: self.tokenizer.specials.eos,
                source_end: self.tokenizer.specials.source_end,
                int8: self.int8,
                target_prefix: self.target_prefix.clone(),
                replace_unknowns: self.replace_unknowns,
                alignment_layer: self.alignment.0,
                alignment_heads: self.alignment.1,
                model: self.model.clone(),
            }),
            ..MtTrainConfig::default()
        }
    }
}

/// A temporary run directory, removed when dropped.
#[derive(Debug)]
pub struct TempRun(PathBuf);

impl TempRun {
    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempRun {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `path` as a run directory: itself when it is one (it holds `tokenizer.json`: a trained or
/// an imported run); else the published model there (a CTranslate2 directory, an Argos
/// package) imported into a temporary run, which is removed when the guard drops (load it
/// first: a loaded run needs its directory no more).
pub fn as_run(path: &Path) -> Result<(PathBuf, Option<TempRun>)> {
    if tokenizer_path(path).exists() {
        return Ok((path.to_path_buf(), None));
    }
    let format = Format::detect(path)?;
    let imported = format.read(path)?;
    let dir = fresh_temp_dir("transformer-model");
    let guard = TempRun(dir.clone());
    imported.write_run(&dir)?;
    Ok((dir, Some(guard)))
}

/// A new folder name under the system's temporary folder, unique to this process and moment.
pub(crate) fn fresh_temp_dir(prefix: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "{prefix}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ))
}

/// The JSON file `path` (a published model's configuration).
pub(crate) fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = read_text(path)?;
    serde_json::from_str(&text).map_err(|e| Error::Config {
        path: path.into(),
        msg: format!("not JSON: {e}"),
    })
}
