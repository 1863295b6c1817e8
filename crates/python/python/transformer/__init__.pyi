"""Type stubs of the ``transformer`` package (the engine's Python bindings)."""

import os
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Union,
    overload,
)

__version__: str
SACREBLEU_VERSION: str
"""The sacreBLEU version whose scores corpus_bleu and corpus_chrf reproduce exactly."""

_Path = Union[str, "os.PathLike[str]"]

class TranslationResult:
    """The translation of one source, as CTranslate2's ``TranslationResult``."""

    hypotheses: List[List[str]]
    """Hypotheses, best first, each a list of subword pieces (without ``<eos>`` unless
    ``return_end_token``)."""
    scores: List[float]
    """With ``return_scores``: each hypothesis's log-probability (its tokens and ``<eos>``)
    divided by length ** length_penalty (length counting ``<eos>``), as beam search ranks
    them; else empty."""
    attention: List[List[List[float]]]
    """With ``return_attention``: per hypothesis, one row per output token of the last
    decoder layer's encoder-decoder attention averaged over heads, over the source pieces
    and the source's ``<eos>``; else empty."""
    logits: List[List[float]]
    """Always empty (``return_logits_vocab`` is not supported)."""
    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, key: int) -> Dict[str, Any]:
        """Hypothesis ``key`` as a dict: ``tokens``, and ``score`` / ``attention`` when
        returned (CTranslate2 1.x's result format)."""
    @overload
    def __getitem__(self, key: str) -> Any:
        """A field: ``hypotheses``, ``scores``, ``attention``, or ``tokens`` / ``score``
        (of the best hypothesis)."""

class Tokenizer:
    """A run's subword tokenizer (``tokenizer.json``), for both languages."""

    def __init__(self, path: _Path) -> None:
        """Loads a run directory's ``tokenizer.json``, or a ``tokenizer.json`` file.

        Raises FileNotFoundError when there is none, ValueError when it is not usable."""
    @property
    def path(self) -> str: ...
    @property
    def vocab_size(self) -> int:
        """Ids in the vocabulary, the specials <pad> <bos> <eos> <unk> (0-3) included."""
    def __len__(self) -> int: ...
    def encode(self, text: str) -> List[str]:
        """The subword pieces of ``text`` (what ``Translator.translate_batch`` takes)."""
    def encode_ids(self, text: str) -> List[int]:
        """The ids of ``text``, without <bos> or <eos>."""
    def encode_batch(self, texts: Sequence[str]) -> List[List[str]]:
        """``encode`` of every text."""
    def decode(self, tokens: Union[Sequence[int], Sequence[str]]) -> str:
        """The text of ids or pieces; special tokens are left out. ValueError for an id
        outside the vocabulary; an unknown piece decodes as <unk>."""
    def token_to_id(self, token: str) -> Optional[int]:
        """The id of a piece, or None."""
    def id_to_token(self, id: int) -> str:
        """The piece of an id (ValueError outside the vocabulary)."""

