//! Training: losses, optimizers, learning-rate schedules, gradient clipping, checkpoints,
//! metrics, the tutorial's WikiText-2 language model loop, and the copy task (the Annotated
//! Transformer's end-to-end smoke test).

pub mod average;
pub mod checkpoint;
pub mod clip;
pub mod copy_task;
pub mod error;
pub mod lm;
pub mod loss;
pub mod metrics;
pub mod mt;
pub mod mt_model;
pub mod optim;
mod par;
pub mod runner;
pub mod runtime;

pub use clip::clip_grad_norm;
pub use error::{Error, Result};
pub use loss::cross_entropy;
pub use optim::{Adam, NoamSchedule, Sgd};
