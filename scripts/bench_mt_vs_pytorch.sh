#!/usr/bin/env bash
# Benchmarks translation (the default `transformer mt` model: 3 + 3 layers, d_model 256,
# 8 heads, FFN 512, joint vocabulary with shared embeddings) against PyTorch and CTranslate2
# on this machine, in this invocation:
#
#   training  `transformer bench mt --json` against `scripts/bench_mt_torch.py train --json`
#             (the same padded batch, label smoothing 0.1, clipping, Adam), fp32, and PyTorch's
#             bf16 autocast beside it;
#   decoding  beam search over test_2016_flickr with a trained run's weights:
#             `transformer bench mt-decode` against PyTorch decoding the usual way
#             (`scripts/bench_mt_torch.py decode`: the decoder rerun over the whole prefix at
#             every step) and against CTranslate2 running the very same weights
#             (`scripts/mt_to_ctranslate2.py`, `scripts/bench_mt_ct2.py`); the same beam,
#             sentences per batch and threads, and the share of sentences each translates
#             exactly as we do; greedy single-sentence latency (the translation alone, no
#             scores, on both sides) beside CTranslate2's.
#
# Each measurement alternates the sides over ROUNDS rounds (ours first in odd rounds), so
# every ratio comes from runs a minute apart. Prints a table and, last, the lines
#   mt_train_speedup_vs_pytorch_bf16=X  both sides in bf16 mixed precision (CPUs with AMX or
#                                   AVX512-BF16 only)
#   mt_train_speedup_vs_pytorch=X   PyTorch's median training step / ours
#   mt_beam_speedup_vs_pytorch=X    PyTorch's beam-search seconds / ours
#   mt_beam_vs_ctranslate2=X        CTranslate2's beam-search seconds / ours (>1: we are faster)
#   mt_beam_int8_vs_ctranslate2_int8=X  the same, both in int8 (ours `--quantize int8`,
#                                   CTranslate2's compute_type="int8")
#   mt_greedy_latency_vs_ctranslate2=X  CTranslate2's greedy one-sentence latency / ours (fp32)
#   mt_beam_restricted_vs_ctranslate2=X  CTranslate2's beam-search seconds / ours with
#                                   `--restrict-vocab` (the run's vocabulary map)
#   mt_beam_restricted_vs_ctranslate2_vmap=X  the same, CTranslate2 restricted by the same map
#                                   (its vmap, use_vmap=True)
#   mt_greedy_latency_restricted_vs_ctranslate2=X  CTranslate2's greedy latency / ours restricted
#
# Usage: scripts/bench_mt_vs_pytorch.sh
# Environment:
#   RUN        a trained run directory (default runs/de-en); when it does not exist a 2-epoch
#              run is trained into runs/bench-de-en (about 3 minutes) and used instead
#   SRC        source sentences (default ../shared/data/multi30k/task1/raw/test_2016_flickr.de.gz)
#   SENTENCES  how many of them to translate (default 1000; PyTorch's prefix recomputation
#              takes about 40 s per 100 sentences at beam 5 on 2 cores)
#   BEAM (5), BATCH sentences per batch (25), THREADS (all cores), ROUNDS (3),
#   REPEATS timed training steps per round (10), LATENCY sentences for greedy latency (50)
#   ONLY       `decode` to measure decoding against CTranslate2 alone (no training, no
#              PyTorch decoding: minutes instead of half an hour)
#   CT2_CONFIGS CTranslate2's configurations tried ("threads:mkl" pairs; default 1 and all
#              threads, with MKL and with CT2_USE_MKL=0); each measurement takes the best
#   KEY_PREFIX the prefix of the printed keys (mt; base for a base-size run)
#   PYTHON     a Python with torch and ctranslate2; otherwise .venv/bin/python in the
#              repository root, created (pip install torch numpy safetensors ctranslate2) when
#              missing.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
translation_defaults
ROUNDS="${ROUNDS:-3}"
REPEATS="${REPEATS:-10}"
BEAM="${BEAM:-5}"
BATCH="${BATCH:-25}"
LATENCY="${LATENCY:-50}"

build_cli
python_with torch numpy safetensors ctranslate2

if [[ ! -f "$RUN/config.toml" ]]; then
    RUN=runs/bench-de-en
    if [[ ! -f "$RUN/best.safetensors" ]]; then
        say "no trained run: training a 2-epoch one into $RUN (transformer mt train --corpus multi30k-de-en --epochs 2)"
        "$BIN" mt train --corpus multi30k-de-en --epochs 2 --out "$RUN" >&2
    fi
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
export CANDLE_NUM_THREADS="$THREADS" RAYON_NUM_THREADS="$THREADS"

