"""Generate the fixture for `transformer lm import-torch` + `transformer lm eval` (crates/cli tests).

What it produces, in ``crates/cli/tests/fixtures/lm_import/``
---------------------------------------------------------------
* ``text.txt``                 a small synthetic English text (written by this script from its own word
                               lists and sentence templates, fixed seed; no third-party text).
* ``vocab.txt``                the tutorial's vocabulary built from the first 70% of the lines of
                               ``text.txt``: one token per line in index order, no header, ``<unk>`` first.
* ``state_dict.safetensors``   ``safetensors.torch.save_file(model.state_dict(), path)`` of the
                               "Language Modeling with nn.Transformer and torchtext" tutorial's
                               ``TransformerModel`` (float32), briefly trained on the vocabulary lines.
* ``expected.json``            PyTorch's own perplexity of that model on the whole ``text.txt``,
                               computed exactly like the tutorial's ``evaluate`` (eval batch size 10,
                               bptt 35), in float32 and (on a float64 copy of the model) in float64.
* ``README.md``                description of the above.

Tokenizer and vocabulary rules are imported from ``crates/text/scripts/torchtext_reference.py``
(torchtext's ``basic_english`` and ``build_vocab_from_iterator(..., specials=['<unk>'])`` restated),
the reference the Rust ``text`` crate is tested against.

Model config: ntoken = len(vocab), d_model 32, nhead 4, d_hid 48, nlayers 2, dropout 0.2. The one
departure from the tutorial: ``PositionalEncoding`` is built with ``max_len=512`` instead of 5000 so
that the persistent ``pos_encoder.pe`` buffer ([max_len, 1, d_model], which is in the state dict, as
in the real tutorial) stays small.

How to run (from the repository root; any Python with torch, numpy and safetensors)
-----------------------------------------------------------------------------------
    /path/to/python scripts/make_lm_import_fixture.py

Deterministic: fixed seeds, CPU only, one thread, deterministic algorithms. Running it twice gives
byte-identical files (the safetensors file is written without metadata; the script checks that its
header holds no ``__metadata__`` whose key order could vary).
"""

import copy
import importlib.util
import json
import math
import os
import random
import struct
import warnings

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(REPO_ROOT, "crates", "cli", "tests", "fixtures", "lm_import")
TORCH_VERSION = torch.__version__

# Config.
D_MODEL, NHEAD, D_HID, NLAYERS, DROPOUT = 32, 4, 48, 2, 0.2
MAX_LEN = 512  # tutorial default is 5000; smaller here to keep the fixture small
VOCAB_FRACTION = 0.7
TRAIN_BATCH, EVAL_BATCH, BPTT = 20, 10, 35
LR, CLIP, TRAIN_STEPS = 5.0, 0.5, 80
TEXT_SEED, TORCH_SEED = 20240607, 1234


