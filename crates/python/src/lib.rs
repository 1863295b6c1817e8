//! The `transformer` Python package's native module (`transformer._native`): trained
//! translation runs used from Python the way CTranslate2's `Translator`, Hugging Face's
//! `tokenizers` and sacreBLEU are, and training started from Python.
//!
//! - [`Translator`]: a run directory loaded once; `translate_batch` takes subword pieces and
//!   returns [`TranslationResult`]s as `ctranslate2.Translator.translate_batch` does,
//!   `translate` takes and returns text;
//! - [`Tokenizer`]: a run's subword tokenizer (pieces, ids, text);
//! - `corpus_bleu` and `corpus_chrf`: sacreBLEU's functions of the same names, computed by
//!   `transformer_text::score` ([`BleuScore`], [`ChrfScore`]);
//! - `train`: `transformer mt train` (or `lm train`) from a dict of its configuration keys
//!   or a TOML file.
//!
//! Translation and training run with the GIL released, so Python threads translate at the
//! same time. Errors are Python exceptions carrying the message the command line prints:
//! `ValueError` for bad arguments and unusable runs or settings, `FileNotFoundError` /
//! `OSError` for files, `RuntimeError` for failures inside the model.
//!
//! The user manual is docs/PYTHON.md; the stubs (`transformer/__init__.pyi`) document every
//! argument.

use pyo3::exceptions::{
    PyFileNotFoundError, PyIndexError, PyKeyError, PyKeyboardInterrupt, PyOSError, PyRuntimeError,
    PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use candle_core::Device;
use transformer_decode::{DecodeOptions, Hypothesis, SearchRules};
use transformer_model::DecodePrecision;
use transformer_runtime::load::{load_run, tokenizer_path, Execution, LoadedMt};
use transformer_runtime::model::MtDecoder;
use transformer_runtime::translate::{
    alignment_rows, hypothesis_text, max_source_tokens, replace_unknowns as replace_unknowns_in,
    translate, DecodeRequest,
};
use transformer_text::score::{self, BleuOptions, ChrfOptions, Smoothing};
use transformer_text::subword::{Subword, TextTokenizer};

// ---------------------------------------------------------------------------------------
// Errors

/// The Python exception for an error of the engine, with its message as the command line
/// prints it.
fn engine_err(e: transformer_runtime::Error) -> PyErr {
    use transformer_runtime::Error as E;
    let msg = e.to_string();
    match &e {
        E::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(msg)
        }
        E::Io { .. } => PyOSError::new_err(msg),
        E::Usage(_) | E::Config { .. } | E::Checkpoint { .. } | E::Model(_) => {
            PyValueError::new_err(msg)
        }
        E::Text(t) => match t {
            transformer_text::Error::MissingDataDir { .. }
            | transformer_text::Error::MissingSplit { .. } => PyFileNotFoundError::new_err(
                format!("{msg} (the data folder is wrong: set `data`)"),
            ),
            _ => PyValueError::new_err(msg),
        },
        _ => PyRuntimeError::new_err(msg),
    }
}

fn value_err(msg: impl Into<String>) -> PyErr {
    PyValueError::new_err(msg.into())
}

/// An integer argument that must be at least `min`, as a `usize` (a negative one is a
/// `ValueError` naming the argument, not an `OverflowError`).
fn at_least(name: &str, v: i64, min: i64, what: &str) -> PyResult<usize> {
    if v < min {
        return Err(value_err(format!(
            "{name}={v}: must be at least {min} ({what})"
        )));
    }
    Ok(v as usize)
}

// ---------------------------------------------------------------------------------------
// Threads and devices

/// The thread count the first `Translator` asked for (`intra_threads`), applied to candle's
/// CPU pool, which is one per process.
static INTRA_THREADS: OnceLock<usize> = OnceLock::new();

/// Sets the CPU pool's size to `n` threads for this process (0: leave it as it is), when it
/// is not set already: by the environment (`CANDLE_NUM_THREADS`, `RAYON_NUM_THREADS`) or by
/// an earlier call. Must run before candle's first CPU operation to take effect.
fn apply_intra_threads(n: usize) {
    if n == 0 {
        return;
    }
    let env_set = ["CANDLE_NUM_THREADS", "RAYON_NUM_THREADS"]
        .iter()
        .any(|k| std::env::var_os(k).is_some());
    INTRA_THREADS.get_or_init(|| {
        if !env_set {
            // Before any thread of ours reads them: set while this process has not yet
            // decoded (the OnceLock makes it the first Translator only).
            std::env::set_var("CANDLE_NUM_THREADS", n.to_string());
            std::env::set_var("RAYON_NUM_THREADS", n.to_string());
        }
        n
    });
}

/// The device a `device` argument names: `cpu` (or `auto`, which is the CPU here).
fn open_device(device: &str, index: usize) -> PyResult<Device> {
    match device {
        "cpu" | "auto" => {
            if index != 0 {
                return Err(value_err(format!(
                    "device_index={index}: the CPU has only device 0"
                )));
            }
            Ok(Device::Cpu)
        }
        "cuda" => Err(value_err(
            "device='cuda': this package decodes on the CPU only (the command line's CUDA \
             build is `cargo build --release --features cuda`); use device='cpu'",
        )),
        other => Err(value_err(format!(
            "device='{other}': unknown device; use 'cpu' (or 'auto')"
        ))),
    }
}

/// `device_index`: an int or a list of ints, as CTranslate2 takes it; only 0 here.
fn device_index(v: &Bound<'_, PyAny>) -> PyResult<usize> {
    if let Ok(i) = v.extract::<i64>() {
        return at_least("device_index", i, 0, "a device number");
    }
    if let Ok(list) = v.extract::<Vec<i64>>() {
        if list.len() == 1 {
            return at_least("device_index", list[0], 0, "a device number");
        }
        return Err(value_err(format!(
            "device_index={list:?}: one device only (one translator per process here)"
        )));
    }
    Err(PyTypeError::new_err(
        "device_index must be an int or a list of ints",
    ))
}

// ---------------------------------------------------------------------------------------
// A loaded run with its decoder

/// A run loaded once and its decoding weights made ready once ([`MtDecoder`]), for every
/// call. The decoder borrows the run: the run is on the heap, never moved or changed while
/// the decoder lives, and freed after it (in `Drop`).
struct Engine {
    decoder: Option<MtDecoder<'static>>,
    run: NonNull<LoadedMt>,
}

// The run and its decoder are read-only after construction; both are Send + Sync (checked
// below), so sharing the engine between threads is sharing those.
unsafe impl Send for Engine {}
unsafe impl Sync for Engine {}

#[allow(dead_code)]
fn assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<LoadedMt>();
    is::<MtDecoder<'static>>();
}

impl Engine {
    fn new(run: LoadedMt) -> transformer_runtime::Result<Self> {
        let run = NonNull::from(Box::leak(Box::new(run)));
        // SAFETY: `run` points to a live heap value freed only in `Drop`, after `decoder`.
        let decoder = unsafe { run.as_ref() }.model.decoder();
        match decoder {
            Ok(d) => Ok(Self {
                decoder: Some(d),
                run,
            }),
            Err(e) => {
                // SAFETY: nothing borrows the run.
                drop(unsafe { Box::from_raw(run.as_ptr()) });
                Err(e.into())
            }
        }
    }

