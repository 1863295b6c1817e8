//! Times the phases of the tutorial LM's evaluation forward and training step.
//! `cargo run --release -p transformer-train --example profile_lm`
//! (`PRECISION=bf16`: the loss's products on AMX; `STEPS=N`: only N untimed training steps,
//! or with `EVAL=1` N evaluation forwards, with `ENCODER=1` N encoder forwards + backwards.)

use candle_core::{DType, Device, Tensor, Var};
use std::time::Instant;
use transformer_model::backend::{Backprop, Pass};
use transformer_model::encoder::Encoder;
use transformer_model::stack::LayerSpec;
use transformer_model::{
    Activation, DirectGrads, LmConfig, Mask, Mode, ParamBuilder, Rng, TransformerLm,
};
use transformer_train::lm::LmStep;

mod support;
use support::time;

/// The tutorial LM's encoder stack (2 post-norm ReLU layers, d_model 200, 2 heads, d_hid
/// 200, dropout 0.2), on its own so that its paths can be timed apart.
struct EncoderBench {
    enc: Encoder,
    /// (B, T, C), a variable so that its gradient is asked for, as the embedding's is.
    x: Var,
    mask: Mask,
    /// The cotangent of the output.
    cot: Tensor,
    direct: DirectGrads,
}

impl EncoderBench {
    fn new(b: usize, t: usize) -> candle_core::Result<Self> {
        let dev = Device::Cpu;
        let pb = ParamBuilder::new(DType::F32, &dev, 3);
        let spec = LayerSpec {
            d_model: 200,
            nhead: 2,
            dim_feedforward: 200,
            dropout: 0.2,
            activation: Activation::Relu,
            layer_norm_eps: 1e-5,
            norm_first: false,
        };
        Ok(Self {
            enc: Encoder::new(&pb.pp("enc"), &spec, 2, false)?,
            x: Var::from_tensor(&Tensor::randn(0f32, 1f32, (b, t, 200), &dev)?)?,
            mask: Mask::causal(t, &dev)?,
            cot: Tensor::randn(0f32, 1f32, (b, t, 200), &dev)?,
            direct: DirectGrads::new(),
        })
    }

    /// Training forward + backward as the trainer runs it: each layer one fused op, the
    /// parameters' gradients into `DirectGrads`.
    fn fused(&self, rng: &Rng) -> candle_core::Result<candle_core::backprop::GradStore> {
        self.direct.clear();
        let direct = Backprop::Direct(&self.direct);
        let pass = Pass::new(Mode::Train(rng)).backprop(direct);
        let (y, _) = self.enc.forward_as(&self.x, Some(&self.mask), pass)?;
        (y * &self.cot)?.sum_all()?.backward()
    }

    /// The same through candle's graph of the fused small ops (`loss.backward()`).
    fn composed(&self, rng: &Rng) -> candle_core::Result<candle_core::backprop::GradStore> {
        let y = self
            .enc
            .forward(&self.x, Some(&self.mask), Mode::Train(rng))?;
        (y * &self.cot)?.sum_all()?.backward()
    }
}

