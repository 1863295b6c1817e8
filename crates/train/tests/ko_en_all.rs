//! `--corpus ko-en-all` against the real Korean-English data in `../shared/data/ko-en`
//! (relative to the repository root, as every checkout that runs the tests has it): which
//! sources it trains on, how many pairs each gives, that no training pair is one of the
//! held-out test sets', and that `--reverse` exchanges the sides and the language codes.

use std::collections::HashSet;
use std::path::PathBuf;
use transformer_runtime::config::Corpus;
use transformer_runtime::config::MtTrainConfig;
use transformer_text::parallel::PairSource;
use transformer_train::mt::{self, CorpusSources, HELD_OUT_EVERY};

/// The shared data folder beside the repository, or `None` (the test says it skipped) where
/// a checkout has none, unless `TRANSFORMER_REQUIRE_DATA` is set, as the WikiText-2 test does.
fn data_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data");
    if dir.join("ko-en/extra/python-docs").is_dir() {
        return Some(dir);
    }
    assert!(
        std::env::var("TRANSFORMER_REQUIRE_DATA").is_err(),
        "{}: no Korean-English data (ko-en/ with extra/), and TRANSFORMER_REQUIRE_DATA is set",
        dir.display()
    );
    eprintln!(
        "skipping: no Korean-English data at {} (the shared data folder beside the repository)",
        dir.display()
    );
    None
}

#[test]
fn ko_en_all_reads_every_pair_but_the_held_out_ones() {
    let Some(data) = data_dir() else {
        return;
    };
    let train = mt::ko_en_all_train(&data);
    let counts: Vec<(String, usize)> = train
        .iter()
        .map(|s| (s.describe(), s.read().unwrap().len()))
        .collect();
    let expected = [
        (
            "tatoeba/kor.txt columns 1, 0 (all but pairs whose target sentence's MD5 is 1 modulo 20)",
            5475,
        ),
        ("jhe/jhe-koen-dev.ko + .en", 720),
        ("jhe/jhe-koen-eval.ko + .en", 720),
        (
            "python-docs/pydocs.clean.ko + .en (all but pairs 50, 100, 150, ...)",
            39488,
        ),
        (
            "libreoffice/lo-help.ko + .en (all but pairs 50, 100, 150, ...)",
            18294,
        ),
        (
            "libreoffice/lo-ui.ko + .en (all but pairs 50, 100, 150, ...)",
            14391,
        ),
        ("ud-pud/pud.ko + .en", 1000),
    ];
    let expected: Vec<(String, usize)> =
        expected.iter().map(|(n, c)| (n.to_string(), *c)).collect();
    assert_eq!(counts, expected);
    assert_eq!(HELD_OUT_EVERY, 50);

    // The corpus's files are these, validated and tested on the news sets.
    let files = mt::corpus_files(Corpus::KoEnAll, &data);
    assert_eq!(files.train, train);
    assert!(files
        .valid
        .describe()
        .contains("korean-english-park.dev.ko"));
    let test = files.test.unwrap();
    assert!(test.describe().contains("korean-english-park.test.ko"));
    // ko-en's training sources are ko-en-all's first three, Tatoeba without its held-out
    // sentences.
    assert_eq!(
        mt::corpus_files(Corpus::KoEn, &data).train[1..],
        train[1..3]
    );

    // The test sets: the news test, NTREX-128 and the three held-out slices.
    let sets = mt::ko_en_test_sets(&data);
    let names: Vec<&str> = sets.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "news-v1-test",
            "ntrex128",
            "tatoeba-heldout",
            "python-docs-heldout",
            "lo-help-heldout",
            "lo-ui-heldout"
        ]
    );
    assert_eq!(sets[0].1, test);
    let sizes: Vec<usize> = sets.iter().map(|(_, s)| s.read().unwrap().len()).collect();
    assert_eq!(sizes, [2000, 1997, 274, 805, 373, 293]);
    // Training drops the pairs of all of them: 109 training lines repeat a held-out pair
    // (short LibreOffice strings in both help and UI, a few Python-docs paragraphs), none
    // repeats a news or NTREX pair.
    let exclude: Vec<PairSource> = sets.iter().map(|(_, s)| s.clone()).collect();
    assert_eq!(files.exclude, exclude);
    assert!(mt::corpus_files(Corpus::KoEn, &data).exclude.is_empty());
    let held: HashSet<(String, String)> = {
        let p = PairSource::read_all(&exclude).unwrap();
        p.src.into_iter().zip(p.tgt).collect()
    };
    let repeats: Vec<usize> = train
        .iter()
        .map(|s| {
            let p = s.read().unwrap();
            p.src
                .into_iter()
                .zip(p.tgt)
                .filter(|pair| held.contains(pair))
                .count()
        })
        .collect();
    assert_eq!(repeats, [0, 0, 0, 5, 55, 49, 0]);
    for (name, source) in &sets[..3] {
        let p = source.read().unwrap();
        let trained: HashSet<(String, String)> = {
            let t = PairSource::read_all(&train).unwrap();
            t.src.into_iter().zip(t.tgt).collect()
        };
        let shared = p
            .src
            .into_iter()
            .zip(p.tgt)
            .filter(|pair| trained.contains(pair))
            .count();
        assert_eq!(shared, 0, "{name}");
    }
}

