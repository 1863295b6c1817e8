//! Decoding over a restricted output vocabulary (CTranslate2's vocabulary map): for a batch
//! of sources a [`CandidateVocab`] names the target tokens worth scoring, and the output
//! layer multiplies by those rows of its weight only, so the logits (and the search's
//! log-softmax) cover the candidates alone. The columns of such logits are the candidates'
//! ids in ascending order ([`crate::DecodeState::vocab`]). The backend cuts the output
//! layer down ([`crate::backend::OutputLayer::restricted`]).

use candle_core::{Result, Tensor};

/// Which target tokens a batch of sources may produce.
pub trait CandidateVocab: std::fmt::Debug + Send + Sync {
    /// The candidates of a batch whose sources are `sources` (token ids without padding),
    /// ascending and without repeats; `<eos>` must be among them.
    fn candidates(&self, sources: &[&[u32]]) -> Vec<u32>;
}

/// Each row's token ids of `src` (B, S) without the padding `pad`.
pub fn source_rows(src: &Tensor, pad: u32) -> Result<Vec<Vec<u32>>> {
    Ok(src
        .to_vec2::<u32>()?
        .into_iter()
        .map(|row| row.into_iter().filter(|&t| t != pad).collect())
        .collect())
}
