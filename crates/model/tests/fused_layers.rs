//! The fused encoder and decoder layers (`transformer_kernels`) against the composed layers
//! in f64: forward and every gradient, with the layer's work split into an uneven number of
//! thread groups; and the bf16 products within bf16's rounding of fp32.

use candle_core::{DType, Device, Result, Tensor};
use transformer_kernels::testing::{decoder_layer_slices, encoder_layer_slices, LayerShape};
use transformer_kernels::{bf16, DecoderLayerDropout, LayerDropout};
use transformer_model::config::Activation;
use transformer_model::decoder::DecoderLayer;
use transformer_model::dropout::Mode;
use transformer_model::encoder::EncoderLayer;
use transformer_model::mask::Mask;
use transformer_model::params::ParamBuilder;
use transformer_model::rng::Rng;
use transformer_model::stack::LayerSpec;
use transformer_model::Pass;

mod common;
use common::layer_spec;

/// For the fused layers' tests against the composed ones: with `skip`, the reference's output
/// `y` and incoming gradient `dy` (`(B, T, C)`) with the rows from each sequence's length on
/// zeroed (the fused layer computes no padding rows and reads no gradient there).
fn zero_padding_rows(
    y: candle_core::Tensor,
    dy: &candle_core::Tensor,
    lens: &[usize],
    skip: bool,
) -> candle_core::Result<(candle_core::Tensor, candle_core::Tensor)> {
    if !skip {
        return Ok((y, dy.clone()));
    }
    let (b, t, _) = y.dims3()?;
    let real: Vec<f64> = (0..b * t)
        .map(|i| f64::from(u8::from(i % t < lens[i / t])))
        .collect();
    let real = candle_core::Tensor::from_vec(real, (b, t, 1), y.device())?.to_dtype(y.dtype())?;
    Ok((y.broadcast_mul(&real)?, dy.broadcast_mul(&real)?))
}

/// The layers compared: every activation, with both norm placements (pre-norm first).
const CASES: [(bool, Activation); 6] = [
    (false, Activation::Relu),
    (true, Activation::Relu),
    (false, Activation::Gelu),
    (true, Activation::Gelu),
    (false, Activation::GeluTanh),
    (true, Activation::Swish),
];

/// The composed layer that `build` makes (an encoder or decoder layer) in f64 on the CPU
/// under `l.` (seed 4): width, heads and feed-forward size `(c, h, f)`, dropout `p`, the
/// activation, the norms first or last; and its parameters.
fn f64_layer<L>(
    build: impl Fn(&ParamBuilder, &LayerSpec) -> Result<L>,
    (c, h, f): (usize, usize, usize),
    p: f64,
    activation: Activation,
    norm_first: bool,
) -> Result<(L, transformer_model::params::Params)> {
    let pb = ParamBuilder::new(DType::F64, &Device::Cpu, 4);
    let layer = build(&pb.pp("l"), &layer_spec(c, h, f, p, activation, norm_first))?;
    Ok((layer, pb.params()))
}

