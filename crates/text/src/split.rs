//! The three splits of a corpus (below both [`crate::corpus`] and [`crate::error`]).

use std::fmt;

/// One of the three splits of a corpus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// `train.txt`; the vocabulary is built from it.
    Train,
    /// `valid.txt`.
    Valid,
    /// `test.txt`.
    Test,
}

impl Split {
    /// All three, in the order they are loaded.
    pub const ALL: [Split; 3] = [Split::Train, Split::Valid, Split::Test];

    /// The file name inside a corpus directory: `train.txt`, `valid.txt` or `test.txt`.
    pub fn file_name(self) -> &'static str {
        match self {
            Split::Train => "train.txt",
            Split::Valid => "valid.txt",
            Split::Test => "test.txt",
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Split::Train => "train",
            Split::Valid => "valid",
            Split::Test => "test",
        })
    }
}
