//! The model side of the server: the loaded runs, and one worker thread that translates what
//! the requests queue, the requests that arrive together in one batch.
//!
//! Requests never touch a model. A handler tokenizes its text, checks it against the
//! model's length limit and the queue's bound, and sends a job; the worker takes the
//! first job waiting, gathers every job that arrives within the batching window (up to a
//! number of sentences), and translates each language pair's sentences in one call of
//! [`translate`], which sorts them by length and cuts them into batches under
//! a row budget, as `mt translate` does with a file. Each job gets its own sentences' n-best
//! lists back through a one-shot channel. One worker is enough: the model's kernels already
//! use every core the process is given.

use anyhow::{bail, Context};
use candle_core::Device;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use transformer_decode::{DecodeOptions, Hypothesis};
use transformer_model::DecodePrecision;
use transformer_runtime::attention::attention_of;
use transformer_runtime::config::is_language_code;
use transformer_runtime::load::{load_run, Execution};
use transformer_runtime::model::{Arch, MtDecoder, MtModel};
use transformer_runtime::translate::{translate, DecodeRequest};
use transformer_runtime::viz::AttentionSet;
use transformer_text::subword::{Subword, TextTokenizer};

/// One `--run` of `transformer serve`: a run directory and, optionally, the language codes
/// it translates between (`de:en=runs/de-en`); without them the run's own are used.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpec {
    /// Source and target codes given on the command line.
    pub codes: Option<(String, String)>,
    /// The run directory.
    pub run: PathBuf,
}

impl std::str::FromStr for RunSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        // `SRC:TGT=DIR`; a plain path otherwise (a path may hold `=` or `:` too, so only a
        // prefix of two valid codes counts).
        if let Some((codes, dir)) = s.split_once('=') {
            if let Some((src, tgt)) = codes.split_once(':') {
                if is_language_code(src) && is_language_code(tgt) {
                    if dir.is_empty() {
                        return Err(format!("{s:?}: give the run directory after '='"));
                    }
                    if src == tgt {
                        return Err(format!(
                            "{s:?}: the source and the target are both {src}: name the \
                             languages the run translates from and to (as de:en={dir})"
                        ));
                    }
                    return Ok(RunSpec {
                        codes: Some((src.to_string(), tgt.to_string())),
                        run: PathBuf::from(dir),
                    });
                }
            }
        }
        if s.is_empty() {
            return Err("give a run directory (DIR, or SRC:TGT=DIR as de:en=runs/de-en)".into());
        }
        Ok(RunSpec {
            codes: None,
            run: PathBuf::from(s),
        })
    }
}

/// How the engine decodes and batches.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Beam size for every run (`None`: each run's own, 5 by default).
    pub beam: Option<usize>,
    /// How long the worker waits, after the first job of a batch, for more to join it.
    pub batch_wait: Duration,
    /// Sentences per batch at most (the worker stops gathering there).
    pub max_batch_sentences: usize,
    /// Sentences queued or in translation at most; more are refused (HTTP 429).
    pub max_queue: usize,
    /// Where the models run.
    pub device: Device,
    /// The arithmetic of decoding's products (int8 or f32); `None`: each run's own.
    pub precision: Option<DecodePrecision>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            beam: None,
            batch_wait: Duration::from_millis(2),
            max_batch_sentences: 256,
            max_queue: 4096,
            device: Device::Cpu,
            precision: None,
        }
    }
}

/// A language pair served by one run.
pub struct Pair {
    /// Source language code.
    pub src: String,
    /// Target language code.
    pub tgt: String,
    /// The run directory it was loaded from.
    pub run: PathBuf,
    /// The run's tokenizer (both languages).
    pub tokenizer: Arc<Subword>,
    /// Whether the tokenizer spells text character by character (subwords), so that a
    /// character it reads as `<unk>` is one the model cannot spell; not so for words.
    pub spells_characters: bool,
    /// How its sentences are decoded.
    pub opts: DecodeOptions,
    /// The longest source, in tokens, whose translation stays within the model's positions.
    pub max_source_tokens: usize,
    /// The model's name (transformer, gru-bahdanau, ...).
    pub arch: Arch,
    /// How a published model's own engine makes its translations around the search (an
    /// Argos package's run replaces unknown tokens: the text follows them).
    pub rules: transformer_runtime::model::EngineRules,
    /// The source's and target's language names as a published model gives them (an Argos
    /// package's metadata); `None`: the names of the codes.
    pub names: Option<(String, String)>,
    /// What decoding was prepared with (f32 or int8, and the kernel), for the log.
    pub decoding: String,
}

