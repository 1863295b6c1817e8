//! CTranslate2 model directories: `model.bin` ([`super::model_bin`]) holding a
//! `TransformerSpec` (or the `TransformerBase`/`TransformerBig` of binary versions 1 and 2),
//! `config.json` (binary version 6; the same settings were attributes of `model.bin` before),
//! and the vocabularies (`shared_vocabulary` or `source_`/`target_vocabulary`, `.json` or
//! `.txt`). The names, defaults and layout follow CTranslate2's `python/ctranslate2/specs/`
//! and `src/models/` (`transformer.cc`, `model.cc`, `sequence_to_sequence.cc`).
//!
//! Every variable of the file is either read into the model or one of the attributes this
//! reader understands; any other (relative positions, a GLU feed-forward, RMS norms, source
//! features, an embedding layer norm...) is an error naming it, so that no model loads that
//! would translate wrongly.

use super::model_bin::{DType, ModelBin, Variable};
use super::{read_json, Imported, Weights};
use crate::error::{Error, Result};
use crate::run_dir::read_text;
use std::collections::BTreeSet;
use std::path::Path;
use transformer_model::{Activation, Inputs, Positions, Seq2SeqConfig, TransformerConfig};
use transformer_text::published::{PublishedTokenizer, Side, Splitter, Vocabulary};
use transformer_text::Specials;

/// The positions of a CTranslate2 model with the built-in sinusoidal table: it grows on
/// demand there; 1,024 source tokens is CTranslate2's default `max_input_length`.
const BUILTIN_POSITIONS: usize = 1024;

/// The int16 scale CTranslate2 assumes where a binary version 1 file stores none.
const DEFAULT_INT16_SCALE: f64 = 1000.0;

/// A weight's f32 values and shape.
type Matrix = (Vec<f32>, Vec<usize>);

/// The special tokens and source framing of `config.json` (or, before binary version 6,
/// of the model's attributes).
#[derive(Debug, Clone)]
pub(crate) struct Ct2Config {
    pub unk: String,
    pub bos: String,
    pub eos: String,
    pub decoder_start: Option<String>,
    pub add_source_bos: bool,
    pub add_source_eos: bool,
    pub layer_norm_eps: f64,
}

/// Reads the CTranslate2 model directory `dir` with `splitters` for the source and target
/// text (whitespace for a model that takes tokens; an Argos package's SentencePiece model).
pub(crate) fn read(dir: &Path, splitters: (Splitter, Splitter)) -> Result<Imported> {
    let bin = ModelBin::read(&dir.join("model.bin"))?;
    let mut spec = Spec::new(bin)?;
    let config = read_config(dir, &mut spec)?;
    let (model, weights, stored) = spec.model(&config)?;
    let (src_tokens, tgt_tokens) = read_vocabularies(dir)?;
    let tokenizer = tokenizer(dir, &config, src_tokens, tgt_tokens, splitters, &model)?;
    let mut notes = vec![format!(
        "CTranslate2 model: binary version {}, {} revision {}, weights {}",
        spec.bin.version,
        if spec.bin.spec.is_empty() {
            "TransformerBase"
        } else {
            &spec.bin.spec
        },
        spec.bin.revision,
        stored
    )];
    let (model, weights, tokenizer) = with_padding(model, weights, tokenizer, &mut notes)?;
    // Read (and marked read) with the architecture; CTranslate2's defaults: the last layer,
    // its first head.
    let alignment_layer = spec
        .scalar("decoder/alignment_layer")
        .or_else(|| spec.scalar("alignment_layer"))
        .map_or(-1, |v| v as i64);
    let alignment_heads = spec
        .scalar("decoder/alignment_heads")
        .or_else(|| spec.scalar("alignment_heads"))
        .map_or(1, |v| v.max(0.0) as usize);
    Ok(Imported {
        format: super::Format::CTranslate2,
        origin: dir.to_path_buf(),
        model,
        weights,
        int8: stored == "int8",
        tokenizer,
        languages: None,
        engine: crate::config::Engine::CTranslate2,
        beam: 2,
        length_penalty: 1.0,
        max_length: 256,
        notes,
        target_prefix: Vec::new(),
        replace_unknowns: false,
        alignment: (alignment_layer, alignment_heads),
    })
}

