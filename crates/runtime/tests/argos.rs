//! An Argos Translate package (`tests/fixtures/marian/de_en.argosmodel`, made by
//! `scripts/make_marian_fixtures.py`: a small German-English Transformer trained on Multi30k,
//! converted to CTranslate2, with a SentencePiece model, zipped as Argos packages are)
//! imported and decoded here gives what Argos Translate's pipeline gives: SentencePiece
//! pieces, CTranslate2's `translate_batch`, the pieces decoded.

use candle_core::Device;
use serde_json::Value;
use std::path::{Path, PathBuf};

mod common;
use transformer_decode::SearchRules;
use transformer_runtime::import::{as_run, Format};
use transformer_runtime::load::{load_run, Execution};

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