    fn run(&self) -> &LoadedMt {
        // SAFETY: see `Engine`.
        unsafe { self.run.as_ref() }
    }

    fn decoder(&self) -> &MtDecoder<'static> {
        self.decoder.as_ref().expect("set until drop")
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.decoder.take();
        // SAFETY: the decoder that borrowed the run is gone; the pointer came from a Box.
        drop(unsafe { Box::from_raw(self.run.as_ptr()) });
    }
}

/// How `translate_batch` decodes, beyond [`DecodeOptions`].
#[derive(Clone)]
struct Job {
    opts: DecodeOptions,
    /// Decoder rows (sentences x beam) per batch.
    batch_rows: usize,
    /// No output longer than this many tokens (CTranslate2's `max_decoding_length`).
    max_decoding_length: usize,
    /// Hypotheses kept per source.
    num_hypotheses: usize,
    /// Each source's target prefix (CTranslate2's `target_prefix`; empty for none); `None`:
    /// the run's own ([`transformer_runtime::model::MtModel::target_prefix`]).
    target_prefix: Option<Vec<Vec<u32>>>,
}

/// Translates `src` (token ids) and returns each source's n-best list (at most
/// `num_hypotheses`). The output length limit is the run's rule (`max_len_a * source +
/// max_len_b`) capped at `max_decoding_length`: sources the rule would let run longer are
/// decoded in a job of their own with the cap as their fixed limit. An empty source
/// translates to one empty hypothesis (as `mt translate` prints an empty line for it).
fn decode(
    engine: &Engine,
    src: &[Vec<u32>],
    job: &Job,
) -> transformer_runtime::Result<Vec<Vec<Hypothesis>>> {
    let max_src = max_source_tokens(&engine.run().model);
    let mut out: Vec<Vec<Hypothesis>> = vec![Vec::new(); src.len()];
    let (mut ruled, mut capped) = (Vec::new(), Vec::new());
    for (i, s) in src.iter().enumerate() {
        if s.is_empty() {
            out[i] = vec![Hypothesis {
                tokens: Vec::new(),
                score: 0.0,
                finished: true,
                attention: Vec::new(),
            }];
            continue;
        }
        // The rule counts the source's <eos>, which the batch appends.
        let len = max_src.map_or(s.len(), |m| s.len().min(m)) + 1;
        if job.opts.max_len(len) > job.max_decoding_length {
            capped.push(i);
        } else {
            ruled.push(i);
        }
    }
    let capped_opts = DecodeOptions {
        max_len_a: 0.0,
        max_len_b: job.max_decoding_length,
        ..job.opts
    };
    for (group, opts) in [(ruled, job.opts), (capped, capped_opts)] {
        if group.is_empty() {
            continue;
        }
        let ids: Vec<Vec<u32>> = group.iter().map(|&i| src[i].clone()).collect();
        let mut request = DecodeRequest::new(opts).with_batch_rows(job.batch_rows);
        if let Some(p) = &job.target_prefix {
            request = request.with_target_prefix(group.iter().map(|&i| p[i].clone()).collect());
        }
        let nbest = translate(engine.decoder(), &ids, &request, &Device::Cpu, |_, _| {})?;
        for (i, mut hs) in group.into_iter().zip(nbest) {
            hs.truncate(job.num_hypotheses);
            out[i] = hs;
        }
    }
    Ok(out)
}

/// The score CTranslate2 reports: the log-probability of the tokens and `</s>`, divided by
/// length^`length_penalty` (length counting `</s>`) as beam search ranks hypotheses.
fn normalized_score(h: &Hypothesis, length_penalty: f64) -> f64 {
    if length_penalty == 0.0 {
        h.score
    } else {
        let len = h.tokens.len() + usize::from(h.finished);
        h.score / (len.max(1) as f64).powf(length_penalty)
    }
}