/// The variables of a `model.bin` under CTranslate2's current names, and which were read.
struct Spec {
    bin: ModelBin,
    used: BTreeSet<String>,
}

impl Spec {
    fn new(mut bin: ModelBin) -> Result<Self> {
        if !bin.spec.is_empty() && !bin.spec.starts_with("Transformer") {
            return Err(Error::Checkpoint {
                path: bin.path.clone(),
                msg: format!(
                    "a {} model: this reader runs CTranslate2's encoder-decoder Transformer \
                     (TransformerSpec, TransformerBase, TransformerBig) only",
                    bin.spec
                ),
            });
        }
        if bin.revision > 7 {
            return Err(Error::Checkpoint {
                path: bin.path.clone(),
                msg: format!(
                    "TransformerSpec revision {}: this reader knows revisions 1 to 7 (a newer \
                     CTranslate2 wrote it)",
                    bin.revision
                ),
            });
        }
        if bin.revision == 1 {
            bin.variables = std::mem::take(&mut bin.variables)
                .into_iter()
                .map(|(n, v)| (v1_name(&n), v))
                .collect();
        }
        Ok(Self {
            bin,
            used: BTreeSet::new(),
        })
    }

    fn err(&self, msg: String) -> Error {
        Error::Checkpoint {
            path: self.bin.path.clone(),
            msg,
        }
    }

    fn has(&self, name: &str) -> bool {
        self.bin.variables.contains_key(name)
    }

    fn var(&mut self, name: &str) -> Result<&Variable> {
        self.used.insert(name.to_string());
        self.bin
            .variables
            .get(name)
            .ok_or_else(|| Error::Checkpoint {
                path: self.bin.path.clone(),
                msg: format!("no variable {name}: not a complete Transformer model"),
            })
    }

    /// A scalar attribute (marked read), `None` when absent.
    fn scalar(&mut self, name: &str) -> Option<f64> {
        if !self.has(name) {
            return None;
        }
        self.used.insert(name.to_string());
        self.bin.variables[name].values().first().copied()
    }

    /// A string attribute (UTF-8 bytes stored as int8).
    fn string(&mut self, name: &str) -> Option<String> {
        if !self.has(name) {
            return None;
        }
        self.used.insert(name.to_string());
        let v = &self.bin.variables[name];
        String::from_utf8(v.data.clone()).ok()
    }

    /// The attribute `name` of a stack (`encoder/name`, revision 5 on) or of the model (its
    /// root name, before).
    fn stack_scalar(&mut self, stack: &str, name: &str) -> Option<f64> {
        self.scalar(&format!("{stack}/{name}"))
            .or_else(|| self.scalar(name))
    }

    /// A weight in f32 with its shape: float types converted, int8 (one scale per row) and
    /// int16 (one scale) dequantized with the scale stored beside it.
    fn weight(&mut self, name: &str) -> Result<Matrix> {
        let v = self.var(name)?.clone();
        let values = v.values();
        let out: Vec<f32> = match v.dtype {
            DType::F32 | DType::F16 | DType::Bf16 => values.iter().map(|&x| x as f32).collect(),
            DType::I8 | DType::I16 => {
                let scale_name = format!("{name}_scale");
                let scales = match self.has(&scale_name) {
                    true => self.var(&scale_name)?.values(),
                    false if v.dtype == DType::I16 => vec![DEFAULT_INT16_SCALE],
                    false => {
                        return Err(self.err(format!(
                            "{name} is int8 without {scale_name}: the model is damaged"
                        )))
                    }
                };
                let rows = v.dims.first().copied().unwrap_or(1).max(1);
                let cols = v.len() / rows;
                match scales.len() {
                    1 => values.iter().map(|&q| (q / scales[0]) as f32).collect(),
                    n if n == rows => values
                        .chunks(cols.max(1))
                        .zip(&scales)
                        .flat_map(|(row, &s)| row.iter().map(move |&q| (q / s) as f32))
                        .collect(),
                    n => {
                        return Err(self.err(format!(
                            "{scale_name} has {n} scales for the {rows} rows of {name}"
                        )))
                    }
                }
            }
            DType::I32 => {
                return Err(self.err(format!("{name} is int32, not a weight type")));
            }
        };
        Ok((out, v.dims))
    }

