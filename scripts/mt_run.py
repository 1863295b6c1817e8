"""Reading a `transformer mt` run directory from Python, for the translation benchmarks
(`scripts/bench_mt_torch.py`, `scripts/mt_to_ctranslate2.py`, `scripts/bench_mt_ct2.py`).

A run directory written by `transformer mt train --out DIR` holds:

  - `config.toml`: the training configuration; decoding reads `beam`, `length_penalty`,
    `max_len_a` and `max_len_b` from it (the longest output for a source of n tokens, its
    `<eos>` included, is `floor(max_len_a * n + max_len_b)` tokens before `<eos>`);
  - `best.safetensors`: the best weights, tagged `transformer-mt-weights/1`, with the model's
    configuration as JSON under the metadata key `model`;
  - `tokenizer.json`: the joint tokenizer, whose four special tokens have fixed ids
    (`<pad>` 0, `<bos>` 1, `<eos>` 2, `<unk>` 3).

Parameter names are PyTorch's `nn.Transformer` names under `transformer.`, except that each
attention's packed `in_proj_weight` / `in_proj_bias` is stored as three projections
`q_proj`, `k_proj`, `v_proj`; with shared embeddings the one embedding matrix is
`src_embedding.weight` (also the output layer's weight) and the output bias is
`generator.bias`.

Only numpy, safetensors and the standard library are needed here (no torch).
"""

import argparse
import json
import math
import os
import tomllib
from dataclasses import dataclass

import numpy as np
from safetensors import safe_open

# The weights file's format tag (crates/train/src/mt.rs, WEIGHTS_FORMAT).
WEIGHTS_FORMAT = "transformer-mt-weights/1"
# The special tokens and their fixed ids (crates/text/src/subword.rs, Specials::FIXED).
SPECIALS = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3}
PAD, BOS, EOS, UNK = 0, 1, 2, 3


@dataclass
class Run:
    """What the benchmarks need from a run directory."""

    path: str
    # The model's shape: d_model, nhead, num_encoder_layers, num_decoder_layers,
    # dim_feedforward, dropout, activation, layer_norm_eps, norm_first, max_len.
    transformer: dict
    src_vocab: int
    tgt_vocab: int
    share_embeddings: bool
    # Weights by our parameter names (any prefix in the file removed), float32.
    weights: dict
    # Decoding options from config.toml.
    beam: int
    length_penalty: float
    max_len_a: float
    max_len_b: int

    def max_len(self, src_len: int) -> int:
        """The most output tokens (before `<eos>`) for a source of `src_len` tokens (its
        `<eos>` included, padding excluded), as `DecodeOptions::max_len` computes it."""
        return int(math.floor(self.max_len_a * src_len + self.max_len_b))


def _model_config(meta: dict, path: str) -> dict:
    if meta.get("format") not in (None, WEIGHTS_FORMAT):
        raise SystemExit(f"{path}: format {meta.get('format')!r}, expected {WEIGHTS_FORMAT!r}")
    if "model" not in meta:
        raise SystemExit(f"{path}: no 'model' configuration in the metadata")
    cfg = json.loads(meta["model"])
    if "transformer" not in cfg:
        raise SystemExit(f"{path}: not a Transformer model (a recurrent baseline?): {cfg}")
    return cfg


def _strip_prefix(tensors: dict, path: str) -> dict:
    """Removes whatever prefix the names carry, located by the source embedding's name."""
    anchor = "src_embedding.weight"
    found = [n for n in tensors if n == anchor or n.endswith("." + anchor)]
    if len(found) != 1:
        raise SystemExit(f"{path}: expected one tensor named *{anchor}, found {found}")
    prefix = found[0][: -len(anchor)]
    return {n[len(prefix):]: t for n, t in tensors.items() if n.startswith(prefix)}


def check_tokenizer_specials(run_dir: str) -> None:
    """Checks that the run's tokenizer gives the special tokens the ids this code assumes."""
    path = os.path.join(run_dir, "tokenizer.json")
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        tok = json.load(f)
    added = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    for name, want in SPECIALS.items():
        if name in added and added[name] != want:
            raise SystemExit(f"{path}: {name} has id {added[name]}, expected {want}")


