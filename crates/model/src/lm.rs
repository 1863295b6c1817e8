//! The causal language model of PyTorch's "Language Modeling with nn.Transformer" tutorial:
//! embedding scaled by sqrt(d_model), sinusoidal positional encoding with dropout, a
//! post-norm encoder stack under a causal mask (no final norm), and a linear layer to the
//! vocabulary. Parameter names are the tutorial's (`embedding.weight`,
//! `transformer_encoder.layers.0.linear1.weight`, `linear.bias`).

use crate::backend::{Backprop, Pass};
use crate::config::{Activation, LmConfig};
use crate::dropout::Mode;
use crate::embedding::Embedding;
use crate::encoder::Encoder;
use crate::linear::Linear;
use crate::mask::Mask;
use crate::multi_head::KvCache;
use crate::ops::{self, Precision};
use crate::params::{Init, ParamBuilder};
use crate::positional::PositionalEncoding;
use crate::stack::LayerSpec;
use crate::Result;
use candle_core::Tensor;

/// The tutorial's causal Transformer language model: token ids (B, T) -> logits (B, T, V).
#[derive(Debug, Clone)]
pub struct TransformerLm {
    pos_encoder: PositionalEncoding,
    transformer_encoder: Encoder,
    embedding: Embedding,
    linear: Linear,
    d_model: usize,
    /// The output layer's products in a training pass (`Graph` or `Direct`), from the builder
    /// ([`ParamBuilder::precision`]); its encoder layers and evaluation run in f32.
    precision: Precision,
}

impl TransformerLm {
    /// The tutorial's initialisation: embedding and output weights U(-0.1, 0.1), output bias
    /// zero, encoder layers with PyTorch's defaults. With `cfg.tie_weights` the output layer
    /// uses the embedding's matrix (no `linear.weight` parameter).
    pub fn new(pb: &ParamBuilder, cfg: &LmConfig) -> Result<Self> {
        cfg.validate()
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let spec = LayerSpec {
            d_model: cfg.d_model,
            nhead: cfg.nhead,
            dim_feedforward: cfg.d_hid,
            dropout: cfg.dropout,
            activation: Activation::Relu,
            layer_norm_eps: cfg.layer_norm_eps,
            norm_first: false,
        };
        // Created in the tutorial's parameter order.
        let transformer_encoder =
            Encoder::new(&pb.pp("transformer_encoder"), &spec, cfg.nlayers, false)?;
        let embedding = Embedding::new(
            &pb.pp("embedding"),
            cfg.ntoken,
            cfg.d_model,
            Init::Uniform(0.1),
        )?;
        let linear = if cfg.tie_weights {
            // The embedding's matrix, (ntoken, d_model), is already the (out, in) layout.
            let bias = pb.pp("linear").var("bias", cfg.ntoken, Init::Zeros)?;
            Linear::from_parts(embedding.weight().clone(), Some(bias))
        } else {
            Linear::with_init(
                &pb.pp("linear"),
                cfg.d_model,
                cfg.ntoken,
                Init::Uniform(0.1),
                Some(Init::Zeros),
            )?
        };
        let pos_encoder = PositionalEncoding::new(
            cfg.d_model,
            cfg.max_len,
            cfg.dropout,
            pb.dtype(),
            &pb.device(),
        )?;
        Ok(Self {
            pos_encoder,
            transformer_encoder,
            embedding,
            linear,
            d_model: cfg.d_model,
            precision: pb.precision(),
        })
    }

    /// Hidden states of the last layer under the causal mask: position t sees tokens <= t.
    ///
    /// # Shapes
    /// ids (B, T) u32 -> (B, T, C)
    pub fn hidden(&self, ids: &Tensor, mode: Mode) -> Result<Tensor> {
        self.hidden_with(ids, mode, Backprop::Graph)
    }

    /// [`Self::hidden`], differentiated as `backprop` says: through the graph, with the
    /// embedding's and the encoder layers' parameter gradients going to `DirectGrads`, or not
    /// at all.
    fn hidden_with(&self, ids: &Tensor, mode: Mode, backprop: Backprop) -> Result<Tensor> {
        let (_b, t) = ids.dims2()?;
        let e = self.embedding.forward_as(ids, backprop)?;
        let x = (e * (self.d_model as f64).sqrt())?;
        let x = self.pos_encoder.forward(&x, 0, mode)?;
        let causal = Mask::causal(t, ids.device())?;
        let enc = &self.transformer_encoder;
        let x = match backprop {
            Backprop::Off => x.detach(),
            Backprop::Graph | Backprop::Direct(..) => x,
        };
        let pass = Pass::new(mode).backprop(backprop);
        Ok(enc.forward_as(&x, Some(&causal), pass)?.0)
    }

    /// Every layer's causal self-attention weights over `ids` (evaluation mode), for
    /// pictures of which earlier word each word attends to.
    ///
    /// # Shapes
    /// ids (B, T) u32 -> per layer (B, H, T, T)
    pub fn attention(&self, ids: &Tensor) -> Result<Vec<Tensor>> {
        let (_b, t) = ids.dims2()?;
        let x = (self.embedding.forward(ids)? * (self.d_model as f64).sqrt())?;
        let x = self.pos_encoder.forward(&x, 0, Mode::Eval)?;
        let causal = Mask::causal(t, ids.device())?;
        Ok(self
            .transformer_encoder
            .forward_as(&x, Some(&causal), Pass::new(Mode::Eval).weights())?
            .1)
    }

    /// Next-token logits at every position.
    ///
    /// # Shapes
    /// ids (B, T) u32 -> (B, T, V)
    pub fn forward(&self, ids: &Tensor, mode: Mode) -> Result<Tensor> {
        self.linear.forward(&self.hidden(ids, mode)?)
    }

