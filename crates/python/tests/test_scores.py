"""corpus_bleu and corpus_chrf against sacreBLEU's own output: the cases and results that
scripts/make_bleu_fixtures.py wrote with sacreBLEU (crates/text/tests/fixtures/bleu)."""

import json

import pytest

import transformer
from conftest import ROOT

FIXTURES = ROOT / "crates" / "text" / "tests" / "fixtures" / "bleu"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text(encoding="utf-8"))


def lines(name, ext):
    """A case's file read as sacreBLEU's command line (and the fixture script) read it."""
    text = (FIXTURES / f"{name}.{ext}").read_text(encoding="utf-8")
    if text.endswith("\n"):
        text = text[:-1]
    return [line.rstrip() for line in text.split("\n")]


def case(name):
    return lines(name, "hyp"), lines(name, "ref")


def test_the_fixtures_are_sacrebleus():
    assert EXPECTED["sacrebleu_version"] == transformer.SACREBLEU_VERSION
    assert len(EXPECTED["bleu"]) > 50 and len(EXPECTED["chrf"]) > 20


@pytest.mark.parametrize("row", EXPECTED["bleu"], ids=lambda r: f"{r[0]}-{r[1]}-{r[2]}-{r[3]}")
def test_corpus_bleu_equals_sacrebleu(row):
    name, tok, lc, smooth, score, precisions, bp, ratio, sys_len, ref_len, counts, totals, line = row
    hyps, refs = case(name)
    s = transformer.corpus_bleu(hyps, [refs], smooth_method=smooth, lowercase=lc, tokenize=tok)
    assert s.score == pytest.approx(score, abs=1e-9)
    assert s.precisions == pytest.approx(precisions, abs=1e-9)
    assert s.bp == pytest.approx(bp, abs=1e-12)
    assert s.ratio == pytest.approx(ratio, abs=1e-12)
    assert (s.sys_len, s.ref_len, s.counts, s.totals) == (sys_len, ref_len, counts, totals)
    if line is not None:
        assert str(s) == line
    sig = EXPECTED["signatures"][f"bleu {tok} {'lc' if lc else 'mixed'} {smooth}"]
    assert s.signature == sig


@pytest.mark.parametrize("row", EXPECTED["chrf"], ids=lambda r: f"{r[0]}-{r[1]}-{r[2]}-{r[3]}")
def test_corpus_chrf_equals_sacrebleu(row):
    name, word_order, lc, eps, score, stats, line = row
    hyps, refs = case(name)
    s = transformer.corpus_chrf(
        hyps, [refs], word_order=word_order, lowercase=lc, eps_smoothing=eps
    )
    assert s.score == pytest.approx(score, abs=1e-9)
    assert str(s) == line
    assert s.name == line.split(" =")[0]


def test_live_sacrebleu_when_installed():
    sacrebleu = pytest.importorskip("sacrebleu")
    if sacrebleu.__version__ != transformer.SACREBLEU_VERSION:
        pytest.skip(f"sacrebleu {sacrebleu.__version__} installed, not {transformer.SACREBLEU_VERSION}")
    for name in ["en_multi30k", "korean", "mixed_case", "numbers"]:
        hyps, refs = case(name)
        for kwargs in [{}, {"tokenize": "intl", "lowercase": True}, {"smooth_method": "floor"}]:
            ours = transformer.corpus_bleu(hyps, [refs], **kwargs)
            theirs = sacrebleu.corpus_bleu(hyps, [refs], **kwargs)
            assert str(ours) == str(theirs)
            assert ours.score == pytest.approx(theirs.score, abs=1e-9)
            assert (ours.counts, ours.totals) == (list(theirs.counts), list(theirs.totals))
        assert str(transformer.corpus_chrf(hyps, [refs])) == str(sacrebleu.corpus_chrf(hyps, [refs]))


def test_bad_score_arguments():
    with pytest.raises(TypeError, match=r"\[refs\]"):
        transformer.corpus_bleu(["a b c"], ["a b c"])
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        transformer.corpus_bleu(["a", "b"], [["a"]])
    with pytest.raises(ValueError, match="unknown tokenizer"):
        transformer.corpus_bleu(["a"], [["a"]], tokenize="moses")
    with pytest.raises(ValueError, match="unknown smoothing"):
        transformer.corpus_bleu(["a"], [["a"]], smooth_method="best")
    with pytest.raises(ValueError, match="one reference"):
        transformer.corpus_bleu(["a"], [["a"], ["b"]])
    with pytest.raises(TypeError, match="list of str"):
        transformer.corpus_chrf("a b", [["a b"]])
    # Smoothing values are used.
    floor = transformer.corpus_bleu(["a b c d e"], [["a b x y z"]], smooth_method="floor")
    floor2 = transformer.corpus_bleu(
        ["a b c d e"], [["a b x y z"]], smooth_method="floor", smooth_value=0.5
    )
    assert floor2.score > floor.score > 0
