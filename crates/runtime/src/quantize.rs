//! `transformer mt quantize`: a copy of a translation run with its weight matrices in int8,
//! a quarter of their f32 size on disk, which every command that loads a run decodes in
//! int8.
//!
//! Each weight matrix (every 2-D parameter: the embedding shared with the output layer, the
//! attention projections, the feed-forward layers) is stored as int8 with one f32 scale per
//! row, the scheme decoding quantizes with (`transformer_model::quantize_weight_rows`: `scale =
//! max |row| / 127`, `q = round(w / scale)`); biases and layer norms stay f32. On load the
//! matrices are turned back into f32 (`q x scale`) for the encoder and the embeddings, and
//! decoding quantizes them again, which gives back the same int8 values: the largest entry
//! of each row is `127 x scale` exactly, so the scale is found again and every `q x scale /
//! scale` rounds to `q`.

use crate::checkpoint;
use crate::checkpoint::params_tensors;
use crate::error::{Error, Result};
use crate::load::{load_run, tokenizer_path, LoadedMt};
use crate::run_dir::{self as runner, best_path, config_path, save_tagged};
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::Path;
use transformer_model::quantize_weight_rows;

/// The format tag of an int8 run's `best.safetensors`.
pub const INT8_WEIGHTS_FORMAT: &str = "transformer-mt-weights-int8/1";

/// Name suffix of a matrix's row scales.
const SCALE_SUFFIX: &str = ".int8_scale";

/// What [`quantize_run`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizeSummary {
    /// Matrices stored as int8.
    pub matrices: usize,
    /// Bytes of the source run's weights file.
    pub bytes_before: u64,
    /// Bytes of the int8 run's.
    pub bytes_after: u64,
}

/// Writes to `out` a copy of the run `run` (its best weights, configuration and tokenizer)
/// with every weight matrix in int8. `out` must not exist yet or be empty.
pub fn quantize_run(run: &Path, out: &Path) -> Result<QuantizeSummary> {
    let loaded = load_run(run, &crate::load::Execution::on(&Device::Cpu))?;
    if loaded.model.transformer().is_none() {
        return Err(Error::Usage(format!(
            "{}: a {} run; int8 covers the Transformer (the recurrent models decode in f32)",
            run.display(),
            loaded.config.arch.name()
        )));
    }
    if out.exists() && std::fs::read_dir(out).map_or(true, |mut d| d.next().is_some()) {
        return Err(Error::Usage(format!(
            "{}: exists and is not an empty directory; give a new directory for the int8 run",
            out.display()
        )));
    }
    std::fs::create_dir_all(out).map_err(|source| Error::Io {
        path: out.into(),
        source,
    })?;
    let (tensors, matrices) = quantized_tensors(&loaded)?;
    let dst = best_path(out);
    save_tagged(
        &dst,
        &tensors,
        INT8_WEIGHTS_FORMAT,
        [
            (
                "model",
                serde_json::to_string(&loaded.model_config).expect("config serializes"),
            ),
            ("quantization", "int8, one scale per row".to_string()),
        ],
    )?;
    for (from, to) in [
        (config_path(run), config_path(out)),
        (tokenizer_path(run), tokenizer_path(out)),
    ] {
        std::fs::copy(&from, &to).map_err(|source| Error::Io { path: from, source })?;
    }
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let (source, _) = runner::weights_file(run);
    Ok(QuantizeSummary {
        matrices,
        bytes_before: size(&source),
        bytes_after: size(&dst),
    })
}

/// The run's parameters with every matrix as int8 (`u8` tensors holding the bytes) plus
/// its row scales; the count of matrices.
fn quantized_tensors(loaded: &LoadedMt) -> Result<(Vec<(String, Tensor)>, usize)> {
    let mut out = Vec::new();
    let mut matrices = 0;
    for (name, t) in params_tensors(&loaded.params) {
        let Ok((rows, cols)) = t.dims2() else {
            out.push((name, t));
            continue;
        };
        let w = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let (q, scales) = quantize_matrix(&w, cols);
        let dev = t.device();
        out.push((name.clone(), Tensor::from_vec(q, (rows, cols), dev)?));
        out.push((
            format!("{name}{SCALE_SUFFIX}"),
            Tensor::from_vec(scales, rows, dev)?,
        ));
        matrices += 1;
    }
    Ok((out, matrices))
}

/// A row-major matrix of `cols` columns as int8 bytes (stored as `u8`) with one scale per
/// row: decoding's own quantization ([`quantize_weight_rows`]).
fn quantize_matrix(w: &[f32], cols: usize) -> (Vec<u8>, Vec<f32>) {
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

/// Loads `path`'s tensors and metadata whatever their format tag (checked by the caller).
pub(crate) fn load_any(
    path: &Path,
    device: &Device,
) -> Result<(HashMap<String, Tensor>, HashMap<String, String>)> {
    checkpoint::load(path, device)
}

#[cfg(test)]
mod tests {
    use super::*;

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
