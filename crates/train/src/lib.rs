//! Training: losses, optimizers, learning-rate schedules, gradient clipping, and the
//! copy task (the Annotated Transformer's end-to-end smoke test).

pub mod clip;
pub mod copy_task;
pub mod loss;
pub mod optim;

pub use clip::clip_grad_norm;
pub use loss::cross_entropy;
pub use optim::{Adam, NoamSchedule, Sgd};
