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

use super::dropout::MaskSpec;
use super::float::{self, simd, Float};
use super::shared::{
    group_ranges, split_at_ranges, EncoderLayerOptions, Keep, LayerShape, Run, MIN_PARALLEL_MACS,
};
use super::sublayer::{
    attn_bwd, attn_fwd, check_lengths, ff_bwd, ff_fwd, AttnSaved, FfDrops, FfSaved, Rows, SubDims,
    SublayerDrops,
};
use super::{cpu_slice, num_threads, run_parallel, with_slice};
use crate::grads::DirectGrads;
use candle_core::{bail, CpuStorage, CustomOp1, DType, Layout, Result, Shape, Storage, Tensor};
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
    let keep = match keep {
        Some(m) => {
            let kb = m.dim(0)?;
            let v = m
                .to_dtype(DType::U8)?
                .broadcast_as((kb, 1, t, t))?
                .flatten_all()?
                .to_vec1::<u8>()?;
            Some(Keep {
                data: v,
                per_batch: kb > 1,
            })
        }
        None => None,
    };
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
    let dims = Dims {
        b,
        t,
        sub: SubDims::new(c, f, &opts, x.dtype()),
    };
    let op = LayerOp {
        params: params.clone(),
        dims,
        keep,
        lens,
        drops: dropout.filter(|d| d.p > 0.0).map(Drops::new),
        grads: grads.cloned(),
        saved: Mutex::new(None),
    };
    let x = x.contiguous()?;
    match grads {
        Some(_) => x.apply_op1(op),
        None => x.detach().apply_op1_no_bwd(&op),
    }
}

/// Whether [`encoder_layer`] runs on these tensors: all on the CPU, f32, or f64 when no
/// gradients are asked for (`with_grads` false).
pub fn encoder_layer_applies(x: &Tensor, params: &EncoderLayerParams, with_grads: bool) -> bool {
    let dtype = x.dtype();
    let ok_dtype = dtype == DType::F32 || (dtype == DType::F64 && !with_grads);
    ok_dtype
        && x.device().is_cpu()
        && params
            .tensors
            .iter()
            .all(|p| p.device().is_cpu() && p.dtype() == dtype)
}

#[derive(Debug, Clone, Copy)]
struct Dims {
    b: usize,
    t: usize,
    /// What the sub-layers read.
    sub: SubDims,
}

impl Dims {
    /// Groups of sequences, one per thread.
    fn groups(&self) -> usize {
        let (c, f) = (self.sub.c, self.sub.f);
        let macs = self.b * self.t * c * (4 * c + 2 * f + 2 * self.t);
        num_threads()
            .min(macs / MIN_PARALLEL_MACS)
            .min(self.b)
            .max(1)
    }
}

/// The four dropout masks (see [`LayerDropout`]).
#[derive(Debug, Clone, Copy)]
struct Drops {
    attn: MaskSpec,
    out1: MaskSpec,
    hidden: MaskSpec,
    out2: MaskSpec,
    scale: f64,
}

impl Drops {
    fn new(d: LayerDropout) -> Self {
        let m = |s| MaskSpec::new(d.p, d.seed, s);
        Self {
            attn: m(d.streams[0]),
            out1: m(d.streams[1]),
            hidden: m(d.streams[2]),
            out2: m(d.streams[3]),
            scale: 1.0 / (1.0 - d.p),
        }
    }
}

/// The parameters as slices, indexed by [`slot`].
struct Weights<'a, T>([&'a [T]; slot::COUNT]);

/// What one group's forward pass keeps for its backward pass.
#[derive(Debug)]
struct Saved<T> {
    sa: AttnSaved<T>,
    ff: FfSaved<T>,
    /// The residual stream between the sub-layers.
    x1: Vec<T>,
}

/// The forward pass of sequences `s0 .. s0 + ns` (`x` and `y` their padded rows; only the
/// first `lens` rows of each are computed, the others zero in `y`); returns what the
/// backward pass needs when `keep_saved`.
#[allow(clippy::too_many_arguments)]
fn forward_group<T: Float>(
    d: &Dims,
    w: &Weights<T>,
    keep: Option<&Keep>,
    lens: Option<&[usize]>,
    drops: Option<&Drops>,
    s0: usize,
    x: &[T],
    y: &mut [T],
    keep_saved: bool,
) -> Option<Saved<T>> {
    let (t, c) = (d.t, d.sub.c);
    let rows = Rows::of_group(s0, x.len() / (t * c), t, lens);
    let n = rows.n();
    let dscale = T::from_f64(drops.map_or(1.0, |dr| dr.scale));
    let (sh, (sa_drops, ff_drops)) = (d.sub, sublayer_drops(drops));
    let gathered;
    let x: &[T] = if rows.is_full() {
        x
    } else {
        gathered = rows.gather(x, c);
        &gathered
    };
    simd(
        #[inline(always)]
        || {
            let mut x1 = vec![T::ZERO; n * c];
            let sa = attn_fwd(
                &sh,
                &w.0,
                (slot::Q_W, slot::N1_W),
                x,
                &rows,
                None,
                |seq| keep.map(|m| m.of(seq, t)),
                sa_drops,
                dscale,
                &mut x1,
            );
            let ff_slots = (slot::L1_W, slot::L2_W, slot::N2_W);
            let mut yc = Vec::new();
            let y_rows: &mut [T] = if rows.is_full() {
                y
            } else {
                yc = vec![T::ZERO; n * c];
                &mut yc
            };
            let ff = ff_fwd(&sh, &w.0, ff_slots, &x1, &rows, ff_drops, dscale, y_rows);
            if !rows.is_full() {
                rows.scatter(&yc, y, c);
            }
            keep_saved.then_some(Saved { sa, ff, x1 })
        },
    )
}

