//! Training one model in several processes (data parallelism), and gradient accumulation in
//! one: the global batch, the sum of gradients across batches and processes, and the checks
//! that every process trains the same run.
//!
//! A *global batch* is `G` consecutive batches of an epoch's batch list (each batch bounded
//! by the token budget, so batches carry similar numbers of tokens); one optimizer step
//! follows each global batch. `G = accumulate x processes`: process `r` takes batches
//! `r * accumulate .. (r + 1) * accumulate` of each global batch, computes their gradients
//! and adds them up, each weighted by its number of target tokens; the sums of all
//! processes are added ([`Collective::sum_f32`]) and divided by the global batch's target
//! tokens (fairseq's rule: the gradient of the token-summed loss over the global batch, not a
//! mean of per-batch means). Clipping and the optimizer step then run on every process on
//! the same numbers, so the weights stay replicated. One process with `--accumulate G` and
//! `N` processes with `--accumulate G/N` add the same terms, in another order only.
//!
//! Dropout in a global batch draws from a stream derived from the run's dropout seed, the
//! step and the batch's position in the global batch ([`micro_rng`]): a run is reproducible
//! for a given global batch, whatever the number of processes.
//!
//! With `G = 1` (no accumulation, one process) the runner applies the task's
//! [`crate::runner::Task::backward`] with [`crate::runner::Task::update`] directly, and none
//! of this runs.

use crate::error::{Error, Result};
use crate::grads::Gradients;
use candle_core::{backprop::GradStore, Tensor, Var};
use std::collections::HashMap;
use std::rc::Rc;
use transformer_model::rng::mix64;
use transformer_model::Rng;

/// The processes of a data-parallel run and the operations the training loop needs between
/// them. Every method is collective: every process calls it, in the same order. The MPI
/// implementation lives in the `transformer` binary (cargo feature `mpi`); a failure inside
/// one aborts the whole job.
pub trait Collective {
    /// This process's rank, `0..size`.
    fn rank(&self) -> usize;
    /// The number of processes.
    fn size(&self) -> usize;
    /// Replaces `buf` on every process by the element-wise sum of every process's `buf`.
    fn sum_f32(&self, buf: &mut [f32]);
    /// Replaces `buf` on every process by the element-wise sum of every process's `buf`.
    fn sum_f64(&self, buf: &mut [f64]);
    /// Every process's `value`, in rank order.
    fn gather_u64(&self, value: u64) -> Vec<u64>;
    /// Every process's `bytes`, in rank order.
    fn gather_bytes(&self, bytes: &[u8]) -> Vec<Vec<u8>>;
}

/// The processes a run trains in: one (the default), or the ranks of a [`Collective`].
#[derive(Clone, Default)]
pub struct Dist(Option<Rc<dyn Collective>>);

impl std::fmt::Debug for Dist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Dist(rank {} of {})", self.rank(), self.size())
    }
}

impl Dist {
    /// One process.
    pub fn single() -> Self {
        Self(None)
    }

    /// The processes of `c`.
    pub fn new(c: Rc<dyn Collective>) -> Self {
        Self(Some(c))
    }

    /// This process's rank (0 alone).
    pub fn rank(&self) -> usize {
        self.0.as_ref().map_or(0, |c| c.rank())
    }

    /// The number of processes.
    pub fn size(&self) -> usize {
        self.0.as_ref().map_or(1, |c| c.size())
    }

    /// Whether this process writes the run's files (rank 0).
    pub fn writes(&self) -> bool {
        self.rank() == 0
    }

    /// Element-wise sum across processes (nothing to do alone).
    pub fn sum_f32(&self, buf: &mut [f32]) {
        if let Some(c) = &self.0 {
            c.sum_f32(buf)
        }
    }

    /// Element-wise sum across processes (nothing to do alone).
    pub fn sum_f64(&self, buf: &mut [f64]) {
        if let Some(c) = &self.0 {
            c.sum_f64(buf)
        }
    }

    /// This process's share of `n` items split into contiguous ranges in rank order, the
    /// first `n % size` ranks one item more (all of them alone).
    pub fn shard(&self, n: usize) -> std::ops::Range<usize> {
        let (size, rank) = (self.size(), self.rank());
        let (base, extra) = (n / size, n % size);
        let start = rank * base + rank.min(extra);
        start..start + base + usize::from(rank < extra)
    }

    /// Waits until every process has come here (nothing to do alone).
    pub fn barrier(&self) {
        if let Some(c) = &self.0 {
            c.gather_u64(0);
        }
    }

    /// Every process's `lines` joined in rank order (`lines` alone).
    pub fn gather_lines(&self, lines: Vec<String>) -> Result<Vec<String>> {
        let Some(c) = &self.0 else { return Ok(lines) };
        let bytes = serde_json::to_vec(&lines).expect("strings serialize");
        let mut all = Vec::new();
        for b in c.gather_bytes(&bytes) {
            let part: Vec<String> = serde_json::from_slice(&b)
                .map_err(|e| Error::Usage(format!("gathering lines across ranks: {e}")))?;
            all.extend(part);
        }
        Ok(all)
    }

