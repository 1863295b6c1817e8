//! The crate's one error type. Every variant that comes from a file names the file, and the
//! line where one applies, so that the binary can print it as it is and the user knows what to
//! fix.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::split::Split;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong between a text file and a grid of ids.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The data directory given for a corpus does not exist.
    #[error(
        "data directory {} does not exist: choose a data folder that holds train.txt, \
         valid.txt and test.txt (WikiText-2's tokenized splits)",
        .dir.display()
    )]
    MissingDataDir {
        /// The directory that was looked for.
        dir: PathBuf,
    },

    /// One split file of a corpus directory is missing.
    #[error(
        "the {split} split {} does not exist: choose a data folder that holds train.txt, \
         valid.txt and test.txt (WikiText-2's tokenized splits)",
        .path.display()
    )]
    MissingSplit {
        /// Which split.
        split: Split,
        /// The file that was looked for.
        path: PathBuf,
    },

    /// A file that was asked for by path does not exist.
    #[error("{} does not exist", .path.display())]
    FileNotFound {
        /// The file that was looked for.
        path: PathBuf,
    },

    /// Any other failure to open, read or write a file.
    #[error("cannot {action} {}: {source}", .path.display())]
    Io {
        /// What was being done: "read", "create", "write".
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },

    /// A text file is not UTF-8.
    #[error(
        "{}:{line}:{column}: invalid UTF-8 (byte 0x{byte:02x} at file offset {byte_offset}); \
         the file must be UTF-8 text",
        .path.display()
    )]
    InvalidUtf8 {
        /// The file.
        path: PathBuf,
        /// 1-based line number (lines end at `\n`).
        line: usize,
        /// 1-based byte column of the first invalid byte within the line.
        column: usize,
        /// 0-based byte offset of the first invalid byte from the start of the file.
        byte_offset: u64,
        /// The first invalid byte.
        byte: u8,
    },

    /// A split file has no tokens at all (empty, or only whitespace).
    #[error(
        "{} has no tokens (it is empty or holds only whitespace){}",
        .path.display(),
        split_hint(*.split)
    )]
    NoTokens {
        /// The file.
        path: PathBuf,
        /// The split, when the file was read as part of a corpus.
        split: Option<Split>,
    },

    /// A vocabulary entry is unusable. `path` is `None` for [`crate::Vocab::from_tokens`],
    /// where `line` is the 1-based position in the list.
    #[error("{}: {problem}", location(.path.as_deref(), *.line))]
    VocabEntry {
        /// The vocabulary file, if the vocabulary came from one.
        path: Option<PathBuf>,
        /// 1-based line in the file (or 1-based position in the token list).
        line: usize,
        /// What is wrong with the entry.
        problem: VocabProblem,
    },

    /// A vocabulary has no `<unk>` token, so unknown words would have no id.
    #[error(
        "{}: no `<unk>` token; every vocabulary needs one (it is the id of unknown words)",
        whole(.path.as_deref())
    )]
    NoUnk {
        /// The vocabulary file, if the vocabulary came from one.
        path: Option<PathBuf>,
    },

    /// A vocabulary file has no tokens.
    #[error("{}: the vocabulary file lists no tokens", .path.display())]
    EmptyVocab {
        /// The vocabulary file.
        path: PathBuf,
    },

    /// A gzip file could not be decompressed.
    #[error(
        "{}: not a readable gzip file ({source}); pass the .gz file as distributed, or the \
         uncompressed text without the .gz suffix",
        .path.display()
    )]
    Gzip {
        /// The file.
        path: PathBuf,
        /// The decompressor's error.
        #[source]
        source: io::Error,
    },

    /// The two sides of a parallel corpus have different numbers of lines.
    #[error(
        "{} has {src_lines} lines but {} has {tgt_lines}: line i of the source must be the \
         translation of line i of the target; pass the two files of one split",
        .src.display(),
        .tgt.display()
    )]
    LineCountMismatch {
        /// The source file.
        src: PathBuf,
        /// Its line count.
        src_lines: usize,
        /// The target file.
        tgt: PathBuf,
        /// Its line count.
        tgt_lines: usize,
    },

    /// A parallel corpus has no sentence pairs (or none left after the documented rules).
    #[error("{}: no sentence pairs{hint}", .path.display())]
    EmptyCorpus {
        /// The (source) file.
        path: PathBuf,
        /// What was skipped, if anything.
        hint: String,
    },

    /// A tab-separated line lacks a column.
    #[error(
        "{}:{line}: expected at least {needed} tab-separated columns, found {found}",
        .path.display()
    )]
    MissingColumn {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// Columns needed.
        needed: usize,
        /// Columns found.
        found: usize,
    },

    /// A subword tokenizer could not be trained, saved or loaded.
    #[error("{}: {msg}", .path.display())]
    Tokenizer {
        /// The tokenizer file (or the run directory when training one).
        path: PathBuf,
        /// What went wrong and what to do.
        msg: String,
    },

    /// `batchify` was asked for zero columns.
    #[error("batch size must be at least 1, got 0")]
    ZeroBatchSize,

    /// A split is too short to give one (input, target) window with this batch size.
    #[error(
        "the split has {tokens} tokens, too few for batch size {batch_size}: batchify needs at \
         least {needed} (2 rows of {batch_size} columns) to form one input/target pair; use a \
         smaller batch size or a longer file"
    )]
    TooFewTokens {
        /// Tokens in the split.
        tokens: usize,
        /// The batch size asked for.
        batch_size: usize,
        /// The fewest tokens that work: `2 * batch_size`.
        needed: usize,
    },
}

