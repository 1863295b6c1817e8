//! WikiText-2-style corpora: a folder with `train.txt`, `valid.txt`, `test.txt`, each read into
//! one stream of token ids.
//!
//! # Where the rules come from
//!
//! The tutorial ("Language Modeling with nn.Transformer and torchtext", the version that uses
//! `build_vocab_from_iterator`) builds the vocabulary from the training split and then turns
//! each split into one tensor:
//!
//! ```python
//! vocab = build_vocab_from_iterator(map(tokenizer, train_iter), specials=['<unk>'])
//! vocab.set_default_index(vocab['<unk>'])
//!
//! def data_process(raw_text_iter):
//!     data = [torch.tensor(vocab(tokenizer(item)), dtype=torch.long) for item in raw_text_iter]
//!     return torch.cat(tuple(filter(lambda t: t.numel() > 0, data)))
//! ```
//!
//! torchtext's `WikiText2` yields the lines of `wiki.{train,valid,test}.tokens` with their
//! trailing `\n`; the tokenizer splits on whitespace, so the line ends make no difference, and
//! lines without tokens contribute nothing. The result is the concatenation of every line's ids,
//! which is what [`read_split`] returns. The files the project uses are pytorch/examples'
//! `word_language_model/data/wikitext-2/{train,valid,test}.txt`, the same tokenized WikiText-2.
//!
//! Files are read line by line as bytes (a line ends at `\n`) so that a byte that is not UTF-8
//! is reported with its line, column and file offset. torchtext would fail on such a file too
//! (it opens the files as UTF-8).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

pub use crate::split::Split;

use crate::error::{Error, Result};
use crate::tokenize::for_each_token;
use crate::vocab::{TokenCounts, Vocab};

/// What the end of a line becomes in the token stream.
///
/// The newer tutorial (`data_process`, the default) drops line ends and skips lines without
/// tokens. The older tutorial read WikiText-2 through the legacy torchtext
/// `LanguageModelingDataset`, which appends an `<eos>` token to every line, empty ones
/// included (about 36,700 extra tokens in train, 1.8%); its published test perplexity
/// (229.27) was measured over that stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum LineEnd {
    /// Nothing: the newer tutorial's `data_process`.
    #[default]
    Dropped,
    /// An [`EOS`] token after every line, empty lines included: the older tutorial's.
    Eos,
}

/// The token [`LineEnd::Eos`] appends to every line.
pub const EOS: &str = "<eos>";

/// A corpus read from a directory: the vocabulary and the three id streams.
#[derive(Debug, Clone)]
pub struct Corpus {
    /// Built from the training split ([`build_vocab`]), or given ([`Corpus::load_with_vocab`]).
    pub vocab: Vocab,
    /// Ids of `train.txt`.
    pub train: Vec<u32>,
    /// Ids of `valid.txt`.
    pub valid: Vec<u32>,
    /// Ids of `test.txt`.
    pub test: Vec<u32>,
}

impl Corpus {
    /// Reads `dir/{train,valid,test}.txt`, builds the vocabulary from the training split and
    /// encodes all three, as the tutorial does. All three files are checked to exist before
    /// anything is read.
    pub fn load(dir: &Path) -> Result<Corpus> {
        let paths = split_paths(dir)?;
        let vocab = counts_of(&paths[0], Some(Split::Train), LineEnd::Dropped)?.into_vocab();
        Self::encode_splits(vocab, &paths)
    }

    /// Reads the three splits of `dir` with an existing vocabulary (for instance one saved
    /// with a trained model); tokens it does not know become `<unk>`.
    pub fn load_with_vocab(dir: &Path, vocab: Vocab) -> Result<Corpus> {
        let paths = split_paths(dir)?;
        Self::encode_splits(vocab, &paths)
    }

    /// The id stream of one split.
    pub fn split(&self, split: Split) -> &[u32] {
        match split {
            Split::Train => &self.train,
            Split::Valid => &self.valid,
            Split::Test => &self.test,
        }
    }

    fn encode_splits(vocab: Vocab, paths: &[PathBuf; 3]) -> Result<Corpus> {
        let [train, valid, test] = [0, 1, 2]
            .map(|i| encode_file(&paths[i], &vocab, Some(Split::ALL[i]), LineEnd::Dropped));
        Ok(Corpus {
            train: train?,
            valid: valid?,
            test: test?,
            vocab,
        })
    }
}

/// Reads one split file into one id stream, the tutorial's `data_process`: every line
/// tokenized with [`basic_english`](crate::basic_english) and encoded with `vocab`, lines
/// without tokens skipped, everything concatenated. Errors if the file is missing, not UTF-8,
/// or has no tokens.
pub fn read_split(path: &Path, vocab: &Vocab) -> Result<Vec<u32>> {
    read_split_with(path, vocab, LineEnd::Dropped)
}

/// [`read_split`] with a choice of what line ends become (see [`LineEnd`]).
pub fn read_split_with(path: &Path, vocab: &Vocab, line_end: LineEnd) -> Result<Vec<u32>> {
    encode_file(path, vocab, None, line_end)
}