/// The gradients of one group: the input's written into `dx` (zero on padding rows), the
/// parameters' returned (indexed by [`slot`]).
#[allow(clippy::too_many_arguments)]
fn backward_group<T: Float>(
    d: &Dims,
    w: &Weights<T>,
    lens: Option<&[usize]>,
    drops: Option<&Drops>,
    s0: usize,
    sv: &Saved<T>,
    x: &[T],
    dy: &[T],
    dx: &mut [T],
) -> Vec<Vec<T>> {
    let (t, c) = (d.t, d.sub.c);
    let rows = Rows::of_group(s0, x.len() / (t * c), t, lens);
    let n = rows.n();
    let dscale = T::from_f64(drops.map_or(1.0, |dr| dr.scale));
    let (sh, (sa_drops, ff_drops)) = (d.sub, sublayer_drops(drops));
    let w = &w.0;
    let gathered;
    let (x, dy) = if rows.is_full() {
        (x, dy)
    } else {
        gathered = (rows.gather(x, c), rows.gather(dy, c));
        (&gathered.0[..], &gathered.1[..])
    };
    simd(
        #[inline(always)]
        || {
            let mut g: Vec<Vec<T>> = w.iter().map(|p| vec![T::ZERO; p.len()]).collect();
            let mut scratch = Vec::new();
            let mut dx1 = vec![T::ZERO; n * c];
            let ff_slots = (slot::L1_W, slot::L2_W, slot::N2_W);
            let (ff, x1) = (&sv.ff, &sv.x1);
            ff_bwd(
                &sh,
                w,
                ff_slots,
                &mut g,
                ff,
                x1,
                &rows,
                ff_drops,
                dscale,
                dy,
                &mut dx1,
                &mut scratch,
            );
            let mut dxc = Vec::new();
            let dx_rows: &mut [T] = if rows.is_full() {
                dx
            } else {
                dxc = vec![T::ZERO; n * c];
                &mut dxc
            };
            attn_bwd(
                &sh,
                w,
                (slot::Q_W, slot::N1_W),
                &mut g,
                &sv.sa,
                x,
                &rows,
                None,
                sa_drops,
                dscale,
                &dx1,
                dx_rows,
                &mut scratch,
            );
            if !rows.is_full() {
                rows.scatter(&dxc, dx, c);
            }
            g
        },
    )
}

/// The two sub-layers' dropout masks.
fn sublayer_drops(drops: Option<&Drops>) -> (SublayerDrops<'_>, FfDrops<'_>) {
    (
        SublayerDrops {
            attn: drops.map(|dr| &dr.attn),
            out: drops.map(|dr| &dr.out1),
        },
        FfDrops {
            hidden: drops.map(|dr| &dr.hidden),
            out: drops.map(|dr| &dr.out2),
        },
    )
}

/// The output of a forward pass and what each group kept.
type Forwarded<T> = (Vec<T>, Vec<Option<Saved<T>>>);

/// The layer's forward pass over all `b` sequences of `x`, split into `groups` groups run in
/// parallel; the output and, when `keep_saved`, what each group keeps.
#[allow(clippy::too_many_arguments)]
fn forward<T: Float>(
    d: &Dims,
    w: &Weights<T>,
    keep: Option<&Keep>,
    lens: Option<&[usize]>,
    drops: Option<&Drops>,
    x: &[T],
    groups: usize,
    keep_saved: bool,
) -> Forwarded<T> {
    let row = d.t * d.sub.c;
    let mut y = vec![T::ZERO; x.len()];
    let groups = groups.min(d.b).max(1);
    let items: Vec<_> = group_ranges(d.b, groups)
        .into_iter()
        .zip(split_at_ranges(&mut y, d.b, groups, row))
        .collect();
    let saved = run_parallel(items, |(r, y)| {
        forward_group(
            d,
            w,
            keep,
            lens,
            drops,
            r.start,
            &x[r.start * row..r.end * row],
            y,
            keep_saved,
        )
    });
    (y, saved)
}

