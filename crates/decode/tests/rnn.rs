//! The recurrent encoder-decoders through the one decoding interface: stepping equals
//! teacher forcing, padding is never attended to, the searches agree with each other, and
//! training reaches every parameter. Small random models in f64.

use candle_core::{DType, Device, Result, Tensor};
use transformer_decode::{beam_search, greedy, DecodeOptions, StepModel};
use transformer_model::{Mode, ParamBuilder, Params, RnnAttention, RnnSeq2Seq, RnnSeq2SeqConfig};

mod common;

use common::{opts, sources, PAD, VOCAB};
const KINDS: [RnnAttention; 3] = [
    RnnAttention::None,
    RnnAttention::Dot,
    RnnAttention::Bahdanau,
];

fn model(seed: u64, attention: RnnAttention) -> Result<(RnnSeq2Seq, Params)> {
    let pb = ParamBuilder::new(DType::F64, &Device::Cpu, seed);
    let m = RnnSeq2Seq::new(
        &pb,
        &RnnSeq2SeqConfig {
            src_vocab: VOCAB,
            tgt_vocab: VOCAB,
            emb: 6,
            hidden: 5,
            dropout: 0.2,
            attention,
        },
    )?;
    Ok((m, pb.params()))
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    (a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>()
}

#[test]
fn stepping_gives_the_logits_of_teacher_forcing() -> Result<()> {
    for kind in KINDS {
        let (m, _) = model(3, kind)?;
        let src = sources(5, 1)?;
        let tgt: Vec<u32> = (0..5 * 4)
            .map(|i| 1 + (i * 7 % (VOCAB as u32 - 1)))
            .collect();
        let tgt = Tensor::from_vec(tgt, (5, 4), &Device::Cpu)?;
        let forced = m.forward(&src, &tgt, PAD, Mode::Eval)?;
        let mut st = StepModel::start(&m, &src, PAD)?;
        for t in 0..4 {
            let col: Vec<u32> = tgt.narrow(1, t, 1)?.squeeze(1)?.to_vec1()?;
            let out = StepModel::step(&m, &mut st, &col, false)?;
            let want = forced.narrow(1, t, 1)?.squeeze(1)?;
            let d = max_abs_diff(&out.logits, &want)?;
            assert!(d < 1e-12, "{kind:?} step {t}: {d}");
        }
    }
    Ok(())
}

#[test]
fn attention_never_looks_at_padding() -> Result<()> {
    for kind in [RnnAttention::Dot, RnnAttention::Bahdanau] {
        let (m, _) = model(4, kind)?;
        let src = sources(6, 2)?;
        let o = DecodeOptions {
            want_attention: true,
            ..opts(1)
        };
        let lens: Vec<usize> = src
            .ne(PAD)?
            .to_dtype(DType::U32)?
            .sum(1)?
            .to_vec1::<u32>()?
            .into_iter()
            .map(|n| n as usize)
            .collect();
        for (r, h) in greedy(&m, &src, &o)?.iter().enumerate() {
            assert_eq!(h.attention.len(), h.tokens.len() + 1);
            for a in &h.attention {
                assert_eq!(a.len(), 8);
                let s: f32 = a.iter().sum();
                assert!((s - 1.0).abs() < 1e-5, "{kind:?}: {s}");
                assert!(
                    a[lens[r]..].iter().all(|&w| w == 0.0),
                    "{kind:?} row {r}: {a:?}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn a_sentence_decodes_the_same_alone_and_in_a_padded_batch() -> Result<()> {
    for kind in KINDS {
        let (m, _) = model(8, kind)?;
        let src = sources(7, 3)?;
        let all = beam_search(&m, &src, &opts(3))?;
        for r in 0..7 {
            // Alone, without any padding column.
            let row = src.narrow(0, r, 1)?;
            let len = row
                .ne(PAD)?
                .to_dtype(DType::U32)?
                .sum_all()?
                .to_scalar::<u32>()?;
            let alone = beam_search(&m, &row.narrow(1, 0, len as usize)?, &opts(3))?;
            assert_eq!(alone[0].tokens, all[r].tokens, "{kind:?} row {r}");
            assert!((alone[0].score - all[r].score).abs() < 1e-9);
        }
    }
    Ok(())
}

#[test]
fn beam_of_one_is_greedy_and_wider_beams_score_no_lower() -> Result<()> {
    for kind in KINDS {
        for seed in [5, 6] {
            let (m, _) = model(seed, kind)?;
            let src = sources(10, seed)?;
            let g = greedy(&m, &src, &opts(1))?;
            assert_eq!(g, beam_search(&m, &src, &opts(1))?, "{kind:?} seed {seed}");
            for k in [2, 4] {
                for (h, gh) in beam_search(&m, &src, &opts(k))?.iter().zip(&g) {
                    assert!(
                        h.score >= gh.score - 1e-9,
                        "{kind:?} seed {seed} beam {k}: {h:?} < greedy {gh:?}"
                    );
                }
            }
        }
    }
    Ok(())
}

#[test]
fn training_reaches_every_parameter() -> Result<()> {
    for kind in KINDS {
        let (m, params) = model(9, kind)?;
        let src = sources(4, 4)?;
        let tgt: Vec<u32> = (0..4 * 5)
            .map(|i| 3 + (i * 5 % (VOCAB as u32 - 3)))
            .collect();
        let tgt_in = Tensor::from_vec(tgt.clone(), (4, 5), &Device::Cpu)?;
        let tgt_out = Tensor::from_vec(tgt, (4, 5), &Device::Cpu)?;
        let rng = transformer_model::Rng::new(1);
        let l = m.loss(&src, &tgt_in, &tgt_out, PAD, 0.1, Mode::Train(&rng))?;
        let grads = l.loss.backward()?;
        for (name, var) in params.iter() {
            let g = grads
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("{kind:?}: no gradient for {name}"));
            let n = g.abs()?.sum_all()?.to_scalar::<f64>()?;
            assert!(n > 0.0, "{kind:?}: zero gradient for {name}");
        }
    }
    Ok(())
}

/// Decoding keeps no graph through the recurrent state: the state `start` makes and every
/// step's are cut from candle's graph, so a step's logits reach only that step's own
/// parameters (the decoder's, the output layers'), never the encoder's, and memory does
/// not grow with the output's length.
#[test]
fn decoding_keeps_no_graph_through_the_state() -> Result<()> {
    let encoder_side = ["src_embedding.", "encoder.", "bridge.", "attention.keys."];
    for kind in KINDS {
        let (m, params) = model(5, kind)?;
        let src = sources(2, 4)?;
        let mut st = m.start(&src, PAD)?;
        for t in 0..3u32 {
            let ids = Tensor::new(&[3 + t, 4 + t], &Device::Cpu)?;
            let grads = m.step(&mut st, &ids, false)?.0.sum_all()?.backward()?;
            for (name, var) in params.iter() {
                let reached = grads.get(var.as_tensor()).is_some();
                if encoder_side.iter().any(|p| name.starts_with(p)) {
                    assert!(
                        !reached,
                        "{kind:?} step {t}: {name} reached from the logits"
                    );
                }
                if name.starts_with("generator.") {
                    assert!(reached, "{kind:?} step {t}: {name}");
                }
            }
        }
    }
    Ok(())
}
