#!/usr/bin/env bash
# Benchmarks our implementation of the PyTorch "Language Modeling with nn.Transformer"
# tutorial model against PyTorch, on this machine, in this invocation, at identical shapes:
# `transformer bench lm --json` and `scripts/bench_lm_torch.py --json`, alternating over
# ROUNDS rounds (ours first in odd rounds, PyTorch first in even ones), so that each ratio
# comes from two runs a minute apart: on a shared machine the speed of both cores drifts by up
# to 2x within minutes. Prints a table (each side's median over the rounds, and the median of
# the per-round ratios) and, as its last line, speedup_vs_pytorch=X: the median over rounds
# of PyTorch's median ms per fp32 training step divided by ours. The line before it, where
# this CPU has AMX or AVX512-BF16, is speedup_vs_pytorch_bf16=Y (both sides in bf16 mixed precision);
# on other CPUs (e.g. AVX2-only Zen 3) PyTorch's bf16 step is not run.
#
# Usage: scripts/bench_vs_pytorch.sh [FLAGS FOR BOTH SIDES]
#   e.g. scripts/bench_vs_pytorch.sh --vocab 33278 --batch 32
#   (flags both sides accept: --vocab --emsize --nhid --nlayers --nhead --dropout --batch
#    --bptt --eval-batch --gen-prompt --gen-tokens --lr --clip --warmup --repeats --seed)
# Environment:
#   REPEATS  timed repetitions of each measurement (default 10); WARMUP (default 2)
#   ROUNDS   alternating rounds of both sides (default 3)
#   PYTHON   a Python with torch; otherwise .venv/bin/python in the repository root, which is
#            created (python3 -m venv .venv; pip install torch numpy) when missing.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
REPEATS="${REPEATS:-10}"
WARMUP="${WARMUP:-2}"
ROUNDS="${ROUNDS:-3}"

# Percent of all CPU time that was busy during one second (other work on the machine).
busy_pct() {
    local a b
    read -r -a a < <(grep '^cpu ' /proc/stat)
    sleep 1
    read -r -a b < <(grep '^cpu ' /proc/stat)
    local idle=$(( (b[4] + b[5]) - (a[4] + a[5]) )) total=0 i
    for i in 1 2 3 4 5 6 7 8; do total=$(( total + b[i] - a[i] )); done
    echo $(( total > 0 ? 100 * (total - idle) / total : 0 ))
}

# ---- our binary ----------------------------------------------------------------------------
build_cli

# ---- Python with torch ---------------------------------------------------------------------
python_with torch numpy

# ---- run both sides ------------------------------------------------------------------------
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
BUSY_BEFORE="$(busy_pct)"
# Ours runs first in round 1, so its JSON says before any PyTorch run whether this CPU has a
# bf16 unit for our side; without one there is no bf16 ratio to take, and PyTorch's bf16
# autocast step (emulated on such CPUs: 8-9 s per step on a Zen 3) is skipped.
TORCH_EXTRA=()
run_ours() {
    say "round $1, ours: $BIN bench lm --json --warmup $WARMUP --repeats $REPEATS ${*:2}"
    "$BIN" bench lm --json --warmup "$WARMUP" --repeats "$REPEATS" "${@:2}" > "$TMP/ours.$1.json"
    if (( $1 == 1 )) && ! "$PY" -c 'import json, sys
sys.exit(0 if json.load(open(sys.argv[1])).get("bf16_products") else 1)' "$TMP/ours.1.json"; then
        TORCH_EXTRA=(--no-bf16)
    fi
}
run_torch() {
    say "round $1, PyTorch: $PY scripts/bench_lm_torch.py --json --warmup $WARMUP --repeats $REPEATS ${TORCH_EXTRA[*]} ${*:2}"
    "$PY" scripts/bench_lm_torch.py --json --warmup "$WARMUP" --repeats "$REPEATS" "${TORCH_EXTRA[@]}" "${@:2}" > "$TMP/torch.$1.json"
}
for (( r = 1; r <= ROUNDS; r++ )); do
    if (( r % 2 == 1 )); then run_ours "$r" "$@"; run_torch "$r" "$@"
    else run_torch "$r" "$@"; run_ours "$r" "$@"; fi
done
BUSY_AFTER="$(busy_pct)"

CPU_MODEL="$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n1)"
CORES="$(nproc)"

# ---- table ---------------------------------------------------------------------------------
# Any python3 reads the JSONs (the one with torch is used; no jq needed).
"$PY" - "$TMP" "$ROUNDS" "${CPU_MODEL:-unknown}" "$CORES" \
    "$(date -u '+%Y-%m-%d %H:%M:%S UTC')" "$BUSY_BEFORE" "$BUSY_AFTER" <<'EOF'
import json, statistics, sys