/// A hypothesis's attention as CTranslate2 returns it: one row per output token (and for
/// `</s>` when asked), the last decoder layer's encoder-decoder attention averaged over its
/// heads, over the source's tokens and its `</s>`.
fn attention_rows(
    h: &Hypothesis,
    shape: (usize, usize),
    src_len: usize,
    with_end: bool,
) -> Vec<Vec<f32>> {
    let (layers, heads) = (shape.0.max(1), shape.1.max(1));
    let rows = h.tokens.len() + usize::from(with_end && h.finished);
    h.attention
        .iter()
        .take(rows)
        .map(|v| {
            let s = v.len() / (layers * heads);
            let last = &v[(layers - 1) * heads * s..];
            let cols = (src_len + 1).min(s);
            (0..cols)
                .map(|c| (0..heads).map(|hd| last[hd * s + c]).sum::<f32>() / heads as f32)
                .collect()
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// TranslationResult

/// The translation of one source: its hypotheses (token lists, best first), and their
/// scores and attention when asked for (`return_scores`, `return_attention`), as
/// CTranslate2's `TranslationResult`. `result[i]` is hypothesis `i` as a dict (`tokens`,
/// and `score`, `attention` when returned), as CTranslate2 1.x returned it.
#[pyclass(module = "transformer", frozen, get_all)]
pub struct TranslationResult {
    /// Hypotheses, best first: lists of subword pieces.
    hypotheses: Vec<Vec<String>>,
    /// Each hypothesis's score (empty unless `return_scores`).
    scores: Vec<f64>,
    /// Each hypothesis's attention, one row per output token over the source's tokens and
    /// its `</s>` (empty unless `return_attention`).
    attention: Vec<Vec<Vec<f32>>>,
    /// Not returned by this engine (CTranslate2's `return_logits_vocab`): always empty.
    logits: Vec<Vec<f32>>,
}

#[pymethods]
impl TranslationResult {
    fn __len__(&self) -> usize {
        self.hypotheses.len()
    }

    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Ok(i) = key.extract::<isize>() {
            let n = self.hypotheses.len() as isize;
            let j = if i < 0 { i + n } else { i };
            if j < 0 || j >= n {
                return Err(PyIndexError::new_err(format!(
                    "hypothesis {i} out of range: this result has {n}"
                )));
            }
            let j = j as usize;
            let d = PyDict::new(py);
            d.set_item("tokens", &self.hypotheses[j])?;
            if let Some(s) = self.scores.get(j) {
                d.set_item("score", s)?;
            }
            if let Some(a) = self.attention.get(j) {
                d.set_item("attention", a)?;
            }
            return Ok(d.into_any());
        }
        if let Ok(k) = key.extract::<String>() {
            return match k.as_str() {
                "hypotheses" => Ok(self.hypotheses.clone().into_pyobject(py)?.into_any()),
                "tokens" => Ok(self.hypotheses[0].clone().into_pyobject(py)?.into_any()),
                "scores" => Ok(self.scores.clone().into_pyobject(py)?.into_any()),
                "score" if !self.scores.is_empty() => {
                    Ok(self.scores[0].into_pyobject(py)?.into_any())
                }
                "attention" => Ok(self.attention.clone().into_pyobject(py)?.into_any()),
                _ => Err(PyKeyError::new_err(format!(
                    "'{k}': a TranslationResult has hypotheses, tokens (the best \
                     hypothesis), scores, score (with return_scores) and attention"
                ))),
            };
        }
        Err(PyTypeError::new_err(
            "TranslationResult indices are ints (a hypothesis) or strings (a field)",
        ))
    }

    fn __repr__(&self) -> String {
        format!(
            "TranslationResult(hypotheses={:?}, scores={:?}, attention=[{} matrices])",
            self.hypotheses,
            self.scores,
            self.attention.len()
        )
    }
}

// ---------------------------------------------------------------------------------------
// Translator

/// The `compute_type` values understood: the run's own arithmetic, f32, or int8.
fn precision_of(compute_type: &str) -> PyResult<Option<DecodePrecision>> {
    match compute_type {
        "default" | "auto" => Ok(None),
        "float32" | "float" => Ok(Some(DecodePrecision::F32)),
        "int8" | "int8_float32" => Ok(Some(DecodePrecision::Int8 { output_layer: true })),
        other => Err(value_err(format!(
            "compute_type='{other}': this engine decodes in 'default' (the run's own: int8 \
             for a run written by `transformer mt quantize`, else float32), 'float32' or \
             'int8' (int8_float32); float16, bfloat16 and int8_float16 are not supported"
        ))),
    }
}

/// The source token lists of `translate_batch`: `list[list[str]]`.
fn source_tokens(source: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<String>>> {
    let bad = || {
        PyTypeError::new_err(
            "source must be a list of token lists (list[list[str]]), such as \
             [['▁Ein', '▁Mann', '▁fährt', '▁Fahrrad', '.']] (Translator.tokenizer.encode \
             gives them); use Translator.translate for text",
        )
    };
    if source.is_instance_of::<PyString>() {
        return Err(bad());
    }
    let mut out = Vec::new();
    for item in source.try_iter().map_err(|_| bad())? {
        let item = item?;
        if item.is_instance_of::<PyString>() {
            return Err(bad());
        }
        out.push(item.extract::<Vec<String>>().map_err(|_| bad())?);
    }
    Ok(out)
}

/// A trained translation run, loaded to translate: `ctranslate2.Translator`'s interface
/// over a run directory of `transformer mt train`.
#[pyclass(module = "transformer", subclass, frozen)]
pub struct Translator {
    engine: Engine,
    /// The run's tokenizer as a Python object, made once.
    tokenizer: Py<Tokenizer>,
    model_path: String,
    compute_type: String,
    intra_threads: usize,
}

impl Translator {
    fn tokenizer_ref(&self) -> &Subword {
        &self.engine.run().tokenizer
    }

    fn ids_of_pieces(&self, pieces: &[String], max_input_length: usize) -> Vec<u32> {
        let tok = self.tokenizer_ref();
        let unk = tok.specials().unk;
        let mut ids: Vec<u32> = pieces
            .iter()
            .map(|p| tok.source_token_to_id(p).unwrap_or(unk))
            .collect();
        if max_input_length > 0 {
            ids.truncate(max_input_length);
        }
        ids
    }

    /// The run's decoding options with `beam` and `length_penalty`, checked as the command
    /// line checks them.
    fn options(
        &self,
        beam: usize,
        length_penalty: f64,
        want_scores: bool,
    ) -> PyResult<DecodeOptions> {
        let mut c = self.engine.run().config.clone();
        c.length_penalty = length_penalty;
        c.validate_decoding()
            .map_err(|e| value_err(format!("length_penalty={length_penalty}: {e}")))?;
        Ok(DecodeOptions {
            want_scores,
            ..c.decode_options(beam)
        })
    }
}

#[pymethods]
impl Translator {
    #[new]
    #[pyo3(signature = (model_path, device="cpu", *, device_index=None, compute_type="default",
        inter_threads=1, intra_threads=0, max_queued_batches=0, flash_attention=false,
        tensor_parallel=false, files=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model_path: PathBuf,
        device: &str,
        device_index: Option<&Bound<'_, PyAny>>,
        compute_type: &str,
        inter_threads: i64,
        intra_threads: i64,
        max_queued_batches: i64,
        flash_attention: bool,
        tensor_parallel: bool,
        files: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let index = device_index.map(device_index_of).transpose()?.unwrap_or(0);
        let dev = open_device(device, index)?;
        let precision = precision_of(compute_type)?;
        at_least(
            "inter_threads",
            inter_threads,
            1,
            "translations at once; use Python threads",
        )?;
        let intra = at_least("intra_threads", intra_threads, 0, "0 = every core")?;
        let _ = max_queued_batches;
        if flash_attention || tensor_parallel {
            return Err(value_err(
                "flash_attention and tensor_parallel are GPU features of CTranslate2; this \
                 engine decodes on the CPU (leave them False)",
            ));
        }
        if files.is_some_and(|f| !f.is_none()) {
            return Err(value_err(
                "files= (a model given in memory) is not supported: give the run directory",
            ));
        }
        apply_intra_threads(intra);
        let path = model_path.clone();
        let engine = py
            .allow_threads(move || -> transformer_runtime::Result<Engine> {
                let how = Execution {
                    device: dev,
                    decoding: precision,
                    restrict_vocab: false,
                };
                Engine::new(load_run(&path, &how)?)
            })
            .map_err(engine_err)?;
        let compute_type = match engine.run().model.decode_precision() {
            DecodePrecision::F32 => "float32",
            _ => "int8",
        };
        let tokenizer = Py::new(
            py,
            Tokenizer {
                inner: engine.run().tokenizer.clone(),
                path: tokenizer_path(&model_path).display().to_string(),
            },
        )?;
        Ok(Self {
            engine,
            tokenizer,
            model_path: model_path.display().to_string(),
            compute_type: compute_type.to_string(),
            intra_threads: *INTRA_THREADS.get().unwrap_or(&intra),
        })
    }

    /// The run directory.
    #[getter]
    fn model_path(&self) -> &str {
        &self.model_path
    }

    /// Always `"cpu"`.
    #[getter]
    fn device(&self) -> &str {
        "cpu"
    }

    /// Always 0.
    #[getter]
    fn device_index(&self) -> Vec<usize> {
        vec![0]
    }

    /// The arithmetic decoding runs in: `"float32"` or `"int8"`.
    #[getter]
    fn compute_type(&self) -> &str {
        &self.compute_type
    }

    /// 1: one model; run Python threads to translate several batches at once.
    #[getter]
    fn num_translators(&self) -> usize {
        1
    }

    /// 0: nothing is queued (calls decode at once, in the caller's thread).
    #[getter]
    fn num_queued_batches(&self) -> usize {
        0
    }

    /// True: the model is loaded while the object lives.
    #[getter]
    fn model_is_loaded(&self) -> bool {
        true
    }

    /// The threads of the CPU pool this translator asked for (0: as many as the CPUs).
    #[getter]
    fn intra_threads(&self) -> usize {
        self.intra_threads
    }

    /// The run's tokenizer.
    #[getter]
    fn tokenizer(&self, py: Python<'_>) -> Py<Tokenizer> {
        self.tokenizer.clone_ref(py)
    }

    /// The run's own decoding settings: beam, length_penalty, max_len_a, max_len_b.
    #[getter]
    fn decoding_defaults<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = &self.engine.run().config;
        let d = PyDict::new(py);
        d.set_item("beam_size", c.beam)?;
        d.set_item("length_penalty", c.length_penalty)?;
        d.set_item("max_len_a", c.max_len_a)?;
        d.set_item("max_len_b", c.max_len_b)?;
        Ok(d)
    }

    #[pyo3(signature = (source, target_prefix=None, *, max_batch_size=0, batch_type="examples",
        asynchronous=false, beam_size=2, patience=1.0, num_hypotheses=1, length_penalty=1.0,
        coverage_penalty=0.0, repetition_penalty=1.0, no_repeat_ngram_size=0, disable_unk=false,
        suppress_sequences=None, end_token=None, return_end_token=false, prefix_bias_beta=0.0,
        max_input_length=1024, max_decoding_length=256, min_decoding_length=1, use_vmap=false,
        return_scores=false, return_logits_vocab=false, return_attention=false,
        return_alternatives=false, min_alternative_expansion_prob=0.0, sampling_topk=1,
        sampling_topp=1.0, sampling_temperature=1.0, replace_unknowns=false, callback=None))]
    #[allow(clippy::too_many_arguments)]
    fn translate_batch(
        &self,
        py: Python<'_>,
        source: &Bound<'_, PyAny>,
        target_prefix: Option<&Bound<'_, PyAny>>,
        max_batch_size: i64,
        batch_type: &str,
        asynchronous: bool,
        beam_size: i64,
        patience: f64,
        num_hypotheses: i64,
        length_penalty: f64,
        coverage_penalty: f64,
        repetition_penalty: f64,
        no_repeat_ngram_size: i64,
        disable_unk: bool,
        suppress_sequences: Option<&Bound<'_, PyAny>>,
        end_token: Option<&Bound<'_, PyAny>>,
        return_end_token: bool,
        prefix_bias_beta: f64,
        max_input_length: i64,
        max_decoding_length: i64,
        min_decoding_length: i64,
        use_vmap: bool,
        return_scores: bool,
        return_logits_vocab: bool,
        return_attention: bool,
        return_alternatives: bool,
        min_alternative_expansion_prob: f64,
        sampling_topk: i64,
        sampling_topp: f64,
        sampling_temperature: f64,
        replace_unknowns: bool,
        callback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<TranslationResult>> {
        let src = source_tokens(source)?;
        let unsupported = |name: &str, given: String, default: &str| {
            value_err(format!(
                "translate_batch: {name}={given} is not supported by this engine (only the \
                 default, {default}); see docs/PYTHON.md"
            ))
        };
        // CTranslate2's hard prefix: one token list (or None) per source; none given, none
        // forced (a run's own prefix is the text API's, `translate`).
        let prefixes: Vec<Vec<String>> = match target_prefix.filter(|p| !p.is_none()) {
            None => vec![Vec::new(); src.len()],
            Some(p) => {
                let v = p.extract::<Vec<Option<Vec<String>>>>().map_err(|_| {
                    PyTypeError::new_err(
                        "target_prefix must be a list with one token list (or None) per source",
                    )
                })?;
                if v.len() != src.len() {
                    return Err(value_err(format!(
                        "target_prefix has {} entries for {} sources: give one per source \
                         (None or [] for none)",
                        v.len(),
                        src.len()
                    )));
                }
                v.into_iter().map(Option::unwrap_or_default).collect()
            }
        };
        let has_prefix = prefixes.iter().any(|p| !p.is_empty());
        if has_prefix
            && !matches!(
                self.engine.run().config.decode_options(1).rules,
                SearchRules::CTranslate2 { .. }
            )
        {
            return Err(value_err(
                "target_prefix: this run decodes by another engine's rules than CTranslate2's \
                 (target prefixes are decoded for CTranslate2 and Argos Translate models)",
            ));
        }
        if batch_type != "examples" {
            return Err(unsupported(
                "batch_type",
                format!("'{batch_type}'"),
                "'examples'",
            ));
        }
        let checks: [(&str, bool, String, &str); 17] = [
            (
                "asynchronous",
                asynchronous,
                asynchronous.to_string(),
                "False",
            ),
            ("patience", patience != 1.0, patience.to_string(), "1"),
            (
                "coverage_penalty",
                coverage_penalty != 0.0,
                coverage_penalty.to_string(),
                "0",
            ),
            (
                "repetition_penalty",
                repetition_penalty != 1.0,
                repetition_penalty.to_string(),
                "1",
            ),
            (
                "no_repeat_ngram_size",
                no_repeat_ngram_size != 0,
                no_repeat_ngram_size.to_string(),
                "0",
            ),
            ("disable_unk", disable_unk, disable_unk.to_string(), "False"),
            (
                "suppress_sequences",
                suppress_sequences.is_some_and(|s| !s.is_none()),
                "[...]".into(),
                "None",
            ),
            (
                "end_token",
                end_token.is_some_and(|s| !s.is_none()),
                "...".into(),
                "None",
            ),
            (
                "prefix_bias_beta",
                prefix_bias_beta != 0.0,
                prefix_bias_beta.to_string(),
                "0",
            ),
            ("use_vmap", use_vmap, use_vmap.to_string(), "False"),
            (
                "return_logits_vocab",
                return_logits_vocab,
                return_logits_vocab.to_string(),
                "False",
            ),
            (
                "return_alternatives",
                return_alternatives,
                return_alternatives.to_string(),
                "False",
            ),
            (
                "min_alternative_expansion_prob",
                min_alternative_expansion_prob != 0.0,
                min_alternative_expansion_prob.to_string(),
                "0",
            ),
            (
                "sampling_topk",
                sampling_topk != 1,
                sampling_topk.to_string(),
                "1",
            ),
            (
                "sampling_topp",
                sampling_topp != 1.0,
                sampling_topp.to_string(),
                "1",
            ),
            (
                "sampling_temperature",
                sampling_temperature != 1.0,
                sampling_temperature.to_string(),
                "1",
            ),
            (
                "callback",
                callback.is_some_and(|s| !s.is_none()),
                "<function>".into(),
                "None",
            ),
        ];
        for (name, bad, given, default) in checks {
            if bad {
                return Err(unsupported(name, given, default));
            }
        }
        if min_decoding_length > 1 {
            return Err(unsupported(
                "min_decoding_length",
                min_decoding_length.to_string(),
                "0 or 1",
            ));
        }
        let beam = at_least("beam_size", beam_size, 1, "1 = greedy search")?;
        let n = at_least(
            "num_hypotheses",
            num_hypotheses,
            1,
            "hypotheses returned per source",
        )?;
        if n > beam {
            return Err(value_err(format!(
                "num_hypotheses={n} is more than beam_size={beam}: beam search keeps at most \
                 beam_size hypotheses"
            )));
        }
        let max_dec = at_least(
            "max_decoding_length",
            max_decoding_length,
            1,
            "the longest output in tokens",
        )?;
        let max_input = at_least("max_input_length", max_input_length, 0, "0 = no limit")?;
        let max_batch = at_least("max_batch_size", max_batch_size, 0, "0 = no limit")?;
        if !length_penalty.is_finite() {
            return Err(value_err(format!(
                "length_penalty={length_penalty}: must be a finite number"
            )));
        }
        // Greedy search finds tokens faster when it need not score them (as `mt translate`).
        let want_scores = return_scores || beam > 1;
        let mut opts = self.options(beam, length_penalty, want_scores)?;
        opts.want_attention = return_attention || replace_unknowns;
        if let SearchRules::CTranslate2 { .. } = opts.rules {
            // CTranslate2's own: as many hypotheses as asked, its minimum length.
            opts.rules = SearchRules::CTranslate2 {
                min_length: min_decoding_length.max(0) as usize,
                num_hypotheses: n,
            };
        }
        let target_prefix = {
            let tok = self.tokenizer_ref();
            prefixes.iter().map(|p| tok.target_ids(p)).collect()
        };
        let batch_rows = match max_batch {
            0 => transformer_runtime::translate::DECODE_BATCH_ROWS,
            b => b.saturating_mul(beam),
        };
        let job = Job {
            opts,
            batch_rows,
            max_decoding_length: max_dec,
            num_hypotheses: n,
            target_prefix: Some(target_prefix),
        };
        let ids: Vec<Vec<u32>> = src
            .iter()
            .map(|s| self.ids_of_pieces(s, max_input))
            .collect();
        let engine = &self.engine;
        let nbest = py
            .allow_threads(|| decode(engine, &ids, &job))
            .map_err(engine_err)?;
        let tok = self.tokenizer_ref();
        let eos = tok.specials().eos;
        let shape = self.engine.run().model_config.arch().attention_shape();
        // CTranslate2's alignment (a published model's layer and heads), over the source's
        // pieces; a run of this project's: the last layer's heads averaged, with `</s>`.
        let published = self.engine.run().config.published.as_ref();
        let align = published.map(|p| p.alignment(shape.0, shape.1));
        let unk_piece = tok.token(tok.target_unk());
        let mut out = Vec::with_capacity(nbest.len());
        for ((hs, src_ids), src_pieces) in nbest.iter().zip(&ids).zip(&src) {
            let alignment = |h: &Hypothesis, rows: usize| match align {
                Some(a) => {
                    let mut r = alignment_rows(h, shape, a, rows, 0..src_ids.len());
                    for v in &mut r {
                        v.resize(src_pieces.len(), 0.0);
                    }
                    r
                }
                None => attention_rows(h, shape, src_ids.len(), return_end_token),
            };
            let pieces = |h: &Hypothesis| {
                let mut p: Vec<String> = h.tokens.iter().map(|&t| tok.token(t)).collect();
                if replace_unknowns && !src_ids.is_empty() {
                    let rows = alignment(h, p.len());
                    replace_unknowns_in(&mut p, &unk_piece, &rows, src_pieces);
                }
                if return_end_token && h.finished && !src_ids.is_empty() {
                    p.push(tok.token(eos));
                }
                p
            };
            out.push(TranslationResult {
                hypotheses: hs.iter().map(pieces).collect(),
                scores: if return_scores {
                    hs.iter()
                        .map(|h| normalized_score(h, length_penalty))
                        .collect()
                } else {
                    Vec::new()
                },
                attention: if return_attention {
                    hs.iter()
                        .map(|h| {
                            let rows = h.tokens.len() + usize::from(return_end_token && h.finished);
                            alignment(h, rows)
                        })
                        .collect()
                } else {
                    Vec::new()
                },
                logits: Vec::new(),
            });
        }
        Ok(out)
    }

    /// Translates text: each sentence tokenized with the run's tokenizer, translated, and
    /// detokenized, as `transformer mt translate` does (a str in, a str out; a list in, a
    /// list out).
    #[pyo3(signature = (texts, *, beam_size=None, length_penalty=None, max_decoding_length=256,
        max_batch_size=0))]
    fn translate<'py>(
        &self,
        py: Python<'py>,
        texts: &Bound<'py, PyAny>,
        beam_size: Option<i64>,
        length_penalty: Option<f64>,
        max_decoding_length: i64,
        max_batch_size: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let single = texts.is_instance_of::<PyString>();
        let lines: Vec<String> = if single {
            vec![texts.extract()?]
        } else {
            texts.extract().map_err(|_| {
                PyTypeError::new_err("texts must be a str or a list of str (sentences)")
            })?
        };
        let c = &self.engine.run().config;
        let beam = at_least(
            "beam_size",
            beam_size.unwrap_or(c.beam as i64),
            1,
            "1 = greedy search",
        )?;
        let lp = length_penalty.unwrap_or(c.length_penalty);
        let opts = self.options(beam, lp, false)?;
        let max_batch = at_least("max_batch_size", max_batch_size, 0, "0 = no limit")?;
        let job = Job {
            opts,
            batch_rows: match max_batch {
                0 => transformer_runtime::translate::DECODE_BATCH_ROWS,
                b => b.saturating_mul(beam),
            },
            max_decoding_length: at_least(
                "max_decoding_length",
                max_decoding_length,
                1,
                "the longest output in tokens",
            )?,
            num_hypotheses: 1,
            target_prefix: None,
        };
        let engine = &self.engine;
        let out = py
            .allow_threads(|| -> transformer_runtime::Result<Vec<String>> {
                let tok = &engine.run().tokenizer;
                let rules = engine.run().model.engine_rules();
                let ids: Vec<Vec<u32>> = lines.iter().map(|l| tok.encode(l)).collect();
                let nbest = decode(engine, &ids, &job)?;
                Ok(nbest
                    .iter()
                    .zip(&lines)
                    .map(|(hs, line)| {
                        hs.first()
                            .map_or(String::new(), |h| hypothesis_text(rules, tok, line, h))
                    })
                    .collect())
            })
            .map_err(engine_err)?;
        if single {
            Ok(PyString::new(py, &out[0]).into_any())
        } else {
            Ok(PyList::new(py, out)?.into_any())
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Translator('{}', device='cpu', compute_type='{}')",
            self.model_path, self.compute_type
        )
    }
}

