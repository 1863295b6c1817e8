//! An Argos Translate package (`tests/fixtures/marian/de_en.argosmodel`, made by
//! `scripts/make_marian_fixtures.py`: a small German-English Transformer trained on Multi30k,
//! converted to CTranslate2, with a SentencePiece model, zipped as Argos packages are)
//! imported and decoded here gives what Argos Translate's pipeline gives: SentencePiece
//! pieces, CTranslate2's `translate_batch`, the pieces decoded.

use candle_core::Device;
use serde_json::Value;
use std::path::{Path, PathBuf};

mod common;
use transformer_decode::{DecodeOptions, SearchRules};
use transformer_runtime::import::{as_run, Format};
use transformer_runtime::load::{load_run, Execution, LoadedMt};

use transformer_text::TextTokenizer;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/marian")
        .join(name)
}

#[test]
fn an_argos_package_translates_as_argos_translate_does() {
    let package = fixture("de_en.argosmodel");
    assert_eq!(Format::detect(&package).unwrap(), Format::Argos);
    let (dir, _guard) = as_run(&package).unwrap();
    let run = load_run(&dir, &Execution::on(&Device::Cpu)).unwrap();
    assert_eq!(
        run.config.language_pair(),
        Some(("de".to_string(), "en".to_string()))
    );
    let names = run
        .config
        .published
        .as_ref()
        .unwrap()
        .language_names
        .clone();
    assert_eq!(names, Some(("German".into(), "English".into())));
    let want: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("argos_expected.json")).unwrap())
            .unwrap();
    let lines = want["lines"].as_array().unwrap();
    for (beam, key) in [(1, "beam1"), (4, "beam4")] {
        // The fixture's references were made with length penalty 1 (Argos Translate itself
        // calls with 0.2, the imported run's default).
        assert_eq!(run.config.length_penalty, 0.2);
        let opts = transformer_decode::DecodeOptions {
            max_len_b: 127,
            length_penalty: 1.0,
            rules: SearchRules::CTRANSLATE2,
            ..run.config.decode_options(beam)
        };
        let src: Vec<Vec<u32>> = lines
            .iter()
            .map(|l| {
                let text = l["src"].as_str().unwrap();
                let pieces: Vec<String> = serde_json::from_value(l["src_pieces"].clone()).unwrap();
                assert_eq!(run.tokenizer.pieces(text), pieces, "{text}");
                run.tokenizer.encode(text)
            })
            .collect();
        let out = common::decode(&run, &src, opts);
        for (l, hyps) in lines.iter().zip(&out) {
            let h = &hyps[0];
            let tokens: Vec<String> = common::token_strings(&run, h);
            let expected: Vec<String> = serde_json::from_value(l[key]["tokens"].clone()).unwrap();
            assert_eq!(tokens, expected, "{key}: {}", l["src"]);
            let score = l[key]["score"].as_f64().unwrap();
            assert!((h.engine_score(1.0) - score).abs() < 1e-4, "{key}: {score}");
            assert_eq!(
                run.tokenizer.decode(&h.tokens),
                l[key]["text"].as_str().unwrap()
            );
        }
    }
}

/// What `scripts/make_ct2_prefix_fixtures.py` recorded of CTranslate2 and Argos Translate.
fn prefix_unk_fixture() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/ctranslate2/expected_prefix_unk.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The texts `translate_lines` (what `mt translate`, `mt eval` and the server use) makes of
/// `texts` with `run` under `opts`.
fn texts_of(run: &LoadedMt, texts: &[String], opts: DecodeOptions) -> Vec<String> {
    transformer_runtime::translate::translate_lines(
        &run.model.decoder().unwrap(),
        &run.tokenizer,
        texts,
        &transformer_runtime::translate::DecodeRequest::new(opts),
        &Device::Cpu,
        |_, _| {},
    )
    .unwrap()
}

