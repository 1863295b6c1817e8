//! What the decoding tests share: special ids, padded random sources, search options.
#![allow(dead_code)]

use candle_core::{DType, Device, Result, Tensor};
use transformer_decode::DecodeOptions;
use transformer_model::restrict::CandidateVocab;
use transformer_model::{ParamBuilder, Seq2Seq, Seq2SeqConfig, TransformerConfig};

pub const PAD: u32 = 0;
pub const BOS: u32 = 1;
pub const EOS: u32 = 2;
pub const VOCAB: usize = 13;

/// A fixed list of candidates, whatever the sources.
#[derive(Debug)]
pub struct Fixed(pub Vec<u32>);

impl CandidateVocab for Fixed {
    fn candidates(&self, _sources: &[&[u32]]) -> Vec<u32> {
        self.0.clone()
    }
}

/// `n` sources of lengths 1..=7 (ids 3.., then padding).
pub fn sources(n: usize, seed: u64) -> Result<Tensor> {
    let s = 8;
    let mut ids = vec![PAD; n * s];
    for r in 0..n {
        let len = 1 + (r * 5 + seed as usize) % 7;
        for j in 0..len {
            ids[r * s + j] = 3 + ((r * 31 + j * 17 + seed as usize * 7) % (VOCAB - 3)) as u32;
        }
        ids[r * s + len] = EOS;
    }
    Tensor::from_vec(ids, (n, s), &Device::Cpu)
}

pub fn opts(beam: usize) -> DecodeOptions {
    DecodeOptions {
        beam,
        max_len_a: 1.0,
        max_len_b: 4,
        length_penalty: 0.0,
        bos: BOS,
        eos: EOS,
        pad: PAD,
        source_end: Some(EOS),
        want_attention: false,
        want_scores: true,
        rules: Default::default(),
    }
}

/// A small random Transformer in f64 (so that ties cannot flip between two equally correct
/// computations), embeddings shared or not.
pub fn model(seed: u64, share: bool) -> Result<Seq2Seq> {
    model_by(builder(seed), share)
}

/// The builder of [`model`]'s weights (f64, drawn from `seed`).
pub fn builder(seed: u64) -> ParamBuilder {
    ParamBuilder::new(DType::F64, &Device::Cpu, seed)
}

/// [`model`] built by `pb` (which says how it runs: its candidates, say).
pub fn model_by(pb: ParamBuilder, share: bool) -> Result<Seq2Seq> {
    Seq2Seq::with_config(
        &pb,
        &Seq2SeqConfig {
            transformer: TransformerConfig {
                dropout: 0.1,
                ..TransformerConfig::tiny()
            },
            src_vocab: VOCAB,
            tgt_vocab: VOCAB,
            share_embeddings: share,
            inputs: Default::default(),
        },
    )
}
