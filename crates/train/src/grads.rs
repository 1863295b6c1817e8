//! One backward pass's gradients, whatever produced them: [`Gradients`].
//!
//! A training step's parameter gradients come from two places: candle's autograd (a
//! `GradStore`, for every op built from candle's tensor ops) and the fused CPU kernels,
//! which write theirs into a [`DirectGrads`] outside the graph (`transformer_model::grads`:
//! the embedding's rows, the output layer's `dW` and `db`, the fused encoder and decoder
//! layers). [`Gradients`] holds both for a list of trainable variables, and everything after
//! the backward pass reads it through one API: the gradient of a variable
//! ([`Gradients::get`]), the global norm ([`Gradients::norm`], for clipping), scaling
//! ([`Gradients::scale`]), a visit of every gradient where it lies ([`Gradients::for_each`],
//! what the optimizers read) and a visit of every gradient as one mutable dense `f32` slice
//! in the variables' order ([`Gradients::for_each_mut`], what a sum across processes needs).
//!
//! A training step reads: loss, [`Gradients::from_backward`], [`crate::clip::clip_coefficient`],
//! [`crate::Adam::step`] or [`crate::Sgd::step`]:
//!
//! ```
//! # fn main() -> candle_core::Result<()> {
//! use candle_core::{Device, Var};
//! use transformer_model::DirectGrads;
//! use transformer_train::{clip::clip_coefficient, grads::Gradients, Sgd};
//!
//! let w = Var::new(&[3.0f32, -4.0], &Device::Cpu)?;
//! let mut sgd = Sgd::new(vec![w.clone()], 0.1);
//! // Fused ops would write into `direct` during the forward pass's backward.
//! let direct = DirectGrads::new();
//! let loss = (w.as_tensor().sqr()? * 0.5)?.sum_all()?; // gradient = w, norm 5
//! let grads = Gradients::from_backward(&loss, sgd.vars(), &direct)?;
//! let (norm, coef) = clip_coefficient(&grads, 1.0)?;
//! assert!((norm - 5.0).abs() < 1e-6);
//! sgd.step(&grads, coef)?; // w -= 0.1 * w / 5
//! let w = w.as_tensor().to_vec1::<f32>()?;
//! assert!((w[0] - 2.94).abs() < 1e-6 && (w[1] + 3.92).abs() < 1e-6, "{w:?}");
//! # Ok(())
//! # }
//! ```
//!
//! Dropping the `Gradients` empties the `DirectGrads` it read (keeping its buffers), ready
//! for the next step's backward pass.

use candle_core::{backprop::GradStore, DType, Result, Storage, Tensor, Var};
use transformer_model::grads::{DirectGrads, GradView};

/// The parameter gradients of one backward pass: candle's `GradStore` and the fused
/// kernels' [`DirectGrads`] together, for a fixed list of trainable variables (see the
/// module docs).
pub struct Gradients {
    vars: Vec<Var>,
    store: GradStore,
    direct: DirectGrads,
}

/// One variable's gradient where it lies, as [`Gradients::for_each`] hands it over.
#[derive(Debug, Clone, Copy)]
pub enum GradRef<'a> {
    /// A tensor of candle's autograd, in the variable's shape.
    Tensor(&'a Tensor),
    /// Written by fused kernels (`transformer_model::grads`); `plus` is a gradient the
    /// autograd also produced for the same variable (a weight shared between a fused op and
    /// a composed one): the variable's gradient is the sum of the two.
    Fused {
        /// The fused kernels' gradient.
        view: GradView<'a>,
        /// The autograd's gradient of the same variable, if any.
        plus: Option<&'a Tensor>,
    },
}

impl std::fmt::Debug for Gradients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gradients")
            .field("vars", &self.vars.len())
            .field("direct", &self.direct)
            .finish_non_exhaustive()
    }
}

impl Gradients {
    /// The gradients of `loss` with respect to `vars` (all the parameters being trained):
    /// `loss.backward()` for the ops of candle's graph, and what the fused ops of `loss`'s
    /// forward pass wrote into `direct`. `direct` is emptied (its buffers kept) when the
    /// returned value is dropped. A gradient in `direct` for a variable not in `vars` is an
    /// error: pass every trainable variable of the model.
    pub fn from_backward(loss: &Tensor, vars: &[Var], direct: &DirectGrads) -> Result<Self> {
        let store = loss.backward()?;
        Self::from_parts(store, vars, direct)
    }

