//! A toy backend registered on a model: it runs the composed layers through a counting
//! wrapper, which shows that every layer call goes through the one place that decides how
//! layers run (`transformer_model::backend`), and that a backend is added without editing
//! the paper's modules.

use candle_core::{DType, Device, Result, Tensor};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use transformer_model::backend::{
    self, Backend, Backprop, Composed, DecoderLayerCall, DecoderLayerParts, EncoderLayerParts,
    LayerCall, Pass,
};
use transformer_model::{
    DecodePrecision, DirectGrads, Mode, ParamBuilder, Transformer, TransformerConfig, TransformerLm,
};

mod common;
use common::lm_config;

/// Counts the encoder and decoder layer calls and leaves each to the composed layer
/// (`None`); it has no fused decoding step.
#[derive(Debug, Default)]
struct Counting {
    encoder: AtomicUsize,
    decoder: AtomicUsize,
}

/// One more call counted in `calls`, left to the composed layer.
fn count(calls: &AtomicUsize) -> Result<Option<Tensor>> {
    calls.fetch_add(1, Ordering::SeqCst);
    Ok(None)
}

impl Backend for Counting {
    fn describe(&self) -> String {
        "counting composed layers (a test)".into()
    }

    fn encoder_layer(&self, _: &EncoderLayerParts<'_>, _: LayerCall<'_>) -> Result<Option<Tensor>> {
        count(&self.encoder)
    }

    fn decoder_layer(
        &self,
        _: &DecoderLayerParts<'_>,
        _: DecoderLayerCall<'_>,
    ) -> Result<Option<Tensor>> {
        count(&self.decoder)
    }
}

fn lm() -> Result<TransformerLm> {
    lm_by(builder())
}

/// The builder of [`lm`]'s weights.
fn builder() -> ParamBuilder {
    ParamBuilder::new(DType::F32, &Device::Cpu, 7)
}

/// [`lm`] built by `pb` (which says how it runs: its backend, its training precision).
fn lm_by(pb: ParamBuilder) -> Result<TransformerLm> {
    TransformerLm::new(&pb, &lm_config(40, 16, 32, 3))
}

#[test]
fn every_encoder_layer_call_goes_through_the_registered_backend() -> Result<()> {
    let ids = Tensor::new(&[[1u32, 2, 3, 4, 5], [6, 7, 8, 9, 10]], &Device::Cpu)?;
    let reference = lm_by(builder().with_backend(Arc::new(Composed)))?;
    let want = reference.forward(&ids, Mode::Eval)?;

    let counting = Arc::new(Counting::default());
    let model = lm_by(builder().with_backend(counting.clone()))?;
    assert_eq!(
        model.describe_backend(),
        "counting composed layers (a test)"
    );
    let got = model.forward(&ids, Mode::Eval)?;
    assert_eq!(
        counting.encoder.load(Ordering::SeqCst),
        3,
        "one call per layer"
    );
    let diff = (got - &want)?.abs()?.max_all()?.to_scalar::<f32>()?;
    assert_eq!(diff, 0.0, "the counting backend runs the composed layers");

    // The evaluation loss goes through it too (three more layer calls).
    let targets = Tensor::new(&[[2u32, 3, 4, 5, 6], [7, 8, 9, 10, 11]], &Device::Cpu)?;
    model.loss(&ids, &targets, Mode::Eval, Backprop::Off)?;
    assert_eq!(counting.encoder.load(Ordering::SeqCst), 6);

    // Calls that keep a cache or want the attention weights run the composed layers
    // without asking the backend (the stacks' one loop decides it, `Stack::run`).
    let weights = model.attention(&ids)?;
    assert_eq!(weights.len(), 3);
    let mut cache = model.new_cache();
    model.forward_step(&ids, &mut cache, Mode::Eval)?;
    assert_eq!(counting.encoder.load(Ordering::SeqCst), 6);
    Ok(())
}

#[test]
fn the_cpu_gets_the_fused_backend_and_says_why() {
    let cpu = backend::choose(&Device::Cpu).describe();
    assert!(cpu.contains("fused CPU layers"), "{cpu}");
    assert!(lm()
        .unwrap()
        .describe_backend()
        .contains("fused CPU layers"));
}

#[test]
fn every_decoder_layer_call_goes_through_the_registered_backend() -> Result<()> {
    let dev = Device::Cpu;
    let pb = ParamBuilder::new(DType::F32, &dev, 3);
    let cpu = Transformer::new(&pb, &TransformerConfig::tiny())?;
    assert!(
        cpu.decoder().fused_stack(DecodePrecision::F32)?.is_some(),
        "the CPU backend fuses decoding"
    );
    let counting = Arc::new(Counting::default());
    let pb = ParamBuilder::new(DType::F32, &dev, 3).with_backend(counting.clone());
    let model = Transformer::new(&pb, &TransformerConfig::tiny())?;
    assert!(
        model.decoder().fused_stack(DecodePrecision::F32)?.is_none(),
        "the toy backend has no fused step"
    );
    let src = Tensor::randn(0f32, 1.0, (2, 5, 32), &dev)?;
    let tgt = Tensor::randn(0f32, 1.0, (2, 4, 32), &dev)?;
    let memory = model.encoder().forward(&src, None, Mode::Eval)?;
    let direct = DirectGrads::new();
    let backprop = Backprop::Direct(&direct);
    let pass = Pass::new(Mode::Eval).backprop(backprop);
    let inputs = transformer_model::decoder::DecoderInputs::full(&memory, None, None);
    model.decoder().forward_as(&tgt, inputs, pass)?;
    let layers = TransformerConfig::tiny().num_decoder_layers;
    assert_eq!(counting.decoder.load(Ordering::SeqCst), layers);
    assert_eq!(
        counting.encoder.load(Ordering::SeqCst),
        TransformerConfig::tiny().num_encoder_layers
    );
    Ok(())
}

