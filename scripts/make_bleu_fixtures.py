"""Write sacreBLEU reference fixtures for `transformer_text::score` (corpus BLEU and chrF).

What it produces, in ``crates/text/tests/fixtures/bleu/``:

* ``<case>.hyp`` / ``<case>.ref``: small parallel text cases, one segment per line (UTF-8, LF).
* ``expected.json``: sacreBLEU's corpus scores for every case and metric configuration
  (BLEU: tokenizers 13a, intl, char, none x lowercase off/on x smoothing exp/none, plus 13a with
  floor and add-k; chrF: chrF2, chrF2 lowercased, chrF2++, chrF2 with eps smoothing), one row
  per line to keep it small and diffable:
  ``signatures``: configuration -> sacreBLEU signature (the same for every case);
  ``bleu`` rows: [case, tokenize, lowercase, smooth, score, precisions (percent), bp, ratio,
  sys_len, ref_len, counts, totals, line], where ``line`` is ``str(score)``
  (``BLEU = 33.41 64.7/40.2/26.6/17.9 (BP = ...)``) for the configurations in ``LINE_CONFIGS``
  and null for the others; ``chrf`` rows: [case, word_order, lowercase, eps_smoothing, score,
  stats (summed [hyp, ref, match] per order), line]. Floats are Python's, all digits.
* ``tokenize.json``: tricky strings with sacreBLEU's own tokenizer outputs (13a, intl, char),
  Python's ``str.lower()`` of each, and every code point for which ``str.isspace()`` is true
  (what ``str.split()`` / ``str.rstrip()`` treat as whitespace).

The script also checks that torchtext's ``bleu_score`` formula over lowercased 13a tokens (the
"lowercased-token BLEU" of the PyTorch translation tutorial) equals sacreBLEU's BLEU with
``lowercase=True, tokenize="13a", smooth_method="none"`` (times 1/100) on every case, which is
how ``BleuOptions::lowercased_tokens`` computes it.

Segments are read the way the sacreBLEU command line reads files (split on "\\n" only, then
``str.rstrip()``), and scored with the Python API (``BLEU(...).corpus_score``,
``CHRF(...).corpus_score``), one reference per segment.

The cases use at most 25 lines of Multi30k's English validation split (``val.en.gz``) and 5
lines of the Korean-English news test split, read from ``../shared/data`` (the repository's
data convention); the rest of the text is written here. The fixtures are committed; the Rust
tests need no Python.

How to run (from the repository root)
-------------------------------------
    python3 -m venv /work/venv-bleu && /work/venv-bleu/bin/pip install sacrebleu
    /work/venv-bleu/bin/python scripts/make_bleu_fixtures.py [--data ../shared/data]
"""

import argparse
import gzip
import json
import sys
from pathlib import Path

import sacrebleu
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a
from sacrebleu.tokenizers.tokenizer_char import TokenizerChar
from sacrebleu.tokenizers.tokenizer_intl import TokenizerV14International

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "text" / "tests" / "fixtures" / "bleu"

TOKENIZERS = ["13a", "intl", "char", "none"]
SMOOTHINGS = ["exp", "none"]
# BLEU configurations whose formatted line (`str(score)`) is stored (to keep the fixture small)
LINE_CONFIGS = {("13a", False, "exp"), ("13a", True, "none"), ("intl", False, "exp"),
                ("char", False, "none")}


def perturb_en(i, line):
    """Deterministic, ordinary-looking system errors for English reference `line`."""
    words = line.split()
    kind = i % 5
    if kind == 0:  # a perfect translation
        return line
    if kind == 1:  # last word dropped
        return " ".join(words[:-1])
    if kind == 2:  # two words swapped in the middle
        j = len(words) // 2
        words[j - 1], words[j] = words[j], words[j - 1]
        return " ".join(words)
    if kind == 3:  # synonyms and article changes
        swap = {"man": "guy", "men": "guys", "woman": "lady", "a": "the", "A": "The",
                "is": "was", "are": "were", "dog": "puppy", "young": "little"}
        return " ".join(swap.get(w, w) for w in words)
    # kind 4: lowercased, final period removed, one word repeated
    text = line.lower().rstrip(".")
    ws = text.split()
    return " ".join(ws[:2] + ws[1:2] + ws[2:])


