//! The int8 weights file of a run that `transformer mt quantize` wrote
//! ([`crate::quantize`]): each weight matrix as int8 bytes with one f32 scale per row, the
//! scheme decoding quantizes with (`transformer_model::quantize_weight_rows`), read back as
//! f32 ([`dequantize`]) for the encoder and the embeddings.

use crate::error::{Error, Result};
use candle_core::{DType, Tensor};
use std::collections::HashMap;
use std::path::Path;
use transformer_model::quantize_weight_rows;

/// The format tag of an int8 run's `best.safetensors`.
pub const INT8_WEIGHTS_FORMAT: &str = "transformer-mt-weights-int8/1";

/// Name suffix of a matrix's row scales.
pub(crate) const SCALE_SUFFIX: &str = ".int8_scale";

/// A row-major matrix of `cols` columns as int8 bytes (stored as `u8`) with one scale per
/// row: decoding's own quantization ([`quantize_weight_rows`]).
pub(crate) fn quantize_matrix(w: &[f32], cols: usize) -> (Vec<u8>, Vec<f32>) {
    let (q, scales) = quantize_weight_rows(w, cols);
    (q.into_iter().map(|t| t as u8).collect(), scales)
}

/// The f32 parameters of an int8 weights file's tensors (`path` names it in errors).
pub fn dequantize(
    path: &Path,
    mut tensors: HashMap<String, Tensor>,
) -> Result<HashMap<String, Tensor>> {
    let bad = |msg: String| Error::Checkpoint {
        path: path.into(),
        msg,
    };
    let names: Vec<String> = tensors
        .keys()
        .filter(|n| n.ends_with(SCALE_SUFFIX))
        .cloned()
        .collect();
    for scale_name in names {
        let name = scale_name.trim_end_matches(SCALE_SUFFIX).to_string();
        let scale = tensors.remove(&scale_name).expect("listed");
        let q = tensors
            .remove(&name)
            .ok_or_else(|| bad(format!("{scale_name} without its matrix {name}")))?;
        let (rows, cols) = q.dims2().map_err(|e| bad(format!("{name}: {e}")))?;
        if q.dtype() != DType::U8 || scale.dims() != [rows] {
            return Err(bad(format!(
                "{name}: an int8 matrix must be u8 bytes with one scale per row"
            )));
        }
        let bytes = q.flatten_all()?.to_vec1::<u8>()?;
        let scales = scale.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        let w: Vec<f32> = bytes
            .chunks_exact(cols)
            .zip(&scales)
            .flat_map(|(row, &s)| row.iter().map(move |&b| b as i8 as f32 * s))
            .collect();
        tensors.insert(name, Tensor::from_vec(w, (rows, cols), q.device())?);
    }
    if let Some((n, _)) = tensors.iter().find(|(_, t)| t.dtype() == DType::U8) {
        return Err(bad(format!("{n}: int8 bytes without their row scales")));
    }
    Ok(tensors)
}

/// Whether a weights file's metadata marks an int8 run.
pub fn is_int8(meta: &HashMap<String, String>) -> bool {
    meta.get("format").map(String::as_str) == Some(INT8_WEIGHTS_FORMAT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Dequantized weights are within half a step of the originals, and quantizing them again
    /// gives the same bytes and (to rounding) the same scales: what decoding an int8 run
    /// relies on.
    #[test]
    fn dequantized_weights_quantize_back_to_the_same_bytes() -> Result<()> {
        let (rows, cols) = (7, 33);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 1009) as f32 / 1009.0 - 0.5) * (1.0 + (i / cols) as f32))
            .collect();
        let (q, scales) = quantize_matrix(&w, cols);
        let dev = Device::Cpu;
        let file = HashMap::from([
            (
                "m".to_string(),
                Tensor::from_vec(q.clone(), (rows, cols), &dev)?,
            ),
            (
                format!("m{SCALE_SUFFIX}"),
                Tensor::from_vec(scales.clone(), rows, &dev)?,
            ),
            ("b".to_string(), Tensor::new(&[1f32, 2.0], &dev)?),
        ]);
        let back = dequantize(Path::new("x"), file)?;
        assert_eq!(back["b"].to_vec1::<f32>()?, vec![1.0, 2.0]);
        let d = back["m"].flatten_all()?.to_vec1::<f32>()?;
        for (i, (a, b)) in w.iter().zip(&d).enumerate() {
            assert!(
                (a - b).abs() <= scales[i / cols] / 2.0 * 1.0001,
                "{i}: {a} vs {b}"
            );
        }
        let (q2, s2) = quantize_matrix(&d, cols);
        assert_eq!(q2, q);
        for (a, b) in scales.iter().zip(&s2) {
            assert!((a - b).abs() <= a * 1e-6);
        }
        // Bytes without scales, or scales of the wrong length, are refused.
        let orphan = HashMap::from([("m".to_string(), Tensor::from_vec(q, (rows, cols), &dev)?)]);
        assert!(dequantize(Path::new("x"), orphan).is_err());
        Ok(())
    }
}
