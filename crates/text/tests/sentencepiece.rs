//! `transformer_text::sentencepiece` against the `sentencepiece` Python package: the models
//! and expected outputs in `tests/fixtures/sentencepiece/` were written by
//! `scripts/make_sentencepiece_fixtures.py` (the package version is in each file's first row).
//!
//! For every line (Multi30k test_2016_flickr de and en, JHE eval ko and en, hard strings) the
//! pieces and ids must be identical, and so must the decoded text, of the ids and of the
//! pieces; random id sequences must decode identically. Then bad files: errors that name the
//! file, never a panic.

use std::path::{Path, PathBuf};

use serde_json::Value;
use transformer_text::bucket::SplitMix64;
use transformer_text::parallel::read_bytes;
use transformer_text::sentencepiece::{ModelType, SentencePiece};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sentencepiece")
}

fn model(name: &str) -> SentencePiece {
    model_in(&dir(), name)
}

fn model_in(dir: &Path, name: &str) -> SentencePiece {
    SentencePiece::load(&dir.join(format!("{name}.model.gz"))).expect("the model loads")
}

fn rows(dir: &Path, name: &str) -> Vec<Value> {
    let bytes = read_bytes(&dir.join(format!("{name}.expected.jsonl.gz"))).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).expect("a JSON row"))
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) if s.is_empty() => Vec::new(),
        Value::String(s) => s.split(' ').map(str::to_string).collect(),
        Value::Array(a) => a.iter().map(|x| x.as_str().unwrap().to_string()).collect(),
        _ => panic!("pieces are a string or a list"),
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Compares every row of `name`; returns (lines compared, lines matched, decode cases).
fn compare(name: &str, model_type: ModelType) -> (usize, usize, usize) {
    compare_in(&dir(), name, model_type)
}