def load_run(run_dir: str) -> Run:
    """Reads config.toml and best.safetensors of a translation run."""
    cfg_path = os.path.join(run_dir, "config.toml")
    w_path = os.path.join(run_dir, "best.safetensors")
    for p in (cfg_path, w_path):
        if not os.path.exists(p):
            raise SystemExit(f"{p}: missing (train a model with `transformer mt train --out DIR`)")
    with open(cfg_path, "rb") as f:
        train_cfg = tomllib.load(f)
    check_tokenizer_specials(run_dir)
    with safe_open(w_path, framework="numpy") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k).astype(np.float32) for k in f.keys()}
    model_cfg = _model_config(meta, w_path)
    t = model_cfg["transformer"]
    if t.get("activation", "relu") != "relu":
        raise SystemExit(f"{w_path}: activation {t['activation']!r}; the scripts build ReLU models")
    return Run(
        path=run_dir,
        transformer=t,
        src_vocab=model_cfg["src_vocab"],
        tgt_vocab=model_cfg["tgt_vocab"],
        share_embeddings=bool(model_cfg.get("share_embeddings", False)),
        weights=_strip_prefix(tensors, w_path),
        beam=int(train_cfg.get("beam", 5)),
        length_penalty=float(train_cfg.get("length_penalty", 1.0)),
        max_len_a=float(train_cfg.get("max_len_a", 1.2)),
        max_len_b=int(train_cfg.get("max_len_b", 10)),
    )


def sinusoid_table(max_len: int, d_model: int) -> np.ndarray:
    """The positional encodings of section 3.5 exactly as `PositionalEncoding::table` computes
    them: interleaved, `PE(pos, 2i) = sin(pos * f_i)`, `PE(pos, 2i + 1) = cos(pos * f_i)`,
    `f_i = exp(2i * -ln(10000) / C)`, in float64, then cast to float32. Shape (max_len, C)."""
    pos = np.arange(max_len, dtype=np.float64)[:, None]
    freq = np.exp(np.arange(0, d_model, 2, dtype=np.float64) * -(math.log(10000.0)) / d_model)
    pe = np.zeros((max_len, d_model), dtype=np.float64)
    pe[:, 0::2] = np.sin(pos * freq)
    pe[:, 1::2] = np.cos(pos * freq)
    return pe.astype(np.float32)


def attention_qkv(w: dict, prefix: str):
    """The (q, k, v) weights and biases of the attention under `prefix` (`...self_attn`)."""
    ws = [w[f"{prefix}.{p}_proj.weight"] for p in "qkv"]
    bs = [w[f"{prefix}.{p}_proj.bias"] for p in "qkv"]
    return ws, bs


def read_id_lines(path: str) -> list:
    """One list of int ids per line (space-separated). An empty line gives an empty list."""
    with open(path, encoding="utf-8") as f:
        return [[int(x) for x in line.split()] for line in f.read().splitlines()]


def strip_eos(ids: list) -> list:
    """`ids` without a trailing `<eos>` (reference files may or may not carry it)."""
    return ids[:-1] if ids and ids[-1] == EOS else ids


def same_fraction(hyps: list, refs: list) -> float:
    """The fraction of sentences whose output ids equal the reference line's."""
    if len(refs) < len(hyps):
        raise SystemExit(f"the reference file has {len(refs)} lines for {len(hyps)} sentences")
    same = sum(1 for h, r in zip(hyps, refs) if list(h) == strip_eos(r))
    return same / max(len(hyps), 1)


def write_id_lines(path: str, rows: list) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(" ".join(str(i) for i in r) + "\n")


