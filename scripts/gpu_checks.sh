#!/usr/bin/env bash
# The checks of docs/CUDA.md on a machine with an NVIDIA GPU, in one command: the driver and
# libraries, the CPU-against-CUDA parity tests, speed against PyTorch on the same GPU (in this
# invocation), and a full default Multi30k training run on the GPU.
#
#   scripts/gpu_checks.sh
#
# Build on any machine first with `scripts/build_cuda.sh --tests` and bring the two files it
# makes (target/cuda/release/transformer and target/cuda/cuda_parity) with the repository; the
# GPU machine needs no network, no Rust and no CUDA toolkit: only the NVIDIA driver and a
# Python with PyTorch for CUDA 13 (whose `nvidia` packages hold the CUDA libraries the binary
# loads) for the PyTorch side.
#
# Environment:
#   BIN      the CUDA binary (target/cuda/release/transformer)
#   PARITY   the parity test binary (target/cuda/cuda_parity)
#   RUN      a trained translation run for the decoding benchmark (runs/de-en); it is
#            skipped when RUN has no best.safetensors
#   DATA     the data folder with multi30k/ (../shared/data)
#   OUT      where logs, JSON and the summary go (gpu-checks)
#   PY       a Python with torch, numpy and safetensors (python3)
#   STEPS    which steps, in order (env parity bench decode train; also `composed`: our
#            training steps again with the fused CUDA kernels switched off,
#            TRANSFORMER_CUDA_FUSED=0, every layer composed of candle's ops as before them);
#            `env` stops the script when the GPU cannot run a first small job, so nothing else
#            wastes the machine
#   REPEATS  timed training steps per benchmark (20); SENTENCES to decode (1000); MODELS
#            the translation models to time (default base)
#   TRAIN_SECONDS  a limit on the full run (none); EPOCHS for it (the default, 20);
#            TRAIN_UNTIL instead: stop it this many seconds after the script started;
#            TRAIN_ARGS more flags for it (e.g. "--max-batches 20" for a trial of the script)
#   DEVICE   cuda (cuda:N for another GPU; cpu to try the script itself on a machine without
#            one: every step then runs on the CPU)
#   PARITY_TIMEOUT  seconds the parity tests may take (600); CMD_TIMEOUT seconds for each
#            benchmark, decoding and training command (no limit), for a machine lent briefly
#
# Writes $OUT/summary.txt last, and $OUT.tgz: everything under $OUT but the full run's weights and
# the decoded ids (a few hundred kB, to bring back from a machine that keeps nothing). The
# summary has one line per measurement, the ratios
#   cuda_mt_train_vs_pytorch=X, cuda_mt_train_bf16_vs_pytorch_bf16=X (default model),
#   cuda_mt_train_base_vs_pytorch=X, cuda_mt_train_base_bf16_vs_pytorch_bf16=X (base model),
#   cuda_lm_train_vs_pytorch=X, cuda_beam_vs_pytorch=X (PyTorch's time / ours: >1 we are faster)
# and the full run's test BLEU and wall time.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN="${BIN:-target/cuda/release/transformer}"
PARITY="${PARITY:-target/cuda/cuda_parity}"
RUN="${RUN:-runs/de-en}"
DATA="${DATA:-../shared/data}"
OUT="${OUT:-gpu-checks}"
PY="${PY:-python3}"
STEPS="${STEPS:-env parity bench decode train}"
REPEATS="${REPEATS:-20}"
SENTENCES="${SENTENCES:-1000}"
EPOCHS="${EPOCHS:-}"
TRAIN_SECONDS="${TRAIN_SECONDS:-}"
TRAIN_ARGS="${TRAIN_ARGS:-}"
DEVICE="${DEVICE:-cuda}"
PARITY_TIMEOUT="${PARITY_TIMEOUT:-600}"
CMD_TIMEOUT="${CMD_TIMEOUT:-86400}"
TORCH_DEVICE="${DEVICE}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
START=$(date +%s)

say() { echo "[gpu-checks +$(($(date +%s) - START))s] $*" | tee -a "$OUT/steps.log" >&2; }
record() { echo "$*" | tee -a "$SUMMARY"; }

