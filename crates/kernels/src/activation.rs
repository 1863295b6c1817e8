//! `tanh` and the logistic sigmoid, element-wise, with their backward passes from the output
//! (`1 - y^2` and `y (1 - y)`), for the recurrent models' gates.
//!
//! Why: candle's `tanh` calls the C library's `tanhf` one element at a time. A GRU
//! encoder-decoder with additive attention applies tanh to a (batch, source, 2 x hidden)
//! tensor at every decoder step, and its gates at every step of both GRUs: profiled on a
//! 2-vCPU AMD EPYC Zen 5 (2026-11-25, `perf record` of 20 Multi30k batches of
//! `--arch gru-bahdanau`), `tanhf` and the `expm1f` inside it took 30% of the step. Here f32
//! runs a vectorised Cephes `tanhf` (an odd polynomial below |x| = 0.625, `1 - 2 / (e^2|x| +
//! 1)` above, with the crate's vectorised `exp`; error a few ulp), and the sigmoid is
//! `1 / (1 + e^-x)` on the same `exp`. f64 keeps the C library's functions, so float64
//! checks against PyTorch stay at rounding error.

use super::float::{exp_f32, simd};
use super::{cpu_slice, fused_applies, par_rows, with_slice};
use candle_core::{bail, CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};

/// Elements per thread below which the kernel stays on the calling thread.
const MIN_PARALLEL_ELEMS: usize = 1 << 15;
/// Rows handed to `par_rows` (the element-wise op has no real rows).
const ROW: usize = 1024;

#[derive(Clone, Copy)]
enum Kind {
    Tanh,
    Sigmoid,
}

/// `tanh(x)` with a backward pass; CPU f32/f64 fused, elsewhere candle's `tanh`.
pub fn tanh(x: &Tensor) -> Result<Tensor> {
    if !fused_applies(&[x]) {
        return x.tanh();
    }
    x.contiguous()?.apply_op1(Activation(Kind::Tanh))
}

/// The logistic function `1 / (1 + e^-x)` with a backward pass; CPU f32/f64 fused,
/// elsewhere [`sigmoid_reference`].
pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    if !fused_applies(&[x]) {
        return sigmoid_reference(x);
    }
    x.contiguous()?.apply_op1(Activation(Kind::Sigmoid))
}

/// The logistic function from candle primitives as `(tanh(x / 2) + 1) / 2`: exact, and its
/// backward never meets `exp` overflow (`1 / (1 + exp(-x))` composed of primitives gives NaN
/// gradients below about -88 in f32).
pub fn sigmoid_reference(x: &Tensor) -> Result<Tensor> {
    ((x * 0.5)?.tanh()? + 1.0)? * 0.5
}

struct Activation(Kind);

#[inline(always)]
fn tanh_f32(x: f32) -> f32 {
    let a = x.abs();
    // |x| > 0.625: 1 - 2 / (e^(2|x|) + 1), sign restored.
    let big = 1.0 - 2.0 / (exp_f32(a + a) + 1.0);
    let big = if x < 0.0 { -big } else { big };
    // |x| <= 0.625: x + x^3 P(x^2) (Cephes tanhf).
    let z = x * x;
    let mut p = -5.704_988_7e-3_f32;
    p = p.mul_add(z, 2.063_908_9e-2);
    p = p.mul_add(z, -5.373_971_6e-2);
    p = p.mul_add(z, 1.333_144_2e-1);
    p = p.mul_add(z, -3.333_328_2e-1);
    let small = (p * z).mul_add(x, x);
    if a > 0.625 {
        big
    } else {
        small
    }
}

#[inline(always)]
fn sigmoid_f32(x: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-x))
}

fn forward_f32(x: &[f32], kind: Kind) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    par_rows(&mut y, ROW, MIN_PARALLEL_ELEMS, |r0, ys| {
        simd(
            #[inline(always)]
            || {
                let xs = &x[r0 * ROW..][..ys.len()];
                match kind {
                    Kind::Tanh => {
                        for (o, &v) in ys.iter_mut().zip(xs) {
                            *o = tanh_f32(v);
                        }
                    }
                    Kind::Sigmoid => {
                        for (o, &v) in ys.iter_mut().zip(xs) {
                            *o = sigmoid_f32(v);
                        }
                    }
                }
            },
        )
    });
    y
}

fn forward_f64(x: &[f64], kind: Kind) -> Vec<f64> {
    match kind {
        Kind::Tanh => x.iter().map(|v| v.tanh()).collect(),
        Kind::Sigmoid => x.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect(),
    }
}

impl CustomOp1 for Activation {
    fn name(&self) -> &'static str {
        match self.0 {
            Kind::Tanh => "kernels-tanh",
            Kind::Sigmoid => "kernels-sigmoid",
        }
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let out = match s {
            CpuStorage::F32(_) => CpuStorage::F32(forward_f32(cpu_slice::<f32>(s, l)?, self.0)),
            CpuStorage::F64(_) => CpuStorage::F64(forward_f64(cpu_slice::<f64>(s, l)?, self.0)),
            _ => bail!("{}: only f32 and f64", self.name()),
        };
        Ok((out, l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        let kind = self.0;
        fn grad<T: candle_core::WithDType + num_like::Num>(
            y: &Tensor,
            dy: &Tensor,
            kind: Kind,
        ) -> Result<Tensor> {
            with_slice::<T, _>(y, |ys| {
                with_slice::<T, _>(dy, |dys| {
                    let dx: Vec<T> = ys
                        .iter()
                        .zip(dys)
                        .map(|(&y, &g)| match kind {
                            Kind::Tanh => g * (<T as num_like::Num>::one() - y * y),
                            Kind::Sigmoid => g * y * (<T as num_like::Num>::one() - y),
                        })
                        .collect();
                    Tensor::from_vec(dx, y.shape(), y.device())
                })
            })
        }
        let dx = match y.dtype() {
            DType::F32 => grad::<f32>(y, dy, kind)?,
            DType::F64 => grad::<f64>(y, dy, kind)?,
            dt => bail!("{}: unsupported dtype {dt:?}", self.name()),
        };
        Ok(Some(dx))
    }
}

/// The arithmetic the backward pass needs, for f32 and f64.
mod num_like {
    pub trait Num:
        Copy + std::ops::Mul<Output = Self> + std::ops::Sub<Output = Self> + Send + Sync
    {
        fn one() -> Self;
    }
    impl Num for f32 {
        fn one() -> Self {
            1.0
        }
    }
    impl Num for f64 {
        fn one() -> Self {
            1.0
        }
    }
}
