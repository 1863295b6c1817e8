//! A translation run's configuration, as its `config.toml` records it ([`MtTrainConfig`]):
//! what the model is, how it decodes and which languages it translates, beside the training
//! settings the run was made with; the bundled corpora's names and languages.

use crate::error::{Error, Result};
use crate::model::{Arch, MtModelConfig};
use crate::run_dir::{self as runner, require_at_least_one};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use transformer_decode::{DecodeOptions, SearchRules};
use transformer_model::Precision;
use transformer_model::{RnnSeq2SeqConfig, Seq2SeqConfig, TransformerConfig};

/// The default decay of the weight average.
pub const DEFAULT_AVERAGE_DECAY: f64 = 0.999;

/// Everything a translation run is configured by. The defaults are the small model of the
/// published Multi30k baselines (3 + 3 layers, d_model 256, 8 heads, FFN 512, dropout 0.1,
/// about 9M parameters) with the paper's optimizer, schedule and label smoothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MtTrainConfig {
    /// A bundled corpus (its files under `data`).
    pub corpus: Option<Corpus>,
    /// The folder holding the bundled corpora.
    pub data: Option<PathBuf>,
    /// Training source sentences, one per line (replaces the corpus's).
    pub train_src: Option<PathBuf>,
    /// Training target sentences, line by line parallel to `train_src`.
    pub train_tgt: Option<PathBuf>,
    /// Validation source sentences, one per line (replaces the corpus's).
    pub valid_src: Option<PathBuf>,
    /// Validation target sentences, parallel to `valid_src`.
    pub valid_tgt: Option<PathBuf>,
    /// Test source sentences, one per line (replaces the corpus's).
    pub test_src: Option<PathBuf>,
    /// Test target sentences, parallel to `test_src`.
    pub test_tgt: Option<PathBuf>,
    /// The source language's code (ISO 639-1, as `de`), for `transformer serve`; a bundled
    /// corpus implies it.
    pub src_lang: Option<String>,
    /// The target language's code (as `en`); a bundled corpus implies it.
    pub tgt_lang: Option<String>,
    /// Exchange source and target in every split (train, validation, test), so that a
    /// bundled corpus is learnt in the other direction (`ko-en` as English to Korean). The
    /// language codes follow ([`MtTrainConfig::language_pair`]).
    pub reverse: bool,
    /// Fine-tune: start from this translation run's weights (its `best.safetensors`, as
    /// [`crate::load::load_run`] reads it) and tokenizer instead of fresh ones. The model's shape and the
    /// tokenizer are that run's; the warm-up, learning rate, data and epochs are this run's,
    /// and Adam starts afresh.
    pub init_from: Option<PathBuf>,
    /// The model: the Transformer, or a recurrent baseline (`gru`, `gru-dot`,
    /// `gru-bahdanau`).
    pub arch: Arch,
    /// GRU units per encoder direction for the recurrent models (the decoder has twice as
    /// many); their embeddings are `d_model` wide.
    pub rnn_hidden: usize,
    /// Subword BPE (the default) or lowercased words; one tokenizer for both languages.
    pub tokenizer: TokenizerKind,
    /// Joint BPE vocabulary size (source and target share one tokenizer).
    pub vocab_size: usize,
    /// One matrix for both embeddings and the output layer (section 3.4).
    pub share_embeddings: bool,
    /// Model width (the recurrent models' embedding width).
    pub d_model: usize,
    /// Attention heads; must divide `d_model`.
    pub nhead: usize,
    /// Encoder layers N.
    pub encoder_layers: usize,
    /// Decoder layers N.
    pub decoder_layers: usize,
    /// Inner feed-forward width d_ff.
    pub dim_feedforward: usize,
    /// Dropout probability (section 5.4); the recurrent models apply it to the embeddings.
    pub dropout: f64,
    /// Pre-norm layers instead of the paper's post-norm.
    pub norm_first: bool,
    /// Label smoothing epsilon (section 5.4: 0.1).
    pub label_smoothing: f64,
    /// Warm-up steps of the learning-rate schedule (section 5.3).
    pub warmup: usize,
    /// Multiplies the schedule's learning rate.
    pub lr_factor: f64,
    /// Gradient-norm clipping threshold.
    pub clip: f64,
    /// Passes over the training data. 20 for Multi30k: its validation BLEU (greedy) is
    /// 38.05 after 10 epochs and 40.39 after 20, and the weight average's validation loss is
    /// still falling at epoch 18 (about 25 minutes on a 2-core AMD Zen 5, 2026-11-25).
    pub epochs: usize,
    /// Padded tokens per side and batch.
    pub max_tokens: usize,
    /// Batches whose gradients are summed before one optimizer step (gradient
    /// accumulation), per process: the global batch is `accumulate` x processes batches,
    /// its gradient that of the mean loss per target token over all of them
    /// (`transformer_train::dist`). 1: a step per batch.
    pub accumulate: usize,
    /// Training pairs with a side longer than this many subword tokens are skipped.
    pub max_sentence_tokens: usize,
    /// Print and record the mean training loss every this many batches (and after the
    /// epoch's last).
    pub log_interval: usize,
    /// Write a resumable checkpoint every this many batches (and at every epoch end).
    pub checkpoint_interval: usize,
    /// Stop each epoch after this many batches (quick runs); all when absent.
    pub max_batches: Option<usize>,
    /// Validate on at most this many sentences (quick runs); all when absent.
    pub max_valid: Option<usize>,
    /// Seeds the initial weights, the batch order of every epoch and (plus 1) dropout.
    pub seed: u64,
    /// Decay per step of the moving average of the weights that is validated beside the
    /// trained weights at every epoch end (`transformer_train::average`); 0 turns it off.
    pub average_decay: f64,
    /// Beam size for the final test translation.
    pub beam: usize,
    /// Beam scores divided by length^length_penalty. 1.0 was chosen by validation BLEU of
    /// the default Multi30k model (beam 5, sacreBLEU on val, 2026-11-25: 0.6 gave 40.92,
    /// 1.0 41.25, 1.5 41.22, 2.0 39.88).
    pub length_penalty: f64,
    /// Translations are at most `max_len_a * source_tokens + max_len_b` tokens long.
    pub max_len_a: f64,
    /// See `max_len_a`.
    pub max_len_b: usize,
    /// Arithmetic of the output layer's products in training (the Transformer): `f32`, or
    /// `bf16` (mixed precision on the AMX units or AVX512-BF16; f32 where the CPU has
    /// neither). Validation, test and decoding are always f32.
    pub precision: Precision,
    /// With `precision` bf16, a fresh run first times the output layer both ways and trains
    /// in bf16 only if it is faster on this CPU (`transformer_train::precision`); false: bf16 as
    /// asked, unmeasured (the run's `config.toml` records the outcome either way).
    pub measure_precision: bool,
    /// Set for a published model brought in by `transformer import`: its exact architecture
    /// (which the sizes above only summarize), its special tokens and whose search rules it
    /// decodes by.
    pub published: Option<Published>,
}

