#!/usr/bin/env python3
"""Fixtures for transformer_text::sentencepiece (crates/text/tests/sentencepiece.rs).

Trains four small SentencePiece models with the `sentencepiece` Python package and writes,
for every test line of Multi30k (test_2016_flickr .de and .en), of the Korean-English
test split JHE eval (.ko and .en) and for a list of hard strings, what the package gives:

* `pieces`: `encode(text, out_type=str)`, joined by spaces (a list where a piece holds one)
* `ids`: `encode(text)`, only where they differ from the pieces' own ids
* `decoded`: `decode(ids)` where it differs from the text, and `decoded_pieces`:
  `decode(pieces)` where it differs from `decoded` (detokenization)

plus `decode(ids)` for random id sequences drawn from the whole vocabulary (control, unknown
and byte pieces in any order: invalid UTF-8 from byte pieces, leading spaces).

The models (all small; the nmt_nfkc ones are mostly the 240 KB normalization charsmap, so
every .model is written gzipped):

* `m30k_unigram`: Unigram, default `nmt_nfkc`, Multi30k de+en.
* `m30k_bpe`: BPE, `nmt_nfkc`, user-defined `>>deu<<`/`>>eng<<`, Multi30k de+en.
* `koen_unigram_bytes`: Unigram with byte_fallback, Korean+English (Tatoeba and JHE dev).
* `m30k_identity`: Unigram, `identity` normalization, remove_extra_whitespaces=false,
  user-defined `>>deu<<`/`>>eng<<`/`>>fra<<` and a control symbol `<sep>`, Multi30k de+en.

The training data is sampled deterministically (at most 20,000 lines). The data files are
read from their place (never copied into the repository); the inputs of the test lines are in
the expected files because the test needs them.

Usage (from the repository root, with a venv that has `pip install sentencepiece`):

    python3 scripts/make_sentencepiece_fixtures.py
"""

import argparse
import gzip
import json
import os
import random
import shutil
import sys
import tempfile

import sentencepiece as spm

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DATA = os.path.join(REPO, "..", "shared", "data")

HARD = [
    "",
    " ",
    "   ",
    "\t",
    "\t \t",
    "  leading spaces",
    "trailing spaces   ",
    "  both  sides  ",
    "multiple     spaces   inside",
    "tab\tseparated\twords",
    "mixed \t whitespace\t \tseq",
    "line\nbreak and\r\ncarriage",
    "non\u00a0breaking\u00a0space",
    "ideographic\u3000space\u3000here",
    "en\u2002em\u2003thin\u2009spaces",
    "zero\u200bwidth\u200cjoiner\u200dtest",
    "soft\u00adhyphen",
    "\ufeffbyte order mark",
    "ｆｕｌｌ－ｗｉｄｔｈ　ＡＢＣ　１２３！",
    "half-width ｶﾀｶﾅ ｶﾞｷﾞ ﾊﾟ",
    "emoji 😀🎉 in text 👍🏽",
    "family 👨‍👩‍👧 and flag 🇩🇪🇰🇷",
    "combining: e\u0301 a\u0308 o\u0302 n\u0303",
    "precomposed: é ä ô ñ",
    "Ångström Å Å Ω Ω K K",
    "ligatures ﬁ ﬂ ﬀ ǅ Ǆ",
    "fractions ½ ¾ ⅓ and circled ① ② ㈱ ㍿",
    "superscripts x² y³ H₂O",
    "Straße ẞ İstanbul ß",
    "Ein Hund läuft über die Wiese.",
    ">>deu<< Ein Hund läuft.",
    ">>eng<<A dog runs.",
    "x>>deu<<y >>fra<< z",
    ">> deu << not a tag",
    "<unk> <s> </s> <sep> <pad> literal",
    "▁ already escaped ▁▁ ▁x",
    "日本語のテキストと漢字",
    "中文文本测试",
    "Привет, мир!",
    "مرحبا بالعالم",
    "שלום עולם",
    "ελληνικά κείμενα",
    "한국어 문장입니다.",
    "decomposed hangul \u1112\u1161\u11ab\u1100\u1173\u11af",
    "hangul jamo ㄱㄴㄷ ᄀᄁ",
    "control\x01chars\x7fhere",
    "nul\x00char",
    "numbers 1234567890 3.14159 1,000,000",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "Donaudampfschifffahrtsgesellschaftskapitänsmütze",
    "ALL CAPS SENTENCE WITH WORDS",
    "punctuation!!! ??? ... --- ;;; :::",
    "quotes “curly” ‘single’ «guillemets» „German“",
    "math ∑ ∫ √ ∞ ≠ ≤ ≥ ×",
    "private use \ue000\uf8ff and noncharacter \ufdd0",
    "\U0001d400\U0001d401 math bold",
    "Ⅻ roman numeral Ⅻ ⅻ",
    "trailing tab\t",
    "\u3000\u3000",
    "\u00a0",
    "\u200b",
    "a",
    "▁",
    "😀",
]


