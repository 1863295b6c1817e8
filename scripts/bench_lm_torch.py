#!/usr/bin/env python3
"""PyTorch side of `scripts/bench_vs_pytorch.sh`: the model of PyTorch's "Language Modeling
with nn.Transformer and torchtext" tutorial, timed at the same shapes and in the same way as
`transformer bench lm`:

  - training step: model.train(), forward, CrossEntropyLoss, zero_grad, backward,
    clip_grad_norm_(0.5), SGD(lr=5.0).step(), loss.item() (the tutorial's loop body);
  - evaluation forward: model.eval(), torch.no_grad(), on a (bptt, 10) batch;
  - generation: greedy, batch 1, recomputing the whole prefix every step (no cache);
  - peak RSS (ru_maxrss) right after the training-step measurement;
  - a bf16 autocast training step, reported separately as train_step_bf16_ms.

Inputs are random token ids (seeded, drawn on the CPU, so the same on any device),
sequence-first (T, B) as in the tutorial.

On a CUDA GPU (`--device cuda` or `cuda:N`) the model and the batches live on the GPU, every
timed repetition ends with torch.cuda.synchronize(), the bf16 step uses
torch.autocast("cuda", torch.bfloat16), and the JSON adds gpu_peak_mem_mb (the peak GPU
memory allocated over the training steps); --threads applies to the CPU only.

Examples:

  scripts/bench_lm_torch.py --json
  scripts/bench_lm_torch.py --repeats 3 --no-bf16
  scripts/bench_lm_torch.py --device cuda --json
"""

import argparse
import json
import os
import resource
import statistics
import time
import warnings

import torch
from torch import nn

# nn.TransformerEncoder warns that its nested-tensor fast path is off for seq-first layers.
warnings.filterwarnings("ignore", message=".*enable_nested_tensor.*")


# ---- The tutorial's model code (its current version), unchanged -----------------------------

from tutorial_lm import TransformerModel  # noqa: E402  (the tutorial's model)


# ---- Measurements ---------------------------------------------------------------------------

