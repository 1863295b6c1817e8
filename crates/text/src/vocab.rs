//! The vocabulary: tokens to ids and back, built like torchtext's
//! `build_vocab_from_iterator(map(tokenizer, train_iter), specials=["<unk>"])` followed by
//! `vocab.set_default_index(vocab["<unk>"])`.
//!
//! # Order of ids (where the rules come from)
//!
//! torchtext's `build_vocab_from_iterator` counts tokens with a `collections.Counter`, sorts the
//! counts with `sorted(counter.items(), key=lambda x: (-x[1], x[0]))`, removes the specials
//! from that list and puts them in front. So:
//!
//! * id 0 is `<unk>`, even when `<unk>` occurs in the text (WikiText-2 has 54,625 of them):
//!   it is counted, but listed once, as the special;
//! * then tokens by descending count;
//! * ties by the token itself, in Python's string order, which compares code points. Rust's
//!   `str` order compares UTF-8 bytes, which orders code points the same way.
//!
//! The tie-break is lexicographic in the torchtext releases that have `max_tokens` (0.12 on,
//! through the last, 0.18), which is what the tutorial's code runs with today. Releases before
//! sorted with `key=lambda x: x[1], reverse=True` alone; Python's sort is stable, so ties kept
//! the Counter's first-seen order. On WikiText-2 the two orders give the same size (28,782) and
//! the same ids for every count above the ties, but they assign different ids within each tie
//! group (most of the rare words), so a vocabulary imported from an older torchtext has to be
//! loaded from its file (see [`Vocab::load`]), not rebuilt.
//!
//! # File format
//!
//! One token per line, in id order, UTF-8, `\n` line ends, after a header line
//! [`VOCAB_HEADER`]. [`Vocab::load`] also reads a file without the header (for instance
//! PyTorch's `vocab.get_itos()` written one per line), and tolerates `\r\n` line ends.

use std::collections::HashMap;
use std::fs;
use std::io::{BufWriter, Write};
use std::path::Path;

use crate::error::{Error, Result, VocabProblem};
use crate::tokenize::basic_english;

/// The unknown-word token; its id is the default for any token not in the vocabulary.
pub const UNK: &str = "<unk>";

/// First line of a vocabulary file written by [`Vocab::save`]; names the format and its
/// version.
pub const VOCAB_HEADER: &str = "# transformer-vocab v1";

/// A bijection between tokens and ids `0..len()`, with unknown tokens mapped to `<unk>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vocab {
    itos: Vec<String>,
    stoi: HashMap<String, u32>,
    unk: u32,
}

impl Vocab {
    /// Builds the vocabulary of a token stream as torchtext's
    /// `build_vocab_from_iterator(..., specials=["<unk>"])` does: `<unk>` at id 0, then tokens
    /// by descending count, ties in lexicographic order (see the module docs).
    ///
    /// ```
    /// use transformer_text::Vocab;
    /// let vocab = Vocab::build(["b", "a", "b", "c", "<unk>", "c"]);
    /// assert_eq!(vocab.tokens(), ["<unk>", "b", "c", "a"]);
    /// assert_eq!(vocab.id("never seen"), 0);
    /// ```
    pub fn build<I, T>(tokens: I) -> Vocab
    where
        I: IntoIterator<Item = T>,
        T: AsRef<str>,
    {
        let mut counts = TokenCounts::default();
        for token in tokens {
            counts.add(token.as_ref());
        }
        counts.into_vocab()
    }

    /// Makes a vocabulary from tokens in id order (token `i` gets id `i`). The list must contain
    /// `<unk>` (anywhere; it becomes the default id), and no empty, duplicate or
    /// whitespace-containing token.
    pub fn from_tokens(tokens: Vec<String>) -> Result<Vocab> {
        Self::checked(tokens, None, &[])
    }

    /// Number of tokens, `<unk>` included (the model's `ntokens`).
    pub fn len(&self) -> usize {
        self.itos.len()
    }

    /// Always false: a vocabulary holds at least `<unk>`.
    pub fn is_empty(&self) -> bool {
        self.itos.is_empty()
    }

    /// Id of `<unk>`, the id of every token not in the vocabulary.
    pub fn unk_id(&self) -> u32 {
        self.unk
    }