/// The work of one request on one language pair.
enum Work {
    /// Translate these token sequences (each non-empty); returns each one's n-best list.
    Translate(Vec<Vec<u32>>),
    /// The attention of one sentence (its tokens) in its translation: `hyp`, or when `None`
    /// the one decoded here.
    Attention {
        /// The sentence as given.
        sentence: String,
        /// Its tokens.
        ids: Vec<u32>,
        /// Its translation's tokens, when already decoded.
        hyp: Option<Vec<u32>>,
    },
}

/// What a [`Work`] gives back.
enum Done {
    /// Per sentence, its hypotheses, best first.
    Translated(Vec<Vec<Hypothesis>>),
    /// The sentence's translation and every attention in it.
    Attention(Box<AttentionSet>),
}

/// Why a job was not done.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineError {
    /// The queue holds `pending` sentences; this job's would pass `limit`.
    Busy {
        /// Sentences queued or in translation now.
        pending: usize,
        /// The bound (`--max-queue`).
        limit: usize,
    },
    /// The server is shutting down.
    Stopped,
    /// The model failed (a bug or an exhausted resource): the message.
    Failed(String),
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::Busy { pending, limit } => write!(
                f,
                "the translation queue holds {pending} sentences (at most {limit}); try again shortly"
            ),
            EngineError::Stopped => write!(f, "the server is shutting down"),
            EngineError::Failed(m) => write!(f, "translation failed: {m}"),
        }
    }
}

struct Job {
    pair: usize,
    work: Work,
    /// Sentences it counts for in the queue.
    weight: usize,
    reply: oneshot::Sender<Result<Done, EngineError>>,
}

/// The loaded runs and the worker translating for them.
pub struct Engine {
    pairs: Vec<Pair>,
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    pending: Arc<AtomicUsize>,
    max_queue: usize,
    worker: Mutex<Option<JoinHandle<()>>>,
    batches: Arc<AtomicUsize>,
}

/// The longest source (tokens, before `<eos>`) whose translation fits `positions` positions
/// under `opts`' length bound: the source plus `<eos>`, and the output's `<bos>`, tokens and
/// `<eos>`, each within the positional encoding.
fn max_source_tokens(positions: usize, opts: &DecodeOptions) -> usize {
    let mut n = positions.saturating_sub(1);
    // An engine's rules cap the output at the positions themselves, whatever the source.
    if opts.rules != transformer_decode::SearchRules::Native {
        return n;
    }
    while n > 0 && opts.max_len(n) + 2 > positions {
        n -= 1;
    }
    n
}

