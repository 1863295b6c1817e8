//! Properties every Transformer must have, checked on small random models.

use candle_core::{DType, Device, Result, Tensor};
use transformer_model::backend::{Backprop, Pass};
use transformer_model::seq2seq::Seq2SeqMasks;
use transformer_model::{
    LmConfig, Mode, ParamBuilder, Params, Rng, Seq2Seq, TransformerConfig, TransformerLm,
};

mod common;
use common::gradients::assert_every_parameter_has_gradient;
use common::{layer_spec, lm_config, max_diff_and_size};

fn tiny_lm_config() -> LmConfig {
    LmConfig {
        dropout: 0.1,
        ..lm_config(30, 16, 24, 2)
    }
}

fn tiny_lm(seed: u64) -> Result<(TransformerLm, Params)> {
    let pb = ParamBuilder::new(DType::F64, &Device::Cpu, seed);
    Ok((TransformerLm::new(&pb, &tiny_lm_config())?, pb.params()))
}

fn tiny_seq2seq(seed: u64) -> Result<(Seq2Seq, Params)> {
    let pb = ParamBuilder::new(DType::F64, &Device::Cpu, seed);
    let cfg = TransformerConfig {
        dropout: 0.1,
        ..TransformerConfig::tiny()
    };
    Ok((Seq2Seq::new(&pb, &cfg, 20, 25)?, pb.params()))
}

/// The model's logits for a batch in evaluation mode, pad id 0.
fn eval(model: &Seq2Seq, src: &Tensor, tgt: &Tensor) -> Result<Tensor> {
    model.forward(src, tgt, &Seq2SeqMasks::new(src, tgt, 0)?, Mode::Eval)
}

fn ids(v: &[&[u32]]) -> Result<Tensor> {
    let rows: Vec<Vec<u32>> = v.iter().map(|r| r.to_vec()).collect();
    Tensor::new(rows, &Device::Cpu)
}

/// max |a - b| per position along dim 1 of (B, T, V) tensors.
fn per_position_diff(a: &Tensor, b: &Tensor) -> Result<Vec<f64>> {
    (a - b)?.abs()?.max(2)?.max(0)?.to_vec1::<f64>()
}

#[test]
fn lm_has_no_causal_leakage() -> Result<()> {
    let (lm, _) = tiny_lm(1)?;
    let a = ids(&[&[3, 7, 1, 9, 4, 4, 2, 8]])?;
    let b = ids(&[&[3, 7, 1, 9, 4, 11, 2, 8]])?; // position 5 changed
    let d = per_position_diff(&lm.forward(&a, Mode::Eval)?, &lm.forward(&b, Mode::Eval)?)?;
    for (t, diff) in d.iter().enumerate() {
        if t < 5 {
            assert_eq!(
                *diff, 0.0,
                "logits at position {t} changed when token 5 changed: leak"
            );
        } else {
            assert!(*diff > 1e-6, "logits at position {t} did not see token 5");
        }
    }
    Ok(())
}