/// Mixed precision is the backend's to give: the composed backend (the GPU's) runs a bf16
/// training pass's products in bf16 (autocast), which moves the loss by bf16 rounding, and
/// an f32 pass through it is the plain composed pass.
#[test]
fn the_composed_backend_lowers_a_bf16_pass_to_bf16_products() -> Result<()> {
    use transformer_model::kernels::Precision;
    let ids = Tensor::new(&[[1u32, 2, 3, 4, 5], [6, 7, 8, 9, 10]], &Device::Cpu)?;
    let targets = Tensor::new(&[[2u32, 3, 4, 5, 6], [7, 8, 9, 10, 11]], &Device::Cpu)?;
    let composed = |p: Precision| -> Result<TransformerLm> {
        lm_by(builder().with_precision(p).with_backend(Arc::new(Composed)))
    };
    let loss = |p: Precision| -> Result<f32> {
        let direct = DirectGrads::new();
        composed(p)?
            .loss(&ids, &targets, Mode::Eval, Backprop::Direct(&direct))?
            .to_scalar::<f32>()
    };
    let (full, half) = (loss(Precision::F32)?, loss(Precision::Bf16)?);
    let model = composed(Precision::F32)?;
    let plain = model
        .loss(&ids, &targets, Mode::Eval, Backprop::Off)?
        .to_scalar::<f32>()?;
    assert!(
        (full - plain).abs() <= 1e-6 * plain.abs(),
        "{full} vs {plain}"
    );
    assert_ne!(full, half, "the bf16 pass computed in f32");
    assert!((full - half).abs() <= 2e-2 * full.abs(), "{full} vs {half}");
    assert!(
        !transformer_model::kernels::autocast::bf16_products(),
        "the guard ends with the pass"
    );
    // The composed layers' own products, under the guard alone.
    let plain_h = model.forward(&ids, Mode::Eval)?;
    let low_h = {
        let _g = transformer_model::kernels::autocast::Bf16Products::on();
        model.forward(&ids, Mode::Eval)?
    };
    let diff = (plain_h - low_h)?.abs()?.max_all()?.to_scalar::<f32>()?;
    assert!(
        diff > 0.0 && diff < 0.5,
        "bf16 products moved the logits by {diff}"
    );
    // The fused CPU backend does its bf16 in its own kernels: no guard.
    assert!(backend::choose(&Device::Cpu)
        .mixed_precision(Precision::Bf16)
        .is_none());
    assert!(Composed.mixed_precision(Precision::Bf16).is_some());
    assert!(Composed.mixed_precision(Precision::F32).is_none());
    Ok(())
}

/// Has no fused decoding step and counts the output layers it makes for decoding, in f32
/// whatever precision is asked: decoding's choices go through the backend too.
#[derive(Debug, Default)]
struct CountingDecoding {
    output_layers: AtomicUsize,
}

impl Backend for CountingDecoding {
    fn describe(&self) -> String {
        "composed layers, counted output layers (a test)".into()
    }

    fn output_layer(
        &self,
        output: &transformer_model::Linear,
        _: DecodePrecision,
    ) -> Result<backend::OutputLayer> {
        self.output_layers.fetch_add(1, Ordering::SeqCst);
        backend::OutputLayer::new(output, None)
    }
}

#[test]
fn decoding_is_prepared_by_the_registered_backend() -> Result<()> {
    use transformer_model::{Seq2Seq, Seq2SeqConfig};
    let dev = Device::Cpu;
    let cfg = Seq2SeqConfig {
        transformer: TransformerConfig::tiny(),
        src_vocab: 17,
        tgt_vocab: 17,
        share_embeddings: true,
        inputs: Default::default(),
    };
    let cpu = Seq2Seq::with_config(&ParamBuilder::new(DType::F32, &dev, 4), &cfg)?;
    // The same weights (the same seed), through a toy backend, asked to decode in int8.
    let counting = Arc::new(CountingDecoding::default());
    let pb = ParamBuilder::new(DType::F32, &dev, 4)
        .with_backend(counting.clone())
        .with_decoding(DecodePrecision::Int8 { output_layer: true });
    let model = Seq2Seq::with_config(&pb, &cfg)?;
    let prepared = model.prepare_decoding()?;
    assert_eq!(counting.output_layers.load(Ordering::SeqCst), 1);
    assert_eq!(
        prepared.describe(),
        "decoder layers f32 (composed), output layer f32",
        "the toy backend chose f32 and no fused step"
    );
    // It decodes as the CPU model's composed layers do, bit for bit.
    let src = Tensor::new(&[[5u32, 6, 7, 2], [9, 10, 2, 0]], &dev)?;
    let mut a = model.start_prepared(&src, 0, &prepared)?;
    let mut b = cpu.start_with(&src, 0, false)?;
    assert!(!a.is_fused() && !b.is_fused());
    for step in 0..4u32 {
        let ids = Tensor::new(&[1 + step, 3 + step], &dev)?;
        let (x, _) = model.step(&mut a, &ids, false)?;
        let (y, _) = cpu.step(&mut b, &ids, false)?;
        assert_eq!(x.to_vec2::<f32>()?, y.to_vec2::<f32>()?, "step {step}");
    }
    Ok(())
}
