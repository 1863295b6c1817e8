//! CUDA against the CPU, on a machine with an NVIDIA GPU: every building block's output, the
//! translation loss and every parameter's gradient agree with the CPU's (float64, and float32
//! within float32 tolerance), 50 training steps from the same seed follow the same losses,
//! and a run trained on one device decodes on the other.
//!
//! Compiled only with the `cuda` feature, and ignored by a plain `cargo test`, since CI has
//! no GPU. On the GPU machine, from a tree built by `scripts/build_cuda.sh`:
//!
//! ```text
//! CUDA_ROOT=... cargo test --release -p transformer-cli --features cuda \
//!     --target-dir target/cuda --test cuda_parity -- --ignored --test-threads 1
//! ```
//!
//! or, with the test binary that `scripts/build_cuda.sh --tests` builds copied to the GPU
//! machine beside the `transformer` binary:
//!
//! ```text
//! TRANSFORMER_BIN=./transformer ./cuda_parity --ignored --test-threads 1
//! ```
//!
//! (docs/CUDA.md says what the GPU machine needs.)
#![cfg(feature = "cuda")]

use candle_core::{DType, Device, Tensor, Var};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use transformer_model::seq2seq::Seq2SeqConfig;
use transformer_model::{
    Activation, Backprop, DirectGrads, FeedForward, LayerNorm, Mask, Mode, MultiHeadAttention,
    ParamBuilder, Rng, TransformerConfig,
};
use transformer_runtime::model::MtModel;
use transformer_runtime::model::MtModelConfig;
use transformer_train::mt::train_step;
use transformer_train::optim::Adam;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const SEED: u64 = 7;

fn gpu() -> Device {
    Device::new_cuda(0).expect("these tests need CUDA GPU 0 (see the file's docs)")
}

/// Deterministic values in [-1, 1] of `shape`, on `dev`.
fn input(shape: &[usize], dtype: DType, dev: &Device) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|i| ((i as f64) * 0.7311).sin()).collect();
    Ok(Tensor::from_vec(v, shape, &Device::Cpu)?
        .to_dtype(dtype)?
        .to_device(dev)?)
}

/// Largest |a - b| / (1 + |a|) over the elements.
fn max_rel_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    assert_eq!(a.dims(), b.dims());
    let a = a.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let b = b
        .to_device(&Device::Cpu)?
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()?;
    Ok(a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs() / (1.0 + x.abs()))
        .fold(0.0, f64::max))
}

/// Tolerance of a comparison in `dtype`.
fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-10,
        _ => 2e-4,
    }
}

fn assert_close(what: &str, cpu: &Tensor, cuda: &Tensor, dtype: DType) -> Result<()> {
    assert!(
        cuda.device().is_cuda(),
        "{what}: the CUDA result is not on the GPU"
    );
    let d = max_rel_diff(cpu, cuda)?;
    assert!(
        d <= tol(dtype),
        "{what} ({dtype:?}): CPU and CUDA differ by {d:e}"
    );
    Ok(())
}

/// The parameters of `pb` by name (their tensors, shared), to give the same weights to a
/// model built by another builder.
fn weights_of(pb: &ParamBuilder) -> HashMap<String, Tensor> {
    pb.params()
        .iter()
        .map(|(n, v)| (n.to_string(), v.as_tensor().clone()))
        .collect()
}

/// A module built on the CPU and the same module, with the same weights, on the GPU.
fn both<M>(
    dtype: DType,
    build: impl Fn(&ParamBuilder) -> transformer_model::Result<M>,
) -> Result<(M, M, transformer_model::params::Params)> {
    let pb_cpu = ParamBuilder::new(dtype, &Device::Cpu, SEED);
    let cpu = build(&pb_cpu)?;
    let pb_gpu = ParamBuilder::new(dtype, &gpu(), SEED);
    let cuda = build(&pb_gpu)?;
    pb_gpu.params().assign(&weights_of(&pb_cpu))?;
    Ok((cpu, cuda, pb_gpu.params()))
}