impl Engine {
    /// Loads every run (its best weights) and starts the worker. Fails on a run that cannot
    /// be loaded, has no language codes, or repeats a pair.
    pub fn load(specs: &[RunSpec], opts: &EngineOptions) -> anyhow::Result<Engine> {
        if specs.is_empty() {
            bail!("give at least one run to serve (--run DIR)");
        }
        let mut pairs = Vec::new();
        let mut models = Vec::new();
        for spec in specs {
            let how = Execution {
                device: opts.device.clone(),
                decoding: opts.precision,
                restrict_vocab: false,
            };
            // A published model (an Argos package, a CTranslate2 directory) is imported
            // into a temporary run first.
            let (dir, _imported) = transformer_runtime::import::as_run(&spec.run)
                .with_context(|| format!("cannot serve {}", spec.run.display()))?;
            let run = load_run(&dir, &how)
                .with_context(|| format!("cannot serve {}", spec.run.display()))?;
            let (src, tgt) = match spec.codes.clone().or_else(|| run.config.language_pair()) {
                Some(c) => c,
                None => bail!(
                    "{}: the run records no language codes (it was trained from files without \
                     --src-lang/--tgt-lang): name them, as --run de:en={}",
                    spec.run.display(),
                    spec.run.display()
                ),
            };
            if src == tgt {
                bail!(
                    "{}: the run records {src} as both its source and its target language: \
                     name the languages it translates from and to, as --run SRC:TGT={}",
                    spec.run.display(),
                    spec.run.display()
                );
            }
            if let Some(p) = pairs.iter().find(|p: &&Pair| p.src == src && p.tgt == tgt) {
                bail!(
                    "{src} -> {tgt} is served twice ({} and {}): give one run per pair",
                    p.run.display(),
                    spec.run.display()
                );
            }
            let beam = opts.beam.unwrap_or(run.config.beam);
            if beam == 0 {
                bail!("--beam must be at least 1 (1 = greedy)");
            }
            let dopts = run.config.decode_options(beam);
            // The recurrent models have no positional limit; keep their work bounded.
            let positions = run.model_config.arch().max_positions().unwrap_or(1024);
            pairs.push(Pair {
                // Filled in by the worker once it has prepared its decoders.
                decoding: String::new(),
                src,
                tgt,
                run: spec.run.clone(),
                spells_characters: !run.tokenizer.is_words(),
                names: run
                    .config
                    .published
                    .as_ref()
                    .and_then(|p| p.language_names.clone()),
                rules: run.model.engine_rules().clone(),
                tokenizer: Arc::new(run.tokenizer),
                opts: dopts,
                max_source_tokens: max_source_tokens(positions, &dopts),
                arch: run.config.arch,
            });
            models.push(run.model);
        }
        let (tx, rx) = mpsc::channel::<Job>();
        let pending = Arc::new(AtomicUsize::new(0));
        let batches = Arc::new(AtomicUsize::new(0));
        let (ready_tx, ready_rx) = mpsc::channel();
        let worker = {
            let ctx = WorkerCtx {
                models,
                tokenizers: pairs.iter().map(|p| p.tokenizer.clone()).collect(),
                requests: pairs.iter().map(|p| DecodeRequest::new(p.opts)).collect(),
                archs: pairs.iter().map(|p| p.arch).collect(),
                device: opts.device.clone(),
                batch_wait: opts.batch_wait,
                max_batch: opts.max_batch_sentences.max(1),
                pending: pending.clone(),
                batches: batches.clone(),
            };
            std::thread::Builder::new()
                .name("translate".into())
                .spawn(move || ctx.run(rx, ready_tx))
                .context("cannot start the translation thread")?
        };
        // The worker prepares each run's decoding weights once (transposed, or quantized to
        // int8) and says what it prepared.
        let described = ready_rx
            .recv()
            .map_err(|_| anyhow::anyhow!("the translation thread ended at start"))?
            .map_err(|e| anyhow::anyhow!("cannot prepare decoding: {e}"))?;
        for (p, d) in pairs.iter_mut().zip(described) {
            p.decoding = d;
        }
        Ok(Engine {
            pairs,
            tx: Mutex::new(Some(tx)),
            pending,
            max_queue: opts.max_queue.max(1),
            worker: Mutex::new(Some(worker)),
            batches,
        })
    }

    /// The pairs served, in the order of the runs given.
    pub fn pairs(&self) -> &[Pair] {
        &self.pairs
    }

    /// The index of the pair `src -> tgt`.
    pub fn find(&self, src: &str, tgt: &str) -> Option<usize> {
        self.pairs.iter().position(|p| p.src == src && p.tgt == tgt)
    }

    /// Sentences queued or in translation now.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }

    /// Batches the worker has run.
    pub fn batches(&self) -> usize {
        self.batches.load(Ordering::SeqCst)
    }

    /// Translates `items` (token sequences, each non-empty) with pair `pair`: each one's
    /// n-best list, best first.
    pub async fn translate(
        &self,
        pair: usize,
        items: Vec<Vec<u32>>,
    ) -> Result<Vec<Vec<Hypothesis>>, EngineError> {
        match self.run(pair, Work::Translate(items)).await? {
            Done::Translated(h) => Ok(h),
            Done::Attention(_) => Err(EngineError::Failed("the worker answered other work".into())),
        }
    }

