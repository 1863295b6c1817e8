//! Greedy search without scores (`DecodeOptions::want_scores` false) asks the model for each
//! step's most likely token alone (`StepModel::step_argmax`); on the CPU in f32 the
//! Transformer's output layer finds it through an int8 screen. The tokens must be those of
//! the scored search, step by step and sentence by sentence.

use candle_core::{DType, Device, Result, Tensor};
use std::sync::Arc;
use transformer_decode::{greedy, DecodeOptions, LogProbs, StepModel};
use transformer_model::{ParamBuilder, Seq2Seq, Seq2SeqConfig, TransformerConfig};

mod common;

use common::{opts, sources, Fixed, BOS, PAD, VOCAB};

/// Output tokens: enough for the screen to rule most of them out.
const TGT_VOCAB: usize = 600;

/// A small random Transformer in f32 (the arithmetic the screen covers), built by `pb`.
fn f32_model_by(pb: ParamBuilder) -> Result<Seq2Seq> {
    Seq2Seq::with_config(
        &pb,
        &Seq2SeqConfig {
            transformer: TransformerConfig::tiny(),
            src_vocab: VOCAB,
            tgt_vocab: TGT_VOCAB,
            share_embeddings: false,
            inputs: Default::default(),
        },
    )
}

/// [`f32_model_by`] with its weights drawn from `seed`.
fn f32_model(seed: u64) -> Result<Seq2Seq> {
    f32_model_by(ParamBuilder::new(DType::F32, &Device::Cpu, seed))
}

/// Each step's `step_argmax` is the argmax of the same step's logits, over the whole
/// vocabulary and over a restricted one, for 1 to 12 rows (the screen runs up to 8).
#[test]
fn step_argmax_is_the_argmax_of_the_logits() -> Result<()> {
    let full = f32_model(3)?;
    // The same weights (the same seed), decoding over every third token.
    let every_third = Arc::new(Fixed((0..TGT_VOCAB as u32).step_by(3).collect()));
    let few =
        f32_model_by(ParamBuilder::new(DType::F32, &Device::Cpu, 3).with_candidates(every_third))?;
    for m in [&full, &few] {
        for n in [1, 5, 12] {
            let src = sources(n, 4)?;
            let (mut a, mut b) = (
                StepModel::start(m, &src, PAD)?,
                StepModel::start(m, &src, PAD)?,
            );
            let mut tokens = vec![BOS; n];
            for _ in 0..6 {
                let out = StepModel::step(m, &mut a, &tokens, false)?;
                let lp = LogProbs::of(&out)?;
                let want: Vec<u32> = (0..n).map(|r| lp.argmax(r)).collect();
                let got = StepModel::step_argmax(m, &mut b, &tokens)?;
                assert_eq!(got, want, "{n} rows");
                tokens = got;
            }
        }
    }
    Ok(())
}

/// Greedy search gives the same tokens with and without scores, alone and in batches; the
/// scores are NaN without.
#[test]
fn greedy_without_scores_gives_the_scored_tokens() -> Result<()> {
    let model = f32_model(11)?;
    let scored = DecodeOptions {
        max_len_b: 12,
        ..opts(1)
    };
    let unscored = DecodeOptions {
        want_scores: false,
        ..scored
    };
    for (n, seed) in [(1, 1), (1, 2), (4, 3), (12, 5)] {
        let src: Tensor = sources(n, seed)?;
        let (a, b) = (
            greedy(&model, &src, &scored)?,
            greedy(&model, &src, &unscored)?,
        );
        for (x, y) in a.iter().zip(&b) {
            assert_eq!((&x.tokens, x.finished), (&y.tokens, y.finished));
            assert!(x.score.is_finite() && y.score.is_nan());
        }
    }
    Ok(())
}
