//! Translation: an encoder-decoder Transformer trained on a parallel corpus (Multi30k
//! German-English, Korean-English, or any pair of files), decoded with greedy or beam search
//! and scored with BLEU.
//!
//! The loop: for each epoch, for each length-bucketed batch (a new order every epoch):
//! forward under the padding and causal masks, label-smoothed cross-entropy over the
//! non-padding target tokens, backward, clip the gradient norm, Adam with the paper's warm-up
//! schedule (section 5.3); log every `log_interval` batches; at the end of the epoch
//! validation loss, perplexity and BLEU (greedy), keep the best model by validation BLEU.
//! At the end, the best model is scored on the test set (when one is given) with beam search.
//!
//! A run directory holds:
//!
//! | file | what |
//! |---|---|
//! | `config.toml` | the resolved configuration |
//! | `tokenizer.json` | the joint tokenizer (source and target; BPE unless `--tokenizer words`) |
//! | `checkpoint.safetensors` | latest resumable state: weights, Adam moments, position, RNG |
//! | `best.safetensors` | the weights with the best validation BLEU so far |
//! | `metrics.jsonl` | log lines, validation and test results |
//! | `loss.svg` | training and validation loss against the step |
//! | `test.hyp` | the test set's translations by the best model |

use crate::average::CHECKPOINT_PREFIX as AVERAGE_PREFIX;
use crate::checkpoint;
use crate::checkpoint::params_tensors;
use crate::clip::clip_coefficient;
use crate::error::{Error, Result};
use crate::grads::Gradients;
use crate::metrics::{Metric, Weights};
use crate::optim::{Adam, NoamSchedule};
use crate::runner::{
    self, load_tagged, meta_json, open_run_dir, predates_averaging, save_tagged, LogWindow,
    Progress, RunState, Saved, Selection, StepStats, Task, Validation,
};
use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;
use transformer_decode::{beam_search_nbest, greedy, DecodeOptions, Hypothesis};
use transformer_model::kernels::Precision;
use transformer_model::{
    DirectGrads, Mode, ParamBuilder, Params, Rng, RnnSeq2SeqConfig, Seq2SeqConfig,
    TransformerConfig,
};
use transformer_text::bucket::{make_batch, pair_batches, source_batches, PairBatch};
use transformer_text::parallel::{keep_for_training, PairFilter, PairSource, Pairs, Side, Slice};
use transformer_text::score::bleu::{corpus_bleu, BleuOptions};
use transformer_text::subword::{BpeOptions, Subword, TextTokenizer};

pub use crate::mt_model::{Arch, MtDecoder, MtModel, MtModelConfig};

/// Format tag of translation checkpoints.
pub const CHECKPOINT_FORMAT: &str = "transformer-mt-checkpoint/1";
/// Format tag of translation weight files.
pub const WEIGHTS_FORMAT: &str = "transformer-mt-weights/1";

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
    /// ([`ko_en_all_train`]): Tatoeba, JHE, the Python documentation and LibreOffice's help
    /// and UI (each but its held-out slice, [`HELD_OUT_EVERY`]) and Korean PUD; validate on
    /// the news dev set, test on the news test set. NTREX-128 and the held-out slices are
    /// left for [`ko_en_test_sets`].
    KoEnAll,
}

impl std::str::FromStr for Corpus {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "multi30k-de-en" => Ok(Corpus::Multi30kDeEn),
            "ko-en" => Ok(Corpus::KoEn),
            "ko-en-all" => Ok(Corpus::KoEnAll),
            _ => Err(format!(
                "unknown corpus {s:?}: use multi30k-de-en, ko-en or ko-en-all, or give files with \
                 --train-src/--train-tgt/--valid-src/--valid-tgt"
            )),
        }
    }
}

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

/// The train, validation and test sources of a corpus.
#[derive(Debug, Clone)]
pub struct CorpusFiles {
    /// The training pairs, read in order and concatenated.
    pub train: Vec<PairSource>,
    /// The validation pairs.
    pub valid: PairSource,
    /// The test pairs, if the corpus has a test set.
    pub test: Option<PairSource>,
    /// Pairs not to train on: a training pair equal (both sides) to one of these is
    /// dropped, so that held-out test sets stay unseen even where another source repeats
    /// their pairs (LibreOffice's UI and help share short strings). Empty for every corpus
    /// but `ko-en-all`, whose test sets ([`ko_en_test_sets`]) these are.
    pub exclude: Vec<PairSource>,
}

impl Corpus {
    /// The files under `data` (the folder holding `multi30k/` and `ko-en/`).
    pub fn files(self, data: &Path) -> CorpusFiles {
        let files = |dir: &Path, stem: &str, s: &str, t: &str| PairSource::Files {
            src: dir.join(format!("{stem}{s}")),
            tgt: dir.join(format!("{stem}{t}")),
        };
        match self {
            Corpus::Multi30kDeEn => {
                let d = data.join("multi30k/task1/raw");
                CorpusFiles {
                    train: vec![files(&d, "train", ".de.gz", ".en.gz")],
                    valid: files(&d, "val", ".de.gz", ".en.gz"),
                    test: Some(files(&d, "test_2016_flickr", ".de.gz", ".en.gz")),
                    exclude: Vec::new(),
                }
            }
            Corpus::KoEn => {
                let d = data.join("ko-en");
                let jhe = d.join("jhe");
                let news = d.join("news-v1");
                CorpusFiles {
                    train: vec![
                        PairSource::Tsv {
                            path: d.join("tatoeba/kor.txt"),
                            src_col: 1,
                            tgt_col: 0,
                        },
                        files(&jhe, "jhe-koen-dev", ".ko", ".en"),
                        files(&jhe, "jhe-koen-eval", ".ko", ".en"),
                    ],
                    valid: files(&news, "korean-english-park.dev", ".ko", ".en"),
                    test: Some(files(&news, "korean-english-park.test", ".ko", ".en")),
                    exclude: Vec::new(),
                }
            }
            Corpus::KoEnAll => {
                let news = data.join("ko-en/news-v1");
                CorpusFiles {
                    train: ko_en_all_train(data),
                    valid: files(&news, "korean-english-park.dev", ".ko", ".en"),
                    test: Some(files(&news, "korean-english-park.test", ".ko", ".en")),
                    exclude: ko_en_test_sets(data).into_iter().map(|(_, s)| s).collect(),
                }
            }
        }
    }
}

/// The held-out slices of the Python documentation and of LibreOffice's help and UI text
/// are their pairs `HELD_OUT_EVERY`, `2 * HELD_OUT_EVERY`, ... (line numbers from 1, as
/// [`Slice::EveryNth`]); `ko-en-all` trains on the rest ([`Slice::AllButEveryNth`]).
pub const HELD_OUT_EVERY: usize = 50;

/// Tatoeba's held-out sentences: the pairs whose English sentence's MD5 is
/// `TATOEBA_HELD_OUT_RESIDUE` modulo `TATOEBA_HELD_OUT_MODULUS` ([`Slice::BySentence`]),
/// every Korean translation of a sentence on the same side: the test split of
/// `scripts/split_ko_en_tatoeba.py` (274 pairs).
pub const TATOEBA_HELD_OUT_MODULUS: u32 = 20;
/// See [`TATOEBA_HELD_OUT_MODULUS`].
pub const TATOEBA_HELD_OUT_RESIDUE: u32 = 1;

/// The Korean-English sources whose pairs are split into a training part and a held-out
/// slice ([`HELD_OUT_EVERY`]): (name, the whole source) under `data` (the folder holding
/// `ko-en/`), Korean first.
fn ko_en_sliced(data: &Path) -> Vec<(&'static str, PairSource)> {
    let extra = data.join("ko-en/extra");
    let files = |dir: &str, stem: &str| PairSource::Files {
        src: extra.join(dir).join(format!("{stem}.ko")),
        tgt: extra.join(dir).join(format!("{stem}.en")),
    };
    vec![
        ("python-docs", files("python-docs", "pydocs.clean")),
        ("lo-help", files("libreoffice", "lo-help")),
        ("lo-ui", files("libreoffice", "lo-ui")),
    ]
}

