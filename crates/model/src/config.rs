//! Model configurations with the paper's defaults, validated before any tensor exists.

use crate::error::ConfigError;
use serde::{Deserialize, Serialize};

/// The position-wise feed-forward activation (section 3.3 uses ReLU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// max(0, x), equation (2) of the paper.
    #[default]
    Relu,
    /// The exact (erf) GELU, PyTorch's `activation="gelu"`; not in the paper.
    Gelu,
    /// GELU's tanh approximation (`gelu_new`, CTranslate2's `GELUTanh`); published models.
    #[serde(rename = "gelu_tanh")]
    GeluTanh,
    /// Swish (SiLU), `x sigmoid(x)`: Marian's and OPUS-MT's activation.
    Swish,
}

impl std::str::FromStr for Activation {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s.to_ascii_lowercase().as_str() {
            "relu" => Ok(Self::Relu),
            "gelu" => Ok(Self::Gelu),
            "gelu_tanh" | "gelu-tanh" | "gelu_new" => Ok(Self::GeluTanh),
            "swish" | "silu" => Ok(Self::Swish),
            _ => Err(ConfigError::UnknownActivation(s.to_string())),
        }
    }
}

/// The encoder-decoder Transformer, as `torch.nn.Transformer` takes it.
///
/// [`Default`] is the paper's base model (Table 3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TransformerConfig {
    /// Model width d_model (Table 3 base: 512).
    pub d_model: usize,
    /// Attention heads h (Table 3 base: 8).
    pub nhead: usize,
    /// Encoder layers N (Table 3 base: 6).
    pub num_encoder_layers: usize,
    /// Decoder layers N (Table 3 base: 6).
    pub num_decoder_layers: usize,
    /// Inner feed-forward width d_ff (Table 3 base: 2048).
    pub dim_feedforward: usize,
    /// P_drop for residual, embedding and attention dropout (section 5.4: 0.1).
    pub dropout: f64,
    /// Feed-forward activation (section 3.3: ReLU).
    pub activation: Activation,
    /// Added to the variance inside the square root, as PyTorch's LayerNorm (default 1e-5).
    pub layer_norm_eps: f64,
    /// Pre-norm (`x + f(norm(x))`) instead of the paper's post-norm (`norm(x + f(x))`).
    pub norm_first: bool,
    /// Longest sequence the positional encoding is precomputed for.
    pub max_len: usize,
    /// A layer norm after each stack's last layer, as `nn.Transformer` has in both
    /// arrangements; published post-norm models (Marian, CTranslate2's) have none.
    #[serde(skip_serializing_if = "is_true")]
    pub final_norm: bool,
}

fn is_true(b: &bool) -> bool {
    *b
}

impl Default for TransformerConfig {
    fn default() -> Self {
        Self::base()
    }
}

impl TransformerConfig {
    /// The paper's base model (Table 3): N=6, d_model 512, d_ff 2048, h 8, P_drop 0.1.
    pub fn base() -> Self {
        Self {
            d_model: 512,
            nhead: 8,
            num_encoder_layers: 6,
            num_decoder_layers: 6,
            dim_feedforward: 2048,
            dropout: 0.1,
            activation: Activation::Relu,
            layer_norm_eps: 1e-5,
            norm_first: false,
            max_len: 5000,
            final_norm: true,
        }
    }

    /// The paper's big model (Table 3): N=6, d_model 1024, d_ff 4096, h 16, P_drop 0.3.
    pub fn big() -> Self {
        Self {
            d_model: 1024,
            nhead: 16,
            dim_feedforward: 4096,
            dropout: 0.3,
            ..Self::base()
        }
    }

    /// A model small enough to train in seconds on a CPU (the copy task, tests).
    pub fn tiny() -> Self {
        Self {
            d_model: 32,
            nhead: 4,
            num_encoder_layers: 2,
            num_decoder_layers: 2,
            dim_feedforward: 64,
            dropout: 0.0,
            max_len: 256,
            ..Self::base()
        }
    }

    /// Checks every size and probability; the error says what to change.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_core(
            self.d_model,
            self.nhead,
            self.dim_feedforward,
            self.dropout,
            self.layer_norm_eps,
        )?;
        for (name, v) in [
            ("num_encoder_layers", self.num_encoder_layers),
            ("num_decoder_layers", self.num_decoder_layers),
            ("max_len", self.max_len),
        ] {
            nonzero(name, v)?;
        }
        Ok(())
    }

    /// Head dimension D = d_model / nhead (section 3.2.2: d_k = d_v = d_model / h).
    pub fn head_dim(&self) -> usize {
        self.d_model / self.nhead
    }
}

