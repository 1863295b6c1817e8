"""Generate float64 PyTorch reference fixtures for the Rust `model` crate tests.

What it produces
----------------
Small safetensors files in ``crates/model/tests/fixtures/``:

* ``mha.safetensors``                       nn.MultiheadAttention (masked cross case + unmasked self case)
* ``encoder_layer_post_relu.safetensors``   nn.TransformerEncoderLayer, norm_first=False, relu, eps 1e-5
* ``encoder_layer_pre_gelu.safetensors``    nn.TransformerEncoderLayer, norm_first=True, gelu, eps 1e-6
* ``decoder_layer_post_relu.safetensors``   nn.TransformerDecoderLayer, norm_first=False, relu, eps 1e-5
* ``decoder_layer_pre_gelu.safetensors``    nn.TransformerDecoderLayer, norm_first=True, gelu, eps 1e-6
* ``transformer.safetensors``               nn.Transformer (2 encoder + 2 decoder layers, all six masks)
* ``tutorial_lm.safetensors``               the "Language Modeling with nn.Transformer" tutorial model
* ``positional_encoding.safetensors``       the tutorial's sinusoidal positional-encoding table

Tensor naming inside each file:

* ``param.<name>`` / ``grad.<name>``: every parameter (exact ``named_parameters()`` name) and its
  gradient of the loss.
* ``input.<name>`` / ``grad_input.<name>``: inputs and (for float inputs) their gradients.
* ``mask.<name>``: boolean masks stored as uint8 in PyTorch polarity (1 = masked out / not allowed),
  named after the PyTorch argument (``attn_mask``, ``src_mask``, ``tgt_key_padding_mask``, ...).
* ``output.<name>``: outputs (``output.out``, ``output.attn_weights``, ``output.loss``, ...).
* ``cotangent.out``: random tensor shaped like the output; unless stated otherwise
  ``loss = (out * cotangent).sum()`` and gradients come from ``loss.backward()``.

All float tensors are float64, token ids int64. The safetensors metadata (string -> string) holds the
module config (``d_model``, ``nhead``, ``dim_feedforward``, ``dropout``, ``activation``, ``norm_first``,
``layer_norm_eps``, ``batch_first``, ... and ``torch_version``).

Every module runs with dropout=0.0 in train() mode with gradients enabled, so PyTorch's inference fast
paths (``torch._transformer_encoder_layer_fwd`` / ``torch._native_multi_head_attention``, nested
tensors) are never used; the script patches those two entry points to raise, to make sure. Each
fixture's output, loss and every gradient are also checked (to 1e-10) against an independent from-scratch
implementation written in this script (differentiated with autograd).

How to run (from the repository root)
-------------------------------------
    .venv/bin/python scripts/make_fixtures.py

(venv: ``python3 -m venv .venv && .venv/bin/pip install torch numpy safetensors``.)
Generated with torch 2.15.0 (+cu132 wheel, run on CPU), safetensors 0.8.0, Python 3.11.
Deterministic: seeded per fixture, CPU only, single thread, deterministic algorithms; the header's
metadata keys are sorted after writing, so regenerated files are byte-identical.
"""

import json
import math
import os
import struct
import sys
import warnings

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(REPO_ROOT, "crates", "model", "tests", "fixtures")

torch.set_default_dtype(torch.float64)
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
warnings.filterwarnings("ignore", message=".*enable_nested_tensor is True.*")

TORCH_VERSION = torch.__version__


# --------------------------------------------------------------------------------------------
# Guard: PyTorch's fused inference fast paths must never be taken.
# --------------------------------------------------------------------------------------------
def _forbid(name):
    def _raise(*args, **kwargs):
        raise RuntimeError(f"fast path {name} was taken; fixtures must come from the reference path")

    return _raise


torch._transformer_encoder_layer_fwd = _forbid("torch._transformer_encoder_layer_fwd")
torch._native_multi_head_attention = _forbid("torch._native_multi_head_attention")


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------
def uniform_(t: Tensor, a: float, b: float):
    with torch.no_grad():
        t.uniform_(a, b)