def perturb_ko(i, line):
    words = line.split()
    kind = i % 4
    if kind == 0:
        return line
    if kind == 1:
        return " ".join(words[: max(1, len(words) * 2 // 3)])
    if kind == 2:
        j = len(words) // 2
        words[j - 1], words[j] = words[j], words[j - 1]
        return " ".join(words)
    return " ".join(w for k, w in enumerate(words) if k % 3 != 1)


def make_cases(data):
    val_en = gzip.open(data / "multi30k/task1/raw/val.en.gz", "rt", encoding="utf-8").read()
    val_en = val_en.split("\n")[:25]
    ko = (data / "ko-en/news-v1/korean-english-park.test.ko").read_text(encoding="utf-8")
    ko = ko.split("\n")[:5]

    cases = {}
    cases["en_multi30k"] = (
        [perturb_en(i, l) for i, l in enumerate(val_en[:20])],
        val_en[:20],
    )
    # empty hypotheses among ordinary ones (lines 20-24 of val.en)
    refs = val_en[20:25]
    cases["empty_hyps"] = (["", refs[1], "", perturb_en(3, refs[3]), ""], refs)
    cases["all_empty"] = (["", "", ""], val_en[20:23])
    cases["short"] = (["A dog runs"], ["A dog runs fast ."])
    cases["short_two"] = (["Hi !", "Thank you"], ["Hi there !", "Thank you very much ."])
    cases["unicode_punct"] = (
        [
            "„Das ist gut“, sagte er – und ging…",
            "Er sagte: „Nein!“ — dann lachte er.",
            "«\u202fBonjour\u202f», dit-il\u00a0; «\u00a0ça va\u00a0?\u00a0»",
            "Elle a dit « oui »… puis « non ».",
            "¿Qué pasa? ¡Nada! — dijo ella.",
            "It’s “quoted” text — isn’t it…",
            "Preis: 5 € (±2 %), © 2020 • 30 °C",
            "Emoji 😀 and stars ★★ in “text”.",
        ],
        [
            "„Das ist gut“, sagte er — und ging …",
            "Er sagte: „Nein!“ – dann lachte er.",
            "« Bonjour », dit-il ; « ça va ? »",
            "Elle a dit « oui » … puis « non ».",
            "¿Qué pasa? ¡Nada! – dijo ella.",
            "It's \"quoted\" text — isn't it...",
            "Preis: 5 € (± 2 %), © 2020 · 30 °C",
            "Emoji 😀 and stars ★★ in \"text\".",
        ],
    )
    cases["korean"] = ([perturb_ko(i, l) for i, l in enumerate(ko)], ko)
    cases["numbers"] = (
        [
            "The price rose 3.5% to $1,234.56 on 12-05-2020.",
            "About 3,000,000 people live there, not 3.000.000.",
            "It was built in 1999.",
            "Scores: 10-20, 5-3 and -5 degrees.",
            "Version 2.0.1 fixed bug #42 (see p. 7).",
            "He ran 42.195 km in 2:03:59.",
        ],
        [
            "The price rose 3.5 % to $1,234.56 on 12-05-2020.",
            "About 3,000,000 people live there, not 3.000.000.",
            "It was built in 1998.",
            "Scores: 10-20, 5-3, and -5 degrees.",
            "Version 2.0.1 fixed bug #42 (see p.7).",
            "He ran 42,195 km in 2:03:59.",
        ],
    )
    cases["html_entities"] = (
        [
            "&quot;Hello&quot; &amp; goodbye &lt;b&gt;bold&lt;/b&gt;",
            "AT&amp;T and AT&T &amp;amp; more",
            "&QUOT;Shouting&QUOT; &Amp; entities",
            "<skipped> the rest was skipped",
            "a &lt;-&gt; b &quot;c&quot;",
        ],
        [
            "\"Hello\" & goodbye <b>bold</b>",
            "AT&T and AT&T &amp; more",
            "\"Shouting\" & entities",
            "the rest was skipped",
            "a <-> b \"c\"",
        ],
    )
    cases["mixed_case"] = (
        [
            "The CAT sat On the Mat.",
            "NASA Launched A New Rocket Today.",
            "ΣΊΣΥΦΟΣ rolls the stone in İSTANBUL.",
            "die STRASSE ist LANG.",
            "iPhone and eBay are BRANDS.",
        ],
        [
            "The cat sat on the mat.",
            "NASA launched a new rocket today.",
            "Σίσυφος rolls the stone in İstanbul.",
            "Die Straße ist lang.",
            "iPhone and eBay are brands.",
        ],
    )
    cases["whitespace"] = (
        [
            "  leading and trailing spaces   ",
            "tabs\there\tand  double  spaces",
            "no\u00a0break\u00a0spaces and\u3000ideographic",
            "file\x1cseparator and\u2028line separator",
            "trailing tab\t",
        ],
        [
            "leading and trailing spaces",
            "tabs here and double spaces",
            "no break spaces and ideographic",
            "file separator and line separator",
            "trailing tab",
        ],
    )
    return cases


def write_lines(path, lines):
    for line in lines:
        assert "\n" not in line and "\r" not in line, line
    path.write_text("".join(l + "\n" for l in lines), encoding="utf-8", newline="\n")


def read_lines(path):
    """As sacreBLEU's command line reads a file: split on "\\n" only, then rstrip()."""
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip() for line in f]


def g(x):
    """A float as Python computed it (JSON keeps all its digits)."""
    return float(x)


def bleu_row(case, hyps, refs, tok, lc, smooth, signatures):
    """[case, tokenize, lowercase, smooth, score, precisions, bp, ratio, sys_len, ref_len,
    counts, totals, line]; the signature goes to `signatures` under the configuration. `line`
    (sacreBLEU's `str(score)`) is kept for the configurations the command prints (13a mixed exp,
    the lowercased-token 13a lc none) and the others that differ in formatting, else null."""
    metric = BLEU(tokenize=tok, lowercase=lc, smooth_method=smooth)
    s = metric.corpus_score(hyps, [refs])
    key = f"bleu {tok} {'lc' if lc else 'mixed'} {smooth}"
    signatures[key] = str(metric.get_signature())
    return [case, tok, lc, smooth, g(s.score), [g(p) for p in s.precisions], g(s.bp), g(s.ratio),
            s.sys_len, s.ref_len,
            [int(c) for c in s.counts], [int(t) for t in s.totals],
            str(s) if (tok, lc, smooth) in LINE_CONFIGS else None]


def chrf_row(case, hyps, refs, word_order, lc, eps, signatures):
    """[case, word_order, lowercase, eps_smoothing, score, stats, line] where stats are the
    summed [hyp, ref, match] counts per order that the score is computed from."""
    metric = CHRF(word_order=word_order, lowercase=lc, eps_smoothing=eps)
    s = metric.corpus_score(hyps, [refs])
    seg = metric._extract_corpus_statistics(hyps, [refs])
    total = [int(sum(col)) for col in zip(*seg)]
    key = f"chrf nw{word_order} {'lc' if lc else 'mixed'} {'eps' if eps else 'eff'}"
    signatures[key] = str(metric.get_signature())
    stats = [total[i:i + 3] for i in range(0, len(total), 3)]
    return [case, word_order, lc, eps, g(s.score), stats, str(s)]


def torchtext_bleu(candidates, references, max_n=4):
    """torchtext's `bleu_score` (torchtext.data.metrics, one reference per candidate, uniform
    weights), written out in float64 Python: clipped n-gram counts summed over the corpus, 0 if
    any order has no match, else exp(mean log precision) * exp(min(1 - r/c, 0)); a fraction."""
    from collections import Counter
    from math import exp, log
    clipped, total = [0] * max_n, [0] * max_n
    cand_len = ref_len = 0
    for cand, ref in zip(candidates, references):
        cand_len += len(cand)
        ref_len += len(ref)
        grams = lambda ws: Counter(tuple(ws[i:i + n]) for n in range(1, max_n + 1)
                                   for i in range(len(ws) - n + 1))
        for gram, count in (grams(cand) & grams(ref)).items():
            clipped[len(gram) - 1] += count
        for i in range(max_n):
            total[i] += max(len(cand) - i, 0)
    if min(clipped) == 0:
        return 0.0
    score = exp(sum(0.25 * log(c / t) for c, t in zip(clipped, total)))
    return exp(min(1 - ref_len / cand_len, 0)) * score


def check_lowercased_token_bleu(case, hyps, refs):
    """The "lowercased-token BLEU" convention (torchtext's bleu_score over lowercased 13a
    tokens) is sacreBLEU's BLEU with lowercase, 13a and smooth `none`, times 1/100."""
    tok = Tokenizer13a()
    words = lambda lines: [tok(l.lower().rstrip()).split() for l in lines]
    tt = 100 * torchtext_bleu(words(hyps), words(refs))
    sb = BLEU(tokenize="13a", lowercase=True, smooth_method="none").corpus_score(hyps, [refs])
    assert abs(tt - sb.score) < 1e-9, (case, tt, sb.score)
    return abs(tt - sb.score)


def dump_rows(f, name, rows, last=False):
    f.write(f' "{name}": [\n')
    for i, r in enumerate(rows):
        sep = "," if i + 1 < len(rows) else ""
        f.write("  " + json.dumps(r, ensure_ascii=False, separators=(",", ":")) + sep + "\n")
    f.write(" ]" + ("" if last else ",") + "\n")


TRICKY = [
    "Hello, world!",
    "It's 3.14, not 3,14.",
    "$1,234.56 and 1.000.000 or 1,5",
    "In 1999. And in 2000.",
    "e.g. U.S.A. i.e. etc.",
    "well-known 10-20 3- -5 --- a-b",
    "&quot;quoted&quot; &amp;amp; &lt;tag&gt; AT&T &QUOT;",
    "<skipped> text <skipped>",
    "hyphen-\nated line\nbreak",
    "„Anführungszeichen“ — Gedankenstrich … Ellipse",
    "« Bonjour » dit-il ; « ça va ? »",
    "¿Qué? ¡Hola!",
    "Price: €5, £3, ¥100, ©2020, ±1°C, 5×3=15",
    "emoji 😀👍 and ★ stars",
    "日本語。中文，標點！",
    "한국어 문장입니다. “인용” 그리고 ‘작은 인용’",
    "tabs\tand  multiple   spaces\u00a0nbsp\u3000ideo",
    "\x1cfile\x1dsep\x1e\x1f \x85nel \u2028ls \u2029ps",
    "trailing... dots... ... a..b ,,, .,.",
    "x.y,z 1.a a.1 1,a a,1 .5 5. ,5 5,",
    "(parens) [brackets] {braces} <angle> `tick` ~tilde ^caret |pipe| \\backslash",
    "don't won’t 'single' \"double\"",
    "mixed CASE Straße İstanbul ΣΊΣΥΦΟΣ",
    "",
    "   ",
    "@user #tag 50% a/b a:b a;b a?b a!b a=b a+b a*b",
    "cafe\u0301 naïve",
    "٣٫٥ and ١٢٣.",
    "²³ ½. Ⅻ, ⅓",
    "http://example.com/path?q=1&x=2",
    "_under_score_ a_b",
    "end with space ",
    "Mr. Smith paid $5.",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    args = ap.parse_args()

    OUT.mkdir(parents=True, exist_ok=True)
    cases = make_cases(args.data)
    bleu, chrf, signatures = [], [], {}
    tt_diff = 0.0
    for case, (hyps, refs) in cases.items():
        assert len(hyps) == len(refs), case
        write_lines(OUT / f"{case}.hyp", hyps)
        write_lines(OUT / f"{case}.ref", refs)
        hyps, refs = read_lines(OUT / f"{case}.hyp"), read_lines(OUT / f"{case}.ref")
        for tok in TOKENIZERS:
            for lc in (False, True):
                for smooth in SMOOTHINGS:
                    bleu.append(bleu_row(case, hyps, refs, tok, lc, smooth, signatures))
        for smooth in ("floor", "add-k"):
            bleu.append(bleu_row(case, hyps, refs, "13a", False, smooth, signatures))
        tt_diff = max(tt_diff, check_lowercased_token_bleu(case, hyps, refs))
        for word_order, lc, eps in ((0, False, False), (0, True, False), (2, False, False),
                                    (0, False, True)):
            chrf.append(chrf_row(case, hyps, refs, word_order, lc, eps, signatures))

    with open(OUT / "expected.json", "w", encoding="utf-8", newline="\n") as f:
        f.write("{\n")
        f.write(f' "sacrebleu_version": "{sacrebleu.__version__}",\n')
        f.write(' "signatures": ' + json.dumps(signatures, indent=2).replace("\n}", "\n }") + ",\n")
        dump_rows(f, "bleu", bleu)
        dump_rows(f, "chrf", chrf, last=True)
        f.write("}\n")

    t13a, tintl, tchar = Tokenizer13a(), TokenizerV14International(), TokenizerChar()
    tok = {
        "sacrebleu_version": sacrebleu.__version__,
        "python_isspace": [c for c in range(sys.maxunicode + 1) if chr(c).isspace()],
        "strings": [
            {"text": s, "13a": t13a(s), "intl": tintl(s), "char": tchar(s), "lower": s.lower()}
            for s in TRICKY
        ],
    }
    with open(OUT / "tokenize.json", "w", encoding="utf-8", newline="\n") as f:
        f.write("{\n")
        f.write(f' "sacrebleu_version": "{tok["sacrebleu_version"]}",\n')
        f.write(f' "python_isspace": {json.dumps(tok["python_isspace"])},\n')
        dump_rows(f, "strings", tok["strings"], last=True)
        f.write("}\n")
    size = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"sacrebleu {sacrebleu.__version__}: {len(cases)} cases, {len(bleu)} BLEU and "
          f"{len(chrf)} chrF scores, "
          f"{len(TRICKY)} tokenizer strings, {size} bytes in {OUT.relative_to(ROOT)}; "
          f"torchtext-formula BLEU vs sacreBLEU 13a lc none: max diff {tt_diff:.1e}")


if __name__ == "__main__":
    main()