/// The language model of PyTorch's "Language Modeling with nn.Transformer" tutorial.
///
/// [`Default`] is the tutorial's: emsize 200, nhid 200, nlayers 2, nhead 2, dropout 0.2.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LmConfig {
    /// Vocabulary size V (`ntokens`; 33,278 for WikiText-2's own vocabulary).
    pub ntoken: usize,
    /// Embedding width (`emsize`).
    pub d_model: usize,
    /// Attention heads.
    pub nhead: usize,
    /// Feed-forward width (`nhid` / `d_hid`).
    pub d_hid: usize,
    /// Encoder layers.
    pub nlayers: usize,
    /// Dropout after the positional encoding and inside every layer.
    pub dropout: f64,
    /// LayerNorm epsilon (PyTorch's default).
    pub layer_norm_eps: f64,
    /// Longest sequence the positional encoding covers (the tutorial's `max_len=5000`).
    pub max_len: usize,
    /// Share one matrix between the embedding and the output layer (Press & Wolf 2017;
    /// Inan et al. 2017): `linear.weight` is `embedding.weight`, about 5.8M fewer
    /// parameters at the tutorial's sizes. The tutorial does not (false).
    pub tie_weights: bool,
}

impl Default for LmConfig {
    fn default() -> Self {
        Self {
            ntoken: 33_278,
            d_model: 200,
            nhead: 2,
            d_hid: 200,
            nlayers: 2,
            dropout: 0.2,
            layer_norm_eps: 1e-5,
            max_len: 5000,
            tie_weights: false,
        }
    }
}

impl LmConfig {
    /// Checks every size and probability; the error says what to change.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_core(
            self.d_model,
            self.nhead,
            self.d_hid,
            self.dropout,
            self.layer_norm_eps,
        )?;
        nonzero("ntoken", self.ntoken)?;
        nonzero("nlayers", self.nlayers)?;
        nonzero("max_len", self.max_len)
    }
}

fn nonzero(name: &'static str, v: usize) -> Result<(), ConfigError> {
    if v == 0 {
        Err(ConfigError::Zero { name })
    } else {
        Ok(())
    }
}

fn validate_core(
    d_model: usize,
    nhead: usize,
    d_ff: usize,
    dropout: f64,
    eps: f64,
) -> Result<(), ConfigError> {
    nonzero("d_model", d_model)?;
    nonzero("nhead", nhead)?;
    nonzero("dim_feedforward", d_ff)?;
    if d_model % 2 == 1 {
        return Err(ConfigError::OddModelDim(d_model));
    }
    if !d_model.is_multiple_of(nhead) {
        return Err(ConfigError::HeadsDoNotDivide { d_model, nhead });
    }
    if !(0.0..1.0).contains(&dropout) {
        return Err(ConfigError::BadProbability {
            name: "dropout",
            value: dropout,
        });
    }
    if !(eps > 0.0 && eps.is_finite()) {
        return Err(ConfigError::BadEps(eps));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paper_defaults() {
        let c = TransformerConfig::default();
        assert_eq!((c.d_model, c.nhead, c.dim_feedforward), (512, 8, 2048));
        assert_eq!((c.num_encoder_layers, c.num_decoder_layers), (6, 6));
        assert_eq!(c.dropout, 0.1);
        assert_eq!(c.activation, Activation::Relu);
        assert!(!c.norm_first);
        assert_eq!(c.head_dim(), 64);
        c.validate().unwrap();
        TransformerConfig::big().validate().unwrap();
        LmConfig::default().validate().unwrap();
    }

    #[test]
    fn invalid_configs_say_what_to_change() {
        let c = TransformerConfig {
            nhead: 7,
            ..TransformerConfig::base()
        };
        let e = c.validate().unwrap_err();
        assert_eq!(
            e,
            ConfigError::HeadsDoNotDivide {
                d_model: 512,
                nhead: 7
            }
        );
        assert!(e.to_string().contains("divisors of 512"));

        let c = TransformerConfig {
            d_model: 511,
            nhead: 1,
            ..TransformerConfig::base()
        };
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains("use 510 or 512"), "{msg}");

        let c = TransformerConfig {
            num_decoder_layers: 0,
            ..TransformerConfig::base()
        };
        assert_eq!(
            c.validate().unwrap_err(),
            ConfigError::Zero {
                name: "num_decoder_layers"
            }
        );

        let c = LmConfig {
            dropout: 1.0,
            ..LmConfig::default()
        };
        assert!(matches!(
            c.validate().unwrap_err(),
            ConfigError::BadProbability { .. }
        ));
        let c = LmConfig {
            layer_norm_eps: 0.0,
            ..LmConfig::default()
        };
        assert_eq!(c.validate().unwrap_err(), ConfigError::BadEps(0.0));
        assert!("mish".parse::<Activation>().is_err());
        assert_eq!("GELU".parse::<Activation>().unwrap(), Activation::Gelu);
        assert_eq!("swish".parse::<Activation>().unwrap(), Activation::Swish);
        assert_eq!(
            "gelu_new".parse::<Activation>().unwrap(),
            Activation::GeluTanh
        );
    }
}