#[test]
#[ignore = "needs an NVIDIA GPU and the cuda feature; see the file's docs"]
fn building_blocks_match_the_cpu() -> Result<()> {
    let g = gpu();
    for dtype in [DType::F64, DType::F32] {
        let x_cpu = input(&[3, 7, 32], dtype, &Device::Cpu)?;
        let x_gpu = x_cpu.to_device(&g)?;

        let (a, b, _) = both(dtype, |pb| LayerNorm::new(pb, 32, 1e-5))?;
        assert_close(
            "layer norm",
            &a.forward(&x_cpu)?,
            &b.forward(&x_gpu)?,
            dtype,
        )?;

        let (a, b, _) = both(dtype, |pb| {
            FeedForward::new(pb, 32, 64, Activation::Relu, 0.0)
        })?;
        let (ya, yb) = (
            a.forward(&x_cpu, Mode::Eval)?,
            b.forward(&x_gpu, Mode::Eval)?,
        );
        assert_close("feed-forward", &ya, &yb, dtype)?;

        let (a, b, _) = both(dtype, |pb| MultiHeadAttention::new(pb, 32, 4, 0.0, true))?;
        let (ma, mb) = (Mask::causal(7, &Device::Cpu)?, Mask::causal(7, &g)?);
        let (ya, _) = a.forward(&x_cpu, &x_cpu, &x_cpu, Some(&ma), Mode::Eval)?;
        let (yb, _) = b.forward(&x_gpu, &x_gpu, &x_gpu, Some(&mb), Mode::Eval)?;
        assert_close("causal self-attention", &ya, &yb, dtype)?;
    }
    Ok(())
}

/// `f(inputs)` on the CPU and on the GPU, each differentiated through `sum(y * r)` for a
/// fixed cotangent `r`: the outputs and every input's gradient agree within `dtype`'s
/// tolerance. `cpu` is the composed op (the reference), `gpu` the fused kernel.
fn check_op(
    what: &str,
    dtype: DType,
    inputs: &[Tensor],
    cpu: impl Fn(&[Tensor]) -> candle_core::Result<Tensor>,
    gpu_op: impl Fn(&[Tensor]) -> candle_core::Result<Tensor>,
) -> Result<()> {
    let g = gpu();
    let vars_cpu: Vec<Var> = inputs
        .iter()
        .map(|t| Var::from_tensor(t))
        .collect::<candle_core::Result<_>>()?;
    let vars_gpu: Vec<Var> = inputs
        .iter()
        .map(|t| Var::from_tensor(&t.to_device(&g)?))
        .collect::<candle_core::Result<_>>()?;
    let ts_cpu: Vec<Tensor> = vars_cpu.iter().map(|v| v.as_tensor().clone()).collect();
    let ts_gpu: Vec<Tensor> = vars_gpu.iter().map(|v| v.as_tensor().clone()).collect();
    let (ya, yb) = (cpu(&ts_cpu)?, gpu_op(&ts_gpu)?);
    assert_close(what, &ya, &yb, dtype)?;
    let r = input(ya.dims(), dtype, &Device::Cpu)?.affine(0.5, 0.25)?;
    let (ga, gb) = (
        (&ya * &r)?.sum_all()?.backward()?,
        (&yb * r.to_device(&g)?)?.sum_all()?.backward()?,
    );
    for (i, (va, vb)) in vars_cpu.iter().zip(&vars_gpu).enumerate() {
        let da = ga.get(va.as_tensor()).expect("a CPU gradient");
        let db = gb.get(vb.as_tensor()).expect("a GPU gradient");
        assert_close(&format!("{what}: gradient of input {i}"), da, db, dtype)?;
    }
    Ok(())
}