/// The training sources of `--corpus ko-en-all` under `data` (the folder holding `ko-en/`),
/// Korean first, read in this order: Tatoeba (`tatoeba/kor.txt`, all of it, as `ko-en`),
/// JHE dev and eval, the Python documentation (`extra/python-docs/pydocs.clean`), LibreOffice
/// help and UI (`extra/libreoffice/lo-help`, `lo-ui`), each of these three without its
/// held-out slice ([`HELD_OUT_EVERY`]), and Korean PUD (`extra/ud-pud/pud`, all of it). Not
/// read: NTREX-128 (`extra/ntrex128/`, a second news test), the held-out slices, the news
/// dev set (validation) and the news test set. Training then also drops every pair equal to
/// one of the test sets' ([`CorpusFiles::exclude`]): 109 pairs of LibreOffice and the Python
/// documentation repeat held-out ones.
pub fn ko_en_all_train(data: &Path) -> Vec<PairSource> {
    let mut train = Corpus::KoEn.files(data).train;
    train[0] = PairSource::Slice {
        of: Box::new(train[0].clone()),
        slice: Slice::AllButSentence {
            side: Side::Tgt,
            modulus: TATOEBA_HELD_OUT_MODULUS,
            residue: TATOEBA_HELD_OUT_RESIDUE,
        },
    };
    for (_, whole) in ko_en_sliced(data) {
        train.push(PairSource::Slice {
            of: Box::new(whole),
            slice: Slice::AllButEveryNth(HELD_OUT_EVERY),
        });
    }
    let pud = data.join("ko-en/extra/ud-pud");
    train.push(PairSource::Files {
        src: pud.join("pud.ko"),
        tgt: pud.join("pud.en"),
    });
    train
}

/// The Korean-English test sets that `--corpus ko-en-all` does not train on, under `data`
/// (the folder holding `ko-en/`), Korean first: `news-v1-test` (the news test set),
/// `ntrex128` (NTREX-128, news translated from English), and the held-out slices
/// `python-docs-heldout`, `lo-help-heldout` and `lo-ui-heldout` (pairs 50, 100, ... of each,
/// [`HELD_OUT_EVERY`]). For English to Korean, take each source's
/// [`PairSource::reversed`].
pub fn ko_en_test_sets(data: &Path) -> Vec<(String, PairSource)> {
    let d = data.join("ko-en");
    let mut sets = vec![
        (
            "news-v1-test".to_string(),
            PairSource::Files {
                src: d.join("news-v1/korean-english-park.test.ko"),
                tgt: d.join("news-v1/korean-english-park.test.en"),
            },
        ),
        (
            "ntrex128".to_string(),
            PairSource::Files {
                src: d.join("extra/ntrex128/ntrex128.ko"),
                tgt: d.join("extra/ntrex128/ntrex128.en"),
            },
        ),
    ];
    sets.push((
        "tatoeba-heldout".to_string(),
        PairSource::Slice {
            of: Box::new(PairSource::Tsv {
                path: d.join("tatoeba/kor.txt"),
                src_col: 1,
                tgt_col: 0,
            }),
            slice: Slice::BySentence {
                side: Side::Tgt,
                modulus: TATOEBA_HELD_OUT_MODULUS,
                residue: TATOEBA_HELD_OUT_RESIDUE,
            },
        },
    ));
    for (name, whole) in ko_en_sliced(data) {
        sets.push((
            format!("{name}-heldout"),
            PairSource::Slice {
                of: Box::new(whole),
                slice: Slice::EveryNth(HELD_OUT_EVERY),
            },
        ));
    }
    sets
}

/// The default data folder, `../shared/data` from the working directory, if it exists.
pub fn default_data_dir() -> Option<PathBuf> {
    let p = PathBuf::from("../shared/data");
    p.is_dir().then_some(p)
}

/// Model sizes by name: the small model of the published Multi30k baselines (the default),
/// and the paper's base and big models (Table 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MtPreset {
    /// 3 + 3 layers, d_model 256, 8 heads, FFN 512, dropout 0.1.
    Small,
    /// 6 + 6 layers, d_model 512, 8 heads, FFN 2048, dropout 0.1 (Table 3, base).
    Base,
    /// 6 + 6 layers, d_model 1024, 16 heads, FFN 4096, dropout 0.3 (Table 3, big).
    Big,
}

impl std::str::FromStr for MtPreset {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "small" => Ok(MtPreset::Small),
            "base" => Ok(MtPreset::Base),
            "big" => Ok(MtPreset::Big),
            _ => Err(format!("unknown preset {s:?}: use small, base or big")),
        }
    }
}

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

impl std::str::FromStr for TokenizerKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "bpe" => Ok(TokenizerKind::Bpe),
            "bpe-bytes" => Ok(TokenizerKind::BpeBytes),
            "unigram" => Ok(TokenizerKind::Unigram),
            "unigram-bytes" => Ok(TokenizerKind::UnigramBytes),
            "words" => Ok(TokenizerKind::Words),
            _ => Err(format!(
                "unknown tokenizer {s:?}: use bpe, bpe-bytes, unigram, unigram-bytes or words"
            )),
        }
    }
}

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

/// Bytes a byte-fallback vocabulary spends of its `vocab_size`.
const BYTE_PIECES: usize = 256;

/// Trains the tokenizer `kind` of `vocab_size` ids on `texts` (both sides of the training
/// pairs); `origin` names the data in errors.
pub fn train_tokenizer<'a>(
    kind: TokenizerKind,
    vocab_size: usize,
    texts: impl Iterator<Item = &'a String> + Send,
    origin: &Path,
) -> Result<Subword> {
    let opts = |size: usize| BpeOptions {
        vocab_size: size,
        min_frequency: 2,
    };
    let with_bytes = || {
        if vocab_size <= BYTE_PIECES + 4 {
            return Err(Error::Usage(format!(
                "--vocab-size {vocab_size} leaves no room beside the {BYTE_PIECES} byte pieces \
                 of --tokenizer {}: ask for thousands",
                match kind {
                    TokenizerKind::BpeBytes => "bpe-bytes",
                    _ => "unigram-bytes",
                }
            )));
        }
        Ok(opts(vocab_size - BYTE_PIECES))
    };
    Ok(match kind {
        TokenizerKind::Bpe => Subword::train_bpe(texts, opts(vocab_size), origin)?,
        TokenizerKind::BpeBytes => {
            Subword::train_bpe(texts, with_bytes()?, origin)?.with_byte_fallback(origin)?
        }
        TokenizerKind::Unigram => Subword::train_unigram(texts, opts(vocab_size), origin)?,
        TokenizerKind::UnigramBytes => {
            Subword::train_unigram(texts, with_bytes()?, origin)?.with_byte_fallback(origin)?
        }
        TokenizerKind::Words => Subword::train_words(texts, 2, origin)?,
    })
}

/// The default decay of the weight average.
pub const DEFAULT_AVERAGE_DECAY: f64 = 0.999;

/// The settings a resumed run may change ([`crate::runner::resume_config`]): how long it
/// trains, what it logs and checkpoints, how it validates and decodes the test set, and where
/// its data lies. The rest (the model, the tokenizer, the optimizer, the batches, the seed)
/// are the run's own.
pub const MAY_CHANGE_ON_RESUME: &[&str] = &[
    "epochs",
    "accumulate",
    "max_batches",
    "max_valid",
    "log_interval",
    "checkpoint_interval",
    "beam",
    "length_penalty",
    "max_len_a",
    "max_len_b",
    "data",
    "train_src",
    "train_tgt",
    "valid_src",
    "valid_tgt",
    "test_src",
    "test_tgt",
    "measure_precision",
];

/// What `--precision bf16` runs in bf16, as the log says it: the output layer's products and,
/// in the Transformer, the encoder and decoder layers' projection and feed-forward products
/// (`EncoderLayerOptions::precision`), all on the same bf16 unit.
const BF16_COVERS: &str = "the output layer's products and the Transformer layers' projection \
                           and feed-forward products";
