//! A toy backend registered on a model: it runs the composed layers through a counting
//! wrapper, which shows that every layer call goes through the one place that decides how
//! layers run (`transformer_model::backend`), and that a backend is added without editing
//! the paper's modules.

use candle_core::{DType, Device, Result, Tensor};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use transformer_model::backend::{self, Backend, Composed, LayerCall};
use transformer_model::{EncoderLayer, LmConfig, Mode, ParamBuilder, TransformerLm};

/// Counts the encoder layer calls and leaves each to the composed layer (`None`).
#[derive(Debug, Default)]
struct Counting {
    calls: AtomicUsize,
}

impl Backend for Counting {
    fn describe(&self) -> String {
        "counting composed layers (a test)".into()
    }

    fn encoder_layer(&self, _: &EncoderLayer, call: LayerCall<'_>) -> Result<Option<Tensor>> {
        assert!(!call.need_weights && !call.cached);
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(None)
    }
}

fn lm() -> Result<TransformerLm> {
    let pb = ParamBuilder::new(DType::F32, &Device::Cpu, 7);
    let cfg = LmConfig {
        ntoken: 40,
        d_model: 16,
        nhead: 2,
        d_hid: 32,
        nlayers: 3,
        ..LmConfig::default()
    };
    TransformerLm::new(&pb, &cfg)
}

#[test]
fn every_encoder_layer_call_goes_through_the_registered_backend() -> Result<()> {
    let ids = Tensor::new(&[[1u32, 2, 3, 4, 5], [6, 7, 8, 9, 10]], &Device::Cpu)?;
    let mut reference = lm()?;
    reference.set_backend(Arc::new(Composed));
    let want = reference.forward(&ids, Mode::Eval)?;

    let counting = Arc::new(Counting::default());
    let mut model = lm()?;
    model.set_backend(counting.clone());
    assert_eq!(
        model.describe_backend(),
        "counting composed layers (a test)"
    );
    let got = model.forward(&ids, Mode::Eval)?;
    assert_eq!(
        counting.calls.load(Ordering::SeqCst),
        3,
        "one call per layer"
    );
    let diff = (got - &want)?.abs()?.max_all()?.to_scalar::<f32>()?;
    assert_eq!(diff, 0.0, "the counting backend runs the composed layers");

    // The evaluation loss goes through it too (three more layer calls).
    let targets = Tensor::new(&[[2u32, 3, 4, 5, 6], [7, 8, 9, 10, 11]], &Device::Cpu)?;
    model.loss_no_grad(&ids, &targets)?;
    assert_eq!(counting.calls.load(Ordering::SeqCst), 6);
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