/// Every fused GPU kernel (`crates/kernels/src/cuda/fused.cu`) against the composed ops it
/// replaces, run on the CPU, forward and every gradient, in f64 and f32: layer norm, softmax,
/// attention's softmax with scale, causal and padding masks and dropout, bias + ReLU / GELU +
/// dropout, dropout, and the output layer's label-smoothed cross-entropy with ignored rows.
#[test]
#[ignore = "needs an NVIDIA GPU and the cuda feature; see the file's docs"]
fn fused_gpu_kernels_match_the_composed_ops() -> Result<()> {
    use transformer_model::kernels::{self as k, gpu as kg, Activation as KAct};
    let (p, seed, stream) = (0.25, 11u64, 3u64);
    for dtype in [DType::F64, DType::F32] {
        let cpu = Device::Cpu;
        // Layer norm over rows of 48 (and 512: more than one pass of a warp per row).
        for c in [48usize, 512] {
            let ins = [
                input(&[5, 9, c], dtype, &cpu)?,
                input(&[c], dtype, &cpu)?.affine(0.3, 1.0)?,
                input(&[c], dtype, &cpu)?.affine(0.2, 0.1)?,
            ];
            check_op(
                &format!("layer norm C={c}"),
                dtype,
                &ins,
                |t| k::layer_norm_reference(&t[0], &t[1], &t[2], 1e-5),
                |t| k::layer_norm(&t[0], &t[1], &t[2], 1e-5),
            )?;
        }
        // Softmax over the last dimension.
        let ins = [input(&[4, 3, 70], dtype, &cpu)?.affine(3.0, 0.0)?];
        check_op(
            "softmax",
            dtype,
            &ins,
            |t| k::softmax_last_dim_reference(&t[0]),
            |t| k::softmax_last_dim(&t[0]),
        )?;
        // Attention: causal self-attention and padded cross-attention (a row of nothing to
        // attend to included), with and without dropout.
        let (b, h, t, s, d) = (3usize, 2usize, 6usize, 7usize, 8usize);
        let causal: Vec<u8> = (0..t * s).map(|i| u8::from(i % s <= i / s)).collect();
        let causal = Tensor::from_vec(causal, (1, 1, t, s), &cpu)?;
        let padding: Vec<u8> = (0..b * s)
            .map(|i| u8::from(i % s < [7, 4, 0][i / s]))
            .collect();
        let padding = Tensor::from_vec(padding, (b, 1, 1, s), &cpu)?;
        for (name, keep) in [("causal", causal), ("padding", padding)] {
            for drop in [None, Some((p, seed, stream))] {
                let ins = [
                    input(&[b, h, t, d], dtype, &cpu)?,
                    input(&[b, h, s, d], dtype, &cpu)?.affine(-1.3, 0.1)?,
                    input(&[b, h, s, d], dtype, &cpu)?.affine(0.7, 0.0)?,
                ];
                let scale = 1.0 / (d as f64).sqrt();
                let keep_gpu = keep.to_device(&gpu())?;
                check_op(
                    &format!("attention, {name} mask, dropout {drop:?}"),
                    dtype,
                    &ins,
                    |x| {
                        let mult = match drop {
                            Some((p, seed, stream)) => {
                                let ones = Tensor::ones((b, h, t, s), dtype, &cpu)?;
                                Some(k::dropout(&ones, p, seed, stream)?)
                            }
                            None => None,
                        };
                        k::attention_reference(k::AttentionInputs {
                            qkv: k::Qkv {
                                q: &x[0],
                                k: &x[1],
                                v: &x[2],
                            },
                            keep: Some(&keep),
                            dropout: mult.as_ref(),
                            scale,
                        })
                    },
                    |x| {
                        Ok(
                            kg::attention_gpu(&x[0], &x[1], &x[2], Some(&keep_gpu), drop, scale)?
                                .expect("the fused GPU attention applies"),
                        )
                    },
                )?;
            }
        }
        // Bias + activation + dropout, and dropout alone.
        for act in [KAct::Relu, KAct::Gelu] {
            for drop in [None, Some((p, seed, stream))] {
                // No pre-activation exactly 0, where ReLU's gradient is a convention: the
                // kernel takes 0 there (as PyTorch and the fused CPU layers), candle's
                // composed `relu` 1.
                let ins = [
                    input(&[6, 5, 40], dtype, &cpu)?.affine(2.0, 0.0)?,
                    input(&[40], dtype, &cpu)?.affine(0.5, 0.01)?,
                ];
                check_op(
                    &format!("bias + {act:?} + dropout {drop:?}"),
                    dtype,
                    &ins,
                    |x| {
                        let u = x[0].broadcast_add(&x[1])?;
                        let a = match act {
                            KAct::Relu => u.relu()?,
                            KAct::Gelu => transformer_model::feed_forward::gelu_erf(&u)
                                .map_err(|e| candle_core::Error::Msg(e.to_string()))?,
                        };
                        match drop {
                            Some((p, seed, stream)) => k::dropout(&a, p, seed, stream),
                            None => Ok(a),
                        }
                    },
                    |x| {
                        Ok(kg::bias_activation_dropout(&x[0], &x[1], act, drop)?
                            .expect("the fused GPU op applies"))
                    },
                )?;
            }
        }
        let ins = [input(&[7, 300], dtype, &cpu)?];
        check_op(
            "dropout",
            dtype,
            &ins,
            |x| k::dropout(&x[0], p, seed, stream),
            |x| k::dropout(&x[0], p, seed, stream),
        )?;
        // The output layer's label-smoothed cross-entropy: 11 rows, 3 of them ignored (0),
        // a vocabulary of 1,000 (more than one pass of a block per row).
        let (n, c, v) = (11usize, 16usize, 1000usize);
        let targets: Vec<u32> = (0..n as u32)
            .map(|i| if i % 4 == 1 { 0 } else { 1 + i * 37 % 999 })
            .collect();
        let tc = Tensor::from_vec(targets, n, &cpu)?;
        let tg = tc.to_device(&gpu())?;
        let ins = [
            input(&[n, c], dtype, &cpu)?.affine(2.0, 0.0)?,
            input(&[v, c], dtype, &cpu)?.affine(0.5, 0.0)?,
            input(&[v], dtype, &cpu)?.affine(0.3, 0.0)?,
        ];
        for eps in [0.0, 0.1] {
            check_op(
                &format!("smoothed cross-entropy, eps {eps}"),
                dtype,
                &ins,
                |x| {
                    let nll = k::linear_cross_entropy_reference(&x[0], &x[1], &x[2], &tc, Some(0))?;
                    let smooth = k::label_smoothing_term_reference(k::SmoothingInputs {
                        hidden: &x[0],
                        weight: &x[1],
                        bias: &x[2],
                        targets: &tc,
                        ignore_index: 0,
                        eps,
                    })?;
                    nll + smooth
                },
                |x| {
                    let (loss, _) =
                        kg::linear_smoothed_cross_entropy(&x[0], &x[1], &x[2], &tg, Some(0), eps)?
                            .expect("the fused GPU loss applies");
                    Ok(loss)
                },
            )?;
        }
    }
    Ok(())
}