/// The formats `transformer import` reads (the readers: [`crate::import`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// A CTranslate2 model directory.
    CTranslate2,
    /// An Argos Translate package (`.argosmodel`, or its unzipped folder).
    Argos,
    /// A Hugging Face MarianMT directory (OPUS-MT).
    Marian,
}

/// A published model's record in its run's `config.toml` (`[published]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Published {
    /// What it was imported from: `ctranslate2` or `argos`.
    pub format: Format,
    /// Where it was imported from.
    pub origin: PathBuf,
    /// Whose search rules it decodes by.
    pub engine: Engine,
    /// The source's and the target's language names, when the model says.
    pub language_names: Option<(String, String)>,
    /// The special ids: padding, the decoder's start, the end, what ends a source sentence
    /// (none: nothing is appended).
    pub pad: u32,
    /// The decoder's start token.
    pub bos: u32,
    /// The end token.
    pub eos: u32,
    /// The token appended to every source sentence, if any.
    pub source_end: Option<u32>,
    /// Its weights were int8: it decodes in int8 unless told otherwise.
    #[serde(default)]
    pub int8: bool,
    /// Target tokens every translation starts with (an Argos package's `target_prefix`),
    /// forced after the start token as CTranslate2's `target_prefix` forces them, and
    /// removed from the translated text as Argos Translate removes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_prefix: Vec<String>,
    /// Every `<unk>` of a translation becomes the source piece its alignment weighs most
    /// before the text is detokenized (CTranslate2's `replace_unknowns`, which Argos
    /// Translate's call asks for); runs imported before this existed: `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replace_unknowns: bool,
    /// The decoder layer whose encoder-decoder attention aligns an output token with the
    /// source (CTranslate2's `alignment_layer`; negative counts from the last, -1 the last).
    #[serde(default = "last_layer")]
    pub alignment_layer: i64,
    /// The heads of that layer averaged, from the first (CTranslate2's `alignment_heads`;
    /// 0: every head).
    #[serde(default = "first_head")]
    pub alignment_heads: usize,
    /// The exact architecture.
    pub model: Seq2SeqConfig,
}