fn device_index_of(v: &Bound<'_, PyAny>) -> PyResult<usize> {
    device_index(v)
}

// ---------------------------------------------------------------------------------------
// Tokenizer

/// A run's subword tokenizer (`tokenizer.json`): text to pieces and ids, and back.
#[pyclass(module = "transformer", frozen)]
pub struct Tokenizer {
    inner: Subword,
    path: String,
}

#[pymethods]
impl Tokenizer {
    /// Loads `path`: a run directory (its `tokenizer.json`) or a `tokenizer.json` file.
    #[new]
    fn new(path: PathBuf) -> PyResult<Self> {
        let file = if path.is_dir() {
            tokenizer_path(&path)
        } else {
            path.clone()
        };
        if !file.exists() {
            return Err(PyFileNotFoundError::new_err(if path.is_dir() {
                format!(
                    "{}: no tokenizer.json, so not a translation run",
                    path.display()
                )
            } else {
                format!("{}: no such file or directory", path.display())
            }));
        }
        let inner = Subword::load(&file).map_err(|e| engine_err(e.into()))?;
        Ok(Self {
            inner,
            path: file.display().to_string(),
        })
    }

    /// The `tokenizer.json` it was loaded from.
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    /// The number of ids, the four specials (`<pad>`, `<bos>`, `<eos>`, `<unk>`) included.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn __len__(&self) -> usize {
        self.inner.vocab_size()
    }

    /// The subword pieces of `text` (what `Translator.translate_batch` takes).
    fn encode(&self, text: &str) -> Vec<String> {
        self.inner
            .encode(text)
            .into_iter()
            .map(|i| self.inner.token(i))
            .collect()
    }

    /// The ids of `text`, without `<bos>` or `<eos>`.
    fn encode_ids(&self, text: &str) -> Vec<u32> {
        self.inner.encode(text)
    }

    /// `encode` of every text.
    fn encode_batch(&self, texts: Vec<String>) -> Vec<Vec<String>> {
        texts.iter().map(|t| self.encode(t)).collect()
    }

    /// The text of `tokens`: ids or pieces (special tokens left out).
    fn decode(&self, tokens: &Bound<'_, PyAny>) -> PyResult<String> {
        let ids = self.ids_of(tokens)?;
        Ok(self.inner.decode(&ids))
    }

    /// The id of the piece `token`, or None when the vocabulary has no such piece.
    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The piece of `id`.
    fn id_to_token(&self, id: i64) -> PyResult<String> {
        let v = self.inner.vocab_size();
        if id < 0 || id as usize >= v {
            return Err(value_err(format!(
                "id {id} is outside the vocabulary (0 to {})",
                v - 1
            )));
        }
        Ok(self.inner.token(id as u32))
    }

    fn __repr__(&self) -> String {
        format!(
            "Tokenizer('{}', vocab_size={})",
            self.path,
            self.inner.vocab_size()
        )
    }
}

