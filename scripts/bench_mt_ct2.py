#!/usr/bin/env python3
"""CTranslate2 side of the translation benchmark: translates source token ids with a model
converted by `scripts/mt_to_ctranslate2.py` and times it as `transformer bench mt-decode`
times ours.

CTranslate2 runs on the CPU in float32 (`compute_type="float32"`; `--compute-type int8` for its int8), one translation at a
time (`inter_threads=1`) on `--threads` cores, with its own beam search and key/value
caches. Its options are set to ours: beam size, length penalty (score / length^lp, the
length counting `<eos>`, as ours), no minimum length (ours may end at the first step), no
input truncation. Its search differs from ours in two details that can change a few
outputs: it stops a sentence once `beam` hypotheses are finished (ours goes on while a live
hypothesis can still beat the worst finished one, and carries the greedy path along), and it
has one absolute length limit per call (`max_decoding_length`) where ours allows
`floor(max_len_a * source_length + max_len_b)` tokens per sentence. So sentences are sorted
by length, cut into batches of `--batch`, and each batch is one `translate_batch` call whose
limit is the largest of its sentences' limits: in beam search a sentence only feels the
difference if it runs into its limit. Greedy decoding (`--beam 1`) has neither difference:
there a per-token callback ends each sentence at its own limit.

Example:

  transformer bench mt-decode --run runs/de-en --src test.de.gz --beam 5 --dump runs/bench
  scripts/mt_to_ctranslate2.py --run runs/de-en --out runs/de-en-ct2
  scripts/bench_mt_ct2.py --model runs/de-en-ct2 --run runs/de-en \\
      --src-ids runs/bench/src.ids --ref-ids runs/bench/hyp.ids --beam 5 --batch 64 \\
      --threads 2 --greedy-latency 50 --json
"""

import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mt_run  # noqa: E402

import ctranslate2  # noqa: E402


def decode_options(args):
    """Length penalty and length limit: from the run's config.toml when --run is given,
    else from the flags (whose defaults are the run defaults)."""
    if args.run:
        run = mt_run.load_run(args.run)
        return run.length_penalty, run.max_len_a, run.max_len_b, run.beam
    return args.length_penalty, args.max_len_a, args.max_len_b, 5


