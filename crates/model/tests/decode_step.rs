//! The fused decoding step (`kernels::DecoderStack`, used by `Seq2Seq::start` on CPU f32)
//! against the composed decoder layers (`Seq2Seq::start_with(.., false)`): the same logits
//! and attention weights at every step, post-norm and pre-norm, with padded sources, rows
//! repeated and reordered as a beam search does, and rows dropped.

use candle_core::{DType, Device, Result, Tensor};
use transformer_model::{
    seq2seq::Seq2SeqMasks, Activation, Inputs, Mode, ParamBuilder, Positions, Seq2Seq,
    Seq2SeqConfig, TransformerConfig,
};

const PAD: u32 = 0;

fn max_rel_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    assert_eq!(a.dims(), b.dims());
    let (a, b) = (
        a.flatten_all()?.to_vec1::<f32>()?,
        b.flatten_all()?.to_vec1::<f32>()?,
    );
    let scale = b.iter().fold(1e-6f32, |m, x| m.max(x.abs()));
    Ok(a.iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale)
}

/// A translation model on the CPU in f32 with `transformer`'s layers, one vocabulary of
/// `vocab` shared by both sides, its parameters drawn from `seed`.
fn model(transformer: TransformerConfig, vocab: usize, seed: u64) -> Result<Seq2Seq> {
    model_with(transformer, Inputs::default(), vocab, seed)
}

/// [`model`] with the token inputs `inputs`.
fn model_with(
    transformer: TransformerConfig,
    inputs: Inputs,
    vocab: usize,
    seed: u64,
) -> Result<Seq2Seq> {
    model_by(
        ParamBuilder::new(DType::F32, &Device::Cpu, seed),
        transformer,
        inputs,
        vocab,
    )
}

/// [`model_with`] built by `pb` (which says how it runs: its decoding arithmetic, say).
fn model_by(
    pb: ParamBuilder,
    transformer: TransformerConfig,
    inputs: Inputs,
    vocab: usize,
) -> Result<Seq2Seq> {
    let cfg = Seq2SeqConfig {
        transformer,
        src_vocab: vocab,
        tgt_vocab: vocab,
        share_embeddings: true,
        inputs,
    };
    Seq2Seq::with_config(&pb, &cfg)
}

/// The layer and input variants of published models: activations, no final norms, other
/// position tables, unscaled embeddings, a zero start embedding.
fn variants() -> Vec<(TransformerConfig, Inputs)> {
    let t = |norm_first, activation, final_norm| TransformerConfig {
        norm_first,
        activation,
        final_norm,
        ..TransformerConfig::tiny()
    };
    let inputs = |scale_embeddings, positions, zero_start_embedding| Inputs {
        scale_embeddings,
        positions,
        zero_start_embedding,
    };
    vec![
        (t(false, Activation::Relu, true), Inputs::default()),
        (t(true, Activation::Relu, true), Inputs::default()),
        (
            t(false, Activation::Swish, false),
            inputs(true, Positions::Halves, true),
        ),
        (
            t(true, Activation::GeluTanh, true),
            inputs(false, Positions::Timing, false),
        ),
        (
            t(false, Activation::Gelu, false),
            inputs(true, Positions::Learned, false),
        ),
    ]
}

/// Step-by-step decoding (fused and composed) gives the logits of the teacher-forced forward
/// pass at every position, for each variant of [`variants`].
#[test]
fn every_variant_decodes_step_by_step_as_the_forward_pass() -> Result<()> {
    let dev = Device::Cpu;
    let src = Tensor::new(&[[5u32, 6, 7, 8, 2], [9, 10, 2, 0, 0]], &dev)?;
    let tgt = Tensor::new(&[[1u32, 4, 9, 12, 3], [1, 7, 7, 2, 5]], &dev)?;
    for (i, (transformer, inputs)) in variants().into_iter().enumerate() {
        let model = model_with(transformer, inputs, 17, 7 + i as u64)?;
        let masks = Seq2SeqMasks::new(&src, &tgt, PAD)?;
        let full = model.forward(&src, &tgt, &masks, Mode::Eval)?;
        for fused in [true, false] {
            let mut state = model.start_with(&src, PAD, fused)?;
            assert_eq!(state.is_fused(), fused, "variant {i}");
            for t in 0..tgt.dim(1)? {
                let ids = tgt.narrow(1, t, 1)?.squeeze(1)?;
                let (logits, _) = model.step(&mut state, &ids, false)?;
                let want = full.narrow(1, t, 1)?.squeeze(1)?;
                let d = max_rel_diff(&logits, &want)?;
                assert!(d < 1e-5, "variant {i}, fused {fused}, position {t}: {d}");
            }
        }
    }
    Ok(())
}

