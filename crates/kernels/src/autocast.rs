//! Mixed precision for the composed layers, the way PyTorch's `torch.autocast` does it: while
//! a [`Bf16Products`] guard is alive on a thread, the matrix products of the composed layers
//! (linear layers, the two products of attention, the output layer) take bf16 operands and
//! give an f32 result; everything else (softmax, layer norm, the loss, the residual sums)
//! stays f32, and so do the weights, their gradients and the optimizer (fp32 master weights).
//! The casts are ops of candle's graph, so the backward pass runs the products' gradients in
//! bf16 too and hands each f32 weight an f32 gradient.
//!
//! This is how the GPU trains in bf16 ([`crate::Precision::Bf16`] off the CPU): the tensor
//! cores run bf16 products at many times their f32 rate. On the CPU, bf16 training goes
//! through the fused kernels instead ([`crate::bf16`]), which convert inside their own
//! blocking; the guard works there too (candle's CPU matmul takes bf16), which is how the
//! tests check it without a GPU.
//!
//! The state is per thread, like autocast's: the products run on the thread that builds the
//! graph, and a guard set on one training thread changes nothing on another.

use candle_core::{DType, Result, Tensor};
use std::cell::Cell;

thread_local! {
    static BF16_PRODUCTS: Cell<bool> = const { Cell::new(false) };
}

/// While alive, [`matmul`] on this thread multiplies f32 operands in bf16. Dropping it
/// restores what was set before (guards nest).
#[derive(Debug)]
#[must_use = "the products are bf16 only while the guard is alive"]
pub struct Bf16Products {
    before: bool,
}

impl Bf16Products {
    /// Turns bf16 products on for this thread until the guard is dropped.
    pub fn on() -> Self {
        let before = BF16_PRODUCTS.with(|c| c.replace(true));
        Self { before }
    }
}

impl Drop for Bf16Products {
    fn drop(&mut self) {
        BF16_PRODUCTS.with(|c| c.set(self.before));
    }
}

/// True while a [`Bf16Products`] guard is alive on this thread.
pub fn bf16_products() -> bool {
    BF16_PRODUCTS.with(Cell::get)
}

/// `a.matmul(b)`; under a [`Bf16Products`] guard, with f32 operands, as bf16 operands and an
/// f32 result (candle's bf16 matmul accumulates in f32: cuBLAS on a GPU, `gemm` on the CPU).
/// Other dtypes (f64 in the parity tests) are never lowered.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if bf16_products() && a.dtype() == DType::F32 && b.dtype() == DType::F32 {
        a.to_dtype(DType::BF16)?
            .matmul(&b.to_dtype(DType::BF16)?)?
            .to_dtype(DType::F32)
    } else {
        a.matmul(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn inputs() -> Result<(Var, Var)> {
        let dev = Device::Cpu;
        let a = Tensor::arange(0f32, 12.0, &dev)?.reshape((3, 4))?;
        let b = (Tensor::arange(0f32, 8.0, &dev)?.reshape((4, 2))? * 0.1)?;
        Ok((Var::from_tensor(&a)?, Var::from_tensor(&b)?))
    }

    #[test]
    fn without_a_guard_the_product_is_candles() -> Result<()> {
        let (a, b) = inputs()?;
        assert!(!bf16_products());
        let ours = matmul(&a, &b)?.to_vec2::<f32>()?;
        assert_eq!(ours, a.matmul(&b)?.to_vec2::<f32>()?);
        Ok(())
    }

    #[test]
    fn a_guard_lowers_the_operands_and_keeps_f32_gradients() -> Result<()> {
        let (a, b) = inputs()?;
        // 1/3 is not a bf16 number: its product shows the rounding.
        let third = Var::new(&[[1.0f32 / 3.0]], &Device::Cpu)?;
        let one = Tensor::new(&[[1.0f32]], &Device::Cpu)?;
        let (y, low, g) = {
            let _g = Bf16Products::on();
            assert!(bf16_products());
            let y = matmul(&a, &b)?;
            let low = matmul(&third, &one)?.to_vec2::<f32>()?[0][0];
            let g = y.sum_all()?.backward()?;
            (y, low, g)
        };
        assert!(!bf16_products(), "dropping the guard restores the state");
        assert_eq!(y.dtype(), DType::F32);
        // Small integers and tenths times small integers: bf16 keeps 8 bits, so the product
        // is within bf16 rounding of the f32 one.
        let exact = a.matmul(&b)?;
        let diff = (y - &exact)?.abs()?.max_all()?.to_scalar::<f32>()?;
        let scale = exact.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(
            diff <= scale * 1e-2,
            "bf16 product off by {diff} (scale {scale})"
        );
        assert_ne!(low, 1.0f32 / 3.0, "the operand was not lowered to bf16");
        assert!((low - 1.0 / 3.0).abs() < 2e-3);
        let ga = g.get(&a).expect("a has a gradient");
        assert_eq!(ga.dtype(), DType::F32);
        // d(sum(a b))/da = row sums of b broadcast: (3, 4), each row [0.1, 0.5, 0.9, 1.3]
        // within bf16 rounding.
        let want = [0.1f32, 0.5, 0.9, 1.3];
        for row in ga.to_vec2::<f32>()? {
            for (got, want) in row.iter().zip(want) {
                assert!((got - want).abs() < 1e-2, "gradient {got} for {want}");
            }
        }
        Ok(())
    }

    #[test]
    fn guards_nest_and_f64_is_never_lowered() -> Result<()> {
        let x = Tensor::new(&[[1.0f64 / 3.0]], &Device::Cpu)?;
        let one = Tensor::new(&[[1.0f64]], &Device::Cpu)?;
        let outer = Bf16Products::on();
        {
            let _inner = Bf16Products::on();
            assert_eq!(matmul(&x, &one)?.to_vec2::<f64>()?[0][0], 1.0 / 3.0);
        }
        assert!(bf16_products(), "the inner guard restores the outer state");
        drop(outer);
        assert!(!bf16_products());
        Ok(())
    }
}