    /// Id of `token`, or of `<unk>` if it is not in the vocabulary (torchtext's
    /// `vocab[token]` after `set_default_index`).
    pub fn id(&self, token: &str) -> u32 {
        self.get(token).unwrap_or(self.unk)
    }

    /// Id of `token`, or `None` if it is not in the vocabulary.
    pub fn get(&self, token: &str) -> Option<u32> {
        self.stoi.get(token).copied()
    }

    /// The token with id `id`.
    ///
    /// # Panics
    /// If `id >= len()`.
    pub fn token(&self, id: u32) -> &str {
        match self.itos.get(id as usize) {
            Some(token) => token,
            None => panic!(
                "token id {id} out of range for a vocabulary of {} tokens",
                self.len()
            ),
        }
    }

    /// All tokens in id order (torchtext's `vocab.get_itos()`).
    pub fn tokens(&self) -> &[String] {
        &self.itos
    }

    /// Ids of `tokens` (torchtext's `vocab(tokens)`), unknown ones as `<unk>`.
    pub fn encode<I, T>(&self, tokens: I) -> Vec<u32>
    where
        I: IntoIterator<Item = T>,
        T: AsRef<str>,
    {
        tokens.into_iter().map(|t| self.id(t.as_ref())).collect()
    }

    /// Tokenizes `line` with [`basic_english`] and encodes it (the tutorial's
    /// `vocab(tokenizer(line))`).
    pub fn encode_line(&self, line: &str) -> Vec<u32> {
        self.encode(basic_english(line))
    }

    /// The tokens of `ids` joined by single spaces.
    ///
    /// # Panics
    /// If an id is `>= len()`.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut text = String::new();
        for (i, &id) in ids.iter().enumerate() {
            if i > 0 {
                text.push(' ');
            }
            text.push_str(self.token(id));
        }
        text
    }

    /// Writes the vocabulary: [`VOCAB_HEADER`], then one token per line in id order.
    pub fn save(&self, path: &Path) -> Result<()> {
        let io_err = |action, source| Error::Io {
            action,
            path: path.to_path_buf(),
            source,
        };
        let file = fs::File::create(path).map_err(|e| io_err("create", e))?;
        let mut out = BufWriter::new(file);
        writeln!(out, "{VOCAB_HEADER}").map_err(|e| io_err("write", e))?;
        for token in &self.itos {
            writeln!(out, "{token}").map_err(|e| io_err("write", e))?;
        }
        out.flush().map_err(|e| io_err("write", e))
    }

    /// Reads a vocabulary written by [`save`](Self::save), or a plain list of tokens, one per
    /// line in id order, without the header. Errors name the file and line of any empty,
    /// duplicate or whitespace-containing token, and say so if `<unk>` is missing.
    pub fn load(path: &Path) -> Result<Vocab> {
        let bytes = fs::read(path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                Error::FileNotFound {
                    path: path.to_path_buf(),
                }
            } else {
                Error::Io {
                    action: "read",
                    path: path.to_path_buf(),
                    source,
                }
            }
        })?;
        let text = match std::str::from_utf8(&bytes) {
            Ok(text) => text,
            Err(e) => return Err(crate::error::utf8_error(path, &bytes, e.valid_up_to())),
        };
        let mut lines: Vec<&str> = text.split('\n').collect();
        if text.ends_with('\n') {
            lines.pop();
        }
        let lines: Vec<&str> = lines
            .into_iter()
            .map(|l| l.strip_suffix('\r').unwrap_or(l))
            .collect();
        // 1-based file line of each token.
        let (tokens, first_line) = match lines.first() {
            Some(&first) if first == VOCAB_HEADER => (&lines[1..], 2),
            _ => (&lines[..], 1),
        };
        if tokens.is_empty() {
            return Err(Error::EmptyVocab {
                path: path.to_path_buf(),
            });
        }
        let line_numbers: Vec<usize> = (first_line..first_line + tokens.len()).collect();
        let tokens = tokens.iter().map(|t| t.to_string()).collect();
        Self::checked(tokens, Some(path), &line_numbers)
    }

    /// Validates `itos` and builds the lookup table. `lines[i]` is the 1-based line of token
    /// `i` (positions `i + 1` when empty).
    fn checked(itos: Vec<String>, path: Option<&Path>, lines: &[usize]) -> Result<Vocab> {
        let line_of = |i: usize| lines.get(i).copied().unwrap_or(i + 1);
        let entry_error = |i: usize, problem| Error::VocabEntry {
            path: path.map(Path::to_path_buf),
            line: line_of(i),
            problem,
        };
        assert!(
            u32::try_from(itos.len()).is_ok(),
            "a vocabulary of {} tokens does not fit u32 ids",
            itos.len()
        );
        let mut stoi = HashMap::with_capacity(itos.len());
        for (i, token) in itos.iter().enumerate() {
            if token.is_empty() {
                return Err(entry_error(i, VocabProblem::Empty));
            }
            if token.chars().any(char::is_whitespace) {
                return Err(entry_error(
                    i,
                    VocabProblem::Whitespace {
                        token: token.clone(),
                    },
                ));
            }
            if let Some(&first) = stoi.get(token.as_str()) {
                return Err(entry_error(
                    i,
                    VocabProblem::Duplicate {
                        token: token.clone(),
                        first_line: line_of(first as usize),
                    },
                ));
            }
            stoi.insert(token.clone(), i as u32);
        }
        let Some(&unk) = stoi.get(UNK) else {
            return Err(Error::NoUnk {
                path: path.map(Path::to_path_buf),
            });
        };
        Ok(Vocab { itos, stoi, unk })
    }
}

