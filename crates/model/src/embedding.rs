//! Token embeddings (section 3.4): a lookup table of learned vectors.

use crate::backend::Backprop;
use crate::grads::DirectGrads;
use crate::params::{Init, ParamBuilder};
use crate::Result;
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Shape, Tensor};

/// A token embedding table: id `i` maps to row `i` of a learned (V, C) weight.
#[derive(Debug, Clone)]
pub struct Embedding {
    /// (V, C)
    weight: Tensor,
}

impl Embedding {
    /// Creates the (`vocab`, `dim`) table as the parameter `weight` under `pb`, initialised
    /// with `init`.
    pub fn new(pb: &ParamBuilder, vocab: usize, dim: usize, init: Init) -> Result<Self> {
        Ok(Self {
            weight: pb.var("weight", (vocab, dim), init)?,
        })
    }

    /// (V, C): shared with an output layer when weights are tied (section 3.4).
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// Looks up the vectors of `ids` (each below V).
    ///
    /// # Shapes
    /// ids (...) u32 -> (..., C)
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let flat = self.checked_ids(ids)?;
        // (N,) -> (N, C) -> (..., C)
        self.weight
            .index_select(&flat, 0)?
            .reshape(self.out_dims(ids))
    }

    /// [`Self::forward`] with the gradient going where `backprop` says: with
    /// `Backprop::Direct`, the backward pass records the gradient of the used rows only, in
    /// its `DirectGrads` (see [`crate::grads`]), instead of a dense `(V, C)` gradient in
    /// candle's `GradStore` (for a weight that is not a CPU f32 variable, and otherwise, this
    /// is [`Self::forward`]).
    ///
    /// # Shapes
    /// ids (...) u32 -> (..., C)
    pub fn forward_as(&self, ids: &Tensor, backprop: Backprop) -> Result<Tensor> {
        let grads = match backprop {
            Backprop::Direct(grads) if DirectGrads::accepts(&self.weight) => grads,
            _ => return self.forward(ids),
        };
        let ids_vec = self.checked_ids(ids)?.to_vec1::<u32>()?;
        let op = RowLookup {
            ids: ids_vec,
            grads: grads.clone(),
        };
        self.weight.apply_op1(op)?.reshape(self.out_dims(ids))
    }

    /// The ids flattened, after checking their type and range.
    fn checked_ids(&self, ids: &Tensor) -> Result<Tensor> {
        let vocab = self.weight.dim(0)?;
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
        Ok(flat)
    }

    fn out_dims(&self, ids: &Tensor) -> Vec<usize> {
        let mut dims = ids.dims().to_vec();
        dims.push(self.weight.dims()[1]);
        dims
    }
}

/// Rows `ids` of a CPU f32 `(V, C)` weight, whose backward pass hands the rows' gradients
/// to [`DirectGrads`] and none to candle (the weight is then absent from the `GradStore`).
struct RowLookup {
    ids: Vec<u32>,
    grads: DirectGrads,
}

impl CustomOp1 for RowLookup {
    fn name(&self) -> &'static str {
        "embedding-row-lookup"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (Some((a, b)), &[_, dim]) = (l.contiguous_offsets(), l.dims()) else {
            candle_core::bail!("embedding-row-lookup: expected a contiguous (V, C) weight");
        };
        let w = &s.as_slice::<f32>()?[a..b];
        let mut out = Vec::with_capacity(self.ids.len() * dim);
        for &id in &self.ids {
            out.extend_from_slice(&w[id as usize * dim..(id as usize + 1) * dim]);
        }
        Ok((CpuStorage::F32(out), Shape::from((self.ids.len(), dim))))
    }

    fn bwd(&self, weight: &Tensor, _out: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let dim = weight.dim(1)?;
        let g = grad.flatten_all()?.to_vec1::<f32>()?;
        self.grads.add_rows(weight, &self.ids, &g, dim);
        Ok(None)
    }
}