def main():
    cores = len(os.sched_getaffinity(0))
    p = mt_run.argument_parser(__doc__)
    p.add_argument("--model", required=True, help="CTranslate2 model directory")
    mt_run.add_id_file_args(p)
    p.add_argument("--run", help="the run directory the model was converted from: its "
                                 "config.toml gives the length penalty, length limit and beam")
    p.add_argument("--beam", type=int, default=None,
                   help="beam size, 1 = greedy (default: the run's, else 5)")
    p.add_argument("--length-penalty", type=float, default=1.0,
                   help="without --run: score / length^lp (1.0)")
    p.add_argument("--max-len-a", type=float, default=1.2,
                   help="without --run: at most floor(a * source length + b) tokens (1.2)")
    p.add_argument("--max-len-b", type=int, default=10, help="without --run: see --max-len-a (10)")
    p.add_argument("--batch", type=int, default=64, help="sentences per batch (64)")
    p.add_argument("--patience", type=float, default=1.0,
                   help="CTranslate2's beam patience: a sentence ends once beam x patience "
                        "hypotheses are finished (1, its default)")
    p.add_argument("--max-sentences", type=int, default=None,
                   help="translate only the first N lines")
    p.add_argument("--threads", type=int, default=cores,
                   help=f"intra_threads (default: {cores})")
    mt_run.add_greedy_latency_arg(p)
    p.add_argument("--no-callback", action="store_true",
                   help="greedy: leave out the per-token callback that ends each sentence at "
                        "its own length limit (the batch's largest limit then applies to all)")
    p.add_argument("--compute-type", default="float32",
                   help="CTranslate2's compute_type: float32 (default) or int8 (weights "
                        "quantized at load, one scale per output row)")
    p.add_argument("--use-vmap", action="store_true",
                   help="restrict the output vocabulary with the model's vmap "
                        "(mt_to_ctranslate2.py --vocab-map)")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    a = p.parse_args()

    lp, max_a, max_b, run_beam = decode_options(a)
    beam = a.beam if a.beam is not None else run_beam

    def limit(src):
        return int(math.floor(max_a * len(src) + max_b))

    sources = mt_run.read_sources(a.src_ids, a.max_sentences)
    tokens_of = [[str(i) for i in s] for s in sources]

    translator = ctranslate2.Translator(a.model, device="cpu", inter_threads=1,
                                        intra_threads=a.threads, compute_type=a.compute_type)

    def translate(idx, beam_size, scores=True):
        """Translates sentences `idx` (one call); returns their output ids. Without `scores`
        the hypotheses are not scored."""
        limits = [limit(sources[i]) for i in idx]
        callback = None
        if beam_size == 1 and len(idx) > 1 and not a.no_callback:
            # Greedy search calls back after every token of every sentence (with the
            # sentence's index in this call), and a True answer ends that sentence there:
            # so greedy decoding keeps each sentence's own length limit exactly.
            def callback(step):
                return step.step + 1 >= limits[step.batch_id]
        res = translator.translate_batch(
            [tokens_of[i] for i in idx],
            max_batch_size=a.batch,
            beam_size=beam_size,
            patience=a.patience,
            num_hypotheses=1,
            length_penalty=lp,
            max_decoding_length=max(limits),
            min_decoding_length=0,
            max_input_length=0,
            return_scores=scores,
            callback=callback,
            use_vmap=a.use_vmap,
        )
        return [[int(t) for t in r.hypotheses[0]] for r in res]

    order, translate_all = mt_run.batched_translator(sources, a.batch, translate)

    t0 = time.perf_counter()
    hyps = translate_all(beam)
    seconds = time.perf_counter() - t0
    rss = mt_run.peak_rss_mb()

    latency = None
    n_lat = min(a.greedy_latency, len(order))
    if n_lat > 0:
        ms = []
        for i in [i for i in range(len(sources)) if sources[i]][:n_lat]:
            t1 = time.perf_counter()
            # The translation alone, as an interactive user wants it (ours scores nothing
            # in this measurement either).
            translate([i], 1, scores=False)
            ms.append((time.perf_counter() - t1) * 1e3)
        latency = statistics.median(ms)

    same, same_greedy = mt_run.agreement(hyps, beam, a.ref_ids, a.ref_greedy_ids, translate_all)
    if a.out_ids:
        mt_run.write_id_lines(a.out_ids, hyps)

    out = {
        "impl": "ctranslate2",
        "ct2_version": ctranslate2.__version__,
        "threads": a.threads,
        "compute_type": a.compute_type,
        "beam": beam,
        "batch": a.batch,
        "length_penalty": lp,
        "patience": a.patience,
        "max_len_a": max_a,
        "max_len_b": max_b,
        "length_limit": ("per sentence (greedy, callback)" if beam == 1 and not a.no_callback else
                         "per call: the largest floor(a * src_len + b) of the batch"),
        **mt_run.decode_figures(hyps, seconds, latency, n_lat, rss, same, same_greedy),
    }
    n = out["sentences"]
    if a.json:
        print(json.dumps(out))
        return
    print(f"CTranslate2 {ctranslate2.__version__} float32, {a.threads} threads: {n} sentences, "
          f"beam {beam}, batch {a.batch}: {seconds:.2f} s ({out['sentences_per_s']:.1f} "
          f"sentences/s, {out['tokens_per_s']:.0f} tokens/s); peak RSS {rss:.0f} MB")
    mt_run.print_agreement(latency, n_lat, same, same_greedy)


if __name__ == "__main__":
    main()
