//! The WikiText-2 language model of PyTorch's "Language Modeling with nn.Transformer and
//! torchtext" tutorial: its data pipeline, training loop, evaluation and checkpoints.
//!
//! The loop, in the tutorial's order: for each epoch, for each `bptt` window of the
//! batchified training stream: forward under the causal mask, cross-entropy, backward, clip
//! the gradient norm to 0.5, SGD step; log every 200 batches; at the end of the epoch
//! evaluate on validation, keep the best model, step the learning rate (x0.95). At the end,
//! evaluate the best model on test.
//!
//! One addition to the tutorial, on by default (`average_decay`, 0 turns it off): a moving
//! average of the weights ([`crate::average`]) is validated beside the SGD weights at every
//! epoch end, and whichever of the two has the lower validation loss is the best model. It is
//! a read-out only: the training steps, and so the SGD weights' log and validation figures,
//! are exactly the tutorial's. The best SGD weights are kept too and tested at the end, so
//! the tutorial's own result is always reported.
//!
//! A run directory holds everything about a run:
//!
//! | file | what |
//! |---|---|
//! | `config.toml` | the resolved configuration |
//! | `vocab.txt` | the vocabulary, one token per line in id order |
//! | `checkpoint.safetensors` | latest resumable state: weights + position, RNG, best loss |
//! | `best.safetensors` | the weights with the lowest validation loss so far |
//! | `best-sgd.safetensors` | the same among the SGD weights only (when averaging) |
//! | `metrics.jsonl` | one JSON object per log line, validation and test result |
//! | `loss.svg` | training and validation loss against the step |

use crate::checkpoint;
use crate::error::{Error, Result};
use crate::runner::{self, ModelConfig, RunConfig};
use candle_core::{DType, Device};
use serde::Serialize;
use std::path::Path;
use transformer_model::{LmConfig, ParamBuilder, TransformerLm};
use transformer_text::batch::batchify;
use transformer_text::corpus::read_split_with;
use transformer_text::Vocab;

mod config;
mod data;
mod files;
mod task;

pub use config::*;
pub use data::*;
pub use files::*;
use task::*;

/// Format tag written into checkpoints and checked on load.
pub const CHECKPOINT_FORMAT: &str = "transformer-lm-checkpoint/1";
/// Format tag of model-only weight files (`best.safetensors`).
pub const WEIGHTS_FORMAT: &str = "transformer-lm-weights/1";

/// Trains (or resumes) a run on the [`crate::runner`]; see the module docs for the loop and
/// the files.
pub fn train(opts: &TrainOptions, progress: &mut dyn Progress) -> Result<Summary> {
    Ok(runner::train(LmSetup, opts, progress)?.1)
}

/// Imports the tutorial's PyTorch `TransformerModel` (either tutorial version's names, see
/// [`transformer_model::import::LmLayout`]) saved with
/// `safetensors.torch.save_file(model.state_dict(), FILE)` and its vocabulary (one token per
/// line in index order) into a new run directory that `eval` and `generate` can use. Sizes
/// are read from the tensors; the head count is not stored by PyTorch and must be given.
pub fn import_torch(
    state_dict: &Path,
    vocab_file: &Path,
    nhead: usize,
    out: &Path,
) -> Result<(LmConfig, transformer_model::import::LmLayout)> {
    let dev = Device::Cpu;
    let (tensors, _) = checkpoint::load(state_dict, &dev)?;
    let bad = |msg: String| Error::Checkpoint {
        path: state_dict.to_path_buf(),
        msg,
    };
    let (tensors, layout) =
        transformer_model::import::lm_from_torch_layout(tensors).map_err(bad)?;
    let dims = |name: &str| -> Result<Vec<usize>> {
        tensors.get(name).map(|t| t.dims().to_vec()).ok_or_else(|| {
            bad(format!(
                "no tensor {name:?}: expected the state dict of the tutorial's TransformerModel \
                 (embedding, transformer_encoder.layers.N.*, linear)"
            ))
        })
    };
    let emb = dims("embedding.weight")?;
    let (ntoken, d_model) = (emb[0], emb[1]);
    let d_hid = dims("transformer_encoder.layers.0.linear1.weight")?[0];
    let nlayers = (0..)
        .take_while(|i| {
            tensors.contains_key(&format!("transformer_encoder.layers.{i}.norm1.weight"))
        })
        .count();
    let vocab = Vocab::load(vocab_file)?;
    if vocab.len() != ntoken {
        return Err(Error::Usage(format!(
            "{} has {} tokens but the model's embedding has {ntoken} rows: pass the vocabulary the model was trained with",
            vocab_file.display(),
            vocab.len()
        )));
    }
    let config = LmConfig {
        ntoken,
        d_model,
        nhead,
        d_hid,
        nlayers,
        ..LmConfig::default()
    };
    config.validate()?;
    let pb = ParamBuilder::new(DType::F32, &dev, 0);
    TransformerLm::new(&pb, &config)?;
    let params = pb.params();
    let ours = transformer_model::import::from_torch(&tensors)?;
    params.assign(&ours).map_err(|e| bad(e.to_string()))?;
    std::fs::create_dir_all(out).map_err(|source| Error::Io {
        path: out.into(),
        source,
    })?;
    let train_cfg = LmTrainConfig {
        emsize: d_model,
        nhid: d_hid,
        nlayers,
        nhead,
        ..LmTrainConfig::default()
    };
    checkpoint::write_atomic(&config_path(out), train_cfg.to_toml().as_bytes())?;
    vocab.save(&vocab_path(out))?;
    config.save(&best_path(out), &params)?;
    Ok((config, layout))
}

/// Loss, perplexity and token count of a text file under a run's model, evaluated like the
/// tutorial's `evaluate` (tokenized with its vocabulary, batchified into `batch_size`
/// columns, `bptt` windows, each window's loss weighted by its length).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct EvalResult {
    /// Mean cross-entropy per predicted token, in nats.
    pub loss: f64,
    /// Perplexity, `exp(loss)`.
    pub ppl: f64,
    /// The number of predicted tokens.
    pub tokens: usize,
}

/// Evaluates the text file `text` under the loaded model; see [`EvalResult`].
pub fn evaluate_file(
    lm: &LoadedLm,
    text: &Path,
    batch_size: usize,
    bptt: usize,
    device: &Device,
) -> Result<EvalResult> {
    let ids = read_split_with(text, &lm.vocab, lm.line_end)?;
    let data = batchify(&ids, batch_size).map_err(|e| Error::Config {
        path: text.into(),
        msg: e.to_string(),
    })?;
    let loss = evaluate(&lm.model, &data, bptt, device)?;
    Ok(EvalResult {
        loss,
        ppl: loss.exp(),
        tokens: (data.rows - 1) * data.cols,
    })
}
