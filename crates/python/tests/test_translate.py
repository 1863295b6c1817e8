"""Translator: the same translations as `transformer mt translate`, CTranslate2's result
objects and arguments, int8, threads."""

import json
import threading
import time

import pytest

import transformer
from conftest import run_cli


@pytest.fixture(scope="module")
def translator(run_dir):
    return transformer.Translator(str(run_dir), intra_threads=1)


@pytest.fixture(scope="module")
def pieces(translator, sources):
    return [translator.tokenizer.encode(s) for s in sources]


@pytest.mark.parametrize("beam", [1, 5])
def test_translate_batch_equals_the_command_line(
    cli, run_dir, translator, pieces, sources, references, test_de, test_en, beam, tmp_path
):
    expected = run_cli(cli, "mt", "translate", "--run", run_dir, "--src", test_de, "--beam", beam)
    expected = expected.split("\n")[:-1]
    assert len(expected) == len(sources) == 1000
    results = translator.translate_batch(pieces, beam_size=beam)
    assert len(results) == len(sources)
    tok = translator.tokenizer
    got = [tok.decode(r.hypotheses[0]) for r in results]
    assert got == expected
    # The text interface gives the same lines.
    assert translator.translate(sources, beam_size=beam) == expected
    # The tiny model learnt something: its outputs differ between sentences.
    assert len(set(got)) > 30 and "" not in got
    # And the scores: sacreBLEU's BLEU and chrF of the command line on the same files.
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("\n".join(got) + "\n", encoding="utf-8")
    bleu = transformer.corpus_bleu(got, [references])
    chrf = transformer.corpus_chrf(got, [references])
    cmd = json.loads(run_cli(cli, "bleu", "--hyp", hyp, "--ref", test_en, "--json"))
    assert bleu.score == cmd["score"] and chrf.score == cmd["chrf"]
    assert (bleu.counts, bleu.totals, bleu.sys_len) == (cmd["counts"], cmd["totals"], cmd["sys_len"])
    assert bleu.format(signature=bleu.signature) == cmd["line"]
    assert chrf.format(signature=chrf.signature) == cmd["chrf_line"]
    assert 0 < bleu.score < 100


def test_text_translation_of_one_sentence_and_defaults(translator, sources, cli, run_dir):
    line = sources[0]
    one = translator.translate(line)
    assert isinstance(one, str)
    # The run's own beam (2 in the fixture's config) is the default, as for `mt translate`.
    assert translator.decoding_defaults["beam_size"] == 2
    assert one == run_cli(cli, "mt", "translate", "--run", run_dir, stdin=line + "\n").rstrip("\n")
    assert translator.translate(["", line]) == ["", one]


def test_result_objects_follow_ctranslate2(translator, pieces):
    src = pieces[:20]
    results = translator.translate_batch(
        src, beam_size=4, num_hypotheses=3, return_scores=True, return_attention=True
    )
    for r, s in zip(results, src):
        assert len(r) == len(r.hypotheses) == len(r.scores) == len(r.attention) == 3
        assert r.scores == sorted(r.scores, reverse=True)
        assert all(x < 0 for x in r.scores)
        assert r[0]["tokens"] == r.hypotheses[0] == r["tokens"]
        assert r[0]["score"] == r.scores[0]
        assert r[-1]["tokens"] == r.hypotheses[2]
        with pytest.raises(IndexError):
            r[3]
        for hyp, att in zip(r.hypotheses, r.attention):
            assert len(att) == len(hyp)
            for row in att:
                # Over the source's pieces and its <eos>, a distribution.
                assert len(row) == len(s) + 1
                assert abs(sum(row) - 1) < 1e-4
    plain = translator.translate_batch(src, beam_size=4)
    assert [r.hypotheses[0] for r in plain] == [r.hypotheses[0] for r in results]
    assert all(r.scores == [] and r.attention == [] and len(r) == 1 for r in plain)
    # Greedy scores: the log-probability per token (length penalty 1) is at most 0.
    greedy = translator.translate_batch(src, beam_size=1, return_scores=True)
    assert all(len(r.scores) == 1 and r.scores[0] <= 0 for r in greedy)
    # The same, unnormalized (length_penalty=0), is the sum: more negative for longer outputs.
    # (The length counts <eos> when the hypothesis ended with it: return_end_token shows it.)
    raw = translator.translate_batch(
        src, beam_size=1, return_scores=True, length_penalty=0, return_end_token=True
    )
    for g, r in zip(greedy, raw):
        n = len(r.hypotheses[0])
        assert r.scores[0] == pytest.approx(g.scores[0] * n, rel=1e-9)


