//! Vocabulary restriction for decoding (CTranslate2's `vmap` idea): the output layer scores
//! only the target tokens a batch's sources make plausible, instead of the whole vocabulary.
//!
//! The map is learnt from the run's training pairs, encoded with the run's tokenizer:
//! - `always`: the `frequent` most frequent target tokens (function words, punctuation,
//!   common subword endings) and `<eos>`, candidates for every sentence;
//! - for each source token `s`, the `per_source` target tokens `t` with the highest Dice
//!   coefficient `2 c(s,t) / (c(s) + c(t))` over sentence pairs (`c` counts the pairs a token
//!   occurs in, `c(s,t)` the pairs both occur in): the tokens `s` is translated by.
//!
//! A batch's candidates are `always` and the lists of every source token in it. Where the
//! model's best token is not among them the restricted search differs from the full one;
//! `mt eval` and `bench mt-decode` measure by how much (docs/MT.md).

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::path::Path;

/// How a map is learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VocabMapOptions {
    /// Candidates per source token.
    pub per_source: usize,
    /// The most frequent target tokens, always candidates.
    pub frequent: usize,
}

impl Default for VocabMapOptions {
    fn default() -> Self {
        Self {
            per_source: 20,
            frequent: 500,
        }
    }
}

/// The candidate target tokens: for every sentence, and by source token.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VocabMap {
    /// The format tag of the file.
    pub format: String,
    /// The vocabulary size the map was learnt for (the run's tokenizer's).
    pub vocab: usize,
    /// Candidates of every sentence, ascending.
    pub always: Vec<u32>,
    /// Candidates by source token id (empty for a token never seen in training).
    pub by_source: Vec<Vec<u32>>,
}

/// The format tag of `vocab_map.json`.
pub const FORMAT: &str = "transformer-mt-vocab-map/1";

/// The file name inside a run directory.
pub const FILE: &str = "vocab_map.json";

impl VocabMap {
    /// Learns a map from encoded training pairs (`src[i]` translated by `tgt[i]`, token ids
    /// below `vocab`); `eos` is always a candidate.
    pub fn learn(
        src: &[Vec<u32>],
        tgt: &[Vec<u32>],
        vocab: usize,
        eos: u32,
        opts: VocabMapOptions,
    ) -> Self {
        let mut src_count = vec![0u32; vocab];
        let mut tgt_count = vec![0u32; vocab];
        let mut tgt_tokens = vec![0u64; vocab];
        let mut pair: Vec<HashMap<u32, u32>> = vec![HashMap::new(); vocab];
        let unique = |ids: &[u32]| {
            let mut u: Vec<u32> = ids
                .iter()
                .copied()
                .filter(|&i| (i as usize) < vocab)
                .collect();
            u.sort_unstable();
            u.dedup();
            u
        };
        for (s, t) in src.iter().zip(tgt) {
            for &id in t {
                if let Some(n) = tgt_tokens.get_mut(id as usize) {
                    *n += 1;
                }
            }
            let (s, t) = (unique(s), unique(t));
            for &b in &t {
                tgt_count[b as usize] += 1;
            }
            for &a in &s {
                src_count[a as usize] += 1;
                let row = &mut pair[a as usize];
                for &b in &t {
                    *row.entry(b).or_insert(0) += 1;
                }
            }
        }
        let mut by_freq: Vec<u32> = (0..vocab as u32).collect();
        // Most frequent first (tokens never in a target last); ties by id, so the map is the
        // same on every machine and `frequent` >= the vocabulary makes every token a candidate.
        by_freq.sort_by_key(|&i| (std::cmp::Reverse(tgt_tokens[i as usize]), i));
        let mut always: Vec<u32> = by_freq.into_iter().take(opts.frequent).collect();
        always.push(eos);
        always.sort_unstable();
        always.dedup();
        let by_source = pair
            .into_iter()
            .enumerate()
            .map(|(a, row)| {
                let mut scored: Vec<(f64, u32)> = row
                    .into_iter()
                    .map(|(b, both)| {
                        let dice =
                            2.0 * f64::from(both) / f64::from(src_count[a] + tgt_count[b as usize]);
                        (dice, b)
                    })
                    .collect();
                scored.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
                let mut top: Vec<u32> = scored
                    .into_iter()
                    .take(opts.per_source)
                    .map(|(_, b)| b)
                    .collect();
                top.sort_unstable();
                top
            })
            .collect();
        Self {
            format: FORMAT.to_string(),
            vocab,
            always,
            by_source,
        }
    }