    /// The weight and bias of a linear layer (a missing bias as zeros).
    fn linear(&mut self, scope: &str) -> Result<(Matrix, Vec<f32>)> {
        let w = self.weight(&format!("{scope}/weight"))?;
        let rows = w.1[0];
        let bias = match self.has(&format!("{scope}/bias")) {
            true => self.weight(&format!("{scope}/bias"))?.0,
            false => vec![0.0; rows],
        };
        Ok((w, bias))
    }

    /// The stored type of the model's weights, for the log (and whether it decodes in int8).
    fn weight_type(&self) -> &'static str {
        let types: BTreeSet<&'static str> = self
            .bin
            .variables
            .iter()
            .filter(|(n, v)| n.ends_with("/weight") && !v.dims.is_empty())
            .map(|(_, v)| v.dtype.name())
            .collect();
        // The narrowest type any weight has: an int8 model keeps some in float32 at most.
        ["int8", "int16", "float16", "bfloat16", "float32"]
            .into_iter()
            .find(|t| types.contains(t))
            .unwrap_or("float32")
    }

    /// The number of `layer_<i>` of a stack.
    fn layers(&self, stack: &str) -> usize {
        let prefix = format!("{stack}/layer_");
        self.bin
            .variables
            .keys()
            .filter_map(|n| {
                n.strip_prefix(&prefix)?
                    .split('/')
                    .next()?
                    .parse::<usize>()
                    .ok()
            })
            .map(|i| i + 1)
            .max()
            .unwrap_or(0)
    }

    /// The architecture and the weights under this project's names.
    fn model(&mut self, config: &Ct2Config) -> Result<(Seq2SeqConfig, Weights, &'static str)> {
        let stored = self.weight_type();
        for unsupported in [
            (
                "encoder/layernorm_embedding/gamma",
                "a layer norm after the embeddings",
            ),
            (
                "decoder/layernorm_embedding/gamma",
                "a layer norm after the embeddings",
            ),
            ("encoder/embeddings_1/weight", "source features"),
            ("decoder/scale_outputs", "scaled decoder outputs"),
        ] {
            if self.has(unsupported.0) {
                return Err(self.unsupported(unsupported.1, unsupported.0));
            }
        }
        for flag in [
            "decoder/alibi",
            "encoder/multi_query_attention",
            "decoder/multi_query_attention",
        ] {
            if self.scalar(flag).unwrap_or(0.0) != 0.0 {
                return Err(self.unsupported(flag.rsplit('/').next().unwrap_or(flag), flag));
            }
        }
        for flag in [
            "decoder/alibi_use_positive_positions",
            "decoder/scale_alibi",
        ] {
            self.scalar(flag);
        }
        let heads_default = if self.bin.spec == "TransformerBig" {
            16.0
        } else {
            8.0
        };
        let mut stack_settings = Vec::new();
        for stack in ["encoder", "decoder"] {
            let heads = self
                .stack_scalar(stack, "num_heads")
                .unwrap_or(heads_default) as usize;
            let pre_norm = self.stack_scalar(stack, "pre_norm").unwrap_or(1.0) != 0.0;
            let activation = match self.stack_scalar(stack, "activation").unwrap_or(0.0) as i64 {
                0 => Activation::Relu,
                1 => Activation::GeluTanh,
                2 => Activation::Swish,
                3 => Activation::Gelu,
                4 => return Err(self.unsupported("the GELU sigmoid approximation", stack)),
                5 => return Err(self.unsupported("the tanh activation", stack)),
                6 => return Err(self.unsupported("the sigmoid activation", stack)),
                a => return Err(self.unsupported(&format!("activation {a}"), stack)),
            };
            self.stack_scalar(stack, "embeddings_merge");
            stack_settings.push((heads, pre_norm, activation));
        }
        self.scalar("decoder/alignment_layer");
        self.scalar("decoder/alignment_heads");
        self.scalar("alignment_layer");
        self.scalar("alignment_heads");
        if stack_settings[0] != stack_settings[1] {
            return Err(self.err(format!(
                "the encoder (heads, pre-norm, activation) {:?} and the decoder {:?} differ: \
                 this project's Transformer has one setting for both",
                stack_settings[0], stack_settings[1]
            )));
        }
        let (nhead, norm_first, activation) = stack_settings[0];
        let src_emb_name = if self.has("encoder/embeddings/weight") {
            "encoder/embeddings/weight"
        } else {
            "encoder/embeddings_0/weight"
        };
        let (src_emb, src_dims) = self.weight(src_emb_name)?;
        let (tgt_emb, tgt_dims) = self.weight("decoder/embeddings/weight")?;
        let d_model = src_dims[1];
        let scale = self.embedding_scale(d_model)?;
        let zero_start = self
            .scalar("decoder/start_from_zero_embedding")
            .unwrap_or(0.0)
            != 0.0;
        let final_norms = [
            self.has("encoder/layer_norm/gamma"),
            self.has("decoder/layer_norm/gamma"),
        ];
        if final_norms[0] != final_norms[1] {
            return Err(self
                .err("one stack has a final layer norm and the other none: not supported".into()));
        }
        let learned = [
            self.has("encoder/position_encodings/encodings"),
            self.has("decoder/position_encodings/encodings"),
        ];
        if learned[0] != learned[1] {
            return Err(self.err(
                "one stack has learned positions and the other the sinusoidal table: not \
                 supported"
                    .into(),
            ));
        }
        let mut w = Weights::new();
        let max_len = if learned[0] {
            let (pe_src, d1) = self.weight("encoder/position_encodings/encodings")?;
            let (pe_tgt, d2) = self.weight("decoder/position_encodings/encodings")?;
            let rows = d1[0].min(d2[0]);
            w.insert(
                "src_positions.weight",
                pe_src[..rows * d_model].to_vec(),
                &[rows, d_model],
            );
            w.insert(
                "tgt_positions.weight",
                pe_tgt[..rows * d_model].to_vec(),
                &[rows, d_model],
            );
            rows
        } else {
            BUILTIN_POSITIONS
        };
        let ((out_w, out_dims), out_b) = self.linear("decoder/projection")?;
        let shared_src = src_emb == tgt_emb && src_dims == tgt_dims;
        let tied_out = out_w == tgt_emb && out_dims == tgt_dims;
        let share = shared_src && tied_out;
        w.insert("src_embedding.weight", src_emb, &src_dims);
        if !share {
            w.insert("tgt_embedding.weight", tgt_emb, &tgt_dims);
            w.insert("generator.weight", out_w, &out_dims);
        }
        w.insert("generator.bias", out_b, &[out_dims[0]]);
        let mut ff = 0;
        let (enc_layers, dec_layers) = (self.layers("encoder"), self.layers("decoder"));
        for (stack, layers) in [("encoder", enc_layers), ("decoder", dec_layers)] {
            for i in 0..layers {
                let src = format!("{stack}/layer_{i}");
                let dst = format!("transformer.{stack}.layers.{i}");
                // (CTranslate2's scope, ours, the linear layers) of each attention: a decoder
                // layer's encoder-decoder attention comes second.
                let mut attentions = vec![("self_attention", "self_attn", SELF_ATTENTION)];
                if stack == "decoder" {
                    attentions.push(("attention", "multihead_attn", CROSS_ATTENTION));
                }
                // Each sublayer is followed by its norm: norm1, norm2 (and norm3).
                for (k, &(scope, name, layout)) in attentions.iter().enumerate() {
                    let (attn, attn_dst) = (format!("{src}/{scope}"), format!("{dst}.{name}"));
                    let norm = format!("{dst}.norm{}", k + 1);
                    self.attention(&mut w, &attn, &attn_dst, &norm, layout, d_model)?;
                }
                ff = self.ffn(&mut w, &format!("{src}/ffn"), &dst)?;
                let ffn_norm = format!("{dst}.norm{}", attentions.len() + 1);
                self.norm(&mut w, &format!("{src}/ffn/layer_norm"), &ffn_norm)?;
            }
        }
        if final_norms[0] {
            self.norm(&mut w, "encoder/layer_norm", "transformer.encoder.norm")?;
            self.norm(&mut w, "decoder/layer_norm", "transformer.decoder.norm")?;
        }
        let unread: Vec<&String> = self
            .bin
            .variables
            .keys()
            .filter(|n| !self.used.contains(*n) && !is_config_attribute(n))
            .collect();
        if let Some(first) = unread.first() {
            return Err(self.err(format!(
                "the variable {first} (and {} more) is a feature this reader does not support \
                 (it reads CTranslate2's encoder-decoder Transformer without relative \
                 positions, GLU feed-forward layers or RMS norms)",
                unread.len() - 1
            )));
        }
        if enc_layers == 0 || dec_layers == 0 {
            return Err(self.err("no encoder or no decoder layers".into()));
        }
        let transformer = TransformerConfig {
            d_model,
            nhead,
            num_encoder_layers: enc_layers,
            num_decoder_layers: dec_layers,
            dim_feedforward: ff,
            dropout: 0.1,
            activation,
            layer_norm_eps: config.layer_norm_eps,
            norm_first,
            max_len,
            final_norm: final_norms[0],
        };
        let model = Seq2SeqConfig {
            transformer,
            src_vocab: src_dims[0],
            tgt_vocab: tgt_dims[0],
            share_embeddings: share,
            inputs: Inputs {
                scale_embeddings: scale,
                positions: if learned[0] {
                    Positions::Learned
                } else {
                    Positions::Timing
                },
                zero_start_embedding: zero_start,
            },
        };
        model
            .validate()
            .map_err(|e| self.err(format!("the model it describes: {e}")))?;
        Ok((model, w, stored))
    }

    fn unsupported(&self, feature: &str, name: &str) -> Error {
        self.err(format!(
            "{name}: {feature} is not supported by this reader (the model would translate \
             wrongly; nothing was imported)"
        ))
    }

    /// Whether the embeddings are multiplied by sqrt(d_model): the `scale_embeddings` flag
    /// (absent: yes), or a value that must be sqrt(d_model) or 1.
    fn embedding_scale(&mut self, d_model: usize) -> Result<bool> {
        let mut scaled = Vec::new();
        for stack in ["encoder", "decoder"] {
            let name = format!("{stack}/scale_embeddings");
            let old = format!("{stack}/embeddings/multiply_by_sqrt_depth");
            let (var, key) = match (self.has(&name), self.has(&old)) {
                (true, _) => (self.var(&name)?.clone(), name),
                (false, true) => (self.var(&old)?.clone(), old),
                (false, false) => {
                    scaled.push(true);
                    continue;
                }
            };
            let value = var.values().first().copied().unwrap_or(1.0);
            scaled.push(match var.dtype {
                DType::I8 => value != 0.0,
                _ if value == 1.0 => false,
                _ if (value - (d_model as f64).sqrt()).abs() < 1e-4 => true,
                _ => {
                    return Err(self.unsupported(
                        &format!("an embedding scale of {value} (only sqrt(d_model) or 1)"),
                        &key,
                    ))
                }
            });
        }
        if scaled[0] != scaled[1] {
            return Err(self.err(
                "the encoder's embeddings are scaled and the decoder's not (or the reverse): \
                 not supported"
                    .into(),
            ));
        }
        Ok(scaled[0])
    }

    fn norm(&mut self, w: &mut Weights, src: &str, dst: &str) -> Result<()> {
        if !self.has(&format!("{src}/beta")) && self.has(&format!("{src}/gamma")) {
            return Err(self.unsupported("an RMS norm (a layer norm without beta)", src));
        }
        let (g, dims) = self.weight(&format!("{src}/gamma"))?;
        let (b, _) = self.weight(&format!("{src}/beta"))?;
        w.insert(&format!("{dst}.weight"), g, &dims);
        w.insert(&format!("{dst}.bias"), b, &dims);
        Ok(())
    }

    /// The attention `src` as `dst`: its linear layers `linear_0`, `linear_1`, ... in the
    /// `layout` of [`SELF_ATTENTION`] or [`CROSS_ATTENTION`], the output projection after
    /// them, then its layer norm as `norm`.
    fn attention(
        &mut self,
        w: &mut Weights,
        src: &str,
        dst: &str,
        norm: &str,
        layout: &[&[&str]],
        c: usize,
    ) -> Result<()> {
        self.no_relative(src)?;
        for (i, parts) in layout.iter().enumerate() {
            self.split_rows(w, &format!("{src}/linear_{i}"), dst, parts, c)?;
        }
        let out = format!("{src}/linear_{}", layout.len());
        self.output_projection(w, &out, dst, c)?;
        self.norm(w, &format!("{src}/layer_norm"), norm)
    }

    /// The linear layer `fused`, whose rows are the (C, C) projections `parts` stacked in
    /// that order, as `dst.<part>`.
    fn split_rows(
        &mut self,
        w: &mut Weights,
        fused: &str,
        dst: &str,
        parts: &[&str],
        c: usize,
    ) -> Result<()> {
        let ((rows, dims), bias) = self.linear(fused)?;
        if dims != [parts.len() * c, c] {
            return Err(self.err(format!(
                "{fused}/weight has shape {dims:?}, not [{}, {c}]",
                parts.len() * c
            )));
        }
        for (i, p) in parts.iter().enumerate() {
            let weight = rows[i * c * c..(i + 1) * c * c].to_vec();
            w.insert(&format!("{dst}.{p}.weight"), weight, &[c, c]);
            w.insert(
                &format!("{dst}.{p}.bias"),
                bias[i * c..(i + 1) * c].to_vec(),
                &[c],
            );
        }
        Ok(())
    }

    /// The attention's output projection `src` as `dst.out_proj`.
    fn output_projection(&mut self, w: &mut Weights, src: &str, dst: &str, c: usize) -> Result<()> {
        self.split_rows(w, src, dst, &["out_proj"], c)
    }

    fn no_relative(&self, scope: &str) -> Result<()> {
        for feature in [
            "relative_position_keys",
            "relative_attention_bias",
            "relative_asymmetric_position_keys",
            "queries_scale",
        ] {
            let name = format!("{scope}/{feature}");
            if self.has(&name) {
                return Err(self.unsupported(feature, &name));
            }
        }
        Ok(())
    }

    /// The feed-forward block; returns its inner width.
    fn ffn(&mut self, w: &mut Weights, src: &str, dst: &str) -> Result<usize> {
        if self.has(&format!("{src}/linear_0_noact/weight")) {
            return Err(self.unsupported("a gated (GLU) feed-forward layer", src));
        }
        let ((w1, d1), b1) = self.linear(&format!("{src}/linear_0"))?;
        let ((w2, d2), b2) = self.linear(&format!("{src}/linear_1"))?;
        w.insert(&format!("{dst}.linear1.weight"), w1, &d1);
        w.insert(&format!("{dst}.linear1.bias"), b1, &[d1[0]]);
        w.insert(&format!("{dst}.linear2.weight"), w2, &d2);
        w.insert(&format!("{dst}.linear2.bias"), b2, &[d2[0]]);
        Ok(d1[0])
    }
}