/// Optimizer steps between updates of the weight average.
pub const AVERAGE_EVERY: usize = 4;

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
    /// [`load_run`] reads it) and tokenizer instead of fresh ones. The model's shape and the
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
    /// ([`crate::dist`]). 1: a step per batch.
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
    /// trained weights at every epoch end ([`crate::average`]); 0 turns it off.
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
    /// in bf16 only if it is faster on this CPU ([`crate::precision`]); false: bf16 as
    /// asked, unmeasured (the run's `config.toml` records the outcome either way).
    pub measure_precision: bool,
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
    pub fn model(&self, vocab: usize) -> Seq2SeqConfig {
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
        match self.model_config(self.vocab_size) {
            MtModelConfig::Transformer(c) => c.validate()?,
            MtModelConfig::Rnn(c) => c.validate().map_err(Error::Usage)?,
        }
        for (name, v) in [
            ("epochs", self.epochs),
            ("max_tokens", self.max_tokens),
            ("max_sentence_tokens", self.max_sentence_tokens),
            ("log_interval", self.log_interval),
            ("beam", self.beam),
            ("warmup", self.warmup),
        ] {
            if v == 0 {
                return Err(Error::Usage(format!("{name} must be at least 1")));
            }
        }
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
        DecodeOptions {
            beam,
            max_len_a: self.max_len_a,
            max_len_b: self.max_len_b,
            length_penalty: self.length_penalty,
            bos: sp.bos,
            eos: sp.eos,
            pad: sp.pad,
            want_attention: false,
        }
    }

    /// The train, validation and test sources: the bundled corpus, or the files given.
    pub fn sources(&self) -> Result<CorpusFiles> {
        let given = |a: &Option<PathBuf>, b: &Option<PathBuf>| match (a, b) {
            (Some(s), Some(t)) => Some(PairSource::Files {
                src: s.clone(),
                tgt: t.clone(),
            }),
            _ => None,
        };
        let mut files = match self.corpus {
            Some(c) => {
                let data = self.data.clone().or_else(default_data_dir).ok_or_else(|| {
                    Error::Usage(
                        "the bundled corpora are read from ../shared/data, which does not \
                         exist here: pass --data DIR (the folder holding multi30k/ and ko-en/)"
                            .into(),
                    )
                })?;
                c.files(&data)
            }
            None => {
                let (Some(train), Some(valid)) = (
                    given(&self.train_src, &self.train_tgt),
                    given(&self.valid_src, &self.valid_tgt),
                ) else {
                    return Err(Error::Usage(
                        "no data: pass --corpus multi30k-de-en (or ko-en), or all four of \
                         --train-src, --train-tgt, --valid-src, --valid-tgt"
                            .into(),
                    ));
                };
                CorpusFiles {
                    train: vec![train],
                    valid,
                    test: None,
                    exclude: Vec::new(),
                }
            }
        };
        if let Some(t) = given(&self.train_src, &self.train_tgt) {
            files.train = vec![t];
            files.exclude.clear();
        }
        if let Some(v) = given(&self.valid_src, &self.valid_tgt) {
            files.valid = v;
        }
        if let Some(t) = given(&self.test_src, &self.test_tgt) {
            files.test = Some(t);
        }
        if self.reverse {
            files = CorpusFiles {
                train: files.train.iter().map(PairSource::reversed).collect(),
                valid: files.valid.reversed(),
                test: files.test.as_ref().map(PairSource::reversed),
                exclude: files.exclude.iter().map(PairSource::reversed).collect(),
            };
        }
        Ok(files)
    }

    /// The sets a trained run can be scored on by name (`mt eval --test-set`), each in the
    /// run's direction: `valid` and `test` (the sources training validated and tested on),
    /// and for `ko-en-all` every held-out test set instead of `test` ([`ko_en_test_sets`]:
    /// `news-v1-test`, `ntrex128`, `tatoeba-heldout`, `python-docs-heldout`,
    /// `lo-help-heldout`, `lo-ui-heldout`).
    pub fn eval_sets(&self) -> Result<Vec<(String, PairSource)>> {
        let files = self.sources()?;
        let mut sets = vec![("valid".to_string(), files.valid)];
        if self.corpus == Some(Corpus::KoEnAll) && self.test_src.is_none() {
            let data = self
                .data
                .clone()
                .or_else(default_data_dir)
                .unwrap_or_default();
            for (name, source) in ko_en_test_sets(&data) {
                let source = if self.reverse {
                    source.reversed()
                } else {
                    source
                };
                sets.push((name, source));
            }
        } else if let Some(test) = files.test {
            sets.push(("test".to_string(), test));
        }
        Ok(sets)
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
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.into(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| Error::Config {
            path: path.into(),
            msg: e.to_string(),
        })
    }

    /// The configuration as TOML, every key written (what `config.toml` holds).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("config serializes")
    }
}

/// A split's sentences and their token ids (without `<bos>` / `<eos>`).
#[derive(Debug, Clone)]
pub struct EncodedSplit {
    /// The sentence pairs as text.
    pub pairs: Pairs,
    /// The source sentences' token ids, one list per sentence.
    pub src: Vec<Vec<u32>>,
    /// The target sentences' token ids, one list per sentence.
    pub tgt: Vec<Vec<u32>>,
}

impl EncodedSplit {
    /// Tokenizes both sides of `pairs` with `tok`.
    pub fn encode(pairs: Pairs, tok: &Subword) -> Self {
        let src = pairs.src.iter().map(|s| tok.encode(s)).collect();
        let tgt = pairs.tgt.iter().map(|s| tok.encode(s)).collect();
        Self { pairs, src, tgt }
    }

    /// The first `n` pairs.
    pub fn truncate(&mut self, n: usize) {
        self.pairs.src.truncate(n);
        self.pairs.tgt.truncate(n);
        self.src.truncate(n);
        self.tgt.truncate(n);
    }
}

pub use crate::runner::{best_path, checkpoint_path, config_path, metrics_path};

/// `tokenizer.json` in the run directory `run`: the run's tokenizer.
pub fn tokenizer_path(run: &Path) -> PathBuf {
    run.join("tokenizer.json")
}

/// Where a run stands; saved in every checkpoint (the runner's, for every task).
pub type MtState = RunState;

/// How to run [`train`].
pub type MtTrainOptions = crate::runner::RunOptions<MtTrainConfig>;

/// What a finished (or stopped) run reports.
#[derive(Debug, Clone)]
pub struct MtSummary {
    /// Where the run stands at the end of this invocation.
    pub state: MtState,
    /// Test loss and sacreBLEU of the best model, when a test set was given.
    pub test: Option<(f64, f64)>,
    /// The loss of every step taken in this invocation.
    pub step_losses: Vec<f64>,
}

/// Tensors of a batch: src (B, S), tgt_in (B, T), tgt_out (B, T).
pub fn batch_tensors(b: &PairBatch, dev: &Device) -> Result<(Tensor, Tensor, Tensor)> {
    Ok((
        Tensor::from_vec(b.src.clone(), (b.rows, b.src_len), dev)?,
        Tensor::from_vec(b.tgt_in.clone(), (b.rows, b.tgt_len), dev)?,
        Tensor::from_vec(b.tgt_out.clone(), (b.rows, b.tgt_len), dev)?,
    ))
}

/// Mean cross-entropy per target token (no smoothing) over a split, teacher-forced.
pub fn evaluate_loss(
    model: &MtModel,
    data: &EncodedSplit,
    max_tokens: usize,
    dev: &Device,
) -> Result<f64> {
    evaluate_loss_on(model, data, max_tokens, dev, &crate::dist::Dist::single())
}

/// [`evaluate_loss`] with the batches split across the processes of `dist` (each its
/// [`crate::dist::Dist::shard`]) and the sums added: every process gets the loss.
pub fn evaluate_loss_on(
    model: &MtModel,
    data: &EncodedSplit,
    max_tokens: usize,
    dev: &Device,
    dist: &crate::dist::Dist,
) -> Result<f64> {
    let sp = transformer_text::Specials::FIXED;
    let all: Vec<usize> = (0..data.src.len()).collect();
    // Sentences longer than the model takes are scored on their first positions (the length
    // rule of `translate_ids`).
    let max = max_source_tokens(model);
    let (src, tgt) = (fit(&data.src, max), fit(&data.tgt, max));
    let batches = pair_batches(&src, &tgt, &all, max_tokens, sp, 0);
    let (mut total, mut tokens) = (0.0, 0usize);
    for b in &batches[dist.shard(batches.len())] {
        let (src, tgt_in, tgt_out) = batch_tensors(b, dev)?;
        let l = model.loss(&src, &tgt_in, &tgt_out, sp.pad, 0.0, Mode::Eval)?;
        total += l.nll.to_dtype(DType::F64)?.to_scalar::<f64>()? * b.tgt_tokens as f64;
        tokens += b.tgt_tokens;
    }
    let mut sums = [total, tokens as f64];
    dist.sum_f64(&mut sums);
    Ok(sums[0] / sums[1].max(1.0))
}

/// Perplexity per word rather than per subword token, comparable across tokenizations:
/// `exp(total loss / (words + sentences))`, where words are the references' 13a tokens
/// (punctuation split off, as word-level tutorials tokenize) and each sentence adds its end
/// token, as word-level vocabularies count `<eos>`.
pub fn word_perplexity(loss_per_token: f64, data: &EncodedSplit) -> f64 {
    let subwords: usize = data.tgt.iter().map(|t| t.len() + 1).sum();
    let words: usize = data
        .pairs
        .tgt
        .iter()
        .map(|l| {
            transformer_text::score::tokenize_13a(l)
                .split_whitespace()
                .count()
                + 1
        })
        .sum();
    (loss_per_token * subwords as f64 / words.max(1) as f64).exp()
}

