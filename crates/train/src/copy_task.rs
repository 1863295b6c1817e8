//! The Annotated Transformer's copy task: learn to output the source sequence. Random
//! symbols 1..V-1 with the first position fixed to 1 (used as the start symbol), 0 = padding.
//! A model that decodes its inputs back has working embeddings, masks, attention over the
//! memory, training and decoding end to end.

use crate::clip::clip_grad_norm;
use crate::loss::cross_entropy;
use crate::optim::{Adam, NoamSchedule};
use candle_core::{DType, Device, Result, Tensor};
use transformer_model::seq2seq::Seq2SeqMasks;
use transformer_model::{Mode, ParamBuilder, Params, Rng, Seq2Seq, TransformerConfig};

pub const PAD: u32 = 0;
pub const BOS: u32 = 1;

#[derive(Debug, Clone)]
pub struct CopyTaskConfig {
    pub model: TransformerConfig,
    /// Symbols 0..vocab (0 = padding, 1 = start).
    pub vocab: usize,
    /// Sequence length including the start symbol.
    pub seq_len: usize,
    pub batch_size: usize,
    pub steps: usize,
    pub warmup: usize,
    /// Multiplies the Noam learning rate.
    pub lr_factor: f64,
    pub seed: u64,
}

impl Default for CopyTaskConfig {
    fn default() -> Self {
        Self {
            model: TransformerConfig {
                dropout: 0.1,
                ..TransformerConfig::tiny()
            },
            vocab: 11,
            seq_len: 10,
            batch_size: 32,
            steps: 800,
            warmup: 100,
            lr_factor: 1.0,
            seed: 1,
        }
    }
}

/// A batch of random sequences; returned as `(B, seq_len)` u32 ids.
pub fn random_batch(rng: &Rng, cfg: &CopyTaskConfig, device: &Device) -> Result<Tensor> {
    let u = rng.uniform_vec(cfg.batch_size * cfg.seq_len);
    let ids: Vec<u32> = u
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            if i % cfg.seq_len == 0 {
                BOS
            } else {
                1 + (x * (cfg.vocab - 1) as f64) as u32
            }
        })
        .collect();
    Tensor::from_vec(ids, (cfg.batch_size, cfg.seq_len), device)
}

/// A trained model with its parameters and the loss of every step.
pub struct Trained {
    pub model: Seq2Seq,
    pub params: Params,
    pub losses: Vec<f64>,
}

/// Trains from scratch; `on_step(step, loss, lr)` is called after every step.
pub fn train(
    cfg: &CopyTaskConfig,
    device: &Device,
    mut on_step: impl FnMut(usize, f64, f64),
) -> Result<Trained> {
    let pb = ParamBuilder::new(DType::F32, device, cfg.seed);
    let model = Seq2Seq::new(&pb, &cfg.model, cfg.vocab, cfg.vocab)?;
    let params = pb.params();
    let vars = params.vars();
    let mut opt = Adam::new(vars.clone(), 0.0)?;
    let schedule = NoamSchedule {
        d_model: cfg.model.d_model,
        warmup: cfg.warmup,
        factor: cfg.lr_factor,
    };
    let rng = Rng::new(cfg.seed.wrapping_add(1));
    let mut losses = Vec::with_capacity(cfg.steps);
    for step in 1..=cfg.steps {
        let data = random_batch(&rng, cfg, device)?;
        // Teacher forcing: predict tgt[1..] from tgt[..-1]; the source is the whole sequence.
        let t = cfg.seq_len - 1;
        let (tgt_in, tgt_out) = (data.narrow(1, 0, t)?, data.narrow(1, 1, t)?);
        let masks = Seq2SeqMasks::new(&data, &tgt_in, PAD)?;
        let logits = model.forward(&data, &tgt_in, &masks, Mode::Train(&rng))?;
        let (loss, _) = cross_entropy(
            &logits.reshape((cfg.batch_size * t, cfg.vocab))?,
            &tgt_out.flatten_all()?,
            Some(PAD),
        )?;
        let mut grads = loss.backward()?;
        clip_grad_norm(&mut grads, &vars, 1.0)?;
        opt.lr = schedule.lr(step);
        opt.step(&grads)?;
        let loss = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        losses.push(loss);
        on_step(step, loss, opt.lr);
    }
    Ok(Trained {
        model,
        params,
        losses,
    })
}

/// Greedy-decodes `src` (B, seq_len): `seq_len - 1` symbols per row (no end token).
pub fn greedy_copies(model: &Seq2Seq, src: &Tensor) -> Result<Vec<Vec<u32>>> {
    let (_, s) = src.dims2()?;
    let opts = transformer_decode::DecodeOptions {
        beam: 1,
        max_len_a: 0.0,
        max_len_b: s - 1,
        bos: BOS,
        // No end token: every output is s - 1 symbols long (an id that is never produced).
        eos: u32::MAX,
        pad: PAD,
        ..Default::default()
    };
    Ok(transformer_decode::greedy(model, src, &opts)?
        .into_iter()
        .map(|h| h.tokens)
        .collect())
}

/// Greedy-decodes `src` (B, seq_len) and returns the fraction of sequences copied exactly.
pub fn copy_accuracy(model: &Seq2Seq, src: &Tensor) -> Result<f64> {
    let (b, _) = src.dims2()?;
    let decoded = greedy_copies(model, src)?;
    let rows = src.to_vec2::<u32>()?;
    let exact = rows
        .iter()
        .zip(&decoded)
        .filter(|(r, d)| r[1..] == d[..])
        .count();
    Ok(exact as f64 / b as f64)
}
