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

/// Which version of PyTorch's nn.Transformer language-model tutorial a state dict comes
/// from: the two name the embedding and the output layer differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LmLayout {
    /// The current tutorial: `embedding.weight`, `linear.weight`, `linear.bias`.
    Newer,
    /// The older tutorial, which most translated write-ups follow: `encoder.weight` (the
    /// embedding) and `decoder.weight`, `decoder.bias` (the output layer).
    Older,
}

impl LmLayout {
    /// A phrase for the log.
    pub fn describe(self) -> &'static str {
        match self {
            LmLayout::Newer => "the current tutorial's layout (embedding / linear)",
            LmLayout::Older => "the older tutorial's layout (encoder / decoder)",
        }
    }
}

/// The older tutorial's names and this crate's, in that order.
const OLDER_NAMES: [(&str, &str); 3] = [
    ("encoder.weight", "embedding.weight"),
    ("decoder.weight", "linear.weight"),
    ("decoder.bias", "linear.bias"),
];

/// Detects which tutorial version wrote `state` and renames the older version's embedding
/// and output layer to this crate's names (`transformer_encoder.*` is the same in both and
/// never touched). An unknown layout is an error that lists the names expected.
pub fn lm_from_torch_layout(
    mut state: HashMap<String, Tensor>,
) -> std::result::Result<(HashMap<String, Tensor>, LmLayout), String> {
    let has = |n: &str| state.contains_key(n);
    let layout = if has("embedding.weight") && has("linear.weight") && has("linear.bias") {
        LmLayout::Newer
    } else if OLDER_NAMES.iter().all(|(old, _)| has(old)) {
        LmLayout::Older
    } else {
        let mut found: Vec<&String> = state
            .keys()
            .filter(|k| !k.starts_with("transformer_encoder.layers."))
            .collect();
        found.sort();
        return Err(format!(
            "not a state dict of PyTorch's nn.Transformer language-model tutorial: expected \
             embedding.weight, linear.weight and linear.bias (the current tutorial) or \
             encoder.weight, decoder.weight and decoder.bias (the older one), beside \
             transformer_encoder.layers.N.*; found {found:?}"
        ));
    };
    if layout == LmLayout::Older {
        for (old, new) in OLDER_NAMES {
            let t = state.remove(old).expect("checked above");
            state.insert(new.to_string(), t);
        }
    }
    Ok((state, layout))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn lm_state(names: &[&str]) -> HashMap<String, Tensor> {
        names
            .iter()
            .map(|n| {
                let t = Tensor::new(&[n.len() as f32], &Device::Cpu).unwrap();
                (n.to_string(), t)
            })
            .collect()
    }

    #[test]
    fn both_tutorial_layouts_are_recognised() {
        let layer = "transformer_encoder.layers.0.linear1.weight";
        let newer = lm_state(&["embedding.weight", "linear.weight", "linear.bias", layer]);
        let (out, layout) = lm_from_torch_layout(newer.clone()).unwrap();
        assert_eq!(layout, LmLayout::Newer);
        assert_eq!(out.len(), newer.len());
        let older = lm_state(&["encoder.weight", "decoder.weight", "decoder.bias", layer]);
        let (out, layout) = lm_from_torch_layout(older).unwrap();
        assert_eq!(layout, LmLayout::Older);
        let mut names: Vec<&String> = out.keys().collect();
        names.sort();
        assert_eq!(
            names,
            vec!["embedding.weight", "linear.bias", "linear.weight", layer]
        );
        // The values move with their names.
        assert_eq!(
            out["embedding.weight"].to_vec1::<f32>().unwrap(),
            vec!["encoder.weight".len() as f32]
        );
        let err = lm_from_torch_layout(lm_state(&["emb.weight", "out.weight", layer])).unwrap_err();
        for name in [
            "embedding.weight",
            "encoder.weight",
            "decoder.bias",
            "emb.weight",
        ] {
            assert!(err.contains(name), "{err}");
        }
    }

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
