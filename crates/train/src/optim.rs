//! Optimizers that update parameters in place, with state that can be saved and restored,
//! and the paper's learning-rate schedule.

use crate::grads::{GradRef, Gradients};
use candle_core::{CpuStorage, DType, InplaceOp1, InplaceOp3, Layout, Result, Tensor, Var};
use transformer_model::grads::GradView;

/// Plain stochastic gradient descent, `p -= lr * g` (the PyTorch tutorial's optimizer).
#[derive(Debug, Clone)]
pub struct Sgd {
    vars: Vec<Var>,
    /// The learning rate; set it between steps to follow a schedule.
    pub lr: f64,
}

impl Sgd {
    /// An optimizer for `vars` with learning rate `lr`.
    pub fn new(vars: Vec<Var>, lr: f64) -> Self {
        Self { vars, lr }
    }

    /// The parameters it updates.
    pub fn vars(&self) -> &[Var] {
        &self.vars
    }

    /// `p -= lr * scale * g` for every parameter with a gradient in `grads`: the step after
    /// scaling the gradients by `scale` (the clipping coefficient; 1 leaves them as they
    /// are), without materialising the scaled gradients. In place: a dense gradient in one
    /// pass over both cores, a row gradient on its rows only. A gradient of a parameter this
    /// optimizer does not hold is an error.
    pub fn step(&mut self, grads: &Gradients, scale: f64) -> Result<()> {
        let alpha = -self.lr * scale;
        let vars = &self.vars;
        grads.for_each(|v, g| {
            if !vars
                .iter()
                .any(|x| x.as_tensor().id() == v.as_tensor().id())
            {
                candle_core::bail!("sgd: a gradient for a parameter it does not hold");
            }
            match g {
                GradRef::Tensor(g) => axpy_in_place(v, g, alpha),
                GradRef::Fused { view, plus } => {
                    if let Some(g) = plus {
                        axpy_in_place(v, g, alpha)?;
                    }
                    v.as_tensor().inplace_op1(&AxpyDirect {
                        g: view,
                        alpha: alpha as f32,
                    })
                }
            }
        })
    }
}

/// The values of a contiguous f32 CPU tensor that an in-place op updates, or the error
/// `refusal`.
fn contiguous_f32<'a>(dst: &'a mut CpuStorage, l: &Layout, refusal: &str) -> Result<&'a mut [f32]> {
    match (dst, l.contiguous_offsets()) {
        (CpuStorage::F32(d), Some((d0, d1))) => Ok(&mut d[d0..d1]),
        _ => candle_core::bail!("{refusal}"),
    }
}

/// `p += alpha * g` for a gradient written by fused ops ([`GradRef::Fused`]).
struct AxpyDirect<'a> {
    g: GradView<'a>,
    alpha: f32,
}

impl InplaceOp1 for AxpyDirect<'_> {
    fn name(&self) -> &'static str {
        "axpy-direct"
    }

    fn cpu_fwd(&self, dst: &mut CpuStorage, l: &Layout) -> Result<()> {
        let d = contiguous_f32(dst, l, "axpy-direct: expected a contiguous f32 parameter")?;
        let a = self.alpha;
        match self.g {
            GradView::Dense { values: g, .. } => {
                if g.len() != d.len() {
                    candle_core::bail!("axpy-direct: gradient and parameter sizes differ");
                }
                crate::par::zip_mut(d, g, |d, s| {
                    d.iter_mut().zip(s).for_each(|(x, g)| *x += a * g)
                });
            }
            GradView::Rows { ids, rows, dim } => {
                for (&id, r) in ids.iter().zip(rows.chunks_exact(dim)) {
                    let Some(row) = d.get_mut(id as usize * dim..(id as usize + 1) * dim) else {
                        candle_core::bail!("axpy-direct: row {id} outside the parameter");
                    };
                    row.iter_mut().zip(r).for_each(|(x, g)| *x += a * g);
                }
            }
        }
        Ok(())
    }
}