def test_lengths_batches_and_unknown_pieces(translator, pieces):
    src = pieces[:30]
    short = translator.translate_batch(src, beam_size=2, max_decoding_length=3)
    assert all(len(r.hypotheses[0]) <= 3 for r in short)
    assert any(len(r.hypotheses[0]) == 3 for r in short)
    full = translator.translate_batch(src, beam_size=2)
    small_batches = translator.translate_batch(src, beam_size=2, max_batch_size=4)
    assert [r.hypotheses for r in small_batches] == [r.hypotheses for r in full]
    it = list(translator.translate_iterable(iter(src), max_batch_size=7, beam_size=2))
    assert [r.hypotheses for r in it] == [r.hypotheses for r in full]
    # A piece outside the vocabulary is <unk>, as the tokenizer maps it.
    unk = translator.translate_batch([["▁Ein", "☃☃no-such-piece"]], beam_size=1)
    same = translator.translate_batch([["▁Ein", "<unk>"]], beam_size=1)
    assert unk[0].hypotheses == same[0].hypotheses
    # max_input_length cuts the source.
    cut = translator.translate_batch([src[0]], beam_size=1, max_input_length=2)
    assert cut[0].hypotheses == translator.translate_batch([src[0][:2]], beam_size=1)[0].hypotheses
    # end token on request
    # The end token on request, on the hypotheses that ended with it.
    ended = translator.translate_batch(src, beam_size=2, return_end_token=True)
    finished = 0
    for e, f in zip(ended, full):
        if e.hypotheses[0] != f.hypotheses[0]:
            assert e.hypotheses[0] == f.hypotheses[0] + ["<eos>"]
            finished += 1
    assert finished > 0


def test_int8_equals_the_command_line(cli, run_dir, sources, tmp_path):
    t8 = transformer.Translator(str(run_dir), compute_type="int8")
    assert t8.compute_type == "int8"
    assert transformer.Translator(str(run_dir)).compute_type == "float32"
    src = tmp_path / "src.de"
    src.write_text("\n".join(sources[:200]) + "\n", encoding="utf-8")
    expected = run_cli(
        cli, "mt", "translate", "--run", run_dir, "--src", src, "--beam", 1, "--quantize", "int8"
    ).split("\n")[:-1]
    assert t8.translate(sources[:200], beam_size=1) == expected


def test_two_threads_translate_at_the_same_time(run_dir, pieces):
    """translate_batch releases the GIL: two threads, one translator each (one CPU thread
    each), take clearly less time together than one after the other."""
    import os

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: nothing can run at the same time")
    a = transformer.Translator(str(run_dir), intra_threads=1)
    b = transformer.Translator(str(run_dir), intra_threads=1)
    work = pieces[:400]

    def job(t):
        t.translate_batch(work, beam_size=4)

    job(a)  # warm up
    ratios = []
    for _ in range(5):
        t0 = time.perf_counter()
        job(a)
        job(b)
        serial = time.perf_counter() - t0
        threads = [threading.Thread(target=job, args=(t,)) for t in (a, b)]
        t0 = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        together = time.perf_counter() - t0
        ratios.append(together / serial)
        if ratios[-1] < 0.9:
            break
    if min(ratios) >= 0.9 and os.getloadavg()[0] > len(os.sched_getaffinity(0)):
        # Other processes held the cores (the load average counts them): the two threads
        # could not have had a core each. test_translation_releases_the_gil still checks
        # that they may.
        pytest.skip(f"machine busy (load {os.getloadavg()[0]:.1f}): ratios {ratios}")
    assert min(ratios) < 0.9, f"concurrent / serial time: {ratios}"


def test_translation_releases_the_gil(translator, pieces):
    """While one thread translates, another runs Python code: it could not if the call held
    the GIL (it would count only in the few milliseconds before the call began)."""
    count = [0]
    stop = threading.Event()
    inside = threading.Event()

    def counter():
        while not stop.is_set():
            if inside.is_set():
                count[0] += 1

    th = threading.Thread(target=counter)
    th.start()
    try:
        # The counter's rate while this thread waits without the GIL.
        inside.set()
        time.sleep(0.3)
        inside.clear()
        rate = count[0] / 0.3
        count[0] = 0
        inside.set()
        # Calls for at least a second, however fast the machine: between calls this thread
        # holds the GIL only for a moment.
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 1.0:
            translator.translate_batch(pieces[:200], beam_size=4)
        seconds = time.perf_counter() - t0
        inside.clear()
    finally:
        stop.set()
        th.join()
    assert seconds > 0.5, "enough work that a few milliseconds before the call do not count"
    share = count[0] / (rate * seconds)
    assert share > 0.2, f"the other thread ran at {share:.1%} of its rate during the call"
