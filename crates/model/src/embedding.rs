//! Token embeddings (section 3.4): a lookup table of learned vectors.

use crate::params::{Init, ParamBuilder};
use crate::Result;
use candle_core::{DType, Tensor};

#[derive(Debug, Clone)]
pub struct Embedding {
    /// (V, C)
    weight: Tensor,
}

impl Embedding {
    pub fn new(pb: &ParamBuilder, vocab: usize, dim: usize, init: Init) -> Result<Self> {
        Ok(Self {
            weight: pb.var("weight", (vocab, dim), init)?,
        })
    }

    /// (V, C): shared with an output layer when weights are tied (section 3.4).
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// # Shapes
    /// ids (...) u32 -> (..., C)
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let (vocab, dim) = self.weight.dims2()?;
        if ids.dtype() != DType::U32 {
            candle_core::bail!("token ids must be u32, got {:?}", ids.dtype());
        }
        let flat = ids.flatten_all()?;
        let max = flat.max(0)?.to_scalar::<u32>()?;
        if max as usize >= vocab {
            candle_core::bail!(
                "token id {max} is out of range for a vocabulary of {vocab}: the ids and the \
                 model's vocabulary do not match"
            );
        }
        let mut dims = ids.dims().to_vec();
        dims.push(dim);
        // (N,) -> (N, C) -> (..., C)
        self.weight.index_select(&flat, 0)?.reshape(dims)
    }
}