/// A self-attention's linear layers: fused (3C, C) query/key/value rows.
const SELF_ATTENTION: &[&[&str]] = &[&["q_proj", "k_proj", "v_proj"]];

/// An encoder-decoder attention's linear layers: the query projection, then fused (2C, C)
/// key/value rows.
const CROSS_ATTENTION: &[&[&str]] = &[&["q_proj"], &["k_proj", "v_proj"]];

/// The root attributes that `config.json` replaced (read by [`read_config`]).
fn is_config_attribute(name: &str) -> bool {
    matches!(
        name,
        "unk_token"
            | "bos_token"
            | "eos_token"
            | "with_source_bos"
            | "with_source_eos"
            | "with_target_bos"
            | "user_decoder_start_tokens"
    )
}

/// CTranslate2's renaming of binary version 1's OpenNMT-tf names (`transformer.cc`,
/// `map_v1_variable_name`): each replacement of its first occurrence, in order.
fn v1_name(name: &str) -> String {
    let mut n = name.to_string();
    for (from, to) in [
        ("transformer/", ""),
        (":0", ""),
        ("w_embs", "embeddings/weight"),
        ("kernel", "weight"),
        ("LayerNorm", "layer_norm"),
        ("dense", "projection"),
        ("conv1d_", "linear_"),
        ("conv1d", "linear_0"),
    ] {
        n = n.replacen(from, to, 1);
    }
    if n.contains("encoder") {
        n = n.replacen("multi_head", "self_attention", 1);
    } else {
        n = n.replacen("masked_multi_head", "self_attention", 1);
        n = n.replacen("multi_head", "attention", 1);
    }
    n
}

