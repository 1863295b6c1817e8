//! Named parameters: creation with PyTorch's initialisations, lookup, saving and loading.
//!
//! Modules hold clones of the parameters' tensors; the [`Params`] registry holds the
//! [`Var`]s, in creation order, under their full dotted names. Updating a `Var` in place
//! (optimizer steps, loading weights) is seen by the modules, since clones share storage.

use crate::ops::{DecodePrecision, Precision};
use crate::restrict::CandidateVocab;
use crate::rng::Rng;
use crate::Result;
use candle_core::{DType, Device, Shape, Tensor, Var};
use std::any::Any;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;

/// How a new parameter is filled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
    /// U(-a, a).
    Uniform(f64),
    /// Glorot & Bengio (2010): U(-b, b), b = sqrt(6 / (fan_in + fan_out)).
    XavierUniform {
        /// Input units (the number of columns of a `(out, in)` weight).
        fan_in: usize,
        /// Output units (the number of rows of a `(out, in)` weight).
        fan_out: usize,
    },
}

impl Init {
    /// `n` values drawn (where random) from `rng`.
    fn values(self, rng: &Rng, n: usize) -> Vec<f64> {
        match self {
            Init::Zeros => vec![0.0; n],
            Init::Ones => vec![1.0; n],
            Init::Uniform(a) => uniform(rng, n, a),
            Init::XavierUniform { fan_in, fan_out } => {
                uniform(rng, n, (6.0 / (fan_in + fan_out) as f64).sqrt())
            }
        }
    }

    /// PyTorch's `nn.Linear` default for weight and bias: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    /// (kaiming_uniform with a = sqrt(5) reduces to this bound).
    pub fn torch_linear(fan_in: usize) -> Self {
        Init::Uniform(1.0 / (fan_in as f64).sqrt())
    }
}

/// An ordered registry of named trainable parameters.
#[derive(Debug, Clone, Default)]
pub struct Params {
    vars: Vec<(String, Var)>,
    index: HashMap<String, usize>,
}

