//! Files of named tensors with string metadata (safetensors), written atomically: the new
//! file is written beside the old one, flushed to disk, then renamed over it, so a kill during
//! a save leaves the previous file intact and usable.

use crate::error::{Error, Result};
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use transformer_model::Params;

/// The parameters as named tensors (what a weights file holds).
pub fn params_tensors(params: &Params) -> Vec<(String, Tensor)> {
    params
        .iter()
        .map(|(n, v)| (n.to_string(), v.as_tensor().clone()))
        .collect()
}

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
    let io = Error::io(&tmp);
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

/// The metadata key of a file's checksum: a 64-bit hash of its tensors and other metadata,
/// written by [`save`] and verified by [`load`].
pub const CHECKSUM_KEY: &str = "checksum";
/// The checksum's prefix, naming its function.
const CHECKSUM_PREFIX: &str = "mix64:";

/// A 64-bit hash of bytes, eight at a time: `h = rotl((h ^ word) * P, 29)`. Every step is a
/// bijection of `h` for a given word and of the word for a given `h`, so any change confined
/// to one word always changes the result, and other changes do with probability 1 - 2^-64.
/// It detects damage (flipped bits, torn or spliced files), not tampering, which is all a
/// run directory needs; written here (a few lines, several GB/s) rather than adding a
/// cryptographic hash crate to the build.
struct Mix64(u64);

impl Mix64 {
    const P: u64 = 0x9e37_79b9_7f4a_7c15;

    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    fn word(&mut self, w: u64) {
        self.0 = (self.0 ^ w).wrapping_mul(Self::P).rotate_left(29);
    }

    /// Feeds `bytes` and their length (so that concatenations differ).
    fn bytes(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.word(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let mut tail = [0u8; 8];
        tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        self.word(u64::from_le_bytes(tail));
        self.word(bytes.len() as u64);
    }
}

/// The checksum of a file's contents: every tensor's name, dtype, shape and bytes (in name
/// order) and every metadata entry but the checksum itself (in key order).
fn checksum<'a>(
    tensors: impl IntoIterator<Item = (&'a str, String, &'a [usize], &'a [u8])>,
    metadata: &HashMap<String, String>,
) -> String {
    let mut tensors: Vec<_> = tensors.into_iter().collect();
    tensors.sort_by(|a, b| a.0.cmp(b.0));
    let mut h = Mix64::new();
    for (name, dtype, shape, data) in tensors {
        h.bytes(name.as_bytes());
        h.bytes(dtype.as_bytes());
        h.word(shape.len() as u64);
        for &d in shape {
            h.word(d as u64);
        }
        h.bytes(data);
    }
    let mut keys: Vec<&String> = metadata.keys().filter(|k| *k != CHECKSUM_KEY).collect();
    keys.sort();
    for k in keys {
        h.bytes(k.as_bytes());
        h.bytes(metadata[k].as_bytes());
    }
    format!("{CHECKSUM_PREFIX}{:016x}", h.0)
}

/// Saves tensors with metadata atomically, with a checksum of both in the metadata
/// ([`CHECKSUM_KEY`]) that [`load`] verifies.
pub fn save(
    path: &Path,
    tensors: &[(String, Tensor)],
    mut metadata: HashMap<String, String>,
) -> Result<()> {
    use safetensors::View;
    let data: Vec<_> = tensors.iter().map(|(_, t)| t.data()).collect();
    let sum = checksum(
        tensors.iter().zip(&data).map(|((n, t), d)| {
            (
                n.as_str(),
                format!("{:?}", View::dtype(t)),
                t.dims(),
                d.as_ref(),
            )
        }),
        &metadata,
    );
    metadata.insert(CHECKSUM_KEY.into(), sum);
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
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
    let (_, header) =
        safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
    let meta = header.metadata().clone().unwrap_or_default();
    let views = st.tensors();
    // Files written before checksums existed have none: they load as they always did. Their
    // metadata holds only the keys below, none of which a few flipped bits turn the
    // checksum's key into (all are of other lengths): a file without a checksum and with
    // another key is a damaged one.
    const BEFORE_CHECKSUMS: [&str; 5] = ["format", "state", "config", "model", "adam_step"];
    if !meta.contains_key(CHECKSUM_KEY) {
        if let Some(k) = meta
            .keys()
            .find(|k| !BEFORE_CHECKSUMS.contains(&k.as_str()))
        {
            return Err(bad(format!(
                "its metadata has no checksum but a key {k:?} that files without one never \
                 have: the file is damaged"
            )));
        }
    }
    if let Some(want) = meta.get(CHECKSUM_KEY) {
        let got = checksum(
            views
                .iter()
                .map(|(n, v)| (n.as_str(), format!("{:?}", v.dtype()), v.shape(), v.data())),
            &meta,
        );
        if &got != want {
            return Err(bad(format!(
                "its contents do not match the checksum written with it ({want}, computed \
                 {got}): the file is damaged"
            )));
        }
    }
    for (name, v) in &views {
        if let Some(i) = first_non_finite(v.dtype(), v.data()) {
            return Err(bad(format!(
                "tensor {name} holds a non-finite value (NaN or infinity) at element {i}: \
                 the weights are unusable"
            )));
        }
    }
    let tensors =
        candle_core::safetensors::load_buffer(&bytes, device).map_err(|e| bad(e.to_string()))?;
    Ok((tensors, meta))
}

/// The index of the first NaN or infinity in little-endian float data (`None` for integer
/// dtypes and all-finite data).
fn first_non_finite(dtype: safetensors::Dtype, data: &[u8]) -> Option<usize> {
    use safetensors::Dtype;
    match dtype {
        Dtype::F32 => data
            .chunks_exact(4)
            .position(|c| !f32::from_le_bytes(c.try_into().expect("4 bytes")).is_finite()),
        Dtype::F64 => data
            .chunks_exact(8)
            .position(|c| !f64::from_le_bytes(c.try_into().expect("8 bytes")).is_finite()),
        // bf16 and f16: the exponent bits all set.
        Dtype::BF16 => data
            .chunks_exact(2)
            .position(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7f80 == 0x7f80),
        Dtype::F16 => data
            .chunks_exact(2)
            .position(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7c00 == 0x7c00),
        _ => None,
    }
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
        assert_eq!(m.get("k"), Some(&"v".to_string()));
        assert!(m[CHECKSUM_KEY].starts_with(CHECKSUM_PREFIX));
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
