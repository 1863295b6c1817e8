//! Direct gradients: parameters whose gradients fused kernels write straight into buffers
//! kept from step to step, outside candle's `GradStore`.
//!
//! # Why
//! candle's backward pass accumulates every gradient into a fresh `zeros_like` and then into
//! a new sum (`GradStore::or_insert` followed by `add`), and the gradient of `index_select`
//! (the embedding lookup) is a dense zero matrix the size of the vocabulary with the rows
//! added in. For the tutorial LM that means, every step and for each of its two `(V, C)`
//! matrices (23 MB at V 28,782): two or three fresh allocations that fault in page by page,
//! a memset, a copy and an add. `perf` put about 15% of a bf16 step there (memset 7%, the
//! add 6%, copies). The gradient norm and the SGD step then read the dense 23 MB embedding
//! gradient, of which 700 rows are not zero.
//!
//! # How
//! Hand a [`DirectGrads`] to the language model's loss: the fused output layer
//! ([`crate::linear_cross_entropy_direct`]) writes `dW` and `db` once into buffers
//! held here, the embedding (the embedding) records only its rows,
//! one per distinct token, and each encoder layer run as one fused op
//! ([`crate::encoder_layer`]) adds its sixteen parameters' gradients. Those
//! parameters get no entry in the `GradStore`. The training side reads this store and the
//! `GradStore` together as one set of gradients (`transformer_train::grads::Gradients`:
//! the clipping norm, the optimizers, a sum across processes), and [`DirectGrads::clear`]
//! keeps the buffers for the next step. The output
//! layer also hands over `dW`'s sum of squares, taken block by block while in cache, which
//! the clipping norm uses instead of reading `dW` again ([`GradView::Dense`]).
//!
//! Only CPU f32 parameters (candle `Var`s) take this path; for any other the ops return
//! their gradient to the `GradStore` as before. So a caller always reads both (through
//! `transformer_train::grads::Gradients`).
//!
//! # Exactness
//! The embedding's and the output layer's contributions are summed in the order candle's
//! backward pass would sum them, so given the same incoming gradients they are
//! bit-identical to the `GradStore`'s: a row gradient per token is `0 + r1 +
//! r2 + ...` over the token's positions in order (candle's `index_add`), rows arriving on a
//! dense gradient are added into it one position at a time, and a dense gradient arriving on
//! rows is added to their sums. The fused encoder layers sum their weight gradients in
//! another order than the composed ops (per thread, then across threads), so whole training
//! steps agree to rounding (`tests/invariants.rs` compares them).

use candle_core::{Result, Tensor, TensorId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// The gradients of some parameters of one step, outside candle's `GradStore` (see the
/// module docs). Cloning shares the buffers.
#[derive(Debug, Clone, Default)]
pub struct DirectGrads(Arc<Mutex<Vec<Entry>>>);

#[derive(Debug)]
struct Entry {
    /// The parameter (a clone of its `Var`'s tensor: same storage and id).
    param: Tensor,
    grad: Grad,
    /// The sum of squares of a dense `grad`, when the op that wrote it took it on the way
    /// ([`DirectGrads::put_dense_with_sum_sq`]); `None` once anything else is added.
    sum_sq: Option<f64>,
    /// The dense buffer of an earlier step, reused by the next one.
    spare: Vec<f32>,
}

#[derive(Debug, Default)]
enum Grad {
    #[default]
    Empty,
    Dense(Vec<f32>),
    /// Row gradients of a `(rows, dim)` parameter: `ids` distinct, in order of first
    /// appearance; `rows[k * dim..]` belongs to `ids[k]`; `slot` maps an id to its `k`.
    Rows {
        ids: Vec<u32>,
        rows: Vec<f32>,
        slot: HashMap<u32, usize>,
    },
}

impl Entry {
    /// The gradient as the optimizer reads it (`None` without one).
    fn view(&self) -> Option<GradView<'_>> {
        if self.grad.is_none() {
            return None;
        }
        match &self.grad {
            Grad::Empty => None,
            Grad::Dense(g) => Some(GradView::Dense {
                values: g,
                sum_sq: self.sum_sq,
            }),
            Grad::Rows { ids, rows, .. } => Some(GradView::Rows {
                ids,
                rows,
                dim: self.param.dims().last().copied().unwrap_or(1),
            }),
        }
    }
}

impl Grad {
    fn is_none(&self) -> bool {
        match self {
            Grad::Empty => true,
            Grad::Dense(_) => false,
            Grad::Rows { ids, .. } => ids.is_empty(),
        }
    }
}

