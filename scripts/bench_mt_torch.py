#!/usr/bin/env python3
"""PyTorch side of the translation benchmark: the default `transformer mt` model written with
`torch.nn.Transformer`, timed as `transformer bench mt` and `transformer bench mt-decode` time
ours.

Two subcommands, each on the CPU (default) or a CUDA GPU (`--device cuda`, `cuda:N`):

  train   One training step of the default model (3 + 3 post-norm layers, d_model 256,
          8 heads, FFN 512, ReLU, dropout 0.1; one shared (V, 256) embedding matrix for the
          source embedding, the target embedding and the output layer, plus an output bias)
          on a fixed, deterministic padded batch that `transformer bench mt` builds
          identically. `--model base` takes the paper's base model instead (6 + 6 layers,
          d_model 512, 8 heads, FFN 2048, dropout 0.1, the same shared embedding layout).
          One timed step = zero_grad, forward, label-smoothed cross-entropy (0.1, padding
          ignored), backward, clip_grad_norm_(1.0), Adam step (betas 0.9/0.98, eps 1e-9,
          constant lr 5e-4). Eager fp32, or bf16 autocast around forward and loss
          (`--precision bf16`: the usual CPU mixed precision, or on a GPU
          torch.autocast("cuda", torch.bfloat16)). On a GPU every timed step ends with
          torch.cuda.synchronize(), and the JSON adds the peak GPU memory allocated.

  decode  Loads a trained run's weights (`transformer mt train --out RUN`) into the same
          nn.Transformer model and translates source token ids with beam search (or greedy
          with --beam 1) the way most PyTorch code does it: the encoder runs once per batch,
          and every step runs the decoder over the whole prefix again (no key/value cache).
          The search itself follows `crates/decode/src/search.rs` step for step (2 x beam
          candidates per step, an `<eos>` among the first `beam` finishes a hypothesis, the
          greedy path carried along, the same stopping rule, length penalty and length
          limit), so its outputs can be compared id for id with ours. With `--device cuda`
          the network (encoder, decoder, output layer, log-softmax) runs on the GPU and the
          search reads each step's log-probabilities on the host (one copy per step).

Examples:

  scripts/bench_mt_torch.py train --repeats 3
  scripts/bench_mt_torch.py train --precision bf16 --json
  scripts/bench_mt_torch.py train --device cuda --json
  scripts/bench_mt_torch.py train --device cuda --model base --precision bf16 --json
  transformer bench mt-decode --run runs/de-en --src test.de.gz --beam 5 --dump runs/bench
  scripts/bench_mt_torch.py decode --run runs/de-en --src-ids runs/bench/src.ids \\
      --ref-ids runs/bench/hyp.ids --beam 5 --batch 64 --greedy-latency 50 --json
  scripts/bench_mt_torch.py decode --device cuda --run runs/de-en \\
      --src-ids runs/bench/src.ids --ref-ids runs/bench/hyp.ids --beam 5 --batch 64 --json
"""

import json
import math
import os
import statistics
import sys
import time
import warnings

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mt_run  # noqa: E402  (reading run directories, shared with the CTranslate2 scripts)

# nn.TransformerEncoder mentions its nested-tensor fast path in a warning on some inputs.
warnings.filterwarnings("ignore", message=".*enable_nested_tensor.*")
warnings.filterwarnings("ignore", message=".*nested tensors is in prototype.*")


# ---- The device ----------------------------------------------------------------------------

def pick_device(name: str) -> torch.device:
    """`cpu`, `cuda` or `cuda:N` as a torch.device; a CUDA device must be there."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise SystemExit(f"--device {name}: not a device (cpu, cuda or cuda:N)") from None
    if device.type not in ("cpu", "cuda"):
        raise SystemExit(f"--device {name}: only cpu, cuda and cuda:N are supported")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: this PyTorch ({torch.__version__}) sees no CUDA GPU")
    return device


def synchronize(device: torch.device) -> None:
    """Waits for the GPU's queued work (a no-op on the CPU), so a clock read after it counts
    the work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_label(device: torch.device) -> str:
    """The JSON's "device": `cpu`, or the GPU's name (e.g. `NVIDIA H100 80GB HBM3`)."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def set_threads(device: torch.device, threads: int) -> None:
    """torch.set_num_threads on the CPU; on a GPU the host keeps PyTorch's default."""
    if device.type == "cpu":
        torch.set_num_threads(threads)


