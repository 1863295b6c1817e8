//! Loading the PyTorch fixtures written by `scripts/make_fixtures.py` and comparing tensors.
#![allow(dead_code)]

pub mod gradients;

use candle_core::{DType, Device, Result, Tensor, Var};
use std::collections::HashMap;
use std::path::PathBuf;
use transformer_model::config::Activation;
use transformer_model::stack::LayerSpec;
use transformer_model::{import, LmConfig, Mask};

pub fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/fixtures")
        .join(name)
}

/// One fixture file, float tensors cast to `dtype`.
pub struct Fixture {
    pub name: String,
    tensors: HashMap<String, Tensor>,
    meta: HashMap<String, String>,
    pub dtype: DType,
}

impl Fixture {
    pub fn load(name: &str, dtype: DType) -> Self {
        let path = fixture_path(name);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        let meta = header.metadata().clone().unwrap_or_default();
        let tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)
            .unwrap()
            .into_iter()
            .map(|(k, t)| {
                let t = if t.dtype().is_float() {
                    t.to_dtype(dtype).unwrap()
                } else {
                    t
                };
                (k, t)
            })
            .collect();
        Self {
            name: name.to_string(),
            tensors,
            meta,
            dtype,
        }
    }

    pub fn t(&self, key: &str) -> Tensor {
        self.tensors
            .get(key)
            .unwrap_or_else(|| panic!("{}: no tensor {key}", self.name))
            .clone()
    }

    /// An input as a `Var`, so its gradient can be read back.
    pub fn input(&self, key: &str) -> Var {
        Var::from_tensor(&self.t(&format!("input.{key}"))).unwrap()
    }

    pub fn meta(&self, key: &str) -> &str {
        self.meta
            .get(key)
            .unwrap_or_else(|| panic!("{}: no metadata {key}", self.name))
    }

    pub fn meta_usize(&self, key: &str) -> usize {
        self.meta(key).parse().unwrap()
    }

    /// Tensors under `prefix.`, renamed to this crate's parameter names.
    pub fn group(&self, prefix: &str) -> HashMap<String, Tensor> {
        let p = format!("{prefix}.");
        let raw = self
            .tensors
            .iter()
            .filter_map(|(k, t)| k.strip_prefix(&p).map(|n| (n.to_string(), t.clone())))
            .collect();
        import::from_torch(&raw).unwrap()
    }

    /// A PyTorch boolean attention mask (`mask.<key>`, 1 = not allowed).
    pub fn attn_mask(&self, key: &str) -> Mask {
        Mask::from_torch_bool(&self.t(&format!("mask.{key}"))).unwrap()
    }

    /// A PyTorch key padding mask (`mask.<key>`, 1 = padding).
    pub fn padding_mask(&self, key: &str) -> Mask {
        Mask::from_torch_key_padding(&self.t(&format!("mask.{key}"))).unwrap()
    }

    /// The boolean attention mask `mask.<attn>` and the key padding mask `mask.<padding>`
    /// together: a position is attended where both allow it.
    pub fn combined_mask(&self, attn: &str, padding: &str) -> Result<Mask> {
        self.attn_mask(attn).and(&self.padding_mask(padding))
    }
}

/// Tolerance on `max |got - want| / max(1, max |want|)` per dtype: float64 results must
/// agree with PyTorch's float64 to rounding error, float32 to single precision.
pub fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-10,
        _ => 1e-5,
    }
}

pub fn max_rel_diff(got: &Tensor, want: &Tensor) -> f64 {
    assert_eq!(got.dims(), want.dims(), "shapes differ");
    let got = got.to_dtype(DType::F64).unwrap();
    let want = want.to_dtype(DType::F64).unwrap();
    let diff = (&got - &want)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap();
    let scale = want.abs().unwrap().flatten_all().unwrap().max(0).unwrap();
    diff.to_scalar::<f64>().unwrap() / scale.to_scalar::<f64>().unwrap().max(1.0)
}

pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, dtype: DType) {
    let d = max_rel_diff(got, want);
    assert!(
        d <= tol(dtype),
        "{what} ({dtype:?}): relative difference {d:e} > {:e}",
        tol(dtype)
    );
}

/// Backpropagates `sum(out * cotangent)` and checks every parameter's and input's gradient.
pub fn check_gradients(
    fx: &Fixture,
    out: &Tensor,
    params: &transformer_model::Params,
    inputs: &[(&str, &Var)],
) -> Result<()> {
    let loss = (out * fx.t("cotangent.out"))?.sum_all()?;
    assert_close("loss", &loss, &fx.t("output.loss"), fx.dtype);
    let grads = loss.backward()?;
    let want = fx.group("grad");
    assert_eq!(want.len(), params.len(), "{}: parameter count", fx.name);
    for (name, var) in params.iter() {
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{}: no gradient for {name}", fx.name));
        assert_close(
            &format!("{}: grad {name}", fx.name),
            g,
            &want[name],
            fx.dtype,
        );
    }
    for (name, var) in inputs {
        let g = grads.get(var.as_tensor()).expect("input gradient");
        assert_close(
            &format!("{}: grad input {name}", fx.name),
            g,
            &fx.t(&format!("grad_input.{name}")),
            fx.dtype,
        );
    }
    Ok(())
}

/// An encoder or decoder layer of width `d_model` with `nhead` heads, a feed-forward layer
/// of `dim_feedforward` with `activation`, `dropout`, the norms first when `norm_first`, and
/// LayerNorm's eps of 1e-5 (PyTorch's default).
pub fn layer_spec(
    d_model: usize,
    nhead: usize,
    dim_feedforward: usize,
    dropout: f64,
    activation: Activation,
    norm_first: bool,
) -> LayerSpec {
    LayerSpec {
        d_model,
        nhead,
        dim_feedforward,
        dropout,
        activation,
        layer_norm_eps: 1e-5,
        norm_first,
    }
}

/// A small language model's configuration with two attention heads: a vocabulary of
/// `ntoken`, `nlayers` encoder layers of width `d_model` and a feed-forward layer of `d_hid`;
/// the rest as by default.
pub fn lm_config(ntoken: usize, d_model: usize, d_hid: usize, nlayers: usize) -> LmConfig {
    LmConfig {
        ntoken,
        d_model,
        nhead: 2,
        d_hid,
        nlayers,
        ..LmConfig::default()
    }
}

/// The largest absolute difference between two tensors' f32 values, and the largest
/// magnitude of `want`'s (at least `floor`, for gradients that are zero in exact arithmetic),
/// for a tolerance relative to it.
pub fn max_diff_and_size(want: &Tensor, got: &Tensor, floor: f32) -> Result<(f32, f32)> {
    let (w, g) = (
        want.flatten_all()?.to_vec1::<f32>()?,
        got.flatten_all()?.to_vec1::<f32>()?,
    );
    let size = w.iter().fold(floor, |m, v| m.max(v.abs()));
    let diff = w
        .iter()
        .zip(&g)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    Ok((diff, size))
}