/// `p += alpha * g`, in place where the parameter and gradient are contiguous CPU f32/f64
/// (one pass, no allocation: for the tutorial LM the allocating form cost about 25 ms a step,
/// about a tenth of it); through `Var::set` elsewhere.
fn axpy_in_place(p: &Var, g: &Tensor, alpha: f64) -> Result<()> {
    let a = alpha as f32;
    let axpy = crate::par::ZipInPlace {
        name: "axpy",
        f32: |d: &mut [f32], s: &[f32]| d.iter_mut().zip(s).for_each(|(x, g)| *x += a * g),
        f64: Some(|d: &mut [f64], s: &[f64]| {
            d.iter_mut().zip(s).for_each(|(x, g)| *x += alpha * g)
        }),
    };
    if axpy.runs_in_place(p, g) {
        p.as_tensor().inplace_op2(g, &axpy)
    } else {
        p.set(&(p.as_tensor() + (g * alpha)?)?)
    }
}

/// Prefix of Adam's first moments in checkpoints (`adam.m.<parameter index>`).
pub const ADAM_M: &str = "adam.m.";
/// Prefix of Adam's second moments in checkpoints (`adam.v.<parameter index>`).
pub const ADAM_V: &str = "adam.v.";

/// Adam (Kingma & Ba 2015) with bias correction, the paper's optimizer (section 5.3:
/// beta1 0.9, beta2 0.98, eps 1e-9). Its moments are public for checkpoints.
#[derive(Debug, Clone)]
pub struct Adam {
    vars: Vec<Var>,
    /// The learning rate; set it between steps to follow a schedule.
    pub lr: f64,
    /// Decay rate of the first moment (the gradients' running mean).
    pub beta1: f64,
    /// Decay rate of the second moment (the squared gradients' running mean).
    pub beta2: f64,
    /// Added to the denominator `sqrt(v_hat)` for numerical stability.
    pub eps: f64,
    /// Steps taken so far.
    pub step: u64,
    /// First and second moments, one pair per parameter.
    pub moments: Vec<(Tensor, Tensor)>,
    /// Off the CPU: the moments laid end to end, of which `moments` are views, kept between
    /// steps ([`Adam::step_flat`]).
    flat: Option<FlatMoments>,
}

/// All parameters' moments end to end in two flat tensors, and the ids of the views
/// `Adam::moments` held when they were made (a moment replaced since, as a checkpoint's
/// restore does, makes them stale).
#[derive(Debug, Clone)]
struct FlatMoments {
    m: Tensor,
    s: Tensor,
    views: Vec<(candle_core::TensorId, candle_core::TensorId)>,
}

impl Adam {
    /// The optimizer's state as a checkpoint stores it: tensors `adam.m.<i>`, `adam.v.<i>`
    /// (one pair per parameter, in order) and the step count as metadata `adam_step`.
    pub fn checkpoint_state(&self) -> (Vec<(String, Tensor)>, Vec<(&'static str, String)>) {
        let mut tensors = Vec::with_capacity(2 * self.moments.len());
        for (i, (m, v)) in self.moments.iter().enumerate() {
            tensors.push((format!("{ADAM_M}{i}"), m.clone()));
            tensors.push((format!("{ADAM_V}{i}"), v.clone()));
        }
        (tensors, vec![("adam_step", self.step.to_string())])
    }

    /// Restores what [`Adam::checkpoint_state`] saved, taking its tensors out of `tensors`;
    /// `path` names the checkpoint in errors.
    pub fn restore_checkpoint_state(
        &mut self,
        tensors: &mut std::collections::HashMap<String, Tensor>,
        meta: &std::collections::HashMap<String, String>,
        path: &std::path::Path,
    ) -> crate::error::Result<()> {
        let bad = |msg: String| crate::error::Error::Checkpoint {
            path: path.into(),
            msg,
        };
        for (i, (m, v)) in self.moments.iter_mut().enumerate() {
            *m = tensors
                .remove(&format!("{ADAM_M}{i}"))
                .ok_or_else(|| bad(format!("no Adam first moment for parameter {i}")))?;
            *v = tensors
                .remove(&format!("{ADAM_V}{i}"))
                .ok_or_else(|| bad(format!("no Adam second moment for parameter {i}")))?;
        }
        self.step = meta
            .get("adam_step")
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("no adam_step".into()))?;
        Ok(())
    }
    /// Section 5.3's hyper-parameters; `lr` is usually set each step by [`NoamSchedule`].
    pub fn new(vars: Vec<Var>, lr: f64) -> Result<Self> {
        let moments = vars
            .iter()
            .map(|v| Ok((v.zeros_like()?, v.zeros_like()?)))
            .collect::<Result<_>>()?;
        Ok(Self {
            vars,
            lr,
            beta1: 0.9,
            beta2: 0.98,
            eps: 1e-9,
            step: 0,
            moments,
            flat: None,
        })
    }

