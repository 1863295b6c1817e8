//! The training pass the fused encoder and decoder layers share ([`super::encoder_layer`],
//! [`super::decoder_layer`]): a stack of sub-layers (self-attention, for a decoder layer
//! attention over the memory, then feed-forward; [`super::sublayer`]) run forward and
//! backward over one group of sequences per thread, and the candle op around it.
//!
//! A layer is described by where its parameters lie ([`Slots`]; the encoder-decoder
//! attention is absent in an encoder layer), its masks and its dropout; an encoder layer is
//! a layer without memory (`S = 0`, an empty memory slice). Each thread runs the whole layer
//! on its group with single-threaded products; the weight gradients are summed per thread
//! and the partial sums added in thread order. The parameters' gradients go to
//! [`DirectGrads`]; the op returns its inputs' gradients to candle's graph.

use super::float::{self, simd, Float};
use super::rng::MaskSpec;
use super::shared::{group_ranges, split_at_ranges, Keep, LayerShape, Run, MIN_PARALLEL_MACS};
use super::sublayer::{
    attn_bwd, attn_fwd, ff_bwd, ff_fwd, AttnSaved, FfDrops, FfSaved, Rows, SublayerDrops,
};
use super::{cpu_slice, num_threads, run_parallel, with_slice};
use crate::grads::DirectGrads;
use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Storage, Tensor,
};
use std::sync::Mutex;

/// Where a layer's sub-layers find their parameters: the query weight's and the norm
/// weight's slots of each attention sub-layer, and `linear1`'s, `linear2`'s and the norm's
/// of the feed-forward sub-layer.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slots {
    pub(super) self_attn: (usize, usize),
    /// The encoder-decoder attention (decoder layers only).
    pub(super) cross: Option<(usize, usize)>,
    pub(super) ff: (usize, usize, usize),
}

/// A layer's shape and where its parameters lie.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dims {
    /// The shape (`s` = 0 without encoder-decoder attention) and options.
    sh: LayerShape,
    slots: Slots,
}

impl Dims {
    pub(super) fn new(sh: LayerShape, slots: Slots) -> Self {
        Self { sh, slots }
    }

    /// Groups of sequences, one per thread.
    fn groups(&self) -> usize {
        let LayerShape { b, t, s, c, f, .. } = self.sh;
        let macs = match self.slots.cross {
            Some(_) => b * t * c * (6 * c + 2 * f + 2 * t + 2 * s) + b * s * c * 2 * c,
            None => b * t * c * (4 * c + 2 * f + 2 * t),
        };
        num_threads().min(macs / MIN_PARALLEL_MACS).min(b).max(1)
    }
}

/// The dropout masks of a layer's sub-layers: of each attention sub-layer's weights and
/// output, of the feed-forward hidden layer and output.
#[derive(Debug, Clone, Copy)]
pub(super) struct Drops {
    self_attn: [MaskSpec; 2],
    cross: Option<[MaskSpec; 2]>,
    ff: [MaskSpec; 2],
    scale: f64,
}

impl Drops {
    /// Probability `p`, the RNG streams under `seed` in the order the composed layer draws
    /// them: the self-attention weights, its output, (the encoder-decoder attention weights,
    /// its output: six streams), the feed-forward hidden layer, its output.
    pub(super) fn new(p: f64, seed: u64, streams: &[u64]) -> Self {
        let pair = |i: usize| {
            [
                MaskSpec::new(p, seed, streams[i]),
                MaskSpec::new(p, seed, streams[i + 1]),
            ]
        };
        Self {
            self_attn: pair(0),
            cross: (streams.len() == 6).then(|| pair(2)),
            ff: pair(streams.len() - 2),
            scale: 1.0 / (1.0 - p),
        }
    }
}

