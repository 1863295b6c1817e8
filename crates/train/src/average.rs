//! An exponential moving average of the weights (Polyak & Juditsky 1992; as a running
//! average of SGD iterates, the "averaged SGD" readout of Merity et al. 2018).
//!
//! SGD at the tutorial's learning rate 5 moves the weights a long way at every step, so the
//! model at any one step (the end of an epoch, where the tutorial evaluates) is a noisy draw
//! around the region the iterates wander in; the average of recent iterates sits nearer its
//! middle and usually predicts better. Averaging is a read-out: it never feeds back into
//! training, so the training trajectory (every step's loss) is the same with or without it.
//!
//! The average is kept in a second model of the same shape, updated in place after every
//! `every`-th optimizer step:
//!
//! ```text
//! avg <- avg + (1 - d) * (w - avg),   d = min(decay^every, n / (n + 1))
//! ```
//!
//! where `n` counts the updates before this one. The `n / (n + 1)` bound makes the first
//! `1 / (1 - decay)` or so updates a plain mean of the iterates seen so far (so the random
//! initial weights do not linger with weight `decay^n`), after which it is the exponential
//! average of horizon about `1 / (1 - decay)` steps.

use crate::error::Result;
use candle_core::{DType, Tensor, Var};
use std::collections::HashMap;
use transformer_model::{ParamBuilder, Params};

/// Prefix of the average's tensors in a checkpoint (`average.<parameter name>`).
pub const CHECKPOINT_PREFIX: &str = transformer_runtime::run_dir::AVERAGE_PREFIX;

/// The moving average of a model's weights, itself a model (`M`: a language model, a
/// translation model) that evaluates and decodes like the one it averages.
pub struct WeightAverage<M> {
    /// Per optimizer step.
    pub decay: f64,
    /// Optimizer steps between updates.
    pub every: usize,
    /// Updates made so far.
    pub updates: u64,
    /// The averaged model; evaluate or decode with it.
    pub model: M,
    /// The averaged model's parameters (the average itself), updated in place.
    pub params: Params,
}

impl<M> WeightAverage<M> {
    /// An average that starts at the weights in `start`; `build` makes a second model of the
    /// same configuration (the parameters it registers are overwritten from `start`, in
    /// registration order).
    pub fn new(
        start: &Params,
        decay: f64,
        every: usize,
        build: impl FnOnce(&ParamBuilder) -> transformer_model::Result<M>,
    ) -> Result<Self> {
        let device = start
            .iter()
            .next()
            .map_or(candle_core::Device::Cpu, |(_, v)| v.device().clone());
        let pb = ParamBuilder::new(DType::F32, &device, 0);
        let model = build(&pb)?;
        let params = pb.params();
        for ((_, a), (_, w)) in params.iter().zip(start.iter()) {
            a.set(w.as_tensor())?;
        }
        Ok(Self {
            decay,
            every: every.max(1),
            updates: 0,
            model,
            params,
        })
    }

    /// The average's tensors as a checkpoint stores them (`average.<name>`).
    pub fn checkpoint_tensors(&self) -> Vec<(String, Tensor)> {
        crate::checkpoint::params_tensors(&self.params)
            .into_iter()
            .map(|(n, t)| (format!("{CHECKPOINT_PREFIX}{n}"), t))
            .collect()
    }

    /// Restores the average from a checkpoint's tensors (taking the `average.*` ones out of
    /// `tensors`) as it stood after optimizer step `step`: it has been updated after every
    /// `every`-th step since step 0.
    pub fn restore(
        &mut self,
        tensors: &mut HashMap<String, Tensor>,
        step: usize,
        path: &std::path::Path,
    ) -> Result<()> {
        let saved = take_average(tensors);
        self.params
            .assign(&saved)
            .map_err(|e| crate::error::Error::Checkpoint {
                path: path.into(),
                msg: format!("the weight average: {e}"),
            })?;
        self.updates = (step / self.every) as u64;
        Ok(())
    }

    /// The weight the average keeps at the next update.
    fn keep(&self) -> f64 {
        let n = self.updates as f64;
        self.decay.powi(self.every as i32).min(n / (n + 1.0))
    }

