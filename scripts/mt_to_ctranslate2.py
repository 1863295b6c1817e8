#!/usr/bin/env python3
"""Converts a trained `transformer mt` run to a CTranslate2 model directory, for
`scripts/bench_mt_ct2.py`.

The model is built with CTranslate2's own model-specification API
(`ctranslate2.specs.TransformerSpec`) and our weights are put into it one by one:

  - layers: post-norm (`LayerNorm(x + sublayer(x))`), ReLU, 8 heads as in the run; the
    encoder's and the decoder's self-attention take one fused (3C, C) input projection
    whose rows are the query, key and value projections stacked in that order (PyTorch's
    `in_proj_weight` layout), the encoder-decoder attention a (C, C) query projection and a
    fused (2C, C) key/value projection;
  - the final LayerNorm after each stack: `nn.Transformer` (and ours) keep one even in the
    post-norm arrangement, while `TransformerSpec.from_config(pre_norm=False)` leaves it out.
    CTranslate2's engine applies a stack's `layer_norm` whenever the model file has one, so
    the spec is built with `pre_norm=True` (which declares it) and its `pre_norm` flag then
    set to False (which makes every layer post-norm);
  - embeddings multiplied by sqrt(d_model) (`scale_embeddings`, CTranslate2's default);
  - positions: our exact sinusoid table (interleaved sin/cos from position 0) stored as the
    `position_encodings/encodings` variable. CTranslate2's built-in table (sin block then
    cos block, positions from 1) is a different function and would change every output;
  - with shared embeddings, the one matrix is the source embedding, the target embedding
    and the output projection's weight (CTranslate2 stores it once, as aliases), and
    `generator.bias` is the output projection's bias;
  - LayerNorm epsilon from the run (1e-5 by default).

Vocabulary: the token ids themselves, "0" ... "V-1", for source and target, so CTranslate2
reads and writes id strings and no tokenizer can differ from ours. The special tokens are
mapped by id: unk "3", bos "1" (also the decoder's start token), eos "2"; the source is
given with its `<eos>` ("2") already appended, so `add_source_eos` stays off. Padding
needs no token: CTranslate2 masks by length.

Example:

  scripts/mt_to_ctranslate2.py --run runs/de-en --out runs/de-en-ct2
"""

import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mt_run  # noqa: E402

import ctranslate2  # noqa: E402
from ctranslate2.specs import common_spec, transformer_spec  # noqa: E402


def set_inputs(stack, embeddings, weight, pe):
    """A stack's input: the embedding matrix (scaled by sqrt(d_model), section 3.4) and the
    sinusoidal position table."""
    embeddings.weight = weight
    stack.scale_embeddings = True
    stack.position_encodings.encodings = pe


def set_linear(spec, weight, bias):
    spec.weight = np.ascontiguousarray(weight, dtype=np.float32)
    spec.bias = np.ascontiguousarray(bias, dtype=np.float32)


def set_norm(spec, w, name):
    spec.gamma = w[f"{name}.weight"]
    spec.beta = w[f"{name}.bias"]


def set_self_attention(spec, w, name):
    """Fused (3C, C) query/key/value projection, then the output projection."""
    ws, bs = mt_run.attention_qkv(w, name)
    set_linear(spec.linear[0], np.concatenate(ws, 0), np.concatenate(bs, 0))
    set_linear(spec.linear[1], w[f"{name}.out_proj.weight"], w[f"{name}.out_proj.bias"])


def set_cross_attention(spec, w, name):
    """Query projection, fused (2C, C) key/value projection, output projection."""
    (wq, wk, wv), (bq, bk, bv) = mt_run.attention_qkv(w, name)
    set_linear(spec.linear[0], wq, bq)
    set_linear(spec.linear[1], np.concatenate([wk, wv], 0), np.concatenate([bk, bv], 0))
    set_linear(spec.linear[2], w[f"{name}.out_proj.weight"], w[f"{name}.out_proj.bias"])


def set_ffn(spec, w, name):
    set_linear(spec.linear_0, w[f"{name}.linear1.weight"], w[f"{name}.linear1.bias"])
    set_linear(spec.linear_1, w[f"{name}.linear2.weight"], w[f"{name}.linear2.bias"])