#[test]
fn reverse_exchanges_every_split_and_the_language_codes() {
    let Some(data) = data_dir() else {
        return;
    };
    let cfg = MtTrainConfig {
        corpus: Some(Corpus::KoEnAll),
        data: Some(data.clone()),
        ..MtTrainConfig::default()
    };
    assert_eq!(
        cfg.language_pair(),
        Some(("ko".to_string(), "en".to_string()))
    );
    let forward = cfg.sources().unwrap();
    let reversed_cfg = MtTrainConfig {
        reverse: true,
        ..cfg.clone()
    };
    assert_eq!(
        reversed_cfg.language_pair(),
        Some(("en".to_string(), "ko".to_string()))
    );
    let back = reversed_cfg.sources().unwrap();
    let (f, b) = (forward.valid.read().unwrap(), back.valid.read().unwrap());
    assert_eq!((&f.src, &f.tgt), (&b.tgt, &b.src));
    assert!(b.src[0].is_ascii(), "English first: {}", b.src[0]);
    assert_eq!(back.train.len(), forward.train.len());
    let (f, b) = (
        forward.train[0].read().unwrap(),
        back.train[0].read().unwrap(),
    );
    assert_eq!((&f.src, &f.tgt), (&b.tgt, &b.src));
    let (f, b) = (
        forward.test.unwrap().read().unwrap(),
        back.test.unwrap().read().unwrap(),
    );
    assert_eq!((f.src, f.tgt), (b.tgt, b.src));
    // `mt eval --test-set` names the same sets, in the run's direction.
    let names = |c: &MtTrainConfig| -> Vec<String> {
        c.eval_sets().unwrap().into_iter().map(|(n, _)| n).collect()
    };
    let want = [
        "valid",
        "news-v1-test",
        "ntrex128",
        "tatoeba-heldout",
        "python-docs-heldout",
        "lo-help-heldout",
        "lo-ui-heldout",
    ];
    assert_eq!(names(&cfg), want);
    assert_eq!(names(&reversed_cfg), want);
    let (f, b) = (
        &cfg.eval_sets().unwrap()[3].1,
        &reversed_cfg.eval_sets().unwrap()[3].1,
    );
    let (f, b) = (f.read().unwrap(), b.read().unwrap());
    assert_eq!((f.src, f.tgt), (b.tgt, b.src));
}

/// Tatoeba's held-out sentences are the test split `scripts/split_ko_en_tatoeba.py` writes
/// (Python's `hashlib.md5`, the reference for the hash rule), and no English sentence of
/// them is trained on, whichever Korean translation it comes with.
#[test]
fn tatoeba_is_held_out_by_sentence_as_the_split_script_does() {
    let Some(data) = data_dir() else {
        return;
    };
    let out = tempfile_dir("tatoeba-split");
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/split_ko_en_tatoeba.py");
    let status = std::process::Command::new("python3")
        .arg(&script)
        .arg(data.join("ko-en"))
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("python3 runs the split script");
    assert!(status.success());
    let lines = |f: &str| -> Vec<String> {
        std::fs::read_to_string(out.join(f))
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    };
    let sets = mt::ko_en_test_sets(&data);
    let (_, tatoeba) = sets.iter().find(|(n, _)| n == "tatoeba-heldout").unwrap();
    let held = tatoeba.read().unwrap();
    assert_eq!(held.src, lines("test.ko"));
    assert_eq!(held.tgt, lines("test.en"));
    let held_en: HashSet<&String> = held.tgt.iter().collect();
    let train = mt::ko_en_all_train(&data);
    let trained = train[0].read().unwrap();
    assert_eq!(trained.len() + held.len(), 5749);
    assert!(trained.tgt.iter().all(|en| !held_en.contains(en)));
    // Several Korean translations of one held-out sentence stay together.
    assert!(held_en.len() < held.len());
    std::fs::remove_dir_all(&out).ok();
}

/// A fresh empty folder under the system's temporary folder.
fn tempfile_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
