//! Attention masks, all built here, with one polarity across the code:
//! **1 = the query may attend to the key, 0 = masked out.**
//!
//! A [`Mask`] holds a `u8` tensor broadcastable to the attention scores `(B, H, T, S)`;
//! it is always 4-D, with size-1 dimensions where it does not vary. Masks combine with
//! [`Mask::and`]. PyTorch's boolean masks use the opposite polarity (True = masked); convert
//! them with [`Mask::from_torch_bool`].

use crate::Result;
use candle_core::{DType, Device, Tensor};
use std::sync::Arc;

/// An attention mask: a `u8` tensor broadcastable to (B, H, T, S), 1 = may attend.
#[derive(Debug, Clone)]
pub struct Mask {
    /// u8, (B | 1, 1, T | 1, S), 1 = may attend
    keep: Tensor,
    /// False when every query is known to keep at least one key (a causal mask always keeps
    /// the diagonal), so attention can skip zeroing fully masked rows.
    may_mask_whole_rows: bool,
    /// Where known: each sequence's real positions, its first ones ([`Mask::with_lengths`]).
    lengths: Option<Arc<[usize]>>,
}

/// The number of tokens other than `pad_id` in each row of `ids` (padding comes after the
/// tokens): the lengths decoding limits and recurrent layers need.
///
/// # Shapes
/// ids (B, S) u32 -> B lengths
pub fn lengths(ids: &Tensor, pad_id: u32) -> Result<Vec<usize>> {
    Ok(ids
        .ne(pad_id)?
        .to_dtype(DType::U32)?
        .sum(1)?
        .to_vec1::<u32>()?
        .into_iter()
        .map(|n| n as usize)
        .collect())
}

/// Each row's length up to its last token other than `pad_id` in any of `ids` (rows of the
/// same batch, such as a decoder's inputs and its targets): the positions after it are
/// padding in all of them.
///
/// # Shapes
/// ids (B, S) u32 each -> B lengths
pub fn padded_lengths(ids: &[&Tensor], pad_id: u32) -> Result<Vec<usize>> {
    let mut out: Vec<usize> = Vec::new();
    for t in ids {
        let rows = t.to_vec2::<u32>()?;
        if out.is_empty() {
            out = vec![0; rows.len()];
        } else if out.len() != rows.len() {
            candle_core::bail!("padded_lengths: {} rows and {} rows", out.len(), rows.len());
        }
        for (len, row) in out.iter_mut().zip(&rows) {
            let last = row
                .iter()
                .rposition(|&id| id != pad_id)
                .map_or(0, |i| i + 1);
            *len = (*len).max(last);
        }
    }
    Ok(out)
}

impl Mask {
    /// Wraps a `u8` keep-tensor of rank 2 `(T, S)`, 3 `(B, T, S)` or 4 `(B, 1, T, S)`.
    pub fn from_keep(keep: &Tensor) -> Result<Self> {
        let keep = keep.to_dtype(DType::U8)?;
        let keep = match keep.rank() {
            2 => keep.unsqueeze(0)?.unsqueeze(0)?,
            3 => keep.unsqueeze(1)?,
            4 => keep,
            r => candle_core::bail!("a mask must have 2 to 4 dimensions, got {r}"),
        };
        Ok(Self {
            keep,
            may_mask_whole_rows: true,
            lengths: None,
        })
    }

    /// Converts a PyTorch boolean `attn_mask` (True/1 = not allowed) of shape `(T, S)`.
    pub fn from_torch_bool(masked: &Tensor) -> Result<Self> {
        Self::from_keep(&masked.to_dtype(DType::U8)?.eq(0u8)?)
    }

    /// The causal ("square subsequent") mask: position t may attend to positions <= t only,
    /// so a prediction never sees the tokens it predicts (section 3.2.3).
    ///
    /// # Shapes
    /// -> (1, 1, T, T)
    pub fn causal(t: usize, device: &Device) -> Result<Self> {
        Self::causal_with_offset(t, 0, device)
    }

