//! Files of named tensors with string metadata (safetensors), written atomically: the new
//! file is written beside the old one, flushed to disk, then renamed over it, so a kill during
//! a save leaves the previous file intact and usable.

use crate::error::{Error, Result};
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Fault injection for the kill-and-resume tests: sleeps as many milliseconds as the
/// environment variable `var` says (nothing when it is unset), so that a test can kill a
/// training process at a chosen moment on a machine of any speed.
pub fn test_pause(var: &str) {
    if let Some(ms) = std::env::var(var).ok().and_then(|v| v.parse::<u64>().ok()) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// Writes `bytes` to `path` atomically (temporary file, fsync, rename).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = tmp_path(path);
    let io = |source| Error::Io {
        path: tmp.clone(),
        source,
    };
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    // Hold the finished temporary file before the rename, so that the kill-and-resume tests
    // can kill the process mid-save.
    test_pause("TRANSFORMER_TEST_SAVE_DELAY_MS");
    std::fs::rename(&tmp, path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    // Make the rename itself durable.
    if let Some(dir) = path.parent() {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Saves tensors with metadata atomically.
pub fn save(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: HashMap<String, String>,
) -> Result<()> {
    let bytes =
        safetensors::serialize(tensors.iter().map(|(n, t)| (n.as_str(), t)), Some(metadata))
            .map_err(|e| Error::Checkpoint {
                path: path.to_path_buf(),
                msg: e.to_string(),
            })?;
    write_atomic(path, &bytes)
}

/// Loads every tensor and the metadata of a safetensors file.
pub fn load(
    path: &Path,
    device: &Device,
) -> Result<(HashMap<String, Tensor>, HashMap<String, String>)> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let bad = |msg: String| Error::Checkpoint {
        path: path.to_path_buf(),
        msg,
    };
    let (_, header) =
        safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
    let meta = header.metadata().clone().unwrap_or_default();
    let tensors =
        candle_core::safetensors::load_buffer(&bytes, device).map_err(|e| bad(e.to_string()))?;
    Ok((tensors, meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_no_leftover_tmp() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("ckpt-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.safetensors");
        let t = Tensor::new(&[1f32, 2., 3.], &Device::Cpu)?;
        let meta = HashMap::from([("k".to_string(), "v".to_string())]);
        save(&path, &[("x".to_string(), t.clone())], meta.clone())?;
        save(&path, &[("x".to_string(), (t * 2.0)?)], meta.clone())?;
        let (tensors, m) = load(&path, &Device::Cpu)?;
        assert_eq!(m, meta);
        assert_eq!(tensors["x"].to_vec1::<f32>()?, vec![2., 4., 6.]);
        assert!(!tmp_path(&path).exists());
        // A torn write (the temporary file) never replaces the good file.
        std::fs::write(tmp_path(&path), b"garbage").unwrap();
        assert_eq!(
            load(&path, &Device::Cpu)?.0["x"].to_vec1::<f32>()?,
            vec![2., 4., 6.]
        );
        std::fs::remove_dir_all(&dir).unwrap();
        Ok(())
    }
}
