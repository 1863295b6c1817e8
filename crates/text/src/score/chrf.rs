//! Corpus chrF as sacreBLEU computes it (`sacrebleu.metrics.CHRF`), one reference per
//! hypothesis.
//!
//! For each order (character n-grams 1 to 6 of the segment with its whitespace removed, then
//! word n-grams 1 to `word_order` for chrF++), each segment gives three counts: hypothesis
//! n-grams (0 when the reference has none of that order), reference n-grams, and clipped
//! matches. The corpus sums them. By default (sacreBLEU's `eff:yes`), the precisions and
//! recalls of the orders where both sides have n-grams are averaged, and the score is the
//! F-beta of the averages, `100 (1 + b^2) P R / (b^2 P + R)` (0 when P + R = 0). With
//! `eps_smoothing` (`eff:no`, the chrF++.py / Moses / NLTK way) it is the mean over all orders
//! of each order's F-beta, with 1e-16 standing in for undefined values.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;

use super::{check_counts, is_python_whitespace, python_split, ScoreError, SACREBLEU_VERSION};

/// What chrF is computed with. `Default` is sacreBLEU's default `chrF2`: character order 6,
/// word order 0, beta 2, mixed case, whitespace removed, effective-order averaging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChrfOptions {
    /// Highest character n-gram order (`nc:`).
    pub char_order: usize,
    /// Highest word n-gram order (`nw:`; 2 gives chrF++).
    pub word_order: usize,
    /// Weight of recall against precision (the 2 of chrF2).
    pub beta: u32,
    /// Lowercase hypotheses and references first (`case:lc`).
    pub lowercase: bool,
    /// Keep whitespace in character n-grams (`space:yes`).
    pub whitespace: bool,
    /// chrF++.py's epsilon smoothing over all orders (`eff:no`) instead of sacreBLEU's
    /// averaging over the orders that have n-grams (`eff:yes`, the default).
    pub eps_smoothing: bool,
}

impl Default for ChrfOptions {
    fn default() -> Self {
        ChrfOptions {
            char_order: 6,
            word_order: 0,
            beta: 2,
            lowercase: false,
            whitespace: false,
            eps_smoothing: false,
        }
    }
}

impl ChrfOptions {
    /// chrF++ (sacreBLEU's `CHRF(word_order=2)`): chrF2 plus word unigrams and bigrams.
    pub fn chrf_plus_plus() -> Self {
        ChrfOptions {
            word_order: 2,
            ..ChrfOptions::default()
        }
    }

    /// The metric's name as sacreBLEU prints it: `chrF2`, or `chrF2++` with word order 2.
    pub fn name(&self) -> String {
        format!("chrF{}{}", self.beta, "+".repeat(self.word_order))
    }

    /// sacreBLEU 2.x's signature for these options and one reference, e.g.
    /// `nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0`.
    pub fn signature(&self) -> String {
        format!(
            "nrefs:1|case:{}|eff:{}|nc:{}|nw:{}|space:{}|version:{SACREBLEU_VERSION}",
            if self.lowercase { "lc" } else { "mixed" },
            if self.eps_smoothing { "no" } else { "yes" },
            self.char_order,
            self.word_order,
            if self.whitespace { "yes" } else { "no" },
        )
    }