fn tiny_mt(dropout: f64) -> MtModelConfig {
    MtModelConfig::Transformer(Seq2SeqConfig {
        transformer: TransformerConfig {
            dropout,
            ..TransformerConfig::tiny()
        },
        src_vocab: 40,
        tgt_vocab: 40,
        share_embeddings: false,
        inputs: Default::default(),
    })
}

/// A padded batch (0 = padding): source (4, 9), target input and output (4, 8).
fn batch(dev: &Device) -> Result<[Tensor; 3]> {
    let (b, s, t) = (4usize, 9usize, 8usize);
    let (mut src, mut tin, mut tout) = (vec![0u32; b * s], vec![0u32; b * t], vec![0u32; b * t]);
    for i in 0..b {
        for j in 0..s - i {
            src[i * s + j] = 4 + ((i * 31 + j * 17) % 36) as u32;
        }
        let y = |j: usize| 4 + ((i * 13 + j * 7) % 36) as u32;
        for j in 0..t - i {
            tin[i * t + j] = y(j);
            tout[i * t + j] = y(j + 1);
        }
    }
    Ok([
        Tensor::from_vec(src, (b, s), dev)?,
        Tensor::from_vec(tin, (b, t), dev)?,
        Tensor::from_vec(tout, (b, t), dev)?,
    ])
}

#[test]
#[ignore = "needs an NVIDIA GPU and the cuda feature; see the file's docs"]
fn translation_loss_and_every_gradient_match_the_cpu() -> Result<()> {
    let g = gpu();
    for dtype in [DType::F64, DType::F32] {
        let pb_cpu = ParamBuilder::new(dtype, &Device::Cpu, SEED);
        let cpu = MtModel::build(&pb_cpu, &tiny_mt(0.0))?;
        let (cuda, params_gpu) = {
            let pb = ParamBuilder::new(dtype, &g, SEED);
            let m = MtModel::build(&pb, &tiny_mt(0.0))?;
            pb.params().assign(&weights_of(&pb_cpu))?;
            (m, pb.params())
        };
        let [s, ti, to] = batch(&Device::Cpu)?;
        let [sg, tig, tog] = batch(&g)?;
        let la = cpu
            .loss([&s, &ti, &to], (0, 0.1), Mode::Eval, Backprop::Graph)?
            .loss;
        let lb = cuda
            .loss([&sg, &tig, &tog], (0, 0.1), Mode::Eval, Backprop::Graph)?
            .loss;
        assert_close("loss", &la, &lb, dtype)?;
        let (ga, gb) = (la.backward()?, lb.backward()?);
        let params_cpu = pb_cpu.params();
        assert!(params_cpu.len() > 10);
        for (name, va) in params_cpu.iter() {
            let vb = params_gpu.get(name).expect("same parameters");
            let da = ga.get(va.as_tensor());
            let db = gb.get(vb.as_tensor());
            match (da, db) {
                (Some(da), Some(db)) => {
                    assert_close(&format!("gradient of {name}"), da, db, dtype)?
                }
                (None, None) => panic!("{name} has no gradient on either device"),
                _ => panic!("{name} has a gradient on one device only"),
            }
        }
    }
    Ok(())
}

