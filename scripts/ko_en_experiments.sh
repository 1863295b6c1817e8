#!/usr/bin/env bash
# The Korean-English experiments of docs/MT.md, every run resumable: run this script
# again after an interruption (or to continue a stage split across sittings) and each run
# continues from its last checkpoint; a finished run (its test.hyp written) is skipped.
# The stages run in the order STAGES names them:
#
#   tokenizer  the tokenizer choice, by validation chrF (news-v1 dev) of English -> Korean
#              runs of TOK_EPOCHS epochs on ko-en-all: bpe, bpe-bytes, unigram, unigram-bytes;
#   ko-en      the Transformer (default size), Korean -> English on ko-en-all with the
#              chosen tokenizer, EPOCHS epochs;
#   en-ko      the same, English -> Korean;
#   gru        gru-bahdanau Korean -> English on the same data and tokenizer, EPOCHS
#              epochs, and the Transformer for as many (ko-en-EPOCHS-epochs) beside it;
#   finetune   the Korean -> English run continued on Tatoeba's training sentences
#              (scripts/split_ko_en_tatoeba.py; the held-out Tatoeba sentences stay unseen),
#              FT_EPOCHS epochs, 100 warm-up steps and a quarter of the default
#              --lr-factor (peak rate 6.3e-4 at step 100; the ko-en run ends at 2.2e-4);
#   scores     every finished run scored on every held-out set (`mt eval --test-set all
#              --json`), one JSON line per (run, set) in $RUNS/scores.jsonl, translations in
#              $RUNS/<run>/hyps/; a run scored before is not scored again.
#
# EPOCHS is read when a run starts; a resumed run keeps the epochs it was started with.
#
# Environment: BIN (target/release/transformer), RUNS (runs/ko-en), DATA (../shared/data),
# EPOCHS (12), TOK_EPOCHS (2), TOKENIZER (the tokenizer stage's winner; set it to skip that
# stage), FT_EPOCHS (10), STAGES ("tokenizer ko-en en-ko gru finetune scores"), EXTRA (flags
# added to every fresh run, e.g. "--max-batches 20 --max-valid 50" for a quick check of the
# whole script), RESUME_EXTRA (flags added to every resumed run, e.g. "--epochs 8" to end a
# run sooner than it was started for), SCORE_SETS (the sets the scores stage names, as
# `mt eval --test-set` takes them; default all).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
RUNS="${RUNS:-runs/ko-en}"
DATA="${DATA:-../shared/data}"
EPOCHS="${EPOCHS:-12}"
TOK_EPOCHS="${TOK_EPOCHS:-2}"
FT_EPOCHS="${FT_EPOCHS:-10}"
STAGES="${STAGES:-tokenizer ko-en en-ko gru finetune scores}"
BIN="${BIN:-$ROOT/target/release/transformer}"
mkdir -p "$RUNS"

say() { echo "[ko-en] $*" >&2; }

[ -x "$BIN" ] || cargo build --release -p transformer-cli

# Trains OUT with the given flags, or resumes it; a finished run is left as it is.
train() {
    local out="$1"
    shift
    if [ -f "$out/test.hyp" ]; then
        say "finished already: $out"
    elif [ -f "$out/checkpoint.safetensors" ]; then
        say "resuming $out"
        # shellcheck disable=SC2086
        "$BIN" mt train --out "$out" --resume ${RESUME_EXTRA:-} 2>&1 | tee -a "$out.log"
    else
        say "training $out: $*"
        # shellcheck disable=SC2086
        "$BIN" mt train --out "$out" "$@" ${EXTRA:-} 2>&1 | tee -a "$out.log"
    fi
}

# A finished run's validation chrF (news-v1 dev, its best weights, greedy: a comparison
# between tokenizers, at a fifth of beam search's time).
valid_chrf() {
    "$BIN" mt eval --run "$1" --test-set valid --beam 1 --json |
        python3 -c "import json,sys; print(round(json.loads(sys.stdin.readline())['chrf'], 2))"
}