/// The sub-layers' dropout masks: self-attention, encoder-decoder attention, feed-forward.
fn sublayer_drops(drops: Option<&Drops>) -> (SublayerDrops<'_>, SublayerDrops<'_>, FfDrops<'_>) {
    fn attn(m: Option<&[MaskSpec; 2]>) -> SublayerDrops<'_> {
        SublayerDrops {
            attn: m.map(|m| &m[0]),
            out: m.map(|m| &m[1]),
        }
    }
    (
        attn(drops.map(|dr| &dr.self_attn)),
        attn(drops.and_then(|dr| dr.cross.as_ref())),
        FfDrops {
            hidden: drops.map(|dr| &dr.ff[0]),
            out: drops.map(|dr| &dr.ff[1]),
        },
    )
}

/// The dropout's scale (1 without dropout).
fn drop_scale<T: Float>(drops: Option<&Drops>) -> T {
    T::from_f64(drops.map_or(1.0, |dr| dr.scale))
}

/// The masks a layer reads: the self-attention's `(B | 1, T, T)` and the memory's `B x S`,
/// and the sequences' lengths where padding rows are skipped.
pub(super) struct Masks<'a> {
    pub(super) self_keep: Option<&'a Keep>,
    pub(super) memory_keep: Option<&'a [u8]>,
    /// Each target sequence's real rows.
    pub(super) lens: Option<&'a [usize]>,
    /// Each source sequence's real rows.
    pub(super) memory_lens: Option<&'a [usize]>,
}

impl Masks<'_> {
    /// The rows of sequences `s0 .. s0 + ns`: the target's (of `t`) and the memory's (of `s`).
    fn rows(&self, s0: usize, ns: usize, t: usize, s: usize) -> (Rows, Rows) {
        (
            Rows::of_group(s0, ns, t, self.lens),
            Rows::of_group(s0, ns, s, self.memory_lens),
        )
    }
}

/// The memory mask of sequences `seqs`, each row repeated for the `t` queries: `T x S` per
/// sequence, the layout [`super::attention::masked_softmax_rows`] reads.
fn memory_keep_rows(keep: &[u8], seqs: std::ops::Range<usize>, t: usize, s: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(seqs.len() * t * s);
    for seq in seqs {
        for _ in 0..t {
            out.extend_from_slice(&keep[seq * s..(seq + 1) * s]);
        }
    }
    out
}

/// What one group's forward pass keeps for its backward pass.
#[derive(Debug)]
pub(super) struct Saved<T> {
    sa: AttnSaved<T>,
    /// The encoder-decoder attention's and the residual stream after it.
    ca: Option<(AttnSaved<T>, Vec<T>)>,
    ff: FfSaved<T>,
    /// The residual stream after the self-attention.
    x1: Vec<T>,
}

impl<T> Saved<T> {
    /// The feed-forward sub-layer's input.
    fn ff_in(&self) -> &[T] {
        self.ca.as_ref().map_or(&self.x1, |(_, x2)| x2)
    }
}

/// The output of a forward pass and what each group kept.
type Forwarded<T> = (Vec<T>, Vec<Option<Saved<T>>>);

/// What every pass of a layer reads: its shape, parameters (indexed by its slots), masks
/// and dropout.
#[derive(Clone, Copy)]
struct Layer<'a, T> {
    d: &'a Dims,
    w: &'a [&'a [T]],
    masks: &'a Masks<'a>,
    drops: Option<&'a Drops>,
}

