//! Sinusoidal positional encoding (section 3.5):
//! `PE(pos, 2i) = sin(pos / 10000^(2i/C))`, `PE(pos, 2i+1) = cos(pos / 10000^(2i/C))`,
//! added to the (scaled) embeddings, followed by dropout. Computed in float64 once, up to
//! `max_len`, then cast; the frequencies are `exp(2i * -ln(10000) / C)` as in the PyTorch
//! tutorial.

use crate::dropout::{Dropout, Mode};
use crate::Result;
use candle_core::{DType, Device, Tensor};

/// The sinusoidal positional encodings, a fixed (max_len, C) table added to the embeddings,
/// followed by dropout.
#[derive(Debug, Clone)]
pub struct PositionalEncoding {
    /// (max_len, C), not a parameter.
    pe: Tensor,
    dropout: Dropout,
}

impl PositionalEncoding {
    /// `d_model` must be even (checked by the configs).
    pub fn new(
        d_model: usize,
        max_len: usize,
        dropout: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        Ok(Self {
            pe: Self::table(d_model, max_len, device)?.to_dtype(dtype)?,
            dropout: Dropout::new(dropout),
        })
    }

    /// The float64 table `(max_len, d_model)`.
    pub fn table(d_model: usize, max_len: usize, device: &Device) -> Result<Tensor> {
        if d_model % 2 == 1 {
            candle_core::bail!("positional encoding needs an even d_model, got {d_model}");
        }
        let mut pe = vec![0f64; max_len * d_model];
        for pos in 0..max_len {
            for i in (0..d_model).step_by(2) {
                let freq = (i as f64 * -(10000f64.ln()) / d_model as f64).exp();
                let angle = pos as f64 * freq;
                pe[pos * d_model + i] = angle.sin();
                pe[pos * d_model + i + 1] = angle.cos();
            }
        }
        Tensor::from_vec(pe, (max_len, d_model), device)
    }

    /// The number of positions the table covers; longer sequences are an error.
    pub fn max_len(&self) -> usize {
        self.pe.dim(0).unwrap_or(0)
    }

    /// Adds the encodings of positions `offset .. offset + T` (offset > 0 when decoding step
    /// by step with a cache), then drops out.
    ///
    /// # Shapes
    /// x (B, T, C) -> (B, T, C)
    pub fn forward(&self, x: &Tensor, offset: usize, mode: Mode) -> Result<Tensor> {
        let (_b, t, c) = x.dims3()?;
        let (max_len, d) = self.pe.dims2()?;
        if c != d {
            candle_core::bail!("positional encoding has width {d}, input has {c}");
        }
        if offset + t > max_len {
            candle_core::bail!(
                "sequence positions up to {} exceed the positional encoding's max_len {max_len}: \
                 use shorter sequences or build the model with a larger max_len",
                offset + t
            );
        }
        // (T, C) broadcast over B
        let x = x.broadcast_add(&self.pe.narrow(0, offset, t)?)?;
        self.dropout.forward(&x, mode)
    }
}