impl Tokenizer {
    fn ids_of(&self, tokens: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
        let bad = || PyTypeError::new_err("decode takes a list of ids (int) or of pieces (str)");
        if tokens.is_instance_of::<PyString>() {
            return Err(bad());
        }
        if let Ok(ids) = tokens.extract::<Vec<i64>>() {
            let v = self.inner.vocab_size();
            return ids
                .into_iter()
                .map(|i| {
                    if i < 0 || i as usize >= v {
                        Err(value_err(format!(
                            "id {i} is outside the vocabulary (0 to {})",
                            v - 1
                        )))
                    } else {
                        Ok(i as u32)
                    }
                })
                .collect();
        }
        if let Ok(pieces) = tokens.extract::<Vec<String>>() {
            let unk = self.inner.specials().unk;
            return Ok(pieces
                .iter()
                .map(|p| self.inner.token_to_id(p).unwrap_or(unk))
                .collect());
        }
        Err(bad())
    }
}

// ---------------------------------------------------------------------------------------
// Scores

/// A corpus BLEU score, with sacreBLEU's `BLEUScore` fields.
#[pyclass(module = "transformer", frozen, get_all)]
pub struct BleuScore {
    /// BLEU, 0 to 100.
    score: f64,
    /// Clipped n-gram matches of each order (with add-k smoothing, k added to orders 2 to
    /// 4 as sacreBLEU reports them).
    counts: Py<PyList>,
    /// Hypothesis n-grams of each order (k added likewise).
    totals: Py<PyList>,
    /// Precision of each order in percent, after smoothing.
    precisions: Vec<f64>,
    /// Brevity penalty.
    bp: f64,
    /// Hypothesis words.
    sys_len: u64,
    /// Reference words.
    ref_len: u64,
    /// `sys_len / ref_len`.
    ratio: f64,
    /// `"BLEU"`.
    name: String,
    /// sacreBLEU's signature (`nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0`).
    signature: String,
    line: String,
    verbose: String,
}

