//! The bundled corpora and their held-out test sets, the presets, and the tokenizer choice.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use transformer_text::parallel::{PairSource, Side, Slice};
use transformer_text::subword::{BpeOptions, Subword};

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
        by_config_name(s).ok_or_else(|| {
            format!(
                "unknown corpus {s:?}: use multi30k-de-en, ko-en or ko-en-all, or give files with \
                 --train-src/--train-tgt/--valid-src/--valid-tgt"
            )
        })
    }
}

/// The variant of a unit-variant enum that `s` names as configuration files name it (its
/// serde name: `ko-en-all`, `bpe-bytes`), for parsing flags by the same names; `None` for a
/// name it does not have.
fn by_config_name<T: serde::de::DeserializeOwned>(s: &str) -> Option<T> {
    use serde::de::value::{Error, StrDeserializer};
    T::deserialize(StrDeserializer::<Error>::new(s)).ok()
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

impl std::str::FromStr for MtPreset {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        by_config_name(s).ok_or_else(|| format!("unknown preset {s:?}: use small, base or big"))
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
        by_config_name(s).ok_or_else(|| {
            format!("unknown tokenizer {s:?}: use bpe, bpe-bytes, unigram, unigram-bytes or words")
        })
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
        assert!("Small"
            .parse::<MtPreset>()
            .unwrap_err()
            .contains("small, base or big"));
        assert!("ko_en"
            .parse::<Corpus>()
            .unwrap_err()
            .contains("unknown corpus"));
        assert!("bpe bytes".parse::<TokenizerKind>().is_err());
    }
}