fn last_layer() -> i64 {
    -1
}

fn first_head() -> usize {
    1
}

impl Published {
    /// The alignment attention of a decoder of `layers` layers of `heads` heads: (the layer,
    /// how many heads from the first are averaged), as CTranslate2 reads `alignment_layer`
    /// and `alignment_heads`.
    pub fn alignment(&self, layers: usize, heads: usize) -> (usize, usize) {
        let layer = if self.alignment_layer < 0 {
            (layers as i64 + self.alignment_layer).max(0) as usize
        } else {
            self.alignment_layer as usize
        };
        let n = match self.alignment_heads {
            0 => heads,
            n => n.min(heads),
        };
        (layer.min(layers.saturating_sub(1)), n.max(1))
    }
}

/// The engine whose search rules a published model decodes by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// CTranslate2's `translate_batch` (CTranslate2 and Argos Translate models).
    CTranslate2,
    /// Hugging Face's `generate()` (MarianMT models): `<pad>`, its start token, never
    /// generated.
    #[serde(rename = "huggingface")]
    HuggingFace,
    /// The same with `renormalize_logits` (the log-probabilities normalised again without
    /// `<pad>`).
    #[serde(rename = "huggingface-renormalized")]
    HuggingFaceRenormalized,
}

impl Engine {
    /// The search rules, with the engine's defaults (`pad`: the padding id).
    pub fn rules(self, pad: u32) -> SearchRules {
        match self {
            Engine::CTranslate2 => SearchRules::CTRANSLATE2,
            Engine::HuggingFace => SearchRules::HuggingFace {
                suppress: Some(pad),
                renormalize: false,
            },
            Engine::HuggingFaceRenormalized => SearchRules::HuggingFace {
                suppress: Some(pad),
                renormalize: true,
            },
        }
    }
}

impl Default for MtTrainConfig {
    fn default() -> Self {
        Self {
            corpus: None,
            data: None,
            train_src: None,
            train_tgt: None,
            valid_src: None,
            valid_tgt: None,
            test_src: None,
            test_tgt: None,
            src_lang: None,
            tgt_lang: None,
            reverse: false,
            init_from: None,
            arch: Arch::Transformer,
            rnn_hidden: 256,
            tokenizer: TokenizerKind::Bpe,
            vocab_size: 8000,
            share_embeddings: true,
            d_model: 256,
            nhead: 8,
            encoder_layers: 3,
            decoder_layers: 3,
            dim_feedforward: 512,
            dropout: 0.1,
            norm_first: false,
            label_smoothing: 0.1,
            warmup: 400,
            lr_factor: 0.4,
            clip: 1.0,
            epochs: 20,
            max_tokens: 2048,
            accumulate: 1,
            max_sentence_tokens: 128,
            log_interval: 50,
            checkpoint_interval: 200,
            max_batches: None,
            max_valid: None,
            seed: 1,
            average_decay: DEFAULT_AVERAGE_DECAY,
            beam: 5,
            length_penalty: 1.0,
            max_len_a: 1.2,
            max_len_b: 10,
            precision: Precision::F32,
            measure_precision: true,
            published: None,
        }
    }
}

impl MtTrainConfig {
    /// The run's language codes (source, target): `src_lang` and `tgt_lang` where set (the
    /// languages of the run's source and target as trained, after `reverse`), else those of
    /// the bundled corpus, exchanged when `reverse` is set; `None` when neither says.
    pub fn language_pair(&self) -> Option<(String, String)> {
        let implied = self.corpus.map(|c| {
            let (s, t) = c.languages();
            if self.reverse {
                (t, s)
            } else {
                (s, t)
            }
        });
        let src = self.src_lang.clone().or(implied.map(|l| l.0.to_string()))?;
        let tgt = self.tgt_lang.clone().or(implied.map(|l| l.1.to_string()))?;
        Some((src, tgt))
    }