    /// The gradients of `loss` with respect to `vars` from candle's autograd alone (a model
    /// without fused training ops).
    pub fn backward(loss: &Tensor, vars: &[Var]) -> Result<Self> {
        Self::from_parts(loss.backward()?, vars, &DirectGrads::new())
    }

    /// Gradients already computed: a `GradStore` and the fused ops' `direct`, read for
    /// `vars`. `direct` is emptied when the returned value is dropped.
    pub fn from_parts(store: GradStore, vars: &[Var], direct: &DirectGrads) -> Result<Self> {
        let mut stray = false;
        direct.for_each(|p, _| {
            stray |= !vars.iter().any(|v| v.as_tensor().id() == p.id());
            Ok(())
        })?;
        if stray {
            direct.clear();
            candle_core::bail!(
                "gradients: a fused op wrote the gradient of a parameter missing from the \
                 trainable variables; pass all the model's variables (`Params::vars`)"
            );
        }
        Ok(Self {
            vars: vars.to_vec(),
            store,
            direct: direct.clone(),
        })
    }

    /// The trainable variables, in the order every visit follows.
    pub fn vars(&self) -> &[Var] {
        &self.vars
    }

    /// The gradient of `var` as a tensor of its shape (the sum of the autograd's and the
    /// fused ops' where it has both), or `None` when `var` has none.
    pub fn get(&self, var: &Var) -> Result<Option<Tensor>> {
        let store = self.store.get(var.as_tensor());
        match (self.direct.get(var.as_tensor())?, store) {
            (Some(d), Some(s)) => Ok(Some((s.to_dtype(d.dtype())? + d)?)),
            (Some(d), None) => Ok(Some(d)),
            (None, s) => Ok(s.cloned()),
        }
    }

    /// The sum of the squares of all gradients, in f64: the autograd's in the variables'
    /// order, then the fused ops' in the order they were written (a variable with both
    /// there, their sum). Contiguous CPU f32/f64 gradients are read in place (one pass, no
    /// temporaries); a dense fused gradient whose sum of squares its op took on the way is
    /// not read again; row gradients are read as the rows they are. Gradients off the CPU are
    /// summed there, in the same order, and read back once (a read per gradient would make
    /// the GPU wait for the host about 135 times a step); where they are all f32 (or all f64)
    /// on a GPU with the fused kernels, by one kernel over all of them.
    pub fn sum_sq(&self) -> Result<f64> {
        // Every gradient in the autograd's store and on the GPU: one kernel over all of them
        // (`transformer_model::kernels::gpu::sum_of_squares`).
        if self.direct.is_empty() {
            let gs: Vec<&Tensor> = self
                .vars
                .iter()
                .filter_map(|v| self.store.get(v.as_tensor()))
                .collect();
            if let Some(s) = transformer_model::kernels::gpu::sum_of_squares(&gs)? {
                return s.to_scalar::<f64>();
            }
        }
        let mut sq = 0f64;
        let mut on_device: Option<Tensor> = None;
        for v in &self.vars {
            if let Some(g) = self.store.get(v.as_tensor()) {
                if self.direct.with_grad(v.as_tensor(), |_| Ok(()))?.is_none() {
                    if g.device().is_cpu() {
                        sq += sum_of_squares(g)?;
                    } else {
                        let s = g.to_dtype(DType::F64)?.sqr()?.sum_all()?;
                        on_device = Some(match on_device {
                            Some(acc) => (acc + s)?,
                            None => s,
                        });
                    }
                }
            }
        }
        if let Some(s) = on_device {
            sq += s.to_scalar::<f64>()?;
        }
        self.direct.for_each(|p, g| {
            sq += match (g, self.store.get(p)) {
                (g, Some(plus)) => {
                    let sum = dense_sum(g, Some(plus), p.elem_count())?;
                    crate::par::map(&sum, crate::par::sum_sq_f32).iter().sum()
                }
                (
                    GradView::Dense {
                        sum_sq: Some(sq), ..
                    },
                    None,
                ) => sq,
                (GradView::Dense { values, .. }, None) => {
                    crate::par::map(values, crate::par::sum_sq_f32).iter().sum()
                }
                (GradView::Rows { rows, .. }, None) => crate::par::sum_sq_f32(rows),
            };
            Ok(())
        })?;
        Ok(sq)
    }

    /// The L2 norm of all gradients together ([`Self::sum_sq`]'s square root).
    pub fn norm(&self) -> Result<f64> {
        Ok(self.sum_sq()?.sqrt())
    }

