#!/usr/bin/env python3
"""Generate CTranslate2 reference fixtures for target prefixes and replace_unknowns.

What it makes: crates/runtime/tests/fixtures/ctranslate2/expected_prefix_unk.json, the outputs
of the ctranslate2 Python package's Translator.translate_batch (tokens and scores, one batch
per run: max_batch_size=0, so every example of a run shares its batch) for

* CTranslate2's test model v2/aren-transliteration (committed under the same folder) with
  `target_prefix`: one prefix per example, of different lengths, some empty ([] or None), for
  greedy search, beam 2, beam 5 with 3 hypotheses (length penalties 1 and 0), beam 4 with
  min_decoding_length=0 (where CTranslate2 keeps the end token out of the secondary beams at
  the first free step), a max_decoding_length shorter than some prefixes, and every prefix
  empty;
* the Argos Translate package crates/runtime/tests/fixtures/marian/de_en.argosmodel (its
  model/ folder, a small German-English model) with `replace_unknowns=True` on sources whose
  pieces were partly replaced by words outside the vocabulary (so that the outputs hold
  <unk>), greedy and beam 4, and with target prefixes as well;
* Argos Translate's pipeline (argostranslate/translate.py: SentencePiece pieces,
  translate_batch(target_prefix=[[prefix]] * n, replace_unknowns=True, beam_size=4,
  length_penalty=0.2), the pieces decoded, the prefix and then one space removed from the
  text) on the same package with a `target_prefix`, for the package test; and the same
  pipeline without a prefix on texts holding words outside the vocabulary, whose <unk>
  outputs come back as source pieces in the text.

Run (from the repository root):

    /work/venvs/marian/bin/python scripts/make_ct2_prefix_fixtures.py

(a virtual environment with ctranslate2 and sentencepiece). Deterministic for a given
ctranslate2 version (one thread); takes a few seconds.
"""

import argparse
import json
import os
import random
import tempfile
import zipfile

import ctranslate2
import sentencepiece as spm

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "crates", "runtime", "tests", "fixtures")
CT2 = os.path.join(FIXTURES, "ctranslate2")
PACKAGE = os.path.join(FIXTURES, "marian", "de_en.argosmodel")

SCORE_DIGITS = 6

# Per-example target prefixes for the transliteration model (target letters), cycled.
AREN_PREFIXES = [
    None,
    ["a"],
    [],
    ["a", "b", "c"],
    ["m", "o"],
    ["z", "z", "z", "z", "z", "z"],
    ["k", "h", "a", "l", "i", "d"],
    ["e"],
]

# Words outside the German-English model's vocabulary.
OOV = ["Zürich", "Müller", "Ωmega", "東京", "Xylophon", "QQQ"]

# Argos Translate's target prefix for the package test: one target piece without the word
# marker, so that the decoded text starts with it (and Argos Translate removes it).
ARGOS_PREFIX = "ing"


def translator(path):
    return ctranslate2.Translator(path, device="cpu", inter_threads=1, intra_threads=1)


def run(t, name, inputs, prefixes, **options):
    results = t.translate_batch(
        inputs, target_prefix=prefixes, max_batch_size=0, return_scores=True, **options
    )
    return {
        "name": name,
        "options": options,
        "target_prefix": prefixes,
        "results": [
            {
                "hypotheses": r.hypotheses,
                "scores": [round(float(s), SCORE_DIGITS) for s in r.scores],
            }
            for r in results
        ],
    }


def aren_runs():
    path = os.path.join(CT2, "v2", "aren-transliteration")
    t = translator(path)
    with open(os.path.join(CT2, "expected_v2_aren-transliteration.json"), encoding="utf-8") as f:
        inputs = json.load(f)["inputs"][:24]
    prefixes = [AREN_PREFIXES[i % len(AREN_PREFIXES)] for i in range(len(inputs))]
    runs = [
        run(t, "greedy", inputs, prefixes, beam_size=1),
        run(t, "beam2", inputs, prefixes, beam_size=2),
        run(t, "beam5_n3", inputs, prefixes, beam_size=5, num_hypotheses=3),
        run(t, "beam5_n3_lp0", inputs, prefixes, beam_size=5, num_hypotheses=3, length_penalty=0.0),
        run(t, "beam4_min0_lp0", inputs, prefixes, beam_size=4, min_decoding_length=0,
            length_penalty=0.0),
        run(t, "greedy_min0", inputs, prefixes, beam_size=1, min_decoding_length=0),
        run(t, "beam3_max4", inputs, prefixes, beam_size=3, num_hypotheses=2,
            max_decoding_length=4),
        run(t, "greedy_max4", inputs, prefixes, beam_size=1, max_decoding_length=4),
        run(t, "beam2_all_empty", inputs, [[] for _ in inputs], beam_size=2),
    ]
    return {"model": "ctranslate2/v2/aren-transliteration", "inputs": inputs, "runs": runs}


def unzip_package(tmp):
    with zipfile.ZipFile(PACKAGE) as z:
        z.extractall(tmp)
    root = next(
        os.path.join(tmp, d) for d in os.listdir(tmp) if os.path.isdir(os.path.join(tmp, d))
    )
    return root