/// Argos Translate asks CTranslate2 to replace unknown tokens (`replace_unknowns=True`): a
/// word the vocabulary cannot spell comes back as the source's piece, not as ` ⁇ `. The
/// imported package's translations, as `mt translate`, `mt eval` and the server make their
/// text (`translate_lines`), are the texts of Argos Translate's pipeline
/// (`scripts/make_ct2_prefix_fixtures.py`, `argos_pipeline_unknowns`).
#[test]
fn an_argos_package_replaces_unknown_words_as_argos_translate_does() {
    let want = prefix_unk_fixture();
    let lines = want["argos_pipeline_unknowns"]["lines"].as_array().unwrap();
    let (dir, _guard) = as_run(&fixture("de_en.argosmodel")).unwrap();
    let run = load_run(&dir, &Execution::on(&Device::Cpu)).unwrap();
    assert!(run.config.published.as_ref().unwrap().replace_unknowns);
    let texts: Vec<String> = lines
        .iter()
        .map(|l| l["src"].as_str().unwrap().to_string())
        .collect();
    let translated = texts_of(&run, &texts, run.config.decode_options(run.config.beam));
    let mut copied = 0;
    for (l, got) in lines.iter().zip(&translated) {
        assert_eq!(got, l["text"].as_str().unwrap(), "{}", l["src"]);
        copied += usize::from(got.contains('Ω'));
    }
    // The fixture has sentences whose unknown word came back: else this checks nothing.
    assert!(copied >= 2, "{copied}");
}