def randomize_module(model: nn.Module, skip=()):
    """Randomize every parameter of `model` (except names in `skip`) so nothing is trivially 0/1."""
    touched = set()
    id_to_name = {id(p): n for n, p in model.named_parameters()}

    def mark(p):
        touched.add(id_to_name[id(p)])

    for mod in model.modules():
        if isinstance(mod, nn.LayerNorm):
            if id_to_name[id(mod.weight)] not in skip:
                with torch.no_grad():
                    mod.weight.copy_(1.0 + torch.empty_like(mod.weight).uniform_(-0.2, 0.2))
            mark(mod.weight)
            if id_to_name[id(mod.bias)] not in skip:
                uniform_(mod.bias, -0.2, 0.2)
            mark(mod.bias)
        elif isinstance(mod, nn.Linear):  # includes MHA's out_proj (NonDynamicallyQuantizableLinear)
            if id_to_name[id(mod.weight)] not in skip:
                a = 1.5 / math.sqrt(mod.in_features)
                uniform_(mod.weight, -a, a)
            mark(mod.weight)
            if mod.bias is not None:
                if id_to_name[id(mod.bias)] not in skip:
                    uniform_(mod.bias, -0.3, 0.3)
                mark(mod.bias)
        elif isinstance(mod, nn.MultiheadAttention):
            assert mod._qkv_same_embed_dim
            if id_to_name[id(mod.in_proj_weight)] not in skip:
                a = 1.5 / math.sqrt(mod.embed_dim)
                uniform_(mod.in_proj_weight, -a, a)
            mark(mod.in_proj_weight)
            if id_to_name[id(mod.in_proj_bias)] not in skip:
                uniform_(mod.in_proj_bias, -0.3, 0.3)
            mark(mod.in_proj_bias)
        elif isinstance(mod, nn.Embedding):
            if id_to_name[id(mod.weight)] not in skip:
                uniform_(mod.weight, -0.5, 0.5)
            mark(mod.weight)
    missing = set(id_to_name.values()) - touched
    assert not missing, f"parameters not randomized: {missing}"


def to_mask_u8(m: Tensor) -> Tensor:
    assert m.dtype == torch.bool
    return m.to(torch.uint8).contiguous()


def check_finite(tensors: dict):
    for k, v in tensors.items():
        if v.is_floating_point():
            assert torch.isfinite(v).all(), f"non-finite values in {k}"


def collect_params_and_grads(model: nn.Module, tensors: dict):
    for n, p in model.named_parameters():
        assert p.grad is not None, f"no grad for {n}"
        tensors[f"param.{n}"] = p.detach().clone()
        tensors[f"grad.{n}"] = p.grad.detach().clone()


def backward_and_record(module: nn.Module, out: Tensor, inputs: dict, masks: dict,
                        outputs: dict = None) -> dict:
    """Backpropagates `loss = (out * cotangent).sum()` with a random cotangent, and records the
    module's parameters and gradients, the `inputs` (by name) with their gradients, the
    `masks` as u8, `out` with any further `outputs`, the loss and the cotangent."""
    cot = torch.randn_like(out)
    loss = (out * cot).sum()
    loss.backward()

    t = {}
    collect_params_and_grads(module, t)
    for name, x in inputs.items():
        t[f"input.{name}"] = x.detach().clone()
    for name, x in inputs.items():
        t[f"grad_input.{name}"] = x.grad.clone()
    for name, m in masks.items():
        t[f"mask.{name}"] = to_mask_u8(m)
    t["output.out"] = out.detach().clone()
    for name, x in (outputs or {}).items():
        t[f"output.{name}"] = x.detach().clone()
    t["output.loss"] = loss.detach().clone()
    t["cotangent.out"] = cot
    return t


def save(name: str, tensors: dict, metadata: dict):
    check_finite(tensors)
    for k, v in tensors.items():
        assert v.dtype in (torch.float64, torch.int64, torch.uint8), (k, v.dtype)
    tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
    metadata = {k: str(v) for k, v in metadata.items()}
    metadata["torch_version"] = TORCH_VERSION
    path = os.path.join(OUT_DIR, name)
    save_file(tensors, path, metadata=metadata)
    canonicalize_header(path)
    # Round-trip check.
    back = load_file(path)
    assert set(back) == set(tensors), name
    for k, v in tensors.items():
        assert back[k].shape == v.shape and back[k].dtype == v.dtype, (name, k)
        assert torch.equal(back[k], v), (name, k)
    return path