    /// Multiplies every gradient by `factor` (`g * factor` in the gradient's dtype).
    pub fn scale(&mut self, factor: f64) -> Result<()> {
        for v in &self.vars {
            if let Some(g) = self.store.remove(v.as_tensor()) {
                self.store.insert(v.as_tensor(), (g * factor)?);
            }
        }
        self.direct.scale(factor);
        Ok(())
    }

    /// Calls `f` with each variable that has a gradient, in the order of [`Self::vars`], and
    /// its gradient where it lies (no copy). A variable with no gradient is skipped. `f`
    /// runs while the fused ops' store is locked: it must not read these `Gradients` again.
    pub fn for_each(&self, mut f: impl FnMut(&Var, GradRef<'_>) -> Result<()>) -> Result<()> {
        for v in &self.vars {
            let plus = self.store.get(v.as_tensor());
            let fused = self
                .direct
                .with_grad(v.as_tensor(), |view| f(v, GradRef::Fused { view, plus }))?;
            match (fused, plus) {
                (Some(()), _) | (None, None) => {}
                (None, Some(g)) => f(v, GradRef::Tensor(g))?,
            }
        }
        Ok(())
    }

    /// Calls `f` with each variable that has a gradient, in the order of [`Self::vars`], and
    /// its whole gradient as one mutable dense `f32` slice in the variable's shape; what `f`
    /// leaves there is the gradient from then on (every later read sees it). This is the
    /// one place to sum gradients across processes: visit, add the others' values, done.
    /// Row gradients are laid out densely first, and a variable with gradients from both
    /// the autograd and fused ops gets their sum. Gradients that are not f32 are an error
    /// (convert the model to f32 to train it across processes).
    pub fn for_each_mut(
        &mut self,
        mut f: impl FnMut(&Var, &mut [f32]) -> Result<()>,
    ) -> Result<()> {
        for v in &self.vars {
            let t = v.as_tensor();
            let plus = self.store.remove(t);
            let fused = self.direct.with_dense_mut(t, |g| {
                if let Some(s) = &plus {
                    let s = f32_values(s, v)?;
                    g.iter_mut().zip(&s).for_each(|(x, s)| *x += s);
                }
                f(v, g)
            })?;
            match (fused, plus) {
                (Some(()), _) | (None, None) => {}
                (None, Some(g)) => {
                    let mut values = f32_values(&g, v)?;
                    f(v, &mut values)?;
                    let g = Tensor::from_vec(values, g.shape(), g.device())?;
                    self.store.insert(t, g);
                }
            }
        }
        Ok(())
    }
}

impl Drop for Gradients {
    fn drop(&mut self) {
        self.direct.clear();
    }
}

/// A fused gradient `view` of `n` values laid out densely, plus the autograd's `plus` of the
/// same variable: `plus`'s values (zeros without it), then each of `view`'s added.
pub(crate) fn dense_sum(view: GradView<'_>, plus: Option<&Tensor>, n: usize) -> Result<Vec<f32>> {
    let mut owned = match plus {
        Some(g) => g.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?,
        None => vec![0.0; n],
    };
    match view {
        GradView::Dense { values, .. } => {
            if values.len() != owned.len() {
                candle_core::bail!("gradients: a fused gradient and the variable differ in size");
            }
            owned.iter_mut().zip(values).for_each(|(o, x)| *o += x)
        }
        GradView::Rows { ids, rows, dim } => {
            for (&id, r) in ids.iter().zip(rows.chunks_exact(dim)) {
                let Some(dst) = owned.get_mut(id as usize * dim..(id as usize + 1) * dim) else {
                    candle_core::bail!("gradients: row {id} outside the variable");
                };
                dst.iter_mut().zip(r).for_each(|(o, x)| *o += x);
            }
        }
    }
    Ok(owned)
}

/// `g`'s values (the gradient of `v`) as a dense f32 vector; other dtypes are an error.
fn f32_values(g: &Tensor, v: &Var) -> Result<Vec<f32>> {
    if g.dtype() != DType::F32 {
        candle_core::bail!(
            "gradients: a {:?} gradient of a {:?} parameter; only f32 gradients can be \
             visited as slices (train in f32)",
            g.dtype(),
            v.dims()
        );
    }
    g.flatten_all()?.to_vec1::<f32>()
}

fn sum_of_squares(g: &Tensor) -> Result<f64> {
    if g.device().is_cpu() && g.is_contiguous() {
        let (storage, layout) = g.storage_and_layout();
        if let (Storage::Cpu(s), Some((a, b))) = (&*storage, layout.contiguous_offsets()) {
            match g.dtype() {
                DType::F32 => {
                    let x = &s.as_slice::<f32>()?[a..b];
                    return Ok(crate::par::map(x, crate::par::sum_sq_f32).iter().sum());
                }
                DType::F64 => {
                    let x = &s.as_slice::<f64>()?[a..b];
                    return Ok(crate::par::map(x, crate::par::sum_sq_f64).iter().sum());
                }
                _ => {}
            }
        }
    }
    g.to_dtype(DType::F64)?.sqr()?.sum_all()?.to_scalar::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Adam, Sgd};
    use candle_core::Device;
    use transformer_model::{Embedding, Init, ParamBuilder};