def read_lines(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\n") for line in f]


def sample(lines, n, seed):
    lines = [line for line in lines if line.strip()]
    if len(lines) <= n:
        return lines
    return random.Random(seed).sample(lines, n)


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--multi30k", default=os.path.join(DATA, "multi30k", "task1", "raw"))
    p.add_argument("--ko-en", default=os.path.join(DATA, "ko-en"))
    p.add_argument(
        "--out", default=os.path.join(REPO, "crates", "text", "tests", "fixtures", "sentencepiece")
    )
    p.add_argument(
        "--test-file",
        action="append",
        help="compare on these text files (gzip if .gz) instead of the default test lines; "
        "for a larger check outside the repository: --out /tmp/spm --test-file ..., then "
        "SENTENCEPIECE_FIXTURES=/tmp/spm cargo test --release -p transformer-text "
        "--test sentencepiece -- --ignored",
    )
    args = p.parse_args()

    m30k = args.multi30k
    train_m30k = sample(
        read_lines(os.path.join(m30k, "train.de.gz")) + read_lines(os.path.join(m30k, "train.en.gz")),
        20000,
        1,
    )
    kor = [line.split("\t") for line in read_lines(os.path.join(args.ko_en, "tatoeba", "kor.txt"))]
    train_koen = sample(
        [c[0] for c in kor]
        + [c[1] for c in kor]
        + read_lines(os.path.join(args.ko_en, "jhe", "jhe-koen-dev.ko"))
        + read_lines(os.path.join(args.ko_en, "jhe", "jhe-koen-dev.en")),
        20000,
        2,
    )

    test_m30k = read_lines(os.path.join(m30k, "test_2016_flickr.de.gz")) + read_lines(
        os.path.join(m30k, "test_2016_flickr.en.gz")
    )
    # JHE eval (720 pairs) rather than news-v1 test (2,000 long pairs) keeps the fixtures small.
    jhe = os.path.join(args.ko_en, "jhe")
    test_jhe = read_lines(os.path.join(jhe, "jhe-koen-eval.ko")) + read_lines(
        os.path.join(jhe, "jhe-koen-eval.en")
    )

    common = dict(
        num_threads=2,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        minloglevel=2,
    )
    models = {
        "m30k_unigram": (train_m30k, dict(model_type="unigram", vocab_size=1000)),
        "m30k_bpe": (
            train_m30k,
            dict(model_type="bpe", vocab_size=1000, user_defined_symbols=[">>deu<<", ">>eng<<"]),
        ),
        "koen_unigram_bytes": (
            train_koen,
            dict(
                model_type="unigram",
                vocab_size=2000,
                byte_fallback=True,
                character_coverage=0.98,
            ),
        ),
        "m30k_identity": (
            train_m30k,
            dict(
                model_type="unigram",
                vocab_size=800,
                normalization_rule_name="identity",
                remove_extra_whitespaces=False,
                user_defined_symbols=[">>deu<<", ">>eng<<", ">>fra<<"],
                control_symbols=["<sep>"],
            ),
        ),
    }

    test_lines = test_m30k + test_jhe
    if args.test_file:
        test_lines = [line for path in args.test_file for line in read_lines(path)]

    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp()
    try:
        for name, (train, opts) in models.items():
            train_path = os.path.join(tmp, name + ".txt")
            write_lines(train_path, train)
            prefix = os.path.join(tmp, name)
            spm.SentencePieceTrainer.train(input=train_path, model_prefix=prefix, **common, **opts)
            with open(prefix + ".model", "rb") as f:
                model_bytes = f.read()
            with gzip.GzipFile(
                os.path.join(args.out, name + ".model.gz"), "wb", mtime=0
            ) as f:
                f.write(model_bytes)

            sp = spm.SentencePieceProcessor(model_proto=model_bytes)
            rows = [{"sentencepiece_version": spm.__version__, "model": name, "options": opts}]
            for text in HARD + test_lines:
                pieces = sp.encode(text, out_type=str)
                ids = sp.encode(text)
                # Pieces joined by spaces (no piece holds one while whitespace is escaped).
                if all(" " not in x for x in pieces):
                    row = {"text": text, "pieces": " ".join(pieces)}
                else:
                    row = {"text": text, "pieces": pieces}
                # Ids only where they are not the pieces' own ids (merged unknowns).
                if ids != [sp.piece_to_id(x) for x in pieces]:
                    row["ids"] = ids
                decoded = sp.decode(ids)
                if decoded != text:
                    row["decoded"] = decoded
                decoded_pieces = sp.decode(pieces)
                if decoded_pieces != decoded:
                    row["decoded_pieces"] = decoded_pieces
                rows.append(row)
            rng = random.Random(3)
            n = sp.get_piece_size()
            byte_ids = [i for i in range(n) if sp.is_byte(i)] or list(range(n))
            for _ in range(200):
                ids = [rng.randrange(n) for _ in range(rng.randint(1, 10))]
                # Byte pieces next to each other often, so that valid and invalid UTF-8 occur.
                if rng.random() < 0.5:
                    ids = [rng.choice(byte_ids) for _ in ids]
                    ids.insert(rng.randrange(len(ids) + 1), rng.randrange(n))
                rows.append({"decode_ids": ids, "decoded": sp.decode(ids)})
            with gzip.GzipFile(
                os.path.join(args.out, name + ".expected.jsonl.gz"), "wb", mtime=0
            ) as f:
                for row in rows:
                    f.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
            print(f"{name}: {n} pieces, {len(rows)} rows", file=sys.stderr)
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
