//! Decoding a target sequence token by token.
//!
//! One interface ([`StepModel`]: encode once, step with a cache, select rows) and the
//! searches written once against it ([`greedy`], [`beam_search`], [`sample_decode`]), plus
//! the language model's sampling ([`generate_lm`]).
//!
//! # Example
//! Greedy and beam search with an untrained encoder-decoder on the CPU:
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! use transformer_decode::{beam_search, greedy, DecodeOptions};
//! use transformer_model::{ParamBuilder, Seq2Seq, TransformerConfig};
//!
//! // 12 tokens on both sides: 0 = padding, 1 = <bos>, 2 = <eos> (the options' defaults).
//! let device = Device::Cpu;
//! let pb = ParamBuilder::new(DType::F32, &device, 7);
//! let model = Seq2Seq::new(&pb, &TransformerConfig::tiny(), 12, 12)?;
//!
//! // Two sources, the second padded: (B, S) = (2, 5).
//! let src = Tensor::new(&[[5u32, 6, 7, 8, 2], [9, 10, 2, 0, 0]], &device)?;
//! let opts = DecodeOptions {
//!     beam: 1,
//!     max_len_a: 1.0,
//!     max_len_b: 2,
//!     length_penalty: 0.0,
//!     ..DecodeOptions::default()
//! };
//! let out = greedy(&model, &src, &opts)?;
//! assert_eq!(out.len(), 2);
//! for (hyp, src_len) in out.iter().zip([5, 3]) {
//!     // Each output ends with <eos> (not in `tokens`) or at `max_len_a * src_len + max_len_b`.
//!     assert!(hyp.tokens.len() <= opts.max_len(src_len));
//!     assert!(hyp.finished || hyp.tokens.len() == opts.max_len(src_len));
//! }
//!
//! // Without length normalisation, beam search never scores below greedy.
//! let beams = beam_search(&model, &src, &DecodeOptions { beam: 4, ..opts })?;
//! for (b, g) in beams.iter().zip(&out) {
//!     assert!(b.score >= g.score - 1e-6);
//! }
//! # Ok::<(), candle_core::Error>(())
//! ```

#![warn(missing_docs)]

pub mod engines;
pub mod search;
pub mod step;

pub use engines::{
    ctranslate2_search, ctranslate2_search_prefixed, huggingface_search, SearchRules,
};
pub use search::{
    beam_search, beam_search_nbest, greedy, sample_decode, DecodeOptions, Hypothesis,
};
pub use step::{LogProbs, Recompute, StepModel, StepOutput};

use candle_core::{Result, Tensor};
use transformer_model::Mode;

/// How to pick each next token when generating.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// Divides the logits; 0 means greedy (always the most likely token).
    pub temperature: f64,
    /// Sample only among the `k` most likely tokens.
    pub top_k: Option<usize>,
}

/// Picks a token from one row of logits; `u` is a uniform number in [0, 1).
pub fn sample(logits: &[f32], s: Sampling, u: f64) -> u32 {
    let argmax = || {
        logits
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |best, (i, &x)| {
                if x > best.1 {
                    (i, x)
                } else {
                    best
                }
            })
            .0 as u32
    };
    if s.temperature <= 0.0 || s.top_k == Some(1) {
        return argmax();
    }
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    if let Some(k) = s.top_k.filter(|&k| k < logits.len()) {
        idx.select_nth_unstable_by(k, |&a, &b| logits[b].total_cmp(&logits[a]));
        idx.truncate(k);
    }
    let max = idx
        .iter()
        .map(|&i| logits[i])
        .fold(f32::NEG_INFINITY, f32::max) as f64;
    let weights: Vec<f64> = idx
        .iter()
        .map(|&i| ((logits[i] as f64 - max) / s.temperature).exp())
        .collect();
    let mut target = u * weights.iter().sum::<f64>();
    for (&i, w) in idx.iter().zip(&weights) {
        if target < *w {
            return i as u32;
        }
        target -= w;
    }
    *idx.last().unwrap_or(&0) as u32
}

/// Continues `prompt` by `max_tokens` tokens with a key/value cache: the prompt is run once,
/// then each step feeds only the new token.
pub fn generate_lm(
    model: &transformer_model::TransformerLm,
    prompt: &[u32],
    max_tokens: usize,
    sampling: Sampling,
    rng: &transformer_model::Rng,
    device: &candle_core::Device,
) -> Result<Vec<u32>> {
    if prompt.is_empty() {
        candle_core::bail!("the prompt has no tokens");
    }
    let mut cache = model.new_cache();
    let mut out = Vec::with_capacity(max_tokens);
    let mut input = Tensor::new(prompt, device)?.unsqueeze(0)?;
    for _ in 0..max_tokens {
        let last = model
            .next_logits(&input, &mut cache, Mode::Eval)?
            .get(0)?
            .to_dtype(candle_core::DType::F32)?
            .to_vec1::<f32>()?;
        let next = sample(&last, sampling, rng.uniform());
        out.push(next);
        input = Tensor::new(&[next], device)?.unsqueeze(0)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_respects_temperature_and_top_k() {
        let logits = [0.0f32, 3.0, 1.0, 2.9];
        let sampling = |temperature, top_k| Sampling { temperature, top_k };
        assert_eq!(sample(&logits, sampling(0.0, None), 0.7), 1);
        let top2 = sampling(1.0, Some(2));
        for i in 0..100 {
            let t = sample(&logits, top2, i as f64 / 100.0);
            assert!(t == 1 || t == 3, "top-2 sampled {t}");
        }
        // A very low temperature is nearly greedy.
        assert_eq!(sample(&logits, sampling(0.01, None), 0.4), 1);
        // Frequencies follow the softmax.
        let warm = sampling(1.0, None);
        let n = 10_000;
        let ones = (0..n)
            .filter(|i| sample(&logits, warm, (*i as f64 + 0.5) / n as f64) == 1)
            .count();
        let z: f64 = logits.iter().map(|&x| (x as f64).exp()).sum();
        let p1 = 3f64.exp() / z;
        assert!(((ones as f64 / n as f64) - p1).abs() < 0.01);
    }
}
