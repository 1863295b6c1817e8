//! A whole encoder layer (self-attention and feed-forward sub-layers, each with its residual,
//! dropout and layer norm; post-norm or `norm_first`) as one op with a hand-written backward
//! pass, for training and evaluation without candle's graph inside the layer.
//!
//! # Why
//! Composed of the fused ops ([`super::linear`], [`super::attention`], [`super::layer_norm`],
//! [`super::dropout`]), one layer of the tutorial LM is about 20 candle ops forward and 40
//! backward, each a fresh tensor and a hand-off to candle's thread pool, and every gradient
//! edge becomes a `zeros_like` + `add` in candle's `GradStore`. Its products are small (700 x
//! 200 x 200): the two layers took about 30 ms forward + backward whether on one thread or
//! two, where their 2 GFLOP of products need about 10 ms on two.
//!
//! # How
//! Sequences are independent in an encoder layer, so the batch is split into one contiguous
//! group of sequences per thread and each thread runs the whole layer, forward and backward,
//! on its group with single-threaded products: one hand-off to the pool per layer and
//! direction, no other synchronisation. The weight and bias gradients are summed per thread
//! and the partial sums added in thread order (deterministic for a given thread count). The
//! forward pass keeps what the backward pass reads (`q`, `k`, `v`, the attention weights, the
//! normalised rows, the hidden layer); dropout masks are regenerated from the RNG
//! ([`super::dropout`]), the same streams and elements the composed layer draws.
//!
//! The parameters' gradients go to [`DirectGrads`] (a `CustomOp1` passes only its one
//! input's gradient to candle); the input's gradient goes back into candle's graph.
//! Without a [`DirectGrads`] the op runs forward only and keeps nothing (evaluation).
//!
//! # Exactness
//! The same arithmetic as the composed layer, summed in a different order in the weight
//! gradients (per thread, then across threads) and in products whose row count differs.
//! Checked in f64 against the composed layer (forward and every gradient, post-norm and
//! pre-norm, causal and padding masks, dropout; `tests` below) and in f32 through the
//! language model's whole training step (`tests/invariants.rs`).

use super::float::Float;
use super::fused_layer::{keep_mask, layer_applies, Dims, Drops, LayerOp, Masks, Slots};
use super::shared::{EncoderLayerOptions, Keep, LayerShape, Run};
use super::sublayer::check_lengths;
use crate::grads::DirectGrads;
use candle_core::{bail, Result, Tensor};
use std::sync::Mutex;

/// Index of each weight in [`EncoderLayerParams::tensors`], its bias next: the query, key,
/// value and output projections from `Q_W` on (the attention sub-layer reads them as offsets
/// 0-7 from it), then `linear1`, `linear2` and the two norms.
mod slot {
    pub const Q_W: usize = 0;
    pub const L1_W: usize = 8;
    pub const L2_W: usize = 10;
    pub const N1_W: usize = 12;
    pub const N2_W: usize = 14;
    pub const COUNT: usize = 16;
}

/// The parameters of one encoder layer in PyTorch's layouts: the query, key, value and
/// output projections `(C, C)` + `(C,)`, `linear1` `(F, C)` + `(F,)`, `linear2` `(C, F)` +
/// `(C,)`, and the two layer norms' weight and bias `(C,)`.
#[derive(Debug, Clone)]
pub struct EncoderLayerParams {
    tensors: [Tensor; slot::COUNT],
}

/// A weight and its bias.
pub type WeightBias<'a> = (&'a Tensor, &'a Tensor);

impl EncoderLayerParams {
    /// Collects the layer's weights and biases in the layouts above; the shapes are checked
    /// when the layer runs.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        q: WeightBias,
        k: WeightBias,
        v: WeightBias,
        out: WeightBias,
        linear1: WeightBias,
        linear2: WeightBias,
        norm1: WeightBias,
        norm2: WeightBias,
    ) -> Self {
        let t = |p: WeightBias| [p.0.clone(), p.1.clone()];
        let [a, b, c, d, e, f, g, h] = [q, k, v, out, linear1, linear2, norm1, norm2].map(t);
        let [[q_w, q_b], [k_w, k_b], [v_w, v_b], [o_w, o_b]] = [a, b, c, d];
        let [[l1_w, l1_b], [l2_w, l2_b], [n1_w, n1_b], [n2_w, n2_b]] = [e, f, g, h];
        Self {
            tensors: [
                q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b, l1_w, l1_b, l2_w, l2_b, n1_w, n1_b, n2_w,
                n2_b,
            ],
        }
    }

    /// Whether every parameter can take [`DirectGrads`] (CPU f32 variables).
    pub fn all_accepted_by_direct_grads(&self) -> bool {
        self.tensors.iter().all(DirectGrads::accepts)
    }

    /// `(C, F)`, checking every shape.
    fn dims(&self) -> Result<(usize, usize)> {
        let c = self.tensors[slot::Q_W].dim(0)?;
        let f = self.tensors[slot::L1_W].dim(0)?;
        let want: [&[usize]; slot::COUNT] = [
            &[c, c],
            &[c],
            &[c, c],
            &[c],
            &[c, c],
            &[c],
            &[c, c],
            &[c],
            &[f, c],
            &[f],
            &[c, f],
            &[c],
            &[c],
            &[c],
            &[c],
            &[c],
        ];
        for (t, w) in self.tensors.iter().zip(want) {
            if t.dims() != w {
                bail!(
                    "encoder layer: parameter of shape {:?} where {w:?} was expected",
                    t.dims()
                );
            }
        }
        Ok((c, f))
    }
}

