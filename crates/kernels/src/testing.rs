//! The fused layers on plain slices, for the model's tests that compare them with its
//! composed layers (`transformer-model`'s `tests/fused_layers.rs`): the layers' arithmetic
//! with an explicit number of thread groups, without candle's op around it. Not an API.

pub use super::decoder_layer::run_slices as decoder_layer_slices;
pub use super::encoder_layer::run_slices as encoder_layer_slices;
pub use super::float::Float;
pub use super::shared::{LayerShape, Run};
