//! Corpus BLEU as sacreBLEU computes it (`sacrebleu.metrics.BLEU`), one reference per
//! hypothesis.
//!
//! Each segment is lowercased if asked, right-stripped, tokenized ([`Tokenizer`]) and split on
//! whitespace; its n-grams (1 to 4) are counted and clipped by the reference's. The corpus sums
//! the matches (`counts`), the hypothesis n-grams (`totals`) and the lengths; then
//!
//! - precision n = `100 * counts[n] / totals[n]` (percent, as sacreBLEU prints them);
//! - brevity penalty BP = 1 if `sys_len >= ref_len`, `exp(1 - ref_len / sys_len)` otherwise,
//!   and 0 when the hypotheses are all empty;
//! - BLEU = BP * exp(mean of log precisions), with `log 0` taken as -9999999999 (so a zero
//!   precision gives 0), and 0 outright when nothing matches at all;
//! - `exp` smoothing (sacreBLEU's default, mteval-v13a's): only an order with no match is
//!   changed, to `100 / (2^k * totals[n])` for the k-th such order; an order with no n-grams at
//!   all (every hypothesis shorter than n) ends the loop and leaves its precision 0.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use super::{check_counts, python_rstrip, python_split, ScoreError, Tokenizer, SACREBLEU_VERSION};

/// The n-gram order of BLEU (sacreBLEU's `MAX_NGRAM_ORDER`).
pub const MAX_NGRAM_ORDER: usize = 4;

/// The label printed for [`BleuOptions::lowercased_tokens`] in place of `BLEU`, so that this
/// score is never mistaken for sacreBLEU's default BLEU.
pub const LOWERCASED_TOKEN_BLEU_LABEL: &str =
    "BLEU (lowercased 13a tokens, no smoothing; torchtext bleu_score convention)";

/// How BLEU treats an n-gram order without matches (sacreBLEU's `smooth_method`; Chen and
/// Cherry, 2014).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Smoothing {
    /// `exp` (sacreBLEU's default; mteval-v13a's, Chen and Cherry's method 3): the k-th order
    /// without matches gets precision `100 / (2^k * total)`.
    #[default]
    Exp,
    /// `none`: an order without matches has precision 0, so BLEU is 0.
    None,
    /// `floor` (method 1): an order without matches gets precision `100 * value / total`
    /// (sacreBLEU's default value 0.1).
    Floor(f64),
    /// `add-k` (method 2): `value` is added to the matches and totals of every order above 1
    /// (sacreBLEU's default value 1).
    AddK(f64),
}

impl Smoothing {
    /// sacreBLEU's default value for `floor`.
    pub const FLOOR_DEFAULT: f64 = 0.1;
    /// sacreBLEU's default value for `add-k`.
    pub const ADD_K_DEFAULT: f64 = 1.0;

    /// The method's name: `exp`, `none`, `floor` or `add-k`.
    pub fn name(self) -> &'static str {
        match self {
            Smoothing::Exp => "exp",
            Smoothing::None => "none",
            Smoothing::Floor(_) => "floor",
            Smoothing::AddK(_) => "add-k",
        }
    }

    /// As the signature's `smooth:` writes it: `exp`, `none`, `floor[0.10]`, `add-k[1.00]`.
    pub fn signature(self) -> String {
        match self {
            Smoothing::Exp | Smoothing::None => self.name().to_string(),
            Smoothing::Floor(v) | Smoothing::AddK(v) => format!("{}[{v:.2}]", self.name()),
        }
    }
}

impl fmt::Display for Smoothing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.signature())
    }
}

impl FromStr for Smoothing {
    type Err = ScoreError;

    /// `exp`, `none`, `floor` or `add-k` (the last two with sacreBLEU's default values).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "exp" => Ok(Smoothing::Exp),
            "none" => Ok(Smoothing::None),
            "floor" => Ok(Smoothing::Floor(Smoothing::FLOOR_DEFAULT)),
            "add-k" => Ok(Smoothing::AddK(Smoothing::ADD_K_DEFAULT)),
            _ => Err(ScoreError::UnknownSmoothing(s.to_string())),
        }
    }
}

