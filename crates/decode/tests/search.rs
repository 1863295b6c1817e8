//! The searches against each other and against decoding without a cache, on small random
//! Transformers in f64 (so that ties cannot flip between two equally correct computations).

use candle_core::Result;
use transformer_decode::{beam_search, greedy, DecodeOptions, Recompute, StepModel};

mod common;

use common::{model, opts, sources, BOS, EOS, PAD};

#[test]
fn cached_steps_give_the_logits_of_recomputing_the_prefix() -> Result<()> {
    let m = model(3, false)?;
    let src = sources(6, 1)?;
    let mut cached = StepModel::start(&m, &src, PAD)?;
    let rec = Recompute(&m);
    let mut plain = rec.start(&src, PAD)?;
    let mut tokens = vec![BOS; 6];
    for step in 0..6 {
        let a = StepModel::step(&m, &mut cached, &tokens, true)?;
        let b = rec.step(&mut plain, &tokens, true)?;
        let diff = (a.logits - &b.logits)?
            .abs()?
            .max_all()?
            .to_scalar::<f64>()?;
        assert!(diff < 1e-10, "step {step}: logits differ by {diff}");
        let (aa, ba) = (a.attention.unwrap(), b.attention.unwrap());
        assert_eq!(aa.dims(), ba.dims());
        let diff = (aa - ba)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff < 1e-6, "step {step}: attention differs by {diff}");
        tokens = b
            .logits
            .argmax(1)?
            .to_vec1::<u32>()?
            .into_iter()
            .map(|t| if t == EOS { 3 } else { t })
            .collect();
        // Reordering rows (as beams do) keeps the two in step.
        if step == 2 {
            let rows = [5u32, 0, 0, 3, 2, 1];
            StepModel::select_rows(&m, &mut cached, &rows)?;
            rec.select_rows(&mut plain, &rows)?;
            tokens = rows.iter().map(|&r| tokens[r as usize]).collect();
        }
    }
    Ok(())
}

#[test]
fn searches_with_and_without_the_cache_agree() -> Result<()> {
    for seed in [1, 2, 3] {
        let m = model(seed, seed == 2)?;
        let src = sources(9, seed)?;
        for beam in [1, 4] {
            let o = opts(beam);
            let cached = if beam == 1 {
                greedy(&m, &src, &o)?
            } else {
                beam_search(&m, &src, &o)?
            };
            let plain = if beam == 1 {
                greedy(&Recompute(&m), &src, &o)?
            } else {
                beam_search(&Recompute(&m), &src, &o)?
            };
            for (a, b) in cached.iter().zip(&plain) {
                assert_eq!(a.tokens, b.tokens, "seed {seed} beam {beam}");
                assert!(
                    (a.score - b.score).abs() < 1e-9,
                    "{} vs {}",
                    a.score,
                    b.score
                );
            }
        }
    }
    Ok(())
}

#[test]
fn beam_of_one_is_greedy_and_wider_beams_score_no_lower() -> Result<()> {
    for seed in [4, 5, 6, 7] {
        let m = model(seed, false)?;
        let src = sources(12, seed)?;
        let g = greedy(&m, &src, &opts(1))?;
        let b1 = beam_search(&m, &src, &opts(1))?;
        assert_eq!(g, b1, "seed {seed}");
        for k in [2, 5] {
            let b = beam_search(&m, &src, &opts(k))?;
            for (i, (h, gh)) in b.iter().zip(&g).enumerate() {
                assert!(
                    h.score >= gh.score - 1e-9,
                    "seed {seed} beam {k} sentence {i}: {} < greedy {}",
                    h.score,
                    gh.score
                );
            }
        }
    }
    Ok(())
}

#[test]
fn a_sentence_decodes_the_same_alone_and_in_a_padded_batch() -> Result<()> {
    let m = model(8, false)?;
    let src = sources(7, 3)?;
    let all = beam_search(&m, &src, &opts(3))?;
    for r in 0..7 {
        let alone = beam_search(&m, &src.narrow(0, r, 1)?, &opts(3))?;
        assert_eq!(alone[0].tokens, all[r].tokens, "row {r}");
        assert!((alone[0].score - all[r].score).abs() < 1e-9);
    }
    Ok(())
}

#[test]
fn length_limit_and_attention_are_kept() -> Result<()> {
    let m = model(9, false)?;
    let src = sources(5, 2)?;
    let o = DecodeOptions {
        max_len_a: 0.0,
        max_len_b: 2,
        want_attention: true,
        want_scores: true,
        ..opts(3)
    };
    for hyps in [greedy(&m, &src, &o)?, beam_search(&m, &src, &o)?] {
        for h in &hyps {
            assert!(h.tokens.len() <= 2, "{:?}", h.tokens);
            // One attention row per output position (tokens, then the end), each over
            // layers x heads x source positions, summing to 1 per layer and head.
            assert_eq!(h.attention.len(), h.tokens.len() + 1);
            let per_head = 8;
            for a in &h.attention {
                assert_eq!(a.len(), 2 * 4 * per_head);
                for head in a.chunks(per_head) {
                    let s: f32 = head.iter().sum();
                    assert!((s - 1.0).abs() < 1e-5, "{s}");
                }
            }
        }
    }
    Ok(())
}