    /// Call after every optimizer step (`step` counts them from 1); updates the average from
    /// `weights` on every `every`-th one.
    pub fn after_step(&mut self, step: usize, weights: &Params) -> Result<()> {
        if !step.is_multiple_of(self.every) {
            return Ok(());
        }
        let rate = 1.0 - self.keep();
        for ((_, a), (_, w)) in self.params.iter().zip(weights.iter()) {
            toward_in_place(a, w.as_tensor(), rate)?;
        }
        self.updates += 1;
        Ok(())
    }
}

/// Takes a checkpoint's `average.*` tensors out of `tensors`, under the parameters' names.
pub fn take_average(tensors: &mut HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    tensors
        .extract_if(|name, _| name.starts_with(CHECKPOINT_PREFIX))
        .map(|(name, t)| (name[CHECKPOINT_PREFIX.len()..].to_string(), t))
        .collect()
}

/// `avg += rate * (w - avg)`, in place on contiguous CPU f32 tensors (one pass, no
/// allocation); through candle's ops elsewhere.
fn toward_in_place(avg: &Var, w: &Tensor, rate: f64) -> Result<()> {
    let r = rate as f32;
    let toward = crate::par::ZipInPlace {
        name: "toward",
        f32: |d: &mut [f32], s: &[f32]| d.iter_mut().zip(s).for_each(|(a, w)| *a += r * (*w - *a)),
        f64: None::<fn(&mut [f64], &[f64])>,
    };
    if toward.runs_in_place(avg, w) {
        avg.as_tensor().inplace_op2(w, &toward)?;
    } else {
        let a = avg.as_tensor();
        avg.set(&(a + ((w - a)? * rate)?)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use transformer_model::{LmConfig, Rng, TransformerLm};

    fn flat(params: &Params) -> Vec<f64> {
        params
            .iter()
            .flat_map(|(_, v)| {
                v.as_tensor()
                    .flatten_all()
                    .and_then(|t| t.to_dtype(DType::F64))
                    .and_then(|t| t.to_vec1::<f64>())
                    .unwrap()
            })
            .collect()
    }

    /// The average against the module doc's formula computed in f64 over the same iterates,
    /// with updates on every `every`-th step only and a plain mean while `n / (n + 1)` is
    /// below `decay^every`.
    #[test]
    fn average_follows_its_formula() -> Result<()> {
        let cfg = LmConfig {
            ntoken: 11,
            d_model: 8,
            nhead: 2,
            d_hid: 12,
            nlayers: 1,
            ..LmConfig::default()
        };
        let pb = ParamBuilder::new(DType::F32, &Device::Cpu, 3);
        TransformerLm::new(&pb, &cfg)?;
        let weights = pb.params();
        let (decay, every) = (0.9, 3);
        let mut avg =
            WeightAverage::new(&weights, decay, every, |pb| TransformerLm::new(pb, &cfg))?;
        let mut reference = flat(&weights);
        let rng = Rng::new(9);
        let mut n = 0f64;
        for step in 1..=40usize {
            // A new iterate: every weight moves by a random amount.
            for (_, v) in weights.iter() {
                let t = v.as_tensor();
                let noise: Vec<f32> = (0..t.elem_count())
                    .map(|_| (rng.uniform() as f32 - 0.5) * 0.2)
                    .collect();
                v.set(&(t + Tensor::from_vec(noise, t.dims(), t.device())?)?)?;
            }
            avg.after_step(step, &weights)?;
            if step % every == 0 {
                let keep = decay.powi(every as i32).min(n / (n + 1.0));
                for (r, w) in reference.iter_mut().zip(flat(&weights)) {
                    *r += (1.0 - keep) * (w - *r);
                }
                n += 1.0;
            }
        }
        assert_eq!(avg.updates, 13);
        let got = flat(&avg.params);
        let worst = got
            .iter()
            .zip(&reference)
            .map(|(g, r)| (g - r).abs())
            .fold(0f64, f64::max);
        assert!(
            worst < 1e-5,
            "largest difference from the f64 formula {worst:e}"
        );
        // It is an average, not the last iterate.
        let last = flat(&weights);
        let apart = got
            .iter()
            .zip(&last)
            .filter(|(g, w)| (*g - *w).abs() > 1e-3)
            .count();
        assert!(apart > got.len() / 2, "{apart} of {} differ", got.len());
        Ok(())
    }
}