    /// The candidates of a batch of sources, ascending and without repeats.
    pub fn candidates<'a>(&self, sources: impl IntoIterator<Item = &'a [u32]>) -> Vec<u32> {
        let mut keep = vec![false; self.vocab];
        for &t in &self.always {
            keep[t as usize] = true;
        }
        for s in sources {
            for &a in s {
                if let Some(list) = self.by_source.get(a as usize) {
                    for &t in list {
                        keep[t as usize] = true;
                    }
                }
            }
        }
        (0..self.vocab as u32)
            .filter(|&t| keep[t as usize])
            .collect()
    }

    /// Writes the map as JSON.
    pub fn save(&self, path: &Path) -> Result<()> {
        let json = serde_json::to_string(self).map_err(|e| Error::Config {
            path: path.into(),
            msg: e.to_string(),
        })?;
        crate::checkpoint::write_atomic(path, json.as_bytes())
    }

    /// Reads a map written by [`VocabMap::save`], checking that it was learnt for a
    /// vocabulary of `vocab` tokens.
    pub fn load(path: &Path, vocab: usize) -> Result<Self> {
        let text = crate::run_dir::read_text(path)?;
        let map: VocabMap = serde_json::from_str(&text).map_err(|e| Error::Config {
            path: path.into(),
            msg: format!("not a vocabulary map ({e}); write one with `transformer mt vocab-map`"),
        })?;
        if map.format != FORMAT {
            return Err(Error::Config {
                path: path.into(),
                msg: format!("format {:?}, expected {FORMAT:?}", map.format),
            });
        }
        if map.vocab != vocab || map.by_source.len() != vocab {
            return Err(Error::Config {
                path: path.into(),
                msg: format!(
                    "learnt for a vocabulary of {} tokens, but the run's tokenizer has {vocab}: \
                     write it again with `transformer mt vocab-map`",
                    map.vocab
                ),
            });
        }
        if map
            .always
            .iter()
            .chain(map.by_source.iter().flatten())
            .any(|&t| t as usize >= vocab)
        {
            return Err(Error::Config {
                path: path.into(),
                msg: format!("a token id beyond the vocabulary of {vocab}"),
            });
        }
        Ok(map)
    }
}

impl transformer_model::restrict::CandidateVocab for VocabMap {
    fn candidates(&self, sources: &[&[u32]]) -> Vec<u32> {
        VocabMap::candidates(self, sources.iter().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Source token 10 is always translated by 20, 11 by 21; 30 is in every target.
    #[test]
    fn learns_translation_candidates_and_the_frequent_tokens() {
        let src = vec![vec![10, 12], vec![11, 12], vec![10, 11], vec![10]];
        let tgt = vec![
            vec![20, 30, 2],
            vec![21, 30, 2],
            vec![20, 21, 30, 2],
            vec![20, 30, 2],
        ];
        let opts = VocabMapOptions {
            per_source: 1,
            frequent: 1,
        };
        let m = VocabMap::learn(&src, &tgt, 40, 2, opts);
        // 30 and <eos> (2) occur in every target; ties go to the lower id, so `always` is
        // the one most frequent token (2) and <eos>.
        assert_eq!(m.always, vec![2]);
        assert_eq!(m.by_source[10], vec![20]);
        assert_eq!(m.by_source[11], vec![21]);
        assert!(m.by_source[13].is_empty());
        assert_eq!(m.candidates([&[10u32][..]]), vec![2, 20]);
        assert_eq!(m.candidates([&[10u32][..], &[11, 39][..]]), vec![2, 20, 21]);

        let dir = std::env::temp_dir().join(format!("vmap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(FILE);
        m.save(&p).unwrap();
        assert_eq!(VocabMap::load(&p, 40).unwrap(), m);
        let e = VocabMap::load(&p, 41).unwrap_err().to_string();
        assert!(e.contains("vocabulary of 40 tokens"), "{e}");
        std::fs::write(&p, "{}").unwrap();
        assert!(VocabMap::load(&p, 40).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
