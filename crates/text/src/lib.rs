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

pub mod batch;
pub mod bucket;
pub mod corpus;
pub mod error;
pub mod parallel;
pub mod score;
pub mod subword;
pub mod tokenize;
pub mod vocab;

pub use batch::{batchify, get_batch, Batch, Batched, Windows};
pub use corpus::{build_vocab, read_split, Corpus, Split};
pub use error::{Error, Result, VocabProblem};
pub use subword::{Specials, Subword, TextTokenizer};
pub use tokenize::basic_english;
pub use vocab::{Vocab, UNK, VOCAB_HEADER};