/// What BLEU is computed with. `Default` is sacreBLEU's default BLEU: `13a`, mixed case,
/// `exp` smoothing, order 4, no effective order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BleuOptions {
    /// How segments are cut into words.
    pub tokenizer: Tokenizer,
    /// Lowercase hypotheses and references first (signature `case:lc`, else `case:mixed`).
    pub lowercase: bool,
    /// What an order without matches counts as.
    pub smoothing: Smoothing,
    /// The highest n-gram order (4 for BLEU).
    pub max_order: usize,
    /// Average only the orders that have n-grams (for sentence-level scores; signature
    /// `eff:yes`). Off for corpus BLEU, as in sacreBLEU.
    pub effective_order: bool,
}

impl Default for BleuOptions {
    fn default() -> Self {
        BleuOptions {
            tokenizer: Tokenizer::V13a,
            lowercase: false,
            smoothing: Smoothing::Exp,
            max_order: MAX_NGRAM_ORDER,
            effective_order: false,
        }
    }
}

impl BleuOptions {
    /// "Lowercased-token BLEU", the convention of the PyTorch translation tutorial's published
    /// scores (torchtext's `bleu_score` over lowercased word tokens, no smoothing): lowercase,
    /// the `13a` tokenizer, smoothing `none`. It equals torchtext's `bleu_score` on the same
    /// tokens times 100 (torchtext computes in float32 and returns a fraction; both give 0 as
    /// soon as one order has no match). Printed as [`LOWERCASED_TOKEN_BLEU_LABEL`].
    pub fn lowercased_tokens() -> Self {
        BleuOptions {
            tokenizer: Tokenizer::V13a,
            lowercase: true,
            smoothing: Smoothing::None,
            ..BleuOptions::default()
        }
    }

    /// The name printed before the score: `BLEU`, or [`LOWERCASED_TOKEN_BLEU_LABEL`] for
    /// [`BleuOptions::lowercased_tokens`].
    pub fn label(&self) -> &'static str {
        if *self == BleuOptions::lowercased_tokens() {
            LOWERCASED_TOKEN_BLEU_LABEL
        } else {
            "BLEU"
        }
    }

    /// sacreBLEU 2.x's signature for these options and one reference, e.g.
    /// `nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0`.
    pub fn signature(&self) -> String {
        format!(
            "nrefs:1|case:{}|eff:{}|tok:{}|smooth:{}|version:{SACREBLEU_VERSION}",
            if self.lowercase { "lc" } else { "mixed" },
            if self.effective_order { "yes" } else { "no" },
            self.tokenizer.name(),
            self.smoothing.signature(),
        )
    }

    /// A segment as BLEU counts it: lowercased (if asked), right-stripped, tokenized; words are
    /// its whitespace-separated pieces.
    pub fn preprocess(&self, segment: &str) -> String {
        if self.lowercase {
            let lower = segment.to_lowercase();
            self.tokenizer.tokenize(python_rstrip(&lower))
        } else {
            self.tokenizer.tokenize(python_rstrip(segment))
        }
    }

    fn validate(&self) -> Result<(), ScoreError> {
        if self.max_order == 0 {
            return Err(ScoreError::InvalidOption(
                "BLEU's max_order must be at least 1 (4 is standard)".into(),
            ));
        }
        if let Smoothing::Floor(v) | Smoothing::AddK(v) = self.smoothing {
            if !(v.is_finite() && v >= 0.0) {
                return Err(ScoreError::InvalidOption(format!(
                    "the {} smoothing value must be a finite number >= 0, not {v}",
                    self.smoothing.name()
                )));
            }
        }
        Ok(())
    }
}

/// A corpus BLEU score with the statistics it was computed from.
#[derive(Debug, Clone, PartialEq)]
pub struct BleuScore {
    /// BLEU, 0 to 100.
    pub score: f64,
    /// Precision of each order in percent, after smoothing (as sacreBLEU reports them).
    pub precisions: Vec<f64>,
    /// Clipped n-gram matches of each order (before any `add-k`, which sacreBLEU adds in).
    pub counts: Vec<u64>,
    /// Hypothesis n-grams of each order.
    pub totals: Vec<u64>,
    /// Brevity penalty.
    pub bp: f64,
    /// Hypothesis words, summed over the corpus.
    pub sys_len: u64,
    /// Reference words, summed over the corpus.
    pub ref_len: u64,
    /// `sys_len / ref_len` (0 when there are no reference words).
    pub ratio: f64,
    /// The options it was computed with.
    pub options: BleuOptions,
}

impl BleuScore {
    /// The sacreBLEU signature of the options (see [`BleuOptions::signature`]).
    pub fn signature(&self) -> String {
        self.options.signature()
    }

