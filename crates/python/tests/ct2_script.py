"""A translation script written for CTranslate2 (its documented usage: tokenized input,
`Translator.translate_batch`, `TranslationResult`), kept as it is: the tests run it with
only its import line changed. Arguments: model directory, a file of tokenized sentences
(pieces separated by spaces); prints each translation's pieces and score.
"""

import sys

import ctranslate2

model_dir, src_file = sys.argv[1], sys.argv[2]

translator = ctranslate2.Translator(model_dir, device="cpu", compute_type="default",
                                   inter_threads=1, intra_threads=1)

with open(src_file, encoding="utf-8") as f:
    batch = [line.split() for line in f]

results = translator.translate_batch(batch, beam_size=4, max_batch_size=16,
                                     return_scores=True, num_hypotheses=2)
for result in results:
    best = result.hypotheses[0]
    assert len(result.hypotheses) == 2 and result.scores[0] >= result.scores[1]
    assert result[0]["tokens"] == best
    print(" ".join(best) + "\t" + str(result.scores[0]))

# The streaming interface, in batches of 8.
for result, again in zip(translator.translate_iterable(batch, max_batch_size=8, beam_size=4),
                         results):
    assert result.hypotheses[0] == again.hypotheses[0]