/// One training step on one batch (`[src, tgt_in, tgt_out]`, padded with `pad`): the
/// label-smoothed loss with dropout from `rng`, its gradient, clipping to norm `clip`, and
/// one step of `opt` at its current learning rate. Returns the loss and the plain negative
/// log-likelihood per target token. The training loop and `transformer bench mt` both take
/// exactly this step.
///
/// `direct` takes the gradients that fused ops write outside candle's graph
/// (`MtModel::loss_direct`); [`Gradients::from_backward`] joins them with the autograd's,
/// and `direct` is empty again when the step returns, its buffers kept for the next one.
#[allow(clippy::too_many_arguments)]
pub fn train_step(
    model: &MtModel,
    vars: &[candle_core::Var],
    opt: &mut Adam,
    direct: &DirectGrads,
    clip: f64,
    [src, tgt_in, tgt_out]: [&Tensor; 3],
    pad: u32,
    label_smoothing: f64,
    precision: Precision,
    rng: &Rng,
) -> Result<(f64, f64)> {
    let mode = Mode::Train(rng);
    let l = model.loss_direct(
        src,
        tgt_in,
        tgt_out,
        pad,
        label_smoothing,
        precision,
        mode,
        direct,
    )?;
    let grads = Gradients::from_backward(&l.loss, vars, direct)?;
    let (_, coef) = clip_coefficient(&grads, clip)?;
    opt.step(&grads, coef)?;
    drop(grads); // empties `direct` for the next step
    Ok((
        l.loss.to_dtype(DType::F64)?.to_scalar::<f64>()?,
        l.nll.to_dtype(DType::F64)?.to_scalar::<f64>()?,
    ))
}

/// Decoder rows (sentences x beam) per batch when translating: [`translate_ids`]'s default.
pub const DECODE_BATCH_ROWS: usize = 128;

/// A source longer than the model takes, cut to fit by the length rule of [`translate_ids`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated {
    /// The source's index in the input (0-based; line `index + 1` of a file).
    pub index: usize,
    /// Its tokens.
    pub tokens: usize,
    /// The tokens translated: its first `kept`.
    pub kept: usize,
}

impl std::fmt::Display for Truncated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "line {}: {} tokens, more than the model's {}: only its first {} tokens are \
             translated (split the line to translate all of it)",
            self.index + 1,
            self.tokens,
            self.kept,
            self.kept
        )
    }
}

/// The most source tokens (without `<eos>`) `model` takes: its positions less one for
/// `<eos>`; `None` for a model without a limit (the recurrent ones).
pub fn max_source_tokens(model: &MtModel) -> Option<usize> {
    model.max_positions().map(|p| p.saturating_sub(1))
}

/// The sources of `src` that the length rule of [`translate_ids`] cuts, in input order.
pub fn over_long(model: &MtModel, src: &[Vec<u32>]) -> Vec<Truncated> {
    let Some(max) = max_source_tokens(model) else {
        return Vec::new();
    };
    src.iter()
        .enumerate()
        .filter(|(_, s)| s.len() > max)
        .map(|(index, s)| Truncated {
            index,
            tokens: s.len(),
            kept: max,
        })
        .collect()
}

/// The lines of `lines` that [`translate_lines`] cuts to fit the model (tokenized with
/// `tok`), in input order: what a caller reports as warnings.
pub fn over_long_lines(model: &MtModel, tok: &Subword, lines: &[String]) -> Vec<Truncated> {
    let ids: Vec<Vec<u32>> = lines.iter().map(|l| tok.encode(l)).collect();
    over_long(model, &ids)
}

/// `seqs` with every sequence longer than `max` tokens cut to its first `max` (borrowed when
/// none is).
fn fit(seqs: &[Vec<u32>], max: Option<usize>) -> std::borrow::Cow<'_, [Vec<u32>]> {
    match max {
        Some(m) if seqs.iter().any(|s| s.len() > m) => {
            std::borrow::Cow::Owned(seqs.iter().map(|s| s[..s.len().min(m)].to_vec()).collect())
        }
        _ => std::borrow::Cow::Borrowed(seqs),
    }
}

/// Translates token sequences in batches of at most [`DECODE_BATCH_ROWS`] decoder rows
/// (greedy for beam 1, else beam search); returns one hypothesis per input, in input order.
/// `on_batch(done, total)` reports progress.
///
/// The length rule: a Transformer takes at most its positions (1,024) less one tokens of
/// source, so a longer source is translated from its first [`max_source_tokens`] tokens
/// ([`over_long`] names them, for warnings), and no output is longer than the positions less
/// one, whatever `max_len_a * source + max_len_b` says; every other sentence of the job is
/// translated as usual.
pub fn translate_ids(
    model: &MtModel,
    src: &[Vec<u32>],
    opts: &DecodeOptions,
    dev: &Device,
    on_batch: impl FnMut(usize, usize),
) -> Result<Vec<Hypothesis>> {
    translate_ids_batched(model, src, opts, DECODE_BATCH_ROWS, dev, on_batch)
}

/// [`translate_ids`] with at most `batch_rows` decoder rows (sentences x beam) per batch.
pub fn translate_ids_batched(
    model: &MtModel,
    src: &[Vec<u32>],
    opts: &DecodeOptions,
    batch_rows: usize,
    dev: &Device,
    on_batch: impl FnMut(usize, usize),
) -> Result<Vec<Hypothesis>> {
    Ok(
        translate_ids_nbest(model, src, opts, batch_rows, dev, on_batch)?
            .into_iter()
            .map(|mut hs| hs.swap_remove(0))
            .collect(),
    )
}

/// [`translate_ids_batched`] with each input's n-best list (best first; the first is
/// exactly what [`translate_ids_batched`] returns): beam search's finished hypotheses, or
/// the one greedy hypothesis for beam 1.
pub fn translate_ids_nbest(
    model: &MtModel,
    src: &[Vec<u32>],
    opts: &DecodeOptions,
    batch_rows: usize,
    dev: &Device,
    on_batch: impl FnMut(usize, usize),
) -> Result<Vec<Vec<Hypothesis>>> {
    translate_ids_nbest_with(&model.decoder()?, src, opts, batch_rows, dev, on_batch)
}

/// [`translate_ids_nbest`] with a decoder already prepared ([`MtModel::decoder`]), for a
/// caller that translates many times with the same weights (the server): the decoding
/// weights are then prepared (transposed, or quantized to int8) once, not at every call.
pub fn translate_ids_nbest_with(
    decoder: &MtDecoder<'_>,
    src: &[Vec<u32>],
    opts: &DecodeOptions,
    batch_rows: usize,
    dev: &Device,
    mut on_batch: impl FnMut(usize, usize),
) -> Result<Vec<Vec<Hypothesis>>> {
    let sp = transformer_text::Specials::FIXED;
    let src = &*fit(src, max_source_tokens(decoder.model()));
    // Sentences per batch: beams multiply the decoder's rows.
    let max_rows = (batch_rows / opts.beam.max(1)).max(1);
    let groups = source_batches(src, 2048, max_rows);
    let mut out: Vec<Vec<Hypothesis>> = vec![Vec::new(); src.len()];
    let mut done = 0;
    for g in &groups {
        let empty: Vec<Vec<u32>> = vec![Vec::new(); src.len()];
        let b = make_batch(src, &empty, g.clone(), sp);
        let s = Tensor::from_vec(b.src.clone(), (b.rows, b.src_len), dev)?;
        let hyps = if opts.beam <= 1 {
            greedy(decoder, &s, opts)?
                .into_iter()
                .map(|h| vec![h])
                .collect()
        } else {
            beam_search_nbest(decoder, &s, opts)?
        };
        for (&i, h) in g.iter().zip(hyps) {
            out[i] = h;
        }
        done += g.len();
        on_batch(done, src.len());
    }
    Ok(out)
}