/// A zero start embedding makes the first output the same whatever the first token; the
/// other variants' depends on it.
#[test]
fn a_zero_start_embedding_ignores_the_start_token() -> Result<()> {
    let dev = Device::Cpu;
    let src = Tensor::new(&[[5u32, 6, 7, 2]], &dev)?;
    for zero in [false, true] {
        let inputs = Inputs {
            zero_start_embedding: zero,
            ..Inputs::default()
        };
        let model = model_with(TransformerConfig::tiny(), inputs, 17, 3)?;
        let first = |token: u32| -> Result<Vec<f32>> {
            let mut state = model.start(&src, PAD)?;
            let (logits, _) = model.step(&mut state, &Tensor::new(&[token], &dev)?, false)?;
            logits.flatten_all()?.to_vec1::<f32>()
        };
        assert_eq!(first(1)? == first(4)?, zero, "zero start {zero}");
    }
    Ok(())
}

/// One step's input tokens for `rows` rows: `token(row)` each.
fn step_tokens(rows: usize, token: impl Fn(u32) -> u32) -> Result<Tensor> {
    let tokens: Vec<u32> = (0..rows as u32).map(token).collect();
    Tensor::new(tokens.as_slice(), &Device::Cpu)
}

#[test]
fn fused_step_matches_the_composed_layers() -> Result<()> {
    let dev = Device::Cpu;
    for norm_first in [false, true] {
        let transformer = TransformerConfig {
            norm_first,
            ..TransformerConfig::tiny()
        };
        let model = model(transformer, 17, 3)?;
        let src = Tensor::new(
            &[[5u32, 6, 7, 8, 2], [9, 10, 2, 0, 0], [11, 12, 13, 2, 0]],
            &dev,
        )?;
        let mut fused = model.start(&src, PAD)?;
        let mut plain = model.start_with(&src, PAD, false)?;
        assert!(fused.is_fused() && !plain.is_fused());
        let mut rows = 3;
        for step in 0..7u32 {
            let ids = step_tokens(rows, |r| 1 + (r * 5 + step * 3) % 16)?;
            let want_weights = step % 3 == 1;
            let (a, wa) = model.step(&mut fused, &ids, want_weights)?;
            let (b, wb) = model.step(&mut plain, &ids, want_weights)?;
            let d = max_rel_diff(&a, &b)?;
            assert!(
                d < 1e-5,
                "norm_first {norm_first}, step {step}: logits differ by {d}"
            );
            if want_weights {
                let (wa, wb) = (wa.expect("weights"), wb.expect("weights"));
                for (x, y) in wa.iter().zip(&wb) {
                    assert!(max_rel_diff(&x.self_attn, &y.self_attn)? < 1e-5);
                    assert!(max_rel_diff(&x.cross_attn, &y.cross_attn)? < 1e-5);
                }
            } else {
                assert!(wa.is_none() && wb.is_none());
            }
            // Beams: expand, follow parents (repeats, new order), drop rows.
            let select: Vec<u32> = match step {
                0 => vec![0, 0, 1, 2, 2, 1],
                2 => vec![5, 3, 3, 0, 1],
                4 => vec![4, 2],
                _ => continue,
            };
            fused.select_rows(&select)?;
            plain.select_rows(&select)?;
            assert_eq!(fused.src_lens, plain.src_lens);
            rows = select.len();
        }
    }
    Ok(())
}

