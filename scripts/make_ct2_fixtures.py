#!/usr/bin/env python3
"""Generate CTranslate2 reference fixtures for the Rust CTranslate2 model reader.

What it makes (under crates/runtime/tests/fixtures/ctranslate2/):

* expected_<v1|v2>_<name>.json -- outputs of the ctranslate2 Python package for the five
  upstream test models v1/aren-transliteration, v1/aren-transliteration-i16,
  v2/aren-transliteration, v2/aren-transliteration-i16, v2/aren-transliteration-i8 (copied
  verbatim from OpenNMT/CTranslate2 tests/data/models; this script does not copy them) on
  ~300 inputs (the upstream test inputs + random Arabic "names" of 3-9 characters drawn
  from the source vocabulary, fixed seed), for greedy / beam 2 / beam 5 (3 hypotheses) /
  length penalty 0 and 1.5 / max_decoding_length 5 / min_decoding_length, all with
  return_scores=True, run one example at a time (max_batch_size=1) on CPU.
* synthetic/<features>/ -- tiny TransformerSpec models built with the Python spec API from
  random weights (fixed seeds), covering pre/post norm, ReLU/GELU/GELUTanh/Swish, sinusoidal
  vs learned positions, scaled/unscaled/float-scaled embeddings, shared/separate/tied
  vocabularies and embeddings (aliases), layernorm_embedding, start_from_zero_embedding,
  projection without bias, several layer counts, and float32/float16/bfloat16/int8/int16
  weights. Each directory gets expected.json with greedy and beam-4 outputs and scores for
  compute_type "float32" and the model's own "default".
* upstream_cases.json -- the expectations of CTranslate2's own tests
  (tests/translator_test.cc, python/tests/test_translator.py) for these models, with
  what this ctranslate2 version actually returns for each ("observed").
* manifest.json -- every model directory with binary version, spec name and revision read
  from model.bin, config.json, vocabulary files and covered features.

Run (from the repository root):

    python3 -m venv /work/venvs/ct2
    /work/venvs/ct2/bin/pip install ctranslate2 numpy sentencepiece
    /work/venvs/ct2/bin/python scripts/make_ct2_fixtures.py

Options: --root DIR (fixtures directory), --only-synthetic, --only-aren.
The run is deterministic for a given ctranslate2 version (one thread); it takes ~1 minute.
bfloat16 models are written without torch (float32 -> bfloat16 with round-to-nearest-even).
"""

import argparse
import json
import os
import random
import shutil
import struct
import sys

import numpy as np

import ctranslate2
from ctranslate2.specs import common_spec, model_spec, transformer_spec

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_ROOT = os.path.join(
    HERE, "..", "crates", "runtime", "tests", "fixtures", "ctranslate2"
)

AREN_MODELS = [
    ("v1", "aren-transliteration"),
    ("v1", "aren-transliteration-i16"),
    ("v2", "aren-transliteration"),
    ("v2", "aren-transliteration-i16"),
    ("v2", "aren-transliteration-i8"),
]

ATZMON = ["آ", "ت", "ز", "م", "و", "ن"]
AZA = ["آ", "ز", "ا"]
ATSHYSON = ["آ", "ت", "ش", "ي", "س", "و", "ن"]

SCORE_DIGITS = 6


def rnd(x):
    return round(float(x), SCORE_DIGITS)


def translator_for(path, compute_type="default"):
    return ctranslate2.Translator(
        path, device="cpu", compute_type=compute_type, inter_threads=1, intra_threads=1
    )


def run(translator, inputs, **options):
    results = translator.translate_batch(inputs, max_batch_size=1, **options)
    out = []
    for r in results:
        item = {"hypotheses": r.hypotheses}
        if options.get("return_scores"):
            item["scores"] = [rnd(s) for s in r.scores]
        out.append(item)
    return out


# ---------------------------------------------------------------------------
# model.bin header
# ---------------------------------------------------------------------------


def read_header(path):
    """Return (binary_version, spec_name, spec_revision, num_variables)."""
    with open(path, "rb") as f:
        (version,) = struct.unpack("<I", f.read(4))
        name, revision = "", 1
        if version >= 2:
            (n,) = struct.unpack("<H", f.read(2))
            name = f.read(n)[:-1].decode("utf-8")
            (revision,) = struct.unpack("<I", f.read(4))
        (num_variables,) = struct.unpack("<I", f.read(4))
    return version, name, revision, num_variables


