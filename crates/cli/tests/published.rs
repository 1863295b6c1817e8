//! Published models through the command line: `transformer import` of a MarianMT directory,
//! an Argos package and a CTranslate2 directory, then `mt translate`, `mt quantize`, `mt
//! eval`'s scoring and `mt train --init-from` on the imported run; what the importer refuses.

use std::path::{Path, PathBuf};
use std::process::Output;

mod common;
use common::{assert_mentions, bin, failed, mt_translate_stdin, repo_root, succeeded, temp_dir};

fn fixture(path: &str) -> PathBuf {
    repo_root().join("crates/runtime/tests/fixtures").join(path)
}

/// What `transformer import MODEL --out OUT` did.
fn run_import(model: &Path, out: &Path) -> Output {
    bin()
        .arg("import")
        .arg(model)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap()
}

/// Imports `model` into `out` (replaced); the import's log.
fn import(model: &Path, out: &Path) -> String {
    let _ = std::fs::remove_dir_all(out);
    succeeded(&run_import(model, out))
}

/// Imports the fixture `model` into the `run` folder of a new temporary folder `name`:
/// (folder, run, the import's log).
fn import_fixture(name: &str, model: &str) -> (PathBuf, PathBuf, String) {
    let dir = temp_dir("published", name);
    let run = dir.join("run");
    let log = import(&fixture(model), &run);
    (dir, run, log)
}

/// What `mt translate` prints on stdout (the translations alone).
fn translate(run: &Path, text: &str, flags: &[&str]) -> String {
    let out = mt_translate_stdin(run, flags, text);
    succeeded(&out);
    String::from_utf8(out.stdout).unwrap()
}

/// `mt train --init-from run` on Multi30k (the bundled data in ../shared/data), a few
/// batches, into `out`; `None` (and a note) where the data is not there.
fn fine_tune(run: &Path, out: &Path, extra: &[&str]) -> Option<std::process::Output> {
    let data = repo_root().join("../shared/data");
    if !data.join("multi30k").exists() {
        eprintln!("SKIPPED the fine-tuning part: no ../shared/data/multi30k");
        return None;
    }
    let output = bin()
        .args(["mt", "train", "--init-from"])
        .arg(run)
        .args(["--corpus", "multi30k-de-en", "--data"])
        .arg(&data)
        .arg("--out")
        .arg(out)
        .args(["--max-batches", "4", "--epochs", "1"])
        .args(extra)
        .output()
        .unwrap();
    Some(output)
}

#[test]
fn an_imported_marian_model_translates_quantizes_and_fine_tunes() {
    let (dir, run, log) = import_fixture("marian", "marian/marian-de-en");
    assert_mentions(&log, &["MarianMT", "Swish", "post-norm"]);
    let text = "Ein Mann fährt Fahrrad.\nZwei Hunde spielen im Schnee.\n";
    let out = translate(&run, text, &[]);
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(out.lines().all(|l| !l.trim().is_empty()), "{out}");

    // int8 weights: a run that decodes in int8, translating the same lines.
    let int8 = dir.join("int8");
    let _ = std::fs::remove_dir_all(&int8);
    succeeded(
        &bin()
            .args(["mt", "quantize", "--run"])
            .arg(&run)
            .arg("--out")
            .arg(&int8)
            .output()
            .unwrap(),
    );
    let out8 = translate(&int8, text, &[]);
    assert_eq!(out8.lines().count(), 2, "{out8}");

    // Fine-tuning on a few Multi30k batches keeps the model's tokenizer and rules.
    let tuned = dir.join("tuned");
    let _ = std::fs::remove_dir_all(&tuned);
    let Some(out) = fine_tune(&run, &tuned, &["--max-valid", "20", "--beam", "1"]) else {
        return;
    };
    let log = succeeded(&out);
    assert_mentions(
        &log,
        &["the imported model's own vocabularies", "test BLEU"],
    );
    assert_eq!(
        std::fs::read(run.join("tokenizer.json")).unwrap(),
        std::fs::read(tuned.join("tokenizer.json")).unwrap()
    );
    let config = std::fs::read_to_string(tuned.join("config.toml")).unwrap();
    assert_mentions(&config, &["[published]", "engine = \"huggingface\""]);
    assert_eq!(translate(&tuned, text, &[]).lines().count(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_ctranslate2_test_model_translates_from_the_command_line() {
    let (dir, run, log) = import_fixture("ct2", "ctranslate2/v2/aren-transliteration");
    assert_mentions(&log, &["binary version 2", "TransformerBase"]);
    assert_eq!(translate(&run, "آ ت ز م و ن\n", &[]).trim(), "a t z m o n");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn what_the_importer_cannot_read_is_a_clear_error_and_writes_nothing() {
    let dir = temp_dir("published", "refused");
    let out = dir.join("run");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Not a model at all.
    let err = failed(&run_import(&dir, &out));
    assert_mentions(&err, &["CTranslate2", "Argos", "MarianMT"]);
    assert!(!out.exists());
    // A MarianMT config.json naming an activation this project does not have.
    let m = dir.join("marian");
    std::fs::create_dir_all(&m).unwrap();
    let src = fixture("marian/marian-de-en");
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, m.join(f.file_name().unwrap())).unwrap();
    }
    let cfg = std::fs::read_to_string(m.join("config.json")).unwrap();
    std::fs::write(m.join("config.json"), cfg.replace("\"swish\"", "\"mish\"")).unwrap();
    let err = failed(&run_import(&m, &out));
    assert_mentions(&err, &["config.json", "mish"]);
    assert!(!out.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// An Argos package (a CTranslate2 conversion without a padding token) translates, but
/// fine-tuning it is refused with the reason, before anything is trained.
#[test]
fn a_model_without_padding_translates_and_refuses_fine_tuning() {
    let (dir, run, log) = import_fixture("argos", "marian/de_en.argosmodel");
    assert_mentions(&log, &["Argos Translate package", "<pad> added"]);
    assert_eq!(
        translate(&run, "Ein Mann fährt Fahrrad.\n", &[])
            .lines()
            .count(),
        1
    );
    let tuned = dir.join("tuned");
    let Some(out) = fine_tune(&run, &tuned, &[]) else {
        return;
    };
    let err = failed(&out);
    assert_mentions(&err, &["no padding token", "cannot be fine-tuned"]);
    assert!(!tuned.join("best.safetensors").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