impl<T: Float> Layer<'_, T> {
    /// The target's and the memory's rows of the group from sequence `s0` whose padded
    /// input rows are `x`.
    fn rows(&self, s0: usize, x: &[T]) -> (Rows, Rows) {
        let (t, c) = (self.d.sh.t, self.d.sh.c);
        self.masks.rows(s0, x.len() / (t * c), t, self.d.sh.s)
    }

    /// The forward pass of sequences `s0 .. s0 + ns` (`x`, `mem` and `y` their padded rows;
    /// only their real rows are computed, the others zero in `y`); returns what the backward
    /// pass needs when `keep_saved`.
    fn forward_group(
        &self,
        s0: usize,
        (x, mem): (&[T], &[T]),
        y: &mut [T],
        keep_saved: bool,
    ) -> Option<Saved<T>> {
        let (d, w) = (self.d, self.w);
        let (t, s, c) = (d.sh.t, d.sh.s, d.sh.c);
        let (rows, mrows) = self.rows(s0, x);
        let mem_keep = self
            .masks
            .memory_keep
            .map(|k| memory_keep_rows(k, s0..s0 + rows.seqs(), t, s));
        let (n, dscale) = (rows.n(), drop_scale(self.drops));
        let (x, mem) = (rows.packed(x, c), mrows.packed(mem, c));
        let self_keep = |seq| self.masks.self_keep.map(|k| k.of(seq, t));
        let memory_keep = |seq: usize| {
            mem_keep
                .as_deref()
                .map(|k| &k[(seq - s0) * t * s..][..t * s])
        };
        simd(
            #[inline(always)]
            || {
                let (self_drops, cross_drops, ff_drops) = sublayer_drops(self.drops);
                let sh = d.sh;
                let mut x1 = vec![T::ZERO; n * c];
                let sa_in = (&x[..], &rows, None);
                let sa = attn_fwd(
                    &sh,
                    (w, d.slots.self_attn),
                    sa_in,
                    self_keep,
                    self_drops,
                    dscale,
                    &mut x1,
                );
                let ca = if let Some(slots) = d.slots.cross {
                    let mut x2 = vec![T::ZERO; n * c];
                    let ca_in = (&x1[..], &rows, Some((&*mem, &mrows)));
                    let ca = attn_fwd(
                        &sh,
                        (w, slots),
                        ca_in,
                        memory_keep,
                        cross_drops,
                        dscale,
                        &mut x2,
                    );
                    Some((ca, x2))
                } else {
                    None
                };
                let ff_in = ca.as_ref().map_or(&x1, |(_, x2)| x2);
                let ff = rows.write_packed(
                    y,
                    c,
                    #[inline(always)]
                    |y_rows| ff_fwd(&sh, (w, d.slots.ff), ff_in, &rows, ff_drops, dscale, y_rows),
                );
                keep_saved.then_some(Saved { sa, ca, ff, x1 })
            },
        )
    }

    /// The gradients of one group: its input's into `dx`, its memory rows' into `dmem` (both
    /// zero on padding rows), the parameters' returned (indexed by the layer's slots).
    fn backward_group(
        &self,
        s0: usize,
        sv: &Saved<T>,
        (x, mem, dy): (&[T], &[T], &[T]),
        dx: &mut [T],
        dmem: &mut [T],
    ) -> Vec<Vec<T>> {
        let (d, w, c) = (self.d, self.w, self.d.sh.c);
        let (rows, mrows) = self.rows(s0, x);
        let (n, dscale) = (rows.n(), drop_scale(self.drops));
        let (x, mem, dy) = (rows.packed(x, c), mrows.packed(mem, c), rows.packed(dy, c));
        simd(
            #[inline(always)]
            || {
                let mut g: Vec<Vec<T>> = w.iter().map(|p| vec![T::ZERO; p.len()]).collect();
                let mut scratch = Vec::new();
                let (self_drops, cross_drops, ff_drops) = sublayer_drops(self.drops);
                let sh = d.sh;
                let mut dff_in = vec![T::ZERO; n * c];
                let ff = (&sv.ff, sv.ff_in(), &rows);
                let g_s = (&mut g[..], &mut scratch);
                ff_bwd(
                    &sh,
                    (w, d.slots.ff),
                    g_s,
                    ff,
                    ff_drops,
                    dscale,
                    &dy,
                    &mut dff_in,
                );
                rows.write_packed(
                    dx,
                    c,
                    #[inline(always)]
                    |dx_rows| {
                        let dx1 = match (d.slots.cross, &sv.ca) {
                            (Some(slots), Some((ca, _))) => {
                                let mut dx1 = vec![T::ZERO; n * c];
                                mrows.write_packed(
                                    dmem,
                                    c,
                                    #[inline(always)]
                                    |dmem_rows| {
                                        let kv = Some((&*mem, dmem_rows, &mrows));
                                        let ca = (ca, &sv.x1[..], &rows, kv);
                                        let g_s = (&mut g[..], &mut scratch);
                                        let d_io = (&dff_in[..], &mut dx1[..]);
                                        attn_bwd(
                                            &sh,
                                            (w, slots),
                                            g_s,
                                            ca,
                                            cross_drops,
                                            dscale,
                                            d_io,
                                        )
                                    },
                                );
                                dx1
                            }
                            _ => dff_in,
                        };
                        let sa = (&sv.sa, &x[..], &rows, None);
                        let g_s = (&mut g[..], &mut scratch);
                        let d_io = (&dx1[..], dx_rows);
                        attn_bwd(
                            &sh,
                            (w, d.slots.self_attn),
                            g_s,
                            sa,
                            self_drops,
                            dscale,
                            d_io,
                        );
                    },
                );
                g
            },
        )
    }

    /// The layer's forward pass over all `b` sequences of `x` (and their memory `mem`, empty
    /// without encoder-decoder attention), split into `groups` groups run in parallel; the
    /// output and, when `keep_saved`, what each group keeps.
    fn forward(&self, (x, mem): (&[T], &[T]), groups: usize, keep_saved: bool) -> Forwarded<T> {
        let LayerShape { b, t, s, c, .. } = self.d.sh;
        let (row, mrow) = (t * c, s * c);
        let mut y = vec![T::ZERO; x.len()];
        let groups = groups.min(b).max(1);
        let items: Vec<_> = group_ranges(b, groups)
            .into_iter()
            .zip(split_at_ranges(&mut y, b, groups, row))
            .collect();
        let saved = run_parallel(items, |(r, y)| {
            let inputs = (
                &x[r.start * row..r.end * row],
                &mem[r.start * mrow..r.end * mrow],
            );
            self.forward_group(r.start, inputs, y, keep_saved)
        });
        (y, saved)
    }

    /// The backward pass matching [`Self::forward`]: `dx`, `dmem` and the parameters'
    /// gradients, the groups' partial sums added in group order.
    fn backward(
        &self,
        saved: &[Saved<T>],
        (x, mem, dy): (&[T], &[T], &[T]),
    ) -> (Vec<T>, Vec<T>, Vec<Vec<T>>) {
        let LayerShape { b, t, s, c, .. } = self.d.sh;
        let (row, mrow) = (t * c, s * c);
        let groups = saved.len();
        let mut dx = vec![T::ZERO; x.len()];
        let mut dmem = vec![T::ZERO; mem.len()];
        let items: Vec<_> = group_ranges(b, groups)
            .into_iter()
            .zip(split_at_ranges(&mut dx, b, groups, row))
            .zip(split_at_ranges(&mut dmem, b, groups, mrow))
            .zip(saved)
            .collect();
        let partials = run_parallel(items, |(((r, dx), dmem), sv)| {
            let (rs, ms) = (r.start * row..r.end * row, r.start * mrow..r.end * mrow);
            let inputs = (&x[rs.clone()], &mem[ms], &dy[rs]);
            self.backward_group(r.start, sv, inputs, dx, dmem)
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
}

/// The layer's forward (in `groups` groups) and backward passes on plain slices
/// ([`crate::testing`]): its input `xs`, memory `ms` (empty for an encoder layer) and the
/// output's gradient `dys`.
pub(super) fn run_slices<T: Float>(
    dims: &Dims,
    w: &[&[T]],
    masks: &Masks,
    drops: Option<&Drops>,
    (xs, ms, dys): (&[T], &[T], &[T]),
    groups: usize,
) -> Run<T> {
    let layer = Layer {
        d: dims,
        w,
        masks,
        drops,
    };
    let (y, saved) = layer.forward((xs, ms), groups, true);
    let saved: Vec<_> = saved.into_iter().map(|s| s.expect("kept")).collect();
    let (dx, dmemory, grads) = layer.backward(&saved, (xs, ms, dys));
    Run {
        y,
        dx,
        dmemory,
        grads,
        groups: saved.len(),
    }
}

/// The attention mask `m`, u8 broadcastable to `(B, 1, T, T)`, expanded to `(B | 1, T, T)`.
pub(super) fn keep_mask(m: &Tensor, t: usize) -> Result<Keep> {
    let kb = m.dim(0)?;
    Ok(Keep {
        data: m
            .to_dtype(DType::U8)?
            .broadcast_as((kb, 1, t, t))?
            .flatten_all()?
            .to_vec1::<u8>()?,
        per_batch: kb > 1,
    })
}

/// Whether the fused layer runs on these tensors: all on the CPU, f32, or f64 when no
/// gradients are asked for (`with_grads` false).
pub(super) fn layer_applies(inputs: &[&Tensor], params: &[Tensor], with_grads: bool) -> bool {
    let dtype = inputs[0].dtype();
    let ok_dtype = dtype == DType::F32 || (dtype == DType::F64 && !with_grads);
    ok_dtype
        && inputs
            .iter()
            .all(|x| x.device().is_cpu() && x.dtype() == dtype)
        && params
            .iter()
            .all(|p| p.device().is_cpu() && p.dtype() == dtype)
}

/// The fused layer as a candle op: a [`CustomOp1`] on the input (encoder layers) or a
/// [`CustomOp2`] on the input and the memory (decoder layers).
pub(super) struct LayerOp {
    /// The layer's name in errors ("encoder layer").
    pub(super) what: &'static str,
    /// The op's name ("kernels-encoder-layer").
    pub(super) op_name: &'static str,
    /// The parameters, indexed by the layer's slots.
    pub(super) params: Vec<Tensor>,
    pub(super) dims: Dims,
    pub(super) self_keep: Option<Keep>,
    pub(super) memory_keep: Option<Vec<u8>>,
    /// Each target sequence's real rows (the others are not computed).
    pub(super) lens: Option<Vec<usize>>,
    /// Each source sequence's real rows.
    pub(super) memory_lens: Option<Vec<usize>>,
    pub(super) drops: Option<Drops>,
    pub(super) grads: Option<DirectGrads>,
    /// What the forward pass kept (f32, with `grads`).
    pub(super) saved: Mutex<Option<Vec<Saved<f32>>>>,
}

impl LayerOp {
    /// Runs the layer on `x` (and `memory`, for a [`CustomOp2`]), with a backward pass when
    /// the op has `grads`.
    pub(super) fn apply(self, x: &Tensor, memory: Option<&Tensor>) -> Result<Tensor> {
        let x = x.contiguous()?;
        match (memory, self.grads.is_some()) {
            (None, true) => x.apply_op1(self),
            (None, false) => x.detach().apply_op1_no_bwd(&self),
            (Some(m), true) => x.apply_op2(&m.contiguous()?, self),
            (Some(m), false) => x
                .detach()
                .apply_op2_no_bwd(&m.contiguous()?.detach(), &self),
        }
    }

    /// Calls `f` with the parameters as slices of `T`.
    fn with_weights<T: Float, R>(&self, f: impl FnOnce(&[&[T]]) -> Result<R>) -> Result<R> {
        let guards: Vec<_> = self.params.iter().map(|p| p.storage_and_layout()).collect();
        let slices = guards
            .iter()
            .map(|(s, l)| match &**s {
                Storage::Cpu(s) => cpu_slice::<T>(s, l),
                _ => bail!("{}: parameters must be on the CPU", self.what),
            })
            .collect::<Result<Vec<&[T]>>>()?;
        f(&slices)
    }

    fn masks(&self) -> Masks<'_> {
        Masks {
            self_keep: self.self_keep.as_ref(),
            memory_keep: self.memory_keep.as_deref(),
            lens: self.lens.as_deref(),
            memory_lens: self.memory_lens.as_deref(),
        }
    }

    fn layer<'a, T>(&'a self, w: &'a [&'a [T]], masks: &'a Masks<'a>) -> Layer<'a, T> {
        Layer {
            d: &self.dims,
            w,
            masks,
            drops: self.drops.as_ref(),
        }
    }

    fn run<T: Float>(&self, x: &[T], mem: &[T], keep_saved: bool) -> Result<Forwarded<T>> {
        self.with_weights(|w| {
            let masks = self.masks();
            let layer = self.layer(w, &masks);
            Ok(layer.forward((x, mem), self.dims.groups(), keep_saved))
        })
    }

    /// The forward pass on `x` and the memory `mem` (none for an encoder layer), keeping
    /// what the backward pass reads when the op has `grads`.
    fn cpu_forward(
        &self,
        (s, l): (&CpuStorage, &Layout),
        mem: Option<(&CpuStorage, &Layout)>,
    ) -> Result<(CpuStorage, Shape)> {
        fn slice<'a, T: Float>(mem: Option<(&'a CpuStorage, &Layout)>) -> Result<&'a [T]> {
            mem.map_or(Ok(&[]), |(s, l)| cpu_slice(s, l))
        }
        let storage = match (s, mem.map(|m| m.0)) {
            (CpuStorage::F32(_), None | Some(CpuStorage::F32(_))) => {
                let keep = self.grads.is_some();
                let (y, saved) = self.run::<f32>(cpu_slice(s, l)?, slice(mem)?, keep)?;
                if keep {
                    let saved = saved.into_iter().map(|s| s.expect("kept")).collect();
                    *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = Some(saved);
                }
                CpuStorage::F32(y)
            }
            (CpuStorage::F64(_), None | Some(CpuStorage::F64(_))) if self.grads.is_none() => {
                let (y, _) = self.run::<f64>(cpu_slice(s, l)?, slice(mem)?, false)?;
                CpuStorage::F64(y)
            }
            _ => bail!("{}: f32 (or f64 without gradients) only", self.op_name),
        };
        Ok((storage, l.shape().clone()))
    }

    /// The backward pass: the parameters' gradients into the op's [`DirectGrads`], the
    /// gradients of `x` and of `mem` (for a [`CustomOp2`]) returned.
    fn backward(
        &self,
        x: &Tensor,
        mem: Option<&Tensor>,
        dy: &Tensor,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let Some(grads) = &self.grads else {
            bail!("{}: backward without DirectGrads", self.op_name)
        };
        let saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        let Some(saved) = saved.as_ref() else {
            bail!("{}: backward before forward", self.op_name)
        };
        let (dx, dmem, g) = with_slice::<f32, _>(x, |xs| {
            with_memory_slice(mem, |ms| {
                with_slice::<f32, _>(dy, |dys| {
                    self.with_weights(|w| {
                        let masks = self.masks();
                        Ok(self.layer(w, &masks).backward(saved, (xs, ms, dys)))
                    })
                })
            })
        })?;
        for (param, grad) in self.params.iter().zip(g) {
            if DirectGrads::accepts(param) {
                grads.put_dense(param, grad);
            } else {
                bail!("{}: parameter is not a CPU f32 variable", self.op_name);
            }
        }
        let dmem = mem
            .map(|m| Tensor::from_vec(dmem, m.shape(), m.device()))
            .transpose()?;
        Ok((Tensor::from_vec(dx, x.shape(), x.device())?, dmem))
    }
}

/// [`with_slice`] on the memory, an empty slice without one.
fn with_memory_slice<R>(mem: Option<&Tensor>, f: impl FnOnce(&[f32]) -> Result<R>) -> Result<R> {
    match mem {
        Some(m) => with_slice::<f32, _>(m, f),
        None => f(&[]),
    }
}

impl CustomOp1 for LayerOp {
    fn name(&self) -> &'static str {
        self.op_name
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        self.cpu_forward((s, l), None)
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(self.backward(x, None, dy)?.0))
    }
}

impl CustomOp2 for LayerOp {
    fn name(&self) -> &'static str {
        self.op_name
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.cpu_forward((s1, l1), Some((s2, l2)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        mem: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dmem) = self.backward(x, Some(mem), dy)?;
        Ok((Some(dx), dmem))
    }
}