#[test]
fn bad_packages_and_models_are_clear_errors_naming_the_file() {
    let tmp = std::env::temp_dir().join(format!("transformer-bad-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    // A zip without metadata.json.
    let zip_path = tmp.join("empty.argosmodel");
    {
        let mut z = zip::ZipWriter::new(std::fs::File::create(&zip_path).unwrap());
        z.start_file("readme.txt", zip::write::SimpleFileOptions::default())
            .unwrap();
        std::io::Write::write_all(&mut z, b"not a package").unwrap();
        z.finish().unwrap();
    }
    let err = Format::Argos.read(&zip_path).unwrap_err().to_string();
    assert!(
        err.contains("metadata.json") && err.contains("empty.argosmodel"),
        "{err}"
    );

    // A CTranslate2 model: truncated, a flipped byte, an unsupported activation.
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/ctranslate2/synthetic/prenorm-relu-sinpos-scaled-sharedtied-f32");
    let copy = |name: &str| -> PathBuf {
        let d = tmp.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for f in ["model.bin", "config.json", "shared_vocabulary.json"] {
            std::fs::copy(src.join(f), d.join(f)).unwrap();
        }
        d
    };
    let bin = std::fs::read(src.join("model.bin")).unwrap();
    let truncated = copy("truncated");
    std::fs::write(truncated.join("model.bin"), &bin[..bin.len() / 2]).unwrap();
    let err = Format::CTranslate2
        .read(&truncated)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("model.bin") && err.contains("truncated"),
        "{err}"
    );

    // A flipped byte in the first variable's header: a declared size the data disagrees with.
    let flipped = copy("flipped");
    let mut b = bin.clone();
    b[4] ^= 0xff;
    std::fs::write(flipped.join("model.bin"), &b).unwrap();
    let err = Format::CTranslate2.read(&flipped).unwrap_err().to_string();
    assert!(err.contains("model.bin"), "{err}");

    // The ReLU flag (encoder/activation, an int8 scalar 0) set to 4: the GELU sigmoid form.
    let act = copy("activation");
    let needle = b"encoder/activation\0";
    let at = bin.windows(needle.len()).position(|w| w == needle).unwrap() + needle.len();
    // rank 0, dtype, byte count (u32), then the value.
    let mut b = bin.clone();
    b[at + 1 + 1 + 4] = 4;
    std::fs::write(act.join("model.bin"), &b).unwrap();
    let err = Format::CTranslate2.read(&act).unwrap_err().to_string();
    assert!(
        err.contains("GELU sigmoid") && err.contains("model.bin"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

/// `package` with `"target_prefix": prefix` added to its `metadata.json`, zipped again at
/// `out` as an Argos package.
fn with_target_prefix(package: &Path, prefix: &str, out: &Path) {
    let mut zin = zip::ZipArchive::new(std::fs::File::open(package).unwrap()).unwrap();
    let mut z = zip::ZipWriter::new(std::fs::File::create(out).unwrap());
    for i in 0..zin.len() {
        let mut f = zin.by_index(i).unwrap();
        let name = f.name().unwrap().to_string();
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut bytes).unwrap();
        if f.is_dir() {
            z.add_directory(name, zip::write::SimpleFileOptions::default())
                .unwrap();
            continue;
        }
        if name.ends_with("metadata.json") {
            let mut meta: Value = serde_json::from_slice(&bytes).unwrap();
            meta["target_prefix"] = Value::String(prefix.into());
            bytes = serde_json::to_vec_pretty(&meta).unwrap();
        }
        z.start_file(name, zip::write::SimpleFileOptions::default())
            .unwrap();
        std::io::Write::write_all(&mut z, &bytes).unwrap();
    }
    z.finish().unwrap();
}

#[test]
fn a_package_with_a_target_prefix_forces_it_and_strips_it_from_the_text() {
    // Argos Translate's pipeline on the package with a target prefix, by
    // `scripts/make_ct2_prefix_fixtures.py` with CTranslate2 (beam 4, length penalty 0.2).
    let want = prefix_unk_fixture();
    let want = &want["argos_pipeline"];
    let prefix = want["target_prefix"].as_str().unwrap();
    let tmp = std::env::temp_dir().join(format!("transformer-argos-prefix-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let package = tmp.join("de_en_prefixed.argosmodel");
    with_target_prefix(&fixture("de_en.argosmodel"), prefix, &package);

    // Imported, not refused; the prefix recorded in the run's config.toml.
    let run_dir = tmp.join("run");
    Format::Argos
        .read(&package)
        .unwrap()
        .write_run(&run_dir)
        .unwrap();
    let toml = std::fs::read_to_string(run_dir.join("config.toml")).unwrap();
    assert!(toml.contains("target_prefix"), "{toml}");
    let run = load_run(&run_dir, &Execution::on(&Device::Cpu)).unwrap();
    let published = run.config.published.as_ref().unwrap();
    assert_eq!(published.target_prefix, vec![prefix.to_string()]);
    let prefix_id = run.tokenizer.token_to_id(prefix).unwrap();
    assert_eq!(run.model.target_prefix(), &[prefix_id]);

    // Every translation (the run's own settings: Argos Translate's beam 4, length penalty
    // 0.2) starts with the prefix, has CTranslate2's tokens and score, and its text is
    // Argos Translate's: the prefix removed.
    let lines = want["lines"].as_array().unwrap();
    let texts: Vec<String> = lines
        .iter()
        .map(|l| l["src"].as_str().unwrap().to_string())
        .collect();
    let src: Vec<Vec<u32>> = texts.iter().map(|t| run.tokenizer.encode(t)).collect();
    let opts = run.config.decode_options(run.config.beam);
    assert_eq!((opts.beam, opts.length_penalty), (4, 0.2));
    let out = common::decode(&run, &src, opts);
    for (l, hyps) in lines.iter().zip(&out) {
        let h = &hyps[0];
        assert_eq!(h.tokens[0], prefix_id);
        let expected: Vec<String> = serde_json::from_value(l["tokens"].clone()).unwrap();
        assert_eq!(common::token_strings(&run, h), expected, "{}", l["src"]);
        let score = l["score"].as_f64().unwrap();
        assert!((h.engine_score(0.2) - score).abs() < 1e-4, "{score}");
    }
    let translated = texts_of(&run, &texts, opts);
    for (l, text) in lines.iter().zip(&translated) {
        assert_eq!(text, l["text"].as_str().unwrap());
        assert!(!text.starts_with(prefix), "{text}");
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