fn main() -> candle_core::Result<()> {
    // The process settings of the `transformer` command's training.
    transformer_train::runtime::configure(true);
    // PRECISION=bf16: the training loss's products in bf16 on AMX.
    let precision: transformer_model::Precision = std::env::var("PRECISION")
        .unwrap_or_else(|_| "f32".into())
        .parse()
        .expect("PRECISION is f32 or bf16");
    let dev = Device::Cpu;
    let pb = ParamBuilder::new(DType::F32, &dev, 0).with_precision(precision);
    let cfg = LmConfig {
        ntoken: 28782,
        ..LmConfig::default()
    };
    let model = TransformerLm::new(&pb, &cfg)?;
    let params = pb.params();
    let rng = Rng::new(1);
    // STEPS=N: only N full training steps at 20 x 35, untimed (for `perf record`).
    if let Some(steps) = std::env::var("STEPS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
    {
        let ids = Tensor::from_vec(
            (0..700)
                .map(|i| (i * 7919 % 28782) as u32)
                .collect::<Vec<_>>(),
            (20, 35),
            &dev,
        )?;
        if std::env::var("ENCODER").is_ok_and(|v| v == "1") {
            // ENCODER=1: the encoder alone in training mode, forward + backward, as the
            // trainer runs it.
            let bench = EncoderBench::new(20, 35)?;
            for _ in 0..steps {
                bench.fused(&rng)?;
            }
            return Ok(());
        }
        if std::env::var("EVAL").is_ok_and(|v| v == "1") {
            // EVAL=1: evaluation forwards on the tutorial's 10 x 35 instead.
            let ids = ids.narrow(0, 0, 10)?;
            for _ in 0..steps {
                model.loss(&ids, &ids, Mode::Eval, Backprop::Off)?;
            }
            return Ok(());
        }
        // The trainer's step at lr 0 (the weights stay put).
        let mut step = LmStep::new(params.vars(), 0.0, 0.5);
        for _ in 0..steps {
            let t = Instant::now();
            step.run(&model, &ids, &ids, &rng).unwrap();
            if std::env::var_os("VERBOSE").is_some() {
                eprintln!("step {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
            }
        }
        return Ok(());
    }
    for (b, t) in [(10usize, 35usize), (20, 35)] {
        let ids = Tensor::from_vec(
            (0..b * t)
                .map(|i| (i * 7919 % 28782) as u32)
                .collect::<Vec<_>>(),
            (b, t),
            &dev,
        )?;
        let targets = ids.clone();
        println!("batch {b} x {t}");
        // What the step and evaluation spend outside the loss.
        let enc = EncoderBench::new(b, t)?;
        time("  encoder (eval, composed)", 5, || {
            enc.enc
                .forward(&enc.x, Some(&enc.mask), Mode::Eval)
                .unwrap()
        });
        time("  encoder (eval, fused layers, no graph)", 5, || {
            enc.enc
                .forward_as(
                    &enc.x,
                    Some(&enc.mask),
                    Pass::new(Mode::Eval).backprop(Backprop::Off),
                )
                .unwrap()
        });
        time("  encoder (train) fwd+bwd, composed", 5, || {
            enc.composed(&rng).unwrap()
        });
        time("  encoder (train) fwd, fused layers", 5, || {
            enc.direct.clear();
            enc.enc
                .forward_as(
                    &enc.x,
                    Some(&enc.mask),
                    Pass::new(Mode::Train(&rng)).backprop(Backprop::Direct(&enc.direct)),
                )
                .unwrap()
        });
        time("  encoder (train) fwd+bwd, fused layers", 5, || {
            enc.fused(&rng).unwrap()
        });
        time("  loss (eval, fused)", 5, || {
            model
                .loss(&ids, &targets, Mode::Eval, Backprop::Graph)
                .unwrap()
        });
        time("  logits (eval, unfused)", 5, || {
            model.forward(&ids, Mode::Eval).unwrap()
        });
        // The training loss through candle's graph, in the model's precision.
        let train_loss = || {
            model
                .loss(&ids, &targets, Mode::Train(&rng), Backprop::Graph)
                .unwrap()
        };
        time("  loss (train) forward", 5, &train_loss);
        time("  loss (train) forward+backward", 5, || {
            train_loss().backward().unwrap()
        });
        let vars = params.vars();
        let loss = train_loss();
        let grads = transformer_train::Gradients::backward(&loss, &vars).unwrap();
        time("  clip + sgd (in place)", 5, || {
            let (_, coef) = transformer_train::clip::clip_coefficient(&grads, 0.5).unwrap();
            let mut sgd = transformer_train::Sgd::new(vars.clone(), 0.0);
            sgd.step(&grads, coef).unwrap();
        });
        time("  full step, all gradients in GradStore", 5, || {
            let loss = train_loss();
            let g = transformer_train::Gradients::backward(&loss, &vars).unwrap();
            let (_, coef) = transformer_train::clip::clip_coefficient(&g, 0.5).unwrap();
            let mut sgd = transformer_train::Sgd::new(vars.clone(), 0.0);
            sgd.step(&g, coef).unwrap();
        });
        // The weight average's update, which `transformer lm train` makes every
        // AVERAGE_EVERY-th step (so its cost per step is this divided by that).
        let mut avg = transformer_train::average::WeightAverage::new(&params, 0.999, 1, |pb| {
            TransformerLm::new(pb, &cfg)
        })
        .unwrap();
        let mut n = 0;
        time("  weight average update (one)", 5, || {
            n += 1;
            avg.after_step(n, &params).unwrap()
        });
        // What `transformer lm train` runs (lr 0: the weights stay put).
        let mut step = LmStep::new(vars.clone(), 0.0, 0.5);
        time("  full step, trainer's (direct gradients)", 5, || {
            step.run(&model, &ids, &targets, &rng).unwrap()
        });
    }
    Ok(())
}
