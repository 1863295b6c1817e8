//! Compares the subword tokenizers on a corpus before any training: for each kind (BPE,
//! BPE with byte fallback, unigram, unigram with byte fallback), trained on the corpus's
//! training pairs as `mt train` trains it, the share of `<unk>` pieces and the pieces per
//! sentence on each side of the validation set and of every set the corpus names
//! (`mt eval --test-set`).
//!
//! ```sh
//! cargo run --release -p transformer-train --example compare_tokenizers -- ko-en-all 8000
//! ```

use std::path::Path;
use transformer_runtime::config::Corpus;
use transformer_runtime::config::MtTrainConfig;
use transformer_runtime::config::TokenizerKind;
use transformer_text::subword::TextTokenizer;
use transformer_train::mt::{self, CorpusSources};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let corpus: Corpus = args.get(1).map_or("ko-en-all", String::as_str).parse()?;
    let vocab: usize = args.get(2).map_or(Ok(8000), |v| v.parse())?;
    let cfg = MtTrainConfig {
        corpus: Some(corpus),
        ..MtTrainConfig::default()
    };
    let files = cfg.sources()?;
    let train = transformer_text::parallel::PairSource::read_all(&files.train)?;
    let sets = cfg.eval_sets()?;
    let read: Vec<(String, transformer_text::parallel::Pairs)> = sets
        .into_iter()
        .map(|(n, s)| s.read().map(|p| (n, p)))
        .collect::<Result<_, _>>()?;
    println!(
        "corpus {corpus:?}, vocabulary {vocab}, {} training pairs; per set: <unk> share of the \
         pieces (source / target), pieces per sentence (source / target)",
        train.len()
    );
    for kind in [
        TokenizerKind::Bpe,
        TokenizerKind::BpeBytes,
        TokenizerKind::Unigram,
        TokenizerKind::UnigramBytes,
    ] {
        let t0 = std::time::Instant::now();
        let texts = train.src.iter().chain(&train.tgt);
        let tok = mt::train_tokenizer(kind, vocab, texts, Path::new("train"))?;
        println!(
            "\n{} (trained in {:.1}s, {} ids)",
            kind.describe(),
            t0.elapsed().as_secs_f64(),
            tok.vocab_size()
        );
        for (name, pairs) in &read {
            let side = |lines: &[String]| {
                let (mut pieces, mut unk) = (0usize, 0usize);
                for l in lines {
                    let ids = tok.encode(l);
                    pieces += ids.len();
                    unk += ids.iter().filter(|&&i| i == tok.specials().unk).count();
                }
                (
                    100.0 * unk as f64 / pieces.max(1) as f64,
                    pieces as f64 / lines.len().max(1) as f64,
                )
            };
            let (su, sp) = side(&pairs.src);
            let (tu, tp) = side(&pairs.tgt);
            println!("  {name:<22} unk {su:6.3}% / {tu:6.3}%   pieces {sp:6.1} / {tp:6.1}");
        }
    }
    Ok(())
}