    /// One Adam update of every parameter with a gradient in `grads`, every gradient
    /// multiplied by `scale` (the clipping coefficient, see [`crate::clip::clip_coefficient`];
    /// 1 leaves them as they are) without rewriting the gradients; counts the step. A
    /// parameter with gradients from both the autograd and fused ops gets their sum; a
    /// gradient of a parameter this optimizer does not hold is an error.
    ///
    /// Contiguous CPU f32 parameters take three in-place passes (`AdamMoment`,
    /// `AdamApply`) instead of the dozen allocating tensor ops of the textbook form
    /// ([`Self::step_reference`]); every element goes through the very same f32 operations in
    /// the same order, so the two give bit-identical parameters and moments (tested). For the
    /// default translation model (6.0 M parameters) on one thread of an AMD EPYC Zen 4
    /// (2026-11-25, `examples/profile_mt.rs`) the allocating form takes 19.3 ms a step, the
    /// passes 7.5 ms.
    pub fn step(&mut self, grads: &Gradients, scale: f64) -> Result<()> {
        self.step += 1;
        let t = self.step as i32;
        let (c1, c2) = (1.0 - self.beta1.powi(t), 1.0 - self.beta2.powi(t));
        let h = [self.beta1, self.beta2, self.eps, self.lr];
        if self.vars.first().is_some_and(|v| !v.device().is_cpu())
            && (self.step_fused_gpu(grads, scale, h, [c1, c2])?
                || self.step_flat(grads, scale, h, [c1, c2])?)
        {
            return Ok(());
        }
        let (vars, moments) = (&self.vars, &mut self.moments);
        grads.for_each(|p, g| {
            let Some(i) = vars
                .iter()
                .position(|v| v.as_tensor().id() == p.as_tensor().id())
            else {
                candle_core::bail!("adam: a gradient for a parameter it does not hold");
            };
            let (v, (m, s)) = (&vars[i], &mut moments[i]);
            match g {
                GradRef::Fused { view, plus } => {
                    let n = v.elem_count();
                    // The whole gradient as one f32 slice: Adam moves every element, so row
                    // gradients are laid out densely, and the autograd's gradient is added.
                    let owned: Vec<f32>;
                    let dense: &[f32] = match (view, plus) {
                        (GradView::Dense { values, .. }, None) => values,
                        (view, plus) => {
                            owned = crate::grads::dense_sum(view, plus, n)?;
                            &owned
                        }
                    };
                    let fast = [v.as_tensor(), &*m, &*s].iter().all(|x| {
                        x.device().is_cpu() && x.dtype() == DType::F32 && x.is_contiguous()
                    });
                    if !fast || dense.len() != n {
                        candle_core::bail!(
                            "adam: fused ops' gradients need contiguous CPU f32 parameters"
                        );
                    }
                    Self::update_in_place(v, m, s, dense, h, [c1, c2], scale)
                }
                GradRef::Tensor(g) => {
                    let fast = v.device().is_cpu()
                        && [v.as_tensor(), &*m, &*s, g].iter().all(|x| {
                            x.dtype() == DType::F32 && x.is_contiguous() && x.dims() == v.dims()
                        });
                    if fast {
                        let (storage, layout) = g.storage_and_layout();
                        let candle_core::Storage::Cpu(CpuStorage::F32(data)) = &*storage else {
                            candle_core::bail!("adam: expected a CPU f32 gradient");
                        };
                        let (a, b) = layout
                            .contiguous_offsets()
                            .expect("checked contiguous above");
                        Self::update_in_place(v, m, s, &data[a..b], h, [c1, c2], scale)
                    } else {
                        let g = if scale < 1.0 { (g * scale)? } else { g.clone() };
                        Self::update_reference(v, m, s, &g, h, [c1, c2])
                    }
                }
            }
        })
    }