/// Translates sentences with a tokenizer; returns the detokenized outputs in order. Lines
/// longer than the model takes follow the length rule of [`translate_ids`]
/// ([`over_long_lines`] names them).
pub fn translate_lines(
    model: &MtModel,
    tok: &Subword,
    lines: &[String],
    opts: &DecodeOptions,
    dev: &Device,
    on_batch: impl FnMut(usize, usize),
) -> Result<Vec<String>> {
    // An empty line (no tokens) translates to an empty line, without running the model.
    let ids: Vec<Vec<u32>> = lines.iter().map(|l| tok.encode(l)).collect();
    let nonempty: Vec<usize> = (0..ids.len()).filter(|&i| !ids[i].is_empty()).collect();
    let to_run: Vec<Vec<u32>> = nonempty.iter().map(|&i| ids[i].clone()).collect();
    let hyps = translate_ids(model, &to_run, opts, dev, on_batch)?;
    let mut out = vec![String::new(); lines.len()];
    for (&i, h) in nonempty.iter().zip(&hyps) {
        out[i] = tok.decode(&h.tokens);
    }
    Ok(out)
}

/// sacreBLEU's default corpus BLEU of `hyps` against `refs`.
pub fn bleu(hyps: &[String], refs: &[String]) -> Result<f64> {
    corpus_bleu(hyps, refs, &BleuOptions::default())
        .map(|s| s.score)
        .map_err(|e| Error::Usage(e.to_string()))
}