    fn validate(&self) -> Result<(), ScoreError> {
        if self.char_order + self.word_order == 0 {
            return Err(ScoreError::InvalidOption(
                "chrF needs a character or word n-gram order of at least 1 (6 and 0 are standard)"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// A corpus chrF score with the statistics it was computed from.
#[derive(Debug, Clone, PartialEq)]
pub struct ChrfScore {
    /// chrF, 0 to 100.
    pub score: f64,
    /// Summed `[hypothesis n-grams, reference n-grams, matches]` of each order: the character
    /// orders, then the word orders.
    pub stats: Vec<[u64; 3]>,
    /// The options it was computed with.
    pub options: ChrfOptions,
}

impl ChrfScore {
    /// The sacreBLEU signature of the options (see [`ChrfOptions::signature`]).
    pub fn signature(&self) -> String {
        self.options.signature()
    }

    /// sacreBLEU's line without the signature: `chrF2 = 55.12`.
    pub fn format(&self) -> String {
        format!("{} = {:.2}", self.options.name(), self.score)
    }

    /// sacreBLEU's command-line text output: `chrF2|<signature> = 55.12`.
    pub fn format_with_signature(&self) -> String {
        format!(
            "{}|{} = {:.2}",
            self.options.name(),
            self.signature(),
            self.score
        )
    }
}

impl fmt::Display for ChrfScore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.format())
    }
}

/// ASCII punctuation (Python's `string.punctuation`), which chrF++ splits off words.
fn is_ascii_punct(c: char) -> bool {
    c.is_ascii_punctuation()
}

/// chrF++'s words: whitespace-separated pieces with one punctuation mark split off the end,
/// or else off the start, of words longer than one character (`(hi)` gives `(hi` and `)`).
fn chrf_words(sentence: &str) -> Vec<&str> {
    let mut words = Vec::new();
    for w in python_split(sentence) {
        let mut chars = w.chars();
        let first = chars.next().expect("split gives non-empty words");
        let Some(last) = chars.next_back() else {
            words.push(w);
            continue;
        };
        if is_ascii_punct(last) {
            words.extend([&w[..w.len() - 1], &w[w.len() - 1..]]);
        } else if is_ascii_punct(first) {
            words.extend([&w[..1], &w[1..]]);
        } else {
            words.push(w);
        }
    }
    words
}

/// `[hyp n-grams (0 if the reference has none), ref n-grams, clipped matches]` for order `n`.
fn match_stats<T: Hash + Eq>(hyp: &[T], reference: &[T], n: usize) -> [u64; 3] {
    let count = |s: &[T]| s.len().saturating_sub(n - 1) as u64;
    let (hyp_total, ref_total) = (count(hyp), count(reference));
    if hyp_total == 0 || ref_total == 0 {
        return [if ref_total > 0 { hyp_total } else { 0 }, ref_total, 0];
    }
    let mut ref_counts: HashMap<&[T], u64> = HashMap::new();
    for gram in reference.windows(n) {
        *ref_counts.entry(gram).or_insert(0) += 1;
    }
    let mut hyp_counts: HashMap<&[T], u64> = HashMap::new();
    for gram in hyp.windows(n) {
        *hyp_counts.entry(gram).or_insert(0) += 1;
    }
    let matches = hyp_counts
        .iter()
        .map(|(gram, &c)| c.min(ref_counts.get(gram).copied().unwrap_or(0)))
        .sum();
    [hyp_total, ref_total, matches]
}

/// The characters chrF counts: all of them with `whitespace`, else the segment without its
/// whitespace (Python's `''.join(line.split())`).
fn chrf_chars(segment: &str, whitespace: bool) -> Vec<char> {
    if whitespace {
        segment.chars().collect()
    } else {
        segment
            .chars()
            .filter(|&c| !is_python_whitespace(c))
            .collect()
    }
}

/// Corpus chrF of `hyps` against `refs` (line i of one with line i of the other), as
/// sacreBLEU's `CHRF(**opts).corpus_score(hyps, [refs])` computes it.
///
/// Errors when the two have different lengths (saying both), or on invalid options.
pub fn corpus_chrf<H: AsRef<str>, R: AsRef<str>>(
    hyps: &[H],
    refs: &[R],
    opts: &ChrfOptions,
) -> Result<ChrfScore, ScoreError> {
    check_counts(hyps.len(), refs.len())?;
    opts.validate()?;
    let mut stats = vec![[0u64; 3]; opts.char_order + opts.word_order];
    for (hyp, reference) in hyps.iter().zip(refs) {
        let (hyp, reference) = if opts.lowercase {
            (
                hyp.as_ref().to_lowercase(),
                reference.as_ref().to_lowercase(),
            )
        } else {
            (hyp.as_ref().to_string(), reference.as_ref().to_string())
        };
        let (hc, rc) = (
            chrf_chars(&hyp, opts.whitespace),
            chrf_chars(&reference, opts.whitespace),
        );
        let (hw, rw) = if opts.word_order > 0 {
            (chrf_words(&hyp), chrf_words(&reference))
        } else {
            (Vec::new(), Vec::new())
        };
        for (i, total) in stats.iter_mut().enumerate() {
            let s = if i < opts.char_order {
                match_stats(&hc, &rc, i + 1)
            } else {
                match_stats(&hw, &rw, i - opts.char_order + 1)
            };
            for (t, v) in total.iter_mut().zip(s) {
                *t += v;
            }
        }
    }
    let score = f_score(&stats, opts);
    Ok(ChrfScore {
        score,
        stats,
        options: *opts,
    })
}

/// sacreBLEU's `CHRF._compute_f_score`, same operations in the same order.
fn f_score(stats: &[[u64; 3]], opts: &ChrfOptions) -> f64 {
    const EPS: f64 = 1e-16;
    let factor = (opts.beta * opts.beta) as f64;
    let mut score = 0.0;
    let mut effective_order = 0usize;
    let (mut avg_prec, mut avg_rec) = (0.0, 0.0);
    for &[n_hyp, n_ref, n_match] in stats {
        let prec = if n_hyp > 0 {
            n_match as f64 / n_hyp as f64
        } else {
            EPS
        };
        let rec = if n_ref > 0 {
            n_match as f64 / n_ref as f64
        } else {
            EPS
        };
        let denom = factor * prec + rec;
        score += if denom > 0.0 {
            (1.0 + factor) * prec * rec / denom
        } else {
            EPS
        };
        if n_hyp > 0 && n_ref > 0 {
            avg_prec += prec;
            avg_rec += rec;
            effective_order += 1;
        }
    }
    if opts.eps_smoothing {
        return 100.0 * score / stats.len() as f64;
    }
    if effective_order == 0 {
        return 0.0;
    }
    avg_prec /= effective_order as f64;
    avg_rec /= effective_order as f64;
    if avg_prec + avg_rec != 0.0 {
        let mut score = (1.0 + factor) * avg_prec * avg_rec;
        score /= factor * avg_prec + avg_rec;
        100.0 * score
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_is_100_and_empty_is_0() {
        let h = ["Ein Hund läuft."];
        let s = corpus_chrf(&h, &h, &ChrfOptions::default()).unwrap();
        assert!((s.score - 100.0).abs() < 1e-12);
        let s = corpus_chrf(&[""], &["abc"], &ChrfOptions::default()).unwrap();
        assert_eq!(s.score, 0.0);
        let s = corpus_chrf::<&str, &str>(&[], &[], &ChrfOptions::default()).unwrap();
        assert_eq!(s.score, 0.0);
    }

    #[test]
    fn whitespace_is_removed() {
        let a = corpus_chrf(&["a b  c"], &["abc"], &ChrfOptions::default()).unwrap();
        assert!((a.score - 100.0).abs() < 1e-12);
        assert_eq!(a.stats[0], [3, 3, 3]);
        assert_eq!(a.stats[3], [0, 0, 0]);
    }

    #[test]
    fn chrf_plus_plus_words() {
        assert_eq!(
            chrf_words("(hi) a, .b c"),
            ["(hi", ")", "a", ",", ".", "b", "c"]
        );
        assert_eq!(ChrfOptions::chrf_plus_plus().name(), "chrF2++");
    }

    #[test]
    fn signature() {
        assert_eq!(
            ChrfOptions::default().signature(),
            format!("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:{SACREBLEU_VERSION}")
        );
    }

    #[test]
    fn count_mismatch() {
        let e = corpus_chrf(&["a", "b"], &["a"], &ChrfOptions::default()).unwrap_err();
        assert_eq!(e, ScoreError::CountMismatch { hyps: 2, refs: 1 });
    }
}