def load_reference():
    path = os.path.join(REPO_ROOT, "crates", "text", "scripts", "torchtext_reference.py")
    spec = importlib.util.spec_from_file_location("torchtext_reference", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


REF = load_reference()
tokenizer = REF.basic_english


# --------------------------------------------------------------------------------------------
# Synthetic text.
# --------------------------------------------------------------------------------------------
NAMES = ["Anna", "Boris", "Clara", "Daniel", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas",
         "Karin", "Leo", "Mira", "Nils", "Olga", "Pavel", "Rosa", "Samir", "Tilda", "Viktor"]
PLACES = ["harbour", "village", "valley", "market", "library", "station", "garden", "bridge",
          "forest", "castle", "museum", "river", "mountain", "school", "bakery", "island",
          "lighthouse", "factory", "theatre", "monastery", "quarry", "orchard", "observatory"]
NOUNS = ["boat", "letter", "map", "lantern", "basket", "clock", "window", "horse", "song", "book",
         "coat", "door", "road", "storm", "candle", "bell", "key", "ladder", "mirror", "rope",
         "kettle", "violin", "compass", "telescope", "wagon", "blanket", "hammer", "feather",
         "parcel", "ribbon", "shovel", "teapot", "umbrella", "whistle", "anchor", "barrel"]
ADJS = ["old", "small", "quiet", "bright", "heavy", "strange", "green", "narrow", "cold", "warm",
        "broken", "famous", "empty", "golden", "ancient", "hidden", "wooden", "distant", "gentle",
        "curious", "dusty", "silver", "crooked", "fragile", "enormous", "peculiar", "humble"]
VERBS_PAST = ["found", "carried", "painted", "repaired", "sold", "opened", "lost", "borrowed",
              "described", "remembered", "watched", "built", "cleaned", "measured", "wrapped",
              "hid", "admired", "examined", "polished", "delivered", "abandoned", "sketched"]
VERBS_INTR = ["laughed", "waited", "slept", "sang", "shouted", "whispered", "wandered", "arrived",
              "left", "returned", "hesitated", "listened", "smiled", "stumbled", "vanished"]
TIMES = ["in the morning", "at noon", "before dawn", "after the rain", "during the winter",
         "in the spring", "late at night", "on a sunday", "in the autumn of 1873",
         "on the third day", "at half past four", "around midnight"]
ADVS = ["slowly", "carefully", "suddenly", "quietly", "happily", "twice", "almost", "never",
        "often", "rarely", "eagerly", "reluctantly"]
HEADINGS = ["History", "Geography", "Early life", "Reception", "Legacy", "Construction",
            "Description", "Later years", "Notes", "Climate", "Economy", "Culture"]


def zipf_choice(rng, items, s=1.1):
    weights = [1.0 / (r + 1) ** s for r in range(len(items))]
    return rng.choices(items, weights=weights, k=1)[0]


def sentence(rng):
    n = zipf_choice(rng, NAMES)
    m = zipf_choice(rng, NAMES)
    p = zipf_choice(rng, PLACES)
    o = zipf_choice(rng, NOUNS)
    o2 = zipf_choice(rng, NOUNS)
    a = zipf_choice(rng, ADJS)
    a2 = zipf_choice(rng, ADJS)
    v = zipf_choice(rng, VERBS_PAST)
    vi = zipf_choice(rng, VERBS_INTR)
    t = zipf_choice(rng, TIMES)
    adv = zipf_choice(rng, ADVS)
    num = rng.choice(["two", "three", "four", "seven", "twelve", "1,200", "3.5", "40", "1890s"])
    k = rng.randrange(16)
    if k == 0:
        return f"{n} {v} the {a} {o} near the {p} {t}."
    if k == 1:
        return f"The {o} was {a}, and {n} {adv} {vi}."
    if k == 2:
        return f"\"Where is the {o}?\" asked {n}."
    if k == 3:
        return f"{n} said: \"I don't know why the {o} is so {a}!\""
    if k == 4:
        return f"The {p} (which {m} had {v} {t}) was {a} and {a2}."
    if k == 5:
        return f"{n}'s {o} lay beside the {a} {o2}; nobody {v} it."
    if k == 6:
        return f"{t.capitalize()}, {n} and {m} {vi} at the {p}."
    if k == 7:
        return f"Why did {n} leave the {o} at the {p}? It's {a}!"
    if k == 8:
        return f"There were {num} {o}s in the {a} {p}, or so {m} said."
    if k == 9:
        return f"{n} {adv} {v} a {a} {o}: it was {a2}, {a}, and {num} years old."
    if k == 10:
        return f"The {a} {p} is known for its {o}s ({num} in total)."
    if k == 11:
        return f"\"It isn't {a},\" {n} whispered; \"it's only {a2}.\""
    if k == 12:
        return f"{n} {vi} again!"
    if k == 13:
        return f"In the {p}, the {o} @-@ {o2} trade grew {adv}."
    if k == 14:
        return f"Nobody {v} the {o2} ; {m} {vi} {t}."
    return f"{m} {v} the {o} and {n} {v} the {o2}."


def make_text():
    rng = random.Random(TEXT_SEED)
    lines = [" = The Valley of Lanterns = ", ""]
    # A few pieces that exercise the tokenizer's rules; placed so that some land after the vocab cut.
    specials = [
        "Clara said \"hello\" (twice) : then left ; yes! No? Maybe.",
        "The café's owner, Hugo, sold <br /> 3.5 kilograms of \"Golden\" tea (very dear)!",
        "   ",
        "\" ; :",
        "\tTabs\tand  double  spaces are just whitespace .",
        "Zephyr, Quintus and Yolanda (strangers to the valley) arrived unannounced; the xylophone rang!",
    ]
    section = 0
    while sum(len(tokenizer(l)) for l in lines) < 4600:
        if rng.random() < 0.08:
            lines += ["", f" = = {HEADINGS[section % len(HEADINGS)]} = = ", ""]
            section += 1
        k = rng.randrange(1, 5)
        lines.append(" " + " ".join(sentence(rng) for _ in range(k)) + " ")
        if rng.random() < 0.15:
            lines.append("")
    # Spread the special lines over the text; the last two fall after the vocabulary cut (70%).
    n = len(lines)
    for frac, line in reversed(list(zip((0.1, 0.25, 0.4, 0.55, 0.8, 0.9), specials))):
        lines.insert(int(n * frac), line)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# The tutorial's model (https://pytorch.org/tutorials/beginner/transformer_tutorial.html).
# --------------------------------------------------------------------------------------------
from tutorial_lm import TransformerModel  # noqa: E402  (the tutorial's model)


def data_process(lines, stoi):
    data = [torch.tensor([stoi.get(t, 0) for t in tokenizer(line)], dtype=torch.long) for line in lines]
    return torch.cat(tuple(filter(lambda t: t.numel() > 0, data)))


def batchify(data: Tensor, bsz: int) -> Tensor:
    seq_len = data.size(0) // bsz
    data = data[: seq_len * bsz]
    data = data.view(bsz, seq_len).t().contiguous()
    return data


def get_batch(source: Tensor, i: int):
    seq_len = min(BPTT, len(source) - 1 - i)
    data = source[i : i + seq_len]
    target = source[i + 1 : i + 1 + seq_len].reshape(-1)
    return data, target


def train(model, train_data, ntokens):
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1.0, gamma=0.95)
    model.train()
    step, epoch = 0, 0
    while step < TRAIN_STEPS:
        epoch += 1
        for i in range(0, train_data.size(0) - 1, BPTT):
            if step == TRAIN_STEPS:
                break
            data, targets = get_batch(train_data, i)
            output = model(data)
            loss = criterion(output.view(-1, ntokens), targets)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            optimizer.step()
            step += 1
        print(f"epoch {epoch} (step {step}): last train loss {loss.item():.4f}")
        scheduler.step()
    return epoch