    /// An empty cache for incremental decoding with [`TransformerLm::forward_step`].
    pub fn new_cache(&self) -> Vec<KvCache> {
        vec![KvCache::new(); self.transformer_encoder.num_layers()]
    }

    /// Logits for new tokens that continue the sequence held in `cache` (empty for the
    /// prompt); the cache is extended with them. Gives the same logits as [`Self::forward`]
    /// over the whole sequence, computing only the new positions.
    ///
    /// # Shapes
    /// ids (B, T) u32 -> (B, T, V)
    pub fn forward_step(&self, ids: &Tensor, cache: &mut [KvCache], mode: Mode) -> Result<Tensor> {
        let h = self.step_hidden(ids, cache, mode)?;
        self.linear.forward(&h)
    }

    /// Logits for the token after the last of `ids` only, extending `cache` with all of them:
    /// what a decoding loop needs. Equals the last position of [`Self::forward_step`], without
    /// the output layer's work at the other positions (a prompt of T tokens would otherwise
    /// cost T vocabulary-sized products).
    ///
    /// # Shapes
    /// ids (B, T) u32 -> (B, V)
    pub fn next_logits(&self, ids: &Tensor, cache: &mut [KvCache], mode: Mode) -> Result<Tensor> {
        let h = self.step_hidden(ids, cache, mode)?;
        let last = h.narrow(1, h.dim(1)? - 1, 1)?.squeeze(1)?;
        let bias = self
            .linear
            .bias()
            .expect("the language model's output layer has a bias");
        // A few rows against the whole vocabulary: a kernel that reads W once, in place.
        ops::linear_few_rows(&last, self.linear.weight(), bias)
    }

    /// The last layer's hidden states for new tokens continuing `cache` (extended with them).
    fn step_hidden(&self, ids: &Tensor, cache: &mut [KvCache], mode: Mode) -> Result<Tensor> {
        let (_b, t) = ids.dims2()?;
        let offset = cache.first().map_or(0, |c| c.len());
        let x = (self.embedding.forward(ids)? * (self.d_model as f64).sqrt())?;
        let x = self.pos_encoder.forward(&x, offset, mode)?;
        // A single new token may attend to everything cached: no mask needed.
        let mask = if t > 1 {
            Some(Mask::causal_with_offset(t, offset, ids.device())?)
        } else {
            None
        };
        self.transformer_encoder
            .forward_cached(&x, mask.as_ref(), cache, mode)
    }

    /// Mean cross-entropy of `targets` given `ids`, without materialising the logits
    /// (the output layer is fused with the log-softmax, [`crate::ops::output_cross_entropy`]),
    /// the output layer's products of a pass to be differentiated in the model's training
    /// precision (its builder's, [`ParamBuilder::precision`]: bf16 on the AMX units where the
    /// CPU has them, mixed precision, see [`crate::ops::output_cross_entropy`]), an
    /// evaluation's (`Off`) in f32.
    ///
    /// `backprop` says where the gradients go ([`Backprop`]):
    /// - `Graph`: through candle's graph, the composed model (the reference);
    /// - `Direct`: the gradients of the embedding, of the encoder layers and of the output
    ///   layer go to its `DirectGrads` instead of candle's `GradStore`: the output layer's
    ///   written once into buffers kept between steps, the embedding's as the used rows only
    ///   (see [`crate::grads`]), each encoder layer's from one fused op in f32 (a layer the backend does not fuse keeps its gradients in the
    ///   `GradStore`, so an optimizer reads both). The same gradients (summed in another order
    ///   inside the encoder layers), without the allocations, zeroing and adds of two dense
    ///   `(V, C)` gradients per step or candle's graph of about 60 small ops per encoder layer;
    /// - `Off`: none, for evaluation, like PyTorch under `torch.no_grad()`: the result tracks
    ///   no gradient, which lets the fused loss skip keeping its exponentiated logits for a
    ///   backward pass (one block per thread in cache instead of all `N x V` of them written
    ///   to memory).
    ///
    /// # Shapes
    /// ids (B, T) u32, targets (B, T) or (B * T,) u32 -> scalar
    pub fn loss(
        &self,
        ids: &Tensor,
        targets: &Tensor,
        mode: Mode,
        backprop: Backprop,
    ) -> Result<Tensor> {
        let precision = self.precision;
        let bias = self
            .linear
            .bias()
            .expect("the language model's output layer has a bias");
        let w = self.linear.weight();
        match backprop {
            Backprop::Graph => {
                let h = self.hidden_with(ids, mode, backprop)?;
                ops::output_cross_entropy(&h, w, bias, targets, None, precision, None)
            }
            Backprop::Direct(grads) => {
                // bf16 products where the backend lowers the composed layers' (off the CPU).
                let _products = self
                    .transformer_encoder
                    .backend()
                    .mixed_precision(precision);
                let h = self.hidden_with(ids, mode, backprop)?;
                ops::output_cross_entropy(&h, w, bias, targets, None, precision, Some(grads))
            }
            Backprop::Off => {
                let h = self.hidden_with(ids, mode, backprop)?.detach();
                let (w, bias) = (w.detach(), bias.detach());
                ops::output_cross_entropy(&h, &w, &bias, targets, None, Precision::F32, None)
            }
        }
    }

    /// What runs the encoder layers and why, one line for the log.
    pub fn describe_backend(&self) -> String {
        self.transformer_encoder.backend().describe()
    }

    /// The output layer, for losses that fuse it with the softmax.
    pub fn output_layer(&self) -> &Linear {
        &self.linear
    }
}
