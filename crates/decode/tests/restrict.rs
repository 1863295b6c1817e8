//! Decoding over a restricted output vocabulary (`ParamBuilder::with_candidates`): with every
//! token a candidate the searches give exactly the unrestricted results (the columns map back
//! to their tokens); with fewer, the logits of the candidates are the full logits' columns and
//! every output token is a candidate.

use candle_core::Result;
use std::sync::Arc;
use transformer_decode::{beam_search, greedy, LogProbs, StepModel};

mod common;

use common::{builder, model, model_by, opts, sources, Fixed, EOS, PAD, VOCAB};

#[test]
fn every_token_a_candidate_decodes_as_the_full_vocabulary() -> Result<()> {
    let full = model(5, true)?;
    // The same weights (the same seed), every token a candidate.
    let every = Arc::new(Fixed((0..VOCAB as u32).collect()));
    let all = model_by(builder(5).with_candidates(every), true)?;
    let src = sources(6, 2)?;
    for beam in [1, 3] {
        let o = opts(beam);
        assert_eq!(beam_search(&full, &src, &o)?, beam_search(&all, &src, &o)?);
    }
    assert_eq!(
        greedy(&full, &src, &opts(1))?,
        greedy(&all, &src, &opts(1))?
    );
    Ok(())
}

#[test]
fn a_few_candidates_are_the_full_logits_columns_and_bound_the_output() -> Result<()> {
    let full = model(7, false)?;
    let keep: Vec<u32> = vec![EOS, 4, 6, 9, 11];
    let few = model_by(
        builder(7).with_candidates(Arc::new(Fixed(keep.clone()))),
        false,
    )?;
    let src = sources(4, 1)?;
    let (mut a, mut b) = (
        StepModel::start(&full, &src, PAD)?,
        StepModel::start(&few, &src, PAD)?,
    );
    let tokens = vec![common::BOS; 4];
    let fa = StepModel::step(&full, &mut a, &tokens, false)?;
    let fb = StepModel::step(&few, &mut b, &tokens, false)?;
    assert!(fa.vocab.is_none());
    assert_eq!(fb.vocab.as_deref(), Some(keep.as_slice()));
    let (la, lb) = (fa.logits.to_vec2::<f64>()?, fb.logits.to_vec2::<f64>()?);
    for (ra, rb) in la.iter().zip(&lb) {
        for (c, &t) in keep.iter().enumerate() {
            assert!(
                (ra[t as usize] - rb[c]).abs() < 1e-12,
                "{t}: {} {}",
                ra[t as usize],
                rb[c]
            );
        }
    }
    // Log-probabilities are over the candidates; other tokens have none.
    let lp = LogProbs::of(&fb)?;
    assert_eq!(lp.get(0, 5), None);
    let total: f64 = keep
        .iter()
        .map(|&t| f64::from(lp.get(0, t).unwrap()).exp())
        .sum();
    assert!((total - 1.0).abs() < 1e-5, "{total}");
    assert!(keep.contains(&lp.argmax(0)));
    for h in beam_search(&few, &src, &opts(3))? {
        assert!(h.tokens.iter().all(|t| keep.contains(t)), "{:?}", h.tokens);
    }
    Ok(())
}
