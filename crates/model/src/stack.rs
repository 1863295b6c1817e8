//! A stack of N identical layers and an optional final LayerNorm: the shape the encoder
//! ([`crate::Encoder`]) and the decoder ([`crate::Decoder`]) share. What a layer computes and
//! how the stack runs it live with each layer kind; building the stack, its final norm and
//! the backend each layer call goes through live here once.

use crate::backend::{Backend, Pass};
use crate::config::Activation;
use crate::dropout::Mode;
use crate::layer_norm::LayerNorm;
use crate::multi_head::KvCache;
use crate::params::ParamBuilder;
use crate::Result;
use candle_core::Tensor;
use std::sync::Arc;

/// A layer kind a [`Stack`] can hold, and what the stack's one loop (`Stack::run`) asks
/// of it: the layer as the backend runs it, or the composed layer.
pub trait StackLayer: Sized {
    /// One layer's attention weights, when a pass asks for them.
    type Weights;
    /// What every layer of a pass reads besides its input (the masks; the decoder's memory).
    type Inputs<'a>: Copy;
    /// A layer with its parameters under `pb`.
    fn build(pb: &ParamBuilder, spec: &LayerSpec) -> Result<Self>;
    /// Layer `index` of the stack run by `backend`, or `None` where the backend leaves it
    /// to the composed layer. Asked only for a call without a cache and without attention
    /// weights: the fused layers keep neither.
    fn by_backend(
        &self,
        backend: &dyn Backend,
        x: &Tensor,
        inputs: Self::Inputs<'_>,
        index: usize,
        pass: Pass,
    ) -> Result<Option<Tensor>>;
    /// Layer `index` composed of the paper's modules, extending `cache` when given, with
    /// its attention weights when `need_weights`.
    fn composed(
        &self,
        x: &Tensor,
        inputs: Self::Inputs<'_>,
        index: usize,
        cache: Option<&mut KvCache>,
        mode: Mode,
        need_weights: bool,
    ) -> Result<(Tensor, Option<Self::Weights>)>;
}

/// The sizes and options one layer needs (a view of the model configs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerSpec {
    /// Model width C (`d_model`).
    pub d_model: usize,
    /// Attention heads H; must divide `d_model`.
    pub nhead: usize,
    /// Inner feed-forward width F (`d_ff`).
    pub dim_feedforward: usize,
    /// Dropout probability for the residual, attention and feed-forward dropouts.
    pub dropout: f64,
    /// Feed-forward activation.
    pub activation: Activation,
    /// Epsilon added to the variance in each layer norm.
    pub layer_norm_eps: f64,
    /// Pre-norm (`x + f(norm(x))`) instead of post-norm (`norm(x + f(x))`).
    pub norm_first: bool,
}

impl From<&crate::config::TransformerConfig> for LayerSpec {
    fn from(c: &crate::config::TransformerConfig) -> Self {
        Self {
            d_model: c.d_model,
            nhead: c.nhead,
            dim_feedforward: c.dim_feedforward,
            dropout: c.dropout,
            activation: c.activation,
            layer_norm_eps: c.layer_norm_eps,
            norm_first: c.norm_first,
        }
    }
}

/// N layers of one kind and an optional final LayerNorm (`nn.TransformerEncoder`'s and
/// `nn.TransformerDecoder`'s `norm`; `nn.Transformer` has one, the tutorial language model
/// does not). Each layer call goes through the stack's [`Backend`] (chosen when the stack is
/// built, [`crate::backend::choose`]), which runs it or leaves it to the composed layer.
#[derive(Debug, Clone)]
pub struct Stack<L> {
    pub(crate) layers: Vec<L>,
    pub(crate) norm: Option<LayerNorm>,
    pub(crate) backend: Arc<dyn Backend>,
}

impl<L: StackLayer> Stack<L> {
    /// Layers are named `<pb>.layers.<i>`, the final norm `<pb>.norm`.
    pub fn new(
        pb: &ParamBuilder,
        spec: &LayerSpec,
        num_layers: usize,
        final_norm: bool,
    ) -> Result<Self> {
        let layers = (0..num_layers)
            .map(|i| L::build(&pb.pp("layers").pp(i), spec))
            .collect::<Result<_>>()?;
        let norm = if final_norm {
            Some(LayerNorm::new(
                &pb.pp("norm"),
                spec.d_model,
                spec.layer_norm_eps,
            )?)
        } else {
            None
        };
        let backend = pb.backend();
        Ok(Self {
            layers,
            norm,
            backend,
        })
    }
}

impl<L: StackLayer> Stack<L> {
    /// The one loop over the layers, for the encoder and the decoder alike: each layer call
    /// goes to the backend first when it keeps no cache and wants no attention weights, and
    /// to the composed layer where the backend declines (or was not asked); then the final
    /// norm. Each layer's attention weights come back when `pass` asks for them.
    pub(crate) fn run(
        &self,
        x: &Tensor,
        inputs: L::Inputs<'_>,
        mut caches: Option<&mut [KvCache]>,
        pass: Pass,
    ) -> Result<(Tensor, Vec<L::Weights>)> {
        let (mode, need_weights) = (pass.mode, pass.weights);
        let mut x = x.clone();
        let mut weights = Vec::with_capacity(self.layers.len());
        for (i, layer) in self.layers.iter().enumerate() {
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            let fused = if need_weights || cache.is_some() {
                None
            } else {
                layer.by_backend(self.backend.as_ref(), &x, inputs, i, pass)?
            };
            let (y, w) = match fused {
                Some(y) => (y, None),
                None => layer.composed(&x, inputs, i, cache, mode, need_weights)?,
            };
            x = y;
            weights.extend(w);
        }
        Ok((self.finish(x)?, weights))
    }
}

impl<L> Stack<L> {
    /// The number of layers N in the stack.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// The backend each layer call goes through.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The final norm applied to the last layer's output, where the stack has one.
    pub(crate) fn finish(&self, x: Tensor) -> Result<Tensor> {
        match &self.norm {
            Some(norm) => norm.forward(&x),
            None => Ok(x),
        }
    }
}