    /// The causal mask for `t` new queries at positions `offset .. offset + t` over all
    /// `offset + t` keys seen so far (incremental decoding with a cache).
    ///
    /// # Shapes
    /// -> (1, 1, T, offset + T)
    pub fn causal_with_offset(t: usize, offset: usize, device: &Device) -> Result<Self> {
        let s = offset + t;
        let keep: Vec<u8> = (0..t)
            .flat_map(|i| (0..s).map(move |j| u8::from(j <= offset + i)))
            .collect();
        Ok(Self {
            may_mask_whole_rows: false,
            ..Self::from_keep(&Tensor::from_vec(keep, (t, s), device)?)?
        })
    }

    /// A key-padding mask from a `(B, S)` tensor that is 1 at real tokens, 0 at padding.
    ///
    /// # Shapes
    /// valid (B, S) -> (B, 1, 1, S)
    pub fn key_valid(valid: &Tensor) -> Result<Self> {
        let (b, s) = valid.dims2()?;
        Ok(Self {
            keep: valid.to_dtype(DType::U8)?.reshape((b, 1, 1, s))?,
            may_mask_whole_rows: true,
            lengths: None,
        })
    }

    /// A key-padding mask from PyTorch's `key_padding_mask` (1/True = padding).
    pub fn from_torch_key_padding(padding: &Tensor) -> Result<Self> {
        Self::key_valid(&padding.to_dtype(DType::U8)?.eq(0u8)?)
    }

    /// A key-padding mask from token ids: keys equal to `pad_id` are masked.
    ///
    /// # Shapes
    /// ids (B, S) u32 -> (B, 1, 1, S)
    pub fn key_padding_from_ids(ids: &Tensor, pad_id: u32) -> Result<Self> {
        Self::key_valid(&ids.ne(pad_id)?)
    }

    /// Both masks at once: a key is allowed only where both allow it.
    pub fn and(&self, other: &Mask) -> Result<Mask> {
        Ok(Self {
            keep: self.keep.broadcast_mul(&other.keep)?,
            may_mask_whole_rows: self.may_mask_whole_rows || other.may_mask_whole_rows,
            lengths: match (&self.lengths, &other.lengths) {
                (Some(a), Some(b)) => {
                    Some(a.iter().zip(b.iter()).map(|(x, y)| *x.min(y)).collect())
                }
                (Some(l), None) | (None, Some(l)) => Some(l.clone()),
                (None, None) => None,
            },
        })
    }

    /// `and` where either side may be absent.
    pub fn combine(a: Option<&Mask>, b: Option<&Mask>) -> Result<Option<Mask>> {
        Ok(match (a, b) {
            (Some(a), Some(b)) => Some(a.and(b)?),
            (Some(m), None) | (None, Some(m)) => Some(m.clone()),
            (None, None) => None,
        })
    }

    /// Keeps the batch rows `rows` (in that order, repeats allowed), for a mask that varies
    /// over the batch (a key-padding mask); a mask shared by all rows is returned as is.
    ///
    /// # Shapes
    /// (B, 1, T, S), rows (B',) u32 -> (B', 1, T, S)
    pub fn select_rows(&self, rows: &Tensor) -> Result<Mask> {
        if self.keep.dim(0)? == 1 {
            return Ok(self.clone());
        }
        Ok(Self {
            keep: self.keep.index_select(rows, 0)?,
            may_mask_whole_rows: self.may_mask_whole_rows,
            lengths: None,
        })
    }

    /// Whether some query may have every key masked (then its weights must be zeroed).
    pub fn may_mask_whole_rows(&self) -> bool {
        self.may_mask_whole_rows
    }

    /// The u8 keep-tensor, 4-D.
    pub fn keep(&self) -> &Tensor {
        &self.keep
    }

    /// This mask, declaring that each sequence `b`'s positions from `lengths[b]` on are
    /// padding: the mask hides them as keys from every earlier position, and nothing reads
    /// what a layer computes at them nor sends a gradient into them (the loss ignores them).
    /// The fused layers then skip those rows; their outputs there are zero. The first part is
    /// checked where the rows are skipped; the second is the caller's promise.
    pub fn with_lengths(mut self, lengths: Vec<usize>) -> Self {
        self.lengths = Some(lengths.into());
        self
    }