    /// Checks that every process has the same `value` (a hash of `what`); on every process
    /// alike, an error naming the first rank that differs from rank 0 and `fix`.
    pub fn check_same(&self, what: &str, value: u64, fix: &str) -> Result<()> {
        let Some(c) = &self.0 else { return Ok(()) };
        let all = c.gather_u64(value);
        match all.iter().position(|&v| v != all[0]) {
            None => Ok(()),
            Some(r) => Err(Error::Usage(format!(
                "rank {r}'s {what} differs from rank 0's ({:016x} against {:016x}); {fix}",
                all[r], all[0]
            ))),
        }
    }
}

/// A 64-bit hash of `bytes` (stable across processes and machines).
pub fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h = 0x9e37_79b9_7f4a_7c15u64 ^ bytes.len() as u64;
    for c in bytes.chunks(8) {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        h = mix64(h ^ u64::from_le_bytes(w));
    }
    h
}

/// A hash of the values of `vars` (the model's weights).
pub fn hash_vars(vars: &[Var]) -> Result<u64> {
    let mut h = 0u64;
    for v in vars {
        let x = v
            .as_tensor()
            .flatten_all()?
            .to_dtype(candle_core::DType::F32)?
            .to_vec1::<f32>()?;
        let bytes: Vec<u8> = x.iter().flat_map(|f| f.to_le_bytes()).collect();
        h = mix64(h ^ hash_bytes(&bytes));
    }
    Ok(h)
}

/// The dropout stream of batch `micro` (its position in the global batch) at optimizer step
/// `step`, from the run's dropout seed.
pub fn micro_rng(dropout_seed: u64, step: usize, micro: usize) -> Rng {
    Rng::new(mix64(
        dropout_seed ^ mix64(((step as u64) << 20) ^ micro as u64 ^ 0xd15c_0000_0000_0000),
    ))
}

/// The batches of the global batch starting at batch `start` (of `batches`) that process
/// `rank` computes, `accumulate` per process.
pub fn local_batches(
    start: usize,
    batches: usize,
    global: usize,
    accumulate: usize,
    rank: usize,
) -> std::ops::Range<usize> {
    let end = (start + global).min(batches);
    let a = (start + rank * accumulate).min(end);
    let b = (a + accumulate).min(end);
    a..b
}

/// The gradient sum of one global batch on one process: every trainable variable's
/// gradient in one flat `f32` buffer (the variables' order), whether it had one, and the
/// token-weighted loss sums.
pub struct Accumulator {
    vars: Vec<Var>,
    offsets: HashMap<candle_core::TensorId, (usize, usize)>,
    /// The weighted gradient sum, all variables back to back.
    pub flat: Vec<f32>,
    /// Per variable (then loss, nll and a stop flag): 1 where this process has a gradient.
    pub extra: Vec<f64>,
}

impl Accumulator {
    /// Zero sums for `vars`.
    pub fn new(vars: &[Var]) -> Self {
        let mut offsets = HashMap::new();
        let mut n = 0;
        for (i, v) in vars.iter().enumerate() {
            offsets.insert(v.as_tensor().id(), (n, i));
            n += v.elem_count();
        }
        Self {
            vars: vars.to_vec(),
            offsets,
            flat: vec![0.0; n],
            extra: vec![0.0; vars.len() + 3],
        }
    }

    /// Clears the sums for the next global batch.
    pub fn clear(&mut self) {
        self.flat.iter_mut().for_each(|x| *x = 0.0);
        self.extra.iter_mut().for_each(|x| *x = 0.0);
    }

    /// Adds `tokens` x one batch's gradients (of its mean loss per token), and `tokens` x its
    /// loss and nll.
    pub fn add(&mut self, grads: &mut Gradients, tokens: usize, loss: f64, nll: f64) -> Result<()> {
        let w = tokens as f32;
        let (flat, extra, offsets) = (&mut self.flat, &mut self.extra, &self.offsets);
        grads.for_each_mut(|v, g| {
            let Some(&(off, i)) = offsets.get(&v.as_tensor().id()) else {
                candle_core::bail!("accumulate: a gradient of an unknown variable");
            };
            flat[off..off + g.len()]
                .iter_mut()
                .zip(g.iter())
                .for_each(|(a, x)| *a += w * x);
            extra[i] = 1.0;
            Ok(())
        })?;
        let n = self.vars.len();
        self.extra[n] += tokens as f64 * loss;
        self.extra[n + 1] += tokens as f64 * nll;
        Ok(())
    }