def argos_unk_runs(root):
    t = translator(os.path.join(root, "model"))
    with open(os.path.join(FIXTURES, "marian", "argos_expected.json"), encoding="utf-8") as f:
        sources = [line["src_pieces"] for line in json.load(f)["lines"]]
    rng = random.Random(1)
    inputs = []
    while len(inputs) < 40:
        s = list(rng.choice(sources))
        for j in range(len(s)):
            if rng.random() < 0.35:
                s[j] = rng.choice(OOV) + str(j)
        inputs.append(s)
    vocab = json.load(open(os.path.join(root, "model", "shared_vocabulary.json"), encoding="utf-8"))
    prefixes = [[["▁A"], None, ["▁Two", "▁men"], []][i % 4] for i in range(len(inputs))]
    runs = [
        run(t, "unk_greedy", inputs, None, beam_size=1, max_decoding_length=100,
            replace_unknowns=True),
        run(t, "unk_beam4", inputs, None, beam_size=4, length_penalty=0.2,
            max_decoding_length=100, replace_unknowns=True),
        run(t, "unk_beam4_prefix", inputs, prefixes, beam_size=4, length_penalty=0.2,
            max_decoding_length=100, replace_unknowns=True),
        run(t, "plain_beam4", inputs, None, beam_size=4, length_penalty=0.2,
            max_decoding_length=100),
    ]
    # The sources' OOV words must come back: otherwise the run checks nothing.
    replaced = sum(
        1
        for r in runs[1]["results"]
        for tok in r["hypotheses"][0]
        if tok not in vocab
    )
    unk = sum(1 for r in runs[3]["results"] if "<unk>" in r["hypotheses"][0])
    assert replaced > 5 and unk > 5, (replaced, unk)
    return {"model": "marian/de_en.argosmodel", "inputs": inputs, "runs": runs}


def argos_translate(t, sp, texts, prefix):
    """Argos Translate's translate.py on `texts`: SentencePiece pieces,
    translate_batch(target_prefix=[[prefix]] * n when it has one, replace_unknowns=True,
    beam_size=4, length_penalty=0.2), the pieces decoded, the prefix and then one space
    removed from the text. Returns (tokens, score, text) per text."""
    tokenized = [sp.encode(s, out_type=str) for s in texts]
    results = t.translate_batch(
        tokenized,
        target_prefix=[[prefix]] * len(tokenized) if prefix else None,
        replace_unknowns=True,
        beam_size=4,
        num_hypotheses=1,
        length_penalty=0.2,
        return_scores=True,
    )
    out = []
    for r in results:
        tokens = r.hypotheses[0]
        value = sp.decode(tokens)
        if prefix != "" and value.startswith(prefix):
            value = value[len(prefix):]
        if len(value) > 0 and value[0] == " ":
            value = value[1:]
        out.append((tokens, float(r.scores[0]), value))
    return out


def argos_pipeline(root):
    """Argos Translate's translate.py with a target_prefix (beam 4, length penalty 0.2)."""
    t = translator(os.path.join(root, "model"))
    sp = spm.SentencePieceProcessor(model_file=os.path.join(root, "sentencepiece.model"))
    vocab = json.load(open(os.path.join(root, "model", "shared_vocabulary.json"), encoding="utf-8"))
    assert ARGOS_PREFIX in vocab
    with open(os.path.join(FIXTURES, "marian", "argos_expected.json"), encoding="utf-8") as f:
        texts = [line["src"] for line in json.load(f)["lines"]][:12]
    lines = []
    for text, (tokens, score, value) in zip(texts, argos_translate(t, sp, texts, ARGOS_PREFIX)):
        # replace_unknowns changes nothing here: the test translates without it.
        assert all(tok in vocab for tok in tokens), tokens
        lines.append(
            {"src": text, "tokens": tokens, "score": round(score, SCORE_DIGITS), "text": value}
        )
    return {"target_prefix": ARGOS_PREFIX, "beam_size": 4, "length_penalty": 0.2,
            "lines": lines}


def argos_pipeline_unknowns(root):
    """Argos Translate's translate.py (no target prefix) on texts holding words outside the
    vocabulary: the <unk> outputs come back as the source's pieces (replace_unknowns=True)
    and the text is their SentencePiece decoding, as LibreTranslate serves it."""
    t = translator(os.path.join(root, "model"))
    sp = spm.SentencePieceProcessor(model_file=os.path.join(root, "sentencepiece.model"))
    vocab = json.load(open(os.path.join(root, "model", "shared_vocabulary.json"), encoding="utf-8"))
    with open(os.path.join(FIXTURES, "marian", "argos_expected.json"), encoding="utf-8") as f:
        texts = [line["src"] for line in json.load(f)["lines"]][:30]
    rng = random.Random(2)
    sources = []
    for text in texts:
        words = text.split(" ")
        for j in range(len(words)):
            if rng.random() < 0.3:
                words[j] = rng.choice(OOV) + str(j)
        sources.append(" ".join(words))
    lines = [
        {"src": text, "tokens": tokens, "text": value}
        for text, (tokens, _, value) in zip(sources, argos_translate(t, sp, sources, ""))
    ]
    copied = sum(1 for line in lines for tok in line["tokens"] if tok not in vocab)
    assert copied > 5, copied
    return {"beam_size": 4, "length_penalty": 0.2, "lines": lines}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(CT2, "expected_prefix_unk.json"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = unzip_package(tmp)
        out = {
            "ctranslate2_version": ctranslate2.__version__,
            "made_by": "scripts/make_ct2_prefix_fixtures.py",
            "aren": aren_runs(),
            "argos": argos_unk_runs(root),
            "argos_pipeline": argos_pipeline(root),
            "argos_pipeline_unknowns": argos_pipeline_unknowns(root),
        }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
