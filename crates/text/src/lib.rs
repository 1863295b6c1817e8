//! Text for the WikiText-2 language model of PyTorch's tutorial "Language Modeling with
//! nn.Transformer and torchtext": everything between a text file and a grid of token ids.
//! No tensor dependency; ids are `u32`.
//!
//! The path a split takes, one module per step:
//!
//! 1. [`tokenize`]: a line becomes tokens with torchtext's `basic_english` rules.
//! 2. [`vocab`]: tokens become ids with a vocabulary built from the training split, as
//!    `build_vocab_from_iterator(..., specials=["<unk>"])` does (id 0 = `<unk>`, the default).
//! 3. [`corpus`]: a split file becomes one id stream (the tutorial's `data_process`).
//! 4. [`batch`]: the stream becomes `bsz` columns (`batchify`) read in `bptt`-row windows
//!    (`get_batch`), sequence-first like the tutorial.
//!
//! Translation adds subword tokenizers ([`subword`]), sentence pairs ([`parallel`]), batches
//! of pairs of similar lengths ([`bucket`]) and sacreBLEU's BLEU and chrF ([`score`]);
//! [`sentencepiece`] reads the SentencePiece `.model` files of published translation models.
//!
//! The steps on two lines in memory, and a BLEU score:
//!
//! ```
//! use transformer_text::score::{corpus_bleu, BleuOptions};
//! use transformer_text::{basic_english, batchify, Vocab};
//!
//! let lines = ["The cat sat on the mat.", "The dog sat on the log."];
//! let tokens: Vec<String> = lines.iter().flat_map(|l| basic_english(l)).collect();
//! assert_eq!(tokens[..7], ["the", "cat", "sat", "on", "the", "mat", "."]);
//!
//! // `<unk>` is id 0, then tokens by descending count: "the" (4 times) is id 1.
//! let vocab = Vocab::build(&tokens);
//! let ids = vocab.encode(&tokens);
//! assert_eq!((ids[0], vocab.id("zebra")), (1, 0));
//!
//! // 14 ids in 2 columns of 7 rows, read in windows of at most 3 rows.
//! let grid = batchify(&ids, 2)?;
//! assert_eq!((grid.rows, grid.cols), (7, 2));
//! let window = grid.windows(3).next().unwrap();
//! assert_eq!((window.seq_len, window.batch_size), (3, 2));
//! assert_eq!(window.target[..2], grid.row(1)[..]);
//!
//! // sacreBLEU's corpus BLEU (13a tokenizer, exp smoothing), one reference per line.
//! let hyps = ["the cat sat on the mat"];
//! let refs = ["the cat sat on the mat"];
//! let bleu = corpus_bleu(&hyps, &refs, &BleuOptions::default())?;
//! assert!((bleu.score - 100.0).abs() < 1e-9);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The WikiText-2 splits from their files:
//!
//! ```no_run
//! use transformer_text::{batchify, Corpus};
//!
//! let corpus = Corpus::load("data/wikitext-2".as_ref())?;
//! let train = batchify(&corpus.train, 20)?;
//! for batch in train.windows(35) {
//!     // batch.input and batch.target: (seq_len, 20) row-major
//! }
//! # Ok::<(), transformer_text::Error>(())
//! ```

#![warn(missing_docs)]

pub mod batch;
pub mod bucket;
pub mod corpus;
pub mod error;
pub mod parallel;
pub mod published;
pub mod score;
pub mod sentence;
pub mod sentencepiece;
pub mod specials;
mod split;
pub mod subword;
pub mod tokenize;
pub mod vocab;

pub use batch::{batchify, get_batch, Batch, Batched, Windows};
pub use corpus::{build_vocab, read_split, Corpus, Split};
pub use error::{Error, Result, VocabProblem};
pub use subword::{Specials, Subword, TextTokenizer};
pub use tokenize::basic_english;
pub use vocab::{Vocab, UNK, VOCAB_HEADER};

/// The byte order mark U+FEFF that some editors (Notepad, Excel's "UTF-8" export) write at
/// the start of a UTF-8 file.
pub const BOM: char = '\u{feff}';

/// `text` without a byte order mark at its start: a file or stdin read as text begins after
/// it, so that it never reaches a tokenizer or a vocabulary as a character.
pub fn strip_bom(text: &str) -> &str {
    text.strip_prefix(BOM).unwrap_or(text)
}
