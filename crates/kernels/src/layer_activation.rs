//! The feed-forward activation of the fused layers and of the decoding stack, with its
//! derivative: plain data the CPU and GPU kernels both read.

use super::float::Float;

/// The feed-forward activation of a fused layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// max(0, x).
    #[default]
    Relu,
    /// The exact (erf) GELU.
    Gelu,
    /// GELU's tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    GeluTanh,
    /// Swish (SiLU): `x sigmoid(x) = x / (1 + exp(-x))`, Marian's and OPUS-MT's.
    Swish,
}

/// sqrt(2 / pi), of GELU's tanh approximation.
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;

impl Activation {
    /// The activation of `x`. GELU is computed as the composed layer computes it:
    /// `x * ((erf(x / sqrt 2) + 1) * 0.5)`.
    #[inline(always)]
    pub fn apply<T: Float>(self, x: T) -> T {
        let half = T::from_f64(0.5);
        match self {
            Activation::Relu => if_positive(x, x),
            Activation::Gelu => {
                let s2 = T::from_f64(std::f64::consts::SQRT_2);
                x * (((x / s2).erf() + T::ONE) * half)
            }
            Activation::GeluTanh => {
                let inner = T::from_f64(SQRT_2_OVER_PI) * (x + T::from_f64(0.044715) * x * x * x);
                half * x * (T::ONE + inner.tanh())
            }
            Activation::Swish => x / (T::ONE + (T::ZERO - x).exp()),
        }
    }

    /// The activation's derivative at the input `x`.
    #[inline(always)]
    pub fn derivative<T: Float>(self, x: T) -> T {
        let half = T::from_f64(0.5);
        match self {
            Activation::Relu => if_positive(x, T::ONE),
            // Phi(x) + x phi(x).
            Activation::Gelu => {
                let s2 = T::from_f64(std::f64::consts::SQRT_2);
                let cdf = ((x / s2).erf() + T::ONE) * half;
                let pdf = (T::ZERO - x * x * half).exp()
                    * T::from_f64(1.0 / (2.0 * std::f64::consts::PI).sqrt());
                cdf + x * pdf
            }
            Activation::GeluTanh => {
                let k = T::from_f64(SQRT_2_OVER_PI);
                let a = T::from_f64(0.044715);
                let th = (k * (x + a * x * x * x)).tanh();
                let dinner = k * (T::ONE + T::from_f64(3.0) * a * x * x);
                half * (T::ONE + th) + half * x * (T::ONE - th * th) * dinner
            }
            // s + x s (1 - s), s = sigmoid(x).
            Activation::Swish => {
                let s = T::ONE / (T::ONE + (T::ZERO - x).exp());
                s + x * s * (T::ONE - s)
            }
        }
    }
}

/// `value` where `x > 0`, else 0 (ReLU is `if_positive(x, x)`, its derivative
/// `if_positive(x, 1)`).
#[inline(always)]
fn if_positive<T: Float>(x: T, value: T) -> T {
    if x > T::ZERO {
        value
    } else {
        T::ZERO
    }
}
