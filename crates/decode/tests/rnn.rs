//! The recurrent encoder-decoders through the one decoding interface: stepping equals
//! teacher forcing, padding is never attended to, the searches agree with each other, and
//! training reaches every parameter. Small random models in f64.

use candle_core::{DType, Device, Result, Tensor};
use transformer_decode::{beam_search, greedy, DecodeOptions, StepModel};
use transformer_model::{Mode, ParamBuilder, Params, RnnAttention, RnnSeq2Seq, RnnSeq2SeqConfig};

use transformer_model::mask::lengths;

mod common;
#[path = "../../model/tests/common/gradients.rs"]
mod gradients;

use common::{opts, sources, PAD, VOCAB};
use gradients::assert_every_parameter_has_gradient;
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

/// Runs `check` on a model of each attention kind of `kinds` (its parameters drawn from
/// `seed`) with its parameters and the sources `sources(n, src_seed)`.
fn each_kind(
    kinds: &[RnnAttention],
    seed: u64,
    (n, src_seed): (usize, u64),
    mut check: impl FnMut(RnnAttention, &RnnSeq2Seq, &Params, &Tensor) -> Result<()>,
) -> Result<()> {
    for &kind in kinds {
        let (m, params) = model(seed, kind)?;
        let src = sources(n, src_seed)?;
        check(kind, &m, &params, &src)?;
    }
    Ok(())
}

/// A batch of target ids of `shape` (rows, columns): the `i`-th is
/// `first + i * step % (VOCAB - first)`, ids from `first` up.
fn targets(shape: (usize, usize), first: u32, step: u32) -> Result<Tensor> {
    let n = (shape.0 * shape.1) as u32;
    let ids: Vec<u32> = (0..n)
        .map(|i| first + (i * step % (VOCAB as u32 - first)))
        .collect();
    Tensor::from_vec(ids, shape, &Device::Cpu)
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    (a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>()
}

#[test]
fn stepping_gives_the_logits_of_teacher_forcing() -> Result<()> {
    each_kind(&KINDS, 3, (5, 1), |kind, m, _, src| {
        let tgt = targets((5, 4), 1, 7)?;
        let forced = m.forward(src, &tgt, PAD, Mode::Eval)?;
        let mut st = StepModel::start(m, src, PAD)?;
        for t in 0..4 {
            let col: Vec<u32> = tgt.narrow(1, t, 1)?.squeeze(1)?.to_vec1()?;
            let out = StepModel::step(m, &mut st, &col, false)?;
            let want = forced.narrow(1, t, 1)?.squeeze(1)?;
            let d = max_abs_diff(&out.logits, &want)?;
            assert!(d < 1e-12, "{kind:?} step {t}: {d}");
        }
        Ok(())
    })
}

#[test]
fn attention_never_looks_at_padding() -> Result<()> {
    each_kind(
        &[RnnAttention::Dot, RnnAttention::Bahdanau],
        4,
        (6, 2),
        |kind, m, _, src| {
            let o = DecodeOptions {
                want_attention: true,
                want_scores: true,
                ..opts(1)
            };
            let lens = lengths(src, PAD)?;
            for (r, h) in greedy(m, src, &o)?.iter().enumerate() {
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
            Ok(())
        },
    )
}

#[test]
fn a_sentence_decodes_the_same_alone_and_in_a_padded_batch() -> Result<()> {
    each_kind(&KINDS, 8, (7, 3), |kind, m, _, src| {
        let all = beam_search(m, src, &opts(3))?;
        for r in 0..7 {
            // Alone, without any padding column.
            let row = src.narrow(0, r, 1)?;
            let len = lengths(&row, PAD)?[0];
            let alone = beam_search(m, &row.narrow(1, 0, len)?, &opts(3))?;
            assert_eq!(alone[0].tokens, all[r].tokens, "{kind:?} row {r}");
            assert!((alone[0].score - all[r].score).abs() < 1e-9);
        }
        Ok(())
    })
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
    each_kind(&KINDS, 9, (4, 4), |kind, m, params, src| {
        let (tgt_in, tgt_out) = (targets((4, 5), 3, 5)?, targets((4, 5), 3, 5)?);
        let rng = transformer_model::Rng::new(1);
        let l = m.loss(src, &tgt_in, &tgt_out, PAD, 0.1, Mode::Train(&rng))?;
        assert_every_parameter_has_gradient(&format!("{kind:?}"), &l.loss, params)?;
        Ok(())
    })
}

/// Decoding keeps no graph through the recurrent state: the state `start` makes and every
/// step's are cut from candle's graph, so a step's logits reach only that step's own
/// parameters (the decoder's, the output layers'), never the encoder's, and memory does
/// not grow with the output's length.
#[test]
fn decoding_keeps_no_graph_through_the_state() -> Result<()> {
    let encoder_side = ["src_embedding.", "encoder.", "bridge.", "attention.keys."];
    each_kind(&KINDS, 5, (2, 4), |kind, m, params, src| {
        let mut st = m.start(src, PAD)?;
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
        Ok(())
    })
}
