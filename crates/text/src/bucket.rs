//! Length-bucketed batches of sentence pairs under a token budget, the shape a translation
//! model trains on. The one place where sequences are padded and shifted:
//!
//! - `src` = source tokens, then `<eos>`;
//! - `tgt_in` = `<bos>`, then target tokens (the decoder's input);
//! - `tgt_out` = target tokens, then `<eos>` (what it must predict), so
//!   `tgt_out[t] == tgt_in[t + 1]`;
//! - every row is padded with `<pad>` to the longest row of its batch.
//!
//! Pairs are sorted by length (ties broken by a seeded shuffle), cut into batches whose padded
//! size `rows * max(S, T)` stays within the budget, and the batches are visited in a seeded
//! random order: each batch has little padding and every epoch sees a different order.

use crate::subword::Specials;

/// One padded batch, row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairBatch {
    /// Rows (sentences).
    pub rows: usize,
    /// Source length S (with `<eos>`).
    pub src_len: usize,
    /// Target length T (with `<bos>` / `<eos>`).
    pub tgt_len: usize,
    /// (rows, S) source ids.
    pub src: Vec<u32>,
    /// (rows, T) decoder inputs.
    pub tgt_in: Vec<u32>,
    /// (rows, T) decoder targets.
    pub tgt_out: Vec<u32>,
    /// Target positions that are not padding (the loss's denominator).
    pub tgt_tokens: usize,
    /// Which pairs (indices into the corpus) the rows are.
    pub indices: Vec<usize>,
}

/// SplitMix64: a small seeded generator, this crate's reproducible randomness (it has no
/// RNG dependency); its tests draw their cases from it too.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// The generator started at `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// A 64-bit mixer for the seeded shuffles: [`SplitMix64`]'s first number from seed `z`.
fn mix(z: u64) -> u64 {
    SplitMix64::new(z).next_u64()
}