    /// Every attention of `sentence` (tokens `ids`) in its translation: `hyp`, or when
    /// `None` the one decoded here.
    pub async fn attention(
        &self,
        pair: usize,
        sentence: String,
        ids: Vec<u32>,
        hyp: Option<Vec<u32>>,
    ) -> Result<AttentionSet, EngineError> {
        match self
            .run(pair, Work::Attention { sentence, ids, hyp })
            .await?
        {
            Done::Attention(s) => Ok(*s),
            Done::Translated(_) => {
                Err(EngineError::Failed("the worker answered other work".into()))
            }
        }
    }

    /// Queues `work` for pair `pair` and waits for it. Refused at once when the queue would
    /// pass its bound.
    async fn run(&self, pair: usize, work: Work) -> Result<Done, EngineError> {
        let weight = match &work {
            Work::Translate(items) => items.len().max(1),
            Work::Attention { .. } => 1,
        };
        // Reserve the queue space first, so that concurrent requests cannot pass the bound.
        let mut now = self.pending.load(Ordering::SeqCst);
        loop {
            if now > 0 && now + weight > self.max_queue {
                return Err(EngineError::Busy {
                    pending: now,
                    limit: self.max_queue,
                });
            }
            match self.pending.compare_exchange(
                now,
                now + weight,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => break,
                Err(v) => now = v,
            }
        }
        let (reply, rx) = oneshot::channel();
        let job = Job {
            pair,
            work,
            weight,
            reply,
        };
        let sent = match self.tx.lock().expect("engine lock").as_ref() {
            Some(tx) => tx.send(job).is_ok(),
            None => false,
        };
        if !sent {
            self.pending.fetch_sub(weight, Ordering::SeqCst);
            return Err(EngineError::Stopped);
        }
        rx.await.unwrap_or(Err(EngineError::Stopped))
    }