/// Builds the vocabulary of a training file as the tutorial does
/// (`build_vocab_from_iterator(map(tokenizer, train_iter), specials=['<unk>'])`; see
/// [`Vocab::build`]). Errors if the file is missing, not UTF-8, or has no tokens.
pub fn build_vocab(train_path: &Path) -> Result<Vocab> {
    build_vocab_with(train_path, LineEnd::Dropped)
}

/// [`build_vocab`] over the stream that `line_end` gives: with [`LineEnd::Eos`] the
/// vocabulary also holds [`EOS`], in its frequency place.
pub fn build_vocab_with(train_path: &Path, line_end: LineEnd) -> Result<Vocab> {
    Ok(counts_of(train_path, None, line_end)?.into_vocab())
}

/// The train, valid and test files of a corpus folder; a missing folder or file is an error
/// that names it and what the folder must hold.
pub fn split_paths(dir: &Path) -> Result<[PathBuf; 3]> {
    if !dir.is_dir() {
        return Err(Error::MissingDataDir {
            dir: dir.to_path_buf(),
        });
    }
    let paths = Split::ALL.map(|split| dir.join(split.file_name()));
    for (split, path) in Split::ALL.into_iter().zip(&paths) {
        if !path.is_file() {
            return Err(Error::MissingSplit {
                split,
                path: path.clone(),
            });
        }
    }
    Ok(paths)
}

fn counts_of(path: &Path, split: Option<Split>, line_end: LineEnd) -> Result<TokenCounts> {
    let mut counts = TokenCounts::default();
    for_each_line(path, split, |line| {
        for_each_token(line, |token| counts.add(token));
        if line_end == LineEnd::Eos {
            counts.add(EOS);
        }
    })?;
    if counts.total() == 0 {
        return Err(Error::NoTokens {
            path: path.to_path_buf(),
            split,
        });
    }
    Ok(counts)
}

fn encode_file(
    path: &Path,
    vocab: &Vocab,
    split: Option<Split>,
    line_end: LineEnd,
) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    for_each_line(path, split, |line| {
        for_each_token(line, |token| ids.push(vocab.id(token)));
        if line_end == LineEnd::Eos {
            ids.push(vocab.id(EOS));
        }
    })?;
    if ids.is_empty() {
        return Err(Error::NoTokens {
            path: path.to_path_buf(),
            split,
        });
    }
    Ok(ids)
}