/// Fisher-Yates with a counter-based generator: the same seed gives the same order.
pub fn shuffle<T>(items: &mut [T], seed: u64) {
    for i in (1..items.len()).rev() {
        let j = (mix(seed ^ mix(i as u64)) % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

/// Groups `indices` (already in the desired order) into runs whose padded size
/// `rows * max_len` stays within `max_tokens` (a single over-long row still forms a batch).
fn cut(indices: &[usize], len: impl Fn(usize) -> usize, max_tokens: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut longest = 0;
    for &i in indices {
        let l = len(i);
        let new_longest = longest.max(l);
        if !cur.is_empty() && (cur.len() + 1) * new_longest > max_tokens {
            out.push(std::mem::take(&mut cur));
            longest = 0;
        }
        longest = longest.max(l);
        cur.push(i);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Training batches over the pairs `keep` of (`src`, `tgt`) (token ids without specials),
/// at most `max_tokens` padded positions per side and batch; `seed` decides the tie-breaking
/// and the order of the batches (pass the epoch in it for a new order each epoch).
pub fn pair_batches(
    src: &[Vec<u32>],
    tgt: &[Vec<u32>],
    keep: &[usize],
    max_tokens: usize,
    specials: Specials,
    seed: u64,
) -> Vec<PairBatch> {
    let mut order = keep.to_vec();
    shuffle(&mut order, seed);
    // Stable sort: equal lengths stay in shuffled order.
    order.sort_by_key(|&i| (src[i].len(), tgt[i].len()));
    let len = |i: usize| src[i].len().max(tgt[i].len()) + 1;
    let mut groups = cut(&order, len, max_tokens.max(1));
    shuffle(&mut groups, mix(seed));
    groups
        .into_iter()
        .map(|g| make_batch(src, tgt, g, specials))
        .collect()
}

/// Pads and shifts the pairs `indices` into one batch.
pub fn make_batch(
    src: &[Vec<u32>],
    tgt: &[Vec<u32>],
    indices: Vec<usize>,
    specials: Specials,
) -> PairBatch {
    let rows = indices.len();
    let end = usize::from(specials.source_end.is_some());
    let s_len = (indices.iter().map(|&i| src[i].len() + end).max())
        .unwrap_or(1)
        .max(1);
    let t_len = indices.iter().map(|&i| tgt[i].len() + 1).max().unwrap_or(1);
    let mut b = PairBatch {
        rows,
        src_len: s_len,
        tgt_len: t_len,
        src: vec![specials.pad; rows * s_len],
        tgt_in: vec![specials.pad; rows * t_len],
        tgt_out: vec![specials.pad; rows * t_len],
        tgt_tokens: 0,
        indices,
    };
    for (r, &i) in b.indices.iter().enumerate() {
        let s = &mut b.src[r * s_len..(r + 1) * s_len];
        s[..src[i].len()].copy_from_slice(&src[i]);
        if let Some(e) = specials.source_end {
            s[src[i].len()] = e;
        }
        let (ti, to) = (
            &mut b.tgt_in[r * t_len..(r + 1) * t_len],
            &mut b.tgt_out[r * t_len..(r + 1) * t_len],
        );
        ti[0] = specials.bos;
        ti[1..=tgt[i].len()].copy_from_slice(&tgt[i]);
        to[..tgt[i].len()].copy_from_slice(&tgt[i]);
        to[tgt[i].len()] = specials.eos;
        b.tgt_tokens += tgt[i].len() + 1;
    }
    b
}

/// Batches of sources for decoding: sorted by length, at most `max_tokens` padded source
/// positions and `max_rows` rows each; returns the indices of each batch (translations are
/// put back in corpus order by the caller).
pub fn source_batches(src: &[Vec<u32>], max_tokens: usize, max_rows: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..src.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(src[i].len()));
    let groups = cut(&order, |i| src[i].len() + 1, max_tokens.max(1));
    groups
        .into_iter()
        .flat_map(|g| {
            g.chunks(max_rows.max(1))
                .map(|c| c.to_vec())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_cover_every_pair_once_within_the_budget_and_shift_by_one() {
        let n = 100;
        let src: Vec<Vec<u32>> = (0..n).map(|i| vec![10 + i as u32; 1 + i % 7]).collect();
        let tgt: Vec<Vec<u32>> = (0..n).map(|i| vec![200 + i as u32; 1 + i % 5]).collect();
        let keep: Vec<usize> = (0..n).filter(|i| i % 10 != 3).collect();
        let sp = Specials::FIXED;
        let batches = pair_batches(&src, &tgt, &keep, 24, sp, 7);
        let mut seen: Vec<usize> = batches.iter().flat_map(|b| b.indices.clone()).collect();
        seen.sort();
        assert_eq!(seen, keep);
        for b in &batches {
            assert!(b.rows * b.src_len.max(b.tgt_len) <= 24 || b.rows == 1);
            for r in 0..b.rows {
                let i = b.indices[r];
                let t = b.tgt_len;
                let (ti, to) = (
                    &b.tgt_in[r * t..(r + 1) * t],
                    &b.tgt_out[r * t..(r + 1) * t],
                );
                assert_eq!(ti[0], sp.bos);
                assert_eq!(&to[..tgt[i].len()], &tgt[i][..]);
                assert_eq!(to[tgt[i].len()], sp.eos);
                for k in 0..t - 1 {
                    if to[k] != sp.eos && to[k] != sp.pad {
                        assert_eq!(ti[k + 1], to[k]);
                    }
                }
                let s = &b.src[r * b.src_len..(r + 1) * b.src_len];
                assert_eq!(s[src[i].len()], sp.eos);
                assert!(s[src[i].len() + 1..].iter().all(|&x| x == sp.pad));
            }
            let counted: usize = b.indices.iter().map(|&i| tgt[i].len() + 1).sum();
            assert_eq!(b.tgt_tokens, counted);
        }
        // Same seed, same batches; another seed, another order.
        assert_eq!(batches, pair_batches(&src, &tgt, &keep, 24, sp, 7));
        assert_ne!(batches, pair_batches(&src, &tgt, &keep, 24, sp, 8));
    }

    #[test]
    fn source_batches_keep_every_sentence() {
        let src: Vec<Vec<u32>> = (0..37).map(|i| vec![5; i % 9]).collect();
        let b = source_batches(&src, 30, 4);
        let mut all: Vec<usize> = b.iter().flatten().copied().collect();
        all.sort();
        assert_eq!(all, (0..37).collect::<Vec<_>>());
        assert!(b.iter().all(|g| g.len() <= 4));
    }
}