# The CUDA 13 libraries of PyTorch's `nvidia` packages (cuBLAS, the runtime, cuRAND, NVRTC).
libs=$("$PY" - <<'EOF' 2>/dev/null
import os
try:
    import nvidia
    for p in nvidia.__path__:
        lib = os.path.join(p, "cu13", "lib")
        if os.path.isdir(lib):
            print(lib)
            break
except ImportError:
    pass
EOF
)
[[ -n "$libs" ]] && export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# Runs "$@" while sampling the GPU's memory in use; appends "peak_gpu_mib=N" to $OUT/$1.mem
# ($1 is a label, not part of the command).
with_gpu_peak() {
    local label=$1
    shift
    local samples="$OUT/$label.mem.samples"
    : >"$samples"
    (while :; do
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits >>"$samples" 2>/dev/null
        sleep 0.2
    done) &
    local sampler=$!
    timeout "$CMD_TIMEOUT" "$@"
    local rc=$?
    kill "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null
    echo "peak_gpu_mib=$(sort -n "$samples" | tail -n 1)" >"$OUT/$label.mem"
    rm -f "$samples"
    return $rc
}

step_env() {
    say "env: the GPU, the driver, the libraries"
    nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
    head -n 12 "$OUT/nvidia-smi.txt" >&2
    record "gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
    record "cuda_libs=${libs:-none found}"
    if ldd "$BIN" | grep 'not found'; then
        say "env: the binary's libraries are missing (above); stopping"
        return 1
    fi
    # The smallest whole job on the GPU: if this fails, nothing below can work.
    if ! "$BIN" copy-task --steps 5 --log-every 5 --device "$DEVICE" >"$OUT/smoke.log" 2>&1; then
        say "env: copy-task on the GPU failed; stopping"
        cat "$OUT/smoke.log" >&2
        return 1
    fi
    say "env: copy-task ran on the GPU"
}

step_parity() {
    say "parity: $PARITY --ignored --test-threads 1"
    TRANSFORMER_BIN="$BIN" timeout "$PARITY_TIMEOUT" "$PARITY" --ignored --test-threads 1 >"$OUT/parity.log" 2>&1
    local rc=$?
    grep -E '^test |test result' "$OUT/parity.log" >&2
    record "parity_rc=$rc $(grep -E 'test result' "$OUT/parity.log" | tail -n 1)"
}

step_bench() {
    local m p
    for m in ${MODELS:-default base}; do
        say "bench: translation training step, $m model, ours then PyTorch's"
        with_gpu_peak "mt_$m.ours" "$BIN" bench mt --device "$DEVICE" --model "$m" --repeats "$REPEATS" --json \
            >"$OUT/mt_$m.ours.json" 2>"$OUT/mt_$m.ours.log"
        for p in f32 bf16; do
            with_gpu_peak "mt_$m.torch_$p" "$PY" scripts/bench_mt_torch.py train --device "$DEVICE" --model "$m" \
                --precision "$p" --repeats "$REPEATS" --json \
                >"$OUT/mt_$m.torch_$p.json" 2>"$OUT/mt_$m.torch_$p.log"
        done
    done
    say "bench: language model, ours then PyTorch's"
    with_gpu_peak lm.ours "$BIN" bench lm --device "$DEVICE" --repeats "$REPEATS" --json \
        >"$OUT/lm.ours.json" 2>"$OUT/lm.ours.log"
    with_gpu_peak lm.torch "$PY" scripts/bench_lm_torch.py --device "$DEVICE" --repeats "$REPEATS" --json \
        >"$OUT/lm.torch.json" 2>"$OUT/lm.torch.log"
}

step_composed() {
    local m
    for m in ${MODELS:-default base}; do
        say "composed: translation training step, $m model, the fused CUDA kernels switched off"
        with_gpu_peak "mt_$m.composed" env TRANSFORMER_CUDA_FUSED=0 "$BIN" bench mt --device "$DEVICE" \
            --model "$m" --repeats "$REPEATS" --json >"$OUT/mt_$m.composed.json" 2>"$OUT/mt_$m.composed.log"
    done
    say "composed: language model, the fused CUDA kernels switched off"
    with_gpu_peak lm.composed env TRANSFORMER_CUDA_FUSED=0 "$BIN" bench lm --device "$DEVICE" \
        --repeats "$REPEATS" --json >"$OUT/lm.composed.json" 2>"$OUT/lm.composed.log"
}