    /// Sets the stop flag this process votes with.
    pub fn vote_stop(&mut self, stop: bool) {
        let n = self.vars.len();
        self.extra[n + 2] = if stop { 1.0 } else { 0.0 };
    }

    /// Sums across `dist` and divides by the global batch's `tokens`: the gradients of the
    /// mean loss per token of the global batch (variables no process had a gradient for
    /// left out), that loss and nll, whether any process asked to stop, and the seconds
    /// spent in the sums (waiting for the other processes included).
    pub fn reduce(&mut self, dist: &Dist, tokens: usize) -> Result<Reduced> {
        let t = std::time::Instant::now();
        dist.sum_f32(&mut self.flat);
        dist.sum_f64(&mut self.extra);
        let seconds = t.elapsed().as_secs_f64();
        let inv = 1.0 / tokens.max(1) as f32;
        let mut store = GradStore::default();
        let mut off = 0;
        for (i, v) in self.vars.iter().enumerate() {
            let n = v.elem_count();
            if self.extra[i] > 0.0 {
                let g: Vec<f32> = self.flat[off..off + n].iter().map(|x| x * inv).collect();
                let t = Tensor::from_vec(g, v.shape(), v.device())?.to_dtype(v.dtype())?;
                store.insert(v.as_tensor(), t);
            }
            off += n;
        }
        let n = self.vars.len();
        let t = tokens.max(1) as f64;
        let grads = Gradients::from_parts(
            store,
            &self.vars,
            &transformer_model::grads::DirectGrads::new(),
        )?;
        Ok(Reduced {
            grads,
            loss: self.extra[n] / t,
            nll: self.extra[n + 1] / t,
            stop: self.extra[n + 2] > 0.0,
            seconds,
        })
    }
}

/// A global batch's sums, as [`Accumulator::reduce`] returns them.
pub struct Reduced {
    /// The gradients of the global batch's mean loss per target token.
    pub grads: Gradients,
    /// The global batch's mean loss per target token.
    pub loss: f64,
    /// Its plain cross-entropy per target token.
    pub nll: f64,
    /// Whether a process asked to stop (Ctrl-C).
    pub stop: bool,
    /// Seconds spent in the sums across processes.
    pub seconds: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_every_item_once_in_rank_order() {
        struct Fake(usize, usize);
        impl Collective for Fake {
            fn rank(&self) -> usize {
                self.0
            }
            fn size(&self) -> usize {
                self.1
            }
            fn sum_f32(&self, _: &mut [f32]) {}
            fn sum_f64(&self, _: &mut [f64]) {}
            fn gather_u64(&self, v: u64) -> Vec<u64> {
                vec![v]
            }
            fn gather_bytes(&self, b: &[u8]) -> Vec<Vec<u8>> {
                vec![b.to_vec()]
            }
        }
        for (n, size) in [(10, 3), (2, 4), (0, 2), (7, 1)] {
            let all: Vec<usize> = (0..size)
                .flat_map(|r| Dist::new(Rc::new(Fake(r, size))).shard(n))
                .collect();
            assert_eq!(all, (0..n).collect::<Vec<_>>(), "{n} items on {size} ranks");
        }
    }

    #[test]
    fn local_batches_split_a_global_batch_by_rank() {
        // 2 ranks x 2 batches: rank 0 takes 4..6, rank 1 6..8.
        assert_eq!(local_batches(4, 10, 4, 2, 0), 4..6);
        assert_eq!(local_batches(4, 10, 4, 2, 1), 6..8);
        // The epoch's last global batch is short: rank 1 gets 1 batch, then none.
        assert_eq!(local_batches(8, 9, 4, 2, 0), 8..9);
        assert_eq!(local_batches(8, 9, 4, 2, 1), 9..9);
    }

    #[test]
    fn accumulated_gradients_are_the_token_weighted_mean() -> Result<()> {
        use candle_core::Device;
        let w = Var::new(&[1.0f32, 2.0], &Device::Cpu)?;
        let vars = vec![w.clone()];
        let mut acc = Accumulator::new(&vars);
        // Batch 1: loss = sum(w * [1, 0]) over 3 tokens; batch 2: sum(w * [0, 1]), 1 token.
        for (c, tokens) in [([1.0f32, 0.0], 3usize), ([0.0, 1.0], 1)] {
            let c = Tensor::new(&c, &Device::Cpu)?;
            let loss = (w.as_tensor() * c)?.sum_all()?;
            let mut g = Gradients::backward(&loss, &vars)?;
            acc.add(&mut g, tokens, 1.0, 1.0)?;
        }
        let r = acc.reduce(&Dist::single(), 4)?;
        let g = r.grads.get(&w)?.expect("gradient").to_vec1::<f32>()?;
        assert_eq!(g, vec![0.75, 0.25]);
        assert!((r.loss - 1.0).abs() < 1e-12 && !r.stop);
        Ok(())
    }
}
