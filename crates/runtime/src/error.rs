//! Errors of the training crate; each names the file involved and says what to do.

use std::path::PathBuf;

/// What can go wrong while training, evaluating or loading a run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A checkpoint or weight file that cannot be resumed from or loaded.
    #[error("{path}: not a usable checkpoint: {msg}")]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// A configuration, data or metrics file that cannot be parsed or used.
    #[error("{path}: {msg}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// Invalid options (a zero size, a negative learning rate...); the message says which.
    #[error("{0}")]
    Usage(String),
    /// An error from reading or tokenizing text.
    #[error(transparent)]
    Text(#[from] transformer_text::Error),
    /// A model configuration that cannot build a model.
    #[error(transparent)]
    Model(#[from] transformer_model::ConfigError),
    /// A tensor operation failed (shapes, devices, dtypes, safetensors I/O).
    #[error(transparent)]
    Tensor(#[from] candle_core::Error),
}

impl Error {
    /// What turns an I/O error on the file `path` into an [`Error::Io`] naming it
    /// (`.map_err(Error::io(&path))`).
    pub fn io(path: &std::path::Path) -> impl Fn(std::io::Error) -> Error + Copy + '_ {
        move |source| Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The training crate's result type.
pub type Result<T> = std::result::Result<T, Error>;