step_decode() {
    local src="$DATA/multi30k/task1/raw/test_2016_flickr.de.gz"
    if [[ ! -f "$RUN/best.safetensors" ]]; then
        say "decode: no trained run at $RUN; skipped"
        return 0
    fi
    say "decode: beam 5 over $SENTENCES sentences of test_2016_flickr, ours then PyTorch's"
    with_gpu_peak decode.ours "$BIN" bench mt-decode --device "$DEVICE" --run "$RUN" --src "$src" \
        --max-sentences "$SENTENCES" --beam 5 --batch 25 --latency-sentences 50 \
        --dump "$OUT/dump" --json >"$OUT/decode.ours.json" 2>"$OUT/decode.ours.log"
    # The same run decoded on the CPU of this machine: the outputs must be the same ids.
    "$BIN" bench mt-decode --device cpu --run "$RUN" --src "$src" --max-sentences "$SENTENCES" \
        --beam 5 --batch 25 --latency-sentences 0 --dump "$OUT/dump_cpu" --json \
        >"$OUT/decode.cpu.json" 2>"$OUT/decode.cpu.log"
    with_gpu_peak decode.torch "$PY" scripts/bench_mt_torch.py decode --device "$DEVICE" --run "$RUN" \
        --src-ids "$OUT/dump/src.ids" --ref-ids "$OUT/dump/hyp.ids" --beam 5 --batch 25 \
        --greedy-latency 50 --json >"$OUT/decode.torch.json" 2>"$OUT/decode.torch.log"
}

step_train() {
    local run="$OUT/run"
    local args=(mt train --corpus multi30k-de-en --data "$DATA" --out "$run" --device "$DEVICE")
    rm -rf "$run"
    [[ -n "$EPOCHS" ]] && args+=(--epochs "$EPOCHS")
    # shellcheck disable=SC2206
    [[ -n "$TRAIN_ARGS" ]] && args+=($TRAIN_ARGS)
    # TRAIN_UNTIL: the run ends by then (seconds since this script started), whatever is left.
    if [[ -n "${TRAIN_UNTIL:-}" ]]; then
        TRAIN_SECONDS=$((TRAIN_UNTIL - ($(date +%s) - START)))
        ((TRAIN_SECONDS < 30)) && { say "train: under 30 s left; skipped"; return 0; }
    fi
    say "train: transformer ${args[*]}${TRAIN_SECONDS:+ (limit ${TRAIN_SECONDS}s)}"
    local t0=$(date +%s)
    if [[ -n "$TRAIN_SECONDS" ]]; then
        with_gpu_peak train timeout -s INT "$TRAIN_SECONDS" "$BIN" "${args[@]}" >"$OUT/train.log" 2>&1
    else
        with_gpu_peak train "$BIN" "${args[@]}" >"$OUT/train.log" 2>&1
    fi
    local rc=$?
    record "train_rc=$rc train_wall_s=$(($(date +%s) - t0))"
    cp "$run/metrics.jsonl" "$run/config.toml" "$OUT/" 2>/dev/null
    cp "$run/test.hyp" "$OUT/test.hyp" 2>/dev/null
    grep -iE 'bleu|epoch [0-9]+ ' "$OUT/train.log" | tail -n 5 >&2
    # Trained on the GPU, evaluated on the CPU: the same test BLEU.
    if [[ -f "$run/best.safetensors" ]]; then
        "$BIN" mt eval --run "$run" --test-set test --device cpu >"$OUT/eval_cpu.log" 2>&1
        record "eval_on_cpu_rc=$? $(grep -iE 'bleu' "$OUT/eval_cpu.log" | tail -n 1)"
    fi
}

for s in $STEPS; do
    case "$s" in
        env) step_env || { record "stopped=env"; exit 1; } ;;
        parity) step_parity ;;
        bench) step_bench ;;
        composed) step_composed ;;
        decode) step_decode ;;
        train) step_train ;;
        *) say "unknown step $s (env parity bench composed decode train)"; exit 2 ;;
    esac
done

# The table and the ratios (PyTorch's time / ours).
"$PY" - "$OUT" <<'EOF' | tee -a "$SUMMARY"
import json, os, sys
out = sys.argv[1]