# ---- The model -----------------------------------------------------------------------------

class MtTransformer(nn.Module):
    """Figure 1 of the paper on top of nn.Transformer: embeddings scaled by sqrt(d_model),
    sinusoidal positions (interleaved sin/cos, as our `PositionalEncoding`), dropout, the
    encoder-decoder core, and an output layer. With `share_embeddings` one matrix serves as
    source embedding, target embedding and output weight (with its own output bias)."""

    def __init__(self, vocab_src, vocab_tgt, d_model=256, nhead=8, num_encoder_layers=3,
                 num_decoder_layers=3, dim_feedforward=512, dropout=0.1, layer_norm_eps=1e-5,
                 norm_first=False, max_len=5000, share_embeddings=True):
        super().__init__()
        self.d_model = d_model
        self.share_embeddings = share_embeddings
        self.src_embedding = nn.Embedding(vocab_src, d_model)
        if share_embeddings:
            if vocab_src != vocab_tgt:
                raise ValueError("shared embeddings need one joint vocabulary")
            # (No second module: the target side uses src_embedding, see tgt_emb.)
            self.tgt_embedding = None
            self.generator_weight = None
        else:
            self.tgt_embedding = nn.Embedding(vocab_tgt, d_model)
            self.generator_weight = nn.Parameter(torch.empty(vocab_tgt, d_model))
            nn.init.xavier_uniform_(self.generator_weight)
        self.generator_bias = nn.Parameter(torch.zeros(vocab_tgt))
        self.transformer = nn.Transformer(
            d_model=d_model, nhead=nhead, num_encoder_layers=num_encoder_layers,
            num_decoder_layers=num_decoder_layers, dim_feedforward=dim_feedforward,
            dropout=dropout, activation="relu", layer_norm_eps=layer_norm_eps,
            batch_first=True, norm_first=norm_first)
        # As ours: the shared matrix is initialised with entries of standard deviation
        # d_model^-1/2 (uniform), the other matrices by nn.Transformer (Xavier-uniform).
        bound = math.sqrt(3.0 / d_model)
        nn.init.uniform_(self.src_embedding.weight, -bound, bound)
        if not share_embeddings:
            nn.init.xavier_uniform_(self.tgt_embedding.weight)
        self.register_buffer("pe", torch.from_numpy(mt_run.sinusoid_table(max_len, d_model)),
                             persistent=False)
        self.pos_dropout = nn.Dropout(dropout)

    def tgt_emb(self):
        return self.src_embedding if self.share_embeddings else self.tgt_embedding

    def output_weight(self):
        return self.src_embedding.weight if self.share_embeddings else self.generator_weight

    def embed(self, emb, ids):
        """(B, T) ids -> (B, T, C): scaled embedding + positions 0..T-1, then dropout."""
        x = emb(ids) * math.sqrt(self.d_model)
        return self.pos_dropout(x + self.pe[: ids.size(1)])

    def encode(self, src, src_pad):
        return self.transformer.encoder(self.embed(self.src_embedding, src),
                                        src_key_padding_mask=src_pad)

    def decode_hidden(self, tgt, memory, memory_pad, tgt_pad=None):
        t = tgt.size(1)
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=tgt.device), diagonal=1)
        return self.transformer.decoder(
            self.embed(self.tgt_emb(), tgt), memory, tgt_mask=causal,
            tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=memory_pad,
            tgt_is_causal=True)

    def logits(self, h):
        return F.linear(h, self.output_weight(), self.generator_bias)

    def forward(self, src, tgt_in, pad=mt_run.PAD):
        """Teacher forcing: (B, S), (B, T) ids -> (B, T, V) logits. Masks: source key padding
        (encoder and encoder-decoder attention), causal + target key padding (decoder)."""
        src_pad = src.eq(pad)
        memory = self.encode(src, src_pad)
        return self.logits(self.decode_hidden(tgt_in, memory, src_pad, tgt_in.eq(pad)))


