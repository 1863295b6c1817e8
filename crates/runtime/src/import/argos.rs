//! Argos Translate packages, the models LibreTranslate serves: an `.argosmodel` zip holding
//! one folder with `metadata.json` (the languages' codes and names), `model/` (a CTranslate2
//! model, read by [`super::ctranslate2`]) and `sentencepiece.model` (one SentencePiece model
//! for both sides, which Argos Translate encodes the source and decodes the target with).
//! The unzipped folder is read the same way. A package's `target_prefix` (a target token
//! every translation starts with) is recorded in the run ([`crate::config::Published`]).

use super::ctranslate2;
use super::Imported;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use transformer_text::published::Splitter;

/// Reads the package at `path` (an `.argosmodel` file or its unzipped folder).
pub fn read(path: &Path) -> Result<Imported> {
    if path.is_dir() {
        return read_folder(path, path);
    }
    let tmp = Unzipped::new(path)?;
    let root = package_root(&tmp.dir, path)?;
    read_folder(&root, path)
}

/// A package unzipped into a fresh temporary folder, removed when dropped.
struct Unzipped {
    dir: PathBuf,
}

impl Unzipped {
    fn new(zip_path: &Path) -> Result<Self> {
        let bad = |msg: String| Error::Config {
            path: zip_path.into(),
            msg,
        };
        let file = std::fs::File::open(zip_path).map_err(|source| Error::Io {
            path: zip_path.into(),
            source,
        })?;
        let mut archive = zip::ZipArchive::new(file)
            .map_err(|e| bad(format!("not a readable zip (an Argos package is one): {e}")))?;
        let dir = super::fresh_temp_dir("transformer-import");
        let out = Self { dir };
        archive
            .extract(&out.dir)
            .map_err(|e| bad(format!("cannot unzip it: {e}")))?;
        Ok(out)
    }
}

impl Drop for Unzipped {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The folder of an unzipped package that holds `metadata.json`: the top level or its one
/// folder.
fn package_root(dir: &Path, origin: &Path) -> Result<PathBuf> {
    if dir.join("metadata.json").exists() {
        return Ok(dir.to_path_buf());
    }
    let found = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("metadata.json").exists());
    found.ok_or_else(|| Error::Config {
        path: origin.into(),
        msg: "no metadata.json in the package: not an Argos Translate package (it holds \
              metadata.json, model/ and sentencepiece.model)"
            .into(),
    })
}

/// Reads an unzipped package folder `dir` (`origin`: what the user named).
fn read_folder(dir: &Path, origin: &Path) -> Result<Imported> {
    let meta_path = dir.join("metadata.json");
    let bad = |path: &Path, msg: String| Error::Config {
        path: path.into(),
        msg,
    };
    let text = std::fs::read_to_string(&meta_path).map_err(|_| {
        bad(
            origin,
            "no metadata.json in the package: not an Argos Translate package (it holds \
             metadata.json, model/ and sentencepiece.model)"
                .into(),
        )
    })?;
    let meta: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(&meta_path, format!("not JSON: {e}")))?;
    let field = |k: &str| -> Result<String> {
        meta[k].as_str().map(str::to_string).ok_or_else(|| {
            bad(
                &meta_path,
                format!("no {k:?}: an Argos package names its languages"),
            )
        })
    };
    let (from_code, to_code) = (field("from_code")?, field("to_code")?);
    let from_name = field("from_name").unwrap_or_else(|_| from_code.clone());
    let to_name = field("to_name").unwrap_or_else(|_| to_code.clone());
    // Argos Translate passes it as one target token (`target_prefix=[[prefix]]`) and removes
    // it from the translated text.
    let target_prefix = match &meta["target_prefix"] {
        serde_json::Value::Null => None,
        serde_json::Value::String(p) if p.is_empty() => None,
        serde_json::Value::String(p) => Some(p.clone()),
        other => {
            return Err(bad(
                &meta_path,
                format!("target_prefix {other}: not a string"),
            ))
        }
    };
    let sp_path = dir.join("sentencepiece.model");
    let bytes = std::fs::read(&sp_path).map_err(|_| {
        bad(
            origin,
            "no sentencepiece.model in the package: Argos packages tokenize with one".into(),
        )
    })?;
    let splitter = Splitter::sentencepiece(bytes, &sp_path)?;
    let model_dir = dir.join("model");
    if !model_dir.join("model.bin").exists() {
        return Err(bad(
            origin,
            "no model/model.bin in the package: its CTranslate2 model is missing".into(),
        ));
    }
    let mut imported = ctranslate2::read(&model_dir, (splitter.clone(), splitter))?;
    imported.format = super::Format::Argos;
    imported.origin = origin.to_path_buf();
    imported.languages = Some((from_code, from_name, to_code, to_name));
    if let Some(prefix) = target_prefix {
        if imported.tokenizer.target.vocab.id(&prefix).is_none() {
            return Err(bad(
                &meta_path,
                format!(
                    "target_prefix {prefix:?} is not a token of the model's target vocabulary: \
                     CTranslate2 would force <unk> in its place"
                ),
            ));
        }
        imported.notes.push(format!(
            "every translation starts with the target prefix {prefix:?}"
        ));
        imported.target_prefix = vec![prefix];
    }
    // Argos Translate's own call (`translate_batch(..., replace_unknowns=True,
    // beam_size=max(num_hypotheses, 4), length_penalty=0.2)`), which LibreTranslate makes.
    imported.beam = 4;
    imported.length_penalty = 0.2;
    imported.replace_unknowns = true;
    imported.notes.insert(
        0,
        format!(
            "Argos Translate package{}",
            meta["package_version"]
                .as_str()
                .map(|v| format!(" version {v}"))
                .unwrap_or_default()
        ),
    );
    Ok(imported)
}
