//! Typed errors for configuration, raised before any tensor exists.

/// A configuration that cannot build a model. Each message says what to change.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("{name} must be at least 1 (got 0): set it to a positive size")]
    /// A size that must be positive is 0.
    Zero {
        /// The configuration field.
        name: &'static str,
    },
    #[error(
        "d_model ({d_model}) must be divisible by nhead ({nhead}) so each head gets d_model/nhead \
         dimensions: pick nhead from the divisors of {d_model}, or change d_model"
    )]
    /// `d_model` is not a multiple of `nhead`.
    HeadsDoNotDivide {
        /// The model width.
        d_model: usize,
        /// The number of attention heads.
        nhead: usize,
    },
    #[error(
        "d_model ({0}) must be even: the sinusoidal positional encoding pairs a sine and a cosine \
         per frequency (section 3.5); use {even} or {next}",
        even = .0 - 1,
        next = .0 + 1
    )]
    /// `d_model` (the value) is odd, which the sinusoidal positional encoding cannot use.
    OddModelDim(usize),
    #[error("{name} must be in [0, 1) (got {value}): it is a probability of zeroing an element")]
    /// A dropout probability outside [0, 1).
    BadProbability {
        /// The configuration field.
        name: &'static str,
        /// The rejected value.
        value: f64,
    },
    #[error("layer_norm_eps must be positive and finite (got {0}); PyTorch's default is 1e-5")]
    /// `layer_norm_eps` (the value) is not positive and finite.
    BadEps(f64),
    #[error("unknown activation {0:?}: use \"relu\" (the paper) or \"gelu\"")]
    /// An activation name other than `relu` or `gelu`.
    UnknownActivation(String),
    /// Any other inconsistency; the message says what to change.
    #[error("{0}")]
    Invalid(String),
}