# `train --model`: the default `transformer mt` model and the paper's base model (Table 3).
MODELS = {
    "default": dict(d_model=256, nhead=8, num_encoder_layers=3, num_decoder_layers=3,
                    dim_feedforward=512, dropout=0.1),
    "base": dict(d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6,
                 dim_feedforward=2048, dropout=0.1),
}


def model_from_run(run: mt_run.Run) -> MtTransformer:
    """Builds the model a run describes and loads its trained weights (eval mode)."""
    t = run.transformer
    m = MtTransformer(
        run.src_vocab, run.tgt_vocab, d_model=t["d_model"], nhead=t["nhead"],
        num_encoder_layers=t["num_encoder_layers"], num_decoder_layers=t["num_decoder_layers"],
        dim_feedforward=t["dim_feedforward"], dropout=t["dropout"],
        layer_norm_eps=t["layer_norm_eps"], norm_first=t["norm_first"], max_len=t["max_len"],
        share_embeddings=run.share_embeddings)
    w = run.weights
    state = {}
    used = set()

    def take(name):
        used.add(name)
        return torch.from_numpy(w[name])

    state["src_embedding.weight"] = take("src_embedding.weight")
    if not run.share_embeddings:
        state["tgt_embedding.weight"] = take("tgt_embedding.weight")
        state["generator_weight"] = take("generator.weight")
    state["generator_bias"] = take("generator.bias")
    for name in m.state_dict():
        if not name.startswith("transformer."):
            continue
        for packed, kind in (("in_proj_weight", "weight"), ("in_proj_bias", "bias")):
            if name.endswith(packed):
                prefix = name[: -len(packed)]
                state[name] = torch.cat([take(f"{prefix}{p}_proj.{kind}") for p in "qkv"], 0)
                break
        else:
            state[name] = take(name)
    unused = sorted(set(w) - used)
    if unused:
        raise SystemExit(f"{run.path}: weights not used by the PyTorch model: {unused[:8]}")
    m.load_state_dict(state, strict=True)
    return m.eval()


# ---- train ---------------------------------------------------------------------------------

def bench_batch(batch, src_len, tgt_len, vocab):
    """The benchmark's fixed batch, as `transformer bench mt` builds it: row i has source
    length S - i % 6 and target length T - 5i % 7; source ids 4 + (977 i + 7919 j + 13) mod
    (V - 4), target ids y(i, j) = 4 + (131 i + 7919 j) mod (V - 4), tgt_in = y(i, j),
    tgt_out = y(i, j + 1); pad (0) elsewhere. Returns int64 tensors and the target tokens."""
    span = vocab - 4
    src = torch.zeros(batch, src_len, dtype=torch.int64)
    tin = torch.zeros(batch, tgt_len, dtype=torch.int64)
    tout = torch.zeros(batch, tgt_len, dtype=torch.int64)
    tokens = 0
    for i in range(batch):
        sl = src_len - i % 6
        tl = tgt_len - (i * 5) % 7
        for j in range(sl):
            src[i, j] = 4 + (i * 977 + j * 7919 + 13) % span
        for j in range(tl):
            tin[i, j] = 4 + (i * 131 + j * 7919) % span
            tout[i, j] = 4 + (i * 131 + (j + 1) * 7919) % span
        tokens += tl
    return src, tin, tout, tokens