fn compare_in(dir: &Path, name: &str, model_type: ModelType) -> (usize, usize, usize) {
    let sp = model_in(dir, name);
    assert_eq!(sp.model_type(), model_type);
    let rows = rows(dir, name);
    assert!(
        rows[0]["sentencepiece_version"].is_string(),
        "first row names the version"
    );
    let (mut lines, mut matched, mut decodes) = (0, 0, 0);
    let mut failures = Vec::new();
    for row in &rows[1..] {
        if let Some(want_ids) = row.get("decode_ids") {
            let got = sp.decode_ids(&ids(want_ids)).unwrap();
            let want = row["decoded"].as_str().unwrap();
            if got != want {
                failures.push(format!("decode {want_ids}: got {got:?}, want {want:?}"));
            }
            decodes += 1;
            continue;
        }
        lines += 1;
        let text = row["text"].as_str().unwrap();
        let want_pieces = strings(&row["pieces"]);
        let want_ids: Vec<u32> = match row.get("ids") {
            Some(v) => ids(v),
            None => want_pieces.iter().map(|p| sp.piece_to_id(p)).collect(),
        };
        let want_decoded = row.get("decoded").and_then(Value::as_str).unwrap_or(text);
        let want_decoded_pieces = row
            .get("decoded_pieces")
            .and_then(Value::as_str)
            .unwrap_or(want_decoded);
        let encoded = sp.encode(text);
        let pieces: Vec<String> = encoded.iter().map(|(p, _)| p.clone()).collect();
        let got_ids: Vec<u32> = encoded.iter().map(|&(_, id)| id).collect();
        let mut ok = true;
        if pieces != want_pieces {
            failures.push(format!(
                "{text:?}\n  normalized {:?}\n  got  {pieces:?}\n  want {want_pieces:?}",
                sp.normalize(text)
            ));
            ok = false;
        } else if got_ids != want_ids {
            failures.push(format!("{text:?}: ids {got_ids:?}, want {want_ids:?}"));
            ok = false;
        }
        let decoded = sp.decode_ids(&want_ids).unwrap();
        if decoded != want_decoded {
            failures.push(format!(
                "{text:?}: decode(ids) {decoded:?}, want {want_decoded:?}"
            ));
            ok = false;
        }
        let decoded_pieces = sp.decode_pieces(&want_pieces);
        if decoded_pieces != want_decoded_pieces {
            failures.push(format!(
                "{text:?}: decode(pieces) {decoded_pieces:?}, want {want_decoded_pieces:?}"
            ));
            ok = false;
        }
        matched += usize::from(ok);
    }
    println!(
        "{name}: {matched} of {lines} lines match (pieces, ids, both decodes); \
         {decodes} random id sequences decoded"
    );
    assert!(
        failures.is_empty(),
        "{name}: {} disagreements with sentencepiece:\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );
    (lines, matched, decodes)
}

/// All 3504 lines of fixture `name` match.
fn assert_every_line_matches(name: &str, model_type: ModelType) {
    let (lines, matched, _) = compare(name, model_type);
    assert_eq!((lines, matched), (3504, 3504));
}

#[test]
fn unigram_nmt_nfkc_matches_sentencepiece() {
    assert_every_line_matches("m30k_unigram", ModelType::Unigram);
}

#[test]
fn bpe_with_user_defined_symbols_matches_sentencepiece() {
    assert_every_line_matches("m30k_bpe", ModelType::Bpe);
}

#[test]
fn unigram_byte_fallback_korean_matches_sentencepiece() {
    let sp = model("koen_unigram_bytes");
    assert!(sp.byte_fallback());
    assert_every_line_matches("koen_unigram_bytes", ModelType::Unigram);
}

#[test]
fn unigram_identity_user_defined_matches_sentencepiece() {
    assert_every_line_matches("m30k_identity", ModelType::Unigram);
}

/// The same comparison on fixtures written elsewhere with more lines (see the script's
/// `--test-file`): `SENTENCEPIECE_FIXTURES=/tmp/spm cargo test ... -- --ignored`.
#[test]
#[ignore = "needs SENTENCEPIECE_FIXTURES, a directory written by the fixture script"]
fn larger_fixtures_from_the_environment() {
    let dir = PathBuf::from(std::env::var("SENTENCEPIECE_FIXTURES").expect("a directory"));
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().ok()?;
            Some(name.strip_suffix(".expected.jsonl.gz")?.to_string())
        })
        .collect();
    names.sort();
    assert!(
        !names.is_empty(),
        "no *.expected.jsonl.gz in {}",
        dir.display()
    );
    for name in names {
        let meta = &rows(&dir, &name)[0];
        let model_type = match meta["options"]["model_type"].as_str() {
            Some("bpe") => ModelType::Bpe,
            _ => ModelType::Unigram,
        };
        compare_in(&dir, &name, model_type);
    }
}

#[test]
fn vocabulary_lookups() {
    let sp = model("m30k_identity");
    assert_eq!(sp.len(), 800);
    assert_eq!(sp.id_to_piece(sp.unk_id()), Some("<unk>"));
    let tag = sp.piece_to_id(">>deu<<");
    assert_ne!(tag, sp.unk_id());
    assert_eq!(sp.id_to_piece(tag), Some(">>deu<<"));
    assert_eq!(sp.get_id("no such piece"), None);
    assert_eq!(sp.piece_to_id("no such piece"), sp.unk_id());
    assert_eq!(sp.id_to_piece(800), None);
    let err = sp.decode_ids(&[800]).unwrap_err().to_string();
    assert!(
        err.contains("m30k_identity.model.gz") && err.contains("800"),
        "{err}"
    );
    // A user-defined piece is kept whole wherever it stands.
    assert!(sp
        .encode_pieces("x>>deu<<y")
        .contains(&">>deu<<".to_string()));
}

fn model_bytes(name: &str) -> Vec<u8> {
    read_bytes(&dir().join(format!("{name}.model.gz"))).unwrap()
}

fn assert_names(err: &transformer_text::Error, file: &str) {
    let msg = err.to_string();
    assert!(msg.contains(file), "error does not name {file}: {msg}");
}

