//! A small counter-based random number generator for initialisation and dropout.
//!
//! Written by hand rather than taken from `rand` because of what it must guarantee:
//! candle's CPU `Tensor::rand` cannot be seeded, and a resumable training run needs its whole
//! RNG state as two integers (seed, counter) in the checkpoint. Being counter-based
//! (SplitMix64's finaliser over `seed ^ stream ^ index`), any element of any dropout mask can
//! be regenerated from `(seed, stream, index)` without storing it, which fused kernels can use.

use std::cell::Cell;

/// SplitMix64's output function (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The `index`-th uniform number in [0, 1) of stream `stream` under `seed` (53 random bits).
#[inline]
pub fn uniform_at(seed: u64, stream: u64, index: u64) -> f64 {
    let key = mix64(seed ^ mix64(stream.wrapping_add(0x9e37_79b9_7f4a_7c15)));
    let bits = mix64(key.wrapping_add(index.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A seeded stream of random numbers. Its whole state is `(seed, counter)`; each call that
/// draws a block of numbers (one weight matrix, one dropout mask) takes the next stream.
///
/// Interior mutability lets a shared `&Rng` travel inside the model's `Mode` through a forward
/// pass; the type is deliberately not `Sync`.
#[derive(Debug, Clone)]
pub struct Rng {
    seed: u64,
    counter: Cell<u64>,
}

impl Rng {
    /// A fresh stream for `seed` (counter 0).
    pub fn new(seed: u64) -> Self {
        Self::from_state(seed, 0)
    }

    /// Restores the state saved by [`Rng::state`] (for resumable checkpoints).
    pub fn from_state(seed: u64, counter: u64) -> Self {
        Self {
            seed,
            counter: Cell::new(counter),
        }
    }

    /// `(seed, counter)`: everything needed to continue the sequence exactly.
    pub fn state(&self) -> (u64, u64) {
        (self.seed, self.counter.get())
    }

    /// Takes the next stream id.
    pub fn next_stream(&self) -> u64 {
        let s = self.counter.get();
        self.counter.set(s + 1);
        s
    }

    /// `n` uniform numbers in [0, 1) from a fresh stream.
    pub fn uniform_vec(&self, n: usize) -> Vec<f64> {
        let stream = self.next_stream();
        (0..n as u64)
            .map(|i| uniform_at(self.seed, stream, i))
            .collect()
    }

    /// One uniform number in [0, 1) from a fresh stream.
    pub fn uniform(&self) -> f64 {
        uniform_at(self.seed, self.next_stream(), 0)
    }

    /// A uniform integer in `0..n` (n > 0) from a fresh stream.
    pub fn below(&self, n: usize) -> usize {
        ((self.uniform() * n as f64) as usize).min(n - 1)
    }
}

/// Which elements a mask keeps: `uniform_at(seed, stream, i) >= p`, i.e. the top 53 bits of
/// `mix64(key + i * GOLDEN)` at or above `p * 2^53` (an exact integer comparison: both sides
/// are whole numbers below 2^53).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MaskSpec {
    pub(crate) p: f64,
    pub(crate) key: u64,
    pub(crate) threshold: u64,
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

impl MaskSpec {
    pub(crate) fn new(p: f64, seed: u64, stream: u64) -> Self {
        Self {
            p,
            key: mix64(seed ^ mix64(stream.wrapping_add(GOLDEN))),
            threshold: (p * (1u64 << 53) as f64).ceil() as u64,
        }
    }

    /// The mask's key and threshold, for the GPU kernels that regenerate it.
    #[cfg(feature = "cuda")]
    pub(crate) fn key_threshold(&self) -> (u64, u64) {
        (self.key, self.threshold)
    }

    #[inline(always)]
    pub(crate) fn keep(&self, i: u64) -> bool {
        mix64(self.key.wrapping_add(i.wrapping_mul(GOLDEN))) >> 11 >= self.threshold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_resumable() {
        let a = Rng::new(7);
        let first = a.uniform_vec(5);
        let (seed, counter) = a.state();
        let second = a.uniform_vec(5);
        assert_ne!(first, second);
        let b = Rng::from_state(seed, counter);
        assert_eq!(b.uniform_vec(5), second);
        assert_eq!(Rng::new(7).uniform_vec(5), first);
        assert_ne!(Rng::new(8).uniform_vec(5), first);
    }

    #[test]
    fn roughly_uniform() {
        let v = Rng::new(1).uniform_vec(100_000);
        assert!(v.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let below = v.iter().filter(|&&x| x < 0.2).count() as f64 / v.len() as f64;
        assert!((mean - 0.5).abs() < 0.005, "mean {mean}");
        assert!((below - 0.2).abs() < 0.005, "P(x<0.2) {below}");
    }
}