/// The fused layer's forward and every gradient against the composed layer in f64, with
/// the groups' partial sums (3 groups of uneven size) and each mask and norm placement.
#[test]
fn fused_encoder_layer_equals_the_composed_layer_in_f64() -> Result<()> {
    let dev = Device::Cpu;
    let (b, t, c, f, h) = (5, 6, 8, 12, 2);
    for (norm_first, activation) in CASES {
        // "lengths": the padding mask with the sequences' lengths, padding rows not
        // computed (the reference's are zeroed in `y` and `dy`; the fused layer's `dy`
        // there is not read).
        let kinds = [
            ("causal", 0.3),
            ("padding", 0.0),
            ("none", 0.25),
            ("lengths", 0.3),
        ];
        for (mask_kind, p) in kinds {
            let (layer, params) =
                f64_layer(EncoderLayer::new, (c, h, f), p, activation, norm_first)?;
            let x = candle_core::Var::from_tensor(&Tensor::randn(0f64, 1.0, (b, t, c), &dev)?)?;
            let mask = match mask_kind {
                "causal" => Some(Mask::causal(t, &dev)?),
                "padding" | "lengths" => {
                    let valid: Vec<u8> = (0..b * t)
                        .map(|i| u8::from(i % t < t - i / t % 3))
                        .collect();
                    Some(Mask::key_valid(&Tensor::from_vec(valid, (b, t), &dev)?)?)
                }
                _ => None,
            };
            let rng = Rng::new(11);
            let (y, _) = layer.forward(x.as_tensor(), mask.as_ref(), Mode::Train(&rng))?;
            let dy = Tensor::randn(0f64, 1.0, (b, t, c), &dev)?;
            let lens: Vec<usize> = (0..b).map(|i| t - i % 3).collect();
            let skip = mask_kind == "lengths";
            let (y, dy_ref) = zero_padding_rows(y, &dy, &lens, skip)?;
            let store = (&y * &dy_ref)?.sum_all()?.backward()?;

            // The same layer fused, on the same RNG streams.
            let names = [
                "self_attn.q_proj.weight",
                "self_attn.q_proj.bias",
                "self_attn.k_proj.weight",
                "self_attn.k_proj.bias",
                "self_attn.v_proj.weight",
                "self_attn.v_proj.bias",
                "self_attn.out_proj.weight",
                "self_attn.out_proj.bias",
                "linear1.weight",
                "linear1.bias",
                "linear2.weight",
                "linear2.bias",
                "norm1.weight",
                "norm1.bias",
                "norm2.weight",
                "norm2.bias",
            ];
            let (tensors, vals) = layer_params(&params, &names)?;
            let w: Vec<&[f64]> = vals.iter().map(Vec::as_slice).collect();
            let shape = LayerShape {
                b,
                t,
                s: 0,
                c,
                f,
                h,
                eps: 1e-5,
                norm_first,
                bf16: false,
                activation: activation.into(),
            };
            let keep = match &mask {
                Some(m) => {
                    let kb = m.keep().dim(0)?;
                    let data = m
                        .keep()
                        .broadcast_as((kb, 1, t, t))?
                        .flatten_all()?
                        .to_vec1::<u8>()?;
                    Some((data, kb > 1))
                }
                None => None,
            };
            let (seed, _) = rng.state();
            let dropout = (p > 0.0).then_some(LayerDropout {
                p,
                seed,
                streams: [0, 1, 2, 3],
            });
            let xs = x.as_tensor().flatten_all()?.to_vec1::<f64>()?;
            let dys = dy.flatten_all()?.to_vec1::<f64>()?;
            let run = encoder_layer_slices(
                &shape,
                &w,
                keep,
                skip.then_some(&lens[..]),
                dropout,
                &xs,
                &dys,
                3,
            );
            assert_eq!(run.groups, 3);
            let (fy, fdx, fg) = (run.y, run.dx, run.grads);

            let case = format!("norm_first {norm_first}, {activation:?}, {mask_kind}");
            let close = |what: &str, want: &Tensor, got: &[f64]| close_f64(&case, what, want, got);
            close("y", &y, &fy)?;
            close("dx", store.get(x.as_tensor()).expect("dx"), &fdx)?;
            for (i, n) in names.iter().enumerate() {
                close(n, gradient(&store, &tensors[i]), &fg[i])?;
            }
        }
    }
    Ok(())
}

/// The parameters `l.<name>` of `params` for each of `names`, in that order: their tensors
/// and their values.
fn layer_params(
    params: &transformer_model::params::Params,
    names: &[impl AsRef<str>],
) -> Result<(Vec<Tensor>, Vec<Vec<f64>>)> {
    let tensors: Vec<Tensor> = names
        .iter()
        .map(|n| {
            let n = n.as_ref();
            params
                .get(&format!("l.{n}"))
                .unwrap_or_else(|| panic!("no parameter l.{n}"))
                .as_tensor()
                .clone()
        })
        .collect();
    let vals = tensors
        .iter()
        .map(|t| t.flatten_all()?.to_vec1::<f64>())
        .collect::<Result<_>>()?;
    Ok((tensors, vals))
}

/// The gradient of parameter `t` in `store`; every parameter of these layers has one.
fn gradient<'a>(store: &'a candle_core::backprop::GradStore, t: &Tensor) -> &'a Tensor {
    store.get(t).expect("every parameter has a gradient")
}

/// Asserts `got` equals `want` to 1e-12 of the largest magnitude (at least 1e-3); `case` and
/// `what` name the comparison in the message.
fn close_f64(case: &str, what: &str, want: &Tensor, got: &[f64]) -> Result<()> {
    let want = want.flatten_all()?.to_vec1::<f64>()?;
    assert_eq!(want.len(), got.len(), "{case}: {what}");
    let size = want.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
    let diff = want
        .iter()
        .zip(got)
        .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        diff <= 1e-12 * size,
        "{case}: {what} differs by {diff} (size {size})"
    );
    Ok(())
}