def cmd_train(a):
    if a.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    if a.src_len < 6 or a.tgt_len < 7 or a.vocab <= 4 or a.batch < 1:
        raise SystemExit("--batch must be positive, --src-len at least 6, --tgt-len at least 7, "
                         "--vocab above 4")
    device = pick_device(a.device)
    set_threads(device, a.threads)
    torch.manual_seed(a.seed)
    # Built (and initialised) on the CPU, then moved: the same initial weights on any device.
    model = MtTransformer(a.vocab, a.vocab, **MODELS[a.model]).to(device).train()
    nparams = sum(p.numel() for p in model.parameters())
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1, ignore_index=mt_run.PAD)
    opt = torch.optim.Adam(model.parameters(), lr=5e-4, betas=(0.9, 0.98), eps=1e-9)
    src, tgt_in, tgt_out, tokens = bench_batch(a.batch, a.src_len, a.tgt_len, a.vocab)
    assert tokens == int(tgt_out.ne(mt_run.PAD).sum())
    src, tgt_in, tgt_out = src.to(device), tgt_in.to(device), tgt_out.to(device)
    autocast = a.precision == "bf16"
    last_loss = [float("nan")]

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(src, tgt_in)
            loss = criterion(logits.reshape(-1, logits.size(-1)), tgt_out.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        last_loss[0] = loss.item()

    if device.type == "cuda":
        # The peak from here on: the model, the optimizer state and the steps' activations.
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(a.warmup):
        step()
    synchronize(device)
    ms = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        step()
        synchronize(device)
        ms.append((time.perf_counter() - t0) * 1e3)
    med = statistics.median(ms)
    out = {
        "impl": "pytorch",
        "torch": torch.__version__,
        "device": device_label(device),
        "model": a.model,
        "threads": torch.get_num_threads(),
        "precision": a.precision,
        "train_step_ms": med,
        "train_step_ms_all": ms,
        "tgt_tokens": tokens,
        "tokens_per_s": tokens / (med / 1e3),
        "peak_rss_mb": mt_run.peak_rss_mb(),
        "parameters": nparams,
        "final_loss": last_loss[0],
        "shapes": {"batch": a.batch, "src_len": a.src_len, "tgt_len": a.tgt_len,
                   "vocab": a.vocab, "warmup": a.warmup, "repeats": a.repeats},
    }
    if device.type == "cuda":
        out["gpu_peak_mem_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    if a.json:
        print(json.dumps(out))
        return
    where = (f"{out['threads']} threads" if device.type == "cpu"
             else f"{out['device']} ({device})")
    gpu_mem = (f", peak GPU memory {out['gpu_peak_mem_mb']:.0f} MB"
               if "gpu_peak_mem_mb" in out else "")
    print(f"PyTorch {torch.__version__} eager {a.precision}, {where}; {a.model} model, "
          f"{nparams} parameters; training step ({a.batch} x {a.src_len} -> {a.tgt_len}, "
          f"{tokens} target tokens): best {min(ms):.1f} ms, median {med:.1f} ms "
          f"({out['tokens_per_s']:.0f} target tokens/s); peak RSS {out['peak_rss_mb']:.0f} MB"
          f"{gpu_mem}")


# ---- decode --------------------------------------------------------------------------------

class Searcher:
    """Greedy and beam search over a batch of sources, as crates/decode/src/search.rs does
    them, with the decoder recomputed over the whole prefix at every step. The network runs
    on the model's device; the beam search's bookkeeping reads each step's log-probabilities
    on the host."""

    def __init__(self, model: MtTransformer, run: mt_run.Run, device: torch.device):
        self.model = model
        self.run = run
        self.device = device

    def _normalized(self, score, length):
        lp = self.run.length_penalty
        return score if lp == 0.0 else score / (max(length, 1) ** lp)

    def _start(self, sources):
        """Pads the sources (B, S), encodes them once; returns memory, padding, lengths."""
        s = max(len(x) for x in sources)
        src = torch.zeros(len(sources), s, dtype=torch.int64)
        for i, x in enumerate(sources):
            src[i, : len(x)] = torch.tensor(x, dtype=torch.int64)
        src = src.to(self.device)
        pad = src.eq(mt_run.PAD)
        memory = self.model.encode(src, pad)
        lens = (~pad).sum(1).tolist()
        return memory, pad, lens

    def _step(self, memory, pad, sentence_of_row, prefixes):
        """Next-token log-probabilities (R, V) for each row's prefix (`<bos>` + tokens), the
        decoder run over the whole prefix. On the model's device."""
        idx = torch.tensor(sentence_of_row, dtype=torch.int64).to(self.device)
        tgt = torch.tensor([[mt_run.BOS] + p for p in prefixes], dtype=torch.int64).to(self.device)
        h = self.model.decode_hidden(tgt, memory.index_select(0, idx), pad.index_select(0, idx))
        return F.log_softmax(self.model.logits(h[:, -1]), dim=-1)

    def greedy(self, sources):
        memory, pad, lens = self._start(sources)
        n = len(sources)
        done = [None] * n
        rows = list(range(n))  # live sentences
        tokens = [[] for _ in range(n)]
        while rows:
            lp = self._step(memory, pad, rows, [tokens[s] for s in rows])
            best = lp.argmax(-1).tolist()
            keep = []
            for r, s in enumerate(rows):
                # At the length limit `<eos>` is forced.
                tok = mt_run.EOS if len(tokens[s]) >= self.run.max_len(lens[s]) else best[r]
                if tok == mt_run.EOS:
                    done[s] = tokens[s]
                else:
                    tokens[s].append(tok)
                    keep.append(s)
            rows = keep
        return done

    def _keep_finished(self, finished, hyp, k):
        """Adds hyp (tokens, score) while fewer than k are finished; after that, puts it in
        place of the worst by normalised score when it normalises better (as ours,
        `keep_finished` in crates/decode/src/search.rs). Returns whether it was kept."""
        if len(finished) < k:
            finished.append(hyp)
            return True
        norm = [self._normalized(sc, len(toks) + 1) for toks, sc in finished]
        # The first of equals, as Rust's min_by.
        w = min(range(len(norm)), key=lambda i: (norm[i], i))
        if self._normalized(hyp[1], len(hyp[0]) + 1) > norm[w]:
            finished[w] = hyp
            return True
        return False

    def beam(self, sources, k):
        memory, pad, lens = self._start(sources)
        n = len(sources)
        eos = mt_run.EOS
        finished = [[] for _ in range(n)]  # (tokens, score) per sentence
        # Live rows, grouped by sentence: (sentence, tokens, score, is the greedy path).
        rows = [(s, [], 0.0, True) for s in range(n)]
        while rows:
            # On the host: the search below reads scores row by row (one copy per step
            # instead of a GPU round trip per score; the same tensor on the CPU).
            lp = self._step(memory, pad, [r[0] for r in rows], [r[1] for r in rows]).cpu()
            lp64 = lp.double()
            scores = torch.tensor([r[2] for r in rows], dtype=torch.float64)
            total = lp64 + scores[:, None]
            vocab = lp.size(1)
            next_rows = []
            start = 0
            while start < len(rows):
                sentence = rows[start][0]
                end = start
                while end < len(rows) and rows[end][0] == sentence:
                    end += 1
                if len(rows[start][1]) >= self.run.max_len(lens[sentence]):
                    # The length limit: every live hypothesis ends here, `<eos>` forced.
                    for r in range(start, end):
                        finished[sentence].append(
                            (rows[r][1], rows[r][2] + float(lp[r, eos])))
                    start = end
                    continue
                # The 2k best (score, row, token) over this sentence's rows, best first.
                flat = total[start:end].reshape(-1)
                top_s, top_i = flat.topk(min(2 * k, flat.numel()))
                cand = [(sv, start + i // vocab, i % vocab)
                        for sv, i in zip(top_s.tolist(), top_i.tolist())]
                # The greedy row's own next step, which the beam must not lose.
                greedy_next = None
                for r in range(start, end):
                    if rows[r][3]:
                        greedy_next = (r, int(lp[r].argmax()))
                        break
                greedy_kept = False
                live = 0
                for rank, (sc, r, t) in enumerate(cand):
                    parent = rows[r]
                    is_greedy = greedy_next == (r, t)
                    if t == eos:
                        # An ending counts only from among the k best extensions; once k
                        # are finished, it replaces the worst of them if it normalises
                        # better.
                        if rank < k and self._keep_finished(finished[sentence], (parent[1], sc), k):
                            greedy_kept |= is_greedy
                    elif live < k:
                        live += 1
                        greedy_kept |= is_greedy
                        next_rows.append((sentence, parent[1] + [t], sc, is_greedy))
                # The greedy path, carried along as one extra row while outside the beam.
                if greedy_next is not None and not greedy_kept:
                    r, t = greedy_next
                    parent = rows[r]
                    sc = parent[2] + float(lp64[r, t])
                    if t == eos:
                        finished[sentence].append((parent[1], sc))
                    else:
                        next_rows.append((sentence, parent[1] + [t], sc, True))
                # Done when k hypotheses are finished and the best live one, normalised at
                # its next length, cannot beat the worst of them.
                if len(finished[sentence]) >= k:
                    worst = min(self._normalized(sc, len(toks) + 1)
                                for toks, sc in finished[sentence])
                    best_live = max((self._normalized(r[2], len(r[1]) + 1)
                                     for r in next_rows if r[0] == sentence),
                                    default=-math.inf)
                    if best_live <= worst:
                        while next_rows and next_rows[-1][0] == sentence:
                            next_rows.pop()
                start = end
            rows = next_rows
        out = []
        for hs in finished:
            # The best by normalised score (the last of equals, as Rust's max_by).
            best, best_n = None, -math.inf
            for toks, sc in hs:
                nv = self._normalized(sc, len(toks) + 1)
                if best is None or nv >= best_n:
                    best, best_n = toks, nv
            out.append(best)
        return out

    def translate(self, sources, beam):
        return self.greedy(sources) if beam <= 1 else self.beam(sources, beam)


def cmd_decode(a):
    device = pick_device(a.device)
    set_threads(device, a.threads)
    run = mt_run.load_run(a.run)
    model = model_from_run(run).to(device)
    searcher = Searcher(model, run, device)
    beam = a.beam if a.beam is not None else run.beam
    sources = mt_run.read_sources(a.src_ids, a.max_sentences)
    order, translate_all = mt_run.batched_translator(
        sources, a.batch, lambda idx, k: searcher.translate([sources[i] for i in idx], k))

    with torch.inference_mode():
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        synchronize(device)
        t0 = time.perf_counter()
        hyps = translate_all(beam)
        synchronize(device)
        seconds = time.perf_counter() - t0
        rss = mt_run.peak_rss_mb()
        gpu_mem = (torch.cuda.max_memory_allocated(device) / 2**20
                   if device.type == "cuda" else None)
        latency = None
        n_lat = min(a.greedy_latency, len(order))
        if n_lat > 0:
            ms = []
            for src in [s for s in sources if s][:n_lat]:
                synchronize(device)
                t1 = time.perf_counter()
                searcher.greedy([src])
                synchronize(device)
                ms.append((time.perf_counter() - t1) * 1e3)
            latency = statistics.median(ms)
        same, same_greedy = mt_run.agreement(hyps, beam, a.ref_ids, a.ref_greedy_ids,
                                             translate_all)
    out = {
        "impl": "pytorch",
        "torch": torch.__version__,
        "device": device_label(device),
        "threads": torch.get_num_threads(),
        "kv_cache": False,
        "beam": beam,
        "batch": a.batch,
        "length_penalty": run.length_penalty,
        "max_len_a": run.max_len_a,
        "max_len_b": run.max_len_b,
        **mt_run.decode_figures(hyps, seconds, latency, n_lat, rss, same, same_greedy),
    }
    n = out["sentences"]
    if gpu_mem is not None:
        out["gpu_peak_mem_mb"] = gpu_mem
    if a.out_ids:
        mt_run.write_id_lines(a.out_ids, hyps)
    if a.json:
        print(json.dumps(out))
        return
    where = (f"{out['threads']} threads" if device.type == "cpu"
             else f"{out['device']} ({device})")
    print(f"PyTorch {torch.__version__}, {where}, no cache: {n} sentences, "
          f"beam {beam}, batch {a.batch}: {seconds:.2f} s ({out['sentences_per_s']:.1f} "
          f"sentences/s, {out['tokens_per_s']:.0f} tokens/s); peak RSS {rss:.0f} MB"
          + (f", peak GPU memory {gpu_mem:.0f} MB" if gpu_mem is not None else ""))
    mt_run.print_agreement(latency, n_lat, same, same_greedy)


# ---- command line --------------------------------------------------------------------------

def main():
    cores = len(os.sched_getaffinity(0))
    p = mt_run.argument_parser(__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="time one training step on the fixed benchmark batch",
                       description="Time one training step of the default (or base) "
                                   "translation model on the batch `transformer bench mt` uses.")
    t.add_argument("--batch", type=int, default=128, help="sentences in the batch (128)")
    t.add_argument("--src-len", type=int, default=18,
                   help="longest source row; rows are 0-5 tokens shorter (18)")
    t.add_argument("--tgt-len", type=int, default=18,
                   help="longest target row; rows are 0-6 tokens shorter (18)")
    t.add_argument("--vocab", type=int, default=8000, help="joint vocabulary size (8000)")
    t.add_argument("--warmup", type=int, default=2, help="untimed steps first (2)")
    t.add_argument("--repeats", type=int, default=10, help="timed steps; the median is "
                   "reported (10)")
    t.add_argument("--model", choices=list(MODELS), default="default",
                   help="default (3 + 3 layers, d_model 256, FFN 512) or base (the paper's: "
                        "6 + 6 layers, d_model 512, FFN 2048); 8 heads, dropout 0.1 both")
    t.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (cpu)")
    t.add_argument("--threads", type=int, default=cores,
                   help=f"torch.set_num_threads on the CPU (default: the {cores} cores this "
                        "process may use); not set with a GPU")
    t.add_argument("--precision", choices=["f32", "bf16"], default="f32",
                   help="f32 (eager) or bf16 (torch.autocast around forward and loss, on the "
                        "CPU or the GPU)")
    t.add_argument("--seed", type=int, default=0, help="initialisation and dropout seed (0)")
    t.add_argument("--json", action="store_true", help="print one JSON line")
    t.set_defaults(func=cmd_train)

    d = sub.add_parser("decode", help="translate token ids with a trained run's weights",
                       description="Translate source token ids with a trained run's weights "
                                   "(greedy or beam search, no key/value cache) and time it.")
    d.add_argument("--run", required=True, help="run directory (config.toml, best.safetensors)")
    mt_run.add_id_file_args(d)
    d.add_argument("--beam", type=int, default=None,
                   help="beam size, 1 = greedy (default: the run's config.toml)")
    d.add_argument("--batch", type=int, default=64,
                   help="sentences per batch; beams multiply the decoder's rows (64)")
    d.add_argument("--max-sentences", type=int, default=None,
                   help="translate only the first N lines")
    mt_run.add_greedy_latency_arg(d)
    d.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (cpu)")
    d.add_argument("--threads", type=int, default=cores,
                   help=f"torch.set_num_threads on the CPU (default: {cores}); not set with a GPU")
    d.add_argument("--json", action="store_true", help="print one JSON line")
    d.set_defaults(func=cmd_decode)

    a = p.parse_args()
    a.func(a)


if __name__ == "__main__":
    main()
