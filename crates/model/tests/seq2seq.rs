//! The encoder-decoder's training loss: label-smoothed cross-entropy computed without the
//! logits against its definition over the logits (PyTorch's
//! `CrossEntropyLoss(label_smoothing=eps, ignore_index=pad)`), value and every gradient, in
//! float64; and shared embeddings.

use candle_core::{DType, Device, Result, Tensor, D};
use transformer_model::seq2seq::Seq2SeqMasks;
use transformer_model::{Backprop, Mode, ParamBuilder, Seq2Seq, Seq2SeqConfig, TransformerConfig};

mod common;
use common::max_diff_and_size;

const PAD: u32 = 0;

fn config(share: bool) -> Seq2SeqConfig {
    Seq2SeqConfig {
        transformer: TransformerConfig::tiny(),
        src_vocab: 11,
        tgt_vocab: 11,
        share_embeddings: share,
        inputs: Default::default(),
    }
}

/// The definition: `(1 - eps) * nll + eps * mean_j(-log p_j)`, averaged over non-padding
/// targets.
fn smoothed_reference(logits: &Tensor, targets: &Tensor, eps: f64) -> Result<Tensor> {
    let (n, v) = logits.dims2()?;
    let max = logits.max_keepdim(D::Minus1)?.detach();
    let shifted = logits.broadcast_sub(&max)?;
    let logp = shifted.broadcast_sub(&shifted.exp()?.sum_keepdim(D::Minus1)?.log()?)?;
    let keep = targets.ne(PAD)?;
    let safe = keep.where_cond(targets, &targets.zeros_like()?)?;
    let nll = logp.gather(&safe.unsqueeze(1)?, 1)?.squeeze(1)?.neg()?;
    let uniform = (logp.sum(D::Minus1)?.neg()? / v as f64)?;
    let per_row = ((nll * (1.0 - eps))? + (uniform * eps)?)?;
    let w = keep.to_dtype(DType::F64)?;
    let count = w.sum_all()?.to_scalar::<f64>()?;
    let _ = n;
    (per_row * w)?.sum_all()? / count
}

#[test]
fn label_smoothed_loss_and_gradients_match_the_definition() -> Result<()> {
    let dev = Device::Cpu;
    for share in [false, true] {
        let pb = ParamBuilder::new(DType::F64, &dev, 5);
        let model = Seq2Seq::with_config(&pb, &config(share))?;
        let params = pb.params();
        let src = Tensor::new(&[[3u32, 4, 5, 2, 0], [6, 7, 2, 0, 0]], &dev)?;
        let tgt_in = Tensor::new(&[[1u32, 8, 9, 10], [1, 4, 0, 0]], &dev)?;
        let tgt_out = Tensor::new(&[[8u32, 9, 10, 2], [4, 2, 0, 0]], &dev)?;
        let masks = Seq2SeqMasks::new(&src, &tgt_in, PAD)?;
        for eps in [0.0, 0.1, 0.3] {
            let ours = model.loss(
                &src,
                &tgt_in,
                &tgt_out,
                &masks,
                (PAD, eps),
                Mode::Eval,
                Backprop::Graph,
            )?;
            let logits = model.forward(&src, &tgt_in, &masks, Mode::Eval)?;
            let reference =
                smoothed_reference(&logits.reshape((8, 11))?, &tgt_out.flatten_all()?, eps)?;
            let (a, b) = (ours.loss.to_scalar::<f64>()?, reference.to_scalar::<f64>()?);
            assert!((a - b).abs() < 1e-12 * b.abs(), "eps {eps}: {a} vs {b}");
            let plain =
                smoothed_reference(&logits.reshape((8, 11))?, &tgt_out.flatten_all()?, 0.0)?
                    .to_scalar::<f64>()?;
            assert!((ours.nll.to_scalar::<f64>()? - plain).abs() < 1e-12 * plain);
            let (ga, gb) = (ours.loss.backward()?, reference.backward()?);
            let mut checked = 0;
            for (name, var) in params.iter() {
                let (x, y) = (ga.get(var.as_tensor()), gb.get(var.as_tensor()));
                let (x, y) = (x.expect(name), y.expect(name));
                let scale = y.abs()?.max_all()?.to_scalar::<f64>()?.max(1e-12);
                let diff = (x - y)?.abs()?.max_all()?.to_scalar::<f64>()?;
                assert!(diff < 1e-10 * scale.max(1.0), "eps {eps} {name}: {diff}");
                checked += 1;
            }
            assert_eq!(checked, params.len());
        }
    }
    Ok(())
}

#[test]
fn shared_embeddings_are_one_matrix() -> Result<()> {
    let dev = Device::Cpu;
    let separate = ParamBuilder::new(DType::F32, &dev, 1);
    Seq2Seq::with_config(&separate, &config(false))?;
    let shared = ParamBuilder::new(DType::F32, &dev, 1);
    Seq2Seq::with_config(&shared, &config(true))?;
    let (sep, sh) = (separate.params(), shared.params());
    assert!(sh.get("tgt_embedding.weight").is_none() && sh.get("generator.weight").is_none());
    assert!(sh.get("generator.bias").is_some());
    assert_eq!(sep.num_elements() - sh.num_elements(), 2 * 11 * 32);
    let mismatch = Seq2SeqConfig {
        tgt_vocab: 12,
        ..config(true)
    };
    let err = mismatch.validate().unwrap_err().to_string();
    assert!(err.contains("joint vocabulary"), "{err}");
    Ok(())
}