/// The layer's parameter names in [`slot`] order.
fn param_names() -> Vec<String> {
    let mut names = Vec::new();
    for m in ["self_attn", "multihead_attn"] {
        for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
            for wb in ["weight", "bias"] {
                names.push(format!("{m}.{proj}.{wb}"));
            }
        }
    }
    for l in ["linear1", "linear2", "norm1", "norm2", "norm3"] {
        for wb in ["weight", "bias"] {
            names.push(format!("{l}.{wb}"));
        }
    }
    names
}

/// With bf16 products (the projections and the feed-forward layer, both sub-layer kinds
/// that the encoder layer shares) the output and every gradient stay within bf16's
/// rounding of the fp32 layer's, with dropout and skipped padding rows; and they are not
/// the fp32 values (the bf16 path ran). Needs a CPU with AMX or AVX512-BF16.
#[test]
fn decoder_layer_bf16_products_stay_within_bf16_rounding_of_f32() -> Result<()> {
    if !bf16::available() {
        eprintln!("no bf16 unit on this CPU: nothing to check");
        return Ok(());
    }
    let dev = Device::Cpu;
    let (b, t, s, c, f, h) = (4, 7, 5, 64, 96, 4);
    let pb = ParamBuilder::new(DType::F32, &dev, 5);
    let spec = layer_spec(c, h, f, 0.2, Activation::Relu, false);
    DecoderLayer::new(&pb.pp("l"), &spec)?;
    let params = pb.params();
    let vals: Vec<Vec<f32>> = param_names()
        .iter()
        .map(|n| {
            params
                .get(&format!("l.{n}"))
                .expect("parameter")
                .flatten_all()?
                .to_vec1()
        })
        .collect::<Result<_>>()?;
    let w: Vec<&[f32]> = vals.iter().map(Vec::as_slice).collect();
    let tgt_lens: Vec<usize> = (0..b).map(|i| t - i % 3).collect();
    let src_lens: Vec<usize> = (0..b).map(|i| s - (i + 1) % 3).collect();
    let valid = |lens: &[usize], n: usize| -> Vec<u8> {
        (0..b * n).map(|i| u8::from(i % n < lens[i / n])).collect()
    };
    let tgt_mask = Mask::causal(t, &dev)?.and(&Mask::key_valid(&Tensor::from_vec(
        valid(&tgt_lens, t),
        (b, t),
        &dev,
    )?)?)?;
    let self_keep = tgt_mask
        .keep()
        .broadcast_as((b, 1, t, t))?
        .flatten_all()?
        .to_vec1()?;
    let memory_keep = valid(&src_lens, s);
    let dropout = DecoderLayerDropout {
        p: 0.2,
        seed: 3,
        streams: [0, 1, 2, 3, 4, 5],
    };
    // Seeded values in [-1.7, 1.7) (unit variance).
    let rand = |n: usize, seed: u64| -> Vec<f32> {
        let r = Rng::new(seed);
        r.uniform_vec(n)
            .into_iter()
            .map(|u| ((u * 2.0 - 1.0) * 1.732) as f32)
            .collect()
    };
    let (xs, ms, dys) = (rand(b * t * c, 1), rand(b * s * c, 2), rand(b * t * c, 3));
    let run = |bf16: bool| {
        let shape = LayerShape {
            b,
            t,
            s,
            c,
            f,
            h,
            eps: 1e-5,
            norm_first: false,
            bf16,
            activation: Default::default(),
        };
        let r = decoder_layer_slices(
            &shape,
            &w,
            Some((self_keep.clone(), true)),
            Some(&memory_keep),
            Some((&tgt_lens, &src_lens)),
            Some(dropout),
            &xs,
            &ms,
            &dys,
            2,
        );
        let mut all = vec![r.y, r.dx, r.dmemory];
        all.extend(r.grads);
        all
    };
    let (want, got) = (run(false), run(true));
    let mut what = vec!["y".to_string(), "dx".into(), "dmemory".into()];
    what.extend(param_names());
    let mut any_differs = false;
    for ((name, a), g) in what.iter().zip(&want).zip(&got) {
        if name.ends_with("k_proj.bias") {
            // Zero in exact arithmetic (softmax ignores a shift shared by all keys):
            // both are rounding noise.
            continue;
        }
        // Relative to the tensor's norm: bf16 operands carry 8 significant bits (2^-9
        // relative rounding), and the gradients pass through several products.
        let norm = a.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
        let err = a
            .iter()
            .zip(g)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f32>()
            .sqrt();
        any_differs |= err > 0.0;
        assert!(
            err <= 2e-2 * norm,
            "{name}: bf16 is off by {err} (norm {norm})"
        );
    }
    assert!(any_differs, "the bf16 path gave the fp32 values");
    Ok(())
}