/// Saves model weights with the model config needed to rebuild it.
pub fn save_weights(path: &Path, params: &Params, model: &MtModelConfig) -> Result<()> {
    save_tagged(
        path,
        &params_tensors(params),
        WEIGHTS_FORMAT,
        [(
            "model",
            serde_json::to_string(model).expect("config serializes"),
        )],
    )
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
    if !run.is_dir() {
        return Err(Error::Usage(format!(
            "{}: no such run directory (create one with `transformer mt train --out DIR`)",
            run.display()
        )));
    }
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

/// Translation as a task on the [`crate::runner`]: length-bucketed batches in a new order
/// every epoch, the label-smoothed step with Adam and the warm-up schedule, validation by
/// loss and greedy BLEU (higher BLEU is better), beam-search BLEU on the test set.
struct MtTask {
    cfg: MtTrainConfig,
    model_cfg: MtModelConfig,
    model: MtModel,
    params: Params,
    vars: Vec<candle_core::Var>,
    opt: Adam,
    /// Gradients the fused ops write outside candle's `GradStore`, buffers reused.
    direct: DirectGrads,
    schedule: NoamSchedule,
    tokenizer: Subword,
    train: EncodedSplit,
    keep: Vec<usize>,
    valid: EncodedSplit,
    test_files: Option<PairSource>,
    device: Device,
    /// This epoch's batches.
    batches: Vec<PairBatch>,
    /// The test loss and sacreBLEU of the best model, once tested.
    test: Option<(f64, f64)>,
}

impl Task for MtTask {
    type Model = MtModel;
    const CHECKPOINT_FORMAT: &'static str = CHECKPOINT_FORMAT;
    const SELECTION: Selection = Selection::HigherBleu;

    fn epochs(&self) -> usize {
        self.cfg.epochs
    }
    fn checkpoint_interval(&self) -> usize {
        self.cfg.checkpoint_interval
    }
    fn config_toml(&self) -> String {
        self.cfg.to_toml()
    }
    fn model(&self) -> &MtModel {
        &self.model
    }
    fn params(&self) -> &Params {
        &self.params
    }
    fn build_model(&self, pb: &ParamBuilder) -> transformer_model::Result<MtModel> {
        MtModel::build(pb, &self.model_cfg)
    }
    fn save_weights(&self, path: &Path, params: &Params) -> Result<()> {
        save_weights(path, params, &self.model_cfg)
    }

    fn start_epoch(&mut self, epoch: usize) -> Result<usize> {
        let sp = self.tokenizer.specials();
        let seed = self
            .cfg
            .seed
            .wrapping_mul(1_000_003)
            .wrapping_add(epoch as u64);
        self.batches = pair_batches(
            &self.train.src,
            &self.train.tgt,
            &self.keep,
            self.cfg.max_tokens,
            sp,
            seed,
        );
        Ok(self
            .cfg
            .max_batches
            .map_or(self.batches.len(), |m| m.min(self.batches.len())))
    }

    fn train_step(&mut self, index: usize, step: usize, rng: &Rng) -> Result<StepStats> {
        let sp = self.tokenizer.specials();
        let b = &self.batches[index];
        let (src, tgt_in, tgt_out) = batch_tensors(b, &self.device)?;
        self.opt.lr = self.schedule.lr(step + 1);
        let (loss, nll) = train_step(
            &self.model,
            &self.vars,
            &mut self.opt,
            &self.direct,
            self.cfg.clip,
            [&src, &tgt_in, &tgt_out],
            sp.pad,
            self.cfg.label_smoothing,
            self.cfg.precision,
            rng,
        )?;
        Ok(StepStats {
            loss,
            nll,
            tokens: b.tgt_tokens,
        })
    }

    fn accumulate(&self) -> usize {
        self.cfg.accumulate
    }

    fn batch_tokens(&self, index: usize) -> usize {
        self.batches[index].tgt_tokens
    }

    fn backward(&mut self, index: usize, rng: &Rng) -> Result<(Gradients, StepStats)> {
        let pad = self.tokenizer.specials().pad;
        let b = &self.batches[index];
        let (src, tgt_in, tgt_out) = batch_tensors(b, &self.device)?;
        let l = self.model.loss_direct(
            &src,
            &tgt_in,
            &tgt_out,
            pad,
            self.cfg.label_smoothing,
            self.cfg.precision,
            Mode::Train(rng),
            &self.direct,
        )?;
        let grads = Gradients::from_backward(&l.loss, &self.vars, &self.direct)?;
        let stats = StepStats {
            loss: l.loss.to_dtype(DType::F64)?.to_scalar::<f64>()?,
            nll: l.nll.to_dtype(DType::F64)?.to_scalar::<f64>()?,
            tokens: b.tgt_tokens,
        };
        Ok((grads, stats))
    }

    fn update(&mut self, grads: &Gradients, step: usize) -> Result<()> {
        self.opt.lr = self.schedule.lr(step + 1);
        let (_, coef) = clip_coefficient(grads, self.cfg.clip)?;
        self.opt.step(grads, coef)?;
        Ok(())
    }

    fn data_hash(&self) -> u64 {
        let mut bytes = Vec::new();
        for (s, t) in self.train.src.iter().zip(&self.train.tgt) {
            bytes.extend(s.iter().flat_map(|x| x.to_le_bytes()));
            bytes.push(0xff);
            bytes.extend(t.iter().flat_map(|x| x.to_le_bytes()));
            bytes.push(0xfe);
        }
        bytes.extend(self.keep.iter().flat_map(|&k| (k as u64).to_le_bytes()));
        crate::dist::hash_bytes(&bytes)
    }

    fn log_due(&self, index: usize, batches: usize) -> bool {
        (index + 1).is_multiple_of(self.cfg.log_interval) || index + 1 == batches
    }

    fn log_line(&self, w: &LogWindow) -> (String, Metric) {
        let n = w.count.max(1) as f64;
        let (cur, cur_nll) = (w.loss_sum / n, w.nll_sum / n);
        let ms = w.seconds * 1e3 / n;
        let (epoch, batch, batches, lr) = (w.epoch, w.index + 1, w.batches, self.opt.lr);
        (
            format!(
                "| epoch {epoch:3} | {batch:5}/{batches:5} batches | lr {lr:.2e} | ms/batch {ms:6.1} | tok/s {:6.0} | loss {cur:5.2} | ppl {:7.2}",
                w.tokens as f64 / w.seconds.max(1e-9),
                cur_nll.exp()
            ),
            Metric::Train {
                step: w.step,
                epoch,
                batch,
                batches,
                lr,
                ms_per_batch: ms,
                loss: cur,
                ppl: cur_nll.exp(),
            },
        )
    }

    fn validate(&self, model: &MtModel, dist: &crate::dist::Dist) -> Result<Validation> {
        let dev = &self.device;
        let loss = evaluate_loss_on(model, &self.valid, self.cfg.max_tokens, dev, dist)?;
        let greedy = self.cfg.decode_options(1);
        let src = &self.valid.pairs.src;
        let mine = translate_lines(
            model,
            &self.tokenizer,
            &src[dist.shard(src.len())],
            &greedy,
            dev,
            |_, _| {},
        )?;
        let hyps = dist.gather_lines(mine)?;
        Ok(Validation {
            loss,
            bleu: Some(bleu(&hyps, &self.valid.pairs.tgt)?),
        })
    }

    fn epoch_lines(
        &self,
        epoch: usize,
        secs: f64,
        train_secs: f64,
        validated: &[(Weights, Validation)],
    ) -> Vec<String> {
        let mut lines = vec!["-".repeat(89)];
        for (weights, v) in validated {
            let head = match weights {
                Weights::Sgd => {
                    format!("| end of epoch {epoch:3} | time: {secs:6.1}s (train {train_secs:.1}s)")
                }
                Weights::Average => format!(
                    "| weight average (decay {}) {:>w$}",
                    self.cfg.average_decay,
                    "",
                    w = 9usize.saturating_sub(self.cfg.average_decay.to_string().len())
                ),
            };
            lines.push(format!(
                "{head} | valid loss {:5.3} | valid ppl {:7.2} | valid BLEU {:5.2} (greedy)",
                v.loss,
                v.loss.exp(),
                v.bleu.unwrap_or(0.0)
            ));
        }
        lines.push("-".repeat(89));
        lines
    }

    fn optimizer_state(&self) -> (Vec<(String, Tensor)>, Vec<(&'static str, String)>) {
        self.opt.checkpoint_state()
    }

    fn restore_optimizer(
        &mut self,
        tensors: &mut HashMap<String, Tensor>,
        meta: &HashMap<String, String>,
        path: &Path,
    ) -> Result<()> {
        self.opt.restore_checkpoint_state(tensors, meta, path)
    }

    /// The best model translates the test set with beam search.
    fn test(
        &mut self,
        run: &Path,
        state: &RunState,
        progress: &mut dyn Progress,
        dist: &crate::dist::Dist,
    ) -> Result<(Vec<Metric>, Option<f64>)> {
        let Some(src) = &self.test_files else {
            return Ok((Vec::new(), None));
        };
        let (cfg, dev) = (&self.cfg, &self.device);
        let best = load_run(run, dev)?;
        let data = EncodedSplit::encode(src.read()?, &self.tokenizer);
        let loss = evaluate_loss_on(&best.model, &data, cfg.max_tokens, dev, dist)?;
        let t = Instant::now();
        let mine = translate_lines(
            &best.model,
            &self.tokenizer,
            &data.pairs.src[dist.shard(data.pairs.src.len())],
            &cfg.decode_options(cfg.beam),
            dev,
            |done, total| progress.batch(cfg.epochs + 1, done, total),
        )?;
        let hyps = dist.gather_lines(mine)?;
        let b = bleu(&hyps, &data.pairs.tgt)?;
        let lc = corpus_bleu(&hyps, &data.pairs.tgt, &BleuOptions::lowercased_tokens())
            .map_err(|e| Error::Usage(e.to_string()))?;
        if dist.writes() {
            checkpoint::write_atomic(&run.join("test.hyp"), (hyps.join("\n") + "\n").as_bytes())?;
        }
        progress.line(&"=".repeat(89));
        progress.line(&format!(
            "| End of training | best: {} of epoch {} | test loss {loss:5.3} | test ppl {:7.2} (per word {:.2}) | test BLEU {b:5.2} (sacreBLEU, beam {}, {:.1}s)",
            match state.best_weights {
                Weights::Sgd => "the trained weights",
                Weights::Average => "the weight average",
            },
            state.best_epoch,
            loss.exp(),
            word_perplexity(loss, &data),
            cfg.beam,
            t.elapsed().as_secs_f64()
        ));
        progress.line(&format!("| {}: {:.2}", lc.options.label(), lc.score));
        progress.line(&"=".repeat(89));
        self.test = Some((loss, b));
        let record = Metric::Test {
            step: state.step,
            loss,
            ppl: loss.exp(),
            weights: state.best_weights,
            bleu: Some(b),
        };
        Ok((vec![record], Some(loss)))
    }
}

/// Above this share of `<unk>` tokens in a fine-tuning run's training data (in percent),
/// the log warns that the inherited tokenizer does not fit the data.
pub const UNKNOWN_WARN_PERCENT: f64 = 1.0;

/// The settings that fix the model's shape and its tokenizer: a run started with
/// `--init-from` takes them from the run it starts from.
pub const MODEL_SHAPE_KEYS: &[&str] = &[
    "arch",
    "rnn_hidden",
    "tokenizer",
    "vocab_size",
    "share_embeddings",
    "d_model",
    "nhead",
    "encoder_layers",
    "decoder_layers",
    "dim_feedforward",
    "norm_first",
];

/// `cfg` with the model's shape and tokenizer settings ([`MODEL_SHAPE_KEYS`]) of `from_cfg`,
/// the configuration of the run at `from`, and its dropout unless `given` sets one. A shape
/// setting in `given` that differs from that run's is an error that lists each one.
pub fn inherit_model(
    cfg: &MtTrainConfig,
    from_cfg: &MtTrainConfig,
    from: &Path,
    given: &[runner::Given],
) -> Result<MtTrainConfig> {
    let table = |c: &MtTrainConfig| match toml::Value::try_from(c) {
        Ok(toml::Value::Table(t)) => t,
        _ => toml::Table::new(),
    };
    let (mut merged, theirs) = (table(cfg), table(from_cfg));
    let show = |v: Option<&toml::Value>| v.map_or("none".to_string(), |v| v.to_string());
    let mut conflicts = Vec::new();
    let mut seen = HashSet::new();
    for g in given {
        if !seen.insert(&g.key) {
            continue;
        }
        if MODEL_SHAPE_KEYS.contains(&g.key.as_str()) && merged.get(&g.key) != theirs.get(&g.key) {
            let line = format!(
                "  {}: {} (that run has {} = {})",
                g.from,
                show(merged.get(&g.key)),
                g.key,
                show(theirs.get(&g.key))
            );
            conflicts.push(line);
        }
    }
    if !conflicts.is_empty() {
        return Err(Error::Usage(format!(
            "--init-from {}: the model's shape and tokenizer come from that run, and these \
             settings differ from it:\n{}\nDrop them to fine-tune that model (its {}), or \
             train a new model without --init-from.",
            from.display(),
            conflicts.join("\n"),
            MODEL_SHAPE_KEYS.join(", ")
        )));
    }
    let mut keys: Vec<&str> = MODEL_SHAPE_KEYS.to_vec();
    if !given.iter().any(|g| g.key == "dropout") {
        keys.push("dropout");
    }
    for key in keys {
        match theirs.get(key) {
            Some(v) => merged.insert(key.to_string(), v.clone()),
            None => merged.remove(key),
        };
    }
    toml::Value::Table(merged)
        .try_into()
        .map_err(|e: toml::de::Error| Error::Config {
            path: config_path(from),
            msg: e.to_string(),
        })
}

/// One training source's pairs, as the log reports them.
struct SourceCount {
    /// [`PairSource::describe`].
    name: String,
    /// Pairs read.
    read: usize,
    /// Of those, dropped as pairs of a held-out test set ([`CorpusFiles::exclude`]).
    excluded: usize,
}

/// `pairs` without those in `excluded` (both sides equal).
fn without(pairs: Pairs, excluded: &HashSet<(String, String)>) -> Pairs {
    let mut out = Pairs::default();
    for (s, t) in pairs.src.into_iter().zip(pairs.tgt) {
        if !excluded.contains(&(s.clone(), t.clone())) {
            out.src.push(s);
            out.tgt.push(t);
        }
    }
    out
}

/// `name: N pairs (K kept)` for each training source (with `E dropped as held-out test
/// pairs` where some were), `sizes` in reading order and `keep` the indices of the pairs
/// kept for training (ascending) among those not dropped.
fn per_source_counts(sizes: &[SourceCount], keep: &[usize]) -> String {
    let mut start = 0;
    let mut parts = Vec::with_capacity(sizes.len());
    for c in sizes {
        let end = start + c.read - c.excluded;
        let lo = keep.partition_point(|&i| i < start);
        let hi = keep.partition_point(|&i| i < end);
        let dropped = match c.excluded {
            0 => String::new(),
            e => format!(", {e} dropped as held-out test pairs"),
        };
        parts.push(format!(
            "{}: {} pairs ({} kept{dropped})",
            c.name,
            c.read,
            hi - lo
        ));
        start = end;
    }
    parts.join("; ")
}

/// Trains (or resumes) a run on the [`crate::runner`]; see the module docs for the loop and
/// the files.
pub fn train(opts: &MtTrainOptions, progress: &mut dyn Progress) -> Result<MtSummary> {
    let run = &opts.out;
    let dev = &opts.device;
    // Rank 0 alone creates, locks and writes the run directory; the other ranks read it.
    let writer = opts.dist.writes();
    let (resuming, _lock) = if writer {
        let (r, lock) = open_run_dir(run, opts.resume)?;
        (r, Some(lock))
    } else {
        (opts.resume, None)
    };
    let mut asked = opts.config.clone();
    asked.make_paths_absolute();

    // Configuration, tokenizer and checkpoint: fresh or from the checkpoint.
    let (mut cfg, saved) = if resuming {
        let saved = Saved::load(run, CHECKPOINT_FORMAT, dev)?;
        let text = saved.config_text(run)?;
        let mut cfg: MtTrainConfig = toml::from_str(text).map_err(|e| Error::Checkpoint {
            path: checkpoint_path(run),
            msg: e.to_string(),
        })?;
        // A run from before weight averaging existed continues as it was configured: without.
        if predates_averaging(text) {
            cfg.average_decay = 0.0;
        }
        let (cfg, notes) =
            runner::resume_config(run, &cfg, &asked, &opts.given, MAY_CHANGE_ON_RESUME)?;
        for n in &notes {
            progress.line(n);
        }
        runner::check_global_batch(run, &saved.state, cfg.accumulate, &opts.dist)?;
        runner::check_recorded_paths(
            run,
            &[
                ("train_src", &cfg.train_src),
                ("train_tgt", &cfg.train_tgt),
                ("valid_src", &cfg.valid_src),
                ("valid_tgt", &cfg.valid_tgt),
                ("test_src", &cfg.test_src),
                ("test_tgt", &cfg.test_tgt),
                ("data", &cfg.data),
            ],
            &opts.given,
        )?;
        if writer && !notes.is_empty() {
            checkpoint::write_atomic(&config_path(run), cfg.to_toml().as_bytes())?;
        }
        (cfg, Some(saved))
    } else {
        (asked, None)
    };
    // Fine-tuning: the run the weights and the tokenizer come from (a fresh run only; a
    // resumed one continues from its own checkpoint and its own copy of the tokenizer).
    let init = match (cfg.init_from.clone(), resuming) {
        (Some(from), false) => {
            let loaded = load_run(&from, dev).map_err(|e| {
                Error::Usage(format!(
                    "--init-from {}: {e} (give the directory of a finished `transformer mt \
                     train` run)",
                    from.display()
                ))
            })?;
            cfg = inherit_model(&cfg, &loaded.config, &from, &opts.given)?;
            Some((from, loaded))
        }
        _ => None,
    };
    cfg.validate()?;
    let files = cfg.sources()?;

    let t0 = Instant::now();
    // The sources one by one (the same pairs, in the same order, as `PairSource::read_all`),
    // to count each one's pairs.
    let excluded: HashSet<(String, String)> = {
        let p = PairSource::read_all(&files.exclude)?;
        p.src.into_iter().zip(p.tgt).collect()
    };
    let mut train_pairs = Pairs::default();
    let mut source_sizes = Vec::with_capacity(files.train.len());
    for source in &files.train {
        let mut pairs = source.read()?;
        let read = pairs.len();
        if !excluded.is_empty() {
            pairs = without(pairs, &excluded);
        }
        source_sizes.push(SourceCount {
            name: source.describe(),
            read,
            excluded: read - pairs.len(),
        });
        train_pairs.extend(pairs);
    }
    let tokenizer = if resuming {
        Subword::load(&tokenizer_path(run))?
    } else if let Some((_, loaded)) = &init {
        if writer {
            loaded.tokenizer.save(&tokenizer_path(run))?;
        }
        loaded.tokenizer.clone()
    } else {
        let texts = train_pairs.src.iter().chain(&train_pairs.tgt);
        let origin = files.train[0].first_file().to_path_buf();
        let tok = train_tokenizer(cfg.tokenizer, cfg.vocab_size, texts, &origin)?;
        if writer {
            tok.save(&tokenizer_path(run))?;
        }
        tok
    };
    let train_data = EncodedSplit::encode(train_pairs, &tokenizer);
    let mut valid = EncodedSplit::encode(files.valid.read()?, &tokenizer);
    if let Some(n) = cfg.max_valid {
        valid.truncate(n);
    }
    let (keep, stats) = keep_for_training(
        &train_data.src,
        &train_data.tgt,
        PairFilter::training(cfg.max_sentence_tokens),
    );
    if keep.is_empty() {
        return Err(Error::Usage(format!(
            "no training pairs left ({stats}); check the files, or raise max_sentence_tokens"
        )));
    }
    let vocab = tokenizer.vocab_size();
    progress.line(&format!(
        "data: {stats}; validation {} pairs; joint {} vocabulary {vocab} ({:.1}s)",
        valid.src.len(),
        cfg.tokenizer.describe(),
        t0.elapsed().as_secs_f64()
    ));
    let unk_share = |side: &[Vec<u32>]| {
        let total: usize = side.iter().map(Vec::len).sum();
        let unk = side
            .iter()
            .flatten()
            .filter(|&&i| i == transformer_text::Specials::FIXED.unk)
            .count();
        100.0 * unk as f64 / total.max(1) as f64
    };
    progress.line(&format!(
        "data: <unk> pieces in validation: source {:.2}%, target {:.2}%{}",
        unk_share(&valid.src),
        unk_share(&valid.tgt),
        match cfg.tokenizer {
            TokenizerKind::Bpe | TokenizerKind::Unigram => {
                " (characters without a piece; --tokenizer bpe-bytes or unigram-bytes spells them in bytes)"
            }
            _ => "",
        }
    ));
    if source_sizes.len() > 1 {
        progress.line(&format!(
            "data: training sources: {}",
            per_source_counts(&source_sizes, &keep)
        ));
    }
    if cfg.reverse {
        let (s, t) = cfg
            .language_pair()
            .map_or(("target".into(), "source".into()), |p| p);
        progress.line(&format!(
            "data: reversed (--reverse): every split's sides exchanged, translating {s} to {t}"
        ));
    }
    if cfg.corpus == Some(Corpus::KoEnAll) && cfg.train_src.is_none() {
        let data = cfg
            .data
            .clone()
            .or_else(default_data_dir)
            .unwrap_or_default();
        let mut held = Vec::new();
        for (name, source) in ko_en_test_sets(&data) {
            held.push(format!("{name} {} pairs", source.read()?.len()));
        }
        progress.line(&format!(
            "data: held out for testing, not trained on: {} (mt::ko_en_test_sets)",
            held.join(", ")
        ));
    }
    if let Some((from, loaded)) = &init {
        let unk = tokenizer.specials().unk;
        let total: usize = train_data
            .src
            .iter()
            .chain(&train_data.tgt)
            .map(Vec::len)
            .sum();
        let unknown = train_data
            .src
            .iter()
            .chain(&train_data.tgt)
            .flatten()
            .filter(|&&id| id == unk)
            .count();
        let share = 100.0 * unknown as f64 / total.max(1) as f64;
        progress.line(&format!(
            "init: weights and tokenizer from {} ({}); fresh Adam, this run's schedule; \
             <unk> in the training data under that tokenizer: {unknown} of {total} tokens \
             ({share:.2}%)",
            from.display(),
            loaded
                .note
                .clone()
                .unwrap_or_else(|| "its best.safetensors".into())
        ));
        if share > UNKNOWN_WARN_PERCENT {
            progress.line(&format!(
                "warning: {share:.2}% of the training tokens are <unk> (over \
                 {UNKNOWN_WARN_PERCENT}%): the inherited tokenizer does not cover this data's \
                 characters, and the model cannot learn or produce them; fine-tune from a run \
                 whose tokenizer was trained on text like this, or train from scratch"
            ));
        }
    }
    // bf16 only where it measures faster here (fresh Transformer runs; a resumed run keeps
    // its choice; the recurrent models train in f32).
    let mut cfg = cfg;
    let precision_line = match (cfg.precision, cfg.arch) {
        (Precision::F32, _) => None,
        (_, Arch::Gru | Arch::GruDot | Arch::GruBahdanau) => Some(
            "precision: bf16 applies to the Transformer's output layer only: training in f32"
                .to_string(),
        ),
        _ if resuming => Some(crate::precision::resumed_line(BF16_COVERS)),
        _ => {
            // The output layer runs on a batch's target tokens (at most the token budget).
            let rows = cfg.max_tokens.min(2048);
            let (p, measure) = (cfg.precision, cfg.measure_precision);
            let choice =
                crate::precision::choose(p, measure, rows, cfg.d_model, vocab, BF16_COVERS)?;
            cfg.precision = choice.precision;
            choice.line
        }
    };
    if writer && !resuming {
        checkpoint::write_atomic(&config_path(run), cfg.to_toml().as_bytes())?;
        let _ = std::fs::remove_file(metrics_path(run));
    }

    let model_cfg = match &init {
        Some((_, loaded)) => loaded.model_config.clone(),
        None => cfg.model_config(vocab),
    };
    let pb = ParamBuilder::new(DType::F32, dev, cfg.seed);
    let model = MtModel::build(&pb, &model_cfg)?;
    let params = pb.params();
    if let (Some((from, loaded)), false) = (&init, resuming) {
        let tensors: HashMap<String, Tensor> = params_tensors(&loaded.params).into_iter().collect();
        params.assign(&tensors).map_err(|e| Error::Checkpoint {
            path: from.clone(),
            msg: e.to_string(),
        })?;
    }
    let vars = params.vars();
    progress.line(&match &model_cfg {
        MtModelConfig::Transformer(_) => format!(
            "model: Transformer, {} parameters ({}+{} layers, d_model {}, {} heads, FFN {}, shared embeddings: {})",
            params.num_elements(),
            cfg.encoder_layers,
            cfg.decoder_layers,
            cfg.d_model,
            cfg.nhead,
            cfg.dim_feedforward,
            cfg.share_embeddings
        ),
        MtModelConfig::Rnn(c) => format!(
            "model: {}, {} parameters (embeddings {}, bidirectional GRU encoder {} x 2, GRU decoder {}, attention: {:?})",
            cfg.arch.name(),
            params.num_elements(),
            c.emb,
            c.hidden,
            2 * c.hidden,
            c.attention
        ),
    });
    if let Some(line) = &precision_line {
        progress.line(line);
    }
    let mut task = MtTask {
        opt: Adam::new(vars.clone(), 0.0)?,
        direct: DirectGrads::new(),
        schedule: NoamSchedule {
            d_model: cfg.d_model,
            warmup: cfg.warmup,
            factor: cfg.lr_factor,
        },
        vars,
        model_cfg,
        model,
        params,
        tokenizer,
        train: train_data,
        keep,
        valid,
        test_files: files.test,
        device: dev.clone(),
        batches: Vec::new(),
        test: None,
        cfg,
    };
    let (seed, decay) = (task.cfg.seed, task.cfg.average_decay);
    let s = runner::run(
        &mut task,
        opts,
        saved,
        seed.wrapping_add(1),
        decay,
        AVERAGE_EVERY,
        progress,
    )?;
    Ok(MtSummary {
        state: s.state,
        test: task.test,
        step_losses: s.step_losses,
    })
}

/// `(1, H, Q, K)` attention weights as `[head][query][key]`.
fn heads_of(w: &Tensor) -> Result<Vec<Vec<Vec<f32>>>> {
    Ok(w.squeeze(0)?.to_dtype(DType::F32)?.to_vec3::<f32>()?)
}

/// Translates `sentence` (greedy for beam 1, else beam search) and returns every attention
/// the model computed for it, for pictures ([`crate::viz`]): the Transformer's encoder
/// self-attention, decoder self-attention and encoder-decoder attention of every layer and
/// head, or a recurrent model's attention over the source. The translation is fed back
/// through the model with teacher forcing, which gives the same weights as decoding step by
/// step.
pub fn attention_set(
    run: &LoadedMt,
    sentence: &str,
    opts: &DecodeOptions,
    dev: &Device,
) -> Result<crate::viz::AttentionSet> {
    let tok = &run.tokenizer;
    let mut ids = tok.encode(sentence);
    // The length rule of `translate_ids` (the caller warns with `over_long_lines`).
    if let Some(max) = max_source_tokens(&run.model) {
        ids.truncate(max);
    }
    if ids.is_empty() {
        return Err(Error::Usage(
            "the sentence has no tokens: give a sentence to translate".into(),
        ));
    }
    let hyp = translate_ids(&run.model, std::slice::from_ref(&ids), opts, dev, |_, _| {})?
        .remove(0)
        .tokens;
    attention_of(&run.model, tok, run.config.arch, sentence, &ids, &hyp, dev)
}

/// Every attention of `model` translating `sentence` (tokens `ids`, without `<eos>`) as
/// `hyp` (output tokens, without `<bos>` and `<eos>`), fed through the model with teacher
/// forcing: what [`attention_set`] returns once it has translated.
pub fn attention_of(
    model: &MtModel,
    tok: &Subword,
    arch: Arch,
    sentence: &str,
    ids: &[u32],
    hyp: &[u32],
    dev: &Device,
) -> Result<crate::viz::AttentionSet> {
    let sp = tok.specials();
    let mut src_ids = ids.to_vec();
    src_ids.push(sp.eos);
    let mut tgt_ids = vec![sp.bos];
    tgt_ids.extend(hyp);
    let src = Tensor::from_vec(src_ids.clone(), (1, src_ids.len()), dev)?;
    let tgt_in = Tensor::from_vec(tgt_ids.clone(), (1, tgt_ids.len()), dev)?;
    let name = |ids: &[u32]| -> Vec<String> { ids.iter().map(|&i| tok.token(i)).collect() };
    let mut tgt_out = hyp.to_vec();
    tgt_out.push(sp.eos);
    let mut set = crate::viz::AttentionSet {
        source: sentence.to_string(),
        translation: tok.decode(hyp),
        src_tokens: name(&src_ids),
        tgt_in_tokens: name(&tgt_ids),
        tgt_out_tokens: name(&tgt_out),
        model: arch.name().to_string(),
        ..Default::default()
    };
    match model {
        MtModel::Transformer(m) => {
            let masks = transformer_model::seq2seq::Seq2SeqMasks::new(&src, &tgt_in, sp.pad)?;
            let (memory, enc) = m.encode_with_weights(&src, Some(&masks.src), Mode::Eval)?;
            let (_, dec) = m.decode_with_weights(
                &tgt_in,
                &memory,
                Some(&masks.tgt),
                Some(&masks.memory),
                Mode::Eval,
            )?;
            set.encoder = enc.iter().map(heads_of).collect::<Result<_>>()?;
            set.decoder = dec
                .iter()
                .map(|w| heads_of(&w.self_attn))
                .collect::<Result<_>>()?;
            set.cross = dec
                .iter()
                .map(|w| heads_of(&w.cross_attn))
                .collect::<Result<_>>()?;
        }
        MtModel::Rnn(m) => {
            let (_, w) = m.decode_features(&src, &tgt_in, sp.pad, Mode::Eval)?;
            let w = w.ok_or_else(|| {
                Error::Usage(format!(
                    "the {} model has no attention to show: it reads the source as one \
                     fixed-size vector (train gru-dot or gru-bahdanau for attention)",
                    arch.name()
                ))
            })?;
            set.cross = vec![vec![w
                .squeeze(0)?
                .to_dtype(DType::F32)?
                .to_vec2::<f32>()?]];
        }
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_source_counts_split_the_kept_pairs_by_source() {
        let count = |name: &str, read, excluded| SourceCount {
            name: name.into(),
            read,
            excluded,
        };
        let sizes = [count("a", 3, 0), count("b", 0, 0), count("c", 6, 2)];
        // Pairs 0..3 are a's, 3..7 c's (2 of its 6 dropped before); 1 and 5 were skipped.
        let keep = [0, 2, 3, 4, 6];
        assert_eq!(
            per_source_counts(&sizes, &keep),
            "a: 3 pairs (2 kept); b: 0 pairs (0 kept); c: 6 pairs (3 kept, 2 dropped as \
             held-out test pairs)"
        );
        let mut p = Pairs::default();
        for (s, t) in [("x", "1"), ("y", "2"), ("x", "2")] {
            p.src.push(s.into());
            p.tgt.push(t.into());
        }
        let drop: HashSet<(String, String)> = [("x".to_string(), "1".to_string())].into();
        let left = without(p, &drop);
        assert_eq!(left.src, ["y", "x"]);
        assert_eq!(left.tgt, ["2", "2"]);
    }

    #[test]
    fn reverse_follows_into_the_language_codes_and_explicit_codes_win() {
        let mut cfg = MtTrainConfig {
            corpus: Some(Corpus::KoEn),
            reverse: true,
            ..MtTrainConfig::default()
        };
        assert_eq!(cfg.language_pair(), Some(("en".into(), "ko".into())));
        cfg.src_lang = Some("en-GB".into());
        assert_eq!(cfg.language_pair(), Some(("en-GB".into(), "ko".into())));
        let toml = cfg.to_toml();
        assert!(toml.contains("reverse = true"), "{toml}");
        assert_eq!("ko-en-all".parse::<Corpus>(), Ok(Corpus::KoEnAll));
        assert!(toml::from_str::<MtTrainConfig>("corpus = \"ko-en-all\"").is_ok());
    }
}