/// One parameter's gradient as the optimizer reads it.
#[derive(Debug, Clone, Copy)]
pub enum GradView<'a> {
    /// The whole gradient, the parameter's shape, contiguous, and its sum of squares (in
    /// f64) where the op that wrote it took it (for the clipping norm, without another
    /// pass over memory).
    Dense {
        /// The gradient, row-major in the parameter's shape.
        values: &'a [f32],
        /// The sum of squares of `values`, when the writing op computed it.
        sum_sq: Option<f64>,
    },
    /// Only these rows of a `(rows, dim)` parameter are non-zero; `ids` are distinct and
    /// `rows[k * dim..(k + 1) * dim]` is the gradient of row `ids[k]`.
    Rows {
        /// The non-zero rows' indices, distinct.
        ids: &'a [u32],
        /// The rows' gradients, `ids.len() * dim` values, row `k` for `ids[k]`.
        rows: &'a [f32],
        /// The parameter's row width (its second dimension).
        dim: usize,
    },
}

impl DirectGrads {
    /// An empty store: no parameter has a gradient yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Entry>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `t` can take this path: a CPU f32 variable (its gradient would otherwise go
    /// to the `GradStore`).
    pub fn accepts(t: &Tensor) -> bool {
        t.is_variable() && t.device().is_cpu() && t.dtype() == candle_core::DType::F32
    }