    /// [`Self::step`]'s update off the CPU, where every tensor op is a kernel launch: the
    /// textbook update ([`Self::update_reference`]) once over all parameters laid end to end
    /// (their gradients concatenated, the moments kept flat between steps), instead of a dozen
    /// ops for each of the model's parameters (about 135 of them in the default translation
    /// model: some 2,000 launches a step become about 400, most of them copies). Every element
    /// goes through the same f32 operations as in the per-parameter form, so the two are
    /// bit-identical (tested on the CPU). Returns false, having changed nothing, where it does
    /// not apply: a parameter without a gradient in this step (its moments must then stay as
    /// they are), or parameters of different dtypes.
    fn step_flat(
        &mut self,
        grads: &Gradients,
        scale: f64,
        [beta1, beta2, eps, lr]: [f64; 4],
        [c1, c2]: [f64; 2],
    ) -> Result<bool> {
        let Some(dtype) = self.vars.first().map(|v| v.dtype()) else {
            return Ok(true);
        };
        let mut gs = Vec::with_capacity(self.vars.len());
        for v in &self.vars {
            match grads.get(v)? {
                Some(g) if g.dtype() == dtype && v.dtype() == dtype => gs.push(g.flatten_all()?),
                _ => return Ok(false),
            }
        }
        let g = Tensor::cat(&gs, 0)?;
        let g = if scale < 1.0 { (g * scale)? } else { g };
        let (m, s) = self.flat_moments()?;
        let m = ((&m * beta1)? + (&g * (1.0 - beta1))?)?;
        let s = ((&s * beta2)? + (g.sqr()? * (1.0 - beta2))?)?;
        let denom = ((&s / c2)?.sqrt()? + eps)?;
        let update = (((&m / c1)? / denom)? * lr)?;
        let mut at = 0;
        for v in &self.vars {
            let (n, shape) = (v.elem_count(), v.shape());
            v.set(&(v.as_tensor() - update.narrow(0, at, n)?.reshape(shape)?)?)?;
            at += n;
        }
        self.keep_flat_moments(m, s)?;
        Ok(true)
    }

    /// [`Self::step_flat`] as one kernel on the GPU (`transformer_model::kernels::gpu::adam_step`):
    /// every parameter, its moments (laid end to end, as the flat step keeps them) and its
    /// gradient read and written once, in place, the same f32 operations per element. Returns
    /// false, having changed nothing, where it does not apply (as the flat step, and where the
    /// fused GPU kernels do not take the tensors).
    fn step_fused_gpu(
        &mut self,
        grads: &Gradients,
        scale: f64,
        hyper: [f64; 4],
        corrections: [f64; 2],
    ) -> Result<bool> {
        let params: Vec<&Tensor> = self.vars.iter().map(|v| v.as_tensor()).collect();
        if params.is_empty() || !transformer_model::kernels::gpu::applies(&params) {
            return Ok(false);
        }
        let mut gs = Vec::with_capacity(self.vars.len());
        for v in &self.vars {
            match grads.get(v)? {
                Some(g) if g.dtype() == v.dtype() && g.dims() == v.dims() => gs.push(g),
                _ => return Ok(false),
            }
        }
        let (m, s) = self.flat_moments()?;
        let gs: Vec<&Tensor> = gs.iter().collect();
        let done = transformer_model::kernels::gpu::adam_step(
            &params,
            &gs,
            (&m, &s),
            hyper,
            corrections,
            scale,
        )?;
        if !done {
            return Ok(false);
        }
        // The moments as views of the flat buffers the kernel updated (already so after the
        // first such step).
        let current = self.moments.iter().map(|(a, b)| (a.id(), b.id()));
        let views_current = self
            .flat
            .as_ref()
            .is_some_and(|f| f.m.id() == m.id() && current.eq(f.views.iter().copied()));
        if !views_current {
            self.keep_flat_moments(m, s)?;
        }
        Ok(true)
    }