/// Decoding weights prepared once (`Seq2Seq::prepare_decoding`) give, batch after batch, the
/// logits that preparing them for each batch gives, bit for bit.
#[test]
fn prepared_weights_decode_as_the_model_does() -> Result<()> {
    let dev = Device::Cpu;
    let model = model(TransformerConfig::tiny(), 17, 5)?;
    let prepared = model.prepare_decoding()?;
    let batches = [
        Tensor::new(&[[5u32, 6, 7, 2], [9, 10, 2, 0]], &dev)?,
        Tensor::new(&[[11u32, 12, 2]], &dev)?,
    ];
    for src in &batches {
        let mut a = model.start_prepared(src, PAD, &prepared)?;
        let mut b = model.start(src, PAD)?;
        assert!(a.is_fused() && b.is_fused());
        // Enough rows for the output layer's many-rows path (`linear_wt`).
        let n = src.dim(0)? as u32;
        let rows: Vec<u32> = (0..12).map(|i| i % n).collect();
        a.select_rows(&rows)?;
        b.select_rows(&rows)?;
        for step in 0..4u32 {
            let ids: Vec<u32> = (0..12).map(|r| 1 + (r * 3 + step) % 16).collect();
            let ids = Tensor::new(ids.as_slice(), &dev)?;
            let (x, _) = model.step(&mut a, &ids, false)?;
            let (y, _) = model.step(&mut b, &ids, false)?;
            let (x, y) = (x.to_vec2::<f32>()?, y.to_vec2::<f32>()?);
            assert_eq!(x, y, "step {step}");
        }
    }
    Ok(())
}

/// Decoding in int8 (`DecodePrecision::Int8`, the decoder layers and the output layer) gives
/// the f32 step's logits up to the quantization error, step after step with rows reordered:
/// within 5% of the logits' largest magnitude, and not equal to them (int8 did run).
#[test]
fn int8_decoding_follows_the_f32_step() -> Result<()> {
    use transformer_model::DecodePrecision;
    let dev = Device::Cpu;
    let model = model(TransformerConfig::tiny(), 40, 5)?;
    let src = Tensor::new(&[[5u32, 6, 7, 8, 2], [9, 10, 2, 0, 0]], &dev)?;
    let f32_prep = model.prepare_decoding()?;
    assert_eq!(
        f32_prep.describe(),
        "decoder layers f32 (fused step), output layer f32"
    );
    for output_layer in [false, true] {
        // The same weights (the same seed), decoding in int8.
        let pb = ParamBuilder::new(DType::F32, &dev, 5)
            .with_decoding(DecodePrecision::Int8 { output_layer });
        let int8 = model_by(pb, TransformerConfig::tiny(), Inputs::default(), 40)?;
        let int8_prep = int8.prepare_decoding()?;
        assert!(int8_prep.describe().contains("decoder layers int8"));
        assert_eq!(
            int8_prep.describe().contains("output layer int8"),
            output_layer
        );
        let mut a = int8.start_prepared(&src, PAD, &int8_prep)?;
        let mut b = model.start_prepared(&src, PAD, &f32_prep)?;
        let mut rows = 2;
        for step in 0..6u32 {
            let ids = step_tokens(rows, |r| 1 + (r * 7 + step * 5) % 39)?;
            let (la, _) = int8.step(&mut a, &ids, false)?;
            let (lb, _) = model.step(&mut b, &ids, false)?;
            let d = max_rel_diff(&la, &lb)?;
            assert!(
                d < 0.05,
                "step {step}: int8 logits differ by {d} of their scale"
            );
            assert!(d > 0.0, "step {step}: int8 gave the f32 logits exactly");
            if step == 1 {
                let select = vec![1, 0, 0];
                a.select_rows(&select)?;
                b.select_rows(&select)?;
                rows = 3;
            }
        }
    }
    Ok(())
}