def canonicalize_header(path):
    """safetensors writes `__metadata__` in hash-map order, which changes from run to run. Rewrite the
    header with sorted metadata keys (same length, same tensor entries) so files are byte-reproducible."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n].decode("utf-8"), object_pairs_hook=dict)
    if "__metadata__" in header:
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    # Keep the writer's entry order for tensors; only the metadata object is reordered.
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert len(text) <= n, (path, len(text), n)
    text = text + b" " * (n - len(text))
    with open(path, "wb") as f:
        f.write(raw[:8] + text + raw[8 + n :])


def layer_config(activation, norm_first, eps, batch_first=True):
    return {
        "d_model": 16,
        "nhead": 4,
        "dim_feedforward": 32,
        "dropout": "0.0",
        "activation": activation,
        "norm_first": "true" if norm_first else "false",
        "layer_norm_eps": repr(eps) if eps != 1e-5 else "1e-05",
        "batch_first": "true" if batch_first else "false",
    }


# --------------------------------------------------------------------------------------------
# Independent from-scratch reference implementation (used only to cross-check PyTorch).
# Masks here are bool, True = not allowed. Everything is batch-first [B, L, E].
# --------------------------------------------------------------------------------------------
def ref_mha(P, prefix, q_in, k_in, v_in, nhead, attn_mask=None, kpm=None):
    W = P[prefix + "in_proj_weight"]
    b = P[prefix + "in_proj_bias"]
    E = q_in.shape[-1]
    hd = E // nhead
    q = q_in @ W[:E].T + b[:E]
    k = k_in @ W[E : 2 * E].T + b[E : 2 * E]
    v = v_in @ W[2 * E :].T + b[2 * E :]
    B, L, _ = q.shape
    S = k.shape[1]
    q = q.view(B, L, nhead, hd).transpose(1, 2)
    k = k.view(B, S, nhead, hd).transpose(1, 2)
    v = v.view(B, S, nhead, hd).transpose(1, 2)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)  # [B, H, L, S]
    blocked = torch.zeros(B, 1, L, S, dtype=torch.bool)
    if attn_mask is not None:
        blocked = blocked | attn_mask[None, None]
    if kpm is not None:
        blocked = blocked | kpm[:, None, None, :]
    scores = scores.masked_fill(blocked, float("-inf"))
    w = torch.softmax(scores, dim=-1)
    o = (w @ v).transpose(1, 2).reshape(B, L, E)
    o = o @ P[prefix + "out_proj.weight"].T + P[prefix + "out_proj.bias"]
    return o, w


def ref_ln(P, prefix, x, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * P[prefix + "weight"] + P[prefix + "bias"]


def ref_ff(P, prefix, x, activation):
    h = x @ P[prefix + "linear1.weight"].T + P[prefix + "linear1.bias"]
    if activation == "relu":
        h = torch.clamp(h, min=0)
    else:
        h = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))
    return h @ P[prefix + "linear2.weight"].T + P[prefix + "linear2.bias"]


def ref_encoder_layer(P, p, x, nhead, act, norm_first, eps, mask=None, kpm=None):
    sa = lambda y: ref_mha(P, p + "self_attn.", y, y, y, nhead, mask, kpm)[0]
    if norm_first:
        x = x + sa(ref_ln(P, p + "norm1.", x, eps))
        x = x + ref_ff(P, p, ref_ln(P, p + "norm2.", x, eps), act)
    else:
        x = ref_ln(P, p + "norm1.", x + sa(x), eps)
        x = ref_ln(P, p + "norm2.", x + ref_ff(P, p, x, act), eps)
    return x


def ref_decoder_layer(P, p, x, mem, nhead, act, norm_first, eps, tm=None, mm=None, tkpm=None, mkpm=None):
    sa = lambda y: ref_mha(P, p + "self_attn.", y, y, y, nhead, tm, tkpm)[0]
    ca = lambda y: ref_mha(P, p + "multihead_attn.", y, mem, mem, nhead, mm, mkpm)[0]
    if norm_first:
        x = x + sa(ref_ln(P, p + "norm1.", x, eps))
        x = x + ca(ref_ln(P, p + "norm2.", x, eps))
        x = x + ref_ff(P, p, ref_ln(P, p + "norm3.", x, eps), act)
    else:
        x = ref_ln(P, p + "norm1.", x + sa(x), eps)
        x = ref_ln(P, p + "norm2.", x + ca(x), eps)
        x = ref_ln(P, p + "norm3.", x + ref_ff(P, p, x, act), eps)
    return x


def assert_close(a, b, what):
    err = (a - b).abs().max().item()
    assert err < 1e-10, f"reference mismatch for {what}: max abs err {err}"


def params_of(tensors):
    return {k[len("param.") :]: v for k, v in tensors.items() if k.startswith("param.")}


def check_against_ref(t, what, ref_fn, out_key="output.out", float_inputs=(), loss_fn=None):
    """Re-run the from-scratch reference with autograd on copies of the stored params/inputs and
    compare the output, every parameter gradient and every float-input gradient with PyTorch's."""
    P = {k: v.clone().requires_grad_(True) for k, v in params_of(t).items()}
    X = {n: t[f"input.{n}"].clone().requires_grad_(True) for n in float_inputs}
    out = ref_fn(P, X)
    assert_close(out, t[out_key], f"{what} {out_key}")
    loss = loss_fn(out) if loss_fn is not None else (out * t["cotangent.out"]).sum()
    assert_close(loss, t["output.loss"], f"{what} loss")
    loss.backward()
    for n, p in P.items():
        assert_close(p.grad, t[f"grad.{n}"], f"{what} grad.{n}")
    for n, x in X.items():
        assert_close(x.grad, t[f"grad_input.{n}"], f"{what} grad_input.{n}")