#[pymethods]
impl BleuScore {
    /// sacreBLEU's `format`: the line `str()` gives, or the score alone, or with a signature.
    #[pyo3(signature = (width=2, score_only=false, signature=""))]
    fn format(&self, width: usize, score_only: bool, signature: &str) -> String {
        let details = Some(self.verbose.as_str());
        format_score(
            &self.name, self.score, details, width, score_only, signature,
        )
    }

    fn __str__(&self) -> String {
        self.line.clone()
    }

    fn __repr__(&self) -> String {
        self.line.clone()
    }
}

/// sacreBLEU's `format` of a score: the score alone, or `name = score` and the details when
/// there are any, the name followed by `|` and the signature when one is given.
fn format_score(
    name: &str,
    score: f64,
    details: Option<&str>,
    width: usize,
    score_only: bool,
    signature: &str,
) -> String {
    if score_only {
        return format!("{:.*}", width, score);
    }
    let name = if signature.is_empty() {
        name.to_string()
    } else {
        format!("{name}|{signature}")
    };
    match details {
        Some(details) => format!("{name} = {:.*} {details}", width, score),
        None => format!("{name} = {:.*}", width, score),
    }
}

/// A corpus chrF score, with sacreBLEU's `CHRFScore` fields.
#[pyclass(module = "transformer", frozen, get_all)]
pub struct ChrfScore {
    /// chrF, 0 to 100.
    score: f64,
    /// Character n-gram order.
    char_order: usize,
    /// Word n-gram order (2 for chrF++).
    word_order: usize,
    /// Recall weight.
    beta: u32,
    /// `"chrF2"` or `"chrF2++"`.
    name: String,
    /// sacreBLEU's signature.
    signature: String,
    line: String,
}

#[pymethods]
impl ChrfScore {
    /// sacreBLEU's `format`.
    #[pyo3(signature = (width=2, score_only=false, signature=""))]
    fn format(&self, width: usize, score_only: bool, signature: &str) -> String {
        format_score(&self.name, self.score, None, width, score_only, signature)
    }

    fn __str__(&self) -> String {
        self.line.clone()
    }

    fn __repr__(&self) -> String {
        self.line.clone()
    }
}

/// Hypotheses and one reference stream, as sacreBLEU's `corpus_*(hyps, [refs])` takes them.
fn streams(
    hypotheses: &Bound<'_, PyAny>,
    references: &Bound<'_, PyAny>,
) -> PyResult<(Vec<String>, Vec<String>)> {
    let list_of_str = "hypotheses must be a list of str (one translation per segment)";
    if hypotheses.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(list_of_str));
    }
    let hyps: Vec<String> = hypotheses
        .extract()
        .map_err(|_| PyTypeError::new_err(list_of_str))?;
    let refs_msg = "references must be a list of reference streams, each a list of str \
                    parallel to the hypotheses: corpus_bleu(hyps, [refs])";
    if references.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(refs_msg));
    }
    let mut streams = Vec::new();
    for s in references
        .try_iter()
        .map_err(|_| PyTypeError::new_err(refs_msg))?
    {
        let s = s?;
        if s.is_instance_of::<PyString>() {
            return Err(PyTypeError::new_err(format!(
                "{refs_msg} (a list of str was given: wrap it in a list, [refs])"
            )));
        }
        streams.push(
            s.extract::<Vec<String>>()
                .map_err(|_| PyTypeError::new_err(refs_msg))?,
        );
    }
    match streams.len() {
        1 => Ok((hyps, streams.pop().expect("one"))),
        0 => Err(value_err("references: no reference stream given")),
        n => Err(value_err(format!(
            "references: {n} reference streams given; this implementation scores against \
             one reference per segment"
        ))),
    }
}