class Translator:
    """A trained translation run loaded for translation, with the interface of
    ``ctranslate2.Translator``: a script written for CTranslate2 runs by changing its
    import, within the arguments this engine supports (docs/PYTHON.md)."""

    def __init__(
        self,
        model_path: _Path,
        device: str = "cpu",
        *,
        device_index: Union[int, List[int]] = 0,
        compute_type: str = "default",
        inter_threads: int = 1,
        intra_threads: int = 0,
        max_queued_batches: int = 0,
        flash_attention: bool = False,
        tensor_parallel: bool = False,
        files: Any = None,
    ) -> None:
        """Loads the run directory ``model_path`` (its best weights; an int8 run of
        ``transformer mt quantize`` decodes in int8).

        device: "cpu" (or "auto"); "cuda" raises ValueError.
        compute_type: "default" (the run's own arithmetic), "float32", or "int8" /
            "int8_float32" (int8 products for the decoder layers and the output layer, as
            ``--quantize int8``); anything else raises ValueError.
        inter_threads: accepted (at least 1) for compatibility: translate_batch releases
            the GIL, so run Python threads to translate several batches at once.
        intra_threads: threads of the engine's CPU pool (0: one per core). The pool is one
            per process: the first Translator's value holds for the process, and the
            environment (CANDLE_NUM_THREADS, RAYON_NUM_THREADS) takes precedence.
        max_queued_batches: accepted and ignored (nothing is queued).
        flash_attention, tensor_parallel, files: GPU and in-memory options of CTranslate2;
            only their defaults are accepted.

        Raises FileNotFoundError for a missing directory, ValueError for a directory that
        is not a translation run or an unsupported option."""
    @property
    def model_path(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def device_index(self) -> List[int]: ...
    @property
    def compute_type(self) -> str:
        """"float32" or "int8": what decoding runs in."""
    @property
    def num_translators(self) -> int: ...
    @property
    def num_queued_batches(self) -> int: ...
    @property
    def model_is_loaded(self) -> bool: ...
    @property
    def intra_threads(self) -> int: ...
    @property
    def tokenizer(self) -> Tokenizer:
        """The run's tokenizer."""
    @property
    def decoding_defaults(self) -> Dict[str, Any]:
        """The run's decoding settings: beam_size, length_penalty, max_len_a, max_len_b."""
    def translate_batch(
        self,
        source: Sequence[Sequence[str]],
        target_prefix: Optional[Sequence[Optional[Sequence[str]]]] = None,
        *,
        max_batch_size: int = 0,
        batch_type: str = "examples",
        asynchronous: bool = False,
        beam_size: int = 2,
        patience: float = 1,
        num_hypotheses: int = 1,
        length_penalty: float = 1,
        coverage_penalty: float = 0,
        repetition_penalty: float = 1,
        no_repeat_ngram_size: int = 0,
        disable_unk: bool = False,
        suppress_sequences: Optional[List[List[str]]] = None,
        end_token: Optional[Union[str, List[str]]] = None,
        return_end_token: bool = False,
        prefix_bias_beta: float = 0,
        max_input_length: int = 1024,
        max_decoding_length: int = 256,
        min_decoding_length: int = 1,
        use_vmap: bool = False,
        return_scores: bool = False,
        return_logits_vocab: bool = False,
        return_attention: bool = False,
        return_alternatives: bool = False,
        min_alternative_expansion_prob: float = 0,
        sampling_topk: int = 1,
        sampling_topp: float = 1,
        sampling_temperature: float = 1,
        replace_unknowns: bool = False,
        callback: Optional[Callable[[Any], bool]] = None,
    ) -> List[TranslationResult]:
        """Translates token lists (subword pieces as ``tokenizer.encode`` gives them;
        unknown pieces are <unk>), as CTranslate2's method of this name, with the GIL
        released.

        beam_size: 1 is greedy search. num_hypotheses: at most beam_size.
        length_penalty: beam scores are divided by length ** length_penalty.
        max_decoding_length: the longest output; the run's own rule (max_len_a * (source + 1) +
            max_len_b, 1.2 and 10 by default) also applies, the smaller limit wins.
        max_input_length: sources are cut to this many pieces (0: no limit; the model
            takes at most 1,023).
        max_batch_size: sentences per batch (0: 128 decoder rows, sentences x beam).
        return_scores, return_attention, return_end_token: as in CTranslate2.
        target_prefix: only None (or empty prefixes).

        The other arguments accept only their defaults (min_decoding_length also 0), and a
        non-default value raises ValueError naming it; replace_unknowns is accepted and
        ignored. TypeError when source is not a list of token lists."""
    def translate_iterable(
        self,
        source: Iterable[List[str]],
        target_prefix: Optional[Iterable[Optional[List[str]]]] = None,
        max_batch_size: int = 32,
        batch_type: str = "examples",
        **kwargs: Any,
    ) -> Iterator[TranslationResult]:
        """Translates an iterable in batches of max_batch_size, yielding results in order."""
    @overload
    def translate(
        self,
        texts: str,
        *,
        beam_size: Optional[int] = None,
        length_penalty: Optional[float] = None,
        max_decoding_length: int = 256,
        max_batch_size: int = 0,
    ) -> str: ...
    @overload
    def translate(
        self,
        texts: Sequence[str],
        *,
        beam_size: Optional[int] = None,
        length_penalty: Optional[float] = None,
        max_decoding_length: int = 256,
        max_batch_size: int = 0,
    ) -> List[str]:
        """Translates sentences as ``transformer mt translate`` does: tokenized with the
        run's tokenizer, decoded, detokenized. beam_size and length_penalty default to the
        run's (5 and 1.0 for a default run); an empty sentence translates to ""."""

class BleuScore:
    """A corpus BLEU score with the fields of sacreBLEU's ``BLEUScore``; ``str()`` is
    sacreBLEU's line, ``BLEU = 33.41 64.7/40.2/26.6/17.9 (BP = 1.000 ratio = ...)``."""

    score: float
    counts: List[int]
    totals: List[int]
    precisions: List[float]
    bp: float
    sys_len: int
    ref_len: int
    ratio: float
    name: str
    signature: str
    """sacreBLEU's signature of the options, nrefs:1|case:mixed|eff:no|tok:13a|..."""
    def format(self, width: int = 2, score_only: bool = False, signature: str = "") -> str: ...

class ChrfScore:
    """A corpus chrF score with the fields of sacreBLEU's ``CHRFScore``; ``str()`` is
    ``chrF2 = 55.12``."""

    score: float
    char_order: int
    word_order: int
    beta: int
    name: str
    signature: str
    def format(self, width: int = 2, score_only: bool = False, signature: str = "") -> str: ...

def corpus_bleu(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    smooth_method: str = "exp",
    smooth_value: Optional[float] = None,
    force: bool = False,
    lowercase: bool = False,
    tokenize: str = "13a",
    use_effective_order: bool = False,
) -> BleuScore:
    """sacreBLEU's ``corpus_bleu(hyps, [refs], ...)``, with the same result to the last
    digits (sacreBLEU 2.6.0). One reference stream; tokenize: 13a, intl, char or none;
    smooth_method: exp, none, floor or add-k. ValueError for other values or for streams of
    different lengths, TypeError for a bare list of references (give [refs])."""

def corpus_chrf(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    char_order: int = 6,
    word_order: int = 0,
    beta: int = 2,
    remove_whitespace: bool = True,
    *,
    lowercase: bool = False,
    eps_smoothing: bool = False,
) -> ChrfScore:
    """sacreBLEU's ``corpus_chrf(hyps, [refs], ...)`` (word_order=2 is chrF++)."""

def train(
    config: Union[Mapping[str, Any], _Path, None] = None,
    *,
    out: Optional[_Path] = None,
    task: str = "mt",
    resume: bool = False,
    max_steps: Optional[int] = None,
    device: str = "cpu",
    progress: Union[bool, Callable[[str], Any], None] = None,
) -> str:
    """Trains as ``transformer mt train`` (task="mt") or ``transformer lm train``
    (task="lm") and returns the run directory, with the GIL released.

    config: a dict of the configuration keys (those of ``--config``: corpus, data,
        d_model, layers as encoder_layers / decoder_layers, epochs, max_batches, ...; an
        ``out`` key is the run directory), or the path of a TOML file of them.
    out: the run directory (default: the dict's ``out``, else runs/mt or runs/lm).
    resume: continue the run in ``out`` from its checkpoint (the settings given are checked
        against the run's as ``--resume`` does).
    max_steps: stop after this many steps (resume later).
    progress: True (default) prints each log line; False is quiet; a callable gets each line.

    Ctrl-C saves a checkpoint and raises KeyboardInterrupt (resume=True continues).
    ValueError for an unknown key or a bad value (the command line's message),
    FileNotFoundError for missing data."""