/// Dropout in training: probability `p`, and the RNG streams under `seed` of the four
/// masks in the order the composed layer draws them: attention weights, the self-attention
/// sub-layer's output, the feed-forward hidden layer, the feed-forward sub-layer's output.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerDropout {
    /// The probability of zeroing an element, in [0, 1).
    pub p: f64,
    /// The RNG seed the streams are drawn under.
    pub seed: u64,
    /// One RNG stream per dropout mask, in the order listed above.
    pub streams: [u64; 4],
}

/// One encoder layer (ReLU or GELU feed-forward), fused; see the module docs.
///
/// - `keep`: the attention mask, u8 broadcastable to `(B, 1, T, T)`, 1 = may attend.
/// - `lengths`: each sequence's real positions, its first ones; the rest are padding that
///   `keep` hides from every real position (checked). Padding rows are then not computed:
///   their outputs are zero and their gradients are not read (`None`: every row is computed,
///   as the composed layer does).
/// - `dropout`: `None` in evaluation.
/// - `grads`: where the parameters' gradients go in the backward pass; with `None` the
///   result tracks no gradient at all (evaluation without a graph).
///
/// CPU f32 (and f64 without `grads`) only: callers check [`encoder_layer_applies`].
///
/// # Shapes
/// x (B, T, C) -> (B, T, C)
pub fn encoder_layer(
    x: &Tensor,
    params: &EncoderLayerParams,
    opts: EncoderLayerOptions,
    keep: Option<&Tensor>,
    lengths: Option<&[usize]>,
    dropout: Option<LayerDropout>,
    grads: Option<&DirectGrads>,
) -> Result<Tensor> {
    let (b, t, c) = x.dims3()?;
    let (pc, f) = params.dims()?;
    if pc != c || opts.nhead == 0 || !c.is_multiple_of(opts.nhead) {
        bail!(
            "encoder layer: input {:?} for d_model {pc} and {} heads",
            x.dims(),
            opts.nhead
        );
    }
    if !encoder_layer_applies(x, params, grads.is_some()) {
        bail!("encoder layer: the fused layer needs CPU f32 tensors (f64 without gradients)");
    }
    let keep = keep.map(|m| keep_mask(m, t)).transpose()?;
    let lens = match lengths {
        Some(l) if l.len() != b => {
            bail!("encoder layer: {} lengths for {b} sequences", l.len())
        }
        Some(l) => {
            let keep_of = |seq| keep.as_ref().map(|k| k.of(seq, t));
            check_lengths("encoder layer", (l, t), (l, t), keep_of)?;
            l.iter().any(|&n| n < t).then(|| l.to_vec())
        }
        None => None,
    };
    let op = LayerOp {
        what: "encoder layer",
        op_name: "kernels-encoder-layer",
        params: params.tensors.to_vec(),
        dims: Dims::new(LayerShape::new((b, t, 0), (c, f), &opts, x.dtype()), SLOTS),
        self_keep: keep,
        memory_keep: None,
        lens,
        memory_lens: None,
        drops: dropout.filter(|d| d.p > 0.0).map(drops),
        grads: grads.cloned(),
        saved: Mutex::new(None),
    };
    op.apply(x, None)
}

/// Whether [`encoder_layer`] runs on these tensors: all on the CPU, f32, or f64 when no
/// gradients are asked for (`with_grads` false).
pub fn encoder_layer_applies(x: &Tensor, params: &EncoderLayerParams, with_grads: bool) -> bool {
    layer_applies(&[x], &params.tensors, with_grads)
}

/// Where an encoder layer's sub-layers find their parameters.
const SLOTS: Slots = Slots {
    self_attn: (slot::Q_W, slot::N1_W),
    cross: None,
    ff: (slot::L1_W, slot::L2_W, slot::N2_W),
};

/// The four dropout masks (see [`LayerDropout`]).
fn drops(d: LayerDropout) -> Drops {
    Drops::new(d.p, d.seed, &d.streams)
}

/// The layer's forward (in `groups` groups) and backward passes on plain slices, for the
/// model's parity tests against its composed layer (`crate::testing`).
#[allow(clippy::too_many_arguments)]
pub fn run_slices<T: Float>(
    shape: &LayerShape,
    w: &[&[T]],
    keep: Option<(Vec<u8>, bool)>,
    lens: Option<&[usize]>,
    dropout: Option<LayerDropout>,
    xs: &[T],
    dys: &[T],
    groups: usize,
) -> Run<T> {
    let dims = Dims::new(LayerShape { s: 0, ..*shape }, SLOTS);
    let keep = keep.map(|(data, per_batch)| Keep { data, per_batch });
    let masks = Masks {
        self_keep: keep.as_ref(),
        memory_keep: None,
        lens,
        memory_lens: None,
    };
    let drops = dropout.map(drops);
    let w = &w[..slot::COUNT];
    let inputs = (xs, &[][..], dys);
    super::fused_layer::run_slices(&dims, w, &masks, drops.as_ref(), inputs, groups)
}
