//! Saving a translation model's weights ([`save_weights`]); loading them is the runtime's
//! ([`load_run`]).

use super::*;
use crate::error::Result;
use crate::runner;
use std::path::Path;
use transformer_model::Params;

/// Saves model weights with the model config needed to rebuild it.
pub fn save_weights(path: &Path, params: &Params, model: &MtModelConfig) -> Result<()> {
    runner::ModelConfig::save(model, path, params)
}
