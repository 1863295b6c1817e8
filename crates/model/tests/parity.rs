//! Outputs and gradients against PyTorch, from the float64 fixtures written by
//! `scripts/make_fixtures.py` (see tests/fixtures/README.md). Each check runs in float64
//! (to ~1e-10) and float32 (to ~1e-5).

mod common;

use candle_core::{DType, Device, Result};
use common::{assert_close, check_gradients, Fixture};
use transformer_model::stack::LayerSpec;
use transformer_model::{
    Activation, DecoderLayer, EncoderLayer, Mask, Mode, MultiHeadAttention, ParamBuilder, Pass,
    PositionalEncoding, Transformer, TransformerConfig,
};

const DTYPES: [DType; 2] = [DType::F64, DType::F32];

fn builder(dtype: DType) -> ParamBuilder {
    ParamBuilder::new(dtype, &Device::Cpu, 0)
}

/// The module `build` makes, with the fixture's weights (`param.*`) assigned; and its
/// parameters.
fn with_fixture_weights<M>(
    fx: &Fixture,
    build: impl FnOnce(&ParamBuilder) -> Result<M>,
) -> Result<(M, transformer_model::Params)> {
    let pb = builder(fx.dtype);
    let module = build(&pb)?;
    let params = pb.params();
    params.assign(&fx.group("param"))?;
    Ok((module, params))
}

fn spec(fx: &Fixture) -> LayerSpec {
    LayerSpec {
        d_model: fx.meta_usize("d_model"),
        nhead: fx.meta_usize("nhead"),
        dim_feedforward: fx.meta_usize("dim_feedforward"),
        dropout: 0.0,
        activation: fx.meta("activation").parse::<Activation>().unwrap(),
        layer_norm_eps: fx.meta("layer_norm_eps").parse().unwrap(),
        norm_first: fx.meta("norm_first") == "true",
    }
}

#[test]
fn positional_encoding_matches_tutorial_formula() -> Result<()> {
    let fx = Fixture::load("positional_encoding.safetensors", DType::F64);
    let want = fx.t("output.pe");
    let (max_len, d) = want.dims2()?;
    let got = PositionalEncoding::table(d, max_len, &Device::Cpu)?;
    assert_close("pe", &got, &want, DType::F64);
    Ok(())
}

#[test]
fn multi_head_attention_with_padding_and_attn_mask() -> Result<()> {
    for dtype in DTYPES {
        let fx = Fixture::load("mha.safetensors", dtype);
        let (d_model, nhead) = (fx.meta_usize("d_model"), fx.meta_usize("nhead"));
        let (mha, params) = with_fixture_weights(&fx, |pb| {
            MultiHeadAttention::new(pb, d_model, nhead, 0.0, true)
        })?;

        let (q, k, v) = (fx.input("query"), fx.input("key"), fx.input("value"));
        let mask = fx.combined_mask("attn_mask", "key_padding_mask")?;
        let (out, weights) = mha.forward(&q, &k, &v, Some(&mask), Mode::Eval)?;
        assert_close("mha out", &out, &fx.t("output.out"), dtype);
        assert_close("mha weights", &weights, &fx.t("output.attn_weights"), dtype);
        check_gradients(
            &fx,
            &out,
            &params,
            &[("query", &q), ("key", &k), ("value", &v)],
        )?;

        let x = fx.t("input.self_x");
        let (out, weights) = mha.forward(&x, &x, &x, None, Mode::Eval)?;
        assert_close("self-attention out", &out, &fx.t("output.self_out"), dtype);
        assert_close(
            "self-attention weights",
            &weights,
            &fx.t("output.self_attn_weights"),
            dtype,
        );
    }
    Ok(())
}

/// Checks `check` on each fixture of a layer kind (`encoder` or `decoder`): post-norm with
/// ReLU and pre-norm with GELU, in each dtype, on the layer `build` makes with the fixture's
/// weights.
fn each_layer_fixture<L>(
    kind: &str,
    build: impl Fn(&ParamBuilder, &LayerSpec) -> Result<L>,
    check: impl Fn(&str, &Fixture, &L, &transformer_model::Params) -> Result<()>,
) -> Result<()> {
    for variant in ["post_relu", "pre_gelu"] {
        let file = format!("{kind}_layer_{variant}.safetensors");
        for dtype in DTYPES {
            let fx = Fixture::load(&file, dtype);
            let (layer, params) = with_fixture_weights(&fx, |pb| build(pb, &spec(&fx)))?;
            check(&file, &fx, &layer, &params)?;
        }
    }
    Ok(())
}

#[test]
fn encoder_layers_post_norm_relu_and_pre_norm_gelu() -> Result<()> {
    each_layer_fixture("encoder", EncoderLayer::new, |file, fx, layer, params| {
        let src = fx.input("src");
        let mask = fx.combined_mask("src_mask", "src_key_padding_mask")?;
        let (out, _) = layer.forward(&src, Some(&mask), Mode::Eval)?;
        assert_close(&format!("{file} out"), &out, &fx.t("output.out"), fx.dtype);
        check_gradients(fx, &out, params, &[("src", &src)])
    })
}

#[test]
fn decoder_layers_post_norm_relu_and_pre_norm_gelu() -> Result<()> {
    each_layer_fixture("decoder", DecoderLayer::new, |file, fx, layer, params| {
        let (tgt, memory) = (fx.input("tgt"), fx.input("memory"));
        let self_mask = fx.combined_mask("tgt_mask", "tgt_key_padding_mask")?;
        let memory_mask = fx.combined_mask("memory_mask", "memory_key_padding_mask")?;
        let (out, _) = layer.forward(
            &tgt,
            &memory,
            Some(&self_mask),
            Some(&memory_mask),
            Pass::new(Mode::Eval).weights(),
        )?;
        assert_close(&format!("{file} out"), &out, &fx.t("output.out"), fx.dtype);
        check_gradients(fx, &out, params, &[("tgt", &tgt), ("memory", &memory)])
    })
}

#[test]
fn whole_transformer_with_all_masks() -> Result<()> {
    for dtype in DTYPES {
        let fx = Fixture::load("transformer.safetensors", dtype);
        let cfg = TransformerConfig {
            d_model: fx.meta_usize("d_model"),
            nhead: fx.meta_usize("nhead"),
            num_encoder_layers: fx.meta_usize("num_encoder_layers"),
            num_decoder_layers: fx.meta_usize("num_decoder_layers"),
            dim_feedforward: fx.meta_usize("dim_feedforward"),
            dropout: 0.0,
            ..TransformerConfig::base()
        };
        let (model, params) = with_fixture_weights(&fx, |pb| Transformer::new(pb, &cfg))?;
        let (src, tgt) = (fx.input("src"), fx.input("tgt"));
        let src_mask = fx.combined_mask("src_mask", "src_key_padding_mask")?;
        let tgt_mask: Mask = fx.combined_mask("tgt_mask", "tgt_key_padding_mask")?;
        let memory_mask = fx.combined_mask("memory_mask", "memory_key_padding_mask")?;
        let out = model.forward(
            &src,
            &tgt,
            Some(&src_mask),
            Some(&tgt_mask),
            Some(&memory_mask),
            Mode::Eval,
        )?;
        assert_close("transformer out", &out, &fx.t("output.out"), dtype);
        check_gradients(&fx, &out, &params, &[("src", &src), ("tgt", &tgt)])?;
    }
    Ok(())
}
