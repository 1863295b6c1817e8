//! The real WikiText-2 splits, read in place from `../shared/data/wikitext-2` (relative to the
//! repository root) or from `$WIKITEXT2_DIR`; the test prints a message and passes if neither
//! exists.
//!
//! Expected numbers come from `crates/text/scripts/torchtext_reference.py`, which runs
//! torchtext's tokenizer pattern table with Python's `re` and torchtext's vocabulary sort.
//! The vocabulary size, 28,782, is also the `ntokens` the PyTorch tutorial reports, and 2928 is
//! the batch count in its training log lines.

use std::path::PathBuf;

use transformer_text::{basic_english, batchify, Corpus, Split, Vocab};

fn data_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("WIKITEXT2_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/wikitext-2"),
    };
    if dir.join("train.txt").is_file() {
        Some(dir)
    } else {
        eprintln!(
            "skipping: no WikiText-2 at {} (set WIKITEXT2_DIR to a folder with train.txt, \
             valid.txt, test.txt)",
            dir.display()
        );
        None
    }
}

/// 64-bit FNV-1a, the hash the reference script prints.
fn fnv1a64(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn ids_hash(ids: &[u32]) -> u64 {
    fnv1a64(ids.iter().flat_map(|id| id.to_le_bytes()))
}

#[test]
fn wikitext2_matches_the_tutorial() {
    let Some(dir) = data_dir() else { return };
    let corpus = Corpus::load(&dir).unwrap();
    let vocab = &corpus.vocab;

    assert_eq!(vocab.len(), 28_782);
    assert_eq!(
        &vocab.tokens()[..12],
        ["<unk>", "the", ",", ".", "of", "and", "in", "to", "a", "=", "was", "'"]
    );
    assert_eq!(
        fnv1a64(vocab.tokens().join("\n").into_bytes()),
        0x651f_2e86_35c7_eeb7
    );

    let expected = [
        (Split::Train, 2_049_990, 54_625, 0xb6b0_22c9_606f_452e_u64),
        (Split::Valid, 214_417, 11_718, 0x55c0_0060_2d80_4783),
        (Split::Test, 241_859, 15_218, 0x8877_6906_f40c_3cfc),
    ];
    for (split, tokens, unks, hash) in expected {
        let ids = corpus.split(split);
        assert_eq!(ids.len(), tokens, "{split} tokens");
        assert_eq!(
            ids.iter().filter(|&&id| id == 0).count(),
            unks,
            "{split} <unk>"
        );
        assert_eq!(ids_hash(ids), hash, "{split} ids");
    }

    let train = batchify(&corpus.train, 20).unwrap();
    let valid = batchify(&corpus.valid, 10).unwrap();
    let test = batchify(&corpus.test, 10).unwrap();
    assert_eq!((train.rows, train.cols), (102_499, 20));
    assert_eq!((valid.rows, valid.cols), (21_441, 10));
    assert_eq!((test.rows, test.cols), (24_185, 10));
    assert_eq!(
        (train.tutorial_num_batches(35), train.num_windows(35)),
        (2928, 2929)
    );
    assert_eq!(
        (valid.tutorial_num_batches(35), valid.num_windows(35)),
        (612, 613)
    );
    assert_eq!(
        (test.tutorial_num_batches(35), test.num_windows(35)),
        (691, 691)
    );
    assert_eq!(train.windows(35).count(), 2929);
    let last = train.windows(35).last().unwrap();
    assert_eq!(
        (last.start, last.seq_len),
        (2928 * 35, 102_499 - 1 - 2928 * 35)
    );

    // The first line with text, " = Valkyria Chronicles III = ".
    let title = vocab.encode(basic_english(" = Valkyria Chronicles III = \n"));
    assert_eq!(&corpus.train[..5], title.as_slice());
    assert_eq!(
        vocab.decode(&corpus.train[..5]),
        "= valkyria chronicles iii ="
    );

    eprintln!(
        "WikiText-2: vocab {}, tokens train {} valid {} test {}, \
         batchify train {:?} valid {:?} test {:?}",
        vocab.len(),
        corpus.train.len(),
        corpus.valid.len(),
        corpus.test.len(),
        (train.rows, train.cols),
        (valid.rows, valid.cols),
        (test.rows, test.cols),
    );
}

#[test]
fn wikitext2_vocab_file_round_trips() {
    let Some(dir) = data_dir() else { return };
    let vocab = transformer_text::build_vocab(&dir.join("train.txt")).unwrap();
    let path = std::env::temp_dir().join(format!("wikitext2-{}.vocab", std::process::id()));
    vocab.save(&path).unwrap();
    let loaded = Vocab::load(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(loaded, vocab);

    let valid = transformer_text::read_split(&dir.join("valid.txt"), &loaded).unwrap();
    assert_eq!(valid.len(), 214_417);
}