/// `config.json` (binary version 6), or the same settings from the model's attributes.
fn read_config(dir: &Path, spec: &mut Spec) -> Result<Ct2Config> {
    let path = dir.join("config.json");
    let flag = |spec: &mut Spec, name: &str, default: bool| {
        spec.scalar(name).map_or(default, |v| v != 0.0)
    };
    if path.exists() {
        let v = read_json(&path)?;
        let s = |k: &str, d: &str| v[k].as_str().unwrap_or(d).to_string();
        let eps = v["layer_norm_epsilon"].as_f64().unwrap_or(1e-5);
        if v["multi_query_attention"].as_bool() == Some(true) {
            return Err(Error::Config {
                path,
                msg: "multi_query_attention: not supported by this reader".into(),
            });
        }
        return Ok(Ct2Config {
            unk: s("unk_token", "<unk>"),
            bos: s("bos_token", "<s>"),
            eos: s("eos_token", "</s>"),
            decoder_start: v["decoder_start_token"].as_str().map(str::to_string),
            add_source_bos: v["add_source_bos"].as_bool().unwrap_or(false),
            add_source_eos: v["add_source_eos"].as_bool().unwrap_or(false),
            layer_norm_eps: eps,
        });
    }
    let unk = spec.string("unk_token").unwrap_or_else(|| "<unk>".into());
    let bos = spec.string("bos_token").unwrap_or_else(|| "<s>".into());
    let eos = spec.string("eos_token").unwrap_or_else(|| "</s>".into());
    let add_source_bos = flag(spec, "with_source_bos", false);
    let add_source_eos = flag(spec, "with_source_eos", false);
    let user_start = flag(spec, "user_decoder_start_tokens", false);
    let target_bos = flag(spec, "with_target_bos", true);
    let decoder_start = match (user_start, target_bos) {
        (true, _) => None,
        (false, true) => Some(bos.clone()),
        (false, false) => Some(eos.clone()),
    };
    Ok(Ct2Config {
        unk,
        bos,
        eos,
        decoder_start,
        add_source_bos,
        add_source_eos,
        layer_norm_eps: 1e-5,
    })
}

