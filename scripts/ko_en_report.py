#!/usr/bin/env python3
"""The Korean-English results of docs/MT.md from scripts/ko_en_experiments.sh's runs.

    python3 scripts/ko_en_report.py runs/ko-en            # the table (markdown)
    python3 scripts/ko_en_report.py runs/ko-en --samples  # and sample translations

The table: one row per run, one column per held-out set; each cell is chrF2 and BLEU as
`mt eval --json` wrote them to RUNS/scores.jsonl (sacreBLEU's default 13a BLEU into
English; into Korean its `char`-tokenized BLEU, since 13a splits Korean only at spaces).

The samples: for each held-out set, three sentences whose reference has 4 to 30 words,
translated by each run into English (or into Korean), the ones with the highest, the median
and the lowest sentence-level chrF among them (this script's own chrF2 of character 1- to 6-grams, used
only to rank), with the source and the reference from RUNS/<run>/hyps/NAME.{src,ref}.
Standard library only.
"""
import argparse
import json
import os
from collections import Counter

RUNS = [
    ("ko-en", "Transformer, Korean to English"),
    ("ko-en-ft-tatoeba", "the same, fine-tuned on Tatoeba"),
    ("ko-en-1-epochs", "Transformer, Korean to English"),
    ("ko-en-gru", "gru-bahdanau, Korean to English"),
    ("en-ko", "Transformer, English to Korean"),
]
SETS = [
    ("news-v1-test", "news-v1 test"),
    ("ntrex128", "NTREX-128"),
    ("tatoeba-heldout", "Tatoeba"),
    ("python-docs-heldout", "Python docs"),
    ("lo-help-heldout", "LibreOffice help"),
    ("lo-ui-heldout", "LibreOffice UI"),
]


def ngrams(text, n):
    chars = text.replace(" ", "")
    return Counter(chars[i : i + n] for i in range(len(chars) - n + 1))


def sentence_chrf(hyp, ref, beta=2.0):
    """chrF with character n-grams 1..6, averaged precision and recall (for ranking only)."""
    precs, recs = [], []
    for n in range(1, 7):
        h, r = ngrams(hyp, n), ngrams(ref, n)
        if not h or not r:
            continue
        match = sum((h & r).values())
        precs.append(match / sum(h.values()))
        recs.append(match / sum(r.values()))
    if not precs:
        return 0.0
    p, r = sum(precs) / len(precs), sum(recs) / len(recs)
    if p + r == 0:
        return 0.0
    return 100 * (1 + beta**2) * p * r / (beta**2 * p + r)


def label_of(runs_dir, run, label):
    """The label with the run's epochs (from its config.toml)."""
    try:
        with open(os.path.join(runs_dir, run, "config.toml"), encoding="utf-8") as f:
            for line in f:
                if line.startswith("epochs ="):
                    n = line.split("=")[1].strip()
                    return f"{label}, {n} epoch{'' if n == '1' else 's'}"
    except OSError:
        pass
    return label


def table(runs_dir):
    scores = {}
    with open(os.path.join(runs_dir, "scores.jsonl"), encoding="utf-8") as f:
        for line in f:
            v = json.loads(line)
            scores[(v["run"], v["set"])] = v
    head = "| system | " + " | ".join(name for _, name in SETS) + " |"
    rows = [head, "|---|" + "---|" * len(SETS)]
    for run, label in RUNS:
        if not any((run, s) in scores for s, _ in SETS):
            continue
        cells = []
        for s, _ in SETS:
            v = scores.get((run, s))
            if v is None:
                cells.append("")
                continue
            bleu = v["bleu_char"] if run.startswith("en-ko") else v["bleu"]
            cells.append(f"{v['chrf']:.1f} / {bleu:.1f}")
        rows.append(f"| {label_of(runs_dir, run, label)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def samples(runs_dir):
    out = []
    for run, label in RUNS:
        hyps_dir = os.path.join(runs_dir, run, "hyps")
        if not os.path.isdir(hyps_dir):
            continue
        out.append(f"{label_of(runs_dir, run, label)}:\n")
        out.append("| set | | source | reference | model |")
        out.append("|---|---|---|---|---|")
        for s, name in SETS:
            paths = [os.path.join(hyps_dir, f"{s}.{ext}") for ext in ("src", "ref", "hyp")]
            if not all(os.path.exists(p) for p in paths):
                continue
            src, ref, hyp = (read_lines(p) for p in paths)
            ranked = sorted(
                (sentence_chrf(h, r), i)
                for i, (x, r, h) in enumerate(zip(src, ref, hyp))
                if 4 <= len(r.split()) <= 30
            )
            if not ranked:
                continue
            picks = [ranked[-1], ranked[len(ranked) // 2], ranked[0]]
            for (_, i), kind in zip(picks, ("best", "median", "worst")):
                cell = lambda t: t.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
                out.append(f"| {name} | {kind} | {cell(src[i])} | {cell(ref[i])} | {cell(hyp[i])} |")
        out.append("")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", help="the experiments' folder (RUNS of ko_en_experiments.sh)")
    ap.add_argument("--samples", action="store_true", help="also print sample translations")
    a = ap.parse_args()
    print(table(a.runs))
    if a.samples:
        print()
        print(samples(a.runs))


if __name__ == "__main__":
    main()