/// Calls `f` on every line of `path` (with its `\n`, as torchtext yields lines), checking
/// that each is UTF-8.
fn for_each_line(path: &Path, split: Option<Split>, mut f: impl FnMut(&str)) -> Result<()> {
    let read_error = |source: std::io::Error| Error::Io {
        action: "read",
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(|source| match (source.kind(), split) {
        (std::io::ErrorKind::NotFound, Some(split)) => Error::MissingSplit {
            split,
            path: path.to_path_buf(),
        },
        (std::io::ErrorKind::NotFound, None) => Error::FileNotFound {
            path: path.to_path_buf(),
        },
        _ => read_error(source),
    })?;
    let mut reader = BufReader::new(file);
    let mut line = Vec::new();
    let mut line_number = 0;
    let mut line_start = 0u64;
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).map_err(read_error)?;
        if n == 0 {
            return Ok(());
        }
        line_number += 1;
        match std::str::from_utf8(&line) {
            // A byte order mark where the file begins is not text.
            Ok(text) if line_number == 1 => f(crate::strip_bom(text)),
            Ok(text) => f(text),
            Err(e) => {
                let column = e.valid_up_to();
                return Err(Error::InvalidUtf8 {
                    path: path.to_path_buf(),
                    line: line_number,
                    column: column + 1,
                    byte_offset: line_start + column as u64,
                    byte: line[column],
                });
            }
        }
        line_start += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A fresh directory under the system temp dir for one test.
    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "transformer-text-corpus-{}-{name}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn write_corpus(dir: &Path, train: &str, valid: &str, test: &str) {
        fs::write(dir.join("train.txt"), train).unwrap();
        fs::write(dir.join("valid.txt"), valid).unwrap();
        fs::write(dir.join("test.txt"), test).unwrap();
    }

    #[test]
    fn data_process_concatenates_lines_and_skips_empty_ones() {
        let dir = temp_dir("process");
        write_corpus(
            &dir,
            " \n = Title = \n \n The cat sat . \n The <unk> sat . \n",
            " \n The dog sat . \n",
            " The cat , \n\n the end",
        );
        let corpus = Corpus::load(&dir).unwrap();
        // Counts: the 2, = 2, sat 2, . 2, <unk> 1, cat 1, title 1 -> ties by token.
        assert_eq!(
            corpus.vocab.tokens(),
            ["<unk>", ".", "=", "sat", "the", "cat", "title"]
        );
        assert_eq!(corpus.train, [2, 6, 2, 4, 5, 3, 1, 4, 0, 3, 1]);
        assert_eq!(corpus.valid, [4, 0, 3, 1]);
        assert_eq!(corpus.test, [4, 5, 0, 4, 0]);
        assert_eq!(corpus.split(Split::Valid), corpus.valid);

        let same = read_split(&dir.join("valid.txt"), &corpus.vocab).unwrap();
        assert_eq!(same, corpus.valid);
        assert_eq!(build_vocab(&dir.join("train.txt")).unwrap(), corpus.vocab);

        let with_vocab = Corpus::load_with_vocab(&dir, corpus.vocab.clone()).unwrap();
        assert_eq!(with_vocab.train, corpus.train);
    }

    /// The older tutorial's stream: an `<eos>` after every line, empty and unterminated ones
    /// included, and `<eos>` in the vocabulary in its frequency place.
    #[test]
    fn eos_line_ends_follow_every_line() {
        let dir = temp_dir("eos");
        write_corpus(&dir, "a b\n\nb\n", "b a\n \n", "c");
        let train = dir.join("train.txt");
        let vocab = build_vocab_with(&train, LineEnd::Eos).unwrap();
        assert_eq!(vocab.tokens(), ["<unk>", "<eos>", "b", "a"]);
        let ids = |name: &str, end| read_split_with(&dir.join(name), &vocab, end).unwrap();
        assert_eq!(ids("train.txt", LineEnd::Eos), [3, 2, 1, 1, 2, 1]);
        assert_eq!(ids("valid.txt", LineEnd::Eos), [2, 3, 1, 1]);
        assert_eq!(ids("test.txt", LineEnd::Eos), [0, 1]);
        assert_eq!(ids("train.txt", LineEnd::Dropped), [3, 2, 2]);
        assert_eq!(build_vocab(&train).unwrap().tokens(), ["<unk>", "b", "a"]);
    }

    #[test]
    fn missing_files_say_which_split_and_what_to_pass() {
        let dir = temp_dir("missing");
        let err = Corpus::load(&dir.join("nope")).unwrap_err().to_string();
        assert!(err.starts_with("data directory "), "{err}");
        assert!(
            err.contains("choose a data folder that holds train.txt, valid.txt and test.txt"),
            "{err}"
        );

        fs::write(dir.join("train.txt"), "a b\n").unwrap();
        fs::write(dir.join("test.txt"), "a b\n").unwrap();
        let err = Corpus::load(&dir).unwrap_err();
        assert!(
            matches!(
                err,
                Error::MissingSplit {
                    split: Split::Valid,
                    ..
                }
            ),
            "{err}"
        );
        let text = err.to_string();
        assert!(
            text.starts_with(&format!(
                "the valid split {} does not exist",
                dir.join("valid.txt").display()
            )),
            "{text}"
        );
        assert!(
            text.contains("choose a data folder that holds train.txt, valid.txt and test.txt"),
            "{text}"
        );

        let vocab = Vocab::build(["a"]);
        let err = read_split(&dir.join("other.txt"), &vocab).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("{} does not exist", dir.join("other.txt").display())
        );
    }

    #[test]
    fn empty_splits_are_errors() {
        let dir = temp_dir("empty");
        for ((train, valid), split) in [
            ((" \n \n", "a\n"), Split::Train),
            (("a b\n", ""), Split::Valid),
        ] {
            write_corpus(&dir, train, valid, "a\n");
            let err = Corpus::load(&dir).unwrap_err();
            assert!(
                matches!(err, Error::NoTokens { split: Some(s), .. } if s == split),
                "{err}"
            );
            if split == Split::Train {
                let text = err.to_string();
                assert!(
                    text.contains("has no tokens (it is empty or holds only whitespace)"),
                    "{text}"
                );
                assert!(text.contains("the train split must hold text"), "{text}");
            }
        }

        let err = read_split(&dir.join("valid.txt"), &Vocab::build(["a"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{} has no tokens (it is empty or holds only whitespace)",
                dir.join("valid.txt").display()
            )
        );
    }

    #[test]
    fn invalid_utf8_names_line_column_and_offset() {
        let dir = temp_dir("utf8");
        // Line 3 starts at byte 4 + 6 = 10; `é` is two bytes, so the bad byte is column 4.
        fs::write(dir.join("train.txt"), b"ok \n fine\n\xc3\xa9a\xff b\n").unwrap();
        let err = build_vocab(&dir.join("train.txt")).unwrap_err();
        match &err {
            Error::InvalidUtf8 {
                line,
                column,
                byte_offset,
                byte,
                ..
            } => {
                assert_eq!((*line, *column, *byte_offset, *byte), (3, 4, 13, 0xff));
            }
            other => panic!("expected InvalidUtf8, got {other:?}"),
        }
        assert_eq!(
            err.to_string(),
            format!(
                "{}:3:4: invalid UTF-8 (byte 0xff at file offset 13); the file must be UTF-8 text",
                dir.join("train.txt").display()
            )
        );
        // The whole-buffer helper used by `Vocab::load` agrees.
        let bytes = fs::read(dir.join("train.txt")).unwrap();
        let valid_up_to = std::str::from_utf8(&bytes).unwrap_err().valid_up_to();
        let again = crate::error::utf8_error(&dir.join("train.txt"), &bytes, valid_up_to);
        assert_eq!(again.to_string(), err.to_string());
    }
}