/// The first of `names` in `dir` that exists.
fn first_file(dir: &Path, names: &[&str]) -> Option<std::path::PathBuf> {
    names.iter().map(|n| dir.join(n)).find(|p| p.exists())
}

/// A vocabulary file: a JSON list of tokens, or one token per line (a trailing `\r` dropped
/// from every line only when every line has one, as CTranslate2 reads them).
fn read_vocabulary(path: &Path) -> Result<Vec<String>> {
    let text = read_text(path)?;
    if path.extension().is_some_and(|e| e == "json") {
        return serde_json::from_str(&text).map_err(|e| Error::Config {
            path: path.into(),
            msg: format!("not a JSON list of tokens: {e}"),
        });
    }
    let mut lines: Vec<&str> = text.split('\n').collect();
    if lines.last() == Some(&"") {
        lines.pop();
    }
    let all_cr = !lines.is_empty() && lines.iter().all(|l| l.ends_with('\r'));
    Ok(lines
        .into_iter()
        .map(|l| if all_cr { &l[..l.len() - 1] } else { l }.to_string())
        .collect())
}

/// The source and target token lists.
fn read_vocabularies(dir: &Path) -> Result<(Vec<String>, Vec<String>)> {
    if let Some(p) = first_file(dir, &["shared_vocabulary.json", "shared_vocabulary.txt"]) {
        let v = read_vocabulary(&p)?;
        return Ok((v.clone(), v));
    }
    let src = first_file(dir, &["source_vocabulary.json", "source_vocabulary.txt"]);
    let tgt = first_file(dir, &["target_vocabulary.json", "target_vocabulary.txt"]);
    match (src, tgt) {
        (Some(s), Some(t)) => Ok((read_vocabulary(&s)?, read_vocabulary(&t)?)),
        _ => Err(Error::Usage(format!(
            "{}: no vocabulary (shared_vocabulary.json/.txt, or source_vocabulary and \
             target_vocabulary): not a complete CTranslate2 model directory",
            dir.display()
        ))),
    }
}