# --------------------------------------------------------------------------------------------
# 1. MultiheadAttention
# --------------------------------------------------------------------------------------------
def make_mha():
    torch.manual_seed(0)
    E, H = 16, 4
    mha = nn.MultiheadAttention(embed_dim=E, num_heads=H, dropout=0.0, bias=True, batch_first=True)
    randomize_module(mha)
    mha.train()

    query = torch.randn(2, 5, E, requires_grad=True)
    key = torch.randn(2, 6, E, requires_grad=True)
    value = torch.randn(2, 6, E, requires_grad=True)
    key_padding_mask = torch.zeros(2, 6, dtype=torch.bool)
    key_padding_mask[1, 4:] = True
    attn_mask = torch.zeros(5, 6, dtype=torch.bool)
    attn_mask[0, 1] = True
    attn_mask[1, 3] = True
    attn_mask[2, 0] = True
    attn_mask[3, 5] = True
    attn_mask[4, 2] = True
    attn_mask[4, 3] = True

    out, attn_weights = mha(
        query, key, value,
        key_padding_mask=key_padding_mask, attn_mask=attn_mask,
        need_weights=True, average_attn_weights=False,
    )
    assert out.shape == (2, 5, E) and attn_weights.shape == (2, H, 5, 6)
    t = backward_and_record(
        mha, out, {"query": query, "key": key, "value": value},
        {"key_padding_mask": key_padding_mask, "attn_mask": attn_mask},
        {"attn_weights": attn_weights},
    )

    # Second case: self-attention, no masks, no gradients.
    self_x = torch.randn(2, 5, E)
    with torch.no_grad():
        self_out, self_w = mha(self_x, self_x, self_x, need_weights=True, average_attn_weights=False)
    assert self_w.shape == (2, H, 5, 5)
    t["input.self_x"] = self_x
    t["output.self_out"] = self_out.clone()
    t["output.self_attn_weights"] = self_w.clone()

    # Cross-check against the from-scratch reference.
    P = params_of(t)
    o, w = ref_mha(P, "", t["input.query"], t["input.key"], t["input.value"], H, attn_mask, key_padding_mask)
    assert_close(w, t["output.attn_weights"], "mha attn_weights")
    check_against_ref(
        t, "mha",
        lambda P, X: ref_mha(P, "", X["query"], X["key"], X["value"], H, attn_mask, key_padding_mask)[0],
        float_inputs=("query", "key", "value"),
    )
    o, w = ref_mha(P, "", self_x, self_x, self_x, H)
    assert_close(o, self_out, "mha self_out")
    assert_close(w, self_w, "mha self_attn_weights")

    meta = {
        "d_model": E, "nhead": H, "embed_dim": E, "num_heads": H, "dropout": "0.0", "bias": "true",
        "batch_first": "true", "need_weights": "true", "average_attn_weights": "false",
    }
    return save("mha.safetensors", t, meta)