    /// Keeps the moments laid end to end (`m`, `s`) for the next flat step, and each
    /// parameter's moments as views of them.
    fn keep_flat_moments(&mut self, m: Tensor, s: Tensor) -> Result<()> {
        let mut at = 0;
        for (v, moments) in self.vars.iter().zip(self.moments.iter_mut()) {
            let (n, shape) = (v.elem_count(), v.shape());
            *moments = (
                m.narrow(0, at, n)?.reshape(shape)?,
                s.narrow(0, at, n)?.reshape(shape)?,
            );
            at += n;
        }
        let views = self.moments.iter().map(|(a, b)| (a.id(), b.id())).collect();
        self.flat = Some(FlatMoments { m, s, views });
        Ok(())
    }

    /// The moments end to end: those of the last flat step while `moments` still holds its
    /// views, else concatenated afresh.
    fn flat_moments(&self) -> Result<(Tensor, Tensor)> {
        if let Some(f) = &self.flat {
            let current = self.moments.iter().map(|(a, b)| (a.id(), b.id()));
            if current.eq(f.views.iter().copied()) {
                return Ok((f.m.clone(), f.s.clone()));
            }
        }
        let cat = |pick: fn(&(Tensor, Tensor)) -> &Tensor| -> Result<Tensor> {
            let parts = self
                .moments
                .iter()
                .map(|p| pick(p).flatten_all())
                .collect::<Result<Vec<_>>>()?;
            Tensor::cat(&parts, 0)
        };
        Ok((cat(|p| &p.0)?, cat(|p| &p.1)?))
    }

    /// One parameter's update in three in-place passes from its gradient `g` (contiguous
    /// CPU f32 parameter and moments of `g`'s length), multiplied by `scale` when below 1.
    fn update_in_place(
        v: &Var,
        m: &Tensor,
        s: &Tensor,
        g: &[f32],
        [beta1, beta2, eps, lr]: [f64; 4],
        [c1, c2]: [f64; 2],
        scale: f64,
    ) -> Result<()> {
        let scale = (scale < 1.0).then_some(scale as f32);
        m.inplace_op1(&AdamMoment {
            g,
            decay: beta1 as f32,
            gain: (1.0 - beta1) as f32,
            square: false,
            scale,
        })?;
        s.inplace_op1(&AdamMoment {
            g,
            decay: beta2 as f32,
            gain: (1.0 - beta2) as f32,
            square: true,
            scale,
        })?;
        v.as_tensor().inplace_op3(
            m,
            s,
            &AdamApply {
                inv_c1: (1.0 / c1) as f32,
                inv_c2: (1.0 / c2) as f32,
                eps: eps as f32,
                lr: lr as f32,
            },
        )
    }

    /// The textbook form of [`Self::step`] (scale 1), composed of tensor ops (the plain version the
    /// in-place passes are checked against).
    pub fn step_reference(&mut self, grads: &Gradients) -> Result<()> {
        self.step += 1;
        let t = self.step as i32;
        let (c1, c2) = (1.0 - self.beta1.powi(t), 1.0 - self.beta2.powi(t));
        for (v, (m, s)) in self.vars.iter().zip(self.moments.iter_mut()) {
            let Some(g) = grads.get(v)? else {
                continue;
            };
            Self::update_reference(
                v,
                m,
                s,
                &g,
                [self.beta1, self.beta2, self.eps, self.lr],
                [c1, c2],
            )?;
        }
        Ok(())
    }

    /// One parameter's update from its gradient `g`, composed of tensor ops.
    fn update_reference(
        v: &Var,
        m: &mut Tensor,
        s: &mut Tensor,
        g: &Tensor,
        [beta1, beta2, eps, lr]: [f64; 4],
        [c1, c2]: [f64; 2],
    ) -> Result<()> {
        *m = ((&*m * beta1)? + (g * (1.0 - beta1))?)?;
        *s = ((&*s * beta2)? + (g.sqr()? * (1.0 - beta2))?)?;
        let denom = ((&*s / c2)?.sqrt()? + eps)?;
        let update = ((&*m / c1)? / denom)?;
        v.set(&(v.as_tensor() - (update * lr)?)?)
    }
}

