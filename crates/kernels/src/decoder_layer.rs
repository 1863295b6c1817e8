//! A whole decoder layer (masked self-attention, encoder-decoder attention and feed-forward
//! sub-layers, each with its residual, dropout and layer norm; post-norm or `norm_first`) as
//! one op with a hand-written backward pass, for training without candle's graph inside the
//! layer: the decoder's counterpart of [`super::encoder_layer`].
//!
//! # Why
//! Composed of the fused small ops, one decoder layer is about 30 candle ops forward and
//! more backward, and candle accumulates every gradient edge as a fresh `zeros_like` and an
//! `add`: in the translation model's training step the decoder's backward ran about 30% below
//! the fused encoder layer's rate per FLOP.
//!
//! # How
//! As in the encoder layer: the batch is split into one contiguous group of sequences per
//! thread, and each thread runs the whole layer, forward and backward, on its group with
//! single-threaded products (its sequences' memory rows included: the memory's gradient
//! rows of a group are its own). The weight gradients are summed per thread and added in
//! thread order; they go to [`DirectGrads`], and the op returns the gradients of its two
//! inputs, the target stream and the memory, to candle's graph.
//!
//! # Exactness
//! The composed layer's arithmetic, summed in a different order in the weight gradients.
//! Checked in f64 against the model's composed `DecoderLayer` (`transformer-model`'s `tests/fused_layers.rs`).

use super::decoder_step::{slot, DecoderLayerParams};
use super::float::Float;
use super::fused_layer::{keep_mask, layer_applies, Dims, Drops, LayerOp, Masks, Slots};
use super::shared::{EncoderLayerOptions, Keep, LayerShape, Run};
use super::sublayer::check_lengths;
use crate::grads::DirectGrads;
use candle_core::{bail, DType, Result, Tensor};
use std::sync::Mutex;

/// Dropout in training: probability `p`, and the RNG streams under `seed` of the six masks
/// in the order the composed layer draws them: the self-attention weights, the first
/// sub-layer's output, the encoder-decoder attention weights, the second sub-layer's output,
/// the feed-forward hidden layer, the third sub-layer's output.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecoderLayerDropout {
    /// The probability of zeroing an element, in [0, 1).
    pub p: f64,
    /// The RNG seed the streams are drawn under.
    pub seed: u64,
    /// One RNG stream per dropout mask, in the order listed above.
    pub streams: [u64; 6],
}

/// Where a decoder layer's sub-layers find their parameters.
const SLOTS: Slots = Slots {
    self_attn: (slot::SQ_W, slot::N1_W),
    cross: Some((slot::CQ_W, slot::N2_W)),
    ff: (slot::L1_W, slot::L2_W, slot::N3_W),
};

/// The six dropout masks (see [`DecoderLayerDropout`]).
fn drops(d: DecoderLayerDropout) -> Drops {
    Drops::new(d.p, d.seed, &d.streams)
}