    /// A model of two parameters, an embedding table `E` (7, 4) and a vector `w` (3,), and
    /// its loss for `ids`: `sum(lookup(E, ids) * c) + sum(w^2) + tie * sum(E^2)`. With
    /// `direct` the lookup records its rows there; else everything is candle's graph.
    struct Toy {
        emb: Embedding,
        vars: Vec<Var>,
    }

    impl Toy {
        fn new() -> Result<Self> {
            let pb = ParamBuilder::new(DType::F32, &Device::Cpu, 5);
            let emb = Embedding::new(&pb, 7, 4, Init::Uniform(1.0))
                .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
            pb.var("w", 3, Init::Uniform(1.0))
                .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
            Ok(Self {
                emb,
                vars: pb.params().vars(),
            })
        }

        fn loss(&self, ids: &[u32], tie: f64, direct: Option<&DirectGrads>) -> Result<Tensor> {
            let dev = Device::Cpu;
            let idt = Tensor::new(ids, &dev)?;
            let backprop = match direct {
                Some(d) => transformer_model::Backprop::Direct(d),
                None => transformer_model::Backprop::Graph,
            };
            let h = self
                .emb
                .forward_as(&idt, backprop)
                .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
            let c = Tensor::arange(0f32, (ids.len() * 4) as f32, &dev)?
                .reshape((ids.len(), 4))?
                .affine(0.37, -1.1)?
                .sin()?;
            let (e, w) = (self.vars[0].as_tensor(), self.vars[1].as_tensor());
            let mut loss = ((h * c)?.sum_all()? + w.sqr()?.sum_all()?)?;
            if tie != 0.0 {
                loss = (loss + (e.sqr()?.sum_all()? * tie)?)?;
            }
            Ok(loss)
        }
    }

    fn bits(t: &Tensor) -> Result<Vec<u32>> {
        Ok(t.flatten_all()?
            .to_vec1::<f32>()?
            .iter()
            .map(|x| x.to_bits())
            .collect())
    }

    /// Gradients from a fused lookup (rows in `DirectGrads`) and from candle's graph alone
    /// read the same through every accessor, and move Adam and SGD to the same bits: with
    /// repeated ids (row sums), and with the table also used by a composed op (a gradient in
    /// both stores; ids distinct, so each element is one sum of two values either way).
    #[test]
    fn fused_and_graph_gradients_read_the_same() -> Result<()> {
        for (ids, tie) in [(&[3u32, 1, 3, 6, 3][..], 0.0), (&[5, 0, 2][..], 0.25)] {
            let (fused, plain) = (Toy::new()?, Toy::new()?);
            let direct = DirectGrads::new();
            let gf = Gradients::from_backward(
                &fused.loss(ids, tie, Some(&direct))?,
                &fused.vars,
                &direct,
            )?;
            let gp = Gradients::backward(&plain.loss(ids, tie, None)?, &plain.vars)?;
            assert!(!direct.is_empty(), "the lookup wrote its rows");
            let mut kinds = Vec::new();
            gf.for_each(|v, g| {
                kinds.push((v.dims().to_vec(), matches!(g, GradRef::Fused { .. })));
                if let GradRef::Fused { view, plus } = g {
                    assert!(matches!(view, GradView::Rows { dim: 4, .. }));
                    assert_eq!(plus.is_some(), tie != 0.0);
                }
                Ok(())
            })?;
            assert_eq!(kinds, [(vec![7, 4], true), (vec![3], false)]);
            for (a, b) in fused.vars.iter().zip(&plain.vars) {
                let (a, b) = (gf.get(a)?.unwrap(), gp.get(b)?.unwrap());
                assert_eq!(bits(&a)?, bits(&b)?);
            }
            assert_eq!(gf.sum_sq()?.to_bits(), gp.sum_sq()?.to_bits());

            let mut adam = [
                Adam::new(fused.vars.clone(), 0.01)?,
                Adam::new(plain.vars.clone(), 0.01)?,
            ];
            adam[0].step(&gf, 0.3)?;
            adam[1].step(&gp, 0.3)?;
            let mut sgd = [
                Sgd::new(fused.vars.clone(), 0.1),
                Sgd::new(plain.vars.clone(), 0.1),
            ];
            sgd[0].step(&gf, 0.7)?;
            sgd[1].step(&gp, 0.7)?;
            for (a, b) in fused.vars.iter().zip(&plain.vars) {
                assert_eq!(bits(a.as_tensor())?, bits(b.as_tensor())?);
            }
            drop(gf);
            assert!(
                direct.is_empty(),
                "dropping the gradients empties DirectGrads"
            );
        }
        Ok(())
    }

