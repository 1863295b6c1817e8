//! Importing PyTorch state dicts: PyTorch's parameter names map to ours one to one, except
//! `nn.MultiheadAttention`'s packed input projection, which PyTorch stores as
//! `in_proj_weight` (3C, C) and `in_proj_bias` (3C,) with the rows of the query, key and
//! value projections stacked in that order. We keep them as three `(C, C)` projections.

use crate::Result;
use candle_core::Tensor;
use std::collections::HashMap;

/// Buffers PyTorch writes into state dicts that are not parameters here (recomputed).
const IGNORED_BUFFERS: [&str; 1] = ["pos_encoder.pe"];

/// Renames and splits PyTorch tensors into this crate's parameter names. Works for
/// parameters and for their gradients alike.
pub fn from_torch(state: &HashMap<String, Tensor>) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::with_capacity(state.len() + state.len() / 2);
    for (name, t) in state {
        if IGNORED_BUFFERS.contains(&name.as_str()) {
            continue;
        }
        let packed = [("in_proj_weight", "weight"), ("in_proj_bias", "bias")]
            .into_iter()
            .find_map(|(suffix, kind)| name.strip_suffix(suffix).map(|prefix| (prefix, kind)));
        match packed {
            Some((prefix, kind)) => {
                let rows = t.dim(0)?;
                if rows % 3 != 0 {
                    candle_core::bail!(
                        "{name} has {rows} rows; a packed q/k/v projection has 3 x d_model"
                    );
                }
                for (i, proj) in ["q_proj", "k_proj", "v_proj"].iter().enumerate() {
                    let part = t.narrow(0, i * rows / 3, rows / 3)?.contiguous()?;
                    out.insert(format!("{prefix}{proj}.{kind}"), part);
                }
            }
            None => {
                out.insert(name.clone(), t.clone());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn packed_projection_is_split_in_qkv_order() -> Result<()> {
        let w = Tensor::arange(0f32, 12.0, &Device::Cpu)?.reshape((6, 2))?;
        let b = Tensor::arange(0f32, 6.0, &Device::Cpu)?;
        let state = HashMap::from([
            ("l.self_attn.in_proj_weight".to_string(), w),
            ("l.self_attn.in_proj_bias".to_string(), b),
            (
                "pos_encoder.pe".to_string(),
                Tensor::zeros(1, candle_core::DType::F32, &Device::Cpu)?,
            ),
        ]);
        let out = from_torch(&state)?;
        assert_eq!(out.len(), 6);
        assert_eq!(
            out["l.self_attn.k_proj.weight"].to_vec2::<f32>()?,
            vec![vec![4., 5.], vec![6., 7.]]
        );
        assert_eq!(
            out["l.self_attn.v_proj.bias"].to_vec1::<f32>()?,
            vec![4., 5.]
        );
        Ok(())
    }
}
