//! The bundled corpora's files and their held-out test sets, and training the tokenizer.

use crate::error::{Error, Result};
use std::path::Path;
use transformer_runtime::config::{Corpus, TokenizerKind};
use transformer_text::parallel::{PairSource, Side, Slice};
use transformer_text::subword::{BpeOptions, Subword};

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

/// The files of `corpus` under `data` (the folder holding `multi30k/` and `ko-en/`).
pub fn corpus_files(corpus: Corpus, data: &Path) -> CorpusFiles {
    let files = |dir: &Path, stem: &str, s: &str, t: &str| PairSource::Files {
        src: dir.join(format!("{stem}{s}")),
        tgt: dir.join(format!("{stem}{t}")),
    };
    match corpus {
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
    let mut train = corpus_files(Corpus::KoEn, data).train;
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
