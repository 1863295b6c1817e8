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

use crate::checkpoint::params_tensors;
use crate::error::{Error, Result};
use crate::int8_weights::{quantize_matrix, INT8_WEIGHTS_FORMAT, SCALE_SUFFIX};
use crate::load::{load_run, tokenizer_path, LoadedMt};
use crate::run_dir::{self as runner, best_path, config_path, save_tagged};
use candle_core::{DType, Device, Tensor};
use std::path::Path;

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
