//! Hugging Face MarianMT directories (OPUS-MT): `config.json` (`model_type` `marian`),
//! `model.safetensors` or `pytorch_model.bin`, `vocab.json` (and `target_vocab.json` for
//! separate vocabularies), `source.spm` and `target.spm`, and `generation_config.json`.
//!
//! What the model is, as `transformers`' `modeling_marian.py` computes it: post-norm layers
//! without final norms (layer norm epsilon 1e-5), the activation `config.json` names (OPUS-MT:
//! Swish), token embeddings scaled by sqrt(d_model) when `scale_embedding`, the static
//! sinusoidal table with the sines in the first half and the cosines in the second, from
//! position 0 (not stored in the weights), the output layer tied to the embeddings plus
//! `final_logits_bias`. Its tokenizer is `MarianTokenizer`'s: SentencePiece pieces looked up in
//! `vocab.json` (pieces outside it are `<unk>`), `</s>` appended to the source, a leading
//! `>>xxx<<` target-language token kept whole. It decodes as `generate()` does
//! ([`transformer_decode::SearchRules::HuggingFace`]): from `<pad>`, which it never emits.

use super::{read_json, Imported, Weights};
use crate::config::Engine;
use crate::error::{Error, Result};
use candle_core::{DType, Device, Tensor};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use transformer_model::{Activation, Inputs, Positions, Seq2SeqConfig, TransformerConfig};
use transformer_text::published::{PublishedTokenizer, Side, Splitter, Vocabulary};
use transformer_text::Specials;

/// An encoder layer's parts: (MarianMT's name, this project's), each a weight and a bias.
const ENCODER_PARTS: &[(&str, &str)] = &[
    ("self_attn.q_proj", "self_attn.q_proj"),
    ("self_attn.k_proj", "self_attn.k_proj"),
    ("self_attn.v_proj", "self_attn.v_proj"),
    ("self_attn.out_proj", "self_attn.out_proj"),
    ("self_attn_layer_norm", "norm1"),
    ("fc1", "linear1"),
    ("fc2", "linear2"),
    ("final_layer_norm", "norm2"),
];

/// A decoder layer's parts, as [`ENCODER_PARTS`].
const DECODER_PARTS: &[(&str, &str)] = &[
    ("self_attn.q_proj", "self_attn.q_proj"),
    ("self_attn.k_proj", "self_attn.k_proj"),
    ("self_attn.v_proj", "self_attn.v_proj"),
    ("self_attn.out_proj", "self_attn.out_proj"),
    ("self_attn_layer_norm", "norm1"),
    ("encoder_attn.q_proj", "multihead_attn.q_proj"),
    ("encoder_attn.k_proj", "multihead_attn.k_proj"),
    ("encoder_attn.v_proj", "multihead_attn.v_proj"),
    ("encoder_attn.out_proj", "multihead_attn.out_proj"),
    ("encoder_attn_layer_norm", "norm2"),
    ("fc1", "linear1"),
    ("fc2", "linear2"),
    ("final_layer_norm", "norm3"),
];

/// Whether `dir` holds a MarianMT model (its `config.json` says `marian`).
pub fn is_marian(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .is_some_and(|v| {
            v["model_type"] == "marian"
                || v["architectures"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x == "MarianMTModel"))
        })
}