def fixture_layer(cls, seed, activation, norm_first, eps):
    """A randomized layer of `cls` (nn.TransformerEncoderLayer or nn.TransformerDecoderLayer)
    at the fixtures' sizes (d_model 16, 4 heads, FFN 32, no dropout), seeded with `seed`."""
    torch.manual_seed(seed)
    layer = cls(
        d_model=16, nhead=4, dim_feedforward=32, dropout=0.0, activation=activation,
        layer_norm_eps=eps, batch_first=True, norm_first=norm_first,
    )
    randomize_module(layer)
    layer.train()
    return layer


# --------------------------------------------------------------------------------------------
# 2/3. TransformerEncoderLayer
# --------------------------------------------------------------------------------------------
def make_encoder_layer(fname, seed, activation, norm_first, eps):
    layer = fixture_layer(nn.TransformerEncoderLayer, seed, activation, norm_first, eps)

    src = torch.randn(2, 5, 16, requires_grad=True)
    src_mask = torch.triu(torch.ones(5, 5), diagonal=1).bool()
    src_kpm = torch.zeros(2, 5, dtype=torch.bool)
    src_kpm[1, 4] = True

    out = layer(src, src_mask=src_mask, src_key_padding_mask=src_kpm)
    assert out.shape == (2, 5, 16)
    t = backward_and_record(
        layer, out, {"src": src}, {"src_mask": src_mask, "src_key_padding_mask": src_kpm})

    check_against_ref(
        t, fname,
        lambda P, X: ref_encoder_layer(P, "", X["src"], 4, activation, norm_first, eps, src_mask, src_kpm),
        float_inputs=("src",),
    )
    return save(fname, t, layer_config(activation, norm_first, eps))


# --------------------------------------------------------------------------------------------
# 4. TransformerDecoderLayer
# --------------------------------------------------------------------------------------------
def make_decoder_layer(fname, seed, activation, norm_first, eps):
    layer = fixture_layer(nn.TransformerDecoderLayer, seed, activation, norm_first, eps)

    tgt = torch.randn(2, 4, 16, requires_grad=True)
    memory = torch.randn(2, 5, 16, requires_grad=True)
    tgt_mask = torch.triu(torch.ones(4, 4), diagonal=1).bool()
    memory_mask = torch.zeros(4, 5, dtype=torch.bool)
    memory_mask[0, 1] = True
    memory_mask[2, 4] = True
    tgt_kpm = torch.zeros(2, 4, dtype=torch.bool)
    tgt_kpm[1, 3] = True
    mem_kpm = torch.zeros(2, 5, dtype=torch.bool)
    mem_kpm[1, 3:] = True

    out = layer(
        tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
        tgt_key_padding_mask=tgt_kpm, memory_key_padding_mask=mem_kpm,
    )
    assert out.shape == (2, 4, 16)
    t = backward_and_record(
        layer, out, {"tgt": tgt, "memory": memory},
        {"tgt_mask": tgt_mask, "memory_mask": memory_mask, "tgt_key_padding_mask": tgt_kpm,
         "memory_key_padding_mask": mem_kpm},
    )

    check_against_ref(
        t, fname,
        lambda P, X: ref_decoder_layer(
            P, "", X["tgt"], X["memory"], 4, activation, norm_first, eps, tgt_mask, memory_mask, tgt_kpm, mem_kpm
        ),
        float_inputs=("tgt", "memory"),
    )
    return save(fname, t, layer_config(activation, norm_first, eps))