    fn entry<'a>(entries: &'a mut Vec<Entry>, param: &Tensor) -> &'a mut Entry {
        let id: TensorId = param.id();
        match entries.iter().position(|e| e.param.id() == id) {
            Some(i) => &mut entries[i],
            None => {
                entries.push(Entry {
                    param: param.clone(),
                    grad: Grad::Empty,
                    sum_sq: None,
                    spare: Vec::new(),
                });
                entries.last_mut().expect("just pushed")
            }
        }
    }

    /// A buffer of `len` values for a dense gradient of `param` that the caller overwrites
    /// entirely and hands back with [`Self::put_dense`]: the previous step's when it has that
    /// length (no allocation, no page faults), else a fresh one.
    pub fn take_buffer(&self, param: &Tensor, len: usize) -> Vec<f32> {
        let mut entries = self.lock();
        let spare = std::mem::take(&mut Self::entry(&mut entries, param).spare);
        if spare.len() == len {
            spare
        } else {
            vec![0.0; len]
        }
    }

    /// Adds a dense gradient of `param` (its shape, contiguous).
    pub fn put_dense(&self, param: &Tensor, g: Vec<f32>) {
        let mut entries = self.lock();
        let e = Self::entry(&mut entries, param);
        e.sum_sq = None;
        e.grad = match std::mem::take(&mut e.grad) {
            Grad::Empty => Grad::Dense(g),
            Grad::Dense(mut sum) => {
                sum.iter_mut().zip(&g).for_each(|(s, x)| *s += x);
                e.spare = g;
                Grad::Dense(sum)
            }
            Grad::Rows { ids, rows, .. } => {
                // candle adds this gradient to the row sums (one addition per element, so
                // the order of its operands does not change the result).
                let mut sum = g;
                let dim = rows.len() / ids.len().max(1);
                for (&id, r) in ids.iter().zip(rows.chunks_exact(dim.max(1))) {
                    let dst = &mut sum[id as usize * dim..(id as usize + 1) * dim];
                    dst.iter_mut().zip(r).for_each(|(d, x)| *d += x);
                }
                Grad::Dense(sum)
            }
        };
    }

    /// [`Self::put_dense`] of a gradient whose sum of squares `sum_sq` the caller took on
    /// the way; it is kept for [`Self::for_each`] if this is `param`'s only gradient.
    pub fn put_dense_with_sum_sq(&self, param: &Tensor, g: Vec<f32>, sum_sq: f64) {
        let only = {
            let mut entries = self.lock();
            Self::entry(&mut entries, param).grad.is_none()
        };
        self.put_dense(param, g);
        if only {
            Self::entry(&mut self.lock(), param).sum_sq = Some(sum_sq);
        }
    }

    /// Adds the gradient of a row lookup into `param` `(rows, dim)`: position `i` read row
    /// `ids[i]` and receives `grads[i * dim..(i + 1) * dim]`.
    pub fn add_rows(&self, param: &Tensor, ids: &[u32], grads: &[f32], dim: usize) {
        debug_assert_eq!(grads.len(), ids.len() * dim);
        let mut entries = self.lock();
        let e = Self::entry(&mut entries, param);
        e.sum_sq = None;
        match &mut e.grad {
            Grad::Dense(sum) => {
                // candle's index_add: one position at a time, in order.
                for (&id, r) in ids.iter().zip(grads.chunks_exact(dim)) {
                    let dst = &mut sum[id as usize * dim..(id as usize + 1) * dim];
                    dst.iter_mut().zip(r).for_each(|(d, x)| *d += x);
                }
            }
            g => {
                if matches!(g, Grad::Empty) {
                    *g = Grad::Rows {
                        ids: Vec::new(),
                        rows: Vec::new(),
                        slot: HashMap::new(),
                    };
                }
                let Grad::Rows {
                    ids: have,
                    rows,
                    slot,
                } = g
                else {
                    unreachable!("set just above")
                };
                for (&id, r) in ids.iter().zip(grads.chunks_exact(dim)) {
                    let k = *slot.entry(id).or_insert_with(|| {
                        have.push(id);
                        rows.resize(rows.len() + dim, 0.0);
                        have.len() - 1
                    });
                    let dst = &mut rows[k * dim..(k + 1) * dim];
                    dst.iter_mut().zip(r).for_each(|(d, x)| *d += x);
                }
            }
        }
    }

    /// Calls `f` with each parameter that has a gradient here and that gradient, in the order
    /// the parameters first received one.
    pub fn for_each(&self, mut f: impl FnMut(&Tensor, GradView<'_>) -> Result<()>) -> Result<()> {
        let entries = self.lock();
        for e in entries.iter() {
            if let Some(view) = e.view() {
                f(&e.param, view)?;
            }
        }
        Ok(())
    }

    /// Calls `f` with the gradient of `param` held here, if it has one, and returns what
    /// `f` returns (`None` without a gradient).
    pub fn with_grad<R>(
        &self,
        param: &Tensor,
        f: impl FnOnce(GradView<'_>) -> Result<R>,
    ) -> Result<Option<R>> {
        let entries = self.lock();
        let Some(e) = entries.iter().find(|e| e.param.id() == param.id()) else {
            return Ok(None);
        };
        e.view().map(f).transpose()
    }

    /// Calls `f` with the gradient of `param` as one mutable dense slice in its shape, if it
    /// has one here, and returns what `f` returns (`None` without a gradient). Row gradients
    /// are first laid out densely (the other rows zero); what `f` writes is the gradient
    /// from then on.
    pub fn with_dense_mut<R>(
        &self,
        param: &Tensor,
        f: impl FnOnce(&mut [f32]) -> Result<R>,
    ) -> Result<Option<R>> {
        let mut entries = self.lock();
        let Some(e) = entries.iter_mut().find(|e| e.param.id() == param.id()) else {
            return Ok(None);
        };
        if e.grad.is_none() {
            return Ok(None);
        }
        e.sum_sq = None;
        if let Grad::Rows { ids, rows, .. } = &e.grad {
            let dim = e.param.dims().last().copied().unwrap_or(1);
            let mut dense = std::mem::take(&mut e.spare);
            dense.clear();
            dense.resize(e.param.elem_count(), 0.0);
            for (&id, r) in ids.iter().zip(rows.chunks_exact(dim)) {
                dense[id as usize * dim..(id as usize + 1) * dim].copy_from_slice(r);
            }
            e.grad = Grad::Dense(dense);
        }
        let Grad::Dense(g) = &mut e.grad else {
            unreachable!("a gradient held here is dense or rows, made dense just above")
        };
        f(g).map(Some)
    }

    /// Multiplies every gradient held here by `factor`, as candle's `affine` computes it
    /// (`x * factor + 0` in f32), dense or rows.
    pub fn scale(&self, factor: f64) {
        let c = factor as f32;
        for e in self.lock().iter_mut() {
            let values = match &mut e.grad {
                Grad::Empty => continue,
                Grad::Dense(g) => g,
                Grad::Rows { rows, .. } => rows,
            };
            values.iter_mut().for_each(|x| *x = *x * c + 0.0);
            e.sum_sq = None;
        }
    }

    /// The gradient of `param` as a dense tensor of its shape, if it has one here (for tests
    /// and inspection; the optimizer reads [`Self::for_each`]).
    pub fn get(&self, param: &Tensor) -> Result<Option<Tensor>> {
        let entries = self.lock();
        let Some(e) = entries.iter().find(|e| e.param.id() == param.id()) else {
            return Ok(None);
        };
        if e.grad.is_none() {
            return Ok(None);
        }
        let dense = match &e.grad {
            Grad::Empty => return Ok(None),
            Grad::Dense(g) => g.clone(),
            Grad::Rows { ids, rows, .. } => {
                let dim = param.dims().last().copied().unwrap_or(1);
                let mut g = vec![0f32; param.elem_count()];
                for (&id, r) in ids.iter().zip(rows.chunks_exact(dim)) {
                    g[id as usize * dim..(id as usize + 1) * dim].copy_from_slice(r);
                }
                g
            }
        };
        Tensor::from_vec(dense, param.shape(), param.device()).map(Some)
    }

    /// Whether no gradient is held.
    pub fn is_empty(&self) -> bool {
        self.lock().iter().all(|e| e.grad.is_none())
    }

    /// Forgets this step's gradients, keeping the dense buffers for the next step.
    pub fn clear(&self) {
        for e in self.lock().iter_mut() {
            e.sum_sq = None;
            match std::mem::take(&mut e.grad) {
                Grad::Dense(g) => e.spare = g,
                Grad::Rows {
                    mut ids,
                    mut rows,
                    mut slot,
                } => {
                    ids.clear();
                    rows.clear();
                    slot.clear();
                    // Kept for its capacity; empty rows are no gradient.
                    e.grad = Grad::Rows { ids, rows, slot };
                }
                Grad::Empty => {}
            }
        }
    }
}