/// sacreBLEU's `corpus_bleu`.
#[pyfunction]
#[pyo3(signature = (hypotheses, references, smooth_method="exp", smooth_value=None,
    force=false, lowercase=false, tokenize="13a", use_effective_order=false))]
#[allow(clippy::too_many_arguments)]
fn corpus_bleu(
    py: Python<'_>,
    hypotheses: &Bound<'_, PyAny>,
    references: &Bound<'_, PyAny>,
    smooth_method: &str,
    smooth_value: Option<f64>,
    force: bool,
    lowercase: bool,
    tokenize: &str,
    use_effective_order: bool,
) -> PyResult<BleuScore> {
    let _ = force; // sacreBLEU's warning about tokenized input is not reproduced
    let (hyps, refs) = streams(hypotheses, references)?;
    let mut smoothing: Smoothing = smooth_method
        .parse()
        .map_err(|e: score::ScoreError| value_err(e.to_string()))?;
    if let Some(v) = smooth_value {
        smoothing = match smoothing {
            Smoothing::Floor(_) => Smoothing::Floor(v),
            Smoothing::AddK(_) => Smoothing::AddK(v),
            s => s,
        };
    }
    let opts = BleuOptions {
        tokenizer: tokenize
            .parse()
            .map_err(|e: score::ScoreError| value_err(e.to_string()))?,
        lowercase,
        smoothing,
        effective_order: use_effective_order,
        ..BleuOptions::default()
    };
    let s = score::corpus_bleu(&hyps, &refs, &opts).map_err(|e| value_err(e.to_string()))?;
    // sacreBLEU reports add-k's k added into the counts and totals of orders 2 and up
    // (unless nothing matched: it stops before smoothing then), as ints for an integral k.
    let added = match opts.smoothing {
        Smoothing::AddK(k) if s.counts.iter().any(|&c| c > 0) => k,
        _ => 0.0,
    };
    let stats = |v: &[u64]| -> PyResult<Py<PyList>> {
        let list = if added.fract() == 0.0 {
            let k = added as u64;
            let v: Vec<u64> = v
                .iter()
                .enumerate()
                .map(|(n, &c)| c + if n > 0 { k } else { 0 })
                .collect();
            PyList::new(py, v)?
        } else {
            let v: Vec<f64> = v
                .iter()
                .enumerate()
                .map(|(n, &c)| c as f64 + if n > 0 { added } else { 0.0 })
                .collect();
            PyList::new(py, v)?
        };
        Ok(list.unbind())
    };
    Ok(BleuScore {
        counts: stats(&s.counts)?,
        totals: stats(&s.totals)?,
        // sacreBLEU's name and line (the command line labels one convention apart).
        line: format!("BLEU = {:.2} {}", s.score, s.verbose()),
        verbose: s.verbose(),
        signature: s.signature(),
        name: "BLEU".to_string(),
        score: s.score,
        precisions: s.precisions,
        bp: s.bp,
        sys_len: s.sys_len,
        ref_len: s.ref_len,
        ratio: s.ratio,
    })
}

/// sacreBLEU's `corpus_chrf` (with `lowercase` and `eps_smoothing` of its `CHRF`).
#[pyfunction]
#[pyo3(signature = (hypotheses, references, char_order=6, word_order=0, beta=2,
    remove_whitespace=true, *, lowercase=false, eps_smoothing=false))]
#[allow(clippy::too_many_arguments)]
fn corpus_chrf(
    hypotheses: &Bound<'_, PyAny>,
    references: &Bound<'_, PyAny>,
    char_order: i64,
    word_order: i64,
    beta: i64,
    remove_whitespace: bool,
    lowercase: bool,
    eps_smoothing: bool,
) -> PyResult<ChrfScore> {
    let (hyps, refs) = streams(hypotheses, references)?;
    let opts = ChrfOptions {
        char_order: at_least("char_order", char_order, 0, "6 is standard")?,
        word_order: at_least("word_order", word_order, 0, "0 for chrF, 2 for chrF++")?,
        beta: at_least("beta", beta, 0, "2 is standard")? as u32,
        lowercase,
        whitespace: !remove_whitespace,
        eps_smoothing,
    };
    let s = score::corpus_chrf(&hyps, &refs, &opts).map_err(|e| value_err(e.to_string()))?;
    Ok(ChrfScore {
        line: s.format(),
        signature: s.signature(),
        name: opts.name(),
        score: s.score,
        char_order: opts.char_order,
        word_order: opts.word_order,
        beta: opts.beta,
    })
}

// ---------------------------------------------------------------------------------------
// Training

/// A Python value of a configuration dict as TOML (None: the key left out).
fn toml_value(v: &Bound<'_, PyAny>, key: &str) -> PyResult<Option<toml::Value>> {
    if v.is_none() {
        return Ok(None);
    }
    if let Ok(b) = v.downcast::<pyo3::types::PyBool>() {
        return Ok(Some(toml::Value::Boolean(b.is_true())));
    }
    if let Ok(i) = v.extract::<i64>() {
        return Ok(Some(toml::Value::Integer(i)));
    }
    if let Ok(f) = v.extract::<f64>() {
        return Ok(Some(toml::Value::Float(f)));
    }
    if let Ok(s) = v.extract::<String>() {
        return Ok(Some(toml::Value::String(s)));
    }
    if let Ok(p) = v.extract::<PathBuf>() {
        return Ok(Some(toml::Value::String(p.display().to_string())));
    }
    Err(PyTypeError::new_err(format!(
        "config['{key}']: a {} cannot be a setting (give a str, int, float, bool, path or None)",
        v.get_type().name()?
    )))
}

/// The training configuration a `config` argument gives: a dict of the configuration keys
/// (its `out` key taken apart), or a TOML file; with the settings it gives and `out`.
fn config_table(
    config: &Bound<'_, PyAny>,
) -> PyResult<(
    toml::Table,
    Vec<transformer_train::runner::Given>,
    Option<PathBuf>,
)> {
    use transformer_train::runner::Given;
    if let Ok(d) = config.downcast::<PyDict>() {
        let mut table = toml::Table::new();
        let mut given = Vec::new();
        let mut out = None;
        for (k, v) in d.iter() {
            let k: String = k
                .extract()
                .map_err(|_| PyTypeError::new_err("config keys must be str"))?;
            if k == "out" {
                out = Some(v.extract::<PathBuf>()?);
                continue;
            }
            if let Some(v) = toml_value(&v, &k)? {
                given.push(Given::new(&k, format!("{k} in the config dict")));
                table.insert(k, v);
            }
        }
        return Ok((table, given, out));
    }
    if let Ok(p) = config.extract::<PathBuf>() {
        let text = std::fs::read_to_string(&p).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                PyFileNotFoundError::new_err(format!("{}: {e}", p.display()))
            } else {
                PyOSError::new_err(format!("{}: {e}", p.display()))
            }
        })?;
        let table: toml::Table = text
            .parse()
            .map_err(|e| value_err(format!("{}: {e}", p.display())))?;
        let given = Given::from_config_file(&p).map_err(engine_err)?;
        return Ok((table, given, None));
    }
    Err(PyTypeError::new_err(
        "config must be a dict of settings (the keys of `transformer mt train --config`) or \
         the path of a TOML file",
    ))
}

