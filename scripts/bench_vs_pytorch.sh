#!/usr/bin/env bash
# Benchmarks our implementation of the PyTorch "Language Modeling with nn.Transformer"
# tutorial model against PyTorch, on this machine, in this invocation, at identical shapes:
# `transformer bench lm --json` and `scripts/bench_lm_torch.py --json`, one after the other.
# Prints a table and, as its last line, speedup_vs_pytorch=X (PyTorch's median ms per fp32
# training step divided by ours); the line before it, where this CPU has AMX, is
# speedup_vs_pytorch_bf16=Y (both sides in bf16 mixed precision).
#
# Usage: scripts/bench_vs_pytorch.sh [FLAGS FOR BOTH SIDES]
#   e.g. scripts/bench_vs_pytorch.sh --vocab 33278 --batch 32
#   (flags both sides accept: --vocab --emsize --nhid --nlayers --nhead --dropout --batch
#    --bptt --eval-batch --gen-prompt --gen-tokens --lr --clip --warmup --repeats --seed)
# Environment:
#   REPEATS  timed repetitions of each measurement (default 10); WARMUP (default 2)
#   PYTHON   a Python with torch; otherwise .venv/bin/python in the repository root, which is
#            created (python3 -m venv .venv; pip install torch numpy) when missing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
REPEATS="${REPEATS:-10}"
WARMUP="${WARMUP:-2}"

say() { echo "[bench] $*" >&2; }

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
say "building: cargo build --release -p transformer-cli"
cargo build --release -p transformer-cli >&2
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
BIN="$TARGET_DIR/release/transformer"
[[ -x "$BIN" ]] || { echo "error: $BIN was not built" >&2; exit 1; }

# ---- Python with torch ---------------------------------------------------------------------
if [[ -n "${PYTHON:-}" ]]; then
    PY="$PYTHON"
    say "using PYTHON=$PY"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
    PY="$ROOT/.venv/bin/python"
    say "using $PY"
else
    say "no PYTHON set and no .venv: creating one with python3 -m venv .venv"
    python3 -m venv "$ROOT/.venv"
    PY="$ROOT/.venv/bin/python"
fi
if ! "$PY" -c "import torch" 2>/dev/null; then
    if [[ "$PY" == "$ROOT/.venv/bin/python" ]]; then
        say "installing torch and numpy into .venv (pip install torch numpy; a large download, several minutes)"
        "$ROOT/.venv/bin/pip" install torch numpy >&2
    else
        echo "error: $PY cannot import torch (install it there, or unset PYTHON to use .venv)" >&2
        exit 1
    fi
fi

# ---- run both sides ------------------------------------------------------------------------
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
BUSY_BEFORE="$(busy_pct)"
say "ours: $BIN bench lm --json --warmup $WARMUP --repeats $REPEATS $*"
"$BIN" bench lm --json --warmup "$WARMUP" --repeats "$REPEATS" "$@" > "$TMP/ours.json"
say "PyTorch: $PY scripts/bench_lm_torch.py --json --warmup $WARMUP --repeats $REPEATS $*"
"$PY" scripts/bench_lm_torch.py --json --warmup "$WARMUP" --repeats "$REPEATS" "$@" > "$TMP/torch.json"
BUSY_AFTER="$(busy_pct)"

CPU_MODEL="$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n1)"
CORES="$(nproc)"

# ---- table ---------------------------------------------------------------------------------
# Any python3 reads the JSONs (the one with torch is used; no jq needed).
"$PY" - "$TMP/ours.json" "$TMP/torch.json" "${CPU_MODEL:-unknown}" "$CORES" \
    "$(date -u '+%Y-%m-%d %H:%M:%S UTC')" "$BUSY_BEFORE" "$BUSY_AFTER" <<'EOF'
import json, sys

ours_path, torch_path, cpu, cores, date, busy_before, busy_after = sys.argv[1:8]
o = json.load(open(ours_path))
t = json.load(open(torch_path))
if o["shapes"] != t["shapes"]:
    print(f"WARNING: shapes differ: ours {o['shapes']} vs PyTorch {t['shapes']}")
