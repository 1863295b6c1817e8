//! Times the phases of one training step of the default translation model (3 + 3 layers,
//! d_model 256, 8 heads, FFN 512, joint vocabulary 8000, shared embeddings) on a batch of
//! the default token budget's shape: 200 sentences of 20 source and 20 target tokens.
//! `cargo run --release -p transformer-train --example profile_mt`

use candle_core::{DType, Device, Tensor};
use transformer_model::seq2seq::Seq2SeqMasks;
use transformer_model::Backprop;
use transformer_model::DirectGrads;
use transformer_model::{Mode, ParamBuilder, Rng, Seq2Seq};
use transformer_runtime::config::MtTrainConfig;
use transformer_runtime::model::MtModel;
use transformer_train::clip::clip_grad_norm;
use transformer_train::mt::train_step;
use transformer_train::optim::Adam;
use transformer_train::Gradients;

mod support;
use support::time;

fn main() -> candle_core::Result<()> {
    let dev = Device::Cpu;
    let (b, s, t, vocab) = (200, 20, 20, 8000);
    let cfg = MtTrainConfig::default().model(vocab);
    let pb = ParamBuilder::new(DType::F32, &dev, 1);
    let model = Seq2Seq::with_config(&pb, &cfg)?;
    let params = pb.params();
    let vars = params.vars();
    let ids = |n| -> candle_core::Result<Tensor> {
        let v: Vec<u32> = (0..b * n)
            .map(|i| 4 + (i * 7919 % (vocab - 4)) as u32)
            .collect();
        Tensor::from_vec(v, (b, n), &dev)
    };
    let (src, tgt_in, tgt_out) = (ids(s)?, ids(t)?, ids(t)?);
    let masks = Seq2SeqMasks::new(&src, &tgt_in, 0)?;
    let rng = Rng::new(2);
    let reps = std::env::var("REPS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    time("encode (train mode)", reps, || {
        model
            .encode(&src, Some(&masks.src), Mode::Train(&rng))
            .unwrap()
    });
    let memory = model.encode(&src, Some(&masks.src), Mode::Eval)?;
    time("decoder stack and output layer (eval mode)", reps, || {
        model
            .decode_as(
                &tgt_in,
                &memory,
                Some(&masks.tgt),
                Some(&masks.memory),
                transformer_model::Pass::new(Mode::Eval),
            )
            .unwrap()
    });
    let loss = |eps: f64, mode: Mode, backprop: Backprop| {
        model
            .loss(&src, &tgt_in, &tgt_out, &masks, (0, eps), mode, backprop)
            .unwrap()
    };
    time("loss forward, no smoothing (eval mode)", reps, || {
        loss(0.0, Mode::Eval, Backprop::Graph)
    });
    time("loss forward, smoothing 0.1 (eval mode)", reps, || {
        loss(0.1, Mode::Eval, Backprop::Graph)
    });
    time("loss forward (train mode)", reps, || {
        loss(0.1, Mode::Train(&rng), Backprop::Graph)
    });
    time("loss forward + backward", reps, || {
        let l = loss(0.1, Mode::Train(&rng), Backprop::Graph);
        l.loss.backward().unwrap()
    });
    let mut opt = Adam::new(vars.clone(), 1e-4)?;
    time("whole step, graph gradients (+ clip, Adam)", reps, || {
        let l = loss(0.1, Mode::Train(&rng), Backprop::Graph);
        let mut g = Gradients::backward(&l.loss, &vars).unwrap();
        clip_grad_norm(&mut g, 1.0).unwrap();
        opt.step(&g, 1.0).unwrap();
    });
    let direct = DirectGrads::new();
    time("loss forward + backward, direct gradients", reps, || {
        let l = loss(0.1, Mode::Train(&rng), Backprop::Direct(&direct));
        drop(Gradients::from_backward(&l.loss, &vars, &direct).unwrap());
    });
    let mt_model = MtModel::from(model.clone());
    time(
        "whole step as training takes it (mt::train_step)",
        reps,
        || {
            train_step(
                &mt_model,
                &vars,
                &mut opt,
                &direct,
                1.0,
                [&src, &tgt_in, &tgt_out],
                0,
                0.1,
                &rng,
            )
            .unwrap();
        },
    );
    let l = loss(0.1, Mode::Train(&rng), Backprop::Graph);
    let mut g = Gradients::backward(&l.loss, &vars)?;
    time("clip", reps, || clip_grad_norm(&mut g, 1.0).unwrap());
    time("Adam (three in-place passes)", reps, || {
        opt.step(&g, 1.0).unwrap()
    });
    time("Adam, composed (the textbook form)", reps, || {
        opt.step_reference(&g).unwrap()
    });
    Ok(())
}