/// Losses of `steps` Adam steps (dropout 0.1, label smoothing 0.1) on `dev`, from the
/// weights `init`, with the products in `precision`.
fn train_losses(
    dev: &Device,
    init: &HashMap<String, Tensor>,
    steps: usize,
    precision: transformer_model::Precision,
) -> Result<Vec<f64>> {
    let pb = ParamBuilder::new(DType::F32, dev, SEED).with_precision(precision);
    let model = MtModel::build(&pb, &tiny_mt(0.1))?;
    let params = pb.params();
    params.assign(init)?;
    let vars: Vec<Var> = params.vars();
    let mut opt = Adam::new(vars.clone(), 1e-3)?;
    let direct = DirectGrads::new();
    let rng = Rng::new(SEED + 1);
    let [s, ti, to] = batch(dev)?;
    let mut losses = Vec::with_capacity(steps);
    for _ in 0..steps {
        let (loss, _) = train_step(
            &model,
            &vars,
            &mut opt,
            &direct,
            1.0,
            [&s, &ti, &to],
            0,
            0.1,
            &rng,
        )?;
        losses.push(loss);
    }
    Ok(losses)
}

#[test]
#[ignore = "needs an NVIDIA GPU and the cuda feature; see the file's docs"]
fn fifty_training_steps_follow_the_cpu() -> Result<()> {
    use transformer_model::Precision::F32;
    let init = tiny_init()?;
    let cpu = train_losses(&Device::Cpu, &init, 50, F32)?;
    let cuda = train_losses(&gpu(), &init, 50, F32)?;
    assert!(cpu[49] < cpu[0] - 0.5, "training did not learn: {cpu:?}");
    for (i, (a, b)) in cpu.iter().zip(&cuda).enumerate() {
        assert!(
            (a - b).abs() <= 1e-3 * (1.0 + a.abs()),
            "step {}: CPU loss {a}, CUDA loss {b}\nCPU:  {cpu:?}\nCUDA: {cuda:?}",
            i + 1
        );
    }
    Ok(())
}

/// The tiny model's initial weights (on the CPU).
fn tiny_init() -> Result<HashMap<String, Tensor>> {
    let pb = ParamBuilder::new(DType::F32, &Device::Cpu, SEED);
    MtModel::build(&pb, &tiny_mt(0.1))?;
    Ok(weights_of(&pb))
}

/// bf16 mixed precision on the GPU (autocast: the products in bf16, f32 master weights)
/// learns as f32 does: its 50 losses stay within bf16's rounding of the f32 run's, and they
/// are not the f32 losses (the products really are bf16).
#[test]
#[ignore = "needs an NVIDIA GPU and the cuda feature; see the file's docs"]
fn bf16_mixed_precision_on_the_gpu_follows_f32() -> Result<()> {
    use transformer_model::Precision::{Bf16, F32};
    let init = tiny_init()?;
    let full = train_losses(&gpu(), &init, 50, F32)?;
    let half = train_losses(&gpu(), &init, 50, Bf16)?;
    assert!(
        half[49] < half[0] - 0.5,
        "bf16 training did not learn: {half:?}"
    );
    let mut differ = false;
    for (i, (a, b)) in full.iter().zip(&half).enumerate() {
        assert!(
            (a - b).abs() <= 5e-2 * (1.0 + a.abs()),
            "step {}: f32 loss {a}, bf16 loss {b}\nf32:  {full:?}\nbf16: {half:?}",
            i + 1
        );
        differ |= a != b;
    }
    assert!(
        differ,
        "bf16 losses equal the f32 ones: the products were not lowered"
    );
    Ok(())
}