/// One decoder layer (ReLU or GELU feed-forward), fused; see the module docs.
///
/// - `self_keep`: the self-attention mask, u8 broadcastable to `(B, 1, T, T)`, 1 = may
///   attend (causal and target padding together);
/// - `memory_keep`: the memory's key mask, u8 broadcastable to `(B, 1, 1, S)`;
/// - `lengths`: each target and each source sequence's real positions, its first ones; the
///   rest are padding that the masks hide from every real position (checked). Padding rows
///   are then not computed: their outputs and gradients are zero, and their `dy` is not read
///   (`None`: every row is computed, as the composed layer does);
/// - `dropout`: `None` in evaluation;
/// - `grads`: where the parameters' gradients go in the backward pass; with `None` the
///   result tracks no gradient at all.
///
/// CPU f32 (and f64 without `grads`) only.
///
/// # Shapes
/// x (B, T, C), memory (B, S, C) -> (B, T, C)
#[allow(clippy::too_many_arguments)]
pub fn decoder_layer(
    x: &Tensor,
    memory: &Tensor,
    params: &DecoderLayerParams,
    opts: EncoderLayerOptions,
    self_keep: Option<&Tensor>,
    memory_keep: Option<&Tensor>,
    lengths: Option<(&[usize], &[usize])>,
    dropout: Option<DecoderLayerDropout>,
    grads: Option<&DirectGrads>,
) -> Result<Tensor> {
    let (b, t, c) = x.dims3()?;
    let (mb, s, mc) = memory.dims3()?;
    let pc = params.tensors[slot::SQ_W].dim(0)?;
    let f = params.tensors[slot::L1_W].dim(0)?;
    if pc != c || mc != c || mb != b || opts.nhead == 0 || !c.is_multiple_of(opts.nhead) {
        bail!(
            "decoder layer: input {:?}, memory {:?} for d_model {pc} and {} heads",
            x.dims(),
            memory.dims(),
            opts.nhead
        );
    }
    let dtype = x.dtype();
    if !layer_applies(&[x, memory], &params.tensors, grads.is_some()) {
        bail!("decoder layer: the fused layer needs CPU f32 tensors (f64 without gradients)");
    }
    let self_keep = self_keep.map(|m| keep_mask(m, t)).transpose()?;
    let memory_keep = match memory_keep {
        Some(m) => Some(
            m.to_dtype(DType::U8)?
                .broadcast_as((b, 1, 1, s))?
                .flatten_all()?
                .to_vec1::<u8>()?,
        ),
        None => None,
    };
    let lens = match lengths {
        Some((tl, sl)) if tl.len() != b || sl.len() != b => bail!(
            "decoder layer: {} target and {} source lengths for {b} sequences",
            tl.len(),
            sl.len()
        ),
        Some((tl, sl)) => {
            let self_of = |seq| self_keep.as_ref().map(|k| k.of(seq, t));
            check_lengths("decoder layer", (tl, t), (tl, t), self_of)?;
            let memory_of = |seq: usize| memory_keep.as_ref().map(|k| &k[seq * s..][..s]);
            check_lengths("decoder layer (memory)", (tl, t), (sl, s), memory_of)?;
            (tl.iter().any(|&n| n < t) || sl.iter().any(|&n| n < s))
                .then(|| (tl.to_vec(), sl.to_vec()))
        }
        None => None,
    };
    let (lens, memory_lens) = lens.unzip();
    let op = LayerOp {
        what: "decoder layer",
        op_name: "kernels-decoder-layer",
        params: params.tensors.clone(),
        dims: Dims::new(LayerShape::new((b, t, s), (c, f), &opts, dtype), SLOTS),
        self_keep,
        memory_keep,
        lens,
        memory_lens,
        drops: dropout.filter(|d| d.p > 0.0).map(drops),
        grads: grads.cloned(),
        saved: Mutex::new(None),
    };
    op.apply(x, Some(memory))
}

/// The layer's forward (in `groups` groups) and backward passes on plain slices, for the
/// model's parity tests against its composed layer (`crate::testing`): `self_keep` the
/// self-attention mask `(B | 1, T, T)` (and whether it is per sequence), `memory_keep` the
/// source mask `(B, S)`, `lens` the target and source lengths when padding rows are skipped.
#[allow(clippy::too_many_arguments)]
pub fn run_slices<T: Float>(
    shape: &LayerShape,
    w: &[&[T]],
    self_keep: Option<(Vec<u8>, bool)>,
    memory_keep: Option<&[u8]>,
    lens: Option<(&[usize], &[usize])>,
    dropout: Option<DecoderLayerDropout>,
    xs: &[T],
    ms: &[T],
    dys: &[T],
    groups: usize,
) -> Run<T> {
    let dims = Dims::new(*shape, SLOTS);
    let self_keep = self_keep.map(|(data, per_batch)| Keep { data, per_batch });
    let (lens, memory_lens) = lens.unzip();
    let masks = Masks {
        self_keep: self_keep.as_ref(),
        memory_keep,
        lens,
        memory_lens,
    };
    let drops = dropout.map(drops);
    let inputs = (xs, ms, dys);
    super::fused_layer::run_slices(&dims, w, &masks, drops.as_ref(), inputs, groups)
}