def peak_rss_mb() -> float:
    """Peak resident set size of this process (ru_maxrss is KiB on Linux)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def read_sources(path: str, max_sentences) -> list:
    """The source id lines of `path`, the first `max_sentences` of them when that is not None."""
    sources = read_id_lines(path)
    return sources if max_sentences is None else sources[:max_sentences]


def batched_translator(sources: list, batch: int, translate_batch):
    """Sentences sorted by length (longest first) and cut into batches of `batch`, as
    translation tools batch; an empty line (no ids) translates to nothing.

    `translate_batch(idx, beam_size)` translates the sentences of indices `idx` in one call.
    Returns (order, translate_all): the non-empty sentences' indices, longest first, and a
    function of the beam size giving every sentence's output ids in the input's order."""
    order = sorted((i for i in range(len(sources)) if sources[i]),
                   key=lambda i: -len(sources[i]))

    def translate_all(beam_size):
        hyps = [[] for _ in sources]
        for b in range(0, len(order), batch):
            idx = order[b: b + batch]
            for i, h in zip(idx, translate_batch(idx, beam_size)):
                hyps[i] = h
        return hyps

    return order, translate_all


def agreement(hyps, beam, ref_ids, ref_greedy_ids, translate_all):
    """(same, same_greedy): the shares of sentences whose output ids equal the reference
    files' (None without one). The greedy share reuses `hyps` when the search was greedy,
    otherwise translates everything again greedily (untimed)."""
    same = same_greedy = None
    if ref_ids:
        same = same_fraction(hyps, read_id_lines(ref_ids))
        if beam <= 1:
            same_greedy = same
    if ref_greedy_ids:
        greedy_hyps = hyps if beam <= 1 else translate_all(1)
        same_greedy = same_fraction(greedy_hyps, read_id_lines(ref_greedy_ids))
    return same, same_greedy


def decode_figures(hyps, seconds, latency, n_lat, rss, same, same_greedy) -> dict:
    """The JSON fields every decoding benchmark reports, from its outputs and measurements."""
    tokens = sum(len(h) for h in hyps)
    return {
        "sentences": len(hyps),
        "tokens": tokens,
        "seconds": seconds,
        "sentences_per_s": len(hyps) / seconds,
        "tokens_per_s": tokens / seconds,
        "greedy_latency_ms": latency,
        "greedy_latency_sentences": n_lat,
        "peak_rss_mb": rss,
        "same_as_ref": same,
        "same_as_ref_greedy": same_greedy,
    }


def print_agreement(latency, n_lat, same, same_greedy):
    """The human-readable lines after a decoding benchmark's timing: greedy latency and the
    share of sentences translated exactly as the reference ids."""
    if latency is not None:
        print(f"greedy, one sentence at a time: median {latency:.1f} ms over {n_lat} sentences")
    if same is not None:
        print(f"same output ids as the reference: {100 * same:.1f}%")
    if same_greedy is not None:
        print(f"greedy: same output ids as the greedy reference: {100 * same_greedy:.1f}%")


def argument_parser(doc: str) -> argparse.ArgumentParser:
    """A script's command line parser: its description the first paragraph of the script's
    docstring `doc`, its epilog the rest as written."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                   epilog=doc.split("\n\n", 1)[1],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def add_id_file_args(parser) -> None:
    """The id-file arguments both decoding benchmarks take: --src-ids (required), --ref-ids,
    --ref-greedy-ids and --out-ids."""
    parser.add_argument("--src-ids", required=True,
                        help="source ids, one sentence per line, space-separated, ending with "
                             "<eos> (2), as `transformer bench mt-decode --dump DIR` writes "
                             "DIR/src.ids")
    parser.add_argument("--ref-ids", help="output ids to compare with (DIR/hyp.ids of the "
                                          "dump); reports the fraction of identical sentences")
    parser.add_argument("--ref-greedy-ids",
                        help="greedy output ids to compare with: runs an extra (untimed) "
                             "greedy pass and reports same_as_ref_greedy")
    parser.add_argument("--out-ids", help="write the output ids here, one sentence per line")


def add_greedy_latency_arg(parser) -> None:
    """--greedy-latency N, as both decoding benchmarks take it."""
    parser.add_argument("--greedy-latency", type=int, default=0, metavar="N",
                        help="also report the median ms to translate each of the first N "
                             "sentences alone, greedily (0: skip)")
