//! Which rows of a padded batch of sequences the fused layers compute ([`Rows`]: a group's
//! real rows, one sequence after another, padding left out), and the check that leaving the
//! padding out is exact for a given attention mask ([`check_lengths`]).

use super::float::Float;
use std::borrow::Cow;

/// Which rows of a group of sequences the sub-layers compute, and where they lie: sequence
/// `s0 + j` of the batch (padded to `t` rows) has `len(j)` real rows, its first ones. The
/// group's buffers hold only real rows, one sequence after another; padding rows are not
/// computed. Dropout masks stay indexed by the padded batch's elements, so a row draws the
/// same mask bits with or without the padding rows beside it.
#[derive(Debug, Clone)]
pub(super) struct Rows {
    s0: usize,
    t: usize,
    /// Where each sequence's rows start in the group's buffers; one more entry at the end
    /// (the row count).
    offs: Vec<usize>,
}

impl Rows {
    /// `ns` sequences from `s0`, all `t` rows real.
    pub(super) fn full(s0: usize, ns: usize, t: usize) -> Self {
        Self {
            s0,
            t,
            offs: (0..=ns).map(|j| j * t).collect(),
        }
    }

    /// Sequences `s0 ..` with `lens` real rows each (at most `t`).
    pub(super) fn new(s0: usize, t: usize, lens: &[usize]) -> Self {
        let mut offs = Vec::with_capacity(lens.len() + 1);
        let mut at = 0;
        offs.push(at);
        for &l in lens {
            debug_assert!(l <= t);
            at += l;
            offs.push(at);
        }
        Self { s0, t, offs }
    }

    /// The group's sequences from `s0`: [`Self::full`] without `lens`, else its slice.
    pub(super) fn of_group(s0: usize, ns: usize, t: usize, lens: Option<&[usize]>) -> Self {
        match lens {
            Some(l) => Self::new(s0, t, &l[s0..s0 + ns]),
            None => Self::full(s0, ns, t),
        }
    }

    /// Sequences in the group.
    pub(super) fn seqs(&self) -> usize {
        self.offs.len() - 1
    }

    /// Real rows in the group.
    pub(super) fn n(&self) -> usize {
        self.offs[self.seqs()]
    }

    /// The first sequence's index in the batch.
    pub(super) fn s0(&self) -> usize {
        self.s0
    }

    /// The padded length.
    pub(super) fn t(&self) -> usize {
        self.t
    }

    /// Whether every row is real (the buffers are the padded batch's rows).
    pub(super) fn is_full(&self) -> bool {
        self.n() == self.seqs() * self.t
    }

    /// Sequence `j`'s first row in the group's buffers and its real rows.
    pub(super) fn seq(&self, j: usize) -> (usize, usize) {
        (self.offs[j], self.offs[j + 1] - self.offs[j])
    }

    /// Runs of rows contiguous in both layouts: `(first row in the group's buffers, rows,
    /// the row's index in the padded batch)`; one run when every row is real.
    pub(super) fn runs(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let full = self.is_full();
        let count = if full { 1 } else { self.seqs() };
        (0..count).map(move |j| {
            if full {
                (0, self.n(), self.s0 * self.t)
            } else {
                let (off, len) = self.seq(j);
                (off, len, (self.s0 + j) * self.t)
            }
        })
    }

    /// The real rows (`width` elements each) of the group's padded rows `padded`.
    pub(super) fn gather<T: Copy>(&self, padded: &[T], width: usize) -> Vec<T> {
        let mut out = Vec::with_capacity(self.n() * width);
        for j in 0..self.seqs() {
            let len = self.seq(j).1;
            out.extend_from_slice(&padded[j * self.t * width..][..len * width]);
        }
        out
    }

    /// The real rows of the group's padded rows `padded` ([`Self::gather`]): `padded`
    /// itself when every row is real.
    pub(super) fn packed<'a, T: Copy>(&self, padded: &'a [T], width: usize) -> Cow<'a, [T]> {
        if self.is_full() {
            Cow::Borrowed(padded)
        } else {
            Cow::Owned(self.gather(padded, width))
        }
    }

    /// Runs `f` on a buffer of the group's real rows that is then written into its padded
    /// rows `padded` ([`Self::scatter`]); on `padded` itself when every row is real.
    #[inline(always)]
    pub(super) fn write_packed<T: Float, R>(
        &self,
        padded: &mut [T],
        width: usize,
        f: impl FnOnce(&mut [T]) -> R,
    ) -> R {
        if self.is_full() {
            return f(padded);
        }
        let mut rows = vec![T::ZERO; self.n() * width];
        let r = f(&mut rows);
        self.scatter(&rows, padded, width);
        r
    }

    /// The group's real rows `rows` written into its padded rows `padded`, padding rows
    /// set to zero.
    pub(super) fn scatter<T: Float>(&self, rows: &[T], padded: &mut [T], width: usize) {
        for j in 0..self.seqs() {
            let (off, len) = self.seq(j);
            let dst = &mut padded[j * self.t * width..][..self.t * width];
            dst[..len * width].copy_from_slice(&rows[off * width..][..len * width]);
            dst[len * width..].fill(T::ZERO);
        }
    }
}

/// Checks per-sequence lengths against an attention mask: computing only a sequence's rows
/// before its length (`q_lens`, of `t`) is exact when none of them may attend to a key at or
/// after its key length (`k_lens`, of `tk`). `keep(seq)` is the sequence's mask, `t x tk` or
/// one row of `tk` for all queries. `layer` names the caller in the error.
pub(super) fn check_lengths<'k>(
    layer: &str,
    (q_lens, t): (&[usize], usize),
    (k_lens, tk): (&[usize], usize),
    keep: impl Fn(usize) -> Option<&'k [u8]>,
) -> candle_core::Result<()> {
    if q_lens.len() != k_lens.len() {
        candle_core::bail!(
            "{layer}: {} query lengths for {} key lengths",
            q_lens.len(),
            k_lens.len()
        );
    }
    for (seq, (&lq, &lk)) in q_lens.iter().zip(k_lens).enumerate() {
        if lq > t || lk > tk {
            candle_core::bail!(
                "{layer}: sequence {seq} has {lq} rows and {lk} keys, more than the batch's {t} and {tk}"
            );
        }
        if lk == tk {
            continue;
        }
        let Some(m) = keep(seq) else {
            candle_core::bail!(
                "{layer}: sequence {seq} has {lk} of {tk} keys, but no mask hides the others"
            );
        };
        let rows = if m.len() == tk { lq.min(1) } else { lq };
        for i in 0..rows {
            if let Some(j) = m[i * tk + lk..(i + 1) * tk].iter().position(|&k| k != 0) {
                candle_core::bail!(
                    "{layer}: sequence {seq} has {lk} keys, but its mask lets row {i} attend to key {}: \
                     the positions after a sequence's length must be padding that its mask hides",
                    lk + j
                );
            }
        }
    }
    Ok(())
}
