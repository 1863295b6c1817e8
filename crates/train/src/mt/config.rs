//! What training adds to a run's configuration ([`MtTrainConfig`], the runtime's): where its
//! data comes from, and what a resumed run may change.

use super::*;
use crate::error::{Error, Result};
use std::path::PathBuf;
use transformer_text::parallel::PairSource;

/// The settings a resumed run may change besides the runner's
/// ([`crate::runner::RUNNER_MAY_CHANGE`]: how long it trains, what it logs and checkpoints):
/// how it validates and decodes the test set, and where its data lies. The rest (the model,
/// the tokenizer, the optimizer, the batches, the seed) are the run's own.
pub const MAY_CHANGE_ON_RESUME: &[&str] = &[
    "max_valid",
    "beam",
    "length_penalty",
    "max_len_a",
    "max_len_b",
    "data",
    "train_src",
    "train_tgt",
    "valid_src",
    "valid_tgt",
    "test_src",
    "test_tgt",
];

/// What `--precision bf16` runs in bf16, as the log says it: the output layer's products and,
/// in the Transformer, the encoder and decoder layers' projection and feed-forward products
/// (`EncoderLayerOptions::precision`), all on the same bf16 unit.
pub(super) const BF16_COVERS: &str =
    "the output layer's products and the Transformer layers' projection \
                           and feed-forward products";

/// The data a run's configuration names, as training reads it.
pub trait CorpusSources {
    /// The train, validation and test sources: the bundled corpus, or the files given.
    fn sources(&self) -> Result<CorpusFiles>;
    /// The sets a trained run can be scored on by name (`mt eval --test-set`), each in the
    /// run's direction: `valid` and `test` (the sources training validated and tested on),
    /// and for `ko-en-all` every held-out test set instead of `test` ([`ko_en_test_sets`]:
    /// `news-v1-test`, `ntrex128`, `tatoeba-heldout`, `python-docs-heldout`,
    /// `lo-help-heldout`, `lo-ui-heldout`).
    fn eval_sets(&self) -> Result<Vec<(String, PairSource)>>;
}

impl CorpusSources for MtTrainConfig {
    fn sources(&self) -> Result<CorpusFiles> {
        let given = |a: &Option<PathBuf>, b: &Option<PathBuf>| match (a, b) {
            (Some(s), Some(t)) => Some(PairSource::Files {
                src: s.clone(),
                tgt: t.clone(),
            }),
            _ => None,
        };
        let mut files = match self.corpus {
            Some(c) => {
                let data = self.data.clone().or_else(default_data_dir).ok_or_else(|| {
                    Error::Usage(
                        "the bundled corpora are read from ../shared/data, which does not \
                         exist here: pass --data DIR (the folder holding multi30k/ and ko-en/)"
                            .into(),
                    )
                })?;
                corpus_files(c, &data)
            }
            None => {
                let (Some(train), Some(valid)) = (
                    given(&self.train_src, &self.train_tgt),
                    given(&self.valid_src, &self.valid_tgt),
                ) else {
                    return Err(Error::Usage(
                        "no data: pass --corpus multi30k-de-en (or ko-en), or all four of \
                         --train-src, --train-tgt, --valid-src, --valid-tgt"
                            .into(),
                    ));
                };
                CorpusFiles {
                    train: vec![train],
                    valid,
                    test: None,
                    exclude: Vec::new(),
                }
            }
        };
        if let Some(t) = given(&self.train_src, &self.train_tgt) {
            files.train = vec![t];
            files.exclude.clear();
        }
        if let Some(v) = given(&self.valid_src, &self.valid_tgt) {
            files.valid = v;
        }
        if let Some(t) = given(&self.test_src, &self.test_tgt) {
            files.test = Some(t);
        }
        if self.reverse {
            files = CorpusFiles {
                train: files.train.iter().map(PairSource::reversed).collect(),
                valid: files.valid.reversed(),
                test: files.test.as_ref().map(PairSource::reversed),
                exclude: files.exclude.iter().map(PairSource::reversed).collect(),
            };
        }
        Ok(files)
    }

    fn eval_sets(&self) -> Result<Vec<(String, PairSource)>> {
        let files = self.sources()?;
        let mut sets = vec![("valid".to_string(), files.valid)];
        if self.corpus == Some(Corpus::KoEnAll) && self.test_src.is_none() {
            for (name, source) in ko_en_held_out(self) {
                let source = if self.reverse {
                    source.reversed()
                } else {
                    source
                };
                sets.push((name, source));
            }
        } else if let Some(test) = files.test {
            sets.push(("test".to_string(), test));
        }
        Ok(sets)
    }
}

impl crate::runner::RunConfig for MtTrainConfig {
    const MAY_CHANGE_ON_RESUME: &'static [&'static str] = MAY_CHANGE_ON_RESUME;
    fn make_paths_absolute(&mut self) {
        MtTrainConfig::make_paths_absolute(self);
    }
    fn recorded_paths(&self) -> Vec<(&'static str, &Option<std::path::PathBuf>)> {
        vec![
            ("train_src", &self.train_src),
            ("train_tgt", &self.train_tgt),
            ("valid_src", &self.valid_src),
            ("valid_tgt", &self.valid_tgt),
            ("test_src", &self.test_src),
            ("test_tgt", &self.test_tgt),
            ("data", &self.data),
        ]
    }
    fn without_averaging(&mut self) {
        self.average_decay = 0.0;
    }
    fn set_precision(&mut self, precision: transformer_model::Precision) {
        self.precision = precision;
    }
}

/// The Korean-English test sets ([`ko_en_test_sets`]) under `cfg`'s data folder (or the
/// default one).
pub(super) fn ko_en_held_out(cfg: &MtTrainConfig) -> Vec<(String, PairSource)> {
    let data = cfg
        .data
        .clone()
        .or_else(default_data_dir)
        .unwrap_or_default();
    ko_en_test_sets(&data)
}
