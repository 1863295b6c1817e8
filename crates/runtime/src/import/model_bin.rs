//! CTranslate2's `model.bin`: every binary version its loader reads (1 to 6), every
//! variable read into f32 (float16, bfloat16, int16 and int8 weights with their scales), the
//! aliases resolved. Written by hand: no crate reads the format, which is a small
//! little-endian record stream (CTranslate2's `src/models/model.cc`, `Model::load`):
//!
//! ```text
//! u32 version; [version >= 2: string spec, u32 revision]; u32 count;
//! count x { string name; u8 rank; u32 dims[rank];
//!           version >= 4: u8 dtype, u32 bytes | else: u8 item size, u32 elements;
//!           data }
//! [version >= 3: u32 aliases; aliases x { string alias; string target }]
//! ```
//! where a string is a u16 length (its NUL included) and the bytes.

use crate::error::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The newest binary version this reader knows (CTranslate2 4's).
pub const MAX_VERSION: u32 = 6;

/// A variable's element type as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// IEEE float32.
    F32,
    /// int8 (a weight with per-row `_scale`, or a flag).
    I8,
    /// int16 (a weight with a scalar `_scale`, or a small integer attribute).
    I16,
    /// int32.
    I32,
    /// IEEE float16.
    F16,
    /// bfloat16.
    Bf16,
}

impl DType {
    fn from_id(id: u8) -> Option<Self> {
        Some(match id {
            0 => DType::F32,
            1 => DType::I8,
            2 => DType::I16,
            3 => DType::I32,
            4 => DType::F16,
            5 => DType::Bf16,
            _ => return None,
        })
    }

    fn from_item_size(size: u8) -> Option<Self> {
        Some(match size {
            4 => DType::F32,
            2 => DType::I16,
            1 => DType::I8,
            _ => return None,
        })
    }

    fn size(self) -> usize {
        match self {
            DType::I8 => 1,
            DType::I16 | DType::F16 | DType::Bf16 => 2,
            DType::F32 | DType::I32 => 4,
        }
    }

    /// The name CTranslate2 gives it.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::F16 => "float16",
            DType::Bf16 => "bfloat16",
        }
    }
}

/// One stored variable.
#[derive(Debug, Clone)]
pub struct Variable {
    /// Its shape (empty for a scalar).
    pub dims: Vec<usize>,
    /// Its type as stored.
    pub dtype: DType,
    /// Its bytes, little-endian.
    pub data: Vec<u8>,
}

