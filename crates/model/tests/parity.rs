//! Outputs and gradients against PyTorch, from the float64 fixtures written by
//! `scripts/make_fixtures.py` (see tests/fixtures/README.md). Each check runs in float64
//! (to ~1e-10) and float32 (to ~1e-5).

mod common;

use candle_core::{DType, Device, Result};
use common::{assert_close, check_gradients, Fixture};
use transformer_model::encoder::LayerSpec;
use transformer_model::{
    Activation, DecoderLayer, EncoderLayer, Mask, Mode, MultiHeadAttention, ParamBuilder, Pass,
    PositionalEncoding, Transformer, TransformerConfig,
};

const DTYPES: [DType; 2] = [DType::F64, DType::F32];

fn builder(dtype: DType) -> ParamBuilder {
    ParamBuilder::new(dtype, &Device::Cpu, 0)
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
        let pb = builder(dtype);
        let mha = MultiHeadAttention::new(
            &pb,
            fx.meta_usize("d_model"),
            fx.meta_usize("nhead"),
            0.0,
            true,
        )?;
        let params = pb.params();
        params.assign(&fx.group("param"))?;

        let (q, k, v) = (fx.input("query"), fx.input("key"), fx.input("value"));
        let mask = fx
            .attn_mask("attn_mask")
            .and(&fx.padding_mask("key_padding_mask"))?;
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

#[test]
fn encoder_layers_post_norm_relu_and_pre_norm_gelu() -> Result<()> {
    for file in [
        "encoder_layer_post_relu.safetensors",
        "encoder_layer_pre_gelu.safetensors",
    ] {
        for dtype in DTYPES {
            let fx = Fixture::load(file, dtype);
            let pb = builder(dtype);
            let layer = EncoderLayer::new(&pb, &spec(&fx))?;
            let params = pb.params();
            params.assign(&fx.group("param"))?;
            let src = fx.input("src");
            let mask = fx
                .attn_mask("src_mask")
                .and(&fx.padding_mask("src_key_padding_mask"))?;
            let (out, _) = layer.forward(&src, Some(&mask), Mode::Eval)?;
            assert_close(&format!("{file} out"), &out, &fx.t("output.out"), dtype);
            check_gradients(&fx, &out, &params, &[("src", &src)])?;
        }
    }
    Ok(())
}

#[test]
fn decoder_layers_post_norm_relu_and_pre_norm_gelu() -> Result<()> {
    for file in [
        "decoder_layer_post_relu.safetensors",
        "decoder_layer_pre_gelu.safetensors",
    ] {
        for dtype in DTYPES {
            let fx = Fixture::load(file, dtype);
            let pb = builder(dtype);
            let layer = DecoderLayer::new(&pb, &spec(&fx))?;
            let params = pb.params();
            params.assign(&fx.group("param"))?;
            let (tgt, memory) = (fx.input("tgt"), fx.input("memory"));
            let self_mask = fx
                .attn_mask("tgt_mask")
                .and(&fx.padding_mask("tgt_key_padding_mask"))?;
            let memory_mask = fx
                .attn_mask("memory_mask")
                .and(&fx.padding_mask("memory_key_padding_mask"))?;
            let (out, _) = layer.forward(
                &tgt,
                &memory,
                Some(&self_mask),
                Some(&memory_mask),
                Pass::new(Mode::Eval).weights(),
            )?;
            assert_close(&format!("{file} out"), &out, &fx.t("output.out"), dtype);
            check_gradients(&fx, &out, &params, &[("tgt", &tgt), ("memory", &memory)])?;
        }
    }
    Ok(())
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
        let pb = builder(dtype);
        let model = Transformer::new(&pb, &cfg)?;
        let params = pb.params();
        params.assign(&fx.group("param"))?;
        let (src, tgt) = (fx.input("src"), fx.input("tgt"));
        let src_mask = fx
            .attn_mask("src_mask")
            .and(&fx.padding_mask("src_key_padding_mask"))?;
        let tgt_mask: Mask = fx
            .attn_mask("tgt_mask")
            .and(&fx.padding_mask("tgt_key_padding_mask"))?;
        let memory_mask = fx
            .attn_mask("memory_mask")
            .and(&fx.padding_mask("memory_key_padding_mask"))?;
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
