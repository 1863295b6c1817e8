//! Errors of the training crate; each names the file involved and says what to do.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a usable checkpoint: {msg}")]
    Checkpoint { path: PathBuf, msg: String },
    #[error("{path}: {msg}")]
    Config { path: PathBuf, msg: String },
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Text(#[from] transformer_text::Error),
    #[error(transparent)]
    Model(#[from] transformer_model::ConfigError),
    #[error(transparent)]
    Tensor(#[from] candle_core::Error),
}

pub type Result<T> = std::result::Result<T, Error>;