    /// The part after the score, as sacreBLEU prints it:
    /// `64.7/40.2/26.6/17.9 (BP = 1.000 ratio = 1.012 hyp_len = 1234 ref_len = 1219)`.
    pub fn verbose(&self) -> String {
        let precisions: Vec<String> = self.precisions.iter().map(|p| format!("{p:.1}")).collect();
        format!(
            "{} (BP = {:.3} ratio = {:.3} hyp_len = {} ref_len = {})",
            precisions.join("/"),
            self.bp,
            self.ratio,
            self.sys_len,
            self.ref_len
        )
    }

    /// sacreBLEU's line without the signature:
    /// `BLEU = 33.41 64.7/40.2/26.6/17.9 (BP = 1.000 ratio = 1.012 hyp_len = 1234 ref_len = 1219)`
    /// (with [`LOWERCASED_TOKEN_BLEU_LABEL`] in place of `BLEU` for that convention).
    pub fn format(&self) -> String {
        format!(
            "{} = {:.2} {}",
            self.options.label(),
            self.score,
            self.verbose()
        )
    }

    /// sacreBLEU's command-line text output: `BLEU|<signature> = 33.41 64.7/...`.
    pub fn format_with_signature(&self) -> String {
        format!(
            "{}|{} = {:.2} {}",
            self.options.label(),
            self.signature(),
            self.score,
            self.verbose()
        )
    }
}

impl fmt::Display for BleuScore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.format())
    }
}