    /// The lengths given to [`Self::with_lengths`] (the smaller of two where masks combine).
    pub fn lengths(&self) -> Option<&[usize]> {
        self.lengths.as_deref()
    }

    /// The additive form for scores of `dtype`: 0 where allowed, a large negative number
    /// where masked. Finite rather than -inf so a row whose every key is masked does not
    /// produce 0/0 in the softmax; [`crate::attention`] zeroes such rows afterwards.
    pub fn additive(&self, dtype: DType) -> Result<Tensor> {
        // After max-subtraction exp(-1e30 - x) is exactly 0 in f32 and f64; f16 cannot hold
        // 1e30, so it gets its own most negative finite value.
        let big = if dtype == DType::F16 { 65504.0 } else { 1e30 };
        self.keep.to_dtype(dtype)?.affine(big, -big)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causal_pattern_and_polarity() -> Result<()> {
        let m = Mask::causal(3, &Device::Cpu)?;
        assert_eq!(m.keep().dims(), &[1, 1, 3, 3]);
        let v = m.keep().squeeze(0)?.squeeze(0)?.to_vec2::<u8>()?;
        assert_eq!(v, vec![vec![1, 0, 0], vec![1, 1, 0], vec![1, 1, 1]]);
        let torch = Tensor::new(&[[0u8, 1, 1], [0, 0, 1], [0, 0, 0]], &Device::Cpu)?;
        let t = Mask::from_torch_bool(&torch)?
            .keep()
            .squeeze(0)?
            .squeeze(0)?
            .to_vec2::<u8>()?;
        assert_eq!(t, v);
        Ok(())
    }

    #[test]
    fn padding_combines_with_causal() -> Result<()> {
        let ids = Tensor::new(&[[5u32, 6, 0], [7, 0, 0]], &Device::Cpu)?;
        let pad = Mask::key_padding_from_ids(&ids, 0)?;
        assert_eq!(pad.keep().dims(), &[2, 1, 1, 3]);
        let both = Mask::causal(3, &Device::Cpu)?.and(&pad)?;
        assert_eq!(both.keep().dims(), &[2, 1, 3, 3]);
        let b1 = both.keep().get(1)?.squeeze(0)?.to_vec2::<u8>()?;
        assert_eq!(b1, vec![vec![1, 0, 0], vec![1, 0, 0], vec![1, 0, 0]]);
        Ok(())
    }

    #[test]
    fn lengths_reach_the_last_token_of_any_side_and_survive_and() -> Result<()> {
        let dev = Device::Cpu;
        // Row 0: a padding id inside the row; row 1: the targets run one longer than the
        // inputs; row 2: all padding.
        let tgt_in = Tensor::new(&[[1u32, 0, 7, 0], [1, 5, 0, 0], [0, 0, 0, 0]], &dev)?;
        let tgt_out = Tensor::new(&[[0u32, 7, 0, 0], [5, 2, 2, 0], [0, 0, 0, 0]], &dev)?;
        let lens = padded_lengths(&[&tgt_in, &tgt_out], 0)?;
        assert_eq!(lens, vec![3, 3, 0]);
        assert_eq!(padded_lengths(&[&tgt_in], 0)?, vec![3, 2, 0]);
        let pad = Mask::key_padding_from_ids(&tgt_in, 0)?.with_lengths(vec![3, 3, 0]);
        let both = Mask::causal(4, &dev)?.and(&pad)?;
        assert_eq!(both.lengths(), Some(&[3, 3, 0][..]));
        let shorter = both.and(&Mask::causal(4, &dev)?.with_lengths(vec![4, 2, 4]))?;
        assert_eq!(shorter.lengths(), Some(&[3, 2, 0][..]));
        let rows = Tensor::new(&[1u32, 0], &dev)?;
        assert_eq!(shorter.select_rows(&rows)?.lengths(), None);
        Ok(())
    }
}