/// The `transformer` binary: `TRANSFORMER_BIN` where set (a test binary copied to another
/// machine; a relative path is taken from the directory the tests started in, since some
/// tests run the binary in a folder of their own), else the one cargo built beside this test.
fn bin() -> Command {
    match std::env::var_os("TRANSFORMER_BIN") {
        Some(path) => Command::new(std::path::absolute(&path).unwrap_or_else(|_| path.into())),
        None => Command::new(env!("CARGO_BIN_EXE_transformer")),
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cuda-parity-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The copy task's loss column, one per logged step.
fn copy_task_losses(device: &str) -> Vec<f64> {
    let o = bin()
        .args([
            "copy-task",
            "--steps",
            "50",
            "--log-every",
            "1",
            "--device",
            device,
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{device}: {err}");
    assert!(err.contains(&format!("device: {device}")), "{err}");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split(" | ").find_map(|f| f.strip_prefix("loss ")))
        .map(|v| v.parse().unwrap())
        .collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU and the cuda feature; see the file's docs"]
fn the_copy_task_trains_on_cuda_as_on_the_cpu() {
    let cpu = copy_task_losses("cpu");
    let cuda = copy_task_losses("cuda:0");
    assert_eq!(cpu.len(), 50);
    assert_eq!(cuda.len(), 50);
    for (i, (a, b)) in cpu.iter().zip(&cuda).enumerate() {
        // The log prints four decimals.
        assert!(
            (a - b).abs() <= 2e-3,
            "step {}: {a} vs {b}\n{cpu:?}\n{cuda:?}",
            i + 1
        );
    }
}

/// A toy pair for `mt train` (order reversed, one word for one).
fn write_corpus(dir: &Path) {
    let src = ["ein", "hund", "läuft", "zwei", "katzen", "schlafen"];
    let tgt = ["a", "dog", "runs", "two", "cats", "sleep"];
    for (split, n) in [("train", 120), ("valid", 8), ("test", 8)] {
        let (mut s, mut t) = (String::new(), String::new());
        for i in 0..n {
            let len = 2 + (i * 7 + split.len()) % 4;
            let ids: Vec<usize> = (0..len).map(|j| (i * 13 + j * 5 + j * j) % 6).collect();
            s += &(ids.iter().map(|&k| src[k]).collect::<Vec<_>>().join(" ") + " .\n");
            let rev: Vec<&str> = ids.iter().rev().map(|&k| tgt[k]).collect();
            t += &(rev.join(" ") + " .\n");
        }
        std::fs::write(dir.join(format!("{split}.de")), s).unwrap();
        std::fs::write(dir.join(format!("{split}.en")), t).unwrap();
    }
}

/// `mt eval --json` loss of `run` on the toy test split, decoded on `device`.
fn eval_loss(dir: &Path, run: &Path, device: &str) -> f64 {
    let o = bin()
        .current_dir(dir)
        .args([
            "mt", "eval", "--src", "test.de", "--ref", "test.en", "--json", "--run",
        ])
        .arg(run)
        .args(["--device", device])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["loss"].as_f64().unwrap()
}

#[test]
#[ignore = "needs an NVIDIA GPU and the cuda feature; see the file's docs"]
fn runs_move_between_the_cpu_and_the_gpu() {
    let dir = temp_dir("move");
    write_corpus(&dir);
    for device in ["cpu", "cuda:0"] {
        let run = dir.join(format!("run-{device}"));
        let o = bin()
            .current_dir(&dir)
            .args([
                "mt",
                "train",
                "--train-src",
                "train.de",
                "--train-tgt",
                "train.en",
                "--valid-src",
                "valid.de",
                "--valid-tgt",
                "valid.en",
                "--test-src",
                "test.de",
                "--test-tgt",
                "test.en",
                "--vocab-size",
                "50",
                "--d-model",
                "32",
                "--nhead",
                "4",
                "--layers",
                "1",
                "--dim-feedforward",
                "64",
                "--epochs",
                "1",
                "--max-batches",
                "8",
                "--max-tokens",
                "160",
                "--device",
                device,
                "--out",
            ])
            .arg(&run)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{device}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        // Trained on one device, the same weights give the same loss on the other.
        let (on_cpu, on_gpu) = (
            eval_loss(&dir, &run, "cpu"),
            eval_loss(&dir, &run, "cuda:0"),
        );
        assert!(
            (on_cpu - on_gpu).abs() <= 1e-4 * (1.0 + on_cpu.abs()),
            "trained on {device}: loss {on_cpu} on the CPU, {on_gpu} on the GPU"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs an NVIDIA GPU and the cuda feature; see the file's docs"]
fn cpu_only_arithmetic_is_refused_on_the_gpu_saying_what_to_use() {
    let dir = temp_dir("refused");
    let run = dir.join("no-run");
    let o = bin()
        .args([
            "mt",
            "translate",
            "--quantize",
            "int8",
            "--device",
            "cuda:0",
            "--run",
        ])
        .arg(&run)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "--quantize int8: int8 decoding runs on the CPU's int8 kernels, not on cuda:0"
        ),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
