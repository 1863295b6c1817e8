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
use candle_core::{bail, CpuStorage, CustomOp2, DType, Layout, Result, Shape, Storage, Tensor};
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

#[derive(Debug, Clone, Copy)]
struct Drops {
    self_attn: MaskSpec,
    out1: MaskSpec,
    cross_attn: MaskSpec,
    out2: MaskSpec,
    hidden: MaskSpec,
    out3: MaskSpec,
    scale: f64,
}

impl Drops {
    fn new(d: DecoderLayerDropout) -> Self {
        let m = |s| MaskSpec::new(d.p, d.seed, s);
        Self {
            self_attn: m(d.streams[0]),
            out1: m(d.streams[1]),
            cross_attn: m(d.streams[2]),
            out2: m(d.streams[3]),
            hidden: m(d.streams[4]),
            out3: m(d.streams[5]),
            scale: 1.0 / (1.0 - d.p),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Dims {
    b: usize,
    /// Target length.
    t: usize,
    /// Memory (source) length.
    s: usize,
    /// What the sub-layers read.
    sub: SubDims,
}

impl Dims {
    /// Groups of sequences, one per thread.
    fn groups(&self) -> usize {
        let (b, t, s, c, f) = (self.b, self.t, self.s, self.sub.c, self.sub.f);
        let macs = b * t * c * (6 * c + 2 * f + 2 * t + 2 * s) + b * s * c * 2 * c;
        num_threads().min(macs / MIN_PARALLEL_MACS).min(b).max(1)
    }
}

/// What one group's forward pass keeps.
#[derive(Debug)]
struct Saved<T> {
    sa: AttnSaved<T>,
    ca: AttnSaved<T>,
    ff: FfSaved<T>,
    /// The residual stream after the first and the second sub-layer.
    x1: Vec<T>,
    x2: Vec<T>,
}

/// The three sub-layers' dropout masks: self-attention, encoder-decoder attention,
/// feed-forward.
fn sublayer_drops(drops: Option<&Drops>) -> (SublayerDrops<'_>, SublayerDrops<'_>, FfDrops<'_>) {
    (
        SublayerDrops {
            attn: drops.map(|dr| &dr.self_attn),
            out: drops.map(|dr| &dr.out1),
        },
        SublayerDrops {
            attn: drops.map(|dr| &dr.cross_attn),
            out: drops.map(|dr| &dr.out2),
        },
        FfDrops {
            hidden: drops.map(|dr| &dr.hidden),
            out: drops.map(|dr| &dr.out3),
        },
    )
}

/// The memory mask of sequences `seqs`, each row repeated for the `t` queries: `T x S` per
/// sequence, the layout [`masked_softmax_rows`] reads.
fn memory_keep_rows(keep: &[u8], seqs: std::ops::Range<usize>, t: usize, s: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(seqs.len() * t * s);
    for seq in seqs {
        for _ in 0..t {
            out.extend_from_slice(&keep[seq * s..(seq + 1) * s]);
        }
    }
    out
}

/// The masks a layer reads: the self-attention's `(B | 1, T, T)` and the memory's `B x S`,
/// and the sequences' lengths where padding rows are skipped.
struct Masks<'a> {
    self_keep: Option<&'a Keep>,
    memory_keep: Option<&'a [u8]>,
    /// Each target sequence's and each source sequence's real rows.
    lens: Option<(&'a [usize], &'a [usize])>,
}

impl Masks<'_> {
    /// The rows of sequences `s0 .. s0 + ns`: the target's (of `t`) and the memory's (of `s`).
    fn rows(&self, s0: usize, ns: usize, t: usize, s: usize) -> (Rows, Rows) {
        (
            Rows::of_group(s0, ns, t, self.lens.map(|l| l.0)),
            Rows::of_group(s0, ns, s, self.lens.map(|l| l.1)),
        )
    }
}

/// The forward pass of sequences `s0 .. s0 + ns` (`x`, `mem` and `y` their padded rows;
/// only their real rows are computed, the others zero in `y`).
#[allow(clippy::too_many_arguments)]
fn forward_group<T: Float>(
    d: &Dims,
    w: &[&[T]],
    masks: &Masks,
    drops: Option<&Drops>,
    s0: usize,
    x: &[T],
    mem: &[T],
    y: &mut [T],
    keep_saved: bool,
) -> Option<Saved<T>> {
    let (t, s, c) = (d.t, d.s, d.sub.c);
    let ns = x.len() / (t * c);
    let (rows, mrows) = masks.rows(s0, ns, t, s);
    let n = rows.n();
    let dscale = T::from_f64(drops.map_or(1.0, |dr| dr.scale));
    let mem_keep = masks
        .memory_keep
        .map(|k| memory_keep_rows(k, s0..s0 + ns, t, s));
    let gathered;
    let (x, mem) = if rows.is_full() && mrows.is_full() {
        (x, mem)
    } else {
        gathered = (rows.gather(x, c), mrows.gather(mem, c));
        (&gathered.0[..], &gathered.1[..])
    };
    simd(
        #[inline(always)]
        || {
            let (self_drops, cross_drops, ff_drops) = sublayer_drops(drops);
            let sh = d.sub;
            let mut x1 = vec![T::ZERO; n * c];
            let sa = attn_fwd(
                &sh,
                w,
                (slot::SQ_W, slot::N1_W),
                x,
                &rows,
                None,
                |seq| masks.self_keep.map(|k| k.of(seq, t)),
                self_drops,
                dscale,
                &mut x1,
            );
            let mut x2 = vec![T::ZERO; n * c];
            let ca = attn_fwd(
                &sh,
                w,
                (slot::CQ_W, slot::N2_W),
                &x1,
                &rows,
                Some((mem, &mrows)),
                |seq| {
                    mem_keep
                        .as_deref()
                        .map(|k| &k[(seq - s0) * t * s..][..t * s])
                },
                cross_drops,
                dscale,
                &mut x2,
            );
            let ff_slots = (slot::L1_W, slot::L2_W, slot::N3_W);
            let mut yc = Vec::new();
            let y_rows: &mut [T] = if rows.is_full() {
                y
            } else {
                yc = vec![T::ZERO; n * c];
                &mut yc
            };
            let ff = ff_fwd(&sh, w, ff_slots, &x2, &rows, ff_drops, dscale, y_rows);
            if !rows.is_full() {
                rows.scatter(&yc, y, c);
            }
            keep_saved.then_some(Saved { sa, ca, ff, x1, x2 })
        },
    )
}

/// The gradients of one group: its input's into `dx`, its memory rows' into `dmem` (both
/// zero on padding rows), the parameters' returned (indexed by [`slot`]).
#[allow(clippy::too_many_arguments)]
fn backward_group<T: Float>(
    d: &Dims,
    w: &[&[T]],
    masks: &Masks,
    drops: Option<&Drops>,
    s0: usize,
    sv: &Saved<T>,
    x: &[T],
    mem: &[T],
    dy: &[T],
    dx: &mut [T],
    dmem: &mut [T],
) -> Vec<Vec<T>> {
    let (t, s, c) = (d.t, d.s, d.sub.c);
    let ns = x.len() / (t * c);
    let (rows, mrows) = masks.rows(s0, ns, t, s);
    let (n, nm) = (rows.n(), mrows.n());
    let dscale = T::from_f64(drops.map_or(1.0, |dr| dr.scale));
    let full = rows.is_full() && mrows.is_full();
    let gathered;
    let (x, mem, dy) = if full {
        (x, mem, dy)
    } else {
        gathered = (rows.gather(x, c), mrows.gather(mem, c), rows.gather(dy, c));
        (&gathered.0[..], &gathered.1[..], &gathered.2[..])
    };
    simd(
        #[inline(always)]
        || {
            let mut g: Vec<Vec<T>> = w.iter().map(|p| vec![T::ZERO; p.len()]).collect();
            let mut scratch = Vec::new();
            let (self_drops, cross_drops, ff_drops) = sublayer_drops(drops);
            let sh = d.sub;
            let mut dx2 = vec![T::ZERO; n * c];
            let (ff, x2) = (&sv.ff, &sv.x2);
            ff_bwd(
                &sh,
                w,
                (slot::L1_W, slot::L2_W, slot::N3_W),
                &mut g,
                ff,
                x2,
                &rows,
                ff_drops,
                dscale,
                dy,
                &mut dx2,
                &mut scratch,
            );
            let (mut dxc, mut dmemc) = (Vec::new(), Vec::new());
            let (dx_rows, dmem_rows): (&mut [T], &mut [T]) = if full {
                (dx, dmem)
            } else {
                dxc = vec![T::ZERO; n * c];
                dmemc = vec![T::ZERO; nm * c];
                (&mut dxc, &mut dmemc)
            };
            let mut dx1 = vec![T::ZERO; n * c];
            attn_bwd(
                &sh,
                w,
                (slot::CQ_W, slot::N2_W),
                &mut g,
                &sv.ca,
                &sv.x1,
                &rows,
                Some((mem, dmem_rows, &mrows)),
                cross_drops,
                dscale,
                &dx2,
                &mut dx1,
                &mut scratch,
            );
            attn_bwd(
                &sh,
                w,
                (slot::SQ_W, slot::N1_W),
                &mut g,
                &sv.sa,
                x,
                &rows,
                None,
                self_drops,
                dscale,
                &dx1,
                dx_rows,
                &mut scratch,
            );
            if !full {
                rows.scatter(&dxc, dx, c);
                mrows.scatter(&dmemc, dmem, c);
            }
            g
        },
    )
}

/// The output of a forward pass and what each group kept.
type Forwarded<T> = (Vec<T>, Vec<Option<Saved<T>>>);

/// The layer's forward pass over all sequences, `groups` groups in parallel.
#[allow(clippy::too_many_arguments)]
fn forward<T: Float>(
    d: &Dims,
    w: &[&[T]],
    masks: &Masks,
    drops: Option<&Drops>,
    x: &[T],
    mem: &[T],
    groups: usize,
    keep_saved: bool,
) -> Forwarded<T> {
    let (row, mrow) = (d.t * d.sub.c, d.s * d.sub.c);
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
            masks,
            drops,
            r.start,
            &x[r.start * row..r.end * row],
            &mem[r.start * mrow..r.end * mrow],
            y,
            keep_saved,
        )
    });
    (y, saved)
}

