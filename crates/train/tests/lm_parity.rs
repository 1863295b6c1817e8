//! The PyTorch tutorial's TransformerModel: logits, cross-entropy loss and every gradient
//! against PyTorch float64 (fixture from `scripts/make_fixtures.py`), and the parameter names
//! and count of the full-size model.

#[path = "../../model/tests/common/mod.rs"]
mod common;

use candle_core::{DType, Device, Result};
use common::{assert_close, Fixture};
use std::collections::HashMap;
use transformer_model::{import, LmConfig, Mask, Mode, ParamBuilder, TransformerLm};
use transformer_train::cross_entropy;

#[test]
fn tutorial_lm_logits_loss_and_gradients_match_pytorch() -> Result<()> {
    for dtype in [DType::F64, DType::F32] {
        let fx = Fixture::load("tutorial_lm.safetensors", dtype);
        let cfg = LmConfig {
            ntoken: fx.meta_usize("ntoken"),
            d_model: fx.meta_usize("d_model"),
            nhead: fx.meta_usize("nhead"),
            d_hid: fx.meta_usize("d_hid"),
            nlayers: fx.meta_usize("nlayers"),
            dropout: 0.0,
            ..LmConfig::default()
        };
        let pb = ParamBuilder::new(dtype, &Device::Cpu, 0);
        let model = TransformerLm::new(&pb, &cfg)?;
        let params = pb.params();
        params.assign(&fx.group("param"))?;

        // The tutorial is sequence-first: src (T, B) -> ours (B, T).
        let src = fx.t("input.src").to_dtype(DType::U32)?;
        let (t, b) = src.dims2()?;
        // The model builds its own causal mask; it must be the tutorial's.
        let theirs = Mask::from_torch_bool(&fx.t("mask.src_mask"))?;
        let ours = Mask::causal(t, &Device::Cpu)?;
        assert_eq!(
            theirs.keep().flatten_all()?.to_vec1::<u8>()?,
            ours.keep().flatten_all()?.to_vec1::<u8>()?
        );

        let logits = model.forward(&src.t()?.contiguous()?, Mode::Eval)?;
        // (B, T, V) -> (T, B, V)
        let logits = logits.transpose(0, 1)?.contiguous()?;
        assert_close("logits", &logits, &fx.t("output.logits"), dtype);

        let targets = fx.t("input.targets").to_dtype(DType::U32)?;
        let (loss, n) = cross_entropy(&logits.reshape((t * b, cfg.ntoken))?, &targets, None)?;
        assert_eq!(n, t * b);
        assert_close("loss", &loss, &fx.t("output.loss"), dtype);

        // The fused path used in training (output layer + log-softmax + NLL in one kernel)
        // gives the same loss and gradients.
        let fused = model.loss(
            &src.t()?.contiguous()?,
            &targets.reshape((t, b))?.t()?.contiguous()?,
            Mode::Eval,
            transformer_model::Backprop::Graph,
        )?;
        assert_close("fused loss", &fused, &fx.t("output.loss"), dtype);
        let fused_grads = fused.backward()?;

        let grads = loss.backward()?;
        let want = fx.group("grad");
        assert_eq!(want.len(), params.len());
        for (name, var) in params.iter() {
            let g = grads
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("no gradient for {name}"));
            assert_close(&format!("grad {name}"), g, &want[name], dtype);
            let g = fused_grads
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("no fused gradient for {name}"));
            assert_close(&format!("fused grad {name}"), g, &want[name], dtype);
        }
    }
    Ok(())
}

#[test]
fn tutorial_lm_parameter_names_and_count() -> Result<()> {
    let fx = Fixture::load("tutorial_lm.safetensors", DType::F32);
    let pb = ParamBuilder::new(DType::F32, &Device::Cpu, 0);
    let _model = TransformerLm::new(&pb, &LmConfig::default())?;
    let params = pb.params();
    assert_eq!(params.num_elements(), 13_828_478);
    assert_eq!(
        params.num_elements() as f32,
        fx.t("output.num_params").to_scalar::<f32>()?
    );

    // PyTorch's names, with the packed projections split the way import does it.
    let dummy = |n: &str| {
        let packed = n.ends_with("in_proj_weight") || n.ends_with("in_proj_bias");
        candle_core::Tensor::zeros(if packed { 3 } else { 1 }, DType::F32, &Device::Cpu).unwrap()
    };
    let torch: HashMap<String, _> = fx
        .meta("param_names_full")
        .split(',')
        .map(|n| (n.to_string(), dummy(n)))
        .collect();
    assert_eq!(torch.len(), 27);
    let mut expected: Vec<String> = import::from_torch(&torch)?.into_keys().collect();
    let mut ours: Vec<String> = params.names().iter().map(|s| s.to_string()).collect();
    expected.sort();
    ours.sort();
    assert_eq!(ours, expected);
    Ok(())
}