s = o["shapes"]

print(f"machine: {cpu}, {cores} cores; {date}; CPU busy with other work: {busy_before}% just before, {busy_after}% just after")
print(f"ours: {o['impl']}, {o['threads']} threads | {t['impl']}, {t['threads']} threads")
print(f"model: vocab {s['vocab']}, emsize {s['emsize']}, nhid {s['nhid']}, {s['nlayers']} layers, "
      f"{s['nhead']} heads, dropout {s['dropout']}; {o['parameters']:,} parameters "
      f"(PyTorch {t['parameters']:,}); {s['warmup']} warm-up + {s['repeats']} timed repetitions")
busy = max(int(busy_before), int(busy_after))
if busy > 20:
    print(f"WARNING: other work was using {busy}% of the CPU around this run: these timings are "
          "unreliable (PyTorch's OpenMP threads especially); rerun on an idle machine.")
print()

# ratio: how many times better ours is (>1: ours faster / smaller / more tokens per second).
rows = [
    (f"training step ms, min ({s['batch']}x{s['bptt']})", o["train_step_ms"]["min"], t["train_step_ms"]["min"], "lower"),
    (f"training step ms, median ({s['batch']}x{s['bptt']})", o["train_step_ms"]["median"], t["train_step_ms"]["median"], "lower"),
    (f"eval forward ms, min ({s['eval_batch']}x{s['bptt']})", o["eval_ms"]["min"], t["eval_ms"]["min"], "lower"),
    (f"eval forward ms, median ({s['eval_batch']}x{s['bptt']})", o["eval_ms"]["median"], t["eval_ms"]["median"], "lower"),
    (f"generation tokens/s, median (*)", o["gen_tokens_per_s"], t["gen_tokens_per_s"], "higher"),
    ("peak RSS MB (after training steps)", o["peak_rss_mb"], t["peak_rss_mb"], "lower"),
]
# Mixed precision: ours runs the output layer's products in bf16 on the AMX units, PyTorch
# runs its CPU autocast (bf16 matmuls through oneDNN).
ob, tb = o.get("train_step_bf16_ms"), t.get("train_step_bf16_ms")
if ob or tb:
    rows.append(("training step ms, min, bf16 mixed precision", ob and ob["min"], tb and tb["min"], "lower"))
    rows.append(("training step ms, median, bf16 mixed precision", ob and ob["median"], tb and tb["median"], "lower"))

w = 44
print(f"{'measurement':<{w}} {'ours':>10} {'PyTorch':>10} {'ratio':>8}")
print("-" * (w + 31))
for name, ours, torch_v, better in rows:
    fmt = lambda v: "-" if v is None else f"{v:10.1f}"
    if ours is None or torch_v is None or ours == 0 or torch_v == 0:
        ratio = "-"
    else:
        ratio = f"{(torch_v / ours if better == 'lower' else ours / torch_v):.2f}x"
    print(f"{name:<{w}} {fmt(ours):>10} {fmt(torch_v):>10} {ratio:>8}")
print("-" * (w + 31))
print("ratio: how many times better ours is (>1: ours faster, or smaller for RSS).")
print(f"(*) {s['gen_tokens']} tokens greedily from a {s['gen_prompt']}-token prompt, batch 1; "
      f"ours {'with a key/value cache' if o.get('gen_kv_cache') else 'recomputing the prefix'}, "
      f"PyTorch {'with a cache' if t.get('gen_kv_cache') else 'recomputing the whole prefix each step (the usual way)'}.")
print("Times on shared machines vary run to run (up to 2x); compare ratios from one run.")
if ob and tb:
    print(f"speedup_vs_pytorch_bf16={tb['median'] / ob['median']:.2f}  (both sides bf16 mixed precision)")
print(f"speedup_vs_pytorch={t['train_step_ms']['median'] / o['train_step_ms']['median']:.2f}")
EOF