/// The backward pass matching [`forward`]: `dx`, `dmem` and the parameters' gradients, the
/// groups' partial sums added in group order.
#[allow(clippy::too_many_arguments)]
fn backward<T: Float>(
    d: &Dims,
    w: &[&[T]],
    masks: &Masks,
    drops: Option<&Drops>,
    saved: &[Saved<T>],
    x: &[T],
    mem: &[T],
    dy: &[T],
) -> (Vec<T>, Vec<T>, Vec<Vec<T>>) {
    let (row, mrow) = (d.t * d.sub.c, d.s * d.sub.c);
    let groups = saved.len();
    let mut dx = vec![T::ZERO; x.len()];
    let mut dmem = vec![T::ZERO; mem.len()];
    let items: Vec<_> = group_ranges(d.b, groups)
        .into_iter()
        .zip(split_at_ranges(&mut dx, d.b, groups, row))
        .zip(split_at_ranges(&mut dmem, d.b, groups, mrow))
        .zip(saved)
        .collect();
    let partials = run_parallel(items, |(((r, dx), dmem), sv)| {
        backward_group(
            d,
            w,
            masks,
            drops,
            r.start,
            sv,
            &x[r.start * row..r.end * row],
            &mem[r.start * mrow..r.end * mrow],
            &dy[r.start * row..r.end * row],
            dx,
            dmem,
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
    (dx, dmem, sum)
}

struct LayerOp {
    params: DecoderLayerParams,
    dims: Dims,
    self_keep: Option<Keep>,
    memory_keep: Option<Vec<u8>>,
    /// Each target and source sequence's real rows (the others are not computed).
    lens: Option<(Vec<usize>, Vec<usize>)>,
    drops: Option<Drops>,
    grads: Option<DirectGrads>,
    saved: Mutex<Option<Vec<Saved<f32>>>>,
}

impl LayerOp {
    /// Calls `f` with the parameters as slices of `T`.
    fn with_weights<T: Float, R>(&self, f: impl FnOnce(&[&[T]]) -> Result<R>) -> Result<R> {
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
                _ => bail!("decoder layer: parameters must be on the CPU"),
            })
            .collect::<Result<Vec<&[T]>>>()?;
        f(&slices)
    }

    fn masks(&self) -> Masks<'_> {
        Masks {
            self_keep: self.self_keep.as_ref(),
            memory_keep: self.memory_keep.as_deref(),
            lens: self.lens.as_ref().map(|(t, s)| (&t[..], &s[..])),
        }
    }

    fn run<T: Float>(&self, x: &[T], mem: &[T], keep_saved: bool) -> Result<Forwarded<T>> {
        self.with_weights(|w| {
            let (d, masks) = (&self.dims, self.masks());
            let groups = d.groups();
            Ok(forward(
                d,
                w,
                &masks,
                self.drops.as_ref(),
                x,
                mem,
                groups,
                keep_saved,
            ))
        })
    }
}

