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
//! Checked in f64 against [`crate::decoder::DecoderLayer::forward_no_weights`] (`tests`).

use super::decoder_step::{slot, DecoderLayerParams};
use super::dropout::MaskSpec;
use super::encoder_layer::{
    group_ranges, split_at_ranges, EncoderLayerOptions, Keep, MIN_PARALLEL_MACS,
};
use super::float::{self, simd, Float};
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Activation;
    use crate::decoder::DecoderLayer;
    use crate::dropout::Mode;
    use crate::encoder::LayerSpec;
    use crate::mask::Mask;
    use crate::params::ParamBuilder;
    use crate::rng::Rng;
    use candle_core::Device;

    /// The layer's parameter names in [`slot`] order.
    fn param_names() -> Vec<String> {
        let mut names = Vec::new();
        for m in ["self_attn", "multihead_attn"] {
            for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
                for wb in ["weight", "bias"] {
                    names.push(format!("{m}.{proj}.{wb}"));
                }
            }
        }
        for l in ["linear1", "linear2", "norm1", "norm2", "norm3"] {
            for wb in ["weight", "bias"] {
                names.push(format!("{l}.{wb}"));
            }
        }
        names
    }

    /// With bf16 products (the projections and the feed-forward layer, both sub-layer kinds
    /// that the encoder layer shares) the output and every gradient stay within bf16's
    /// rounding of the fp32 layer's, with dropout and skipped padding rows; and they are not
    /// the fp32 values (the bf16 path ran). Needs a CPU with AMX or AVX512-BF16.
    #[test]
    fn bf16_products_stay_within_bf16_rounding_of_f32() -> Result<()> {
        if !crate::kernels::bf16::available() {
            eprintln!("no bf16 unit on this CPU: nothing to check");
            return Ok(());
        }
        let dev = Device::Cpu;
        let (b, t, s, c, f, h) = (4, 7, 5, 64, 96, 4);
        let pb = ParamBuilder::new(DType::F32, &dev, 5);
        let spec = LayerSpec {
            d_model: c,
            nhead: h,
            dim_feedforward: f,
            dropout: 0.2,
            activation: Activation::Relu,
            layer_norm_eps: 1e-5,
            norm_first: false,
        };
        DecoderLayer::new(&pb.pp("l"), &spec)?;
        let params = pb.params();
        let vals: Vec<Vec<f32>> = param_names()
            .iter()
            .map(|n| {
                params
                    .get(&format!("l.{n}"))
                    .expect("parameter")
                    .flatten_all()?
                    .to_vec1()
            })
            .collect::<Result<_>>()?;
        let w: Vec<&[f32]> = vals.iter().map(Vec::as_slice).collect();
        let tgt_lens: Vec<usize> = (0..b).map(|i| t - i % 3).collect();
        let src_lens: Vec<usize> = (0..b).map(|i| s - (i + 1) % 3).collect();
        let valid = |lens: &[usize], n: usize| -> Vec<u8> {
            (0..b * n).map(|i| u8::from(i % n < lens[i / n])).collect()
        };
        let tgt_mask = Mask::causal(t, &dev)?.and(&Mask::key_valid(&Tensor::from_vec(
            valid(&tgt_lens, t),
            (b, t),
            &dev,
        )?)?)?;
        let self_keep = Keep {
            data: tgt_mask
                .keep()
                .broadcast_as((b, 1, t, t))?
                .flatten_all()?
                .to_vec1()?,
            per_batch: true,
        };
        let memory_keep = valid(&src_lens, s);
        let masks = Masks {
            self_keep: Some(&self_keep),
            memory_keep: Some(&memory_keep),
            lens: Some((&tgt_lens, &src_lens)),
        };
        let drops = Drops::new(DecoderLayerDropout {
            p: 0.2,
            seed: 3,
            streams: [0, 1, 2, 3, 4, 5],
        });
        // Seeded values in [-1.7, 1.7) (unit variance).
        let rand = |n: usize, seed: u64| -> Vec<f32> {
            let r = Rng::new(seed);
            r.uniform_vec(n)
                .into_iter()
                .map(|u| ((u * 2.0 - 1.0) * 1.732) as f32)
                .collect()
        };
        let (xs, ms, dys) = (rand(b * t * c, 1), rand(b * s * c, 2), rand(b * t * c, 3));
        let run = |bf16: bool| {
            let dims = Dims {
                b,
                t,
                s,
                sub: SubDims {
                    c,
                    f,
                    h,
                    eps: 1e-5,
                    norm_first: false,
                    bf16,
                    gelu: false,
                },
            };
            let (y, saved) = forward(&dims, &w, &masks, Some(&drops), &xs, &ms, 2, true);
            let saved: Vec<_> = saved.into_iter().map(|s| s.expect("kept")).collect();
            let (dx, dm, g) = backward(&dims, &w, &masks, Some(&drops), &saved, &xs, &ms, &dys);
            let mut all = vec![y, dx, dm];
            all.extend(g);
            all
        };
        let (want, got) = (run(false), run(true));
        let mut what = vec!["y".to_string(), "dx".into(), "dmemory".into()];
        what.extend(param_names());
        let mut any_differs = false;
        for ((name, a), g) in what.iter().zip(&want).zip(&got) {
            if name.ends_with("k_proj.bias") {
                // Zero in exact arithmetic (softmax ignores a shift shared by all keys):
                // both are rounding noise.
                continue;
            }
            // Relative to the tensor's norm: bf16 operands carry 8 significant bits (2^-9
            // relative rounding), and the gradients pass through several products.
            let norm = a.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
            let err = a
                .iter()
                .zip(g)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f32>()
                .sqrt();
            any_differs |= err > 0.0;
            assert!(
                err <= 2e-2 * norm,
                "{name}: bf16 is off by {err} (norm {norm})"
            );
        }
        assert!(any_differs, "the bf16 path gave the fp32 values");
        Ok(())
    }

    /// The fused layer's forward pass and every gradient (target stream, memory, each
    /// parameter) against the composed layer in f64: post-norm and pre-norm, with and without
    /// dropout, causal and target padding masks, source padding, 3 groups of uneven size.
    #[test]
    fn fused_layer_equals_the_composed_layer_in_f64() -> Result<()> {
        let dev = Device::Cpu;
        let (b, t, s, c, f, h) = (5, 6, 4, 8, 12, 2);
        let cases = [(false, false), (true, false), (false, true), (true, true)];
        for (norm_first, gelu) in cases {
            // `skip`: with the sequences' lengths, padding rows not computed (the reference's
            // are then zeroed in `y` and in `dy`; the fused layer's `dy` there is not read).
            for (p, skip) in [(0.0, false), (0.3, false), (0.0, true), (0.3, true)] {
                let pb = ParamBuilder::new(DType::F64, &dev, 4);
                let spec = LayerSpec {
                    d_model: c,
                    nhead: h,
                    dim_feedforward: f,
                    dropout: p,
                    activation: if gelu {
                        Activation::Gelu
                    } else {
                        Activation::Relu
                    },
                    layer_norm_eps: 1e-5,
                    norm_first,
                };
                let layer = DecoderLayer::new(&pb.pp("l"), &spec)?;
                let params = pb.params();
                let x = candle_core::Var::from_tensor(&Tensor::randn(0f64, 1.0, (b, t, c), &dev)?)?;
                let mem =
                    candle_core::Var::from_tensor(&Tensor::randn(0f64, 1.0, (b, s, c), &dev)?)?;
                let tgt_valid: Vec<u8> = (0..b * t)
                    .map(|i| u8::from(i % t < t - i / t % 3))
                    .collect();
                let src_valid: Vec<u8> = (0..b * s)
                    .map(|i| u8::from(i % s < s - (i / s + 1) % 3))
                    .collect();
                let tgt_mask = Mask::causal(t, &dev)?.and(&Mask::key_valid(&Tensor::from_vec(
                    tgt_valid,
                    (b, t),
                    &dev,
                )?)?)?;
                let mem_mask = Mask::key_valid(&Tensor::from_vec(src_valid, (b, s), &dev)?)?;
                let rng = Rng::new(11);
                let y = layer.forward_no_weights(
                    x.as_tensor(),
                    mem.as_tensor(),
                    Some(&tgt_mask),
                    Some(&mem_mask),
                    Mode::Train(&rng),
                )?;
                let dy = Tensor::randn(0f64, 1.0, (b, t, c), &dev)?;
                let tgt_lens: Vec<usize> = (0..b).map(|i| t - i % 3).collect();
                let src_lens: Vec<usize> = (0..b).map(|i| s - (i + 1) % 3).collect();
                let (y, dy_ref) =
                    crate::kernels::sublayer::zero_padding_rows(y, &dy, &tgt_lens, skip)?;
                let store = (&y * &dy_ref)?.sum_all()?.backward()?;

                let names = param_names();
                let tensors: Vec<Tensor> = names
                    .iter()
                    .map(|n| {
                        params
                            .get(&format!("l.{n}"))
                            .unwrap_or_else(|| panic!("no parameter l.{n}"))
                            .as_tensor()
                            .clone()
                    })
                    .collect();
                let vals: Vec<Vec<f64>> = tensors
                    .iter()
                    .map(|t| t.flatten_all()?.to_vec1::<f64>())
                    .collect::<Result<_>>()?;
                let w: Vec<&[f64]> = vals.iter().map(Vec::as_slice).collect();
                let dims = Dims {
                    b,
                    t,
                    s,
                    sub: SubDims {
                        c,
                        f,
                        h,
                        eps: 1e-5,
                        norm_first,
                        bf16: false,
                        gelu,
                    },
                };
                let self_keep = Keep {
                    data: tgt_mask
                        .keep()
                        .broadcast_as((b, 1, t, t))?
                        .flatten_all()?
                        .to_vec1::<u8>()?,
                    per_batch: true,
                };
                let memory_keep = mem_mask
                    .keep()
                    .broadcast_as((b, 1, 1, s))?
                    .flatten_all()?
                    .to_vec1::<u8>()?;
                let masks = Masks {
                    self_keep: Some(&self_keep),
                    memory_keep: Some(&memory_keep),
                    lens: skip.then_some((&tgt_lens[..], &src_lens[..])),
                };
                let (seed, _) = rng.state();
                let drops = (p > 0.0).then(|| {
                    Drops::new(DecoderLayerDropout {
                        p,
                        seed,
                        streams: [0, 1, 2, 3, 4, 5],
                    })
                });
                let xs = x.as_tensor().flatten_all()?.to_vec1::<f64>()?;
                let ms = mem.as_tensor().flatten_all()?.to_vec1::<f64>()?;
                let (fy, saved) = forward(&dims, &w, &masks, drops.as_ref(), &xs, &ms, 3, true);
                assert_eq!(saved.len(), 3);
                let saved: Vec<_> = saved.into_iter().map(|s| s.unwrap()).collect();
                let dys = dy.flatten_all()?.to_vec1::<f64>()?;
                let (fdx, fdm, fg) =
                    backward(&dims, &w, &masks, drops.as_ref(), &saved, &xs, &ms, &dys);

                let close = |what: &str, want: &Tensor, got: &[f64]| -> Result<()> {
                    let want = want.flatten_all()?.to_vec1::<f64>()?;
                    assert_eq!(want.len(), got.len(), "{what}");
                    let size = want.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
                    let diff = want
                        .iter()
                        .zip(got)
                        .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
                    assert!(
                        diff <= 1e-12 * size,
                        "norm_first {norm_first}, gelu {gelu}, p {p}, skip {skip}: {what} differs by {diff} (size {size})"
                    );
                    Ok(())
                };
                close("y", &y, &fy)?;
                close("dx", store.get(x.as_tensor()).expect("dx"), &fdx)?;
                close("dmemory", store.get(mem.as_tensor()).expect("dmem"), &fdm)?;
                for (i, n) in names.iter().enumerate() {
                    let want = store
                        .get(&tensors[i])
                        .expect("every parameter has a gradient");
                    close(n, want, &fg[i])?;
                }
            }
        }
        Ok(())
    }
}
