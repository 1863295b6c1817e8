//! Translation: an encoder-decoder Transformer trained on a parallel corpus (Multi30k
//! German-English, Korean-English, or any pair of files), decoded with greedy or beam search
//! and scored with BLEU.
//!
//! The loop: for each epoch, for each length-bucketed batch (a new order every epoch):
//! forward under the padding and causal masks, label-smoothed cross-entropy over the
//! non-padding target tokens, backward, clip the gradient norm, Adam with the paper's warm-up
//! schedule (section 5.3); log every `log_interval` batches; at the end of the epoch
//! validation loss, perplexity and BLEU (greedy), keep the best model by validation BLEU.
//! At the end, the best model is scored on the test set (when one is given) with beam search.
//!
//! A run directory holds:
//!
//! | file | what |
//! |---|---|
//! | `config.toml` | the resolved configuration |
//! | `tokenizer.json` | the joint tokenizer (source and target; BPE unless `--tokenizer words`) |
//! | `checkpoint.safetensors` | latest resumable state: weights, Adam moments, position, RNG |
//! | `best.safetensors` | the weights with the best validation BLEU so far |
//! | `metrics.jsonl` | log lines, validation and test results |
//! | `loss.svg` | training and validation loss against the step |
//! | `test.hyp` | the test set's translations by the best model |

mod config;
mod corpus;
mod data;
mod files;
mod scoring;
mod task;
mod training;
mod vocab_map;

pub use config::*;
pub use corpus::*;
pub use data::*;
pub use files::*;
use scoring::*;
use task::*;
pub use training::*;
pub use vocab_map::*;

// What training uses of the runtime: the run's configuration, the model, loading and
// decoding (validation BLEU and the test set are decoded as `mt translate` decodes).
use transformer_runtime::config::*;
use transformer_runtime::load::*;
use transformer_runtime::model::{Arch, MtModel, MtModelConfig};
use transformer_runtime::translate::*;

/// Translation weight files hold their [`MtModelConfig`] ([`crate::runner::ModelConfig::save`]).
impl crate::runner::ModelConfig for MtModelConfig {
    type Model = MtModel;
    const WEIGHTS_FORMAT: &'static str = WEIGHTS_FORMAT;
    fn build(&self, pb: &transformer_model::ParamBuilder) -> transformer_model::Result<MtModel> {
        MtModel::build(pb, self)
    }
}
