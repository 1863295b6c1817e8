"""translate_batch's target_prefix and replace_unknowns on imported CTranslate2 models give
CTranslate2's own tokens and scores (crates/runtime/tests/fixtures/ctranslate2/
expected_prefix_unk.json, made by scripts/make_ct2_prefix_fixtures.py with ctranslate2)."""

import json

import pytest

import transformer
from conftest import ROOT, run_cli

FIXTURES = ROOT / "crates" / "runtime" / "tests" / "fixtures"
EXPECTED = json.loads((FIXTURES / "ctranslate2" / "expected_prefix_unk.json").read_text("utf-8"))

# The runs whose options this Translator takes (CTranslate2's defaults otherwise).
ARGS = ("beam_size", "length_penalty", "max_decoding_length", "min_decoding_length",
        "num_hypotheses", "replace_unknowns")


def imported(cli, tmp_path_factory, model, *langs):
    out = tmp_path_factory.mktemp("imported") / "run"
    run_cli(cli, "import", model, *langs, "--out", out)
    return transformer.Translator(str(out), compute_type="float32", intra_threads=1)


@pytest.fixture(scope="module")
def aren(cli, tmp_path_factory):
    model = FIXTURES / "ctranslate2" / "v2" / "aren-transliteration"
    return imported(cli, tmp_path_factory, model, "--src-lang", "ar", "--tgt-lang", "en")


@pytest.fixture(scope="module")
def argos(cli, tmp_path_factory):
    return imported(cli, tmp_path_factory, FIXTURES / "marian" / "de_en.argosmodel")


def check(translator, group):
    checked = 0
    for run in group["runs"]:
        options = {k: v for k, v in run["options"].items() if k in ARGS}
        results = translator.translate_batch(group["inputs"], target_prefix=run["target_prefix"],
                                             return_scores=True, **options)
        for i, (got, want) in enumerate(zip(results, run["results"])):
            assert got.hypotheses == want["hypotheses"], (run["name"], i)
            assert got.scores == pytest.approx(want["scores"], abs=1e-4), (run["name"], i)
            checked += 1
    return checked


def test_target_prefix_as_ctranslate2(aren):
    assert check(aren, EXPECTED["aren"]) == 9 * 24


def test_replace_unknowns_as_ctranslate2(argos):
    assert check(argos, EXPECTED["argos"]) == 4 * 40
    # Without replace_unknowns the same outputs hold <unk>.
    group = EXPECTED["argos"]
    plain = argos.translate_batch(group["inputs"], beam_size=4, length_penalty=0.2,
                                  max_decoding_length=100)
    assert sum("<unk>" in r.hypotheses[0] for r in plain) > 5


def test_target_prefix_is_one_list_per_source(aren):
    src = EXPECTED["aren"]["inputs"][:2]
    with pytest.raises(ValueError, match="one per source"):
        aren.translate_batch(src, target_prefix=[["a"]])
    out = aren.translate_batch(src, target_prefix=[["a", "b"], None], beam_size=1)
    assert out[0].hypotheses[0][:2] == ["a", "b"]