# --------------------------------------------------------------------------------------------
# 5. nn.Transformer
# --------------------------------------------------------------------------------------------
def make_transformer():
    torch.manual_seed(5)
    model = nn.Transformer(
        d_model=16, nhead=4, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=32,
        dropout=0.0, activation="relu", batch_first=True,
    )
    randomize_module(model)
    model.train()

    src = torch.randn(2, 6, 16, requires_grad=True)
    tgt = torch.randn(2, 4, 16, requires_grad=True)
    src_mask = torch.zeros(6, 6, dtype=torch.bool)
    src_mask[0, 3] = True
    src_mask[2, 1] = True
    src_mask[4, 5] = True
    tgt_mask = torch.triu(torch.ones(4, 4), diagonal=1).bool()
    memory_mask = torch.zeros(4, 6, dtype=torch.bool)
    memory_mask[1, 0] = True
    memory_mask[3, 2] = True
    src_kpm = torch.zeros(2, 6, dtype=torch.bool)
    src_kpm[1, 4:] = True
    tgt_kpm = torch.zeros(2, 4, dtype=torch.bool)
    tgt_kpm[1, 3] = True
    mem_kpm = src_kpm.clone()

    out = model(
        src, tgt, src_mask=src_mask, tgt_mask=tgt_mask, memory_mask=memory_mask,
        src_key_padding_mask=src_kpm, tgt_key_padding_mask=tgt_kpm, memory_key_padding_mask=mem_kpm,
    )
    assert out.shape == (2, 4, 16)
    t = backward_and_record(
        model, out, {"src": src, "tgt": tgt},
        {"src_mask": src_mask, "tgt_mask": tgt_mask, "memory_mask": memory_mask,
         "src_key_padding_mask": src_kpm, "tgt_key_padding_mask": tgt_kpm,
         "memory_key_padding_mask": mem_kpm},
    )

    def ref(P, X):
        m = X["src"]
        for i in range(2):
            m = ref_encoder_layer(P, f"encoder.layers.{i}.", m, 4, "relu", False, 1e-5, src_mask, src_kpm)
        m = ref_ln(P, "encoder.norm.", m, 1e-5)
        x = X["tgt"]
        for i in range(2):
            x = ref_decoder_layer(
                P, f"decoder.layers.{i}.", x, m, 4, "relu", False, 1e-5, tgt_mask, memory_mask, tgt_kpm, mem_kpm
            )
        return ref_ln(P, "decoder.norm.", x, 1e-5)

    check_against_ref(t, "transformer", ref, float_inputs=("src", "tgt"))

    meta = layer_config("relu", False, 1e-5)
    meta.update({"num_encoder_layers": 2, "num_decoder_layers": 2})
    return save("transformer.safetensors", t, meta)


# --------------------------------------------------------------------------------------------
# 6/7. The "Language Modeling with nn.Transformer" tutorial model (verbatim structure).
# --------------------------------------------------------------------------------------------
from tutorial_lm import PositionalEncoding, TransformerModel  # noqa: E402  (the tutorial's model)


