//! Training: losses, one backward pass's gradients ([`Gradients`]), optimizers,
//! learning-rate schedules, gradient clipping, checkpoints,
//! metrics, the tutorial's WikiText-2 language model loop, and the copy task (the Annotated
//! Transformer's end-to-end smoke test).
//!
//! # Example
//! The paper's learning-rate schedule, and a few clipped SGD steps on a cross-entropy:
//!
//! ```
//! use candle_core::{DType, Device, Tensor, Var};
//! use transformer_train::{clip_grad_norm, cross_entropy, Gradients, NoamSchedule, Sgd};
//!
//! // Section 5.3: the rate rises for `warmup` steps, then decays as step^-0.5.
//! let noam = NoamSchedule { d_model: 512, warmup: 4000, factor: 1.0 };
//! assert!(noam.lr(1) < noam.lr(4000) && noam.lr(4000) > noam.lr(8000));
//! assert!((noam.lr(4000) - (512.0f64 * 4000.0).powf(-0.5)).abs() < 1e-12);
//!
//! // Free logits for 3 positions over 4 tokens, the last position padding (target 0).
//! let device = Device::Cpu;
//! let logits = Var::zeros((3, 4), DType::F32, &device)?;
//! let targets = Tensor::new(&[1u32, 3, 0], &device)?;
//! let (first, counted) = cross_entropy(logits.as_tensor(), &targets, Some(0))?;
//! assert_eq!(counted, 2);
//! assert!((first.to_scalar::<f32>()? - 4f32.ln()).abs() < 1e-6); // uniform: ln V
//!
//! let mut sgd = Sgd::new(vec![logits.clone()], 1.0);
//! for _ in 0..10 {
//!     let (loss, _) = cross_entropy(logits.as_tensor(), &targets, Some(0))?;
//!     let mut grads = Gradients::backward(&loss, sgd.vars())?;
//!     clip_grad_norm(&mut grads, 0.5)?; // gradient norm at most 0.5
//!     sgd.step(&grads, 1.0)?;
//! }
//! let (last, _) = cross_entropy(logits.as_tensor(), &targets, Some(0))?;
//! assert!(last.to_scalar::<f32>()? < first.to_scalar::<f32>()?);
//! # Ok::<(), candle_core::Error>(())
//! ```

#![warn(missing_docs)]

pub mod average;
pub mod clip;
pub mod copy_task;
pub mod dist;
pub mod grads;
pub mod lm;
pub mod loss;
pub mod metrics;
pub mod mt;
pub mod optim;
mod par;
pub mod precision;
pub mod runner;
pub mod runtime;

// Errors and weight files are the runtime's: training writes the files a model is used from.
use transformer_runtime::{checkpoint, error};

pub use clip::clip_grad_norm;
pub use error::{Error, Result};
pub use grads::Gradients;
pub use loss::cross_entropy;
pub use optim::{Adam, NoamSchedule, Sgd};