/// The fused layer's forward pass and every gradient (target stream, memory, each
/// parameter) against the composed layer in f64: post-norm and pre-norm, with and without
/// dropout, causal and target padding masks, source padding, 3 groups of uneven size.
#[test]
fn fused_decoder_layer_equals_the_composed_layer_in_f64() -> Result<()> {
    let dev = Device::Cpu;
    let (b, t, s, c, f, h) = (5, 6, 4, 8, 12, 2);
    for (norm_first, activation) in CASES {
        // `skip`: with the sequences' lengths, padding rows not computed (the reference's
        // are then zeroed in `y` and in `dy`; the fused layer's `dy` there is not read).
        for (p, skip) in [(0.0, false), (0.3, false), (0.0, true), (0.3, true)] {
            let (layer, params) =
                f64_layer(DecoderLayer::new, (c, h, f), p, activation, norm_first)?;
            let x = candle_core::Var::from_tensor(&Tensor::randn(0f64, 1.0, (b, t, c), &dev)?)?;
            let mem = candle_core::Var::from_tensor(&Tensor::randn(0f64, 1.0, (b, s, c), &dev)?)?;
            let tgt_valid: Vec<u8> = (0..b * t)
                .map(|i| u8::from(i % t < t - i / t % 3))
                .collect();
            let src_valid: Vec<u8> = (0..b * s)
                .map(|i| u8::from(i % s < s - (i / s + 1) % 3))
                .collect();
            let tgt_mask = Mask::causal(t, &dev)?.and(&Mask::key_valid(&Tensor::from_vec(
                tgt_valid,
                (b, t),
                &dev,
            )?)?)?;
            let mem_mask = Mask::key_valid(&Tensor::from_vec(src_valid, (b, s), &dev)?)?;
            let rng = Rng::new(11);
            let (y, _) = layer.forward(
                x.as_tensor(),
                mem.as_tensor(),
                Some(&tgt_mask),
                Some(&mem_mask),
                Pass::new(Mode::Train(&rng)),
            )?;
            let dy = Tensor::randn(0f64, 1.0, (b, t, c), &dev)?;
            let tgt_lens: Vec<usize> = (0..b).map(|i| t - i % 3).collect();
            let src_lens: Vec<usize> = (0..b).map(|i| s - (i + 1) % 3).collect();
            let (y, dy_ref) = zero_padding_rows(y, &dy, &tgt_lens, skip)?;
            let store = (&y * &dy_ref)?.sum_all()?.backward()?;

            let names = param_names();
            let (tensors, vals) = layer_params(&params, &names)?;
            let w: Vec<&[f64]> = vals.iter().map(Vec::as_slice).collect();
            let shape = LayerShape {
                b,
                t,
                s,
                c,
                f,
                h,
                eps: 1e-5,
                norm_first,
                bf16: false,
                activation: activation.into(),
            };
            let self_keep = tgt_mask
                .keep()
                .broadcast_as((b, 1, t, t))?
                .flatten_all()?
                .to_vec1::<u8>()?;
            let memory_keep = mem_mask
                .keep()
                .broadcast_as((b, 1, 1, s))?
                .flatten_all()?
                .to_vec1::<u8>()?;
            let (seed, _) = rng.state();
            let dropout = (p > 0.0).then_some(DecoderLayerDropout {
                p,
                seed,
                streams: [0, 1, 2, 3, 4, 5],
            });
            let xs = x.as_tensor().flatten_all()?.to_vec1::<f64>()?;
            let ms = mem.as_tensor().flatten_all()?.to_vec1::<f64>()?;
            let dys = dy.flatten_all()?.to_vec1::<f64>()?;
            let run = decoder_layer_slices(
                &shape,
                &w,
                Some((self_keep, true)),
                Some(&memory_keep),
                skip.then_some((&tgt_lens[..], &src_lens[..])),
                dropout,
                &xs,
                &ms,
                &dys,
                3,
            );
            assert_eq!(run.groups, 3);
            let (fy, fdx, fdm, fg) = (run.y, run.dx, run.dmemory, run.grads);

            let case = format!("norm_first {norm_first}, {activation:?}, p {p}, skip {skip}");
            let close = |what: &str, want: &Tensor, got: &[f64]| close_f64(&case, what, want, got);
            close("y", &y, &fy)?;
            close("dx", store.get(x.as_tensor()).expect("dx"), &fdx)?;
            close("dmemory", store.get(mem.as_tensor()).expect("dmem"), &fdm)?;
            for (i, n) in names.iter().enumerate() {
                close(n, gradient(&store, &tensors[i]), &fg[i])?;
            }
        }
    }
    Ok(())
}