#[test]
fn lm_attention_weights_are_causal_distributions() -> Result<()> {
    let (lm, _) = tiny_lm(2)?;
    let maps = lm.attention(&ids(&[&[3, 7, 1, 9, 4]])?)?;
    assert_eq!(maps.len(), 2);
    for m in maps {
        assert_eq!(m.dims(), &[1, 2, 5, 5]);
        let m = m
            .squeeze(0)?
            .to_dtype(candle_core::DType::F64)?
            .to_vec3::<f64>()?;
        for head in m {
            for (i, row) in head.iter().enumerate() {
                assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{row:?}");
                assert!(
                    row[i + 1..].iter().all(|&w| w == 0.0),
                    "row {i} sees the future"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn decoder_has_no_causal_leakage() -> Result<()> {
    let (model, _) = tiny_seq2seq(2)?;
    let src = ids(&[&[1, 5, 6, 7, 8]])?;
    let t1 = ids(&[&[1, 4, 4, 9, 3, 2]])?;
    let t2 = ids(&[&[1, 4, 4, 9, 17, 2]])?; // position 4 changed
    let d = per_position_diff(&eval(&model, &src, &t1)?, &eval(&model, &src, &t2)?)?;
    assert!(
        d[..4].iter().all(|&x| x == 0.0),
        "decoder leaks the future: {d:?}"
    );
    assert!(d[4..].iter().all(|&x| x > 1e-6), "{d:?}");
    Ok(())
}

#[test]
fn padding_does_not_change_results() -> Result<()> {
    let (model, _) = tiny_seq2seq(3)?;
    // The same sentence pair alone and padded (pad id 0) inside a batch with a longer one.
    let src_alone = ids(&[&[1, 5, 6, 7]])?;
    let tgt_alone = ids(&[&[1, 8, 9]])?;
    let src_batch = ids(&[&[1, 5, 6, 7, 0, 0], &[1, 2, 3, 4, 5, 6]])?;
    let tgt_batch = ids(&[&[1, 8, 9, 0, 0], &[1, 3, 3, 3, 3]])?;
    let alone = eval(&model, &src_alone, &tgt_alone)?;
    let batch = eval(&model, &src_batch, &tgt_batch)?;
    let padded = batch.get(0)?.narrow(0, 0, 3)?.unsqueeze(0)?;
    let diff = (alone - padded)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f64>()?;
    assert!(diff < 1e-12, "padding changed the logits by {diff}");
    Ok(())
}

#[test]
fn every_parameter_receives_a_gradient() -> Result<()> {
    let rng = Rng::new(9);
    let (lm, params) = tiny_lm(4)?;
    let x = ids(&[&[3, 7, 1, 9, 4, 4, 2, 8], &[1, 2, 3, 4, 5, 6, 7, 29]])?;
    let logits = lm.forward(&x, Mode::Train(&rng))?;
    // A loss that touches every output logit, so the output bias of unseen words is covered.
    assert_every_parameter_has_gradient("lm", &logits.sqr()?.mean_all()?, &params)?;
    assert_eq!(params.len(), 2 * 16 + 3);

    let (model, params) = tiny_seq2seq(5)?;
    let src = ids(&[&[1, 5, 6, 7, 0], &[1, 2, 3, 4, 5]])?;
    let tgt = ids(&[&[1, 8, 9, 0], &[1, 3, 3, 3]])?;
    let logits = model.forward(
        &src,
        &tgt,
        &Seq2SeqMasks::new(&src, &tgt, 0)?,
        Mode::Train(&rng),
    )?;
    assert_every_parameter_has_gradient("seq2seq", &logits.sqr()?.mean_all()?, &params)
}

#[test]
fn training_mode_is_stochastic_but_reproducible() -> Result<()> {
    let (lm, _) = tiny_lm(6)?;
    let x = ids(&[&[3, 7, 1, 9]])?;
    let eval1 = lm.forward(&x, Mode::Eval)?;
    let eval2 = lm.forward(&x, Mode::Eval)?;
    let same = |a: &Tensor, b: &Tensor| -> Result<bool> {
        Ok((a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>()? == 0.0)
    };
    assert!(same(&eval1, &eval2)?);
    let train1 = lm.forward(&x, Mode::Train(&Rng::new(1)))?;
    let train2 = lm.forward(&x, Mode::Train(&Rng::new(1)))?;
    let train3 = lm.forward(&x, Mode::Train(&Rng::new(2)))?;
    assert!(
        !same(&eval1, &train1)?,
        "dropout had no effect in training mode"
    );
    assert!(
        same(&train1, &train2)?,
        "the same RNG state must give the same masks"
    );
    assert!(!same(&train1, &train3)?);
    Ok(())
}

#[test]
fn same_seed_same_weights() -> Result<()> {
    let (_, a) = tiny_lm(7)?;
    let (_, b) = tiny_lm(7)?;
    let (_, c) = tiny_lm(8)?;
    let w = |p: &Params| {
        p.get("linear.weight")
            .unwrap()
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap()
    };
    assert_eq!(w(&a), w(&b));
    assert_ne!(w(&a), w(&c));
    Ok(())
}

#[test]
fn positions_past_max_len_are_a_clear_error() -> Result<()> {
    let pb = ParamBuilder::new(DType::F32, &Device::Cpu, 0);
    let cfg = LmConfig {
        max_len: 4,
        ..lm_config(10, 8, 8, 1)
    };
    let lm = TransformerLm::new(&pb, &cfg)?;
    let err = lm
        .forward(&ids(&[&[1, 2, 3, 4, 5]])?, Mode::Eval)
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_len 4"), "{err}");
    let err = lm
        .forward(&ids(&[&[1, 12]])?, Mode::Eval)
        .unwrap_err()
        .to_string();
    assert!(err.contains("token id 12 is out of range"), "{err}");
    Ok(())
}

#[test]
fn cached_decoding_equals_the_full_forward() -> Result<()> {
    let (lm, _) = tiny_lm(10)?;
    let seq = ids(&[
        &[3, 7, 1, 9, 4, 4, 2, 8, 5, 6],
        &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
    ])?;
    let full = lm.forward(&seq, Mode::Eval)?;
    let mut cache = lm.new_cache();
    // A 4-token prompt, then one token at a time, then a 2-token chunk.
    let mut parts = vec![lm.forward_step(&seq.narrow(1, 0, 4)?, &mut cache, Mode::Eval)?];
    for t in 4..8 {
        parts.push(lm.forward_step(&seq.narrow(1, t, 1)?, &mut cache, Mode::Eval)?);
    }
    parts.push(lm.forward_step(&seq.narrow(1, 8, 2)?, &mut cache, Mode::Eval)?);
    assert_eq!(cache[0].len(), 10);
    let stepped = Tensor::cat(&parts, 1)?;
    let diff = (&full - stepped)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f64>()?;
    assert!(
        diff < 1e-12,
        "cached logits differ from the full forward by {diff}"
    );

    // next_logits: only the last position's logits, the cache extended the same way.
    let mut cache = lm.new_cache();
    let first = lm.next_logits(&seq.narrow(1, 0, 4)?, &mut cache, Mode::Eval)?;
    let second = lm.next_logits(&seq.narrow(1, 4, 1)?, &mut cache, Mode::Eval)?;
    assert_eq!(first.dims(), &[2, 30]);
    assert_eq!(cache[0].len(), 5);
    for (got, t) in [(first, 3), (second, 4)] {
        let want = full.narrow(1, t, 1)?.squeeze(1)?;
        let diff = (got - want)?.abs()?.max_all()?.to_scalar::<f64>()?;
        assert!(diff < 1e-12, "next_logits at {t} differs by {diff}");
    }
    Ok(())
}

/// Weight tying: the output layer is the embedding's matrix (one parameter fewer, V x C fewer
/// numbers), its logits are `h E^T + b`, and the shared matrix's gradient is the sum of both
/// uses: rows of words absent from the input still get one, through the output layer.
#[test]
fn tied_lm_shares_the_embedding_with_the_output_layer() -> Result<()> {
    let (_, untied) = tiny_lm(4)?;
    let pb = ParamBuilder::new(DType::F64, &Device::Cpu, 4);
    let cfg = LmConfig {
        tie_weights: true,
        ..tiny_lm_config()
    };
    let lm = TransformerLm::new(&pb, &cfg)?;
    let params = pb.params();
    assert_eq!(params.len(), untied.len() - 1);
    assert!(params.get("linear.weight").is_none());
    assert_eq!(params.num_elements(), untied.num_elements() - 30 * 16);
    let emb = params.get("embedding.weight").unwrap().as_tensor();
    assert_eq!(
        lm.output_layer().weight().id(),
        emb.id(),
        "one tensor, not a copy"
    );

    let x = ids(&[&[3, 7, 1, 9]])?;
    let h = lm.hidden(&x, Mode::Eval)?;
    let bias = params.get("linear.bias").unwrap().as_tensor();
    let want = h.squeeze(0)?.matmul(&emb.t()?)?.broadcast_add(bias)?;
    let got = lm.forward(&x, Mode::Eval)?.squeeze(0)?;
    assert!((got - want)?.abs()?.max_all()?.to_scalar::<f64>()? < 1e-12);

    let logits = lm.forward(&x, Mode::Eval)?;
    let grads = logits.sqr()?.mean_all()?.backward()?;
    let g = grads.get(emb).expect("the shared matrix gets a gradient");
    let absent_row = g.get(20)?.abs()?.sum_all()?.to_scalar::<f64>()?;
    assert!(
        absent_row > 0.0,
        "word 20 is not in the input: only the output layer reaches it"
    );
    Ok(())
}

/// The evaluation-only loss is the evaluation-mode loss, and tracks no gradient.
#[test]
fn loss_without_gradients_equals_the_eval_loss() -> Result<()> {
    let (lm, _) = tiny_lm(12)?;
    let x = ids(&[&[3, 7, 1, 9, 4], &[1, 2, 3, 4, 5]])?;
    let t = ids(&[&[7, 1, 9, 4, 4], &[2, 3, 4, 5, 29]])?;
    let eval_loss = |b| lm.loss(&x, &t, Mode::Eval, b);
    let (with_graph, plain) = (eval_loss(Backprop::Graph)?, eval_loss(Backprop::Off)?);
    assert!(with_graph.track_op() && !plain.track_op());
    let diff = (with_graph.to_scalar::<f64>()? - plain.to_scalar::<f64>()?).abs();
    assert!(diff < 1e-12, "differs by {diff}");
    Ok(())
}

/// An encoder stack asked for no weights runs attention as one fused op; with the same RNG
/// state it gives what the composed path (asked for weights) gives, dropout masks included.
#[test]
fn encoder_without_weights_equals_the_composed_path() -> Result<()> {
    use transformer_model::encoder::Encoder;
    use transformer_model::{Activation, Mask};
    for norm_first in [false, true] {
        let pb = ParamBuilder::new(DType::F64, &Device::Cpu, 21);
        let spec = layer_spec(16, 4, 24, 0.3, Activation::Gelu, norm_first);
        let enc = Encoder::new(&pb, &spec, 2, true)?;
        let x = Tensor::randn(0f64, 1.0, (3, 7, 16), &Device::Cpu)?;
        let mask = Mask::causal(7, &Device::Cpu)?;
        for mode_seed in [None, Some(5u64)] {
            let (r1, r2) = (
                Rng::new(mode_seed.unwrap_or(0)),
                Rng::new(mode_seed.unwrap_or(0)),
            );
            let (m1, m2) = match mode_seed {
                Some(_) => (Mode::Train(&r1), Mode::Train(&r2)),
                None => (Mode::Eval, Mode::Eval),
            };
            let fused = enc.forward(&x, Some(&mask), m1)?;
            let (composed, weights) = enc.forward_as(&x, Some(&mask), Pass::new(m2).weights())?;
            assert_eq!(weights.len(), 2);
            let diff = (fused - composed)?.abs()?.max_all()?.to_scalar::<f64>()?;
            assert!(
                diff < 1e-12,
                "norm_first {norm_first} {mode_seed:?}: differs by {diff}"
            );
            assert_eq!(
                r1.state(),
                r2.state(),
                "both paths draw the same RNG streams"
            );
        }
    }
    Ok(())
}

/// `loss` with `Backprop::Direct` delivers the gradients of the embedding, the output layer and every
/// encoder layer's parameters to `DirectGrads` (and none of them to the `GradStore`), equal
/// to the plain `GradStore` gradients with and without tied weights. Equal to rounding, not
/// bit for bit: the fused encoder layers (`kernels::encoder_layer`) sum their products and
/// weight gradients in another order than the composed ops (they are checked in f64 to 1e-12
/// in their own test). Tokens repeat in the input, so rows are summed; the tied matrix sums
/// both uses; the bf16 products (AMX) write through their own path. Two steps in a row check
/// that the kept buffers are overwritten, not accumulated.
#[test]
fn direct_gradients_equal_the_grad_store() -> Result<()> {
    use transformer_model::kernels::Precision;
    use transformer_model::DirectGrads;
    for (tie_weights, precision) in [
        (false, Precision::F32),
        (true, Precision::F32),
        (false, Precision::Bf16),
    ] {
        let pb = ParamBuilder::new(DType::F32, &Device::Cpu, 5).with_precision(precision);
        let cfg = LmConfig {
            tie_weights,
            ..tiny_lm_config()
        };
        let lm = TransformerLm::new(&pb, &cfg)?;
        let params = pb.params();
        let direct = DirectGrads::new();
        let direct_names = ["embedding.weight", "linear.weight", "linear.bias"];
        let is_direct = |name: &str| {
            direct_names.contains(&name) || name.starts_with("transformer_encoder.layers.")
        };
        for (step, x) in [
            ids(&[&[3, 7, 3, 9, 7], &[1, 3, 3, 0, 29]])?,
            ids(&[&[4, 4, 4, 8, 2], &[2, 11, 5, 4, 6]])?,
        ]
        .iter()
        .enumerate()
        {
            let y = x.flatten_all()?;
            let plain_loss = lm.loss(x, &y, Mode::Train(&Rng::new(9)), Backprop::Graph)?;
            let plain = plain_loss.backward()?;
            direct.clear();
            let direct_loss =
                lm.loss(x, &y, Mode::Train(&Rng::new(9)), Backprop::Direct(&direct))?;
            let store = direct_loss.backward()?;
            let (a, b) = (
                plain_loss.to_scalar::<f32>()?,
                direct_loss.to_scalar::<f32>()?,
            );
            assert!((a - b).abs() <= 1e-6 * a.abs(), "losses {a} and {b}");
            for (name, var) in params.iter() {
                let want = plain.get(var.as_tensor()).expect("every parameter has one");
                let got = if is_direct(name) {
                    assert!(
                        store.get(var.as_tensor()).is_none(),
                        "{name} in the GradStore"
                    );
                    direct.get(var.as_tensor())?.expect("a direct gradient")
                } else {
                    assert!(direct.get(var.as_tensor())?.is_none());
                    store
                        .get(var.as_tensor())
                        .expect("in the GradStore")
                        .clone()
                };
                // The floor covers gradients that are zero in exact arithmetic (the key
                // projection's bias: softmax ignores a shift shared by all keys).
                let (diff, size) = max_diff_and_size(want, &got, 1e-4)?;
                assert!(
                    diff <= 1e-5 * size,
                    "tied {tie_weights}, {precision}, step {step}: {name} differs by {diff} \
                     (largest {size})"
                );
            }
            // The output layer's sum of squares, taken by pass 2 for the clipping norm, is
            // that of the values it wrote; with tied weights the embedding's rows join the
            // same gradient and it is not kept.
            let out_name = if tie_weights {
                "embedding.weight"
            } else {
                "linear.weight"
            };
            let linear = params
                .iter()
                .find(|(name, _)| *name == out_name)
                .expect("the output weight")
                .1
                .as_tensor()
                .id();
            let mut seen = false;
            direct.for_each(|p, g| {
                if let transformer_model::grads::GradView::Dense { values, sum_sq } = g {
                    if p.id() == linear {
                        seen = true;
                        assert_eq!(sum_sq.is_some(), !tie_weights, "{precision}");
                    }
                    if let Some(sq) = sum_sq {
                        let want: f64 = values.iter().map(|&v| v as f64 * v as f64).sum();
                        assert!((sq - want).abs() <= 1e-12 * want, "{sq} vs {want}");
                    }
                }
                Ok(())
            })?;
            assert!(seen, "the output weight has a dense direct gradient");
        }
    }
    Ok(())
}

/// A mask's declared lengths ([`Mask::with_lengths`]) let the fused encoder layers skip
/// padding rows: the real rows are those of the plain run (f64, to rounding), the padding
/// rows are zero. Lengths that the mask does not hide are refused with an error that names
/// the sequence.
#[test]
fn declared_lengths_skip_padding_rows_and_are_checked() -> Result<()> {
    use transformer_model::mask::Mask;
    use transformer_model::{Activation, Encoder};
    let dev = Device::Cpu;
    let pb = ParamBuilder::new(DType::F64, &dev, 3);
    let spec = layer_spec(8, 2, 12, 0.0, Activation::Relu, false);
    let enc = Encoder::new(&pb, &spec, 2, false)?;
    let src = ids(&[&[5, 6, 7, 8, 9], &[5, 6, 0, 0, 0], &[7, 0, 0, 0, 0]])?;
    let x = Tensor::randn(0f64, 1.0, (3, 5, 8), &dev)?;
    let mask = Mask::key_padding_from_ids(&src, 0)?;
    let off = Pass::new(Mode::Eval).backprop(Backprop::Off);
    let (plain, _) = enc.forward_as(&x, Some(&mask), off)?;
    let lens = vec![5, 2, 1];
    let (skipped, _) = enc.forward_as(&x, Some(&mask.clone().with_lengths(lens.clone())), off)?;
    for (b, &len) in lens.iter().enumerate() {
        let (want, got) = (plain.get(b)?, skipped.get(b)?);
        let diff = (want.narrow(0, 0, len)? - got.narrow(0, 0, len)?)?
            .abs()?
            .max_all()?
            .to_scalar::<f64>()?;
        assert!(diff < 1e-12, "sequence {b}: real rows differ by {diff}");
        let rest = got
            .narrow(0, len, 5 - len)?
            .abs()?
            .sum_all()?
            .to_scalar::<f64>()?;
        assert_eq!(rest, 0.0, "sequence {b}: padding rows not zero");
    }
    // Sequence 1 has 2 tokens, but a length of 1 leaves its second key visible to row 0.
    let bad = mask.clone().with_lengths(vec![5, 1, 1]);
    let err = enc.forward_as(&x, Some(&bad), off).unwrap_err().to_string();
    assert!(err.contains("sequence 1") && err.contains("key 1"), "{err}");
    // A causal mask hides every key after a length from the rows before it...
    let causal = Mask::causal(5, &dev)?.with_lengths(vec![5, 3, 4]);
    enc.forward_as(&x, Some(&causal), off)?;
    // ... a mask that keeps every key does not.
    let all = Mask::key_valid(&Tensor::ones((3, 5), DType::U8, &dev)?)?.with_lengths(vec![5, 5, 4]);
    let err = enc.forward_as(&x, Some(&all), off).unwrap_err().to_string();
    assert!(err.contains("sequence 2") && err.contains("key 4"), "{err}");
    Ok(())
}