    /// Sets the model's sizes and dropout to a preset's.
    pub fn apply_preset(&mut self, preset: MtPreset) {
        let t = match preset {
            MtPreset::Small => {
                let d = Self::default();
                TransformerConfig {
                    d_model: d.d_model,
                    nhead: d.nhead,
                    num_encoder_layers: d.encoder_layers,
                    num_decoder_layers: d.decoder_layers,
                    dim_feedforward: d.dim_feedforward,
                    dropout: d.dropout,
                    ..TransformerConfig::base()
                }
            }
            MtPreset::Base => TransformerConfig::base(),
            MtPreset::Big => TransformerConfig::big(),
        };
        self.d_model = t.d_model;
        self.nhead = t.nhead;
        self.encoder_layers = t.num_encoder_layers;
        self.decoder_layers = t.num_decoder_layers;
        self.dim_feedforward = t.dim_feedforward;
        self.dropout = t.dropout;
    }

    /// The model configuration for a joint vocabulary of `vocab` tokens.
    /// A published model's is its own whatever `vocab`.
    pub fn model(&self, vocab: usize) -> Seq2SeqConfig {
        if let Some(p) = &self.published {
            return p.model.clone();
        }
        Seq2SeqConfig {
            transformer: TransformerConfig {
                d_model: self.d_model,
                nhead: self.nhead,
                num_encoder_layers: self.encoder_layers,
                num_decoder_layers: self.decoder_layers,
                dim_feedforward: self.dim_feedforward,
                dropout: self.dropout,
                norm_first: self.norm_first,
                max_len: 1024,
                ..TransformerConfig::base()
            },
            src_vocab: vocab,
            tgt_vocab: vocab,
            share_embeddings: self.share_embeddings,
            inputs: Default::default(),
        }
    }

    /// The configuration of the model `arch` names, for a joint vocabulary of `vocab`.
    pub fn model_config(&self, vocab: usize) -> MtModelConfig {
        match self.arch.rnn_attention() {
            None => MtModelConfig::Transformer(self.model(vocab)),
            Some(attention) => MtModelConfig::Rnn(RnnSeq2SeqConfig {
                src_vocab: vocab,
                tgt_vocab: vocab,
                emb: self.d_model,
                hidden: self.rnn_hidden,
                dropout: self.dropout,
                attention,
            }),
        }
    }

    /// Checks the decoding settings: a length limit `max_len_a * source + max_len_b` with
    /// `max_len_a` a number at least 0, and a finite length penalty at least 0.
    pub fn validate_decoding(&self) -> Result<()> {
        if !(self.max_len_a.is_finite() && self.max_len_a >= 0.0) {
            return Err(Error::Usage(format!(
                "max_len_a (--max-len-a) is {}: it must be a number at least 0 (outputs are at \
                 most max_len_a * source tokens + max_len_b long)",
                self.max_len_a
            )));
        }
        if !(self.length_penalty.is_finite() && self.length_penalty >= 0.0) {
            return Err(Error::Usage(format!(
                "length_penalty (--length-penalty) is {}: it must be a number at least 0 \
                 (0 = raw log-probabilities, 1 = per-token average)",
                self.length_penalty
            )));
        }
        Ok(())
    }