/// Adam's moment update in place: `m = m * decay + g * gain`, or with `square`
/// `v = v * decay + (g * g) * gain`, where `g` is first multiplied by `scale` when given.
/// Each product is written as candle's `affine` computes `x * a` (`x * a + 0`), so the
/// result is bit-identical to the composed form.
struct AdamMoment<'a> {
    g: &'a [f32],
    decay: f32,
    gain: f32,
    square: bool,
    scale: Option<f32>,
}

impl InplaceOp1 for AdamMoment<'_> {
    fn name(&self) -> &'static str {
        "adam-moment"
    }

    fn cpu_fwd(&self, dst: &mut CpuStorage, dl: &Layout) -> Result<()> {
        let d = contiguous_f32(dst, dl, "adam-moment: expected a contiguous f32 moment")?;
        if d.len() != self.g.len() {
            candle_core::bail!("adam-moment: gradient and moment sizes differ");
        }
        let (decay, gain, square, scale) = (self.decay, self.gain, self.square, self.scale);
        crate::par::zip_mut(d, self.g, |d, g| {
            for (x, &g) in d.iter_mut().zip(g) {
                let g = match scale {
                    Some(c) => g * c + 0.0,
                    None => g,
                };
                let g = if square { g * g } else { g };
                *x = (*x * decay + 0.0) + (g * gain + 0.0);
            }
        });
        Ok(())
    }
}

/// Adam's parameter update in place from the updated moments:
/// `p = p - ((m * inv_c1) / (sqrt(v * inv_c2) + eps)) * lr`, in candle's `affine` arithmetic
/// (see [`AdamMoment`]).
struct AdamApply {
    inv_c1: f32,
    inv_c2: f32,
    eps: f32,
    lr: f32,
}

impl InplaceOp3 for AdamApply {
    fn name(&self) -> &'static str {
        "adam-apply"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dl: &Layout,
        m: &CpuStorage,
        ml: &Layout,
        v: &CpuStorage,
        vl: &Layout,
    ) -> Result<()> {
        let (CpuStorage::F32(p), CpuStorage::F32(m), CpuStorage::F32(v)) = (dst, m, v) else {
            candle_core::bail!("adam-apply: expected f32 tensors");
        };
        let (Some((p0, p1)), Some((m0, m1)), Some((v0, v1))) = (
            dl.contiguous_offsets(),
            ml.contiguous_offsets(),
            vl.contiguous_offsets(),
        ) else {
            candle_core::bail!("adam-apply: expected contiguous tensors");
        };
        let (inv_c1, inv_c2, eps, lr) = (self.inv_c1, self.inv_c2, self.eps, self.lr);
        crate::par::zip3_mut(&mut p[p0..p1], &m[m0..m1], &v[v0..v1], |p, m, v| {
            for ((x, &m), &v) in p.iter_mut().zip(m).zip(v) {
                let denom = (v * inv_c2 + 0.0).sqrt() * 1.0 + eps;
                let update = (m * inv_c1 + 0.0) / denom;
                *x -= update * lr + 0.0;
            }
        });
        Ok(())
    }
}

/// The paper's learning rate (section 5.3, equation 3):
/// `lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`.
#[derive(Debug, Clone, Copy)]
pub struct NoamSchedule {
    /// The model width whose inverse square root scales the rate.
    pub d_model: usize,
    /// Steps of linear warm-up; the rate peaks at step `warmup`, then decays as
    /// `step^-0.5`.
    pub warmup: usize,
    /// Multiplies the whole rate (1 in the paper).
    pub factor: f64,
}

