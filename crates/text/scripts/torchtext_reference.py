#!/usr/bin/env python3
"""Reference numbers for crates/text/tests/wikitext2.rs, computed the tutorial's way in Python.

Usage: python3 crates/text/scripts/torchtext_reference.py [DIR]   (DIR defaults to
../shared/data/wikitext-2 relative to the repository root)

Standard library only. It runs torchtext's own rules, restated here so that no torchtext
install is needed: the `_basic_english_normalize` pattern table (torchtext/data/utils.py),
`build_vocab_from_iterator(..., specials=['<unk>'])` (torchtext/vocab/vocab_factory.py: a
Counter sorted with key=(-count, token), specials removed and put first) and the tutorial's
`data_process` (concatenate the ids of every line that has tokens). If torchtext happens to be
importable, its tokenizer and vocabulary are used instead and the two are compared.

Prints the vocabulary size, per-split token counts, batchify shapes (train 20 columns,
valid/test 10), the window counts for bptt 35, and 64-bit FNV-1a hashes of the vocabulary
(tokens joined by "\\n", UTF-8) and of each id stream (ids as little-endian u32), which the
Rust test compares against.
"""
import os
import re
import struct
import sys
from collections import Counter

PATTERNS = [r"\'", r"\"", r"\.", r"<br \/>", r",", r"\(", r"\)", r"\!", r"\?", r"\;", r"\:", r"\s+"]
REPLACEMENTS = [" '  ", "", " . ", " ", " , ", " ( ", " ) ", " ! ", " ? ", " ", " ", " "]
COMPILED = [(re.compile(p), r) for p, r in zip(PATTERNS, REPLACEMENTS)]


def basic_english(line):
    line = line.lower()
    for pattern, replacement in COMPILED:
        line = pattern.sub(replacement, line)
    return line.split()


def build_itos(token_lists):
    counter = Counter()
    for tokens in token_lists:
        counter.update(tokens)
    ordered = [t for t, _ in sorted(counter.items(), key=lambda x: (-x[1], x[0]))]
    return ["<unk>"] + [t for t in ordered if t != "<unk>"]


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def lines(directory, split):
    # torchtext's WikiText2 yields lines with their "\n"; the tokenizer ignores it.
    with open(os.path.join(directory, split + ".txt"), encoding="utf-8") as f:
        yield from f


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    directory = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "..", "shared", "data", "wikitext-2")
    itos = build_itos(basic_english(l) for l in lines(directory, "train"))
    try:
        from torchtext.data.utils import get_tokenizer
        from torchtext.vocab import build_vocab_from_iterator

        tokenizer = get_tokenizer("basic_english")
        vocab = build_vocab_from_iterator(map(tokenizer, lines(directory, "train")), specials=["<unk>"])
        assert vocab.get_itos() == itos, "torchtext's vocabulary differs from the restated rules"
        print("torchtext available: vocabulary identical")
    except ImportError:
        print("torchtext not installed: using the restated rules only")
    stoi = {t: i for i, t in enumerate(itos)}
    print(f"vocab_len {len(itos)}")
    print(f"vocab_first {itos[:12]}")
    print(f"vocab_fnv 0x{fnv1a64(chr(10).join(itos).encode('utf-8')):016x}")
    for split, bsz in [("train", 20), ("valid", 10), ("test", 10)]:
        ids = []
        for line in lines(directory, split):
            ids.extend(stoi.get(t, 0) for t in basic_english(line))
        rows = len(ids) // bsz
        blob = struct.pack(f"<{len(ids)}I", *ids)
        print(
            f"{split}: tokens {len(ids)} unk {ids.count(0)} batchify ({rows}, {bsz}) "
            f"tutorial_batches(35) {rows // 35} windows(35) {len(range(0, rows - 1, 35))} "
            f"ids_fnv 0x{fnv1a64(blob):016x}"
        )


if __name__ == "__main__":
    main()