    /// Checks the model configuration and that counts are positive and rates in range.
    pub fn validate(&self) -> Result<()> {
        self.validate_decoding()?;
        if self.accumulate == 0 {
            return Err(Error::Usage(
                "accumulate (--accumulate) must be at least 1 (1: a step per batch)".into(),
            ));
        }
        for (name, v) in [
            ("max_batches", self.max_batches),
            ("max_valid", self.max_valid),
        ] {
            if v == Some(0) {
                return Err(Error::Usage(format!(
                    "{name} (--{}) must be at least 1 (leave it out for all)",
                    name.replace('_', "-")
                )));
            }
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(Error::Usage(format!(
                "dropout is {}: it must be in [0, 1)",
                self.dropout
            )));
        }
        self.model_config(self.vocab_size).arch().validate()?;
        require_at_least_one(&[
            ("epochs", self.epochs),
            ("max_tokens", self.max_tokens),
            ("max_sentence_tokens", self.max_sentence_tokens),
            ("log_interval", self.log_interval),
            ("beam", self.beam),
            ("warmup", self.warmup),
        ])
        .map_err(Error::Usage)?;
        if !(0.0..1.0).contains(&self.label_smoothing) {
            return Err(Error::Usage(format!(
                "label_smoothing is {}: it must be in [0, 1) (the paper uses 0.1)",
                self.label_smoothing
            )));
        }
        if !(0.0..1.0).contains(&self.average_decay) {
            return Err(Error::Usage(format!(
                "average_decay is {}: it must be at least 0 (0 = no weight average) and below 1",
                self.average_decay
            )));
        }
        if !(self.lr_factor > 0.0 && self.clip > 0.0) {
            return Err(Error::Usage("lr_factor and clip must be positive".into()));
        }
        for (name, code) in [("src_lang", &self.src_lang), ("tgt_lang", &self.tgt_lang)] {
            if let Some(c) = code {
                if !is_language_code(c) {
                    return Err(Error::Usage(format!(
                        "{name} is {c:?}: give a language code of 2 or 3 lowercase letters, \
                         optionally with a region or script (de, en, ko, pt-BR, zh-Hans)"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The decoding options of this run's model (beam from the config unless overridden).
    pub fn decode_options(&self, beam: usize) -> DecodeOptions {
        let sp = transformer_text::Specials::FIXED;
        let opts = DecodeOptions {
            beam,
            max_len_a: self.max_len_a,
            max_len_b: self.max_len_b,
            length_penalty: self.length_penalty,
            bos: sp.bos,
            eos: sp.eos,
            pad: sp.pad,
            source_end: sp.source_end,
            want_attention: false,
            want_scores: true,
            rules: SearchRules::Native,
        };
        match &self.published {
            Some(p) => DecodeOptions {
                bos: p.bos,
                eos: p.eos,
                pad: p.pad,
                source_end: p.source_end,
                rules: p.engine.rules(p.pad),
                ..opts
            },
            None => opts,
        }
    }

    /// Makes every file and folder the configuration names absolute, so that a run's
    /// `config.toml` names them wherever the run is resumed from.
    ///
    /// A bundled corpus read from the default folder (`../shared/data`) records that
    /// folder, so that the run resumes and `mt eval --test-set` finds its sets from any
    /// directory.
    pub fn make_paths_absolute(&mut self) {
        if self.corpus.is_some() && self.data.is_none() {
            self.data = default_data_dir();
        }
        for p in [
            &mut self.data,
            &mut self.train_src,
            &mut self.train_tgt,
            &mut self.valid_src,
            &mut self.valid_tgt,
            &mut self.test_src,
            &mut self.test_tgt,
            &mut self.init_from,
        ]
        .into_iter()
        .flatten()
        {
            *p = runner::absolute(p);
        }
    }

    /// Reads a TOML file of the same keys (any subset; the rest keep their defaults).
    pub fn from_toml_file(path: &Path) -> Result<Self> {
        runner::read_toml_file(path)
    }
}

/// The bundled corpora, read in place from the shared data folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Corpus {
    /// Multi30k task 1, German to English: train / val / test_2016_flickr (gzip as
    /// distributed).
    Multi30kDeEn,
    /// Korean to English: train on Tatoeba + JHE (7,189 pairs), validate on the news dev
    /// set, test on the news test set.
    KoEn,
    /// Korean to English on every pair that is not held out for testing
    /// (`transformer_train::mt::ko_en_all_train`): Tatoeba, JHE, the Python documentation and LibreOffice's help
    /// and UI (each but its held-out slice, `transformer_train::mt::HELD_OUT_EVERY`) and Korean PUD; validate on
    /// the news dev set, test on the news test set. NTREX-128 and the held-out slices are
    /// left for `transformer_train::mt::ko_en_test_sets`.
    KoEnAll,
}

/// The variant of a unit-variant enum that `s` names as configuration files name it (its
/// serde name: `ko-en-all`, `bpe-bytes`), for parsing flags by the same names; `None` for a
/// name it does not have.
fn by_config_name<T: serde::de::DeserializeOwned>(s: &str) -> Option<T> {
    use serde::de::value::{Error, StrDeserializer};
    T::deserialize(StrDeserializer::<Error>::new(s)).ok()
}

/// `FromStr` for a unit-variant enum by its configuration names ([`by_config_name`]); an
/// unknown name `s` is the error `unknown {what} {s:?}: use {names}`.
macro_rules! from_config_name {
    ($t:ty, $what:literal, $names:literal) => {
        impl std::str::FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> std::result::Result<Self, String> {
                by_config_name(s)
                    .ok_or_else(|| format!(concat!("unknown ", $what, " {:?}: use ", $names), s))
            }
        }
    };
}

from_config_name!(
    Corpus,
    "corpus",
    "multi30k-de-en, ko-en or ko-en-all, or give files with \
     --train-src/--train-tgt/--valid-src/--valid-tgt"
);

impl Corpus {
    /// The corpus's (source, target) language codes.
    pub fn languages(self) -> (&'static str, &'static str) {
        match self {
            Corpus::Multi30kDeEn => ("de", "en"),
            Corpus::KoEn | Corpus::KoEnAll => ("ko", "en"),
        }
    }
}

/// Whether `code` looks like a language code: 2 or 3 lowercase ASCII letters, optionally
/// followed by `-` and a region or script of 2 to 4 ASCII letters or digits (`pt-BR`,
/// `zh-Hans`), as LibreTranslate's codes are.
pub fn is_language_code(code: &str) -> bool {
    let (lang, rest) = match code.split_once('-') {
        Some((l, r)) => (l, Some(r)),
        None => (code, None),
    };
    (2..=3).contains(&lang.len())
        && lang.bytes().all(|b| b.is_ascii_lowercase())
        && rest.is_none_or(|r| {
            (2..=4).contains(&r.len()) && r.bytes().all(|b| b.is_ascii_alphanumeric())
        })
}

/// The default data folder, `../shared/data` from the working directory, if it exists.
pub fn default_data_dir() -> Option<PathBuf> {
    let p = PathBuf::from("../shared/data");
    p.is_dir().then_some(p)
}

/// Model sizes by name: the small model of the published Multi30k baselines (the default),
/// and the paper's base and big models (Table 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MtPreset {
    /// 3 + 3 layers, d_model 256, 8 heads, FFN 512, dropout 0.1.
    Small,
    /// 6 + 6 layers, d_model 512, 8 heads, FFN 2048, dropout 0.1 (Table 3, base).
    Base,
    /// 6 + 6 layers, d_model 1024, 16 heads, FFN 4096, dropout 0.3 (Table 3, big).
    Big,
}

from_config_name!(MtPreset, "preset", "small, base or big");

/// How text becomes tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TokenizerKind {
    /// Joint byte-pair encoding of `vocab_size` subwords; decodes to the exact text.
    #[default]
    Bpe,
    /// BPE with byte fallback: `vocab_size` pieces of which 256 are bytes, so a character
    /// never seen in training is spelled in bytes instead of `<unk>`.
    BpeBytes,
    /// A unigram language-model tokenizer (SentencePiece's default) of `vocab_size` pieces.
    Unigram,
    /// Unigram with byte fallback (256 of the `vocab_size` pieces are bytes).
    UnigramBytes,
    /// Lowercased words, punctuation split off, words seen fewer than twice as `<unk>`: the
    /// vocabulary of the published Multi30k baselines, for a perplexity measured as theirs
    /// is (per word). `vocab_size` does not apply.
    Words,
}

from_config_name!(
    TokenizerKind,
    "tokenizer",
    "bpe, bpe-bytes, unigram, unigram-bytes or words"
);

impl TokenizerKind {
    /// How the training log names it.
    pub fn describe(self) -> &'static str {
        match self {
            TokenizerKind::Bpe => "BPE",
            TokenizerKind::BpeBytes => "BPE (byte fallback)",
            TokenizerKind::Unigram => "unigram",
            TokenizerKind::UnigramBytes => "unigram (byte fallback)",
            TokenizerKind::Words => "lowercased-word",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each of the space-separated `names` parsed as a `T`.
    fn parse_all<T: std::str::FromStr>(names: &str) -> Vec<std::result::Result<T, T::Err>> {
        names.split(' ').map(str::parse).collect()
    }

    #[test]
    fn flags_parse_by_the_configuration_names() {
        use Corpus::*;
        use TokenizerKind::*;
        assert_eq!(
            parse_all("multi30k-de-en ko-en ko-en-all"),
            [Ok(Multi30kDeEn), Ok(KoEn), Ok(KoEnAll)]
        );
        let presets = [Ok(MtPreset::Small), Ok(MtPreset::Base), Ok(MtPreset::Big)];
        assert_eq!(parse_all("small base big"), presets);
        let kinds = parse_all("bpe bpe-bytes unigram unigram-bytes words");
        assert_eq!(kinds, [Bpe, BpeBytes, Unigram, UnigramBytes, Words].map(Ok));
        assert_eq!(
            "Small".parse::<MtPreset>().unwrap_err(),
            "unknown preset \"Small\": use small, base or big"
        );
        assert_eq!(
            "ko_en".parse::<Corpus>().unwrap_err(),
            "unknown corpus \"ko_en\": use multi30k-de-en, ko-en or ko-en-all, or give files \
             with --train-src/--train-tgt/--valid-src/--valid-tgt"
        );
        assert_eq!(
            "bpe bytes".parse::<TokenizerKind>().unwrap_err(),
            "unknown tokenizer \"bpe bytes\": use bpe, bpe-bytes, unigram, unigram-bytes or words"
        );
    }
}