/// Reads the MarianMT directory `dir`.
pub fn read(dir: &Path) -> Result<Imported> {
    let cfg_path = dir.join("config.json");
    let cfg = read_json(&cfg_path)?;
    let bad = |msg: String| Error::Config {
        path: cfg_path.clone(),
        msg,
    };
    let num = |k: &str| -> Result<usize> {
        cfg[k]
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| bad(format!("no {k:?}: not a complete MarianMT configuration")))
    };
    let flag = |k: &str, d: bool| cfg[k].as_bool().unwrap_or(d);
    if !is_marian(dir) {
        return Err(bad(format!(
            "model_type {}: this reader reads MarianMT (model_type \"marian\")",
            cfg["model_type"]
        )));
    }
    let d_model = num("d_model")?;
    let (enc_heads, dec_heads) = (
        num("encoder_attention_heads")?,
        num("decoder_attention_heads")?,
    );
    let (enc_ffn, dec_ffn) = (num("encoder_ffn_dim")?, num("decoder_ffn_dim")?);
    if enc_heads != dec_heads || enc_ffn != dec_ffn {
        return Err(bad(format!(
            "the encoder has {enc_heads} heads and feed-forward {enc_ffn}, the decoder \
             {dec_heads} and {dec_ffn}: this project's Transformer has one setting for both"
        )));
    }
    let activation = match cfg["activation_function"].as_str().unwrap_or("gelu") {
        "swish" | "silu" => Activation::Swish,
        "gelu" => Activation::Gelu,
        "gelu_new" | "gelu_pytorch_tanh" => Activation::GeluTanh,
        "relu" => Activation::Relu,
        other => {
            return Err(bad(format!(
                "activation_function {other:?} is not supported (swish, silu, gelu, gelu_new, \
                 relu are)"
            )))
        }
    };
    for (key, wrong) in [
        ("normalize_before", true),
        ("normalize_embedding", true),
        ("add_final_layer_norm", true),
        ("static_position_embeddings", false),
    ] {
        if cfg.get(key).and_then(Value::as_bool) == Some(wrong) {
            return Err(bad(format!(
                "{key} {wrong}: not MarianMT's architecture, which this reader supports"
            )));
        }
    }
    let vocab_size = num("vocab_size")?;
    let max_len = num("max_position_embeddings").unwrap_or(1024);
    let pad = num("pad_token_id")? as u32;
    let eos = num("eos_token_id")? as u32;
    let start = cfg["decoder_start_token_id"]
        .as_u64()
        .map_or(pad, |v| v as u32);
    let separate = !flag("share_encoder_decoder_embeddings", true);
    let tgt_vocab_size = match separate {
        true => cfg["decoder_vocab_size"]
            .as_u64()
            .map_or(vocab_size, |v| v as usize),
        false => vocab_size,
    };

    let mut tensors = read_weights(dir)?;
    let mut w = Weights::new();
    let (shared, sd) = take(
        &mut tensors,
        dir,
        &[
            "model.shared.weight",
            "model.encoder.embed_tokens.weight",
            "model.decoder.embed_tokens.weight",
            "lm_head.weight",
        ],
    )?;
    if sd != [vocab_size, d_model] {
        return Err(Error::Checkpoint {
            path: dir.into(),
            msg: format!(
                "the embedding is {sd:?} but config.json says {vocab_size} tokens of \
                 {d_model}: the weights are not this configuration's"
            ),
        });
    }
    let share = !separate
        && flag("tie_word_embeddings", true)
        && tensors.get("lm_head.weight").is_none_or(|t| {
            t.flatten_all().and_then(|f| f.to_vec1::<f32>()).ok() == Some(shared.clone())
        });
    w.insert("src_embedding.weight", shared.clone(), &sd);
    if !share {
        let (tgt, td) = if separate {
            take(&mut tensors, dir, &["model.decoder.embed_tokens.weight"])?
        } else {
            (shared.clone(), sd.clone())
        };
        let (out, od) = match flag("tie_word_embeddings", true) {
            true => (tgt.clone(), td.clone()),
            false => take(&mut tensors, dir, &["lm_head.weight"])?,
        };
        w.insert("tgt_embedding.weight", tgt, &td);
        w.insert("generator.weight", out, &od);
    }
    for n in [
        "model.encoder.embed_tokens.weight",
        "model.decoder.embed_tokens.weight",
        "lm_head.weight",
        "model.encoder.embed_positions.weight",
        "model.decoder.embed_positions.weight",
    ] {
        tensors.remove(n);
    }
    let bias = match tensors.contains_key("final_logits_bias") {
        true => take(&mut tensors, dir, &["final_logits_bias"])?.0,
        false => vec![0.0; tgt_vocab_size],
    };
    w.insert("generator.bias", bias, &[tgt_vocab_size]);
    let (enc_layers, dec_layers) = (num("encoder_layers")?, num("decoder_layers")?);
    for (stack, layers, parts) in [
        ("encoder", enc_layers, ENCODER_PARTS),
        ("decoder", dec_layers, DECODER_PARTS),
    ] {
        for i in 0..layers {
            for (theirs, ours) in parts {
                let src = format!("model.{stack}.layers.{i}.{theirs}");
                let dst = format!("transformer.{stack}.layers.{i}.{ours}");
                linear(&mut tensors, dir, &mut w, &src, &dst)?;
            }
        }
    }
    if let Some(name) = tensors.keys().next() {
        return Err(Error::Checkpoint {
            path: dir.into(),
            msg: format!(
                "the weight {name} (and {} more) is not part of MarianMT as this reader knows \
                 it (a layer norm after the embeddings or the stacks?): not imported",
                tensors.len() - 1
            ),
        });
    }
    let model = Seq2SeqConfig {
        transformer: TransformerConfig {
            d_model,
            nhead: enc_heads,
            num_encoder_layers: enc_layers,
            num_decoder_layers: dec_layers,
            dim_feedforward: enc_ffn,
            dropout: cfg["dropout"].as_f64().unwrap_or(0.1),
            activation,
            layer_norm_eps: 1e-5,
            norm_first: false,
            max_len,
            final_norm: false,
        },
        src_vocab: vocab_size,
        tgt_vocab: tgt_vocab_size,
        share_embeddings: share,
        inputs: Inputs {
            scale_embeddings: flag("scale_embedding", false),
            positions: Positions::Halves,
            zero_start_embedding: false,
        },
    };
    model
        .validate()
        .map_err(|e| bad(format!("the model it describes: {e}")))?;
    let tokenizer = tokenizer(
        dir,
        separate,
        (pad, start, eos),
        (vocab_size, tgt_vocab_size),
    )?;
    let generation = read_json(&dir.join("generation_config.json")).unwrap_or(Value::Null);
    let beam = generation["num_beams"]
        .as_u64()
        .or(cfg["num_beams"].as_u64())
        .unwrap_or(4) as usize;
    let max_length = generation["max_length"]
        .as_u64()
        .or(cfg["max_length"].as_u64())
        .unwrap_or(512) as usize;
    let length_penalty = generation["length_penalty"].as_f64().unwrap_or(1.0);
    Ok(Imported {
        format: super::Format::Marian,
        origin: dir.to_path_buf(),
        model,
        weights: w,
        int8: false,
        tokenizer,
        languages: None,
        engine: match generation["renormalize_logits"].as_bool() {
            Some(true) => Engine::HuggingFaceRenormalized,
            _ => Engine::HuggingFace,
        },
        beam,
        length_penalty,
        max_length,
        target_prefix: Vec::new(),
        replace_unknowns: false,
        // The attention `generate()` returns has no alignment head; CTranslate2's default.
        alignment: (-1, 1),
        notes: vec![format!(
            "MarianMT model ({} weights), decoding as transformers' generate() does",
            if dir.join("model.safetensors").exists() {
                "model.safetensors"
            } else {
                "pytorch_model.bin"
            }
        )],
    })
}

