//! Corpus BLEU and chrF exactly as sacreBLEU computes them, so that translation scores printed
//! here can be set beside published ones.
//!
//! - [`corpus_bleu`]: BLEU (Papineni et al., 2002) with sacreBLEU's tokenizers ([`Tokenizer`]:
//!   `13a`, `intl`, `char`, `none`), optional lowercasing and its smoothing methods
//!   ([`Smoothing`], `exp` by default), one reference per hypothesis.
//! - [`corpus_chrf`]: chrF (Popović, 2015) as sacreBLEU's default `chrF2` (character n-grams up
//!   to 6, beta 2, whitespace removed), and chrF++ with word n-grams.
//! - [`BleuOptions::lowercased_tokens`]: the convention of the PyTorch translation tutorial's
//!   published scores (torchtext's `bleu_score` over lowercased word tokens), labelled
//!   [`LOWERCASED_TOKEN_BLEU_LABEL`] wherever it is printed.
//!
//! Every score carries a sacreBLEU 2.x signature
//! (`nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0`) naming
//! [`SACREBLEU_VERSION`], the version whose output the tests compare against
//! (`crates/text/tests/fixtures/bleu/`, written by `scripts/make_bleu_fixtures.py`).
//!
//! Text is treated as Python treats it: strings are sequences of code points, "whitespace" is
//! what Python's `str.isspace()` accepts (Unicode White_Space plus U+001C..U+001F), and a line
//! read from a file is split on `"\n"` only and then right-stripped ([`read_lines`]), as the
//! sacreBLEU command line reads its files.
//!
//! ```
//! use transformer_text::score::{corpus_bleu, corpus_chrf, BleuOptions, ChrfOptions};
//!
//! let hyps = vec!["The cat sat on the mat.".to_string()];
//! let refs = vec!["The cat sat on the mat.".to_string()];
//! let bleu = corpus_bleu(&hyps, &refs, &BleuOptions::default())?;
//! assert!((bleu.score - 100.0).abs() < 1e-9);
//! println!("{}", bleu.format_with_signature());
//! let chrf = corpus_chrf(&hyps, &refs, &ChrfOptions::default())?;
//! assert!((chrf.score - 100.0).abs() < 1e-9);
//! # Ok::<(), transformer_text::score::ScoreError>(())
//! ```

pub mod bleu;
pub mod chrf;
pub mod tokenizers;

pub use bleu::{
    corpus_bleu, BleuOptions, BleuScore, Smoothing, LOWERCASED_TOKEN_BLEU_LABEL, MAX_NGRAM_ORDER,
};
pub use chrf::{corpus_chrf, ChrfOptions, ChrfScore};
pub use tokenizers::{tokenize_13a, tokenize_char, tokenize_intl, Tokenizer};

/// The sacreBLEU version whose scores these functions reproduce (the fixtures were written
/// with it); it ends every signature as `version:2.6.0`.
pub const SACREBLEU_VERSION: &str = "2.6.0";

/// What can go wrong when scoring.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScoreError {
    /// The hypotheses and references do not pair up one to one.
    #[error(
        "{hyps} hypotheses but {refs} references: a corpus score needs exactly one reference \
         line per hypothesis line"
    )]
    CountMismatch {
        /// Number of hypotheses.
        hyps: usize,
        /// Number of references.
        refs: usize,
    },
    /// A tokenizer name other than the ones implemented.
    #[error("unknown tokenizer {0:?}: use one of 13a, intl, char, none")]
    UnknownTokenizer(String),
    /// A smoothing name other than the ones implemented.
    #[error("unknown smoothing method {0:?}: use one of exp, none, floor, add-k")]
    UnknownSmoothing(String),
    /// An option value that cannot be used (the message says which and why).
    #[error("{0}")]
    InvalidOption(String),
}

/// Whether Python's `str.isspace()` is true for `c`: Unicode White_Space (what
/// [`char::is_whitespace`] tests) plus the four separators U+001C..U+001F, which Python also
/// splits and strips on.
pub fn is_python_whitespace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// The words of `s` as Python's `s.split()` gives them (runs of [`is_python_whitespace`]
/// separate words; no empty words).
pub fn python_split(s: &str) -> impl Iterator<Item = &str> {
    s.split(is_python_whitespace).filter(|w| !w.is_empty())
}

/// `s` without trailing whitespace, as Python's `s.rstrip()`.
pub fn python_rstrip(s: &str) -> &str {
    s.trim_end_matches(is_python_whitespace)
}

/// `' '.join(s.split())` in Python: words separated by single spaces, no leading or trailing
/// whitespace.
pub fn normalize_whitespace(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for w in python_split(s) {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(w);
    }
    out
}

/// The lines of a file's text as the sacreBLEU command line reads them: split on `"\n"` only
/// (a final newline does not start another line; an empty text has no lines), each
/// right-stripped with [`python_rstrip`] (which also drops a `"\r"` of CRLF files).
pub fn read_lines(text: &str) -> Vec<String> {
    text.split_inclusive('\n')
        .map(|l| python_rstrip(l).to_string())
        .collect()
}

/// Checks that there is one reference per hypothesis.
fn check_counts(hyps: usize, refs: usize) -> Result<(), ScoreError> {
    if hyps == refs {
        Ok(())
    } else {
        Err(ScoreError::CountMismatch { hyps, refs })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_whitespace_rules() {
        assert!(is_python_whitespace('\u{1c}') && is_python_whitespace('\u{a0}'));
        assert!(!is_python_whitespace('\u{180e}') && !is_python_whitespace('\u{200b}'));
        let words: Vec<_> = python_split(" a\u{1f}b\u{3000}c\t ").collect();
        assert_eq!(words, ["a", "b", "c"]);
        assert_eq!(python_rstrip("x y \u{2028}\r"), "x y");
        assert_eq!(normalize_whitespace("  a   b "), "a b");
    }

    #[test]
    fn lines_like_python_file_iteration() {
        assert!(read_lines("").is_empty());
        assert_eq!(read_lines("a\n"), ["a"]);
        assert_eq!(read_lines("a\r\n\nb "), ["a", "", "b"]);
        assert_eq!(read_lines("a\u{2028}b\n"), ["a\u{2028}b"]);
    }
}
