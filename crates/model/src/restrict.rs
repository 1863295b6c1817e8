//! Decoding over a restricted output vocabulary (CTranslate2's vocabulary map): for a batch
//! of sources a [`CandidateVocab`] names the target tokens worth scoring, and the output
//! layer multiplies by those rows of its weight only, so the logits (and the search's
//! log-softmax) cover the candidates alone. The columns of such logits are the candidates'
//! ids in ascending order ([`RestrictedOutput::ids`]).

use crate::kernels::int8::{Int8Kernel, QuantizedLinear};
use candle_core::{DType, Result, Tensor};
use std::sync::Arc;

/// Which target tokens a batch of sources may produce.
pub trait CandidateVocab: std::fmt::Debug + Send + Sync {
    /// The candidates of a batch whose sources are `sources` (token ids without padding),
    /// ascending and without repeats; `<eos>` must be among them.
    fn candidates(&self, sources: &[&[u32]]) -> Vec<u32>;
}

/// The output layer cut down to a batch's candidates.
#[derive(Debug, Clone)]
pub struct RestrictedOutput {
    ids: Arc<[u32]>,
    /// The candidates' rows of the weight, (K, C).
    w: Tensor,
    /// `w` transposed, (C, K), for products of many rows.
    wt: Tensor,
    bias: Tensor,
    /// The same rows in int8, when the output layer decodes in int8.
    q: Option<Arc<QuantizedLinear>>,
}

impl RestrictedOutput {
    /// The rows `ids` (ascending) of the output layer `weight` (V, C) and `bias` (V,); in
    /// int8 with `int8` (one scale per row, as the full layer's).
    pub fn new(
        weight: &Tensor,
        bias: &Tensor,
        ids: Vec<u32>,
        int8: Option<Int8Kernel>,
    ) -> Result<Self> {
        let idx = Tensor::new(ids.as_slice(), weight.device())?;
        let w = weight.detach().index_select(&idx, 0)?.contiguous()?;
        let bias = bias.detach().index_select(&idx, 0)?;
        let wt = w.t()?.contiguous()?;
        let q = match int8 {
            Some(kernel) => {
                let (k, c) = w.dims2()?;
                let wv = w.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                let bv = bias.to_dtype(DType::F32)?.to_vec1::<f32>()?;
                Some(Arc::new(QuantizedLinear::new(&wv, &bv, k, c, kernel)))
            }
            None => None,
        };
        Ok(Self {
            ids: ids.into(),
            w,
            wt,
            bias,
            q,
        })
    }

    /// The token id of each column of [`Self::logits`], ascending.
    pub fn ids(&self) -> &Arc<[u32]> {
        &self.ids
    }

    /// The candidates' logits of the decoder outputs `h`.
    ///
    /// # Shapes
    /// h (B, C) -> (B, K)
    pub fn logits(&self, h: &Tensor) -> Result<Tensor> {
        let rows = h.dim(0)?;
        if let Some(q) = &self.q {
            let x = h.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            let mut y = vec![0f32; rows * q.out_features()];
            q.forward_parallel(&mut y, &x);
            return Tensor::from_vec(y, (rows, q.out_features()), h.device());
        }
        if rows <= 8 {
            crate::kernels::linear_few_rows(h, &self.w, &self.bias)
        } else {
            crate::kernels::linear_wt(h, &self.wt, &self.bias)
        }
    }
}

/// Each row's token ids of `src` (B, S) without the padding `pad`.
pub fn source_rows(src: &Tensor, pad: u32) -> Result<Vec<Vec<u32>>> {
    Ok(src
        .to_vec2::<u32>()?
        .into_iter()
        .map(|row| row.into_iter().filter(|&t| t != pad).collect())
        .collect())
}