impl NoamSchedule {
    /// `step` counts from 1.
    pub fn lr(&self, step: usize) -> f64 {
        let s = step.max(1) as f64;
        self.factor
            * (self.d_model as f64).powf(-0.5)
            * s.powf(-0.5).min(s * (self.warmup as f64).powf(-1.5))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn noam_peaks_at_warmup() {
        let s = NoamSchedule {
            d_model: 512,
            warmup: 4000,
            factor: 1.0,
        };
        assert!(s.lr(4000) > s.lr(3999) && s.lr(4000) > s.lr(4001));
        assert!((s.lr(4000) - 512f64.powf(-0.5) * 4000f64.powf(-0.5)).abs() < 1e-15);
    }

    #[test]
    fn in_place_sgd_matches_the_plain_update() -> Result<()> {
        for dtype in [DType::F32, DType::F64] {
            let x = Var::from_tensor(
                &Tensor::new(&[1.0f64, -2.0, 3.0], &Device::Cpu)?.to_dtype(dtype)?,
            )?;
            let view = x.as_tensor().clone(); // a module's clone sees the update
            let loss = (x.as_tensor().sqr()? * 0.5)?.sum_all()?; // gradient = x
            let mut sgd = Sgd::new(vec![x.clone()], 0.1);
            sgd.step(&Gradients::backward(&loss, sgd.vars())?, 0.5)?;
            let got = view.to_dtype(DType::F64)?.to_vec1::<f64>()?;
            let want = [0.95, -1.9, 2.85];
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() < 1e-6, "{got:?}");
            }
        }
        Ok(())
    }

    #[test]
    fn adam_minimises_a_quadratic() -> Result<()> {
        let x = Var::new(&[3.0f64, -2.0], &Device::Cpu)?;
        let mut opt = Adam::new(vec![x.clone()], 0.1)?;
        for _ in 0..300 {
            let loss = x.as_tensor().sqr()?.sum_all()?;
            opt.step(&Gradients::backward(&loss, std::slice::from_ref(&x))?, 1.0)?;
        }
        let v = x.as_tensor().to_dtype(DType::F64)?.to_vec1::<f64>()?;
        assert!(v.iter().all(|a| a.abs() < 1e-2), "{v:?}");
        Ok(())
    }

    /// The in-place passes give the very bits of the composed form, with and without a
    /// clipping scale, over steps whose gradients change; on a tensor large enough to be
    /// split between threads.
    #[test]
    fn in_place_adam_is_bit_identical_to_the_composed_form() -> Result<()> {
        let dev = Device::Cpu;
        let n = (1 << 18) + 37;
        let init: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0)
            .collect();
        let (a, b) = (
            Var::from_vec(init.clone(), n, &dev)?,
            Var::from_vec(init, n, &dev)?,
        );
        let small = (
            Var::new(&[0.5f32, -1.5, 2.0], &dev)?,
            Var::new(&[0.5f32, -1.5, 2.0], &dev)?,
        );
        let mut fused = Adam::new(vec![a.clone(), small.0.clone()], 1e-3)?;
        let mut plain = Adam::new(vec![b.clone(), small.1.clone()], 1e-3)?;
        for step in 0..4 {
            let loss = |x: &Var, y: &Var| -> Result<Gradients> {
                // Gradients that vary in sign and size from element to element and step to step.
                let w = Tensor::arange(0f32, n as f32, &dev)?
                    .affine(1e-5, step as f64)?
                    .sin()?;
                let l = ((x.as_tensor() * &w)?.sqr()?.sum_all()?
                    + y.as_tensor().powf(3.0)?.sum_all()?)?;
                Gradients::backward(&l, &[x.clone(), y.clone()])
            };
            let (ga, gb) = (loss(&a, &small.0)?, loss(&b, &small.1)?);
            if step % 2 == 0 {
                fused.step(&ga, 1.0)?;
                plain.step_reference(&gb)?;
            } else {
                let scale = 0.37;
                fused.step(&ga, scale)?;
                let mut gb = gb;
                gb.scale(scale)?;
                plain.step_reference(&gb)?;
            }
            for (x, y) in [(&a, &b), (&small.0, &small.1)] {
                let (x, y) = (
                    x.as_tensor().to_vec1::<f32>()?,
                    y.as_tensor().to_vec1::<f32>()?,
                );
                assert!(
                    x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
                    "step {step}"
                );
            }
            for ((m1, v1), (m2, v2)) in fused.moments.iter().zip(&plain.moments) {
                assert_eq!(m1.to_vec1::<f32>()?, m2.to_vec1::<f32>()?);
                assert_eq!(v1.to_vec1::<f32>()?, v2.to_vec1::<f32>()?);
            }
        }
        Ok(())
    }

    /// The flat update (the GPU's) against the per-parameter one, on the CPU: bit-identical
    /// parameters and moments over steps with and without clipping, parameters of several
    /// shapes, and moments replaced between steps (as a checkpoint's restore does) taken up.
    #[test]
    fn flat_adam_is_bit_identical_to_the_per_parameter_form() -> Result<()> {
        let dev = Device::Cpu;
        let make = || -> Result<Vec<Var>> {
            Ok(vec![
                Var::from_tensor(
                    &Tensor::arange(0f32, 12.0, &dev)?
                        .affine(0.3, -1.7)?
                        .reshape((3, 4))?,
                )?,
                Var::new(&[0.5f32, -1.5, 2.0], &dev)?,
                Var::from_tensor(
                    &Tensor::arange(0f32, 8.0, &dev)?
                        .affine(-0.2, 0.9)?
                        .reshape((2, 2, 2))?,
                )?,
            ])
        };
        let (xs, ys) = (make()?, make()?);
        let mut flat = Adam::new(xs.clone(), 1e-2)?;
        let mut plain = Adam::new(ys.clone(), 1e-2)?;
        let loss = |vs: &[Var], step: usize| -> Result<Gradients> {
            let mut l = Tensor::new(0f32, &dev)?;
            for (i, v) in vs.iter().enumerate() {
                let w = v
                    .as_tensor()
                    .ones_like()?
                    .affine(0.1 * (i + step) as f64, 0.3)?;
                l = (l + (v.as_tensor() * w)?.sqr()?.sum_all()?)?;
            }
            Gradients::backward(&l, vs)
        };
        for step in 0..5 {
            let scale = if step % 2 == 1 { 0.37 } else { 1.0 };
            let (gx, gy) = (loss(&xs, step)?, loss(&ys, step)?);
            flat.step += 1;
            let t = flat.step as i32;
            let c = [1.0 - flat.beta1.powi(t), 1.0 - flat.beta2.powi(t)];
            let h = [flat.beta1, flat.beta2, flat.eps, flat.lr];
            assert!(flat.step_flat(&gx, scale, h, c)?);
            plain.step(&gy, scale)?;
            if step == 2 {
                // A restore replaces the moments: the flat copy must not be used again.
                for (m, _) in flat.moments.iter_mut() {
                    *m = m.copy()?;
                }
                for (m, _) in plain.moments.iter_mut() {
                    *m = m.copy()?;
                }
            }
            for (x, y) in xs.iter().zip(&ys) {
                let bits = |v: &Var| -> Result<Vec<u32>> {
                    Ok(v.as_tensor()
                        .flatten_all()?
                        .to_vec1::<f32>()?
                        .iter()
                        .map(|f| f.to_bits())
                        .collect())
                };
                assert_eq!(bits(x)?, bits(y)?, "step {step}");
            }
            for ((m1, v1), (m2, v2)) in flat.moments.iter().zip(&plain.moments) {
                assert_eq!(m1.dims(), m2.dims());
                assert_eq!(
                    m1.flatten_all()?.to_vec1::<f32>()?,
                    m2.flatten_all()?.to_vec1::<f32>()?
                );
                assert_eq!(
                    v1.flatten_all()?.to_vec1::<f32>()?,
                    v2.flatten_all()?.to_vec1::<f32>()?
                );
            }
        }
        // A parameter without a gradient: the flat form declines and changes nothing.
        let a = Var::new(&[1.0f32, 2.0], &dev)?;
        let b = Var::new(&[3.0f32], &dev)?;
        let mut opt = Adam::new(vec![a.clone(), b.clone()], 1e-2)?;
        let g = Gradients::backward(&a.as_tensor().sum_all()?, &[a.clone(), b.clone()])?;
        assert!(!opt.step_flat(&g, 1.0, [0.9, 0.98, 1e-9, 1e-2], [0.1, 0.02])?);
        assert_eq!(a.as_tensor().to_vec1::<f32>()?, [1.0, 2.0]);
        Ok(())
    }
}
