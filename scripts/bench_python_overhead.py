#!/usr/bin/env python3
"""The Python package's cost per call: greedy translation of one sentence at a time through
`transformer.Translator.translate_batch`, against the command line's own greedy latency
(`transformer bench mt-decode`, which decodes each sentence with the library directly) and,
when the `ctranslate2` package and a converted model are given, against
`ctranslate2.Translator.translate_batch` on the same weights.

All three run on the same sentences (the first --sentences of --src), the same number of
CPU threads (--threads; the command line and this process get CANDLE_NUM_THREADS), in
alternating rounds (--rounds); each round reports the median milliseconds per sentence, and
the result is the median over rounds. The overhead is the package's median less the command
line's. The outputs are checked to be the same ids as the command line's greedy ones. On a
busy machine the medians of whole translations move by more than the overhead; the binding's
own cost is also timed apart, on calls that run no model (an empty source).

Example:

  scripts/mt_to_ctranslate2.py --run runs/de-en --out runs/de-en-ct2      # optional
  scripts/bench_python_overhead.py --run runs/de-en --ct2-model runs/de-en-ct2 \\
      --src ../shared/data/multi30k/task1/raw/test_2016_flickr.de.gz --threads 1
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="a translation run directory")
    p.add_argument("--src", required=True, help="source sentences (.gz read as gzip)")
    p.add_argument("--ct2-model", help="the run converted by scripts/mt_to_ctranslate2.py")
    p.add_argument("--sentences", type=int, default=50, help="sentences per round (50)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (3)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads of each engine (1)")
    p.add_argument("--bin", default=None, help="the transformer command (target/release)")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    a = p.parse_args()

    os.environ["CANDLE_NUM_THREADS"] = str(a.threads)
    os.environ["RAYON_NUM_THREADS"] = str(a.threads)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exe = a.bin or os.path.join(root, "target", "release", "transformer")

    import transformer

    translator = transformer.Translator(a.run, intra_threads=a.threads)
    tmp = tempfile.mkdtemp()

    def cli_round():
        out = subprocess.run(
            [exe, "bench", "mt-decode", "--run", a.run, "--src", a.src, "--beam", "1",
             "--max-sentences", str(a.sentences), "--latency-sentences", str(a.sentences),
             "--dump", tmp, "--json"],
            capture_output=True, text=True, check=True).stdout
        return json.loads(out.strip().splitlines()[-1])["greedy_latency_ms"]

    cli_ms = [cli_round()]
    with open(os.path.join(tmp, "src.ids")) as f:
        src_ids = [[int(t) for t in line.split()] for line in f]
    with open(os.path.join(tmp, "greedy.ids")) as f:
        greedy_ids = [[int(t) for t in line.split()] for line in f]
    eos = 2
    # The command line's encoder input ends with <eos>; the package takes the pieces alone.
    tok = translator.tokenizer
    pieces = [[tok.id_to_token(i) for i in (s[:-1] if s and s[-1] == eos else s)]
              for s in src_ids]
    pieces = [s for s in pieces if s][: a.sentences]

    def ours_round():
        ms, outs = [], []
        for s in pieces:
            t0 = time.perf_counter()
            r = translator.translate_batch([s], beam_size=1)
            ms.append((time.perf_counter() - t0) * 1e3)
            outs.append([tok.token_to_id(t) for t in r[0].hypotheses[0]])
        return statistics.median(ms), outs

    ct2 = None
    if a.ct2_model:
        import ctranslate2

        ct2 = ctranslate2.Translator(a.ct2_model, device="cpu", inter_threads=1,
                                     intra_threads=a.threads, compute_type="float32")
        config = translator.decoding_defaults

        def ct2_round():
            ms, outs = [], []
            for s in src_ids[: len(pieces)]:
                # The length rule counts the source's <eos> (as the engine's batches hold it).
                limit = int(math.floor(config["max_len_a"] * len(s) + config["max_len_b"]))
                t0 = time.perf_counter()
                r = ct2.translate_batch([[str(i) for i in s]], beam_size=1, num_hypotheses=1,
                                        max_decoding_length=limit, min_decoding_length=0,
                                        max_input_length=0, return_scores=False)
                ms.append((time.perf_counter() - t0) * 1e3)
                outs.append([int(t) for t in r[0].hypotheses[0]])
            return statistics.median(ms), outs

    ours_ms, ct2_ms = [], []
    ours_round()  # warm-up
    if ct2:
        ct2_round()
    for r in range(a.rounds):
        if r > 0:
            cli_ms.append(cli_round())
        m, outs = ours_round()
        ours_ms.append(m)
        same = sum(o == g for o, g in zip(outs, greedy_ids)) / len(outs)
        if ct2:
            m2, outs2 = ct2_round()
            ct2_ms.append(m2)
            same_ct2 = sum(o == g for o, g in zip(outs2, greedy_ids)) / len(outs2)

    # The binding's own cost per call: a call whose source is empty runs no model (it
    # translates to an empty hypothesis), so its time is argument checking, the release and
    # return of the GIL, and building the result.
    floor = []
    for _ in range(2000):
        t0 = time.perf_counter()
        translator.translate_batch([[]], beam_size=1)
        floor.append((time.perf_counter() - t0) * 1e6)

    result = {
        "binding_floor_us": statistics.median(floor),
        "load_average": os.getloadavg()[0],
        "sentences": len(pieces),
        "rounds": a.rounds,
        "threads": a.threads,
        "cli_greedy_ms": statistics.median(cli_ms),
        "python_translate_batch_ms": statistics.median(ours_ms),
        "overhead_ms": statistics.median(ours_ms) - statistics.median(cli_ms),
        "python_same_as_cli": same,
        "cli_rounds_ms": cli_ms,
        "python_rounds_ms": ours_ms,
    }
    if ct2:
        import ctranslate2

        result.update({
            "ct2_version": ctranslate2.__version__,
            "ct2_translate_batch_ms": statistics.median(ct2_ms),
            "ct2_rounds_ms": ct2_ms,
            "ct2_same_as_cli": same_ct2,
        })
    if a.json:
        print(json.dumps(result))
        return
    for k, v in result.items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    sys.exit(main())