def load(name):
    p = os.path.join(out, name + ".json")
    try:
        with open(p) as f:
            lines = [l for l in f.read().splitlines() if l.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None

def mem(name):
    try:
        with open(os.path.join(out, name + ".mem")) as f:
            return f.read().strip().split("=")[1]
    except (OSError, IndexError):
        return "?"

def med(d, key):
    v = d.get(key) if d else None
    return v.get("median") if isinstance(v, dict) else v

for m in ("default", "base"):
    ours, t32, t16 = load(f"mt_{m}.ours"), load(f"mt_{m}.torch_f32"), load(f"mt_{m}.torch_bf16")
    tag = "" if m == "default" else "_base"
    o32, o16 = med(ours, "train_step_ms"), med(ours, "train_step_bf16_ms")
    p32, p16 = med(t32, "train_step_ms"), med(t16, "train_step_ms")
    print(f"mt_train_{m}: ours f32 {o32} ms bf16 {o16} ms (peak GPU {mem(f'mt_{m}.ours')} MiB); "
          f"pytorch f32 {p32} ms (peak {mem(f'mt_{m}.torch_f32')} MiB, allocated "
          f"{(t32 or {}).get('gpu_peak_mem_mb')}) bf16 {p16} ms")
    if ours and ours.get("phases_ms"):
        print(f"mt_train_{m}_phases_ms: {json.dumps(ours['phases_ms'])}")
    if ours and ours.get("tokens_per_s"):
        print(f"mt_train_{m}_tokens_per_s: ours {ours['tokens_per_s']:.0f} "
              f"(bf16 {ours.get('tokens_per_s_bf16') or 0:.0f}), pytorch "
              f"{(t32 or {}).get('tokens_per_s', 0):.0f} (bf16 {(t16 or {}).get('tokens_per_s', 0):.0f})")
    comp = load(f"mt_{m}.composed")
    if comp:
        c32, c16 = med(comp, "train_step_ms"), med(comp, "train_step_bf16_ms")
        print(f"mt_train_{m}_composed: f32 {c32} ms bf16 {c16} ms (peak GPU "
              f"{mem(f'mt_{m}.composed')} MiB); phases_ms {json.dumps(comp.get('phases_ms'))}")
        if c32 and o32:
            print(f"cuda_mt_train{tag}_fused_vs_composed={c32 / o32:.2f}")
        if c32 and p32:
            print(f"cuda_mt_train{tag}_composed_vs_pytorch={p32 / c32:.2f}")
        if c16 and p16:
            print(f"cuda_mt_train{tag}_composed_bf16_vs_pytorch_bf16={p16 / c16:.2f}")
    if o32 and p32:
        print(f"cuda_mt_train{tag}_vs_pytorch={p32 / o32:.2f}")
    if o16 and p16:
        print(f"cuda_mt_train{tag}_bf16_vs_pytorch_bf16={p16 / o16:.2f}")
lo, lt = load("lm.ours"), load("lm.torch")
if lo and lt:
    for k in ("train_step_ms", "eval_ms", "gen_ms"):
        a, b = med(lo, k), med(lt, k)
        print(f"lm_{k}: ours {a} pytorch {b}" + (f" ratio {b / a:.2f}" if a and b else ""))
    a, b = med(lo, "train_step_ms"), med(lt, "train_step_ms")
    if a and b:
        print(f"cuda_lm_train_vs_pytorch={b / a:.2f}")
    print(f"lm_peak_gpu_mib: ours {mem('lm.ours')} pytorch {mem('lm.torch')}")
    lc = load("lm.composed")
    if lc and a and b:
        c = med(lc, "train_step_ms")
        print(f"lm_train_step_ms_composed: {c} (peak GPU {mem('lm.composed')} MiB)"
              + (f" cuda_lm_train_composed_vs_pytorch={b / c:.2f}" if c else ""))
do, dt, dc = load("decode.ours"), load("decode.torch"), load("decode.cpu")
if do:
    print(f"decode: ours {do['seconds']:.2f} s ({do['tokens_per_s']:.0f} tokens/s, greedy latency "
          f"{do.get('greedy_latency_ms')} ms, peak GPU {mem('decode.ours')} MiB)")
if do and dc:
    same = None
    try:
        a = open(os.path.join(out, "dump", "hyp.ids")).read().splitlines()
        b = open(os.path.join(out, "dump_cpu", "hyp.ids")).read().splitlines()
        same = sum(x == y for x, y in zip(a, b)) / max(len(a), 1)
    except OSError:
        pass
    print(f"decode_cpu_same_machine: {dc['seconds']:.2f} s; share of GPU outputs equal to the CPU's: {same}")
if do and dt:
    print(f"decode_pytorch: {json.dumps({k: v for k, v in dt.items() if not isinstance(v, (list, dict))})}")
    if dt.get("seconds"):
        print(f"cuda_beam_vs_pytorch={dt['seconds'] / do['seconds']:.2f}")
EOF
tar czf "$OUT.tgz" --exclude="$(basename "$OUT")/run" --exclude="$(basename "$OUT")/dump" \
    --exclude="$(basename "$OUT")/dump_cpu" -C "$(dirname "$OUT")" "$(basename "$OUT")"
say "done; summary in $SUMMARY, everything in $OUT.tgz"