    /// `for_each_mut` hands every variable's whole gradient once, in the variables' order,
    /// as a dense slice (rows laid out, both stores summed); what it writes is what every
    /// later read sees.
    #[test]
    fn for_each_mut_visits_each_whole_gradient_once_in_order() -> Result<()> {
        // Repeated ids (row sums), then a table also used by a composed op (ids distinct:
        // each element is one sum of two values, whichever way it is taken).
        for (ids, tie) in [([3u32, 1, 3], 0.0), ([3, 1, 5], 0.5)] {
            visit_each_once(&ids, tie)?;
        }
        Ok(())
    }

    fn visit_each_once(ids: &[u32], tie: f64) -> Result<()> {
        let toy = Toy::new()?;
        let want: Vec<Vec<f32>> = {
            let g = Gradients::backward(&toy.loss(ids, tie, None)?, &toy.vars)?;
            toy.vars
                .iter()
                .map(|v| g.get(v)?.unwrap().flatten_all()?.to_vec1::<f32>())
                .collect::<Result<_>>()?
        };
        let direct = DirectGrads::new();
        let loss = toy.loss(ids, tie, Some(&direct))?;
        let mut g = Gradients::from_backward(&loss, &toy.vars, &direct)?;
        let mut seen = Vec::new();
        g.for_each_mut(|v, values| {
            let i = toy
                .vars
                .iter()
                .position(|x| x.as_tensor().id() == v.as_tensor().id());
            let i = i.expect("a trainable variable");
            assert_eq!(values, &want[i][..], "variable {i}");
            seen.push(i);
            values.iter_mut().for_each(|x| *x *= 2.0);
            Ok(())
        })?;
        assert_eq!(seen, [0, 1]);
        for (v, w) in toy.vars.iter().zip(&want) {
            let got = g.get(v)?.unwrap().flatten_all()?.to_vec1::<f32>()?;
            assert_eq!(got, w.iter().map(|x| x * 2.0).collect::<Vec<_>>());
        }
        let sq: f64 = want
            .iter()
            .flatten()
            .map(|&x| (2.0 * x as f64).powi(2))
            .sum();
        assert!(
            (g.sum_sq()? - sq).abs() <= 1e-9 * sq,
            "{} vs {sq}",
            g.sum_sq()?
        );
        Ok(())
    }

    /// A fused op's gradient of a parameter missing from the variables is refused (the
    /// optimizers would otherwise skip it silently), and leaves `DirectGrads` empty.
    #[test]
    fn a_fused_gradient_outside_the_variables_is_an_error() -> Result<()> {
        let toy = Toy::new()?;
        let direct = DirectGrads::new();
        let loss = toy.loss(&[1, 2], 0.0, Some(&direct))?;
        let err = Gradients::from_backward(&loss, &toy.vars[1..], &direct).unwrap_err();
        assert!(
            err.to_string().contains("pass all the model's variables"),
            "{err}"
        );
        assert!(direct.is_empty());
        Ok(())
    }

    /// Scaling multiplies both stores' gradients, rows included, as `g * factor` does.
    #[test]
    fn scale_multiplies_every_gradient() -> Result<()> {
        let toy = Toy::new()?;
        let direct = DirectGrads::new();
        let loss = toy.loss(&[4, 4, 0], 0.0, Some(&direct))?;
        let mut g = Gradients::from_backward(&loss, &toy.vars, &direct)?;
        let before: Vec<Tensor> = toy
            .vars
            .iter()
            .map(|v| Ok(g.get(v)?.unwrap()))
            .collect::<Result<_>>()?;
        g.scale(0.3)?;
        for (v, b) in toy.vars.iter().zip(&before) {
            assert_eq!(bits(&g.get(v)?.unwrap())?, bits(&(b * 0.3)?)?);
        }
        Ok(())
    }
}