    /// Stops taking jobs, lets the worker finish those queued, and waits for it.
    pub fn shutdown(&self) {
        self.tx.lock().expect("engine lock").take();
        if let Some(w) = self.worker.lock().expect("engine lock").take() {
            let _ = w.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

struct WorkerCtx {
    models: Vec<MtModel>,
    tokenizers: Vec<Arc<Subword>>,
    requests: Vec<DecodeRequest>,
    archs: Vec<Arch>,
    device: Device,
    batch_wait: Duration,
    max_batch: usize,
    pending: Arc<AtomicUsize>,
    batches: Arc<AtomicUsize>,
}

impl WorkerCtx {
    fn run(self, rx: mpsc::Receiver<Job>, ready: mpsc::Sender<Result<Vec<String>, String>>) {
        let decoders = match self
            .models
            .iter()
            .map(|m| m.decoder())
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(d) => d,
            Err(e) => {
                let _ = ready.send(Err(e.to_string()));
                return;
            }
        };
        let _ = ready.send(Ok(decoders.iter().map(|d| d.describe()).collect()));
        while let Ok(first) = rx.recv() {
            let mut size = first.weight;
            let mut jobs = vec![first];
            let deadline = Instant::now() + self.batch_wait;
            while size < self.max_batch {
                let left = deadline.saturating_duration_since(Instant::now());
                let next = if left.is_zero() {
                    rx.try_recv().ok()
                } else {
                    rx.recv_timeout(left).ok()
                };
                match next {
                    Some(j) => {
                        size += j.weight;
                        jobs.push(j);
                    }
                    None => break,
                }
            }
            self.batches.fetch_add(1, Ordering::SeqCst);
            self.run_batch(&decoders, jobs);
        }
    }

    /// Runs one batch of jobs: every pair's translations together, attention jobs one by
    /// one. A failure (even a panic) answers the jobs it concerns and leaves the worker up.
    fn run_batch(&self, decoders: &[MtDecoder<'_>], jobs: Vec<Job>) {
        let mut by_pair: Vec<Vec<(Job, Vec<Vec<u32>>)>> =
            (0..self.models.len()).map(|_| Vec::new()).collect();
        let mut single = Vec::new();
        for mut job in jobs {
            match std::mem::replace(&mut job.work, Work::Translate(Vec::new())) {
                Work::Translate(items) => by_pair[job.pair].push((job, items)),
                w @ Work::Attention { .. } => {
                    job.work = w;
                    single.push(job);
                }
            }
        }
        for (pair, group) in by_pair.into_iter().enumerate() {
            if group.is_empty() {
                continue;
            }
            let all: Vec<Vec<u32>> = group.iter().flat_map(|(_, i)| i.iter().cloned()).collect();
            let result = guarded(|| {
                translate(
                    &decoders[pair],
                    &all,
                    &self.requests[pair],
                    &self.device,
                    |_, _| {},
                )
                .map_err(|e| e.to_string())
            });
            match result {
                Ok(hyps) => {
                    let mut hyps = hyps.into_iter();
                    for (job, items) in group {
                        let mine: Vec<Vec<Hypothesis>> = hyps.by_ref().take(items.len()).collect();
                        self.answer(job, Ok(Done::Translated(mine)));
                    }
                }
                Err(e) => {
                    for (job, _) in group {
                        self.answer(job, Err(EngineError::Failed(e.clone())));
                    }
                }
            }
        }
        for job in single {
            let result = match &job.work {
                Work::Attention { sentence, ids, hyp } => guarded(|| {
                    self.attention(job.pair, &decoders[job.pair], sentence, ids, hyp.as_deref())
                        .map(|s| Done::Attention(Box::new(s)))
                }),
                Work::Translate(_) => unreachable!("translations are grouped above"),
            };
            self.answer(job, result.map_err(EngineError::Failed));
        }
    }

    /// The attention of `sentence` (tokens `ids`) in its translation `hyp`, or in the one
    /// decoded here when `hyp` is `None`.
    fn attention(
        &self,
        pair: usize,
        decoder: &MtDecoder<'_>,
        sentence: &str,
        ids: &[u32],
        hyp: Option<&[u32]>,
    ) -> Result<AttentionSet, String> {
        let decoded;
        let hyp = match hyp {
            Some(h) => h,
            None => {
                decoded = translate(
                    decoder,
                    std::slice::from_ref(&ids.to_vec()),
                    &self.requests[pair],
                    &self.device,
                    |_, _| {},
                )
                .map_err(|e| e.to_string())?
                .remove(0)
                .remove(0)
                .tokens;
                &decoded
            }
        };
        attention_of(
            decoder.model(),
            &self.tokenizers[pair],
            self.archs[pair],
            sentence,
            ids,
            hyp,
            &self.device,
        )
        .map_err(|e| e.to_string())
    }

    fn answer(&self, job: Job, result: Result<Done, EngineError>) {
        self.pending.fetch_sub(job.weight, Ordering::SeqCst);
        // The client may have gone: then nobody reads the answer, which is fine.
        let _ = job.reply.send(result);
    }
}

/// Runs `f`, turning a panic into an error message.
fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic in the model".into())),
    }
}

/// A pair's tokens of `text`, or why it cannot be translated: more tokens than the model
/// takes.
pub fn encode_checked(pair: &Pair, text: &str) -> Result<Vec<u32>, usize> {
    let ids = pair.tokenizer.encode(text);
    if ids.len() > pair.max_source_tokens {
        return Err(ids.len());
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_specs_take_codes_or_a_plain_path() {
        let s: RunSpec = "de:en=runs/de-en".parse().unwrap();
        assert_eq!(s.codes, Some(("de".into(), "en".into())));
        assert_eq!(s.run, PathBuf::from("runs/de-en"));
        let s: RunSpec = "runs/a=b".parse().unwrap();
        assert_eq!((s.codes, s.run), (None, PathBuf::from("runs/a=b")));
        let s: RunSpec = "pt-BR:en=r".parse().unwrap();
        assert_eq!(s.codes, Some(("pt-BR".into(), "en".into())));
        assert!("de:en=".parse::<RunSpec>().is_err());
        let same = "de:de=runs/de-en".parse::<RunSpec>().unwrap_err();
        assert!(same.contains("both de"), "{same}");
        assert!("".parse::<RunSpec>().is_err());
    }

    #[test]
    fn the_source_limit_keeps_the_output_within_the_positions() {
        let opts = DecodeOptions::default(); // 1.2 * S + 10
        let n = max_source_tokens(1024, &opts);
        assert!(opts.max_len(n) + 2 <= 1024);
        assert!(opts.max_len(n + 1) + 2 > 1024);
    }
}
