//! A check that the model's tests and the decoding tests share (the decoding tests include
//! this file by its path).

use candle_core::{Result, Tensor};
use transformer_model::Params;

/// Asserts that backpropagating `loss` gives every parameter of `params` a gradient, and one
/// that is not all zero: training reaches each of them. `what` names the model in the
/// messages.
pub fn assert_every_parameter_has_gradient(
    what: &str,
    loss: &Tensor,
    params: &Params,
) -> Result<()> {
    let grads = loss.backward()?;
    for (name, var) in params.iter() {
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{what}: {name} got no gradient"));
        let norm = g.abs()?.sum_all()?.to_scalar::<f64>()?;
        assert!(norm > 0.0, "{what}: {name} got an all-zero gradient");
    }
    Ok(())
}