/// Token counts in first-seen order: torchtext's `Counter` before it is sorted.
#[derive(Default)]
pub(crate) struct TokenCounts {
    index: HashMap<String, usize>,
    counts: Vec<(String, u64)>,
}

impl TokenCounts {
    pub(crate) fn add(&mut self, token: &str) {
        match self.index.get(token) {
            Some(&i) => self.counts[i].1 += 1,
            None => {
                self.index.insert(token.to_string(), self.counts.len());
                self.counts.push((token.to_string(), 1));
            }
        }
    }

    pub(crate) fn total(&self) -> u64 {
        self.counts.iter().map(|(_, n)| n).sum()
    }

    /// `sorted(counter.items(), key=lambda x: (-x[1], x[0]))`, specials removed and put first.
    pub(crate) fn into_vocab(self) -> Vocab {
        let mut counts = self.counts;
        counts.sort_by(|(a, na), (b, nb)| nb.cmp(na).then_with(|| a.cmp(b)));
        let itos: Vec<String> = std::iter::once(UNK.to_string())
            .chain(counts.into_iter().map(|(t, _)| t).filter(|t| t != UNK))
            .collect();
        // Tokens from `basic_english` are never empty, duplicated or spaced, but `build` takes
        // any strings; an empty or spaced one is still a valid key, so build the table directly.
        let stoi = itos
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        Vocab { itos, stoi, unk: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(tokens: &[&str]) -> Vec<String> {
        tokens.iter().map(|t| t.to_string()).collect()
    }

    fn temp_path(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("transformer-text-vocab-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    #[test]
    fn build_orders_by_count_then_token() {
        // Counts: z 1, b 3, a 3, <unk> 5, c 2, y 1. First-seen order of the ties would be
        // (b, a) and (z, y); torchtext sorts them (a, b) and (y, z).
        let text = "z b a <unk> <unk> b a c <unk> c b a <unk> <unk> y";
        let vocab = Vocab::build(text.split(' '));
        assert_eq!(vocab.tokens(), strings(&["<unk>", "a", "b", "c", "y", "z"]));
        assert_eq!(vocab.unk_id(), 0);
        assert_eq!(vocab.len(), 6);
    }

    #[test]
    fn build_ties_compare_code_points() {
        // Python compares str by code point: "Z" < "a" < "é" < "…" < "😀".
        let vocab = Vocab::build(["😀", "é", "a", "…", "Z"]);
        assert_eq!(
            vocab.tokens(),
            strings(&["<unk>", "Z", "a", "é", "…", "😀"])
        );
        // An empty stream still has `<unk>`.
        assert_eq!(
            Vocab::build(Vec::<String>::new()).tokens(),
            strings(&["<unk>"])
        );
    }

    #[test]
    fn lookup_encode_decode() {
        let vocab = Vocab::build(basic_english("The cat. The dog, the end."));
        assert_eq!(
            vocab.tokens(),
            strings(&["<unk>", "the", ".", ",", "cat", "dog", "end"])
        );
        assert_eq!(vocab.id("the"), 1);
        assert_eq!(vocab.id("zebra"), 0);
        assert_eq!(vocab.get("zebra"), None);
        assert_eq!(vocab.get("dog"), Some(5));
        assert_eq!(vocab.token(4), "cat");
        let ids = vocab.encode_line("The zebra, the dog.");
        assert_eq!(ids, [1, 0, 3, 1, 5, 2]);
        assert_eq!(vocab.encode(["the", "dog"]), [1, 5]);
        assert_eq!(vocab.decode(&ids), "the <unk> , the dog .");
        assert_eq!(vocab.decode(&[]), "");
    }

    #[test]
    #[should_panic(expected = "token id 7 out of range for a vocabulary of 7 tokens")]
    fn token_out_of_range_panics() {
        Vocab::build(["a", "b", "c", "d", "e", "f"]).token(7);
    }

    #[test]
    fn from_tokens_checks_entries() {
        let vocab = Vocab::from_tokens(strings(&["a", "<unk>", "b"])).unwrap();
        assert_eq!(vocab.unk_id(), 1);
        assert_eq!(vocab.id("zzz"), 1);

        let err = Vocab::from_tokens(strings(&["<unk>", "a", "b", "a"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "vocabulary token list, entry 4: duplicate token \"a\" (first listed at line 2); \
             a vocabulary lists each token once"
        );
        let err = Vocab::from_tokens(strings(&["<unk>", ""])).unwrap_err();
        assert!(matches!(
            err,
            Error::VocabEntry {
                line: 2,
                problem: VocabProblem::Empty,
                ..
            }
        ));
        let err = Vocab::from_tokens(strings(&["<unk>", "a b"])).unwrap_err();
        assert!(matches!(
            err,
            Error::VocabEntry {
                line: 2,
                problem: VocabProblem::Whitespace { .. },
                ..
            }
        ));
        let err = Vocab::from_tokens(strings(&["a"])).unwrap_err();
        assert!(err.to_string().contains("no `<unk>` token"), "{err}");
    }

    #[test]
    fn save_load_round_trip() {
        let vocab = Vocab::build(basic_english("Ünïcode, 戦場 <unk> @-@ = = x"));
        let path = temp_path("round_trip.vocab");
        vocab.save(&path).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("# transformer-vocab v1\n<unk>\n="),
            "{text}"
        );
        assert_eq!(Vocab::load(&path).unwrap(), vocab);
    }

    #[test]
    fn load_without_header_and_crlf() {
        let path = temp_path("itos.txt");
        fs::write(&path, "<unk>\r\nthe\r\n,\r\n").unwrap();
        let vocab = Vocab::load(&path).unwrap();
        assert_eq!(vocab.tokens(), strings(&["<unk>", "the", ","]));
        // No trailing newline.
        fs::write(&path, "<unk>\nthe").unwrap();
        assert_eq!(Vocab::load(&path).unwrap().len(), 2);
    }

    #[test]
    fn load_errors_name_file_and_line() {
        let path = temp_path("bad.vocab");
        let shown = path.display().to_string();

        fs::write(&path, "# transformer-vocab v1\n<unk>\nthe\n\nof\n").unwrap();
        let err = Vocab::load(&path).unwrap_err().to_string();
        assert_eq!(
            err,
            format!("{shown}:4: empty token; a vocabulary lists one non-empty token per line")
        );

        fs::write(&path, "<unk>\nthe\nof\nthe\n").unwrap();
        let err = Vocab::load(&path).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "{shown}:4: duplicate token \"the\" (first listed at line 2)"
            )),
            "{err}"
        );

        fs::write(&path, "# transformer-vocab v1\nthe\n").unwrap();
        let err = Vocab::load(&path).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("{shown}: no `<unk>` token")),
            "{err}"
        );

        fs::write(&path, "# transformer-vocab v1\n").unwrap();
        let err = Vocab::load(&path).unwrap_err().to_string();
        assert_eq!(err, format!("{shown}: the vocabulary file lists no tokens"));

        fs::write(&path, b"<unk>\nca\xfet\n").unwrap();
        let err = Vocab::load(&path).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "{shown}:2:3: invalid UTF-8 (byte 0xfe at file offset 8)"
            )),
            "{err}"
        );

        let missing = temp_path("missing.vocab");
        let err = Vocab::load(&missing).unwrap_err().to_string();
        assert_eq!(err, format!("{} does not exist", missing.display()));
    }
}