impl Variable {
    /// The values as f64, whatever the stored type (integers as they are, not dequantized).
    pub fn values(&self) -> Vec<f64> {
        let d = &self.data;
        match self.dtype {
            DType::F32 => d
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
                .collect(),
            DType::I8 => d.iter().map(|&b| b as i8 as f64).collect(),
            DType::I16 => d
                .chunks_exact(2)
                .map(|c| i16::from_le_bytes([c[0], c[1]]) as f64)
                .collect(),
            DType::I32 => d
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
                .collect(),
            DType::F16 => d
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DType::Bf16 => d
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.dims.iter().product()
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A parsed `model.bin`.
#[derive(Debug, Clone)]
pub struct ModelBin {
    /// The file.
    pub path: PathBuf,
    /// Binary version (1 to 6).
    pub version: u32,
    /// The spec's name (empty for version 1): `TransformerSpec`, `TransformerBase`, ...
    pub spec: String,
    /// The spec's revision (1 for version 1).
    pub revision: u32,
    /// Variables by name, aliases resolved to copies.
    pub variables: BTreeMap<String, Variable>,
    /// The aliases: name -> the variable it shares.
    pub aliases: HashMap<String, String>,
}

/// A cursor over the file's bytes; every read says what was being read when the file ends.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn err(&self, what: &str) -> Error {
        Error::Checkpoint {
            path: self.path.into(),
            msg: format!(
                "not a CTranslate2 model.bin: {what} at byte {} of {} (the file is truncated \
                 or damaged; copy the model again)",
                self.at,
                self.bytes.len()
            ),
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if self.bytes.len() - self.at < n {
            return Err(self.err(&format!("it ends inside {what}")));
        }
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u16(what)? as usize;
        if len == 0 {
            return Err(self.err(&format!("an empty string for {what}")));
        }
        let b = self.take(len, what)?;
        let text = &b[..len - 1];
        std::str::from_utf8(text)
            .map(str::to_string)
            .map_err(|_| self.err(&format!("{what} is not UTF-8")))
    }
}

impl ModelBin {
    /// Reads `path`.
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.into(),
            source,
        })?;
        Self::parse(&bytes, path)
    }

    /// Parses the bytes of a `model.bin` (`path` names it in errors).
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Self> {
        let mut r = Reader { bytes, at: 0, path };
        let version = r.u32("the binary version")?;
        if version == 0 || version > MAX_VERSION {
            return Err(Error::Checkpoint {
                path: path.into(),
                msg: format!(
                    "CTranslate2 binary version {version}: this reader knows versions 1 to \
                     {MAX_VERSION} (a newer CTranslate2 wrote it, or it is not a model.bin)"
                ),
            });
        }
        let (spec, revision) = if version >= 2 {
            (r.string("the spec name")?, r.u32("the spec revision")?)
        } else {
            (String::new(), 1)
        };
        let count = r.u32("the number of variables")? as usize;
        let mut variables = BTreeMap::new();
        for _ in 0..count {
            let name = r.string("a variable name")?;
            let what = format!("variable {name}");
            let rank = r.u8(&what)? as usize;
            let mut dims = Vec::with_capacity(rank);
            for _ in 0..rank {
                dims.push(r.u32(&what)? as usize);
            }
            let elements: usize = dims.iter().product();
            let (dtype, bytes_len) = if version >= 4 {
                let id = r.u8(&what)?;
                let dtype = DType::from_id(id)
                    .ok_or_else(|| r.err(&format!("{what} has the unknown type id {id}")))?;
                (dtype, r.u32(&what)? as usize)
            } else {
                let size = r.u8(&what)?;
                let dtype = DType::from_item_size(size)
                    .ok_or_else(|| r.err(&format!("{what} has the item size {size}")))?;
                (dtype, r.u32(&what)? as usize * size as usize)
            };
            if bytes_len != elements * dtype.size() {
                return Err(r.err(&format!(
                    "{what} declares {bytes_len} bytes for {elements} {} values",
                    dtype.name()
                )));
            }
            let data = r.take(bytes_len, &what)?.to_vec();
            variables.insert(name, Variable { dims, dtype, data });
        }
        let mut aliases = HashMap::new();
        if version >= 3 {
            let n = r.u32("the number of aliases")?;
            for _ in 0..n {
                let alias = r.string("an alias")?;
                let target = r.string("an alias target")?;
                aliases.insert(alias, target);
            }
        }
        if r.at != bytes.len() {
            return Err(r.err("extra bytes after the last record"));
        }
        // An alias `a -> b` also names `b`'s scale as `a`'s.
        let mut resolved = aliases.clone();
        for (a, b) in &aliases {
            for suffix in ["_scale", "_zero"] {
                let (sa, sb) = (format!("{a}{suffix}"), format!("{b}{suffix}"));
                if variables.contains_key(&sb) {
                    resolved.insert(sa, sb);
                }
            }
        }
        for (a, b) in &resolved {
            let v = variables.get(b).cloned().ok_or_else(|| Error::Checkpoint {
                path: path.into(),
                msg: format!("the alias {a} names {b}, which the file does not hold"),
            })?;
            variables.insert(a.clone(), v);
        }
        Ok(Self {
            path: path.into(),
            version,
            spec,
            revision,
            variables,
            aliases,
        })
    }
}