stage_tokenizer() {
    [ -z "${TOKENIZER:-}" ] || return 0
    # The choice is made on validation; each run's closing test is cut to the news test's
    # first 200 pairs (a short model's beam search runs to its length limit on news).
    head -n 200 "$DATA/ko-en/news-v1/korean-english-park.test.ko" >"$RUNS/news-test-200.ko"
    head -n 200 "$DATA/ko-en/news-v1/korean-english-park.test.en" >"$RUNS/news-test-200.en"
    for tok in bpe bpe-bytes unigram unigram-bytes; do
        train "$RUNS/tok-$tok" --corpus ko-en-all --reverse --data "$DATA" \
            --tokenizer "$tok" --epochs "$TOK_EPOCHS" \
            --test-src "$RUNS/news-test-200.ko" --test-tgt "$RUNS/news-test-200.en"
    done
    best=""
    best_score=-1
    for tok in bpe bpe-bytes unigram unigram-bytes; do
        s=$(valid_chrf "$RUNS/tok-$tok")
        say "validation chrF (en->ko, $TOK_EPOCHS epochs) with $tok: $s"
        if python3 -c "import sys; sys.exit(0 if $s > $best_score else 1)"; then
            best="$tok"
            best_score="$s"
        fi
    done
    echo "$best" >"$RUNS/tokenizer.txt"
    say "chosen tokenizer: $best (validation chrF $best_score)"
}
tokenizer() { echo "${TOKENIZER:-$(cat "$RUNS/tokenizer.txt" 2>/dev/null || echo bpe)}"; }

stage_ko-en() {
    train "$RUNS/ko-en" --corpus ko-en-all --data "$DATA" --tokenizer "$(tokenizer)" \
        --epochs "$EPOCHS"
}
stage_en-ko() {
    train "$RUNS/en-ko" --corpus ko-en-all --reverse --data "$DATA" --tokenizer "$(tokenizer)" \
        --epochs "$EPOCHS"
}
stage_gru() {
    train "$RUNS/ko-en-gru" --corpus ko-en-all --data "$DATA" --tokenizer "$(tokenizer)" \
        --arch gru-bahdanau --epochs "$EPOCHS"
    # The Transformer trained for as many epochs, to compare the two like for like.
    train "$RUNS/ko-en-$EPOCHS-epochs" --corpus ko-en-all --data "$DATA" \
        --tokenizer "$(tokenizer)" --epochs "$EPOCHS"
}
stage_finetune() {
    split="$RUNS/tatoeba-split"
    [ -f "$split/train.ko" ] || python3 scripts/split_ko_en_tatoeba.py "$DATA/ko-en" "$split" >&2
    train "$RUNS/ko-en-ft-tatoeba" --init-from "$RUNS/ko-en" \
        --train-src "$split/train.ko" --train-tgt "$split/train.en" \
        --valid-src "$split/valid.ko" --valid-tgt "$split/valid.en" \
        --test-src "$split/test.ko" --test-tgt "$split/test.en" --epochs "$FT_EPOCHS" \
        --warmup 100 --lr-factor 0.1
}
stage_scores() {
    local run
    for dir in "$RUNS"/*/; do
        run=$(basename "$dir")
        [[ $run == tok-* || $run == tatoeba-split ]] && continue
        [ -f "$RUNS/$run/test.hyp" ] || { say "not finished, not scored: $run"; continue; }
        [ -s "$RUNS/$run/scores.jsonl" ] && continue
        local sets=()
        for set in ${SCORE_SETS:-all}; do sets+=(--test-set "$set"); done
        "$BIN" mt eval --run "$RUNS/$run" --corpus ko-en-all --data "$DATA" "${sets[@]}" \
            --json --hyp-out "$RUNS/$run/hyps" |
            python3 -c "import json,sys
for l in sys.stdin:
    v = json.loads(l); v['run'] = '$run'; print(json.dumps(v))" >"$RUNS/$run/scores.jsonl.part"
        mv "$RUNS/$run/scores.jsonl.part" "$RUNS/$run/scores.jsonl"
    done
    cat "$RUNS"/*/scores.jsonl >"$RUNS/scores.jsonl" 2>/dev/null || true
    say "scores: $RUNS/scores.jsonl"
}

for s in $STAGES; do
    declare -F "stage_$s" >/dev/null || { say "no stage named $s (stages: tokenizer ko-en en-ko gru finetune scores)"; exit 2; }
    "stage_$s"
done
