#!/usr/bin/env python3
"""PyTorch's own run of the "Language Modeling with nn.Transformer and torchtext" tutorial on
WikiText-2, on this machine: the reference that `transformer lm train` is compared with.

The tutorial's training program with its defaults (emsize 200, d_hid 200, 2 layers, 2 heads,
dropout 0.2, batch 20, eval batch 10, bptt 35, CrossEntropyLoss, SGD lr 5.0, StepLR(1.0,
gamma 0.95), clip_grad_norm_ 0.5, 3 epochs, best model by validation loss, then the test
loss), written out here because torchtext, which the tutorial imports for its tokenizer,
vocabulary and dataset, is no longer maintained. What torchtext did is done here directly:

- ``basic_english``: lowercase, then the tokenizer's fixed replacements (``'`` to `` '  ``,
  ``"`` removed, ``. , ( ) ! ?`` spaced, ``<br />``, ``;`` and ``:`` to spaces), split on
  whitespace;
- the vocabulary from the training split, ``<unk>`` first, the rest by count (ties by token),
  unknown words to ``<unk>``;
- the newer tutorial's ``data_process``: the tokens of each non-empty line, concatenated; or
  with ``--eos-per-line`` the older tutorial's stream (the legacy torchtext dataset appended
  ``<eos>`` to every line, empty lines included, and the vocabulary counts it), the stream
  of its published log and test perplexity 229.27.

Prints the tutorial's log lines and, with ``--json FILE``, writes one JSON object per log
line, per epoch and for the test result. Usage:

    python scripts/train_lm_torch.py [--data ../shared/data/wikitext-2] [--eos-per-line]
        [--epochs 3] [--seed 0] [--threads N] [--json FILE]
"""

import argparse
import copy
import json
import math
import os
import time
import warnings
from collections import Counter

import torch
from torch import nn

from tutorial_lm import TransformerModel

warnings.filterwarnings("ignore", message=".*enable_nested_tensor.*")

_REPLACEMENTS = [("'", " '  "), ('"', ""), (".", " . "), ("<br />", " "), (",", " , "),
                 ("(", " ( "), (")", " ) "), ("!", " ! "), ("?", " ? "), (";", " "),
                 (":", " ")]
EOS = "<eos>"


def basic_english(line: str) -> list:
    line = line.lower()
    for old, new in _REPLACEMENTS:
        line = line.replace(old, new)
    return line.split()


def lines(path: str):
    with open(path, encoding="utf-8") as f:
        yield from f


def token_stream(path: str, eos: bool):
    """The tokens of one split, line by line, as the chosen tutorial version reads them."""
    for line in lines(path):
        yield from basic_english(line)
        if eos:
            yield EOS


def build_vocab(path: str, eos: bool) -> dict:
    counts = Counter(token_stream(path, eos))
    counts.pop("<unk>", None)
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return {tok: i for i, tok in enumerate(["<unk>"] + [t for t, _ in ordered])}


def encode(path: str, vocab: dict, eos: bool) -> torch.Tensor:
    unk = vocab["<unk>"]
    return torch.tensor([vocab.get(t, unk) for t in token_stream(path, eos)], dtype=torch.long)


def batchify(data: torch.Tensor, bsz: int) -> torch.Tensor:
    seq_len = data.size(0) // bsz
    return data[: seq_len * bsz].view(bsz, seq_len).t().contiguous()