def read_variables(path):
    """Parse a whole model.bin: list of (name, shape, dtype_or_itemsize), aliases."""
    variables, aliases = [], []
    with open(path, "rb") as f:

        def rd(fmt):
            return struct.unpack(fmt, f.read(struct.calcsize(fmt)))

        def rs():
            (n,) = rd("<H")
            return f.read(n)[:-1].decode("utf-8")

        (version,) = rd("<I")
        if version >= 2:
            rs()
            rd("<I")
        (nv,) = rd("<I")
        for _ in range(nv):
            name = rs()
            (rank,) = rd("<B")
            dims = list(rd("<%dI" % rank))
            if version >= 4:
                (t,) = rd("<B")
                (nb,) = rd("<I")
                dt = ["float32", "int8", "int16", "int32", "float16", "bfloat16"][t]
            else:
                (item,) = rd("<B")
                (cnt,) = rd("<I")
                nb = cnt * item
                dt = {4: "float32", 2: "int16", 1: "int8"}[item]
            f.seek(nb, 1)
            variables.append((name, dims, dt))
        if version >= 3:
            (na,) = rd("<I")
            for _ in range(na):
                aliases.append((rs(), rs()))
    return variables, aliases


def load_vocab(model_dir, name):
    j = os.path.join(model_dir, name + ".json")
    if os.path.exists(j):
        with open(j, encoding="utf-8") as f:
            return json.load(f)
    with open(os.path.join(model_dir, name + ".txt"), encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


# ---------------------------------------------------------------------------
# aren-transliteration expectations
# ---------------------------------------------------------------------------


def aren_inputs(root):
    vocab = load_vocab(os.path.join(root, "v2", "aren-transliteration"), "source_vocabulary")
    chars = [t for t in vocab if t not in ("<blank>", "<s>", "</s>", "<unk>")]
    rng = random.Random(1234)
    inputs = [ATZMON, AZA, ATSHYSON, ["ن"] * 5]
    seen = {tuple(x) for x in inputs}
    while len(inputs) < 300:
        n = rng.randint(3, 9)
        word = [rng.choice(chars) for _ in range(n)]
        # Names often start with an alef-like letter: bias a few towards that.
        if rng.random() < 0.3:
            word[0] = rng.choice(["ا", "آ", "أ", "إ"] if "أ" in chars else ["ا", "آ"])
        if tuple(word) not in seen:
            seen.add(tuple(word))
            inputs.append(word)
    return inputs


AREN_RUNS = [
    ("greedy", dict(beam_size=1, return_scores=True)),
    ("beam2", dict(beam_size=2, return_scores=True)),
    ("beam5_nh3", dict(beam_size=5, num_hypotheses=3, return_scores=True)),
    ("beam2_lp0", dict(beam_size=2, length_penalty=0, return_scores=True)),
    ("beam4_lp1.5", dict(beam_size=4, length_penalty=1.5, return_scores=True)),
    ("greedy_lp0", dict(beam_size=1, length_penalty=0, return_scores=True)),
    ("greedy_max5", dict(beam_size=1, max_decoding_length=5, return_scores=True)),
    ("beam2_max5", dict(beam_size=2, max_decoding_length=5, return_scores=True)),
    ("beam2_min8", dict(beam_size=2, min_decoding_length=8, return_scores=True)),
]


def make_aren_expectations(root):
    inputs = aren_inputs(root)
    summary = []
    for version, name in AREN_MODELS:
        model_dir = os.path.join(root, version, name)
        doc = {
            "model": "%s/%s" % (version, name),
            "generator": "scripts/make_ct2_fixtures.py",
            "ctranslate2_version": ctranslate2.__version__,
            "device": "cpu",
            "notes": "translate_batch(..., max_batch_size=1); scores rounded to %d decimals; "
            "hypotheses exclude EOS (return_end_token=False)" % SCORE_DIGITS,
            "inputs": inputs,
            "runs": [],
        }
        compute_types = ["default"]
        if "-i" in name:
            compute_types.append("float32")
        for ct in compute_types:
            translator = translator_for(model_dir, ct)
            for run_name, opts in AREN_RUNS:
                if ct != "default" and run_name not in ("greedy", "beam2", "beam5_nh3"):
                    continue
                results = run(translator, inputs, **opts)
                doc["runs"].append(
                    {
                        "name": run_name,
                        "compute_type": ct,
                        "effective_compute_type": translator.compute_type,
                        "options": opts,
                        "results": results,
                    }
                )
            del translator
        out = os.path.join(root, "expected_%s_%s.json" % (version, name))
        with open(out, "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        greedy = doc["runs"][0]["results"]
        distinct = len({tuple(r["hypotheses"][0]) for r in greedy})
        summary.append((out, os.path.getsize(out), distinct))
        print("%-60s %7d bytes, %d distinct greedy outputs / %d" % (
            os.path.relpath(out, root), os.path.getsize(out), distinct, len(greedy)))
    return summary


# ---------------------------------------------------------------------------
# upstream test cases
# ---------------------------------------------------------------------------

CPP = "tests/translator_test.cc"
PY = "python/tests/test_translator.py"
V2 = "v2/aren-transliteration"


def upstream_cases():
    cases = []

    def add(**kw):
        cases.append(kw)

    for model in ["v1/aren-transliteration", "v1/aren-transliteration-i16", V2,
                  "v2/aren-transliteration-i16", "v2/aren-transliteration-i8"]:
        for ct in ["default", "float32", "int8"]:
            add(source_file=CPP, test="ModelVariantTest.Transliteration", model=model,
                compute_type=ct, inputs=[ATZMON], target_prefix=None, options={},
                expected_hypotheses=[[["a", "t", "z", "m", "o", "n"]]],
                check="first hypothesis equals expected (also with int16/auto compute types)")
    for beam in (1, 4):
        t = "SearchVariantTest/%d." % beam
        add(source_file=CPP, test=t + "SetMaxDecodingLength", model=V2, inputs=[ATZMON],
            options=dict(beam_size=beam, max_decoding_length=3),
            expected_output_length=[3], check="len(hypotheses[0]) == 3")
        add(source_file=CPP, test=t + "SetMinDecodingLength", model=V2, inputs=[ATZMON],
            options=dict(beam_size=beam, min_decoding_length=8),
            expected_output_length=[8], check="len(hypotheses[0]) == 8")
        add(source_file=CPP, test=t + "SetMaxInputLength", model=V2, inputs=[ATZMON],
            options=dict(beam_size=beam, max_input_length=3, return_attention=True),
            expected_output_length=[3],
            check="len(hypotheses[0]) == 3; attention rows have 6 columns, columns >= 3 are 0")
        add(source_file=CPP, test=t + "ReturnAllHypotheses", model=V2, inputs=[ATZMON],
            options=dict(beam_size=beam, num_hypotheses=beam),
            expected_num_hypotheses=[beam], check="number of hypotheses == beam_size")
        add(source_file=CPP, test=t + "ReturnAttention", model=V2, inputs=[AZA, ATZMON],
            options=dict(beam_size=beam, num_hypotheses=beam, return_attention=True),
            expected_output_length=[4, 6],
            check="attention[0] shape (target_len, source_len) == (4,3) and (6,6)")
        add(source_file=CPP, test=t + "ReturnAttentionWithPrefix", model=V2, inputs=[ATZMON],
            target_prefix=[["<unk>", "t"]],
            options=dict(beam_size=beam, num_hypotheses=beam, return_attention=True),
            expected_hypotheses=[[["<unk>", "t", "z", "m", "o", "n"]]],
            check="first hypothesis equals expected")
        add(source_file=CPP, test=t + "ReturnEndToken", model=V2, inputs=[ATZMON],
            options=dict(beam_size=beam, return_end_token=True),
            expected_hypotheses=[[["a", "t", "z", "m", "o", "n", "</s>"]]],
            check="first hypothesis equals expected")
        add(source_file=CPP, test=t + "TranslateWithPrefix", model=V2, inputs=[ATZMON],
            target_prefix=[["a", "t", "s"]],
            options=dict(beam_size=beam, num_hypotheses=beam, return_attention=True),
            expected_hypotheses=[[["a", "t", "s", "u", "m", "o", "n"]]],
            check="first hypothesis equals expected; num_hypotheses == beam; attention 7x6")
        add(source_file=CPP, test=t + "TranslateBatch", model=V2, inputs=[AZA, ATZMON],
            options=dict(beam_size=beam, return_scores=True),
            expected_hypotheses=[[["a", "z", "z", "a"]], [["a", "t", "z", "m", "o", "n"]]],
            check="first hypotheses equal expected; scores present")
        add(source_file=CPP, test=t + "SuppressSequences", model=V2, inputs=[ATZMON],
            options=dict(beam_size=beam, suppress_sequences=[["o"], ["t", "z", "m"]]),
            expected_hypotheses=[[["a", "t", "z", "u", "m", "u", "n"]]],
            check="first hypothesis equals expected")
        add(source_file=CPP, test=t + "EndToken", model=V2, inputs=[ATZMON],
            options=dict(beam_size=beam, end_token="m"),
            expected_hypotheses=[[["a", "t", "z"]]], check="first hypothesis equals expected")
        add(source_file=CPP, test=t + "ReplaceUnknowns", model=V2, inputs=[ATZMON],
            target_prefix=[["<unk>", "t"]],
            options=dict(beam_size=beam, num_hypotheses=beam, replace_unknowns=True),
            expected_hypotheses=[[["ت", "t", "z", "m", "o", "n"]]],
            check="first hypothesis equals expected (<unk> replaced by aligned source token)")
        add(source_file=CPP, test=t + "RepetitionPenalty", model=V2, inputs=[["ن"] * 5],
            options=dict(beam_size=beam, repetition_penalty=100),
            check="all tokens of hypotheses[0] are distinct")
        add(source_file=CPP, test=t + "NoRepeatNgram", model=V2, inputs=[["ن"] * 50],
            options=dict(beam_size=beam, no_repeat_ngram_size=3),
            check="no repeated character 3-gram in the joined output")
        add(source_file=CPP, test=t + "NormalizeScores", model=V2, inputs=[ATZMON],
            options=dict(beam_size=beam, return_scores=True),
            check="score(length_penalty=1) == score(length_penalty=0) / (len(output) + 1)  "
                  "(+1 = EOS), abs tol 1e-6")
        add(source_file=CPP, test=t + "NormalizeScoresNoEos", model=V2, inputs=[ATZMON],
            options=dict(beam_size=beam, max_decoding_length=6, return_scores=True),
            check="score(length_penalty=1) == score(length_penalty=0) / len(output) "
                  "(output cut at max length, no EOS), abs tol 1e-6")
    add(source_file=CPP, test="TranslatorTest.TranslateBatchWithEmptySource", model=V2,
        inputs=[[], AZA, [], ATZMON, []], options={},
        expected_hypotheses=[[[]], [["a", "z", "z", "a"]], [[]], [["a", "t", "z", "m", "o", "n"]], [[]]],
        check="empty source -> one empty hypothesis (score 0 if return_scores)")
    add(source_file=CPP, test="TranslatorTest.TranslateBatchWithHardPrefixAndEmpty", model=V2,
        inputs=[ATZMON, ATZMON, ATZMON, [], AZA],
        target_prefix=[["a", "t", "s"], [], ["a", "t", "z", "o"], [], []], options={},
        expected_hypotheses=[[["a", "t", "s", "u", "m", "o", "n"]], [["a", "t", "z", "m", "o", "n"]],
                             [["a", "t", "z", "o", "m", "o", "n"]], [[]], [["a", "z", "z", "a"]]],
        check="first hypotheses equal expected (one batch call)")
    add(source_file=CPP, test="TranslatorTest.TranslateBatchWithStronglyBiasedPrefix", model=V2,
        inputs=[ATZMON, ATZMON, ATZMON, AZA],
        target_prefix=[["a", "t", "s"], [], ["a", "t", "z", "o"], []],
        options=dict(prefix_bias_beta=0.99, beam_size=2),
        expected_hypotheses=[[["a", "t", "s", "u", "m", "o", "n"]], [["a", "t", "z", "m", "o", "n"]],
                             [["a", "t", "z", "o", "m", "o", "n"]], [["a", "z", "z", "a"]]],
        check="first hypotheses equal expected")
    add(source_file=CPP, test="TranslatorTest.TranslateBatchWithWeaklyBiasedPrefix", model=V2,
        inputs=[ATZMON, ATZMON, ATZMON, AZA],
        target_prefix=[["a", "t", "s", "s", "s"], [], ["a", "t", "z", "o"], []],
        options=dict(prefix_bias_beta=0.01, beam_size=2),
        expected_hypotheses=[[["a", "t", "z", "m", "o", "n"]]] * 3 + [[["a", "z", "z", "a"]]],
        check="first hypotheses equal expected")
    # Python tests (model v2/aren-transliteration, default options unless given).
    add(source_file=PY, test="test_batch_translation", model=V2, inputs=[ATZMON, ATSHYSON],
        options=dict(return_scores=True),
        expected_hypotheses=[[["a", "t", "z", "m", "o", "n"]], [["a", "c", "h", "i", "s", "o", "n"]]],
        check="hypotheses equal expected; scores[0] < 0")
    add(source_file=PY, test="test_iterable_translation (with prefix)", model=V2,
        inputs=[ATZMON, ATSHYSON], target_prefix=[["a", "t", "s"], ["a", "c", "h", "e"]],
        options={},
        expected_hypotheses=[[["a", "t", "s", "u", "m", "o", "n"]], [["a", "c", "h", "e", "s", "o", "n"]]],
        check="hypotheses equal expected")
    add(source_file=PY, test="test_hard_target_prefix", model=V2, inputs=[ATZMON, ATSHYSON],
        target_prefix=[["a", "t", "s"], None], options={},
        expected_hypotheses=[None, [["a", "c", "h", "i", "s", "o", "n"]]],
        check="hypotheses[0][0][:3] == a t s; second equals expected")
    for beam in (1, 2):
        add(source_file=PY, test="test_strongly_biased_target_prefix[%d]" % beam, model=V2,
            inputs=[ATZMON, ATSHYSON], target_prefix=[["a", "t", "s"], None],
            options=dict(beam_size=beam, prefix_bias_beta=0.9999999),
            expected_hypotheses=[None, [["a", "c", "h", "i", "s", "o", "n"]]],
            check="hypotheses[0][0][:3] == a t s; second equals expected")
        add(source_file=PY, test="test_weakly_biased_target_prefix[%d]" % beam, model=V2,
            inputs=[ATZMON, ATSHYSON], target_prefix=[["a", "t", "s"], ["s", "i", "o"]],
            options=dict(beam_size=beam, prefix_bias_beta=0.0000001, return_scores=True),
            check="same hypotheses and scores (abs 1e-5) as without prefix")
    add(source_file=PY, test="test_num_hypotheses", model=V2, inputs=[ATZMON],
        options=dict(beam_size=4, num_hypotheses=2), expected_num_hypotheses=[2],
        check="2 hypotheses")
    add(source_file=PY, test="test_max_decoding_length", model=V2, inputs=[ATZMON],
        options=dict(max_decoding_length=2), expected_hypotheses=[[["a", "t"]]],
        check="hypotheses equal expected")
    add(source_file=PY, test="test_min_decoding_length", model=V2, inputs=[ATZMON],
        options=dict(min_decoding_length=7), check="len(hypotheses[0]) > 6")
    add(source_file=PY, test="test_return_attention", model=V2, inputs=[ATZMON],
        options=dict(return_attention=True), expected_output_length=[6],
        check="attention 6 x 6")
    add(source_file=PY, test="test_ignore_scores", model=V2, inputs=[ATZMON],
        options=dict(beam_size=1, return_scores=False), check="scores empty")
    add(source_file=PY, test="test_token_streaming", model=V2, inputs=[ATZMON],
        options=dict(beam_size=1, return_scores=True),
        expected_hypotheses=[[["a", "t", "z", "m", "o", "n"]]],
        check="generate_tokens yields hypothesis + '</s>' and sum(step log_prob) / 7 == "
              "translate_batch(return_scores=True).scores[0] (abs 1e-5): greedy score is "
              "length-normalized including EOS")
    add(source_file=PY, test="test_score_api", model=V2, kind="score_batch",
        inputs=[ATZMON, ATSHYSON],
        target=[["a", "t", "z", "m", "o", "n"], ["a", "c", "h", "i", "s", "o", "n"]],
        options={},
        expected_log_probs=[
            [-0.106023, -0.065410, -0.056002, -0.447953, -0.230714, -0.092184, -0.063463],
            [-0.072660, -0.300309, -0.181187, -0.395671, -0.025631, -0.123466, -0.002034,
             -0.012639]],
        check="per-token log probs of target + </s> (teacher forcing), rtol 1e-4")
    return cases


def observe_cases(root, cases):
    translators = {}
    for case in cases:
        model_dir = os.path.join(root, case["model"])
        ct = case.get("compute_type", "default")
        key = (model_dir, ct)
        if key not in translators:
            translators[key] = translator_for(model_dir, ct)
        tr = translators[key]
        try:
            if case.get("kind") == "score_batch":
                res = tr.score_batch(case["inputs"], case["target"])
                case["observed"] = {"log_probs": [[rnd(x) for x in r.log_probs] for r in res],
                                    "tokens": [r.tokens for r in res]}
                continue
            opts = dict(case["options"])
            opts.setdefault("return_scores", True)
            prefix = case.get("target_prefix")
            res = tr.translate_batch(case["inputs"], target_prefix=prefix, **opts)
            obs = {"hypotheses": [r.hypotheses for r in res],
                   "scores": [[rnd(s) for s in r.scores] for r in res],
                   "effective_compute_type": tr.compute_type}
            if "length_penalty" not in opts and opts.get("return_scores"):
                res0 = tr.translate_batch(case["inputs"], target_prefix=prefix,
                                          length_penalty=0, **opts)
                obs["scores_length_penalty_0"] = [[rnd(s) for s in r.scores] for r in res0]
            case["observed"] = obs
            exp = case.get("expected_hypotheses")
            if exp is not None:
                ok = all(e is None or (len(r.hypotheses) > 0 and r.hypotheses[0] == e[0])
                         for e, r in zip(exp, res))
                case["observed_matches_expected"] = ok
                if not ok:
                    print("MISMATCH", case["test"], case["model"], ct, obs["hypotheses"])
        except Exception as e:  # noqa: BLE001
            case["observed"] = {"error": "%s: %s" % (type(e).__name__, e)}
            print("ERROR", case["test"], e)
    return cases


# ---------------------------------------------------------------------------
# synthetic models
# ---------------------------------------------------------------------------


def to_bfloat16_bits(a):
    """float32 array -> uint16 bfloat16 bits, round to nearest even (as torch)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


class BFloat16Variable(model_spec.Variable):
    """A bfloat16 variable that does not need torch."""

    def __init__(self, bits, shape):
        self.bits = bits
        self._shape = tuple(shape)

    @property
    def shape(self):
        return self._shape

    @property
    def dtype(self):
        return "bfloat16"

    def numpy(self):
        return (self.bits.astype(np.uint32) << 16).view(np.float32).reshape(self._shape)

    def num_bytes(self):
        return self.bits.nbytes

    def to_bytes(self):
        return self.bits.tobytes()

    def _to(self, dtype):
        return model_spec.NumpyVariable(self.numpy().astype(dtype))

    def _equal(self, other):
        return self._shape == other._shape and np.array_equal(self.bits, other.bits)


SYNTHETIC = [
    # name, config
    dict(name="prenorm-relu-sinpos-scaled-sharedtied-f32", eos_bias=2.0, d=24, ff=48, layers=(1, 1),
         pre_norm=True, act=common_spec.Activation.RELU, learned_pos=False, scale=True,
         vocab="shared_tied", quant=None),
    dict(name="postnorm-gelu-learnedpos-unscaled-separate-f16", eos_bias=4.5, d=32, ff=64, layers=(1, 1),
         pre_norm=False, act=common_spec.Activation.GELU, learned_pos=True, scale=False,
         vocab="separate", quant="float16"),
    dict(name="prenorm-gelutanh-sinpos-scaled-separate-bf16", d=32, ff=64, layers=(1, 1),
         pre_norm=True, act=common_spec.Activation.GELUTanh, learned_pos=False, scale=True,
         vocab="separate", quant="bfloat16"),
    dict(name="postnorm-swish-sinpos-scaled-shared-int8", eos_bias=4.0, d=32, ff=64, layers=(1, 1),
         pre_norm=False, act=common_spec.Activation.SWISH, learned_pos=False, scale=True,
         vocab="shared", quant="int8"),
    dict(name="prenorm-relu-learnedpos-scaled-separate-int16", eos_bias=8.0, d=32, ff=64, layers=(1, 1),
         pre_norm=True, act=common_spec.Activation.RELU, learned_pos=True, scale=True,
         vocab="separate", quant="int16"),
    dict(name="prenorm-gelu-sinpos-zerostart-unscaled-separate-f32", eos_bias=7.0, d=24, ff=48, layers=(1, 1),
         pre_norm=True, act=common_spec.Activation.GELU, learned_pos=False, scale=False,
         vocab="separate", quant=None, zero_start=True),
    dict(name="postnorm-relu-sinpos-lnembed-2enc1dec-separate-f32", eos_bias=9.0, d=24, ff=48, layers=(2, 1),
         pre_norm=False, act=common_spec.Activation.RELU, learned_pos=False, scale=True,
         vocab="separate", quant=None, layernorm_embedding=True),
    dict(name="prenorm-swish-learnedpos-embscale2-nobias-1enc2dec-shared-f32", d=24, ff=48,
         layers=(1, 2), pre_norm=True, act=common_spec.Activation.SWISH, learned_pos=True,
         scale=2.0, vocab="shared", quant=None, no_bias=True),
    dict(name="prenorm-gelutanh-sinpos-scaled-2enc2dec-separate-int8", eos_bias=4.5, d=32, ff=64,
         layers=(2, 2), pre_norm=True, act=common_spec.Activation.GELUTanh, learned_pos=False,
         scale=True, vocab="separate", quant="int8"),
]

SPECIALS = ["<unk>", "<s>", "</s>"]
EOS_BIAS = 6.0  # make some hypotheses end before max_decoding_length


def synthetic_vocab(kind):
    src = SPECIALS + ["s%d" % i for i in range(27)]          # 30 tokens
    tgt = ["<blank>"] + SPECIALS + ["t%d" % i for i in range(24)]  # 28 tokens
    if kind in ("shared", "shared_tied"):
        shared = SPECIALS + ["w%d" % i for i in range(29)]    # 32 tokens
        return shared, shared
    return src, tgt


def build_synthetic(cfg, out_dir, seed):
    rng = np.random.default_rng(seed)
    d, ff = cfg["d"], cfg["ff"]
    spec = transformer_spec.TransformerSpec.from_config(
        cfg["layers"], 2, pre_norm=cfg["pre_norm"], activation=cfg["act"],
        with_relative_position=False,
        layernorm_embedding=cfg.get("layernorm_embedding", False))
    src_vocab, tgt_vocab = synthetic_vocab(cfg["vocab"])
    vs, vt = len(src_vocab), len(tgt_vocab)
    max_pos = 64
    features = {
        "pre_norm": cfg["pre_norm"],
        "activation": common_spec.Activation(cfg["act"]).name,
        "position_encodings": "learned" if cfg["learned_pos"] else "sinusoidal",
        "scale_embeddings": cfg["scale"],
        "vocabulary": cfg["vocab"],
        "quantization": cfg["quant"] or "float32",
        "d_model": d, "ffn_dim": ff, "num_heads": 2,
        "num_layers": list(cfg["layers"]),
        "layernorm_embedding": cfg.get("layernorm_embedding", False),
        "start_from_zero_embedding": cfg.get("zero_start", False),
        "linear_bias": not cfg.get("no_bias", False),
    }

    def lin(out_f, in_f, gain=1.0):
        return (rng.standard_normal((out_f, in_f)) * gain / np.sqrt(in_f)).astype(np.float32)

    def vec(n, s=0.1):
        return (rng.standard_normal(n) * s).astype(np.float32)

    def set_ln(ln):
        ln.gamma = (1.0 + rng.standard_normal(d) * 0.1).astype(np.float32)
        ln.beta = vec(d)

    def set_linear(l, out_f, in_f, gain=1.0, bias=True):
        l.weight = lin(out_f, in_f, gain)
        if bias and not cfg.get("no_bias", False):
            l.bias = vec(out_f)

    def fill_attention(att, self_att):
        set_ln(att.layer_norm)
        if self_att:
            set_linear(att.linear[0], 3 * d, d, 1.5)
            set_linear(att.linear[1], d, d)
        else:
            set_linear(att.linear[0], d, d, 1.5)
            set_linear(att.linear[1], 2 * d, d, 1.5)
            set_linear(att.linear[2], d, d)

    def fill_ffn(f):
        set_ln(f.layer_norm)
        set_linear(f.linear_0, ff, d, 1.5)
        set_linear(f.linear_1, d, ff)

    enc, dec = spec.encoder, spec.decoder
    emb_scale = 1.0 if cfg["scale"] is True else 1.0
    src_emb = (rng.standard_normal((vs, d)) * emb_scale).astype(np.float32)
    if cfg["scale"] is True:
        src_emb /= np.sqrt(d)  # scaled back up by sqrt(d) at runtime
    enc.embeddings[0].weight = src_emb
    if cfg["vocab"] in ("shared", "shared_tied"):
        tgt_emb = src_emb.copy() if cfg["vocab"] == "shared_tied" else (
            rng.standard_normal((vt, d)).astype(np.float32) / (np.sqrt(d) if cfg["scale"] is True else 1.0))
    else:
        tgt_emb = rng.standard_normal((vt, d)).astype(np.float32)
        if cfg["scale"] is True:
            tgt_emb /= np.sqrt(d)
    dec.embeddings.weight = tgt_emb
    for s in (enc, dec):
        if cfg["scale"] is True:
            s.scale_embeddings = True
        elif cfg["scale"] is False:
            s.scale_embeddings = False
        else:
            s.scale_embeddings = np.float32(cfg["scale"])
        if cfg["learned_pos"]:
            s.position_encodings.encodings = (rng.standard_normal((max_pos, d)) * 0.5).astype(np.float32)
        if hasattr(s, "layer_norm"):
            set_ln(s.layer_norm)
        if hasattr(s, "layernorm_embedding"):
            set_ln(s.layernorm_embedding)
    for layer in enc.layer:
        fill_attention(layer.self_attention, True)
        fill_ffn(layer.ffn)
    for layer in dec.layer:
        fill_attention(layer.self_attention, True)
        fill_attention(layer.attention, False)
        fill_ffn(layer.ffn)
    if cfg["vocab"] == "shared_tied":
        dec.projection.weight = tgt_emb.copy()  # tied -> alias in model.bin
        # the tied projection is small: give it a bias so the outputs are not too flat
        bias = vec(vt, 0.5)
        bias[tgt_vocab.index("</s>")] += cfg.get("eos_bias", EOS_BIAS)
        dec.projection.bias = bias
    else:
        dec.projection.weight = lin(vt, d, 4.0)
        if not cfg.get("no_bias", False):
            bias = vec(vt, 0.5)
            bias[tgt_vocab.index("</s>")] += cfg.get("eos_bias", EOS_BIAS)
            dec.projection.bias = bias
    if cfg.get("zero_start"):
        dec.start_from_zero_embedding = True

    spec.register_source_vocabulary(src_vocab)
    spec.register_target_vocabulary(tgt_vocab)
    spec.validate()
    quant = cfg["quant"]
    if quant == "bfloat16":
        def conv(s, name, value):
            if isinstance(value, model_spec.NumpyVariable) and not value.is_scalar() \
                    and value.dtype == "float32":
                attr = name.split("/")[-1]
                setattr(s, attr, BFloat16Variable(to_bfloat16_bits(value.array), value.shape))
        spec._visit(conv)
    spec.optimize(quantization=quant)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    spec.save(out_dir)
    return features, src_vocab


def make_synthetic(root):
    rows = []
    for i, cfg in enumerate(SYNTHETIC):
        out_dir = os.path.join(root, "synthetic", cfg["name"])
        features, src_vocab = build_synthetic(cfg, out_dir, seed=1000 + i)
        rng = random.Random(2000 + i)
        words = [t for t in src_vocab if t not in SPECIALS]
        inputs = [[rng.choice(words) for _ in range(rng.randint(1, 10))] for _ in range(50)]
        doc = {
            "model": "synthetic/" + cfg["name"],
            "generator": "scripts/make_ct2_fixtures.py",
            "ctranslate2_version": ctranslate2.__version__,
            "features": features,
            "notes": "translate_batch(..., max_batch_size=1, max_decoding_length=20); scores "
                     "rounded to %d decimals; default length_penalty=1" % SCORE_DIGITS,
            "inputs": inputs,
            "runs": [],
        }
        for ct in ("float32", "default"):
            tr = translator_for(out_dir, ct)
            for run_name, opts in (
                ("greedy", dict(beam_size=1, return_scores=True, max_decoding_length=20)),
                ("beam4_nh2", dict(beam_size=4, num_hypotheses=2, return_scores=True,
                                   max_decoding_length=20)),
            ):
                doc["runs"].append({"name": run_name, "compute_type": ct,
                                    "effective_compute_type": tr.compute_type,
                                    "options": opts, "results": run(tr, inputs, **opts)})
            del tr
        with open(os.path.join(out_dir, "expected.json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        greedy = doc["runs"][0]["results"]
        outs = [tuple(r["hypotheses"][0]) for r in greedy]
        toks = [t for o in outs for t in o]
        lengths = [len(o) for o in outs]
        agree = sum(a["hypotheses"][0] == b["hypotheses"][0]
                    for a, b in zip(doc["runs"][0]["results"], doc["runs"][2]["results"]))
        print("%-62s bin=%6d distinct_outputs=%2d/50 distinct_tokens=%2d len[min=%d max=%d "
              "at_max=%d] default(%s)==float32 greedy %d/50" % (
                  cfg["name"], os.path.getsize(os.path.join(out_dir, "model.bin")),
                  len(set(outs)), len(set(toks)), min(lengths), max(lengths),
                  sum(l == 20 for l in lengths), doc["runs"][2]["effective_compute_type"], agree))
        rows.append((out_dir, features))
    return rows


# ---------------------------------------------------------------------------
# manifest
# ---------------------------------------------------------------------------

AREN_FEATURES = {
    "architecture": "TransformerBase-style, 1 encoder + 1 decoder layer, d_model 32, ffn 128, "
                    "num_heads from spec name (8, revision < 3), pre_norm (default true), ReLU, "
                    "sinusoidal positions, scaled embeddings (no scale_embeddings attribute), "
                    "separate .txt vocabularies without <unk> (appended: 51 source / 43 target ids)",
}


def make_manifest(root, synthetic_rows):
    models = []
    for version, name in AREN_MODELS:
        d = os.path.join(root, version, name)
        models.append((d, dict(AREN_FEATURES, quantization={"aren-transliteration": "float32",
                               "aren-transliteration-i16": "int16",
                               "aren-transliteration-i8": "int8"}[name],
                               expected="expected_%s_%s.json" % (version, name),
                               origin="OpenNMT/CTranslate2 tests/data/models")))
    for d, features in synthetic_rows:
        models.append((d, dict(features, expected="expected.json", origin="synthetic")))
    entries = []
    for d, features in models:
        bin_path = os.path.join(d, "model.bin")
        version, name, revision, nv = read_header(bin_path)
        variables, aliases = read_variables(bin_path)
        cfg_path = os.path.join(d, "config.json")
        config = None
        if os.path.exists(cfg_path):
            with open(cfg_path, encoding="utf-8") as f:
                config = json.load(f)
        dtypes = sorted({dt for _, _, dt in variables})
        entries.append({
            "path": os.path.relpath(d, root),
            "binary_version": version,
            "spec_name": name,
            "spec_revision": revision,
            "num_variables": nv,
            "num_aliases": len(aliases),
            "aliases": aliases,
            "variable_dtypes": dtypes,
            "files": {f: os.path.getsize(os.path.join(d, f)) for f in sorted(os.listdir(d))},
            "config": config,
            "features": features,
        })
    manifest = {
        "generator": "scripts/make_ct2_fixtures.py",
        "ctranslate2_version": ctranslate2.__version__,
        "numpy_version": np.__version__,
        "supported_cpu_compute_types": sorted(ctranslate2.get_supported_compute_types("cpu")),
        "models": entries,
    }
    with open(os.path.join(root, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, ensure_ascii=False, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", default=DEFAULT_ROOT)
    p.add_argument("--only-synthetic", action="store_true")
    p.add_argument("--only-aren", action="store_true")
    args = p.parse_args()
    root = os.path.abspath(args.root)
    for version, name in AREN_MODELS:
        if not os.path.exists(os.path.join(root, version, name, "model.bin")):
            sys.exit("missing %s/%s: copy tests/data/models from CTranslate2 first" % (version, name))
    print("ctranslate2", ctranslate2.__version__, "cpu compute types",
          sorted(ctranslate2.get_supported_compute_types("cpu")))
    if not args.only_synthetic:
        make_aren_expectations(root)
        cases = observe_cases(root, upstream_cases())
        with open(os.path.join(root, "upstream_cases.json"), "w", encoding="utf-8") as f:
            json.dump({"source_repository": "OpenNMT/CTranslate2",
                       "generator": "scripts/make_ct2_fixtures.py",
                       "observed_with_ctranslate2": ctranslate2.__version__,
                       "notes": "'expected_*' fields and 'check' come from the upstream tests; "
                                "'observed' is what this ctranslate2 version returns on CPU "
                                "(return_scores forced on; scores_length_penalty_0 = same call "
                                "with length_penalty=0). C++ SearchVariantTest runs with "
                                "beam_size 1 and 4; default model is v2/aren-transliteration.",
                       "cases": cases}, f, ensure_ascii=False, indent=1)
    rows = []
    if not args.only_aren:
        rows = make_synthetic(root)
    else:
        syn = os.path.join(root, "synthetic")
        if os.path.isdir(syn):
            for name in sorted(os.listdir(syn)):
                with open(os.path.join(syn, name, "expected.json"), encoding="utf-8") as f:
                    rows.append((os.path.join(syn, name), json.load(f)["features"]))
    make_manifest(root, rows)
    total = 0
    for dirpath, _, files in os.walk(root):
        total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    print("total fixture size: %d bytes" % total)


if __name__ == "__main__":
    main()