# The source ids and our outputs, for the other two to read and to compare with.
"$BIN" bench mt-decode --run "$RUN" --src "$SRC" --max-sentences "$SENTENCES" --beam "$BEAM" \
    --batch "$BATCH" --latency-sentences 0 --dump "$TMP/dump" --json > /dev/null
say "converting $RUN to CTranslate2 (scripts/mt_to_ctranslate2.py)"
"$PY" scripts/mt_to_ctranslate2.py --run "$RUN" --out "$TMP/ct2" >&2
# The vocabulary map both restricted searches read (written once into the run).
[[ -f "$RUN/vocab_map.json" ]] || "$BIN" mt vocab-map --run "$RUN" >&2
"$PY" scripts/mt_to_ctranslate2.py --run "$RUN" --out "$TMP/ct2_vmap" --vocab-map >&2

train_ours() { "$BIN" bench mt --json --repeats "$REPEATS" > "$TMP/train.ours.$1.json"; }
train_torch() {
    "$PY" scripts/bench_mt_torch.py train --json --repeats "$REPEATS" --threads "$THREADS" > "$TMP/train.torch.$1.json"
    "$PY" scripts/bench_mt_torch.py train --json --repeats "$REPEATS" --threads "$THREADS" --precision bf16 > "$TMP/train.torch_bf16.$1.json"
}
decode_ours() {
    "$BIN" bench mt-decode --run "$RUN" --src "$SRC" --max-sentences "$SENTENCES" --beam "$BEAM" \
        --batch "$BATCH" --latency-sentences "$LATENCY" --json > "$TMP/decode.ours.$1.json"
}
decode_torch() {
    "$PY" scripts/bench_mt_torch.py decode --run "$RUN" --src-ids "$TMP/dump/src.ids" \
        --ref-ids "$TMP/dump/hyp.ids" --beam "$BEAM" --batch "$BATCH" --threads "$THREADS" \
        --json > "$TMP/decode.torch.$1.json"
}
# CTranslate2 at its best on this machine: each of CT2_CONFIGS ("threads:mkl" pairs, mkl 0
# setting CT2_USE_MKL=0) is run, and each measurement takes the best of them (the table also
# prints every configuration's own figures).
CT2_CONFIGS="${CT2_CONFIGS:-1:0 1:1 $THREADS:0 $THREADS:1}"
CT2_CONFIGS="$(echo $CT2_CONFIGS | tr ' ' '\n' | awk '!seen[$0]++' | tr '\n' ' ')"
decode_ct2() {
    local cfg t m
    for cfg in $CT2_CONFIGS; do
        t="${cfg%%:*}"; m="${cfg##*:}"
        CT2_USE_MKL="$m" "$PY" scripts/bench_mt_ct2.py --model "$TMP/ct2" --run "$RUN" --src-ids "$TMP/dump/src.ids" \
            --ref-ids "$TMP/dump/hyp.ids" --beam "$BEAM" --batch "$BATCH" --threads "$t" \
            --greedy-latency "$LATENCY" --json > "$TMP/decode.ct2@t${t}m${m}.$1.json"
        CT2_USE_MKL="$m" "$PY" scripts/bench_mt_ct2.py --model "$TMP/ct2" --run "$RUN" --src-ids "$TMP/dump/src.ids" \
            --ref-ids "$TMP/dump/hyp.ids" --beam "$BEAM" --batch "$BATCH" --threads "$t" \
            --greedy-latency "$LATENCY" --compute-type int8 --json > "$TMP/decode.ct2_int8@t${t}m${m}.$1.json"
    done
}
decode_ours_restricted() {
    "$BIN" bench mt-decode --run "$RUN" --src "$SRC" --max-sentences "$SENTENCES" --beam "$BEAM" \
        --batch "$BATCH" --latency-sentences "$LATENCY" --restrict-vocab --json \
        > "$TMP/decode.ours_restricted.$1.json"
}
decode_ct2_vmap() {
    "$PY" scripts/bench_mt_ct2.py --model "$TMP/ct2_vmap" --run "$RUN" --src-ids "$TMP/dump/src.ids" \
        --ref-ids "$TMP/dump/hyp.ids" --beam "$BEAM" --batch "$BATCH" --threads "$THREADS" \
        --greedy-latency "$LATENCY" --use-vmap --json > "$TMP/decode.ct2_vmap.$1.json"
}
decode_ours_int8() {
    "$BIN" bench mt-decode --run "$RUN" --src "$SRC" --max-sentences "$SENTENCES" --beam "$BEAM" \
        --batch "$BATCH" --latency-sentences "$LATENCY" --quantize int8 --json \
        > "$TMP/decode.ours_int8.$1.json"
}
for (( r = 1; r <= ROUNDS; r++ )); do
    say "round $r of $ROUNDS"
    if [[ "${ONLY:-}" == decode ]]; then
        if (( r % 2 == 1 )); then
            decode_ours "$r"; decode_ours_restricted "$r"; decode_ours_int8 "$r"; decode_ct2 "$r"; decode_ct2_vmap "$r"
        else
            decode_ct2_vmap "$r"; decode_ct2 "$r"; decode_ours_int8 "$r"; decode_ours_restricted "$r"; decode_ours "$r"
        fi
    elif (( r % 2 == 1 )); then
        train_ours "$r"; train_torch "$r"; decode_ours "$r"; decode_ours_restricted "$r"; decode_ours_int8 "$r"; decode_ct2 "$r"; decode_ct2_vmap "$r"; decode_torch "$r"
    else
        train_torch "$r"; train_ours "$r"; decode_torch "$r"; decode_ct2_vmap "$r"; decode_ct2 "$r"; decode_ours_int8 "$r"; decode_ours_restricted "$r"; decode_ours "$r"
    fi
