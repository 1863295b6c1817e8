//! Learning a run's vocabulary map ([`VocabMap`]) from the pairs it trained on.

use super::*;
use crate::error::Result;
use std::path::Path;
use transformer_runtime::vocab_map::{VocabMap, VocabMapOptions};

/// Learns the map of a trained run from its training pairs (its `config.toml`'s sources, as
/// training read them, held-out pairs excluded), encoded with its tokenizer. Returns the map
/// and the number of pairs it was learnt from.
pub fn learn_vocab_map(run: &Path, opts: VocabMapOptions) -> Result<(VocabMap, usize)> {
    use transformer_text::TextTokenizer;
    let config = MtTrainConfig::from_toml_file(&config_path(run))?;
    let tokenizer = transformer_text::Subword::load(&tokenizer_path(run))?;
    let files = config.sources()?;
    let mut pairs = transformer_text::parallel::PairSource::read_all(&files.train)?;
    if !files.exclude.is_empty() {
        let held = transformer_text::parallel::PairSource::read_all(&files.exclude)?;
        let held: std::collections::HashSet<(String, String)> =
            held.src.into_iter().zip(held.tgt).collect();
        let kept: (Vec<String>, Vec<String>) = pairs
            .src
            .into_iter()
            .zip(pairs.tgt)
            .filter(|p| !held.contains(p))
            .unzip();
        pairs = transformer_text::parallel::Pairs {
            src: kept.0,
            tgt: kept.1,
        };
    }
    let n = pairs.src.len();
    let data = EncodedSplit::encode(pairs, &tokenizer);
    let map = VocabMap::learn(
        &data.src,
        &data.tgt,
        tokenizer.vocab_size(),
        tokenizer.specials().eos,
        opts,
    );
    Ok((map, n))
}