impl CustomOp2 for LayerOp {
    fn name(&self) -> &'static str {
        "kernels-decoder-layer"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let storage = match (s1, s2) {
            (CpuStorage::F32(_), CpuStorage::F32(_)) => {
                let keep = self.grads.is_some();
                let (y, saved) = self.run::<f32>(cpu_slice(s1, l1)?, cpu_slice(s2, l2)?, keep)?;
                if keep {
                    let saved = saved.into_iter().map(|s| s.expect("kept")).collect();
                    *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = Some(saved);
                }
                CpuStorage::F32(y)
            }
            (CpuStorage::F64(_), CpuStorage::F64(_)) if self.grads.is_none() => {
                let (y, _) = self.run::<f64>(cpu_slice(s1, l1)?, cpu_slice(s2, l2)?, false)?;
                CpuStorage::F64(y)
            }
            _ => bail!("kernels-decoder-layer: f32 (or f64 without gradients) only"),
        };
        Ok((storage, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        mem: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let Some(grads) = &self.grads else {
            bail!("kernels-decoder-layer: backward without DirectGrads")
        };
        let saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        let Some(saved) = saved.as_ref() else {
            bail!("kernels-decoder-layer: backward before forward")
        };
        let (dx, dmem, g) = with_slice::<f32, _>(x, |xs| {
            with_slice::<f32, _>(mem, |ms| {
                with_slice::<f32, _>(dy, |dys| {
                    self.with_weights(|w| {
                        Ok(backward(
                            &self.dims,
                            w,
                            &self.masks(),
                            self.drops.as_ref(),
                            saved,
                            xs,
                            ms,
                            dys,
                        ))
                    })
                })
            })
        })?;
        for (param, grad) in self.params.tensors.iter().zip(g) {
            if DirectGrads::accepts(param) {
                grads.put_dense(param, grad);
            } else {
                bail!("kernels-decoder-layer: parameter is not a CPU f32 variable");
            }
        }
        Ok((
            Some(Tensor::from_vec(dx, x.shape(), x.device())?),
            Some(Tensor::from_vec(dmem, mem.shape(), mem.device())?),
        ))
    }
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
    let ok = (dtype == DType::F32 || (dtype == DType::F64 && grads.is_none()))
        && memory.dtype() == dtype
        && x.device().is_cpu()
        && memory.device().is_cpu()
        && params
            .tensors
            .iter()
            .all(|p| p.device().is_cpu() && p.dtype() == dtype);
    if !ok {
        bail!("decoder layer: the fused layer needs CPU f32 tensors (f64 without gradients)");
    }
    let self_keep = match self_keep {
        Some(m) => {
            let kb = m.dim(0)?;
            Some(Keep {
                data: m
                    .to_dtype(DType::U8)?
                    .broadcast_as((kb, 1, t, t))?
                    .flatten_all()?
                    .to_vec1::<u8>()?,
                per_batch: kb > 1,
            })
        }
        None => None,
    };
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
    let op = LayerOp {
        params: params.clone(),
        dims: Dims {
            b,
            t,
            s,
            sub: SubDims::new(c, f, &opts, dtype),
        },
        self_keep,
        memory_keep,
        lens,
        drops: dropout.filter(|d| d.p > 0.0).map(Drops::new),
        grads: grads.cloned(),
        saved: Mutex::new(None),
    };
    let (x, memory) = (x.contiguous()?, memory.contiguous()?);
    match grads {
        Some(_) => x.apply_op2(&memory, op),
        None => x.detach().apply_op2_no_bwd(&memory.detach(), &op),
    }
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
    let dims = Dims {
        b: shape.b,
        t: shape.t,
        s: shape.s,
        sub: SubDims::of(shape),
    };
    let self_keep = self_keep.map(|(data, per_batch)| Keep { data, per_batch });
    let masks = Masks {
        self_keep: self_keep.as_ref(),
        memory_keep,
        lens,
    };
    let drops = dropout.map(Drops::new);
    let (y, saved) = forward(&dims, w, &masks, drops.as_ref(), xs, ms, groups, true);
    let saved: Vec<_> = saved.into_iter().map(|s| s.expect("kept")).collect();
    let (dx, dmemory, grads) = backward(&dims, w, &masks, drops.as_ref(), &saved, xs, ms, dys);
    Run {
        y,
        dx,
        dmemory,
        grads,
        groups: saved.len(),
    }
}