done

CPU_MODEL="$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n1)"
"$PY" - "$TMP" "$ROUNDS" "${CPU_MODEL:-unknown}" "$THREADS" "$(date -u '+%Y-%m-%d %H:%M UTC')" "${ONLY:-}" "${KEY_PREFIX:-mt}" "$CT2_CONFIGS" <<'EOF'
import json, statistics, sys

tmp, rounds, cpu, threads, date, only, prefix, ct2_configs = sys.argv[1:9]
R = range(1, int(rounds) + 1)
CONFIGS = [c for c in ct2_configs.split() if c]


def load_one(kind, side):
    return [json.load(open(f"{tmp}/{kind}.{side}.{r}.json")) for r in R]


def load(kind, side):
    """One side's results per round; CTranslate2's are the best of its configurations."""
    if not side.startswith("ct2") or side == "ct2_vmap":
        return load_one(kind, side)
    per = {c: load_one(kind, f"{side}@t{c.split(':')[0]}m{c.split(':')[1]}") for c in CONFIGS}
    best = []
    for i in range(len(R)):
        runs = [per[c][i] for c in CONFIGS]
        fastest = min(runs, key=lambda j: j["seconds"])
        b = dict(fastest)
        b["greedy_latency_ms"] = min(j["greedy_latency_ms"] for j in runs)
        b["sentences_per_s"] = max(j["sentences_per_s"] for j in runs)
        b["tokens_per_s"] = max(j["tokens_per_s"] for j in runs)
        best.append(b)
    for c in CONFIGS:
        js = per[c]
        print(f"  CTranslate2 {side} intra_threads {c.split(':')[0]}, "
              f"{'MKL' if c.split(':')[1] == '1' else 'CT2_USE_MKL=0'}: beam "
              f"{statistics.median(j['seconds'] for j in js):.2f} s, greedy "
              f"{statistics.median(j['greedy_latency_ms'] for j in js):.2f} ms, peak RSS "
              f"{statistics.median(j['peak_rss_mb'] for j in js):.0f} MB")
    return best


full = only != "decode"
if full:
    to, tt, tb = load("train", "ours"), load("train", "torch"), load("train", "torch_bf16")
    dt = load("decode", "torch")
do, dc = load("decode", "ours"), load("decode", "ct2")
do8, dc8 = load("decode", "ours_int8"), load("decode", "ct2_int8")
dor, dcv = load("decode", "ours_restricted"), load("decode", "ct2_vmap")
ms = lambda j: j["train_step_ms"]["median"] if isinstance(j["train_step_ms"], dict) else j["train_step_ms"]
med = statistics.median

print(f"machine: {cpu}, {threads} threads; {date}; {rounds} alternating rounds")
if full:
    print(f"training batch: {to[0]['shapes']['batch']} sentences x {to[0]['shapes']['src_len']} -> "
          f"{to[0]['shapes']['tgt_len']} tokens, {to[0]['tgt_tokens']} target tokens")
print(f"decoding: {do[0]['sentences']} sentences, beam {do[0]['beam']}, {do[0]['batch']} sentences per batch")
print()
w = 46
print(f"{'measurement':<{w}} {'ours':>10} {'other':>10} {'ratio':>7}   per round")
print("-" * (w + 40))


def row(name, ours, other, better="lower", fmt="{:10.1f}"):
    rs = [(b / a if better == "lower" else a / b) for a, b in zip(ours, other) if a and b]
    o, t = med(ours), med(other)
    print(f"{name:<{w}} {fmt.format(o):>10} {fmt.format(t):>10} {med(rs):>6.2f}x   "
          + " ".join(f"{x:.2f}" for x in rs))
    return med(rs)