/// How training reports to Python: each log line printed (or given to a callable), and
/// Ctrl-C (a pending KeyboardInterrupt) turned into the run's interrupt, after which it
/// saves a checkpoint and stops.
struct PyProgress {
    sink: Option<Py<PyAny>>,
    print: bool,
    interrupt: Arc<AtomicBool>,
    error: Option<PyErr>,
}

impl PyProgress {
    fn check(&mut self, py: Python<'_>) {
        if let Err(e) = py.check_signals() {
            self.interrupt.store(true, Ordering::SeqCst);
            self.error.get_or_insert(e);
        }
    }
}

impl transformer_train::runner::Progress for PyProgress {
    fn line(&mut self, line: &str) {
        Python::with_gil(|py| {
            let r = match (&self.sink, self.print) {
                (Some(f), _) => f.call1(py, (line,)).map(drop),
                (None, true) => (|| -> PyResult<()> {
                    let kwargs = PyDict::new(py);
                    kwargs.set_item("flush", true)?;
                    py.import("builtins")?
                        .getattr("print")?
                        .call((line,), Some(&kwargs))?;
                    Ok(())
                })(),
                (None, false) => Ok(()),
            };
            if let Err(e) = r {
                // A failing progress callable stops the run as Ctrl-C would.
                self.interrupt.store(true, Ordering::SeqCst);
                self.error.get_or_insert(e);
            }
            self.check(py);
        });
    }

    fn batch(&mut self, _epoch: usize, _done: usize, _total: usize) {
        Python::with_gil(|py| self.check(py));
    }
}

/// Trains a translation model (`task="mt"`, `transformer mt train`) or a language model
/// (`task="lm"`, `transformer lm train`); returns the run directory.
#[pyfunction]
#[pyo3(signature = (config=None, *, out=None, task="mt", resume=false, max_steps=None,
    device="cpu", progress=None))]
#[allow(clippy::too_many_arguments)]
fn train(
    py: Python<'_>,
    config: Option<&Bound<'_, PyAny>>,
    out: Option<PathBuf>,
    task: &str,
    resume: bool,
    max_steps: Option<i64>,
    device: &str,
    progress: Option<&Bound<'_, PyAny>>,
) -> PyResult<String> {
    use transformer_train::runner::RunOptions;
    let dev = open_device(device, 0)?;
    let (table, given, dict_out) = match config {
        Some(c) if !c.is_none() => config_table(c)?,
        _ => (toml::Table::new(), Vec::new(), None),
    };
    let out = out
        .or(dict_out)
        .unwrap_or_else(|| PathBuf::from(format!("runs/{task}")));
    let stop_after = max_steps
        .map(|m| {
            at_least(
                "max_steps",
                m,
                1,
                "it stops this call after that many steps",
            )
        })
        .transpose()?;
    let (sink, print) = match progress {
        None => (None, true),
        Some(p) if p.is_none() => (None, true),
        Some(p) => {
            if let Ok(b) = p.downcast::<pyo3::types::PyBool>() {
                (None, b.is_true())
            } else if p.is_callable() {
                (Some(p.clone().unbind()), false)
            } else {
                return Err(PyTypeError::new_err(
                    "progress must be True, False or a callable taking each log line",
                ));
            }
        }
    };
    let interrupt = Arc::new(AtomicBool::new(false));
    let mut reporter = PyProgress {
        sink,
        print,
        interrupt: interrupt.clone(),
        error: None,
    };
    let bad_key = |e: toml::de::Error| value_err(format!("config: {}", e.message()));
    enum Config {
        Mt(transformer_runtime::config::MtTrainConfig),
        Lm(transformer_train::lm::LmTrainConfig),
    }
    let cfg = match task {
        "mt" => Config::Mt(toml::Value::Table(table).try_into().map_err(bad_key)?),
        "lm" => Config::Lm(toml::Value::Table(table).try_into().map_err(bad_key)?),
        other => {
            return Err(value_err(format!(
                "task='{other}': 'mt' (translation) or 'lm' (language model)"
            )))
        }
    };
    if !resume {
        match &cfg {
            Config::Mt(c) => c.validate(),
            Config::Lm(c) => c.validate(),
        }
        .map_err(engine_err)?;
    }
    let out_dir = out.clone();
    let stopped = py.allow_threads(|| -> transformer_runtime::Result<Option<usize>> {
        macro_rules! make {
            ($config:expr) => {
                RunOptions {
                    config: $config,
                    out: out_dir.clone(),
                    resume,
                    stop_after_steps: stop_after,
                    crash_after_steps: None,
                    dist: transformer_train::dist::Dist::single(),
                    interrupt: Some(interrupt.clone()),
                    device: dev.clone(),
                    given: given.clone(),
                }
            };
        }
        Ok(match cfg {
            Config::Mt(c) => {
                let s = transformer_train::mt::train(&make!(c), &mut reporter)?;
                (!s.state.finished).then_some(s.state.step)
            }
            Config::Lm(c) => {
                let s = transformer_train::lm::train(&make!(c), &mut reporter)?;
                s.test_loss.is_none().then_some(s.step_losses.len())
            }
        })
    });
    if let Some(e) = reporter.error.take() {
        // Ctrl-C (or a failing progress callable): the checkpoint is saved; resume=True
        // continues.
        if e.is_instance_of::<PyKeyboardInterrupt>(py) {
            return Err(PyKeyboardInterrupt::new_err(format!(
                "training interrupted; the checkpoint is saved: train(..., out='{}', \
                 resume=True) continues",
                out.display().to_string()
            )));
        }
        return Err(e);
    }
    let stopped = stopped.map_err(engine_err)?;
    if let (Some(steps), true) = (stopped, print) {
        let line = format!(
            "stopped after {steps} steps; continue with train(..., out='{}', resume=True)",
            out.display().to_string()
        );
        py.import("builtins")?.getattr("print")?.call1((line,))?;
    }
    Ok(out.display().to_string())
}

/// The version of the Rust crates this module was built from.
const VERSION: &str = env!("CARGO_PKG_VERSION");

#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Translator>()?;
    m.add_class::<TranslationResult>()?;
    m.add_class::<Tokenizer>()?;
    m.add_class::<BleuScore>()?;
    m.add_class::<ChrfScore>()?;
    m.add_function(wrap_pyfunction!(corpus_bleu, m)?)?;
    m.add_function(wrap_pyfunction!(corpus_chrf, m)?)?;
    m.add_function(wrap_pyfunction!(train, m)?)?;
    m.add("__version__", VERSION)?;
    m.add("SACREBLEU_VERSION", score::SACREBLEU_VERSION)?;
    Ok(())
}