def build_spec(run: mt_run.Run) -> transformer_spec.TransformerSpec:
    t = run.transformer
    w = run.weights
    spec = transformer_spec.TransformerSpec.from_config(
        (t["num_encoder_layers"], t["num_decoder_layers"]),
        t["nhead"],
        # Declares the final LayerNorm of each stack; the layers become post-norm below
        # (unless the run is pre-norm). See the module documentation.
        pre_norm=True,
        activation=common_spec.Activation.RELU,
    )
    post_norm = not t["norm_first"]
    spec.encoder.pre_norm = not post_norm
    spec.decoder.pre_norm = not post_norm

    emb = w["src_embedding.weight"]
    tgt_emb = emb if run.share_embeddings else w["tgt_embedding.weight"]
    out_w = emb if run.share_embeddings else w["generator.weight"]
    pe = mt_run.sinusoid_table(t["max_len"], t["d_model"])

    # Encoder.
    set_inputs(spec.encoder, spec.encoder.embeddings[0], emb, pe)
    for i, layer in enumerate(spec.encoder.layer):
        p = f"transformer.encoder.layers.{i}"
        set_self_attention(layer.self_attention, w, f"{p}.self_attn")
        # Post-norm: the attention block's norm is applied after its residual add (norm1),
        # the feed-forward block's after its own (norm2).
        set_norm(layer.self_attention.layer_norm, w, f"{p}.norm1")
        set_ffn(layer.ffn, w, p)
        set_norm(layer.ffn.layer_norm, w, f"{p}.norm2")
    set_norm(spec.encoder.layer_norm, w, "transformer.encoder.norm")

    # Decoder.
    set_inputs(spec.decoder, spec.decoder.embeddings, tgt_emb, pe)
    for i, layer in enumerate(spec.decoder.layer):
        p = f"transformer.decoder.layers.{i}"
        set_self_attention(layer.self_attention, w, f"{p}.self_attn")
        set_norm(layer.self_attention.layer_norm, w, f"{p}.norm1")
        set_cross_attention(layer.attention, w, f"{p}.multihead_attn")
        set_norm(layer.attention.layer_norm, w, f"{p}.norm2")
        set_ffn(layer.ffn, w, p)
        set_norm(layer.ffn.layer_norm, w, f"{p}.norm3")
    set_norm(spec.decoder.layer_norm, w, "transformer.decoder.norm")
    set_linear(spec.decoder.projection, out_w, w["generator.bias"])

    # Vocabularies: the ids as strings; specials by id.
    spec.register_source_vocabulary([str(i) for i in range(run.src_vocab)])
    spec.register_target_vocabulary([str(i) for i in range(run.tgt_vocab)])
    cfg = spec.config
    cfg.unk_token = str(mt_run.UNK)
    cfg.bos_token = str(mt_run.BOS)
    cfg.eos_token = str(mt_run.EOS)
    cfg.decoder_start_token = str(mt_run.BOS)
    cfg.add_source_bos = False
    cfg.add_source_eos = False
    cfg.layer_norm_epsilon = float(t["layer_norm_eps"])
    return spec


def main():
    p = mt_run.argument_parser(__doc__)
    p.add_argument("--run", required=True, help="run directory (config.toml, best.safetensors)")
    p.add_argument("--out", required=True, help="CTranslate2 model directory to write")
    p.add_argument("--quantization", default="float32",
                   help="weight type CTranslate2 stores (float32, the default; or int8, "
                        "bfloat16, ...: then outputs no longer match ours exactly)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--vocab-map", action="store_true",
                   help="also convert the run's vocabulary map (vocab_map.json, written by "
                        "`transformer mt vocab-map`) into CTranslate2's vmap, so that "
                        "translate_batch(use_vmap=True) restricts the output vocabulary to the "
                        "same candidates as `--restrict-vocab`")
    a = p.parse_args()

    run = mt_run.load_run(a.run)
    spec = build_spec(run)
    if a.vocab_map:
        # CTranslate2's format: `<source n-gram>\t<target tokens>` per line, the empty n-gram
        # for the tokens every sentence may use; tokens here are the ids as strings.
        vm = json.load(open(os.path.join(a.run, "vocab_map.json")))
        vmap = os.path.join(a.run, "vmap.ct2.txt")
        with open(vmap, "w") as f:
            f.write("\t" + " ".join(map(str, vm["always"])) + "\n")
            for src, tgts in enumerate(vm["by_source"]):
                if tgts:
                    f.write(f"{src}\t" + " ".join(map(str, tgts)) + "\n")
        spec.register_vocabulary_mapping(vmap)
    spec.validate()
    spec.optimize(quantization=a.quantization)
    if os.path.exists(a.out):
        if not a.force:
            raise SystemExit(f"{a.out} exists (pass --force to replace it)")
        shutil.rmtree(a.out)
    os.makedirs(a.out)
    spec.save(a.out)
    print(f"wrote {a.out} (CTranslate2 {ctranslate2.__version__}, {a.quantization}): "
          f"{run.transformer['num_encoder_layers']}+{run.transformer['num_decoder_layers']} "
          f"layers, d_model {run.transformer['d_model']}, vocabulary {run.src_vocab}/"
          f"{run.tgt_vocab}, shared embeddings {run.share_embeddings}")


if __name__ == "__main__":
    main()