train = bf16 = beam_pt = None
if full:
    train = row("train step ms: ours fp32 / PyTorch fp32", [ms(j) for j in to], [ms(j) for j in tt])
if full and all(j.get("train_step_bf16_ms") for j in to):
    bf16 = row("train step ms: ours bf16 / PyTorch bf16 autocast",
               [j["train_step_bf16_ms"]["median"] for j in to], [ms(j) for j in tb])
elif full:
    row("train step ms: ours fp32 / PyTorch bf16 autocast", [ms(j) for j in to], [ms(j) for j in tb])
if full:
    row("train peak RSS MB: ours / PyTorch", [j["peak_rss_mb"] for j in to], [j["peak_rss_mb"] for j in tt])
    beam_pt = row("beam search s: ours / PyTorch (prefix rerun)", [j["seconds"] for j in do], [j["seconds"] for j in dt], fmt="{:10.2f}")
beam_ct = row("beam search s: ours / CTranslate2", [j["seconds"] for j in do], [j["seconds"] for j in dc], fmt="{:10.2f}")
row("beam sentences/s: ours / CTranslate2", [j["sentences_per_s"] for j in do], [j["sentences_per_s"] for j in dc], "higher")
row("beam tokens/s: ours / CTranslate2", [j["tokens_per_s"] for j in do], [j["tokens_per_s"] for j in dc], "higher")
lat_ct = row("greedy latency ms, 1 sentence: ours / CT2", [j["greedy_latency_ms"] for j in do], [j["greedy_latency_ms"] for j in dc], fmt="{:10.2f}")
row("decoding peak RSS MB: ours / CTranslate2", [j["peak_rss_mb"] for j in do], [j["peak_rss_mb"] for j in dc])
beam_ct8 = row("beam search s, int8: ours / CTranslate2 int8", [j["seconds"] for j in do8], [j["seconds"] for j in dc8], fmt="{:10.2f}")
row("greedy latency ms, int8: ours / CT2 int8", [j["greedy_latency_ms"] for j in do8], [j["greedy_latency_ms"] for j in dc8], fmt="{:10.2f}")
row("decoding peak RSS MB, int8: ours / CT2 int8", [j["peak_rss_mb"] for j in do8], [j["peak_rss_mb"] for j in dc8])
beam_r = row("beam search s: ours restricted / CTranslate2", [j["seconds"] for j in dor], [j["seconds"] for j in dc], fmt="{:10.2f}")
beam_rv = row("beam search s: ours restricted / CT2 vmap", [j["seconds"] for j in dor], [j["seconds"] for j in dcv], fmt="{:10.2f}")
lat_r = row("greedy latency ms: ours restricted / CT2", [j["greedy_latency_ms"] for j in dor], [j["greedy_latency_ms"] for j in dc], fmt="{:10.2f}")
row("greedy latency ms: ours restricted / CT2 vmap", [j["greedy_latency_ms"] for j in dor], [j["greedy_latency_ms"] for j in dcv], fmt="{:10.2f}")
print("-" * (w + 40))
print("ratio: how many times better ours is (>1: ours faster or smaller), median of the per-round ratios.")
same_pt = f"PyTorch {med([j['same_as_ref'] for j in dt]):.1%}, " if full else ""
print(f"same translation as ours (token for token): {same_pt}"
      f"CTranslate2 {med([j['same_as_ref'] for j in dc]):.1%}, "
      f"CTranslate2 with the vmap {med([j['same_as_ref'] for j in dcv]):.1%} of the sentences")
if bf16 is not None:
    print(f"mt_train_speedup_vs_pytorch_bf16={bf16:.2f}  (bf16 products: ours {to[0].get('bf16_products')}, PyTorch autocast)")
if full:
    print(f"mt_train_speedup_vs_pytorch={train:.2f}")
    print(f"mt_beam_speedup_vs_pytorch={beam_pt:.2f}")
print(f"{prefix}_beam_vs_ctranslate2={beam_ct:.2f}")
print(f"{prefix}_beam_int8_vs_ctranslate2_int8={beam_ct8:.2f}")
print(f"{prefix}_greedy_latency_vs_ctranslate2={lat_ct:.2f}")
print(f"{prefix}_beam_restricted_vs_ctranslate2={beam_r:.2f}")
print(f"{prefix}_beam_restricted_vs_ctranslate2_vmap={beam_rv:.2f}")
print(f"{prefix}_greedy_latency_restricted_vs_ctranslate2={lat_r:.2f}")
EOF