/// Counts of every n-gram of orders 1 to `max_order` in `words`.
fn ngram_counts<'a>(words: &'a [&'a str], max_order: usize) -> HashMap<&'a [&'a str], u64> {
    let mut counts = HashMap::new();
    for n in 1..=max_order.min(words.len()) {
        for gram in words.windows(n) {
            *counts.entry(gram).or_insert(0) += 1;
        }
    }
    counts
}

/// Corpus BLEU of `hyps` against `refs` (line i of one with line i of the other), as
/// sacreBLEU's `BLEU(**opts).corpus_score(hyps, [refs])` computes it.
///
/// Errors when the two have different lengths (saying both), or on invalid options.
/// Empty hypotheses are allowed (they only lengthen the references).
pub fn corpus_bleu<H: AsRef<str>, R: AsRef<str>>(
    hyps: &[H],
    refs: &[R],
    opts: &BleuOptions,
) -> Result<BleuScore, ScoreError> {
    check_counts(hyps.len(), refs.len())?;
    opts.validate()?;
    let order = opts.max_order;
    let (mut sys_len, mut ref_len) = (0u64, 0u64);
    let mut counts = vec![0u64; order];
    let mut totals = vec![0u64; order];
    for (hyp, reference) in hyps.iter().zip(refs) {
        let hyp = opts.preprocess(hyp.as_ref());
        let reference = opts.preprocess(reference.as_ref());
        let hyp_words: Vec<&str> = python_split(&hyp).collect();
        let ref_words: Vec<&str> = python_split(&reference).collect();
        sys_len += hyp_words.len() as u64;
        ref_len += ref_words.len() as u64;
        let ref_counts = ngram_counts(&ref_words, order);
        for (gram, count) in ngram_counts(&hyp_words, order) {
            let n = gram.len() - 1;
            totals[n] += count;
            counts[n] += count.min(ref_counts.get(gram).copied().unwrap_or(0));
        }
    }
    Ok(compute_bleu(counts, totals, sys_len, ref_len, *opts))
}

/// sacreBLEU's `log` for BLEU: log 0 is -9999999999 rather than minus infinity.
fn floored_log(x: f64) -> f64 {
    if x == 0.0 {
        -9_999_999_999.0
    } else {
        x.ln()
    }
}

/// BLEU from its sufficient statistics (sacreBLEU's `compute_bleu`, same operations in the
/// same order, so the result is the same to the last bit or nearly).
fn compute_bleu(
    counts: Vec<u64>,
    totals: Vec<u64>,
    sys_len: u64,
    ref_len: u64,
    opts: BleuOptions,
) -> BleuScore {
    let order = opts.max_order;
    let bp = if sys_len >= ref_len {
        1.0
    } else if sys_len > 0 {
        (1.0 - ref_len as f64 / sys_len as f64).exp()
    } else {
        0.0
    };
    let ratio = if ref_len > 0 {
        sys_len as f64 / ref_len as f64
    } else {
        0.0
    };
    let mut precisions = vec![0.0; order];
    let mut score = 0.0;
    // No match at all: 0 without looking further (sacreBLEU #141).
    if counts.iter().any(|&c| c > 0) {
        let mut smooth_mteval = 1.0;
        let mut eff_order = order;
        for n in 0..order {
            let (mut correct, mut total) = (counts[n] as f64, totals[n] as f64);
            if let Smoothing::AddK(k) = opts.smoothing {
                if n > 0 {
                    correct += k;
                    total += k;
                }
            }
            if total == 0.0 {
                break;
            }
            if opts.effective_order {
                eff_order = n + 1;
            }
            if correct == 0.0 {
                match opts.smoothing {
                    Smoothing::Exp => {
                        smooth_mteval *= 2.0;
                        precisions[n] = 100.0 / (smooth_mteval * total);
                    }
                    Smoothing::Floor(v) => precisions[n] = 100.0 * v / total,
                    Smoothing::None | Smoothing::AddK(_) => {}
                }
            } else {
                precisions[n] = 100.0 * correct / total;
            }
        }
        let log_sum = precisions[..eff_order]
            .iter()
            .fold(0.0, |acc, &p| acc + floored_log(p));
        score = bp * (log_sum / eff_order as f64).exp();
    }
    BleuScore {
        score,
        precisions,
        counts,
        totals,
        bp,
        sys_len,
        ref_len,
        ratio,
        options: opts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_is_100_and_disjoint_is_0() {
        let h = ["the cat sat on the mat"];
        let s = corpus_bleu(&h, &h, &BleuOptions::default()).unwrap();
        // exp(log(100)), like sacreBLEU's 100.00000000000004
        assert!((s.score - 100.0).abs() < 1e-12);
        assert_eq!(s.bp, 1.0);
        let s = corpus_bleu(&["a b c d"], &["e f g h"], &BleuOptions::default()).unwrap();
        assert_eq!(s.score, 0.0);
        assert_eq!(s.precisions, vec![0.0; 4]);
    }

    #[test]
    fn empty_hypotheses_do_not_panic() {
        let s = corpus_bleu(&["", ""], &["a b", "c"], &BleuOptions::default()).unwrap();
        assert_eq!((s.score, s.bp, s.sys_len, s.ref_len), (0.0, 0.0, 0, 3));
        let s = corpus_bleu::<&str, &str>(&[], &[], &BleuOptions::default()).unwrap();
        assert_eq!(s.score, 0.0);
        let s = corpus_bleu(&[""], &[""], &BleuOptions::lowercased_tokens()).unwrap();
        assert_eq!(s.score, 0.0);
    }

    #[test]
    fn count_mismatch_names_both_counts() {
        let e = corpus_bleu(&["a"], &["a", "b"], &BleuOptions::default()).unwrap_err();
        assert_eq!(e, ScoreError::CountMismatch { hyps: 1, refs: 2 });
        let msg = e.to_string();
        assert!(
            msg.contains("1 hypotheses") && msg.contains("2 references"),
            "{msg}"
        );
    }

    #[test]
    fn exp_smoothing_halves_each_empty_order() {
        // 3 words: orders 1-3 exist; order 3 has no match, order 4 no n-grams.
        let s = corpus_bleu(&["a b x"], &["a b c"], &BleuOptions::default()).unwrap();
        assert_eq!(s.counts, vec![2, 1, 0, 0]);
        assert_eq!(s.totals, vec![3, 2, 1, 0]);
        assert_eq!(s.precisions[2], 100.0 / 2.0);
        assert_eq!(s.precisions[3], 0.0);
        assert_eq!(s.score, 0.0);
    }

    #[test]
    fn signatures_and_labels() {
        assert_eq!(
            BleuOptions::default().signature(),
            format!("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{SACREBLEU_VERSION}")
        );
        let lc = BleuOptions::lowercased_tokens();
        assert_eq!(
            lc.signature(),
            format!("nrefs:1|case:lc|eff:no|tok:13a|smooth:none|version:{SACREBLEU_VERSION}")
        );
        assert_eq!(lc.label(), LOWERCASED_TOKEN_BLEU_LABEL);
        assert_eq!(Smoothing::Floor(0.1).signature(), "floor[0.10]");
        assert_eq!("add-k".parse::<Smoothing>(), Ok(Smoothing::AddK(1.0)));
        assert!("expo".parse::<Smoothing>().is_err());
    }
}