#[test]
fn truncated_models_are_errors_naming_the_file() {
    let bytes = model_bytes("m30k_identity");
    let path = Path::new("cut/source.spm");
    // Every cut inside the first pieces and around the end; a cut on a field boundary can
    // leave a readable (smaller) model, anything else is an error.
    let mut errors = 0;
    let cuts: Vec<usize> = (0..400).chain(bytes.len() - 400..bytes.len()).collect();
    for cut in cuts {
        match SentencePiece::from_bytes(&bytes[..cut], path) {
            Err(e) => {
                assert_names(&e, "cut/source.spm");
                errors += 1;
            }
            Ok(sp) => {
                let _ = sp.encode("Ein Hund läuft über die Wiese.");
            }
        }
    }
    assert!(errors > 300, "{errors} errors");
    let e = SentencePiece::from_bytes(&bytes[..bytes.len() - 3], path).unwrap_err();
    assert!(e.to_string().contains("truncated"), "{e}");
}

#[test]
fn files_that_are_not_models() {
    let tmp = std::env::temp_dir().join(format!("spm-test-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let text = tmp.join("vocab.txt");
    std::fs::write(&text, "hello world\nthis is text\n").unwrap();
    let e = SentencePiece::load(&text).unwrap_err();
    assert_names(&e, "vocab.txt");
    assert!(e.to_string().contains("not a SentencePiece model"), "{e}");
    let empty = tmp.join("empty.model");
    std::fs::write(&empty, b"").unwrap();
    let e = SentencePiece::load(&empty).unwrap_err();
    assert_names(&e, "empty.model");
    assert!(e.to_string().contains("empty"), "{e}");
    let json = tmp.join("tokenizer.json");
    std::fs::write(&json, b"{\"model\": {\"type\": \"Unigram\"}}").unwrap();
    assert_names(&SentencePiece::load(&json).unwrap_err(), "tokenizer.json");
    let missing = tmp.join("missing.model");
    assert_names(&SentencePiece::load(&missing).unwrap_err(), "missing.model");
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn models_without_unk_or_with_a_bad_type() {
    // A piece list of one normal piece (field 1 { 1: "a", 3: 1 }) and no <unk>.
    let bytes = [0x0a, 0x05, 0x0a, 0x01, b'a', 0x18, 0x01];
    let e = SentencePiece::from_bytes(&bytes, Path::new("no-unk.model")).unwrap_err();
    assert_names(&e, "no-unk.model");
    assert!(e.to_string().contains("unknown piece"), "{e}");
    // Type 9 does not exist.
    let bytes = [0x0a, 0x05, 0x0a, 0x01, b'a', 0x18, 0x09];
    let e = SentencePiece::from_bytes(&bytes, Path::new("bad-type.model")).unwrap_err();
    assert!(e.to_string().contains("type 9"), "{e}");
    // A CHAR model (trainer_spec { model_type: CHAR }).
    let bytes = [
        0x0a, 0x05, 0x0a, 0x01, b'a', 0x18, 0x02, 0x12, 0x02, 0x18, 0x04,
    ];
    let e = SentencePiece::from_bytes(&bytes, Path::new("char.model")).unwrap_err();
    assert!(e.to_string().contains("CHAR"), "{e}");
}

#[test]
fn damaged_models_never_panic() {
    let mut cases = SplitMix64::new(7);
    let texts = ["Ein Hund läuft.", "  a\tb  ", "한국어 😀", ""];
    for name in [
        "m30k_identity",
        "m30k_unigram",
        "m30k_bpe",
        "koen_unigram_bytes",
    ] {
        let bytes = model_bytes(name);
        for case in 0..60 {
            let mut damaged = bytes.clone();
            for _ in 0..1 + cases.below(6) {
                let i = cases.below(damaged.len());
                damaged[i] ^= 1 << cases.below(8);
            }
            if case % 3 == 0 {
                damaged.truncate(cases.below(damaged.len()));
            }
            match SentencePiece::from_bytes(&damaged, Path::new("damaged.model")) {
                Err(e) => assert_names(&e, "damaged.model"),
                Ok(sp) => {
                    for t in texts {
                        let pieces = sp.encode_pieces(t);
                        let _ = sp.decode_pieces(&pieces);
                        let _ = sp.decode_ids(&sp.encode_ids(t));
                    }
                }
            }
        }
    }
    // Random bytes.
    for _ in 0..300 {
        let n = cases.below(200);
        let bytes: Vec<u8> = (0..n).map(|_| cases.next_u64() as u8).collect();
        if let Err(e) = SentencePiece::from_bytes(&bytes, Path::new("random.model")) {
            assert_names(&e, "random.model");
        }
    }
}