def get_batch(source: torch.Tensor, i: int, bptt: int):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.path.join(here, "..", "..", "shared", "data",
                                                  "wikitext-2"))
    p.add_argument("--eos-per-line", action="store_true",
                   help="the older tutorial's stream: <eos> after every line")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--max-batches", type=int, default=0,
                   help="stop each epoch after this many batches (0: all); for a quick check")
    p.add_argument("--json", help="append JSON lines (log lines, epochs, test) to this file")
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    split = {s: os.path.join(a.data, f"{s}.txt") for s in ("train", "valid", "test")}
    vocab = build_vocab(split["train"], a.eos_per_line)
    train_data = batchify(encode(split["train"], vocab, a.eos_per_line), 20)
    val_data = batchify(encode(split["valid"], vocab, a.eos_per_line), 10)
    test_data = batchify(encode(split["test"], vocab, a.eos_per_line), 10)
    bptt = 35
    ntokens = len(vocab)
    print(f"vocabulary {ntokens}, train {train_data.numel()} tokens, "
          f"{(train_data.size(0) - 1 + bptt - 1) // bptt} batches per epoch, "
          f"torch {torch.__version__}, {a.threads} threads, seed {a.seed}", flush=True)
    out = open(a.json, "a") if a.json else None

    def record(obj):
        if out:
            out.write(json.dumps(obj) + "\n")
            out.flush()

    model = TransformerModel(ntokens, 200, 2, 200, 2, 0.2)
    criterion = nn.CrossEntropyLoss()
    lr = 5.0
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1.0, gamma=0.95)

    def train(epoch: int) -> None:
        model.train()
        total_loss = 0.0
        log_interval = 200
        start_time = time.time()
        num_batches = len(train_data) // bptt
        for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
            if a.max_batches and batch >= a.max_batches:
                break
            data, targets = get_batch(train_data, i, bptt)
            output = model(data)
            loss = criterion(output.view(-1, ntokens), targets)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            total_loss += loss.item()
            if batch % log_interval == 0 and batch > 0:
                lr_now = scheduler.get_last_lr()[0]
                ms_per_batch = (time.time() - start_time) * 1000 / log_interval
                cur_loss = total_loss / log_interval
                print(f"| epoch {epoch:3d} | {batch:5d}/{num_batches:5d} batches | "
                      f"lr {lr_now:02.2f} | ms/batch {ms_per_batch:5.2f} | "
                      f"loss {cur_loss:5.2f} | ppl {math.exp(cur_loss):8.2f}", flush=True)
                record({"kind": "train", "epoch": epoch, "batch": batch, "lr": lr_now,
                        "ms_per_batch": ms_per_batch, "loss": cur_loss})
                total_loss = 0.0
                start_time = time.time()

    def evaluate(eval_model, eval_data) -> float:
        eval_model.eval()
        total_loss = 0.0
        with torch.no_grad():
            for i in range(0, eval_data.size(0) - 1, bptt):
                data, targets = get_batch(eval_data, i, bptt)
                output = eval_model(data)
                total_loss += data.size(0) * criterion(output.view(-1, ntokens), targets).item()
        return total_loss / (len(eval_data) - 1)

    best_val_loss = float("inf")
    best_model = None
    run_start = time.time()
    for epoch in range(1, a.epochs + 1):
        epoch_start = time.time()
        train(epoch)
        val_loss = evaluate(model, val_data)
        elapsed = time.time() - epoch_start
        print("-" * 89)
        print(f"| end of epoch {epoch:3d} | time: {elapsed:5.2f}s | "
              f"valid loss {val_loss:5.2f} | valid ppl {math.exp(val_loss):8.2f}")
        print("-" * 89, flush=True)
        record({"kind": "epoch", "epoch": epoch, "seconds": elapsed, "val_loss": val_loss,
                "val_ppl": math.exp(val_loss)})
        if val_loss < best_val_loss:
            best_val_loss = val_loss
            best_model = copy.deepcopy(model)
        scheduler.step()

    test_loss = evaluate(best_model, test_data)
    print("=" * 89)
    print(f"| End of training | test loss {test_loss:5.2f} | test ppl {math.exp(test_loss):8.2f}")
    print("=" * 89, flush=True)
    record({"kind": "test", "test_loss": test_loss, "test_ppl": math.exp(test_loss),
            "seconds": time.time() - run_start})


if __name__ == "__main__":
    main()