impl Params {
    /// Parameters in creation order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Var)> {
        self.vars.iter().map(|(n, v)| (n.as_str(), v))
    }

    /// The parameters' full dotted names, in creation order.
    pub fn names(&self) -> Vec<&str> {
        self.vars.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// The parameter with this full dotted name.
    pub fn get(&self, name: &str) -> Option<&Var> {
        self.index.get(name).map(|&i| &self.vars[i].1)
    }

    /// The number of parameters (tensors, not scalars; see [`Params::num_elements`]).
    pub fn len(&self) -> usize {
        self.vars.len()
    }

    /// True when no parameter has been created.
    pub fn is_empty(&self) -> bool {
        self.vars.is_empty()
    }

    /// Total number of scalar parameters.
    pub fn num_elements(&self) -> usize {
        self.vars.iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// The `Var`s, for an optimizer.
    pub fn vars(&self) -> Vec<Var> {
        self.vars.iter().map(|(_, v)| v.clone()).collect()
    }

    fn insert(&mut self, name: String, var: Var) -> Result<()> {
        if self.index.contains_key(&name) {
            candle_core::bail!("parameter {name} created twice");
        }
        self.index.insert(name.clone(), self.vars.len());
        self.vars.push((name, var));
        Ok(())
    }

    /// Copies `tensors` into the parameters of the same names. Every parameter must be
    /// present with the same shape; extra tensors are an error too, so a checkpoint from a
    /// different model is caught rather than half-loaded.
    pub fn assign(&self, tensors: &HashMap<String, Tensor>) -> Result<()> {
        self.assign_rest(tensors, &HashSet::new())
    }

    /// [`Params::assign`] for parameters created from their loaded values
    /// ([`ParamBuilder::with_values`]): those named in `loaded` are taken as assigned, the
    /// others from `tensors` (what the builder did not take), with the same checks and
    /// errors in the same order as [`Params::assign`] of the whole file.
    pub fn assign_rest(
        &self,
        tensors: &HashMap<String, Tensor>,
        loaded: &HashSet<String>,
    ) -> Result<()> {
        for (name, var) in &self.vars {
            if loaded.contains(name) {
                continue;
            }
            let t = tensors.get(name).ok_or_else(|| {
                candle_core::Error::Msg(format!(
                    "weights have no tensor {name:?} (this model needs {} parameters)",
                    self.vars.len()
                ))
            })?;
            if t.dims() != var.dims() {
                candle_core::bail!(
                    "tensor {name:?} has shape {:?} but the model expects {:?}: the weights are \
                     from a model of another size",
                    t.dims(),
                    var.dims()
                );
            }
            var.set(&t.to_dtype(var.dtype())?.to_device(var.device())?)?;
        }
        if let Some(extra) = tensors.keys().find(|k| !self.index.contains_key(*k)) {
            candle_core::bail!("weights have a tensor {extra:?} that this model does not use");
        }
        Ok(())
    }

    /// Saves every parameter to a safetensors file under its name.
    pub fn save_safetensors(&self, path: impl AsRef<Path>) -> Result<()> {
        let map: HashMap<String, Tensor> = self
            .vars
            .iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
            .collect();
        candle_core::safetensors::save(&map, path)
    }

    /// Loads a file written by [`Params::save_safetensors`].
    pub fn load_safetensors(&self, path: impl AsRef<Path>) -> Result<()> {
        let device = self
            .vars
            .first()
            .map(|(_, v)| v.device().clone())
            .unwrap_or(Device::Cpu);
        self.assign(&candle_core::safetensors::load(path, &device)?)
    }
}

struct BuilderState {
    params: Params,
    rng: Rng,
    dtype: DType,
    device: Device,
    precision: Precision,
    decoding: DecodePrecision,
    candidates: Option<Arc<dyn CandidateVocab>>,
    /// Values to create parameters from instead of drawing them ([`ParamBuilder::with_values`]),
    /// each taken out when its parameter is created.
    values: HashMap<String, Tensor>,
    /// The parameters created from `values`, which re-initialisation leaves alone.
    loaded: HashSet<String>,
    /// An `Arc<dyn Backend>` ([`crate::backend`]'s `ParamBuilder::with_backend`). The
    /// builder sits below the layers and the backends, which are made of layers, so it
    /// keeps the backend without naming its type; the stacks read it back by that type.
    backend: Option<Arc<dyn Any + Send + Sync>>,
}

/// Creates parameters under a dotted name prefix (`encoder.layers.0.self_attn`).
///
/// Clones share one registry and one seeded RNG, so a model built twice with the same seed
/// has the same weights.
#[derive(Clone)]
pub struct ParamBuilder {
    state: Rc<RefCell<BuilderState>>,
    prefix: String,
}

impl ParamBuilder {
    /// A root builder (empty prefix) with a fresh registry whose parameters have `dtype`,
    /// live on `device` and are drawn from an RNG seeded with `seed`.
    pub fn new(dtype: DType, device: &Device, seed: u64) -> Self {
        Self {
            state: Rc::new(RefCell::new(BuilderState {
                params: Params::default(),
                rng: Rng::new(seed),
                dtype,
                device: device.clone(),
                precision: Precision::F32,
                decoding: DecodePrecision::F32,
                candidates: None,
                values: HashMap::new(),
                loaded: HashSet::new(),
                backend: None,
            })),
            prefix: String::new(),
        }
    }

    /// A builder for the sub-module `name`.
    pub fn pp(&self, name: impl std::fmt::Display) -> Self {
        let prefix = if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        };
        Self {
            state: self.state.clone(),
            prefix,
        }
    }

    /// The dtype of the parameters this builder creates.
    pub fn dtype(&self) -> DType {
        self.state.borrow().dtype
    }

    /// The same builder, whose models train in `precision`: the arithmetic of the products
    /// of their training passes, fixed when a model is built ([`Self::precision`]).
    pub fn with_precision(self, precision: Precision) -> Self {
        self.state.borrow_mut().precision = precision;
        self
    }

    /// The training arithmetic of the models built here (f32 unless
    /// [`Self::with_precision`]): a Transformer's fused layers and output layer run their
    /// products in it when differentiated `Direct`; validation and decoding run in f32.
    pub fn precision(&self) -> Precision {
        self.state.borrow().precision
    }

    /// The same builder, whose models decode in `decoding` ([`Self::decoding`]).
    pub fn with_decoding(self, decoding: DecodePrecision) -> Self {
        self.state.borrow_mut().decoding = decoding;
        self
    }

    /// The arithmetic the models built here decode in (f32 unless [`Self::with_decoding`]):
    /// a Transformer prepares its decoding weights in it
    /// ([`crate::Seq2Seq::prepare_decoding`]); training and the other forwards are f32 or
    /// [`Self::precision`].
    pub fn decoding(&self) -> DecodePrecision {
        self.state.borrow().decoding
    }

    /// The same builder, whose models decode over each batch's candidate tokens under `c`
    /// ([`Self::candidates`]).
    pub fn with_candidates(self, c: Arc<dyn CandidateVocab>) -> Self {
        self.state.borrow_mut().candidates = Some(c);
        self
    }

    /// The candidate tokens the models built here restrict decoding's output vocabulary to
    /// (`None`, the default: every token).
    pub fn candidates(&self) -> Option<Arc<dyn CandidateVocab>> {
        self.state.borrow().candidates.clone()
    }

    /// Keeps `backend` (an `Arc<dyn Backend>`, type-erased: see [`BuilderState`]) for the
    /// stacks built here.
    pub(crate) fn keep_backend(self, backend: Arc<dyn Any + Send + Sync>) -> Self {
        self.state.borrow_mut().backend = Some(backend);
        self
    }

    /// What [`Self::keep_backend`] kept.
    pub(crate) fn kept_backend(&self) -> Option<Arc<dyn Any + Send + Sync>> {
        self.state.borrow().backend.clone()
    }

    /// The device the parameters are created on.
    pub fn device(&self) -> Device {
        self.state.borrow().device.clone()
    }

    /// The same builder, which creates each parameter from the tensor of its name in
    /// `values` (a loaded checkpoint) where it has one of the parameter's shape, instead of
    /// drawing it and copying the loaded values in afterwards: a model loaded for decoding
    /// then never holds two copies of its weights (at the paper's base size, 190 MB that
    /// were the process's peak memory). Finish with [`Self::assign_rest`], which checks and
    /// assigns what was not taken as [`Params::assign`] does.
    pub fn with_values(self, values: HashMap<String, Tensor>) -> Self {
        self.state.borrow_mut().values = values;
        self
    }

    /// After building with [`Self::with_values`]: assigns the values the parameters were not
    /// created from, with [`Params::assign`]'s checks and errors (every parameter present
    /// with its shape, no tensor left over).
    pub fn assign_rest(&self) -> Result<()> {
        let (rest, loaded) = {
            let mut st = self.state.borrow_mut();
            (
                std::mem::take(&mut st.values),
                std::mem::take(&mut st.loaded),
            )
        };
        self.params().assign_rest(&rest, &loaded)
    }

    /// Creates the parameter `<prefix>.<name>` and returns its tensor.
    pub fn var(&self, name: &str, shape: impl Into<Shape>, init: Init) -> Result<Tensor> {
        let shape = shape.into();
        let full = self.pp(name).prefix;
        let mut st = self.state.borrow_mut();
        let given = match st.values.get(&full) {
            Some(t) if t.dims() == shape.dims() => st.values.remove(&full),
            _ => None,
        };
        let t = match given {
            Some(t) => {
                st.loaded.insert(full.clone());
                t.to_dtype(st.dtype)?.to_device(&st.device)?
            }
            None => {
                let values = init.values(&st.rng, shape.elem_count());
                Tensor::from_vec(values, shape, &st.device)?.to_dtype(st.dtype)?
            }
        };
        let var = Var::from_tensor(&t)?;
        st.params.insert(full, var.clone())?;
        Ok(var.as_tensor().clone())
    }

    /// Re-initialises the parameter `<prefix>.<name>` (created earlier) from `init`, with the
    /// builder's RNG.
    pub fn reinit(&self, name: &str, init: Init) -> Result<()> {
        let full = self.pp(name).prefix;
        let st = self.state.borrow();
        let var = st
            .params
            .get(&full)
            .ok_or_else(|| candle_core::Error::Msg(format!("no parameter {full}")))?;
        if st.loaded.contains(&full) {
            return Ok(());
        }
        let values = init.values(&st.rng, var.elem_count());
        let t = Tensor::from_vec(values, var.shape(), var.device())?;
        var.set(&t.to_dtype(var.dtype())?)
    }

    /// Re-initialises every matrix (rank-2 parameter) under this prefix with Xavier-uniform
    /// bounds, as `nn.Transformer` does after construction (the split q/k/v projections get
    /// the packed `(3C, C)` matrix's bound).
    pub fn reinit_xavier_matrices(&self) -> Result<()> {
        let st = self.state.borrow();
        for (name, var) in st.params.iter() {
            let under = self.prefix.is_empty() || name.starts_with(&format!("{}.", self.prefix));
            if under && var.rank() == 2 && !st.loaded.contains(name) {
                let (mut fan_out, fan_in) = var.dims2()?;
                // PyTorch initialises the packed in_proj_weight (3C, C) as one matrix; our
                // split q/k/v projections get the same bound.
                if ["q_proj.weight", "k_proj.weight", "v_proj.weight"]
                    .iter()
                    .any(|s| name.ends_with(s))
                {
                    fan_out *= 3;
                }
                let b = (6.0 / (fan_in + fan_out) as f64).sqrt();
                let t = Tensor::from_vec(
                    uniform(&st.rng, var.elem_count(), b),
                    var.shape(),
                    var.device(),
                )?;
                var.set(&t.to_dtype(var.dtype())?)?;
            }
        }
        Ok(())
    }

    /// The registry of everything created so far (shares the `Var`s).
    pub fn params(&self) -> Params {
        self.state.borrow().params.clone()
    }
}

fn uniform(rng: &Rng, n: usize, a: f64) -> Vec<f64> {
    rng.uniform_vec(n)
        .into_iter()
        .map(|u| (2.0 * u - 1.0) * a)
        .collect()
}
