"""Float64 PyTorch references for the Rust GRU (`crates/model/src/gru.rs`).

Writes ``crates/model/tests/fixtures/gru_*.safetensors``:

* ``gru_bi2_packed.safetensors``: ``nn.GRU(5, 4, num_layers=2, bidirectional=True,
  batch_first=True)`` over a padded batch of 3 rows with lengths 6, 4 and 1, run through
  ``pack_padded_sequence`` / ``pad_packed_sequence`` (what the Rust layer's ``lengths`` mean),
  with a random initial state.
* ``gru_uni1.safetensors``: ``nn.GRU(3, 5, batch_first=True)``, no padding, zero initial state.

Names as in ``make_fixtures.py``: ``param.<name>`` / ``grad.<name>`` for every parameter (PyTorch's
own names) and its gradient, ``input.x`` / ``grad_input.x``, ``input.h0`` / ``grad_input.h0``,
``input.lengths`` (int64), ``output.out`` and ``output.h_n``, ``cotangent.out`` and
``cotangent.h_n``; ``loss = (out * cotangent.out).sum() + (h_n * cotangent.h_n).sum()``.
Each fixture is also checked (to 1e-12) against a from-scratch GRU written below with the
gate equations of PyTorch's documentation, differentiated by autograd.

Run from the repository root (deterministic; the files are small):

    python3 -m venv .venv && .venv/bin/pip install torch safetensors
    .venv/bin/python scripts/make_gru_fixtures.py
"""

import os

import torch
from safetensors.torch import save_file
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

OUT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "crates", "model", "tests", "fixtures")
torch.set_default_dtype(torch.float64)
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)


def scratch_gru(P, x, lengths, h0, layers, bidirectional):
    """The documented equations, one row at a time over its own length."""
    dirs = 2 if bidirectional else 1
    b, t, _ = x.shape
    hidden = P["weight_hh_l0"].shape[1]
    out_rows, finals = [], [[None] * b for _ in range(layers * dirs)]
    for row in range(b):
        n = lengths[row]
        inp = x[row, :n]
        for l in range(layers):
            outs = []
            for d in range(dirs):
                sfx = f"_l{l}" + ("_reverse" if d == 1 else "")
                w_ih, w_hh = P["weight_ih" + sfx], P["weight_hh" + sfx]
                b_ih, b_hh = P["bias_ih" + sfx], P["bias_hh" + sfx]
                h = h0[l * dirs + d, row]
                steps = range(n - 1, -1, -1) if d == 1 else range(n)
                seq = [None] * n
                for s in steps:
                    gi = w_ih @ inp[s] + b_ih
                    gh = w_hh @ h + b_hh
                    r = torch.sigmoid(gi[:hidden] + gh[:hidden])
                    z = torch.sigmoid(gi[hidden:2 * hidden] + gh[hidden:2 * hidden])
                    nn_ = torch.tanh(gi[2 * hidden:] + r * gh[2 * hidden:])
                    h = (1 - z) * nn_ + z * h
                    seq[s] = h
                finals[l * dirs + d][row] = h
                outs.append(torch.stack(seq))
            inp = torch.cat(outs, dim=-1)
        pad = torch.zeros(t - n, inp.shape[-1])
        out_rows.append(torch.cat([inp, pad]))
    out = torch.stack(out_rows)
    h_n = torch.stack([torch.stack(f) for f in finals])
    return out, h_n


def make(name, seed, input_size, hidden, layers, bidirectional, lengths, random_h0):
    torch.manual_seed(seed)
    gru = nn.GRU(input_size, hidden, num_layers=layers, bidirectional=bidirectional,
                 batch_first=True)
    for p in gru.parameters():
        with torch.no_grad():
            p.uniform_(-0.6, 0.6)
    dirs = 2 if bidirectional else 1
    b, t = len(lengths), max(lengths)
    x = torch.randn(b, t, input_size, requires_grad=True)
    h0 = (torch.randn(layers * dirs, b, hidden) if random_h0
          else torch.zeros(layers * dirs, b, hidden)).requires_grad_(True)
    packed = pack_padded_sequence(x, torch.tensor(lengths), batch_first=True,
                                  enforce_sorted=False)
    out_p, h_n = gru(packed, h0)
    out, _ = pad_packed_sequence(out_p, batch_first=True, total_length=t)
    cot_out = torch.randn_like(out)
    cot_h = torch.randn_like(h_n)
    loss = (out * cot_out).sum() + (h_n * cot_h).sum()
    loss.backward()

    P = {k: v.detach().clone().requires_grad_(True) for k, v in gru.named_parameters()}
    x2 = x.detach().clone().requires_grad_(True)
    h02 = h0.detach().clone().requires_grad_(True)
    out2, h_n2 = scratch_gru(P, x2, lengths, h02, layers, bidirectional)
    ((out2 * cot_out).sum() + (h_n2 * cot_h).sum()).backward()
    for a, c, what in [(out, out2, "out"), (h_n, h_n2, "h_n"), (x.grad, x2.grad, "grad x"),
                       (h0.grad, h02.grad, "grad h0")] + [
            (p.grad, P[k].grad, "grad " + k) for k, p in gru.named_parameters()]:
        err = (a - c).abs().max().item()
        assert err < 1e-12, f"{name}: {what} differs from the scratch GRU by {err}"

    tensors = {
        "input.x": x.detach(), "grad_input.x": x.grad,
        "input.h0": h0.detach(), "grad_input.h0": h0.grad,
        "input.lengths": torch.tensor(lengths, dtype=torch.int64),
        "output.out": out.detach().contiguous(), "output.h_n": h_n.detach().contiguous(),
        "cotangent.out": cot_out, "cotangent.h_n": cot_h,
    }
    for k, p in gru.named_parameters():
        tensors["param." + k] = p.detach()
        tensors["grad." + k] = p.grad
    meta = {"input_size": str(input_size), "hidden_size": str(hidden),
            "num_layers": str(layers), "bidirectional": str(bidirectional).lower(),
            "torch_version": torch.__version__}
    path = os.path.join(OUT_DIR, name)
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=meta)
    print(f"wrote {path}")


if __name__ == "__main__":
    make("gru_bi2_packed.safetensors", 11, 5, 4, 2, True, [6, 4, 1], True)
    make("gru_uni1.safetensors", 12, 3, 5, 1, False, [4, 4], False)