def synchronize(device: torch.device) -> None:
    """Waits for the GPU's queued work (a no-op on the CPU), so a clock read after it counts
    the work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, warmup: int, repeats: int, f) -> dict:
    for _ in range(warmup):
        f()
    synchronize(device)
    ms = []
    for _ in range(repeats):
        start = time.perf_counter()
        f()
        synchronize(device)
        ms.append((time.perf_counter() - start) * 1e3)
    return {"min": min(ms), "median": statistics.median(ms)}


def peak_rss_mb() -> float:
    # ru_maxrss is in KiB on Linux (bytes on macOS).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def random_window(t: int, b: int, vocab: int, device: torch.device):
    """data (T, B) and targets (T * B,), next-token ids, like the tutorial's get_batch."""
    ids = torch.randint(0, vocab, (t + 1, b)).to(device)
    return ids[:t], ids[1:].reshape(-1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=28782,
                   help="vocabulary size (the tutorial's basic_english WikiText-2 vocabulary)")
    p.add_argument("--emsize", type=int, default=200)
    p.add_argument("--nhid", type=int, default=200)
    p.add_argument("--nlayers", type=int, default=2)
    p.add_argument("--nhead", type=int, default=2)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--bptt", type=int, default=35)
    p.add_argument("--eval-batch", type=int, default=10)
    p.add_argument("--gen-prompt", type=int, default=10)
    p.add_argument("--gen-tokens", type=int, default=100)
    p.add_argument("--lr", type=float, default=5.0)
    p.add_argument("--clip", type=float, default=0.5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (cpu)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="torch.set_num_threads on the CPU (default: the cores this process "
                        "may use); not set with a GPU")
    p.add_argument("--no-bf16", action="store_true", help="skip the bf16 autocast step")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args()
    if a.repeats < 1:
        p.error("--repeats must be at least 1")
    try:
        device = torch.device(a.device)
    except RuntimeError:
        p.error(f"--device {a.device}: not a device (cpu, cuda or cuda:N)")
    if device.type not in ("cpu", "cuda"):
        p.error(f"--device {a.device}: only cpu, cuda and cuda:N are supported")
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {a.device}: this PyTorch ({torch.__version__}) sees no CUDA GPU")

    if device.type == "cpu":
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    ntokens = a.vocab
    model = TransformerModel(ntokens, a.emsize, a.nhead, a.nhid, a.nlayers, a.dropout).to(device)
    nparams = sum(p.numel() for p in model.parameters())
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=a.lr)

    # a. Training step: the body of the tutorial's train() loop.
    data, targets = random_window(a.bptt, a.batch, ntokens, device)
    last_loss = [float("nan")]

    def train_step():
        model.train()
        output = model(data)
        output_flat = output.view(-1, ntokens)
        loss = criterion(output_flat, targets)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        optimizer.step()
        last_loss[0] = loss.item()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    train = timed(device, a.warmup, a.repeats, train_step)
    peak_rss = peak_rss_mb()
    gpu_peak_mem = (torch.cuda.max_memory_allocated(device) / 2**20
                    if device.type == "cuda" else None)

    # b. Evaluation forward: the body of the tutorial's evaluate() on its batch of 10.
    eval_data, eval_targets = random_window(a.bptt, a.eval_batch, ntokens, device)

    def eval_step():
        model.eval()
        with torch.no_grad():
            output = model(eval_data)
            output_flat = output.view(-1, ntokens)
            return a.bptt * criterion(output_flat, eval_targets).item()

    evaluation = timed(device, a.warmup, a.repeats, eval_step)

    # c. Greedy generation, batch 1, recomputing the whole prefix each step (no cache).
    prompt = torch.randint(0, ntokens, (a.gen_prompt, 1)).to(device)

    def generate():
        model.eval()
        seq = prompt
        with torch.no_grad():
            for _ in range(a.gen_tokens):
                logits = model(seq)[-1, 0]
                nxt = int(logits.argmax().item())
                seq = torch.cat([seq, torch.tensor([[nxt]], dtype=seq.dtype, device=device)],
                                dim=0)
        return seq

    gen = timed(device, a.warmup, a.repeats, generate)
    gen_tokens_per_s = a.gen_tokens / (gen["median"] / 1e3)

    # d. The same training step under bf16 autocast (for a mixed-precision comparison).
    bf16 = None
    if not a.no_bf16:
        def train_step_bf16():
            model.train()
            with torch.autocast(device.type, dtype=torch.bfloat16):
                output = model(data)
                loss = criterion(output.view(-1, ntokens), targets)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
            optimizer.step()
            loss.item()

        bf16 = timed(device, a.warmup, a.repeats, train_step_bf16)

    shapes = {
        "vocab": a.vocab, "emsize": a.emsize, "nhid": a.nhid, "nlayers": a.nlayers,
        "nhead": a.nhead, "dropout": a.dropout, "batch": a.batch, "bptt": a.bptt,
        "eval_batch": a.eval_batch, "gen_prompt": a.gen_prompt, "gen_tokens": a.gen_tokens,
        "warmup": a.warmup, "repeats": a.repeats,
    }
    threads = torch.get_num_threads()
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    if a.json:
        out = {
            "impl": f"PyTorch {torch.__version__} eager, fp32",
            "torch_version": torch.__version__,
            "device": device_name,
            "train_step_ms": train,
            "eval_ms": evaluation,
            "gen_ms": gen,
            "gen_tokens_per_s": gen_tokens_per_s,
            "gen_kv_cache": False,
            "peak_rss_mb": peak_rss,
            "train_step_bf16_ms": bf16,
            "threads": threads,
            "parameters": nparams,
            "final_train_loss": last_loss[0],
            "shapes": shapes,
        }
        if gpu_peak_mem is not None:
            out["gpu_peak_mem_mb"] = gpu_peak_mem
        print(json.dumps(out))
        return
    where = f"{threads} threads" if device.type == "cpu" else f"{device_name} ({device})"
    print(f"PyTorch {torch.__version__}, {where}; tutorial LM: vocab {a.vocab}, "
          f"emsize {a.emsize}, nhid {a.nhid}, {a.nlayers} layers, {a.nhead} heads, "
          f"dropout {a.dropout}; {nparams} parameters")
    print(f"{a.warmup} warm-up + {a.repeats} timed repetitions each")
    print(f"{'measurement':<44} {'best':>10} {'median':>10}")
    print(f"{f'training step ms ({a.batch} x {a.bptt}, SGD, clip)':<44} "
          f"{train['min']:>10.1f} {train['median']:>10.1f}")
    if bf16 is not None:
        print(f"{'training step ms, bf16 autocast':<44} {bf16['min']:>10.1f} {bf16['median']:>10.1f}")
    print(f"{f'evaluation forward ms ({a.eval_batch} x {a.bptt})':<44} "
          f"{evaluation['min']:>10.1f} {evaluation['median']:>10.1f}")
    print(f"{f'generation tokens/s ({a.gen_tokens} from {a.gen_prompt}, greedy)':<44} "
          f"{a.gen_tokens / (gen['min'] / 1e3):>10.1f} {gen_tokens_per_s:>10.1f}")
    print(f"peak RSS after the training steps: {peak_rss:.0f} MB")
    if gpu_peak_mem is not None:
        print(f"peak GPU memory allocated over the training steps: {gpu_peak_mem:.0f} MB")


if __name__ == "__main__":
    main()