def make_tutorial_lm():
    # Full tutorial size: parameter count and ordered names.
    torch.manual_seed(6)
    full = TransformerModel(ntoken=33278, d_model=200, nhead=2, d_hid=200, nlayers=2, dropout=0.2)
    num_params_full = sum(p.numel() for p in full.parameters())
    assert num_params_full == 13_828_478, num_params_full
    names_full = [n for n, _ in full.named_parameters()]
    del full

    ntoken, d_model, nhead, d_hid, nlayers = 50, 16, 2, 24, 2
    torch.manual_seed(6)
    model = TransformerModel(ntoken, d_model, nhead, d_hid, nlayers, dropout=0.0)
    # Keep the tutorial init for embedding.weight and linear.weight; randomize everything else.
    randomize_module(model, skip={"embedding.weight", "linear.weight", "linear.bias"})
    uniform_(model.linear.bias, -0.1, 0.1)
    assert [n for n, _ in model.named_parameters()] == names_full
    model.train()

    seq_len, batch = 7, 3
    src = torch.randint(0, ntoken, (seq_len, batch), dtype=torch.int64)
    targets = torch.randint(0, ntoken, (seq_len * batch,), dtype=torch.int64)
    src_mask_f = nn.Transformer.generate_square_subsequent_mask(seq_len)
    assert src_mask_f.dtype == torch.float64
    src_mask_b = torch.isinf(src_mask_f) & (src_mask_f < 0)
    assert torch.equal(src_mask_b, torch.triu(torch.ones(seq_len, seq_len), diagonal=1).bool())

    logits = model(src, src_mask_f)
    assert logits.shape == (seq_len, batch, ntoken)
    loss = nn.CrossEntropyLoss()(logits.view(-1, ntoken), targets)
    loss.backward()

    t = {}
    collect_params_and_grads(model, t)
    t["input.src"] = src
    t["input.targets"] = targets
    t["mask.src_mask"] = to_mask_u8(src_mask_b)
    t["output.logits"] = logits.detach().clone()
    t["output.loss"] = loss.detach().clone()
    t["output.num_params"] = torch.tensor(float(num_params_full), dtype=torch.float64)

    # Cross-check (reference is batch-first, the model is seq-first).
    pe = model.pos_encoder.pe[:seq_len].detach()

    def ref(P, X):
        x = P["embedding.weight"][src] * math.sqrt(d_model) + pe
        x = x.transpose(0, 1)
        for i in range(nlayers):
            x = ref_encoder_layer(P, f"transformer_encoder.layers.{i}.", x, nhead, "relu", False, 1e-5, src_mask_b)
        return (x @ P["linear.weight"].T + P["linear.bias"]).transpose(0, 1)

    def ref_loss(logits):
        # log-softmax + NLL written out, mean over the 21 targets.
        z = logits.reshape(-1, ntoken)
        logp = z - torch.logsumexp(z, dim=-1, keepdim=True)
        return -logp[torch.arange(z.shape[0]), targets].mean()

    check_against_ref(t, "tutorial_lm", ref, out_key="output.logits", loss_fn=ref_loss)

    meta = {
        "ntoken": ntoken, "d_model": d_model, "nhead": nhead, "d_hid": d_hid, "nlayers": nlayers,
        "dim_feedforward": d_hid, "dropout": "0.0", "activation": "relu", "norm_first": "false",
        "layer_norm_eps": "1e-05", "batch_first": "false",
        "loss": "CrossEntropyLoss(mean) over logits.view(-1, ntoken) vs targets",
        "num_params_full_config": "ntoken=33278,d_model=200,nhead=2,d_hid=200,nlayers=2",
        "param_names_full": ",".join(names_full),
    }
    return save("tutorial_lm.safetensors", t, meta)


def make_positional_encoding():
    max_len, d_model = 50, 16
    pe_mod = PositionalEncoding(d_model, dropout=0.0, max_len=max_len)
    pe = pe_mod.pe[:, 0, :].clone()
    assert pe.shape == (max_len, d_model) and pe.dtype == torch.float64
    # Independent check of the formula.
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    i = torch.arange(0, d_model, 2, dtype=torch.float64)
    ang = pos * torch.exp(i * (-math.log(10000.0) / d_model))
    assert_close(pe[:, 0::2], torch.sin(ang), "pe sin")
    assert_close(pe[:, 1::2], torch.cos(ang), "pe cos")
    meta = {"max_len": max_len, "d_model": d_model, "layout": "pe[pos, i]; even i = sin, odd i = cos"}
    return save("positional_encoding.safetensors", {"output.pe": pe}, meta)


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    paths = [
        make_mha(),
        make_encoder_layer("encoder_layer_post_relu.safetensors", 1, "relu", False, 1e-5),
        make_encoder_layer("encoder_layer_pre_gelu.safetensors", 2, "gelu", True, 1e-6),
        make_decoder_layer("decoder_layer_post_relu.safetensors", 3, "relu", False, 1e-5),
        make_decoder_layer("decoder_layer_pre_gelu.safetensors", 4, "gelu", True, 1e-6),
        make_transformer(),
        make_tutorial_lm(),
        make_positional_encoding(),
    ]
    print(f"torch {TORCH_VERSION}; fixtures in {os.path.relpath(OUT_DIR, REPO_ROOT)}")
    for path in paths:
        size = os.path.getsize(path)
        assert size < 300_000, (path, size)
        print(f"\n{os.path.basename(path)}  ({size} bytes)")
        for k, v in sorted(load_file(path).items()):
            print(f"  {k:55s} {str(v.dtype).replace('torch.', ''):8s} {list(v.shape)}")


if __name__ == "__main__":
    sys.exit(main())