/// The backward pass matching [`forward`]: `dx` and the parameters' gradients, the groups'
/// partial sums added in group order.
fn backward<T: Float>(
    d: &Dims,
    w: &Weights<T>,
    lens: Option<&[usize]>,
    drops: Option<&Drops>,
    saved: &[Saved<T>],
    x: &[T],
    dy: &[T],
) -> (Vec<T>, Vec<Vec<T>>) {
    let row = d.t * d.sub.c;
    let groups = saved.len();
    let mut dx = vec![T::ZERO; x.len()];
    let items: Vec<_> = group_ranges(d.b, groups)
        .into_iter()
        .zip(split_at_ranges(&mut dx, d.b, groups, row))
        .zip(saved)
        .collect();
    let partials = run_parallel(items, |((r, dx), sv)| {
        backward_group(
            d,
            w,
            lens,
            drops,
            r.start,
            sv,
            &x[r.start * row..r.end * row],
            &dy[r.start * row..r.end * row],
            dx,
        )
    });
    let mut parts = partials.into_iter();
    let mut sum = parts.next().expect("at least one group");
    for p in parts {
        for (s, g) in sum.iter_mut().zip(&p) {
            simd(
                #[inline(always)]
                || float::add_inplace(s, g),
            );
        }
    }
    (dx, sum)
}

struct LayerOp {
    params: EncoderLayerParams,
    dims: Dims,
    keep: Option<Keep>,
    /// Each sequence's real rows (the others are not computed).
    lens: Option<Vec<usize>>,
    drops: Option<Drops>,
    grads: Option<DirectGrads>,
    /// What the forward pass kept (f32, with `grads`).
    saved: Mutex<Option<Vec<Saved<f32>>>>,
}

impl LayerOp {
    /// Calls `f` with the parameters as slices of `T`.
    fn with_weights<T: Float, R>(&self, f: impl FnOnce(&Weights<T>) -> Result<R>) -> Result<R> {
        let guards: Vec<_> = self
            .params
            .tensors
            .iter()
            .map(|p| p.storage_and_layout())
            .collect();
        let slices = guards
            .iter()
            .map(|(s, l)| match &**s {
                Storage::Cpu(s) => cpu_slice::<T>(s, l),
                _ => bail!("encoder layer: parameters must be on the CPU"),
            })
            .collect::<Result<Vec<&[T]>>>()?;
        let Ok(slices) = <[&[T]; slot::COUNT]>::try_from(slices) else {
            unreachable!("one slice per parameter")
        };
        f(&Weights(slices))
    }

    fn run<T: Float>(&self, x: &[T], keep_saved: bool) -> Result<Forwarded<T>> {
        self.with_weights(|w| {
            Ok(forward(
                &self.dims,
                w,
                self.keep.as_ref(),
                self.lens.as_deref(),
                self.drops.as_ref(),
                x,
                self.dims.groups(),
                keep_saved,
            ))
        })
    }
}

impl CustomOp1 for LayerOp {
    fn name(&self) -> &'static str {
        "kernels-encoder-layer"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let storage = match s {
            CpuStorage::F32(_) => {
                let (y, saved) = self.run::<f32>(cpu_slice(s, l)?, self.grads.is_some())?;
                if self.grads.is_some() {
                    let saved = saved.into_iter().map(|s| s.expect("kept")).collect();
                    *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = Some(saved);
                }
                CpuStorage::F32(y)
            }
            CpuStorage::F64(_) if self.grads.is_none() => {
                CpuStorage::F64(self.run::<f64>(cpu_slice(s, l)?, false)?.0)
            }
            _ => bail!("kernels-encoder-layer: f32 (or f64 without gradients) only"),
        };
        Ok((storage, l.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        let Some(grads) = &self.grads else {
            bail!("kernels-encoder-layer: backward without DirectGrads")
        };
        let saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        let Some(saved) = saved.as_ref() else {
            bail!("kernels-encoder-layer: backward before forward")
        };
        let (dx, g) = with_slice::<f32, _>(x, |xs| {
            with_slice::<f32, _>(dy, |dys| {
                self.with_weights(|w| {
                    Ok(backward(
                        &self.dims,
                        w,
                        self.lens.as_deref(),
                        self.drops.as_ref(),
                        saved,
                        xs,
                        dys,
                    ))
                })
            })
        })?;
        for (param, grad) in self.params.tensors.iter().zip(g) {
            if DirectGrads::accepts(param) {
                grads.put_dense(param, grad);
            } else {
                bail!("kernels-encoder-layer: parameter is not a CPU f32 variable");
            }
        }
        Ok(Some(Tensor::from_vec(dx, x.shape(), x.device())?))
    }
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
    let dims = Dims {
        b: shape.b,
        t: shape.t,
        sub: SubDims::of(shape),
    };
    let w = Weights(std::array::from_fn(|i| w[i]));
    let keep = keep.map(|(data, per_batch)| Keep { data, per_batch });
    let drops = dropout.map(Drops::new);
    let (y, saved) = forward(
        &dims,
        &w,
        keep.as_ref(),
        lens,
        drops.as_ref(),
        xs,
        groups,
        true,
    );
    let saved: Vec<_> = saved.into_iter().map(|s| s.expect("kept")).collect();
    let (dx, grads) = backward(&dims, &w, lens, drops.as_ref(), &saved, xs, dys);
    Run {
        y,
        dx,
        dmemory: Vec::new(),
        grads,
        groups: saved.len(),
    }
}