/// The shared matrix starts with entries of standard deviation d_model^-1/2 (so embeddings
/// scaled by sqrt(d_model) have unit variance); separate embeddings keep Xavier over (V, C).
#[test]
fn shared_embedding_starts_at_unit_scale() -> Result<()> {
    let std_of = |share: bool, name: &str| -> Result<f64> {
        let cfg = Seq2SeqConfig {
            src_vocab: 2000,
            tgt_vocab: 2000,
            ..config(share)
        };
        let pb = ParamBuilder::new(DType::F64, &Device::Cpu, 5);
        Seq2Seq::with_config(&pb, &cfg)?;
        let w = pb.params().get(name).unwrap().as_tensor().clone();
        let mean = w.mean_all()?.to_scalar::<f64>()?;
        let var = w.sqr()?.mean_all()?.to_scalar::<f64>()? - mean * mean;
        Ok(var.sqrt())
    };
    let d = TransformerConfig::tiny().d_model as f64;
    let shared = std_of(true, "src_embedding.weight")?;
    assert!(
        (shared * d.sqrt() - 1.0).abs() < 0.02,
        "shared embedding std {shared}, expected {}",
        d.powf(-0.5)
    );
    let separate = std_of(false, "src_embedding.weight")?;
    let xavier = (2.0 / (2000.0 + d)).sqrt();
    assert!(
        (separate / xavier - 1.0).abs() < 0.02,
        "separate embedding std {separate}, expected Xavier's {xavier}"
    );
    Ok(())
}

/// `loss` with `Backprop::Direct` (the training path: embeddings' rows, fused encoder layers and the output
/// layer's gradients into `DirectGrads`) gives the loss and every gradient of `loss` (the
/// plain `GradStore`), with dropout drawn from the same RNG, shared and separate embeddings,
/// padded sources and targets; equal to rounding (the fused layers sum in another order).
/// Each parameter's gradient is in exactly one of the two stores. Two steps in a row check
/// that the kept buffers are overwritten, not accumulated.
#[test]
fn direct_gradients_equal_the_grad_store() -> Result<()> {
    use transformer_model::{DirectGrads, Rng};
    let dev = Device::Cpu;
    for share in [false, true] {
        let pb = ParamBuilder::new(DType::F32, &dev, 7);
        let mut cfg = config(share);
        cfg.transformer.dropout = 0.2;
        let model = Seq2Seq::with_config(&pb, &cfg)?;
        let params = pb.params();
        let direct = DirectGrads::new();
        for step in 0..2u32 {
            let src = Tensor::new(&[[3u32, 4, 5 + step, 2, 0], [6, 7, 2, 0, 0]], &dev)?;
            let tgt_in = Tensor::new(&[[1u32, 8, 9, 10], [1, 4 + step, 0, 0]], &dev)?;
            let tgt_out = Tensor::new(&[[8u32, 9, 10, 2], [4 + step, 2, 0, 0]], &dev)?;
            let masks = Seq2SeqMasks::new(&src, &tgt_in, PAD)?;
            let rng = || Rng::new(11 + step as u64);
            // The batch's loss with the same dropout masks, its gradients kept as `backprop` says.
            let loss = |backprop| {
                let mode = Mode::Train(&rng());
                model.loss(&src, &tgt_in, &tgt_out, &masks, (PAD, 0.1), mode, backprop)
            };
            let plain = loss(Backprop::Graph)?;
            direct.clear();
            let fast = loss(Backprop::Direct(&direct))?;
            let (a, b) = (
                plain.loss.to_scalar::<f32>()?,
                fast.loss.to_scalar::<f32>()?,
            );
            assert!(
                (a - b).abs() <= 1e-5 * a.abs(),
                "share {share}: losses {a} and {b}"
            );
            let (want, store) = (plain.loss.backward()?, fast.loss.backward()?);
            let mut in_direct = 0;
            for (name, var) in params.iter() {
                let x = var.as_tensor();
                let w = want.get(x).unwrap_or_else(|| panic!("{name}: no gradient"));
                let got = match (store.get(x), direct.get(x)?) {
                    (Some(g), None) => g.clone(),
                    (None, Some(g)) => {
                        in_direct += 1;
                        g
                    }
                    (s, d) => panic!(
                        "{name}: in the store {}, direct {}",
                        s.is_some(),
                        d.is_some()
                    ),
                };
                // The floor covers gradients that are zero in exact arithmetic (the key
                // projection's bias: softmax ignores a shift shared by all keys).
                let (diff, size) = max_diff_and_size(w, &got, 1e-3)?;
                assert!(
                    diff <= 2e-5 * size,
                    "share {share}, step {step}: {name} differs by {diff} (largest {size})"
                );
            }
            // The embeddings, the output bias and the 3 x 16 encoder-layer parameters at least.
            assert!(
                in_direct >= 2 + 16,
                "only {in_direct} gradients went direct"
            );
        }
    }
    Ok(())
}
