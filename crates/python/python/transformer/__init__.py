"""Translate, tokenize, score and train with the transformer engine.

The engine is the Rust library of this repository (candle on the CPU); this package loads
run directories written by ``transformer mt train`` (or by :func:`train`) and uses them as
CTranslate2, Hugging Face ``tokenizers`` and sacreBLEU are used:

    import transformer
    translator = transformer.Translator("runs/de-en")
    translator.translate("Ein Mann fährt Fahrrad.", beam_size=5)      # text in, text out
    pieces = translator.tokenizer.encode("Ein Mann fährt Fahrrad.")   # ['▁Ein', '▁Mann', ...]
    translator.translate_batch([pieces], beam_size=5)[0].hypotheses[0]
    print(transformer.corpus_bleu(hypotheses, [references]))          # BLEU = ...

The manual is docs/PYTHON.md in the repository.
"""

from typing import Iterable, Iterator, List, Optional

from ._native import (
    SACREBLEU_VERSION,
    BleuScore,
    ChrfScore,
    Tokenizer,
    TranslationResult,
    __version__,
    corpus_bleu,
    corpus_chrf,
    train,
)
from ._native import Translator as _NativeTranslator

__all__ = [
    "Translator",
    "TranslationResult",
    "Tokenizer",
    "BleuScore",
    "ChrfScore",
    "corpus_bleu",
    "corpus_chrf",
    "train",
    "SACREBLEU_VERSION",
    "__version__",
]


class Translator(_NativeTranslator):
    """A trained translation run loaded for translation, with the interface of
    ``ctranslate2.Translator`` (see ``__init__.pyi`` for every argument)."""

    def translate_iterable(
        self,
        source: Iterable[List[str]],
        target_prefix: Optional[Iterable[Optional[List[str]]]] = None,
        max_batch_size: int = 32,
        batch_type: str = "examples",
        **kwargs,
    ) -> Iterator[TranslationResult]:
        """Translates an iterable of token lists in batches of ``max_batch_size`` and
        yields one result per source, in order (as CTranslate2's method of this name)."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size}: must be at least 1")
        prefixes = iter(target_prefix) if target_prefix is not None else None
        batch: List[List[str]] = []
        batch_prefix: List[Optional[List[str]]] = []

        def flush():
            results = self.translate_batch(
                batch,
                batch_prefix if prefixes is not None else None,
                max_batch_size=max_batch_size,
                batch_type=batch_type,
                **kwargs,
            )
            batch.clear()
            batch_prefix.clear()
            return results

        for tokens in source:
            batch.append(tokens)
            if prefixes is not None:
                batch_prefix.append(next(prefixes, None))
            if len(batch) == max_batch_size:
                yield from flush()
        if batch:
            yield from flush()
