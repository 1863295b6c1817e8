#!/usr/bin/env python3
"""Build the MarianMT (OPUS-MT-shaped) reference fixtures for the Rust Marian reader.

What it makes (under crates/runtime/tests/fixtures/marian/):
  marian-de-en/          A tiny Hugging Face MarianMTModel directory shaped like a real
                         OPUS-MT one: config.json, generation_config.json, model.safetensors,
                         vocab.json, source.spm, target.spm, tokenizer_config.json,
                         special_tokens_map.json.
  marian-de-en-bin/      The same model with the weights as pytorch_model.bin (no safetensors).
  marian-de-en-ct2/      ct2-transformers-converter output of marian-de-en (float32).
  marian-de-en-ct2-int8/ The same, --quantization int8.
  expected.json          Tokenizer ids, generate() outputs (greedy and beam 4, float32 and
                         float64 torch), and CTranslate2 outputs for the first N lines of
                         Multi30k test_2016_flickr.de.
  logits.safetensors     Teacher-forced decoder logits (float32 and float64) for 20 lines.
  de_en.argosmodel       An Argos-Translate-shaped package (zip) built from a second tiny
                         Marian model that uses ONE joint de+en SentencePiece model.
  argos_expected.json    CTranslate2 translations of 20 lines through that package.

Model: d_model 64, 2+2 layers, 4 heads, ffn 128, swish, scale_embedding, sinusoidal
positions, shared (tied) embeddings, vocab = joint Marian vocab of two 1000-piece unigram
SentencePiece models (</s>=0, <unk>=1, ..., <pad> last), trained briefly on Multi30k train.
Everything is seeded; with the same package versions the output is reproducible.

Run (from the repository root; needs ../shared/data/multi30k, see its README):
  python3 -m venv /work/venvs/marian
  /work/venvs/marian/bin/pip install torch transformers sentencepiece safetensors numpy ctranslate2
  /work/venvs/marian/bin/python scripts/make_marian_fixtures.py [--n-lines 200] [--steps 2500]

Time: about 12 minutes on one CPU thread (spm training ~20 s, Marian training ~5 min,
references for 200 lines ~1.5 min, Argos model training ~3 min). --n-lines 1000 adds
~6 minutes and ~3 MB. It uses torch.set_num_threads(1).
Versions used for the committed fixtures: see expected.json "meta".
"""

import argparse
import copy
import gzip
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
import torch

torch.set_num_threads(1)
torch.set_num_interop_threads(1)

import ctranslate2  # noqa: E402
import safetensors  # noqa: E402
import sentencepiece as spm  # noqa: E402
import transformers  # noqa: E402
from safetensors.numpy import save_file as np_save_file  # noqa: E402
from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DATA = (REPO / ".." / "shared" / "data" / "multi30k" / "task1" / "raw").resolve()
OUT = REPO / "crates" / "runtime" / "tests" / "fixtures" / "marian"

SEED = 1234
MAX_TRAIN_LINES = 30000
# HF max_length 128 counts the decoder start token; CT2's default max_decoding_length (256)
# would run past the 128-row position table, so cap CT2 at 127 generated tokens.
CT2_MAX_DECODING = 127


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def read_gz_lines(path, limit=None):
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            out.append(line.rstrip("\n"))
            if limit is not None and len(out) >= limit:
                break
    return out