FAST_PATH_CALLS = {"n": 0}


def _count_fast_path(name):
    orig = getattr(torch, name)

    def wrapper(*args, **kwargs):
        FAST_PATH_CALLS["n"] += 1
        return orig(*args, **kwargs)

    setattr(torch, name, wrapper)


def evaluate(model, eval_data, ntokens, dtype):
    criterion = nn.CrossEntropyLoss()
    model.eval()
    total_loss = 0.0
    FAST_PATH_CALLS["n"] = 0
    with torch.no_grad():
        for i in range(0, eval_data.size(0) - 1, BPTT):
            data, targets = get_batch(eval_data, i)
            seq_len = data.size(0)
            src_mask = nn.Transformer.generate_square_subsequent_mask(seq_len, dtype=dtype)
            output = model(data, src_mask)
            total_loss += seq_len * criterion(output.view(-1, ntokens), targets).item()
    return total_loss / (len(eval_data) - 1), FAST_PATH_CALLS["n"] > 0


def check_safetensors(path, state):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    assert "__metadata__" not in header, "unexpected metadata (its key order could vary)"
    back = load_file(path)
    assert set(back) == set(state)
    for k, v in state.items():
        assert back[k].dtype == torch.float32 and torch.equal(back[k], v), k


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
    for name in ("_transformer_encoder_layer_fwd", "_native_multi_head_attention"):
        _count_fast_path(name)
    os.makedirs(OUT_DIR, exist_ok=True)

    text = make_text()
    with open(os.path.join(OUT_DIR, "text.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    # Read back the way torchtext's datasets yield lines (with their "\n"; the tokenizer ignores it).
    with open(os.path.join(OUT_DIR, "text.txt"), encoding="utf-8", newline="\n") as f:
        lines = list(f)
    n_vocab_lines = int(len(lines) * VOCAB_FRACTION)
    vocab_lines = lines[:n_vocab_lines]
    itos = REF.build_itos(map(tokenizer, vocab_lines))
    with open(os.path.join(OUT_DIR, "vocab.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(t + "\n" for t in itos))
    stoi = {t: i for i, t in enumerate(itos)}
    ntokens = len(itos)

    all_ids = data_process(lines, stoi)
    train_ids = data_process(vocab_lines, stoi)
    n_unk = int((all_ids == 0).sum())
    print(f"lines {len(lines)} (vocab from first {n_vocab_lines}), tokens {len(all_ids)}, "
          f"train tokens {len(train_ids)}, ntoken {ntokens}, unk in text {n_unk}")
    assert n_unk > 0

    torch.manual_seed(TORCH_SEED)
    model = TransformerModel(ntokens, D_MODEL, NHEAD, D_HID, NLAYERS, DROPOUT, max_len=MAX_LEN)
    epochs = train(model, batchify(train_ids, TRAIN_BATCH), ntokens)

    state = model.state_dict()
    assert all(v.dtype == torch.float32 for v in state.values())
    path = os.path.join(OUT_DIR, "state_dict.safetensors")
    save_file(state, path)
    check_safetensors(path, state)

    eval_data = batchify(all_ids, EVAL_BATCH)
    rows = eval_data.size(0)
    assert (rows - 1) % BPTT != 0, "want a short last window"
    loss32, fast32 = evaluate(model, eval_data, ntokens, torch.float32)
    model64 = copy.deepcopy(model).double()
    loss64, fast64 = evaluate(model64, eval_data, ntokens, torch.float64)
    print(f"float32 loss {loss32} ppl {math.exp(loss32)} (fast path {fast32})")
    print(f"float64 loss {loss64} ppl {math.exp(loss64)} (fast path {fast64})")

    expected = {
        "loss": loss32,
        "ppl": math.exp(loss32),
        "loss_f64": loss64,
        "ppl_f64": math.exp(loss64),
        "tokens": (rows - 1) * EVAL_BATCH,
        "ntoken": ntokens,
        "d_model": D_MODEL,
        "nhead": NHEAD,
        "d_hid": D_HID,
        "nlayers": NLAYERS,
        "dropout": DROPOUT,
        "max_len": MAX_LEN,
        "eval_batch_size": EVAL_BATCH,
        "bptt": BPTT,
        "text_tokens": len(all_ids),
        "unk_tokens": n_unk,
        "vocab_lines": n_vocab_lines,
        "fast_path_f32": fast32,
        "fast_path_f64": fast64,
        "torch_version": TORCH_VERSION,
    }
    with open(os.path.join(OUT_DIR, "expected.json"), "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(expected, indent=2) + "\n")

    params = "\n".join(f"  - `{k}` {list(v.shape)}" for k, v in state.items())
    readme = README.format(
        torch_version=TORCH_VERSION, ntoken=ntokens, n_lines=len(lines), n_vocab_lines=n_vocab_lines,
        text_tokens=len(all_ids), n_unk=n_unk, train_tokens=len(train_ids), steps=TRAIN_STEPS,
        epochs=epochs, rows=rows, tokens=(rows - 1) * EVAL_BATCH, params=params,
        windows=len(range(0, rows - 1, BPTT)),
    )
    with open(os.path.join(OUT_DIR, "README.md"), "w", encoding="utf-8", newline="\n") as f:
        f.write(readme)


README = """# `lm_import` fixture

Test data for `transformer lm import-torch` + `transformer lm eval`: a PyTorch state dict of the
"Language Modeling with nn.Transformer and torchtext" tutorial model, a vocabulary, a text, and the
perplexity PyTorch itself computes for that model on that text.

Generated by `scripts/make_lm_import_fixture.py` with torch {torch_version} on CPU (one thread).
Everything here is synthetic (the text is written by the script from its own word lists).

## Files

- `text.txt`: {n_lines} lines of synthetic English prose with WikiText-like headings
  (` = = Heading = = `), ` @-@ `, punctuation `, . ( ) ! ? ; : ' "`, a `<br />`, a tab, blank lines,
  a line of only spaces and a line whose characters are all dropped by the tokenizer.
  {text_tokens} tokens under `basic_english`.
- `vocab.txt`: the tutorial's vocabulary, one token per line in index order, no header:
  `build_vocab_from_iterator(map(basic_english, lines), specials=['<unk>'])` over the first
  {n_vocab_lines} lines of `text.txt` (70%), i.e. `<unk>` first, then by count descending, ties by
  token ascending. {ntoken} tokens. {n_unk} tokens of the full text map to `<unk>`. Tokenizer and
  ordering come from `crates/text/scripts/torchtext_reference.py`.
- `state_dict.safetensors`: `safetensors.torch.save_file(model.state_dict(), path)`, float32, no
  metadata. The model is the tutorial's `TransformerModel(ntoken={ntoken}, d_model=32, nhead=4,
  d_hid=48, nlayers=2, dropout=0.2)` (`nn.TransformerEncoderLayer` defaults: post-norm, relu,
  eps 1e-5, sequence-first). **One departure from the tutorial:** `PositionalEncoding` was built with
  `max_len=512` instead of 5000, so the persistent buffer `pos_encoder.pe` is `[512, 1, 32]`
  (it holds the same sinusoid rows as the tutorial's first 512). Trained briefly first ({steps} SGD
  steps over {epochs} epochs of the {train_tokens} tokens of the vocabulary lines: batch 20, bptt 35,
  lr 5.0 with StepLR(1, gamma 0.95) per epoch, grad-norm clip 0.5, causal mask). Tensors:
{params}
- `expected.json`: the tutorial's `evaluate` on the whole `text.txt`: `data_process` (ids of every
  line with at least one token, concatenated), `batchify(data, 10)` ({rows} rows), windows of bptt 35
  ({windows} windows, the last one short) with `nn.Transformer.generate_square_subsequent_mask`,
  `loss = sum(seq_len * CrossEntropy) / (rows - 1)`, `ppl = exp(loss)`. `tokens` = (rows - 1) * 10
  = {tokens} target tokens. `loss`/`ppl` are from the float32 model in `eval()` + `no_grad`, exactly
  as PyTorch runs it (`fast_path_f32` says whether the fused inference fast path was taken; with the
  sequence-first layout it is not); `loss_f64`/`ppl_f64` from a float64 copy of the same weights.
  Also records the config, `text_tokens`, `unk_tokens`, `vocab_lines` and `torch_version`.

## Regenerate

From the repository root, with any Python that has torch, numpy and safetensors:

    /path/to/python scripts/make_lm_import_fixture.py

The script is deterministic (fixed seeds, one thread, deterministic algorithms); reruns with the same
torch version give byte-identical files. Other torch versions may give slightly different trained
weights, so regenerate all files together.
"""


if __name__ == "__main__":
    main()