/// The tokenizer: the vocabularies (`<unk>` appended where a list lacks it, as CTranslate2
/// does), the special ids and the source framing; sizes checked against the weights.
fn tokenizer(
    dir: &Path,
    config: &Ct2Config,
    mut src: Vec<String>,
    mut tgt: Vec<String>,
    (src_split, tgt_split): (Splitter, Splitter),
    model: &Seq2SeqConfig,
) -> Result<PublishedTokenizer> {
    for v in [&mut src, &mut tgt] {
        if !v.contains(&config.unk) {
            v.push(config.unk.clone());
        }
    }
    let bad = |msg: String| Error::Config {
        path: dir.into(),
        msg,
    };
    if src.len() != model.src_vocab || tgt.len() != model.tgt_vocab {
        return Err(bad(format!(
            "the vocabularies have {} source and {} target tokens but the weights are for {} \
             and {}: the vocabulary files are not this model's",
            src.len(),
            tgt.len(),
            model.src_vocab,
            model.tgt_vocab
        )));
    }
    // The first of duplicate tokens keeps the token's id, as CTranslate2 reads them.
    let unk_of = |v: &[String], side: &str| {
        v.iter()
            .position(|t| *t == config.unk)
            .map(|i| i as u32)
            .ok_or_else(|| bad(format!("the {side} vocabulary has no {:?}", config.unk)))
    };
    let (src_unk, tgt_unk) = (unk_of(&src, "source")?, unk_of(&tgt, "target")?);
    let source = Vocabulary::new(src, src_unk);
    let target = Vocabulary::new(tgt, tgt_unk);
    let id = |v: &Vocabulary, t: &str, side: &str| {
        v.id(t)
            .ok_or_else(|| bad(format!("the {side} vocabulary has no {t:?}")))
    };
    let start = config.decoder_start.as_deref().ok_or_else(|| {
        bad(
            "the model has no decoder start token (it expects one in every target prefix): \
             not supported"
                .into(),
        )
    })?;
    let specials = Specials {
        // The padding id is settled by `with_padding`.
        pad: src_unk,
        bos: id(&target, start, "target")?,
        eos: id(&target, &config.eos, "target")?,
        unk: src_unk,
        source_end: match config.add_source_eos {
            true => Some(id(&source, &config.eos, "source")?),
            false => None,
        },
    };
    let source_prefix = match config.add_source_bos {
        true => vec![id(&source, &config.bos, "source")?],
        false => Vec::new(),
    };
    Ok(PublishedTokenizer {
        source: Side {
            splitter: src_split,
            vocab: source,
        },
        target: Side {
            splitter: tgt_split,
            vocab: target,
        },
        specials,
        source_prefix,
        language_tags: false,
        skip_unknown: false,
        strip_prefix: None,
    })
}

