//! Sinusoidal positional encoding (section 3.5):
//! `PE(pos, 2i) = sin(pos / 10000^(2i/C))`, `PE(pos, 2i+1) = cos(pos / 10000^(2i/C))`,
//! added to the (scaled) embeddings, followed by dropout. Computed in float64 once, up to
//! `max_len`, then cast; the frequencies are `exp(2i * -ln(10000) / C)` as in the PyTorch
//! tutorial.
//!
//! Published models use other tables ([`Positions`]): the sines in the first half and the
//! cosines in the second (Marian, OPUS-MT), the same with tensor2tensor's frequencies from
//! position 1 (CTranslate2's built-in table), or a learned one read with the weights.

use crate::dropout::{Dropout, Mode};
use crate::Result;
use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

/// Which position table a model adds to its embeddings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Positions {
    /// Section 3.5's: sine at the even columns, cosine at the odd, from position 0.
    #[default]
    Interleaved,
    /// `sin(pos w_i)` in columns `i < C/2`, `cos(pos w_i)` in the others, `w_i =
    /// 10000^(-2i/C)`, from position 0: Marian's (OPUS-MT, Hugging Face `MarianMTModel`).
    Halves,
    /// Sines then cosines with tensor2tensor's frequencies `w_i = exp(-i ln(10000) / (C/2 -
    /// 1))`, from position 1: CTranslate2's built-in table (OpenNMT's models).
    Timing,
    /// A learned (max_len, C) table per stack, a parameter read with the weights
    /// (`src_positions.weight`, `tgt_positions.weight`).
    Learned,
}

impl Positions {
    /// The fixed (max_len, C) table in f64; `None` for [`Positions::Learned`].
    pub fn table(self, d_model: usize, max_len: usize, device: &Device) -> Result<Option<Tensor>> {
        if d_model % 2 == 1 {
            candle_core::bail!("positional encoding needs an even d_model, got {d_model}");
        }
        let half = d_model / 2;
        let halves = |freq: &dyn Fn(usize) -> f64, first: usize| {
            let mut pe = vec![0f64; max_len * d_model];
            for pos in 0..max_len {
                for i in 0..half {
                    let angle = (pos + first) as f64 * freq(i);
                    pe[pos * d_model + i] = angle.sin();
                    pe[pos * d_model + half + i] = angle.cos();
                }
            }
            Tensor::from_vec(pe, (max_len, d_model), device)
        };
        Ok(Some(match self {
            Positions::Interleaved => PositionalEncoding::table(d_model, max_len, device)?,
            Positions::Halves => {
                halves(&|i| 1.0 / 10000f64.powf(2.0 * i as f64 / d_model as f64), 0)?
            }
            Positions::Timing => {
                // As CTranslate2 computes it, in f32: the increment, each frequency, and
                // each angle rounded to f32 before the sine.
                let inc = 10000f32.ln() / (half.max(2) - 1) as f32;
                let freqs: Vec<f32> = (0..half).map(|i| (-inc * i as f32).exp()).collect();
                let mut pe = vec![0f64; max_len * d_model];
                for pos in 0..max_len {
                    for (i, w) in freqs.iter().enumerate() {
                        let angle = ((pos + 1) as f32 * w) as f64;
                        pe[pos * d_model + i] = angle.sin();
                        pe[pos * d_model + half + i] = angle.cos();
                    }
                }
                Tensor::from_vec(pe, (max_len, d_model), device)?
            }
            Positions::Learned => return Ok(None),
        }))
    }
}

/// The sinusoidal positional encodings, a fixed (max_len, C) table added to the embeddings,
/// followed by dropout.
#[derive(Debug, Clone)]
pub struct PositionalEncoding {
    /// (max_len, C): a fixed table, or a learned one (a parameter).
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

    /// Encodings from a given `(max_len, C)` table: a learned one, or one of [`Positions`].
    pub fn with_table(pe: Tensor, dropout: f64) -> Self {
        Self {
            pe,
            dropout: Dropout::new(dropout),
        }
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