tmp, rounds, cpu, cores, date, busy_before, busy_after = sys.argv[1:8]
rounds = int(rounds)
O = [json.load(open(f"{tmp}/ours.{r}.json")) for r in range(1, rounds + 1)]
T = [json.load(open(f"{tmp}/torch.{r}.json")) for r in range(1, rounds + 1)]
o, t = O[0], T[0]
if o["shapes"] != t["shapes"]:
    print(f"WARNING: shapes differ: ours {o['shapes']} vs PyTorch {t['shapes']}")
s = o["shapes"]


def pick(run, key, stat=None):
    v = run.get(key)
    if v is None:
        return None
    return v[stat] if stat else v


print(f"machine: {cpu}, {cores} cores; {date}; CPU busy with other work: {busy_before}% just before, {busy_after}% just after")
bf16_unit = f"; bf16 products as {o['bf16_products']}" if o.get("bf16_products") else ""
print(f"ours: {o['impl']}{bf16_unit}, {o['threads']} threads | {t['impl']}, {t['threads']} threads")
print(f"model: vocab {s['vocab']}, emsize {s['emsize']}, nhid {s['nhid']}, {s['nlayers']} layers, "
      f"{s['nhead']} heads, dropout {s['dropout']}; {o['parameters']:,} parameters "
      f"(PyTorch {t['parameters']:,}); {s['warmup']} warm-up + {s['repeats']} timed repetitions "
      f"per measurement, {rounds} alternating rounds")
busy = max(int(busy_before), int(busy_after))
if busy > 20:
    print(f"WARNING: other work was using {busy}% of the CPU around this run: these timings are "
          "unreliable (PyTorch's OpenMP threads especially); rerun on an idle machine.")
print()

# ratio: how many times better ours is (>1: ours faster / smaller / more tokens per second).
rows = [
    (f"training step ms, min ({s['batch']}x{s['bptt']})", "train_step_ms", "min", "lower"),
    (f"training step ms, median ({s['batch']}x{s['bptt']})", "train_step_ms", "median", "lower"),
    (f"eval forward ms, min ({s['eval_batch']}x{s['bptt']})", "eval_ms", "min", "lower"),
    (f"eval forward ms, median ({s['eval_batch']}x{s['bptt']})", "eval_ms", "median", "lower"),
    ("generation tokens/s, median (*)", "gen_tokens_per_s", None, "higher"),
    ("peak RSS MB (after training steps)", "peak_rss_mb", None, "lower"),
]
if any(r.get("train_step_bf16_ms") for r in O + T):
    rows.append(("training step ms, min, bf16 mixed precision", "train_step_bf16_ms", "min", "lower"))
    rows.append(("training step ms, median, bf16 mixed precision", "train_step_bf16_ms", "median", "lower"))


def ratios(key, stat, better):
    """The per-round ratios (how many times better ours is), rounds where both sides have it."""
    out = []
    for a, b in zip(O, T):
        ours, torch_v = pick(a, key, stat), pick(b, key, stat)
        if ours and torch_v:
            out.append(torch_v / ours if better == "lower" else ours / torch_v)
    return out


def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


w = 44
print(f"{'measurement':<{w}} {'ours':>10} {'PyTorch':>10} {'ratio':>8}   per round")
print("-" * (w + 31))
for name, key, stat, better in rows:
    fmt = lambda v: "-" if v is None else f"{v:10.1f}"
    ours = med([pick(r, key, stat) for r in O])
    torch_v = med([pick(r, key, stat) for r in T])
    rs = ratios(key, stat, better)
    ratio = f"{statistics.median(rs):.2f}x" if rs else "-"
    per_round = " ".join(f"{x:.2f}" for x in rs)
    print(f"{name:<{w}} {fmt(ours):>10} {fmt(torch_v):>10} {ratio:>8}   {per_round}")
print("-" * (w + 31))
print("ratio: how many times better ours is (>1: ours faster, or smaller for RSS): the median of the")
print("per-round ratios; ours and PyTorch: each side's median over the rounds.")
print(f"(*) {s['gen_tokens']} tokens greedily from a {s['gen_prompt']}-token prompt, batch 1; "
      f"ours {'with a key/value cache' if o.get('gen_kv_cache') else 'recomputing the prefix'}, "
      f"PyTorch {'with a cache' if t.get('gen_kv_cache') else 'recomputing the whole prefix each step (the usual way)'}.")
print("Times on shared machines vary run to run (up to 2x); compare ratios from one run.")
bf16 = ratios("train_step_bf16_ms", "median", "lower")
if bf16:
    print(f"speedup_vs_pytorch_bf16={statistics.median(bf16):.2f}  (both sides bf16 mixed precision)")
print(f"speedup_vs_pytorch={statistics.median(ratios('train_step_ms', 'median', 'lower')):.2f}")
EOF