/// What is wrong with one vocabulary entry (see [`Error::VocabEntry`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VocabProblem {
    /// The token appears earlier too.
    Duplicate {
        /// The token.
        token: String,
        /// 1-based line (or position) of its first appearance.
        first_line: usize,
    },
    /// The entry is empty.
    Empty,
    /// The token contains whitespace, which `basic_english` never produces.
    Whitespace {
        /// The token.
        token: String,
    },
}

impl fmt::Display for VocabProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Duplicate { token, first_line } => write!(
                f,
                "duplicate token {token:?} (first listed at line {first_line}); \
                 a vocabulary lists each token once"
            ),
            Self::Empty => write!(
                f,
                "empty token; a vocabulary lists one non-empty token per line"
            ),
            Self::Whitespace { token } => write!(
                f,
                "token {token:?} contains whitespace, which the basic_english tokenizer never \
                 produces, so it could never be looked up"
            ),
        }
    }
}

fn split_hint(split: Option<Split>) -> String {
    match split {
        Some(split) => format!(
            "; the {split} split must hold text: choose a data folder that holds \
             WikiText-2's train.txt, valid.txt and test.txt"
        ),
        None => String::new(),
    }
}

fn location(path: Option<&Path>, line: usize) -> String {
    match path {
        Some(path) => format!("{}:{line}", path.display()),
        None => format!("vocabulary token list, entry {line}"),
    }
}

fn whole(path: Option<&Path>) -> String {
    match path {
        Some(path) => path.display().to_string(),
        None => "vocabulary token list".to_string(),
    }
}

/// The [`Error::InvalidUtf8`] for a whole-file buffer whose first `valid_up_to` bytes are UTF-8.
pub(crate) fn utf8_error(path: &Path, bytes: &[u8], valid_up_to: usize) -> Error {
    let before = &bytes[..valid_up_to];
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    Error::InvalidUtf8 {
        path: path.to_path_buf(),
        line: before.iter().filter(|&&b| b == b'\n').count() + 1,
        column: valid_up_to - line_start + 1,
        byte_offset: valid_up_to as u64,
        byte: bytes[valid_up_to],
    }
}