def train_spm(lines, prefix, vocab_size):
    """Unigram SentencePiece model, SentencePiece defaults + nmt_nfkc (as OPUS-MT).

    Trained with relative paths from inside the work dir: the .model file stores its
    trainer spec (input path, model_prefix), so absolute temp paths would make it differ
    from run to run."""
    prefix = Path(prefix)
    name = prefix.name
    with open(prefix.parent / (name + ".txt"), "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
    cwd = os.getcwd()
    os.chdir(prefix.parent)
    try:
        spm.set_random_generator_seed(SEED)
        spm.SentencePieceTrainer.train(
            input=name + ".txt",
            model_prefix=name,
            vocab_size=vocab_size,
            model_type="unigram",
            normalization_rule_name="nmt_nfkc",
            num_threads=1,
            minloglevel=2,
        )
    finally:
        os.chdir(cwd)
    return str(prefix.parent / (name + ".model"))


def spm_pieces(model_path):
    sp = spm.SentencePieceProcessor(model_file=model_path)
    pieces = []
    for i in range(sp.get_piece_size()):
        if sp.is_control(i) or sp.is_unknown(i):
            continue  # <s>, </s>, <unk> of the spm model are not Marian vocabulary entries
        pieces.append(sp.id_to_piece(i))
    return pieces


def build_vocab(*spm_models):
    """OPUS-MT layout: </s> 0, <unk> 1, pieces of the spm models (first occurrence), <pad> last."""
    vocab = {"</s>": 0, "<unk>": 1}
    for m in spm_models:
        for p in spm_pieces(m):
            if p not in vocab:
                vocab[p] = len(vocab)
    vocab["<pad>"] = len(vocab)
    return vocab


def write_special_tokens_map(d):
    # transformers 5 no longer writes special_tokens_map.json; real OPUS-MT dirs have one.
    if not (d / "special_tokens_map.json").exists():
        with open(d / "special_tokens_map.json", "w", encoding="utf-8") as f:
            json.dump({"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}, f)


def make_config(vocab_size, pad):
    return MarianConfig(
        vocab_size=vocab_size,
        decoder_vocab_size=vocab_size,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        activation_function="swish",
        scale_embedding=True,
        max_position_embeddings=128,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        bos_token_id=0,
        forced_eos_token_id=0,
        share_encoder_decoder_embeddings=True,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
    )


def make_generation_config(pad):
    return GenerationConfig(
        bad_words_ids=[[pad]],
        bos_token_id=0,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        max_length=128,
        num_beams=4,
        pad_token_id=pad,
    )


def zero_pad_row(model, pad):
    # Converted OPUS-MT models have an all-zero <pad> embedding row (the decoder start);
    # CTranslate2 relies on it (start_from_zero_embedding). Keep it zero during training.
    with torch.no_grad():
        model.model.shared.weight[pad].zero_()


def train_model(model, src_ids, tgt_ids, pad, steps, batch_size, lr, warmup, seed):
    """Teacher-forced training. labels = target ids + </s> (pads -> -100)."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-9)
    decay_start = int(0.7 * steps)

    def lr_factor(s):  # linear warmup, constant, linear decay to 0.1 over the last 30%
        f = min(1.0, (s + 1) / warmup)
        if s >= decay_start:
            f *= 1.0 - 0.9 * (s - decay_start) / max(1, steps - decay_start)
        return f

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    model.train()
    zero_pad_row(model, pad)
    n = len(src_ids)
    losses = []
    t0 = time.time()
    for step in range(steps):
        idx = torch.randint(0, n, (batch_size,), generator=g).tolist()
        s = [src_ids[i] for i in idx]
        t = [tgt_ids[i] for i in idx]
        ls, lt = max(map(len, s)), max(map(len, t))
        inp = torch.full((batch_size, ls), pad, dtype=torch.long)
        att = torch.zeros((batch_size, ls), dtype=torch.long)
        lab = torch.full((batch_size, lt), -100, dtype=torch.long)
        for b in range(batch_size):
            inp[b, : len(s[b])] = torch.tensor(s[b])
            att[b, : len(s[b])] = 1
            lab[b, : len(t[b])] = torch.tensor(t[b])
        out = model(input_ids=inp, attention_mask=att, labels=lab)
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        zero_pad_row(model, pad)
        losses.append(out.loss.item())
        if (step + 1) % 100 == 0 or step == 0:
            log(f"  step {step + 1}/{steps} loss {np.mean(losses[-100:]):.4f} ({time.time() - t0:.0f}s)")
    model.eval()
    log(f"  training took {time.time() - t0:.0f}s")
    return {
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "warmup": warmup,
        "loss_first_100": float(np.mean(losses[:100])),
        "loss_last_100": float(np.mean(losses[-100:])),
    }  # (timings are logged, not stored, so that reruns are byte-identical)


def set_final_logits_bias(model, pad, seed):
    g = torch.Generator().manual_seed(seed)
    bias = torch.randn((1, model.final_logits_bias.shape[-1]), generator=g) * 0.1
    bias[0, pad] = 0.0  # converted OPUS-MT models have 0 there (the appended <pad> entry)
    with torch.no_grad():
        model.final_logits_bias.copy_(bias)


def save_bin_dir(model, tok, src_dir, dst_dir):
    """Config + tokenizer files + pytorch_model.bin (torch.save of the state dict, as
    transformers 4.x save_pretrained(safe_serialization=False) wrote it: tied weights keep
    all their names and share storage; sinusoidal position tables are left out)."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    for name in os.listdir(src_dir):
        if name.endswith(".safetensors"):
            continue
        shutil.copy(src_dir / name, dst_dir / name)
    skip = set(getattr(model, "_keys_to_ignore_on_save", None) or [])
    sd = {k: v for k, v in model.state_dict().items() if k not in skip}
    torch.save(sd, dst_dir / "pytorch_model.bin")
    return sorted(sd.keys())


def assert_same_params(a, b, what):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys(), what
    for k in sa:
        assert torch.equal(sa[k], sb[k]), f"{what}: {k} differs"


def hf_generate(model, input_ids, num_beams):
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            num_beams=num_beams,
            do_sample=False,
            output_scores=True,
            output_logits=(num_beams == 1),
            return_dict_in_generate=True,
        )
    return out


def greedy_record(model, tok, input_ids, pad):
    out = hf_generate(model, input_ids, 1)
    seq = out.sequences[0].tolist()
    gen = seq[1:]
    # full-vocabulary log-probs of the chosen tokens (from the raw logits, pad included in
    # the normaliser) and the log-probs generate() uses (processed logits, pad = -inf)
    lp_full, lp_proc = [], []
    for step, t in enumerate(gen):
        raw = out.logits[step][0].double()
        proc = out.scores[step][0].double()
        lp_full.append(float(torch.log_softmax(raw, -1)[t]))
        lp_proc.append(float(torch.log_softmax(proc, -1)[t]))
    return {
        "sequence": seq,
        "ids": gen,
        "text": tok.decode(seq, skip_special_tokens=True),
        "token_logprobs": [round(x, 7) for x in lp_full],
        "sum_logprob": sum(lp_full),
        "sum_logprob_nopad": sum(lp_proc),
    }


def beam_record(model, tok, input_ids):
    out = hf_generate(model, input_ids, 4)
    seq = out.sequences[0].tolist()
    gen = seq[1:]
    while gen and gen[-1] == model.generation_config.pad_token_id:
        gen.pop()
    return {
        "sequence": seq,
        "ids": gen,
        "text": tok.decode(seq, skip_special_tokens=True),
        "sequences_score": float(out.sequences_scores[0]),
    }


def ct2_convert(model_dir, out_dir, quant=None):
    exe = Path(sys.executable).parent / "ct2-transformers-converter"
    cmd = [str(exe), "--model", str(model_dir), "--output_dir", str(out_dir), "--force"]
    if quant:
        cmd += ["--quantization", quant]
    log("  " + " ".join(cmd))
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def ct2_record(translator, pieces, vocab, beam):
    r = translator.translate_batch(
        [pieces], beam_size=beam, return_scores=True, max_batch_size=1, max_decoding_length=CT2_MAX_DECODING
    )[0]
    toks = r.hypotheses[0]
    return {"tokens": toks, "ids": [vocab.get(t, 1) for t in toks], "score": float(r.scores[0])}


def round_floats(x, nd=7):
    if isinstance(x, float):
        return float(f"{x:.{nd + 3}g}")
    if isinstance(x, dict):
        return {k: round_floats(v, nd) for k, v in x.items()}
    if isinstance(x, list):
        return [round_floats(v, nd) for v in x]
    return x


def dump_json(obj, path, list_key):
    """Readable but compact: one entry of obj[list_key] per line."""
    items = obj[list_key]
    head = {k: v for k, v in obj.items() if k != list_key}
    with open(path, "w", encoding="utf-8") as f:
        body = json.dumps(head, ensure_ascii=False, indent=1)
        f.write(body[:-2] + ',\n "' + list_key + '": [\n')
        for i, it in enumerate(items):
            f.write(json.dumps(it, ensure_ascii=False, separators=(",", ":")))
            f.write(",\n" if i + 1 < len(items) else "\n")
        f.write("]}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-lines", type=int, default=200, help="test lines for references")
    ap.add_argument("--steps", type=int, default=2500, help="training steps (batch 32)")
    ap.add_argument("--argos-steps", type=int, default=1500, help="training steps for the Argos model")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    torch.manual_seed(SEED)
    random.seed(SEED)
    np.random.seed(SEED)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="marian_fix_"))
    t_start = time.time()

    train_de = read_gz_lines(DATA / "train.de.gz", MAX_TRAIN_LINES)
    train_en = read_gz_lines(DATA / "train.en.gz", MAX_TRAIN_LINES)
    test_de = read_gz_lines(DATA / "test_2016_flickr.de.gz")
    assert len(train_de) == len(train_en) == 29000 and len(test_de) == 1000

    # ---- a. SentencePiece models -------------------------------------------------------
    log("training spm models")
    src_spm = train_spm(train_de, str(work / "source"), 1000)
    tgt_spm = train_spm(train_en, str(work / "target"), 1000)

    # ---- b. vocab + tokenizer ----------------------------------------------------------
    vocab = build_vocab(src_spm, tgt_spm)
    pad = vocab["<pad>"]
    V = len(vocab)
    log(f"joint vocab {V} entries, <pad> = {pad}")
    with open(work / "vocab.json", "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False, indent=2)
    tok = MarianTokenizer(
        vocab=str(work / "vocab.json"),
        source_spm=src_spm,
        target_spm=tgt_spm,
        source_lang="de",
        target_lang="en",
        model_max_length=512,
    )
    d_st = out / "marian-de-en"
    d_bin = out / "marian-de-en-bin"
    d_ct2 = out / "marian-de-en-ct2"
    d_ct2_i8 = out / "marian-de-en-ct2-int8"
    for d in (d_st, d_bin, d_ct2, d_ct2_i8):
        if d.exists():
            shutil.rmtree(d)
    d_st.mkdir(parents=True)
    tok.save_pretrained(d_st)
    write_special_tokens_map(d_st)
    tok = MarianTokenizer.from_pretrained(d_st)
    probe = "Ein Mann fährt mit dem Fahrrad über eine Brücke."
    probe_ids = tok(probe).input_ids
    assert probe_ids[-1] == 0, probe_ids
    log(f"tokenizer ok: {probe!r} -> {probe_ids}")
    inv_vocab = {v: k for k, v in vocab.items()}

    # ---- c. model ----------------------------------------------------------------------
    torch.manual_seed(SEED)
    model = MarianMTModel(make_config(V, pad))
    model.generation_config = make_generation_config(pad)
    src_ids = [tok(s).input_ids for s in train_de]
    tgt_ids = [tok(text_target=s).input_ids for s in train_en]
    log(f"training marian ({sum(p.numel() for p in model.parameters())} params)")
    train_info = train_model(model, src_ids, tgt_ids, pad, args.steps, 32, 2e-3, 100, SEED)
    set_final_logits_bias(model, pad, SEED + 1)
    zero_pad_row(model, pad)
    model.eval()
    model.save_pretrained(d_st)  # safetensors (the default in transformers 5)
    assert (d_st / "model.safetensors").exists() and not (d_st / "pytorch_model.bin").exists()
    bin_keys = save_bin_dir(model, tok, d_st, d_bin)
    with safetensors.safe_open(str(d_st / "model.safetensors"), "np") as f:
        st_keys = sorted(f.keys())

    m32 = MarianMTModel.from_pretrained(d_st).eval()
    assert_same_params(model, m32, "safetensors reload")
    m32b = MarianMTModel.from_pretrained(d_bin).eval()
    assert_same_params(model, m32b, "pytorch_model.bin reload")
    del m32b
    m64 = copy.deepcopy(m32).double().eval()
    ref_pos = m32.model.encoder.embed_positions.create_weight()
    assert torch.equal(m32.model.encoder.embed_positions.weight, ref_pos)
    assert torch.equal(m32.model.decoder.embed_positions.weight, ref_pos)
    assert float(m32.model.shared.weight.detach()[pad].abs().max()) == 0.0
    log(f"generation config: {m32.generation_config.to_diff_dict()}")

    # ---- d. references -----------------------------------------------------------------
    log("CTranslate2 conversion")
    ct2_convert(d_st, d_ct2)
    ct2_convert(d_st, d_ct2_i8, "int8")
    tr32 = ctranslate2.Translator(str(d_ct2), device="cpu", inter_threads=1, intra_threads=1)
    tr8 = ctranslate2.Translator(str(d_ct2_i8), device="cpu", inter_threads=1, intra_threads=1)

    n = min(args.n_lines, len(test_de))
    lines = []
    t_ref = time.time()
    agree = {k: 0 for k in ("hf32_greedy_eq_hf64_greedy", "hf32_beam_eq_hf64_beam",
                             "ct2_greedy_eq_hf32_greedy", "ct2_beam_eq_hf32_beam",
                             "ct2int8_greedy_eq_hf32_greedy", "ct2int8_beam_eq_hf32_beam")}
    score_diffs = {"ct2_beam_vs_hf32_sequences_score": [],
                   "ct2_greedy_vs_hf32_sum_logprob_over_len": [],
                   "ct2_greedy_vs_hf32_sum_logprob_nopad_over_len": [],
                   "ct2_greedy_vs_hf32_sum_logprob_nopad_over_len_excl_eos": []}
    for i in range(n):
        text = test_de[i]
        ids = tok(text).input_ids
        x = torch.tensor([ids])
        rec = {"index": i, "src": text, "src_ids": ids,
               "src_pieces": tok.convert_ids_to_tokens(ids), "hf": {}, "ct2": {}}
        for name, m in (("float32", m32), ("float64", m64)):
            rec["hf"][name] = {"greedy": greedy_record(m, tok, x, pad), "beam4": beam_record(m, tok, x)}
        pieces = tok.convert_ids_to_tokens(ids)  # includes the final </s> (add_source_eos is false)
        for name, tr in (("float32", tr32), ("int8", tr8)):
            rec["ct2"][name] = {"greedy": ct2_record(tr, pieces, vocab, 1), "beam4": ct2_record(tr, pieces, vocab, 4)}
        h32, h64 = rec["hf"]["float32"], rec["hf"]["float64"]
        strip = lambda ids_: [t for t in ids_ if t != 0]  # noqa: E731 (drop </s>)
        agree["hf32_greedy_eq_hf64_greedy"] += h32["greedy"]["ids"] == h64["greedy"]["ids"]
        agree["hf32_beam_eq_hf64_beam"] += h32["beam4"]["ids"] == h64["beam4"]["ids"]
        for cname, key in (("float32", "ct2"), ("int8", "ct2int8")):
            c = rec["ct2"][cname]
            agree[f"{key}_greedy_eq_hf32_greedy"] += c["greedy"]["ids"] == strip(h32["greedy"]["ids"])
            agree[f"{key}_beam_eq_hf32_beam"] += c["beam4"]["ids"] == strip(h32["beam4"]["ids"])
        c = rec["ct2"]["float32"]
        if c["beam4"]["ids"] == strip(h32["beam4"]["ids"]):
            score_diffs["ct2_beam_vs_hf32_sequences_score"].append(c["beam4"]["score"] - h32["beam4"]["sequences_score"])
        if c["greedy"]["ids"] == strip(h32["greedy"]["ids"]):
            g = h32["greedy"]
            L = len(g["ids"])
            score_diffs["ct2_greedy_vs_hf32_sum_logprob_over_len"].append(c["greedy"]["score"] - g["sum_logprob"] / L)
            score_diffs["ct2_greedy_vs_hf32_sum_logprob_nopad_over_len"].append(c["greedy"]["score"] - g["sum_logprob_nopad"] / L)
            score_diffs["ct2_greedy_vs_hf32_sum_logprob_nopad_over_len_excl_eos"].append(
                c["greedy"]["score"] - g["sum_logprob_nopad"] / max(1, L - 1))
        lines.append(round_floats(rec))
        if (i + 1) % 50 == 0:
            log(f"  refs {i + 1}/{n} ({time.time() - t_ref:.0f}s)")
    ref_seconds = time.time() - t_ref
    log(f"references for {n} lines took {ref_seconds:.0f}s; agreement {agree}")
    score_summary = {k: ({"n": len(v), "max_abs": float(np.max(np.abs(v))), "mean": float(np.mean(v))} if v else {"n": 0})
                     for k, v in score_diffs.items()}
    log(f"score diffs: {score_summary}")

    # teacher-forced logits for the first 20 lines (decoder input = [pad] + float32 greedy
    # tokens without the final </s>, so row t predicts greedy token t)
    rng = np.random.default_rng(SEED)
    cols = sorted(set([0, 1, pad]) | set(rng.choice(V, 29, replace=False).tolist()))
    tensors = {"columns": np.array(cols, dtype=np.int64)}
    tf_meta = []
    for i in range(min(20, n)):
        ids = lines[i]["src_ids"]
        gseq = lines[i]["hf"]["float32"]["greedy"]["sequence"]
        dec = gseq[:-1] if gseq[-1] == 0 else gseq
        tf_meta.append({"index": i, "input_ids": ids, "decoder_input_ids": dec})
        with torch.no_grad():
            t32 = m32(input_ids=torch.tensor([ids]), decoder_input_ids=torch.tensor([dec])).logits[0]
            t64 = m64(input_ids=torch.tensor([ids]), decoder_input_ids=torch.tensor([dec])).logits[0]
        l32, l64 = t32.numpy().astype(np.float32), t64.numpy().astype(np.float64)
        top = np.argsort(-l64, axis=-1, kind="stable")[:, :8].astype(np.int64)
        tensors[f"top8_ids.{i}"] = np.ascontiguousarray(top)
        for name, t, a in (("f32", t32, l32), ("f64", t64, l64)):
            if i == 0:
                tensors[f"full.{name}.{i}"] = np.ascontiguousarray(a)
            tensors[f"sel.{name}.{i}"] = np.ascontiguousarray(a[:, cols])
            tensors[f"lse.{name}.{i}"] = np.ascontiguousarray(torch.logsumexp(t, -1).numpy().astype(a.dtype))
            tensors[f"top8.{name}.{i}"] = np.ascontiguousarray(np.take_along_axis(a, top, -1))
        # margin between best and second best (shows the argmaxes are not near ties)
        srt = np.sort(l64, -1)
        tf_meta[-1]["min_top1_top2_margin_f64"] = float(np.min(srt[:, -1] - srt[:, -2]))
        tf_meta[-1]["max_abs_f32_minus_f64"] = float(np.max(np.abs(l32.astype(np.float64) - l64)))
        # (false only where greedy hit max_length and </s> was forced at the last step)
        tf_meta[-1]["argmax_equals_greedy"] = bool((np.argmax(l32, -1).tolist()) == gseq[1:])
    np_save_file(tensors, str(out / "logits.safetensors"))

    # ---- e. Argos-shaped package -------------------------------------------------------
    log("Argos package: joint spm + second tiny model")
    joint_spm = train_spm(train_de + train_en, str(work / "joint"), 2000)
    avocab = build_vocab(joint_spm)
    apad = avocab["<pad>"]
    sp_joint = spm.SentencePieceProcessor(model_file=joint_spm)
    a_hf = work / "argos-hf"
    a_hf.mkdir()
    with open(work / "argos_vocab.json", "w", encoding="utf-8") as f:
        json.dump(avocab, f, ensure_ascii=False, indent=2)
    atok = MarianTokenizer(vocab=str(work / "argos_vocab.json"), source_spm=joint_spm,
                           target_spm=joint_spm, source_lang="de", target_lang="en")
    atok.save_pretrained(a_hf)

    def to_ids(s):
        return [avocab.get(p, 1) for p in sp_joint.encode(s, out_type=str)]

    # Argos (OpenNMT-py style) feeds the source pieces WITHOUT </s>; train the same way.
    a_src = [to_ids(s) for s in train_de]
    a_tgt = [to_ids(s) + [0] for s in train_en]
    torch.manual_seed(SEED + 7)
    amodel = MarianMTModel(make_config(len(avocab), apad))
    amodel.generation_config = make_generation_config(apad)
    a_train = train_model(amodel, a_src, a_tgt, apad, args.argos_steps, 32, 2e-3, 100, SEED + 7)
    set_final_logits_bias(amodel, apad, SEED + 8)
    zero_pad_row(amodel, apad)
    amodel.save_pretrained(a_hf)
    a_ct2 = work / "argos-ct2"
    ct2_convert(a_hf, a_ct2)
    pkg_dir_name = "translate-de_en-1_0"
    pkg = work / "pkg" / pkg_dir_name
    (pkg / "model").mkdir(parents=True)
    for name in os.listdir(a_ct2):
        shutil.copy(a_ct2 / name, pkg / "model" / name)
    shutil.copy(joint_spm, pkg / "sentencepiece.model")
    metadata = {
        "package_version": "1.0",
        "argos_version": "1.0",
        "from_code": "de",
        "from_name": "German",
        "to_code": "en",
        "to_name": "English",
        "type": "translate",
        "code": "translate-de_en",
        "name": "German - English (tiny test fixture)",
        "links": [],
    }
    with open(pkg / "metadata.json", "w", encoding="utf-8") as f:
        json.dump(metadata, f, indent=4)
        f.write("\n")
    with open(pkg / "README.md", "w", encoding="utf-8") as f:
        f.write("# German - English (test fixture)\n\nA tiny MarianMT model (d_model 64) trained for a few "
                "hundred steps on Multi30k, converted with ct2-transformers-converter. Not a usable "
                "translator. Made by scripts/make_marian_fixtures.py. No stanza/ directory.\n")
    zpath = out / "de_en.argosmodel"
    if zpath.exists():
        zpath.unlink()
    with zipfile.ZipFile(zpath, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for root, dirs, files in os.walk(pkg.parent):
            dirs.sort()
            rel = Path(root).relative_to(pkg.parent)
            if str(rel) != ".":
                zd = zipfile.ZipInfo(str(rel) + "/", date_time=(2020, 1, 1, 0, 0, 0))
                zd.external_attr = (0o40755 << 16) | 0x10
                z.writestr(zd, b"")
            for fn in sorted(files):
                p = Path(root) / fn
                zi = zipfile.ZipInfo(str(p.relative_to(pkg.parent)), date_time=(2020, 1, 1, 0, 0, 0))
                zi.compress_type = zipfile.ZIP_DEFLATED
                zi.external_attr = 0o644 << 16
                z.writestr(zi, p.read_bytes())
    atr = ctranslate2.Translator(str(pkg / "model"), device="cpu", inter_threads=1, intra_threads=1)
    argos_lines = []
    for i in range(20):
        text = test_de[i]
        pieces = sp_joint.encode(text, out_type=str)
        entry = {"index": i, "src": text, "src_pieces": pieces}
        for beam in (1, 4):
            r = atr.translate_batch([pieces], beam_size=beam, return_scores=True, max_batch_size=1,
                                    max_decoding_length=CT2_MAX_DECODING)[0]
            hyp = r.hypotheses[0]
            entry[f"beam{beam}"] = {"tokens": hyp, "score": float(r.scores[0]), "text": sp_joint.decode(hyp)}
        argos_lines.append(round_floats(entry))
    argos_doc = {
        "package": "de_en.argosmodel",
        "top_level_dir": pkg_dir_name,
        "pipeline": "pieces = sentencepiece.model.encode(src, out_type=str) (no </s> appended; the model "
                    "was trained without source </s>); ctranslate2.Translator(model/).translate_batch([pieces], "
                    "beam_size=1|4, return_scores=True) with all other options at their defaults "
                    "(length_penalty 1) except max_decoding_length=127; text = sentencepiece decode of hypothesis pieces",
        "model": {"d_model": 64, "layers": "2+2", "heads": 4, "ffn": 128, "vocab_size": len(avocab),
                  "pad_id": apad, "spm_vocab_size": 2000, "training": a_train},
        "lines": argos_lines,
    }
    dump_json(argos_doc, out / "argos_expected.json", "lines")

    # ---- write expected.json -------------------------------------------------------------
    with open(d_ct2 / "config.json") as f:
        ct2_cfg = json.load(f)
    doc = {
        "meta": {
            "made_by": "scripts/make_marian_fixtures.py",
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "ctranslate2": ctranslate2.__version__, "sentencepiece": spm.__version__,
                         "safetensors": safetensors.__version__, "numpy": np.__version__},
            "data": "Multi30k task1 raw: train.{de,en} (29000 pairs) for spm + training; "
                    "test_2016_flickr.de lines 0..n-1 for references",
            "vocab_size": V, "eos_id": 0, "unk_id": 1, "pad_id": pad,
            "decoder_start_token_id": pad,
            "training": train_info,
            "final_logits_bias": "N(0, 0.1) (torch.Generator seed %d), 0 at <pad>" % (SEED + 1),
            "generate": "model.generate(input_ids, attention_mask=ones, num_beams=1|4, do_sample=False, "
                        "output_scores=True, return_dict_in_generate=True); generation_config: "
                        + json.dumps(m32.generation_config.to_diff_dict()),
            "generate_fields": {
                "sequence": "generate() sequences[0] (starts with decoder_start <pad>, ends with </s>)",
                "ids": "sequence without the start token (beam: also without trailing pad fill)",
                "text": "tokenizer.decode(sequence, skip_special_tokens=True)",
                "token_logprobs": "greedy: log_softmax over the full vocabulary (pad included) of the raw "
                                  "float32 logits at each step, for the chosen token",
                "sum_logprob": "sum of token_logprobs",
                "sum_logprob_nopad": "sum of log_softmax over the processed logits (bad_words: pad = -inf)",
                "sequences_score": "beam: generate()'s sequences_scores[0] = sum logprobs / "
                                   "(generated tokens incl. </s>) ** 1.0",
                "precision_note": "generate() casts the step logits to float32 before log_softmax/argmax "
                                  "even for the float64 model, so float64 scores have float32 precision; "
                                  "the float64 teacher-forced logits in logits.safetensors are true float64",
            },
            "ct2": "ctranslate2.Translator(dir, device=cpu, inter_threads=1, intra_threads=1).translate_batch("
                   "[pieces], beam_size=1|4, return_scores=True, max_batch_size=1, max_decoding_length=127); pieces = "
                   "tokenizer.convert_ids_to_tokens(src_ids) (ends with </s>; CT2 config add_source_eos=false). "
                   "tokens exclude </s>; ids are vocab.json ids of the tokens; score as returned.",
            "ct2_config": ct2_cfg,
            "safetensors_keys": st_keys,
            "pytorch_model_bin_keys": bin_keys,
            "n_lines": n,
            "agreement_counts": agree,
            "ct2_score_minus_hf_score": score_summary,
            "teacher_forced": {
                "file": "logits.safetensors",
                "layout": "columns: int64 [C] fixed vocab columns; for line i in 0..19: sel.{f32,f64}.i [T, C] "
                          "logits at those columns; lse.{f32,f64}.i [T] logsumexp over the full vocab; "
                          "top8_ids.i [T, 8] (from f64, descending); top8.{f32,f64}.i [T, 8] logits at those ids; "
                          "full.{f32,f64}.0 [T, V] all logits of line 0. float32 = model in float32; float64 = "
                          "model.double() (note: the position table is float32-rounded in both).",
                "lines": tf_meta,
            },
            "probe": {"text": probe, "input_ids": probe_ids},
        },
        "lines": lines,
    }
    dump_json(doc, out / "expected.json", "lines")
    shutil.rmtree(work, ignore_errors=True)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    log(f"done in {time.time() - t_start:.0f}s; fixtures total {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