/// A padding id for the source, which this project's model masks by id (CTranslate2 masks
/// by length): `<blank>` or `<pad>` when the source vocabulary has one; otherwise a new
/// source token whose embedding row is zero, the source embedding then its own matrix.
pub(crate) fn with_padding(
    mut model: Seq2SeqConfig,
    mut weights: Weights,
    mut tok: PublishedTokenizer,
    notes: &mut Vec<String>,
) -> Result<(Seq2SeqConfig, Weights, PublishedTokenizer)> {
    if let Some(pad) = ["<blank>", "<pad>"]
        .iter()
        .find_map(|t| tok.source.vocab.id(t))
    {
        tok.specials.pad = pad;
        return Ok((model, weights, tok));
    }
    let c = model.transformer.d_model;
    let v = model.src_vocab;
    let emb = weights.get("src_embedding.weight").expect("read").to_vec();
    if model.share_embeddings {
        weights.insert("tgt_embedding.weight", emb.clone(), &[v, c]);
        let out = emb.clone();
        weights.insert("generator.weight", out, &[v, c]);
        model.share_embeddings = false;
    }
    let mut padded = emb;
    padded.extend(std::iter::repeat_n(0.0, c));
    weights.insert("src_embedding.weight", padded, &[v + 1, c]);
    model.src_vocab = v + 1;
    let mut tokens = tok.source.vocab.tokens().to_vec();
    tokens.push("<pad>".into());
    let unk = tok.source.vocab.unk();
    tok.source.vocab = Vocabulary::new(tokens, unk);
    tok.specials.pad = v as u32;
    notes.push(format!(
        "the source vocabulary has no padding token: <pad> added as source id {v}, with a \
         zero embedding"
    ));
    Ok((model, weights, tok))
}
