#!/usr/bin/env python3
"""Writes an in-domain Korean-English split for `transformer mt train`: Tatoeba's kor.txt
held out by English sentence (a sentence and all its Korean translations land in one split:
md5 of the English text mod 20 = 0 -> valid, 1 -> test, else train), with JHE dev and eval
added to train.

    python3 scripts/split_ko_en_tatoeba.py ../shared/data/ko-en runs/ko-en-split
    transformer mt train --out runs/ko-en-tatoeba --vocab-size 4000 --dropout 0.3 --epochs 60 \\
        --train-src runs/ko-en-split/train.ko --train-tgt runs/ko-en-split/train.en \\
        --valid-src runs/ko-en-split/valid.ko --valid-tgt runs/ko-en-split/valid.en \\
        --test-src runs/ko-en-split/test.ko --test-tgt runs/ko-en-split/test.en

Standard library only; the files are written outside the repository's tracked tree.
"""
import hashlib
import sys
from pathlib import Path


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: split_ko_en_tatoeba.py KO_EN_DATA_DIR OUT_DIR")
    data, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    files = {k: (open(out / f"{k}.ko", "w", encoding="utf-8"),
                 open(out / f"{k}.en", "w", encoding="utf-8"))
             for k in ("train", "valid", "test")}
    counts = {k: 0 for k in files}
    for line in open(data / "tatoeba" / "kor.txt", encoding="utf-8"):
        parts = line.rstrip("\n").split("\t")
        if len(parts) < 2:
            continue
        en, ko = parts[0].strip(), parts[1].strip()
        h = int(hashlib.md5(en.encode("utf-8")).hexdigest(), 16) % 20
        k = "valid" if h == 0 else "test" if h == 1 else "train"
        files[k][0].write(ko + "\n")
        files[k][1].write(en + "\n")
        counts[k] += 1
    for part in ("dev", "eval"):
        ko_lines = open(data / "jhe" / f"jhe-koen-{part}.ko", encoding="utf-8")
        en_lines = open(data / "jhe" / f"jhe-koen-{part}.en", encoding="utf-8")
        for ko, en in zip(ko_lines, en_lines):
            files["train"][0].write(ko.strip() + "\n")
            files["train"][1].write(en.strip() + "\n")
            counts["train"] += 1
    print(counts)


if __name__ == "__main__":
    main()