/// The weights: `model.safetensors`, else `pytorch_model.bin` (a PyTorch state dict).
fn read_weights(dir: &Path) -> Result<HashMap<String, Tensor>> {
    let st = dir.join("model.safetensors");
    if st.exists() {
        return candle_core::safetensors::load(&st, &Device::Cpu).map_err(|e| Error::Checkpoint {
            path: st,
            msg: format!("not a readable safetensors file: {e}"),
        });
    }
    let bin = dir.join("pytorch_model.bin");
    if bin.exists() {
        return candle_core::pickle::read_all(&bin)
            .map(|v| v.into_iter().collect())
            .map_err(|e| Error::Checkpoint {
                path: bin,
                msg: format!("not a readable PyTorch state dict: {e}"),
            });
    }
    Err(Error::Usage(format!(
        "{}: no model.safetensors or pytorch_model.bin: not a complete MarianMT directory",
        dir.display()
    )))
}

/// `MarianTokenizer`: the vocabularies (`vocab.json`, and `target_vocab.json` when separate)
/// in id order, the SentencePiece models, `</s>` after the source, `<unk>` for pieces outside
/// the vocabulary.
fn tokenizer(
    dir: &Path,
    separate: bool,
    (pad, start, eos): (u32, u32, u32),
    (src_size, tgt_size): (usize, usize),
) -> Result<PublishedTokenizer> {
    let vocab = |name: &str, size: usize| -> Result<Vec<String>> {
        let path = dir.join(name);
        let v = read_json(&path)?;
        let map = v.as_object().ok_or_else(|| Error::Config {
            path: path.clone(),
            msg: "not a JSON object of pieces to ids".into(),
        })?;
        let mut tokens = vec![String::new(); size];
        for (piece, id) in map {
            let id = id.as_u64().unwrap_or(u64::MAX) as usize;
            if id >= size {
                return Err(Error::Config {
                    path: path.clone(),
                    msg: format!(
                        "{piece:?} has id {id}, outside the model's {size} tokens: the \
                         vocabulary is not this model's"
                    ),
                });
            }
            tokens[id] = piece.clone();
        }
        Ok(tokens)
    };
    let src_tokens = vocab("vocab.json", src_size)?;
    let tgt_tokens = match separate {
        true => vocab("target_vocab.json", tgt_size)?,
        false => src_tokens.clone(),
    };
    let spm = |name: &str| -> Result<Splitter> {
        let path = dir.join(name);
        let bytes = std::fs::read(&path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        Ok(Splitter::sentencepiece(bytes, &path)?)
    };
    let unk_of = |t: &[String], side: &str| {
        t.iter()
            .position(|p| p == "<unk>")
            .map(|i| i as u32)
            .ok_or_else(|| Error::Config {
                path: dir.join("vocab.json"),
                msg: format!("the {side} vocabulary has no <unk>"),
            })
    };
    let (src_unk, tgt_unk) = (
        unk_of(&src_tokens, "source")?,
        unk_of(&tgt_tokens, "target")?,
    );
    let tok = PublishedTokenizer {
        source: Side {
            splitter: spm("source.spm")?,
            vocab: Vocabulary::new(src_tokens, src_unk),
        },
        target: Side {
            splitter: spm("target.spm")?,
            vocab: Vocabulary::new(tgt_tokens, tgt_unk),
        },
        specials: Specials {
            pad,
            bos: start,
            eos,
            unk: src_unk,
            source_end: Some(eos),
        },
        source_prefix: Vec::new(),
        language_tags: true,
        skip_unknown: true,
        strip_prefix: None,
    };
    tok.check(&dir.join("vocab.json"))?;
    Ok(tok)
}

/// The first of `names` in `tensors` (removed) as f32 values and a shape.
fn take(
    tensors: &mut HashMap<String, Tensor>,
    dir: &Path,
    names: &[&str],
) -> Result<(Vec<f32>, Vec<usize>)> {
    for n in names {
        if let Some(t) = tensors.remove(*n) {
            let dims = t.dims().to_vec();
            let v = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            return Ok((v, dims));
        }
    }
    Err(Error::Checkpoint {
        path: dir.into(),
        msg: format!("no weight {}: not a complete MarianMT model", names[0]),
    })
}

/// The linear layer (or layer norm) `src`'s weight and bias as `dst`'s.
fn linear(
    tensors: &mut HashMap<String, Tensor>,
    dir: &Path,
    w: &mut Weights,
    src: &str,
    dst: &str,
) -> Result<()> {
    let (wt, d) = take(tensors, dir, &[&format!("{src}.weight")])?;
    let (b, bd) = take(tensors, dir, &[&format!("{src}.bias")])?;
    w.insert(&format!("{dst}.weight"), wt, &d);
    w.insert(&format!("{dst}.bias"), b, &bd);
    Ok(())
}
