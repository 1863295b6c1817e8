#!/usr/bin/env bash
# Load test of `transformer serve` on this machine, in this invocation:
#
#   1. starts the server on a trained run (loopback, a free port, no request log);
#   2. `transformer bench serve`: CLIENTS concurrent clients (default 1, then 64), each
#      posting one sentence of test_2016_flickr per request to /translate as LibreTranslate's
#      clients do, SECONDS each; sentences/s and latency p50/p99;
#   3. beside it, CTranslate2's `translate_batch` over the same sentences with the very same
#      weights, beam and threads (scripts/mt_to_ctranslate2.py, scripts/bench_mt_ct2.py):
#      the throughput a server could reach if it had every sentence at once, with no HTTP.
#
# Prints, last:
#   serve_throughput_64_vs_1=X         64 clients' sentences/s over one client's
#   serve_64_vs_ctranslate2_batch=X    64 clients' sentences/s over CTranslate2's translate_batch
#
# Environment: RUN (runs/de-en), SRC (test_2016_flickr.de.gz), SENTENCES for CTranslate2
# (1000), CLIENTS (1,64), SECONDS (20), BEAM (the run's), THREADS (all cores), PYTHON (a
# Python with ctranslate2, numpy and safetensors; otherwise .venv, created when missing).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
translation_defaults
CLIENTS="${CLIENTS:-1,64}"
SECONDS_EACH="${SECONDS:-20}"

build_cli
if [[ ! -f "$RUN/config.toml" ]]; then
    echo "error: $RUN is not a trained run (train one: transformer mt train --corpus multi30k-de-en --out $RUN)" >&2
    exit 1
fi
python_with ctranslate2 numpy safetensors
BEAM="${BEAM:-$(sed -n 's/^beam = //p' "$RUN/config.toml")}"
BEAM="${BEAM:-5}"

TMP="$(mktemp -d)"
SERVER=""
cleanup() { [[ -n "$SERVER" ]] && kill "$SERVER" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
export CANDLE_NUM_THREADS="$THREADS" RAYON_NUM_THREADS="$THREADS"

"$BIN" serve --run "$RUN" --port 0 --beam "$BEAM" --quiet > "$TMP/addr" 2> "$TMP/server.log" &
SERVER=$!
for _ in $(seq 100); do
    grep -q listening "$TMP/addr" 2>/dev/null && break
    sleep 0.2
done
URL="$(sed -n 's/^listening on //p' "$TMP/addr")"
[[ -n "$URL" ]] || { cat "$TMP/server.log" >&2; exit 1; }
LANGS="$(grep -o 'serving [a-zA-Z-]* -> [a-zA-Z-]*' "$TMP/server.log" | head -1)"
SL="$(echo "$LANGS" | awk '{print $2}')"
TL="$(echo "$LANGS" | awk '{print $4}')"
say "server at $URL ($SL -> $TL, beam $BEAM, $THREADS threads)"

"$BIN" bench serve --url "$URL" --src "$SRC" --source "$SL" --target "$TL" \
    --clients "$CLIENTS" --seconds "$SECONDS_EACH" --json | tee "$TMP/load.json"
kill -TERM "$SERVER"; wait "$SERVER" || true; SERVER=""
tail -1 "$TMP/server.log" >&2

say "CTranslate2 translate_batch on the same weights ($SENTENCES sentences, beam $BEAM, batch 64)"
"$BIN" bench mt-decode --run "$RUN" --src "$SRC" --max-sentences "$SENTENCES" --beam "$BEAM" \
    --latency-sentences 0 --dump "$TMP/dump" --json > /dev/null
"$PY" scripts/mt_to_ctranslate2.py --run "$RUN" --out "$TMP/ct2" >&2
"$PY" scripts/bench_mt_ct2.py --model "$TMP/ct2" --run "$RUN" --src-ids "$TMP/dump/src.ids" \
    --beam "$BEAM" --batch 64 --threads "$THREADS" --greedy-latency 0 --json > "$TMP/ct2.json"

"$PY" - "$TMP/load.json" "$TMP/ct2.json" <<'PY'
import json, sys
loads = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
ct2 = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
ct2_rate = ct2["sentences_per_s"]
print(f"CTranslate2 translate_batch: {ct2_rate:.1f} sentences/s ({ct2['seconds']:.2f} s)")
for l in loads:
    print(f"serve, {l['clients']:3d} clients: {l['sentences_per_s']:.1f} sentences/s, p50 {l['p50_ms']:.1f} ms, p99 {l['p99_ms']:.1f} ms, failed {l['failed']}")
first, last = loads[0], loads[-1]
print(f"serve_throughput_{last['clients']}_vs_{first['clients']}={last['sentences_per_s'] / first['sentences_per_s']:.2f}")
print(f"serve_{last['clients']}_vs_ctranslate2_batch={last['sentences_per_s'] / ct2_rate:.2f}")
PY
