//! [`train`]: resolving the configuration, reading the data, and running the task.

use super::*;
use crate::checkpoint::params_tensors;
use crate::error::{Error, Result};
use crate::optim::{Adam, NoamSchedule};
use crate::runner::{self, Progress, Trained};
use candle_core::Tensor;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Instant;
use transformer_model::DirectGrads;
use transformer_model::Precision;
use transformer_text::parallel::{keep_for_training, PairFilter, PairSource, Pairs};
use transformer_text::subword::{Subword, TextTokenizer};

/// Above this share of `<unk>` tokens in a fine-tuning run's training data (in percent),
/// the log warns that the inherited tokenizer does not fit the data.
pub const UNKNOWN_WARN_PERCENT: f64 = 1.0;

/// The settings that fix the model's shape and its tokenizer: a run started with
/// `--init-from` takes them from the run it starts from.
pub const MODEL_SHAPE_KEYS: &[&str] = &[
    "arch",
    "rnn_hidden",
    "tokenizer",
    "vocab_size",
    "share_embeddings",
    "d_model",
    "nhead",
    "encoder_layers",
    "decoder_layers",
    "dim_feedforward",
    "norm_first",
    "published",
];

/// `cfg` with the model's shape and tokenizer settings ([`MODEL_SHAPE_KEYS`]) of `from_cfg`,
/// the configuration of the run at `from`, and its dropout unless `given` sets one. A shape
/// setting in `given` that differs from that run's is an error that lists each one.
pub fn inherit_model(
    cfg: &MtTrainConfig,
    from_cfg: &MtTrainConfig,
    from: &Path,
    given: &[runner::Given],
) -> Result<MtTrainConfig> {
    let (mut merged, theirs) = (runner::toml_table(cfg), runner::toml_table(from_cfg));
    let show = |v: Option<&toml::Value>| v.map_or("none".to_string(), |v| v.to_string());
    let mut conflicts = Vec::new();
    let mut seen = HashSet::new();
    for g in given {
        if !seen.insert(&g.key) {
            continue;
        }
        if MODEL_SHAPE_KEYS.contains(&g.key.as_str()) && merged.get(&g.key) != theirs.get(&g.key) {
            let line = format!(
                "  {}: {} (that run has {} = {})",
                g.from,
                show(merged.get(&g.key)),
                g.key,
                show(theirs.get(&g.key))
            );
            conflicts.push(line);
        }
    }
    if !conflicts.is_empty() {
        return Err(Error::Usage(format!(
            "--init-from {}: the model's shape and tokenizer come from that run, and these \
             settings differ from it:\n{}\nDrop them to fine-tune that model (its {}), or \
             train a new model without --init-from.",
            from.display(),
            conflicts.join("\n"),
            MODEL_SHAPE_KEYS.join(", ")
        )));
    }
    let mut keys: Vec<&str> = MODEL_SHAPE_KEYS.to_vec();
    if !given.iter().any(|g| g.key == "dropout") {
        keys.push("dropout");
    }
    for key in keys {
        match theirs.get(key) {
            Some(v) => merged.insert(key.to_string(), v.clone()),
            None => merged.remove(key),
        };
    }
    toml::Value::Table(merged)
        .try_into()
        .map_err(|e: toml::de::Error| Error::Config {
            path: config_path(from),
            msg: e.to_string(),
        })
}

/// One training source's pairs, as the log reports them.
struct SourceCount {
    /// [`PairSource::describe`].
    name: String,
    /// Pairs read.
    read: usize,
    /// Of those, dropped as pairs of a held-out test set ([`CorpusFiles::exclude`]).
    excluded: usize,
}

/// `pairs` without those in `excluded` (both sides equal).
fn without(pairs: Pairs, excluded: &HashSet<(String, String)>) -> Pairs {
    let mut out = Pairs::default();
    for (s, t) in pairs.src.into_iter().zip(pairs.tgt) {
        if !excluded.contains(&(s.clone(), t.clone())) {
            out.src.push(s);
            out.tgt.push(t);
        }
    }
    out
}

/// `name: N pairs (K kept)` for each training source (with `E dropped as held-out test
/// pairs` where some were), `sizes` in reading order and `keep` the indices of the pairs
/// kept for training (ascending) among those not dropped.
fn per_source_counts(sizes: &[SourceCount], keep: &[usize]) -> String {
    let mut start = 0;
    let mut parts = Vec::with_capacity(sizes.len());
    for c in sizes {
        let end = start + c.read - c.excluded;
        let lo = keep.partition_point(|&i| i < start);
        let hi = keep.partition_point(|&i| i < end);
        let dropped = match c.excluded {
            0 => String::new(),
            e => format!(", {e} dropped as held-out test pairs"),
        };
        parts.push(format!(
            "{}: {} pairs ({} kept{dropped})",
            c.name,
            c.read,
            hi - lo
        ));
        start = end;
    }
    parts.join("; ")
}

/// Trains (or resumes) a run on the [`crate::runner`]; see the module docs for the loop and
/// the files.
pub fn train(opts: &MtTrainOptions, progress: &mut dyn Progress) -> Result<MtSummary> {
    // A fresh run's --init-from is read before the run directory is made: a run that cannot
    // start leaves nothing behind.
    let early = match (&opts.config.init_from, opts.resume) {
        (Some(from), false) => Some(load_init(from, &opts.device)?),
        _ => None,
    };
    let setup = MtSetup {
        early,
        init: None,
        device: opts.device.clone(),
        given: opts.given.clone(),
    };
    let (task, s) = runner::train(setup, opts, progress)?;
    Ok(MtSummary {
        state: s.state,
        test: task.test,
        step_losses: s.step_losses,
    })
}

/// The run at `from` that `--init-from` names, loaded to fine-tune.
fn load_init(from: &Path, device: &candle_core::Device) -> Result<LoadedMt> {
    load_run(from, &Execution::on(device)).map_err(|e| {
        Error::Usage(format!(
            "--init-from {}: {e} (give the directory of a finished `transformer mt \
             train` run)",
            from.display()
        ))
    })
}

// A run keeps its tokenizer (both languages) as `tokenizer.json`.
crate::runner::run_tokenizer_file!(Subword, tokenizer_path);

/// Reads the corpus of `cfg` and encodes it with `own` (a resumed run's tokenizer), else the
/// tokenizer of the run fine-tuned from (`init`), else one trained on the training pairs;
/// logs what it read (pairs kept, `<unk>` shares, sources, direction, held-out sets, and a
/// fine-tuning run's `<unk>` share under the inherited tokenizer).
fn read_data(
    cfg: &MtTrainConfig,
    own: Option<Subword>,
    init: Option<&(std::path::PathBuf, LoadedMt)>,
    progress: &mut dyn Progress,
) -> Result<MtData> {
    let files = cfg.sources()?;

    let t0 = Instant::now();
    // The sources one by one (the same pairs, in the same order, as `PairSource::read_all`),
    // to count each one's pairs.
    let excluded: HashSet<(String, String)> = {
        let p = PairSource::read_all(&files.exclude)?;
        p.src.into_iter().zip(p.tgt).collect()
    };
    let mut train_pairs = Pairs::default();
    let mut source_sizes = Vec::with_capacity(files.train.len());
    for source in &files.train {
        let mut pairs = source.read()?;
        let read = pairs.len();
        if !excluded.is_empty() {
            pairs = without(pairs, &excluded);
        }
        source_sizes.push(SourceCount {
            name: source.describe(),
            read,
            excluded: read - pairs.len(),
        });
        train_pairs.extend(pairs);
    }
    let tokenizer = match (own, init) {
        (Some(own), _) => own,
        (None, Some((_, loaded))) => loaded.tokenizer.clone(),
        (None, None) => {
            let texts = train_pairs.src.iter().chain(&train_pairs.tgt);
            let origin = files.train[0].first_file().to_path_buf();
            train_tokenizer(cfg.tokenizer, cfg.vocab_size, texts, &origin)?
        }
    };
    // A published model without a padding token of its own (a CTranslate2 conversion whose
    // source got one at import) has none on the target side, where batches need one.
    if tokenizer.as_published().is_some()
        && tokenizer.specials().pad as usize >= tokenizer.vocab_size()
    {
        return Err(Error::Usage(format!(
            "{}: the imported model has no padding token in its target vocabulary (a \
             CTranslate2 or Argos model converted without one), so it cannot be fine-tuned \
             here; translating and serving it work. Fine-tune the model it was converted from \
             (an OPUS-MT MarianMT directory has <pad>).",
            cfg.init_from
                .as_deref()
                .map_or_else(|| "the run".to_string(), |p| p.display().to_string())
        )));
    }
    let train_data = EncodedSplit::encode(train_pairs, &tokenizer);
    let mut valid = EncodedSplit::encode(files.valid.read()?, &tokenizer);
    if let Some(n) = cfg.max_valid {
        valid.truncate(n);
    }
    let (keep, stats) = keep_for_training(
        &train_data.src,
        &train_data.tgt,
        PairFilter::training(cfg.max_sentence_tokens),
    );
    if keep.is_empty() {
        return Err(Error::Usage(format!(
            "no training pairs left ({stats}); check the files, or raise max_sentence_tokens"
        )));
    }
    let vocab = tokenizer.vocab_size();
    let vocabulary = match tokenizer.as_published() {
        Some(_) => format!(
            "the imported model's own vocabularies ({} source, {vocab} target tokens)",
            tokenizer.source_vocab_size()
        ),
        None => format!("joint {} vocabulary {vocab}", cfg.tokenizer.describe()),
    };
    progress.line(&format!(
        "data: {stats}; validation {} pairs; {vocabulary} ({:.1}s)",
        valid.src.len(),
        t0.elapsed().as_secs_f64()
    ));
    let unk_share = |side: &[Vec<u32>]| {
        let total: usize = side.iter().map(Vec::len).sum();
        let unk = side
            .iter()
            .flatten()
            .filter(|&&i| i == tokenizer.specials().unk)
            .count();
        100.0 * unk as f64 / total.max(1) as f64
    };
    progress.line(&format!(
        "data: <unk> pieces in validation: source {:.2}%, target {:.2}%{}",
        unk_share(&valid.src),
        unk_share(&valid.tgt),
        match cfg.tokenizer {
            _ if tokenizer.as_published().is_some() => "",
            TokenizerKind::Bpe | TokenizerKind::Unigram => {
                " (characters without a piece; --tokenizer bpe-bytes or unigram-bytes spells them in bytes)"
            }
            _ => "",
        }
    ));
    if source_sizes.len() > 1 {
        progress.line(&format!(
            "data: training sources: {}",
            per_source_counts(&source_sizes, &keep)
        ));
    }
    match (cfg.language_pair(), cfg.reverse) {
        (Some((s, t)), true) => progress.line(&format!(
            "data: reversed (--reverse): every split's sides exchanged, translating {s} to {t}"
        )),
        (None, true) => progress.line(
            "data: reversed (--reverse): every split's sides exchanged, translating the \
             target files' language into the source files'",
        ),
        (Some((s, t)), false) => progress.line(&format!("data: translating {s} to {t}")),
        (None, false) => {}
    }
    if cfg.corpus == Some(Corpus::KoEnAll) && cfg.train_src.is_none() {
        let mut held = Vec::new();
        for (name, source) in ko_en_held_out(cfg) {
            held.push(format!("{name} {} pairs", source.read()?.len()));
        }
        progress.line(&format!(
            "data: held out for testing, not trained on: {} (mt::ko_en_test_sets)",
            held.join(", ")
        ));
    }
    if let Some((from, loaded)) = init {
        let unk = tokenizer.specials().unk;
        let total: usize = train_data
            .src
            .iter()
            .chain(&train_data.tgt)
            .map(Vec::len)
            .sum();
        let unknown = train_data
            .src
            .iter()
            .chain(&train_data.tgt)
            .flatten()
            .filter(|&&id| id == unk)
            .count();
        let share = 100.0 * unknown as f64 / total.max(1) as f64;
        progress.line(&format!(
            "init: weights and tokenizer from {} ({}); fresh Adam, this run's schedule; \
             <unk> in the training data under that tokenizer: {unknown} of {total} tokens \
             ({share:.2}%)",
            from.display(),
            loaded
                .note
                .clone()
                .unwrap_or_else(|| "its best.safetensors".into())
        ));
        if share > UNKNOWN_WARN_PERCENT {
            progress.line(&format!(
                "warning: {share:.2}% of the training tokens are <unk> (over \
                 {UNKNOWN_WARN_PERCENT}%): the inherited tokenizer does not cover this data's \
                 characters, and the model cannot learn or produce them; fine-tune from a run \
                 whose tokenizer was trained on text like this, or train from scratch"
            ));
        }
    }
    Ok(MtData {
        train: train_data,
        keep,
        valid,
        test_files: files.test,
        tokenizer,
    })
}

/// Translation's data, encoded: the training pairs and which of them train, the validation
/// pairs, the test set (read when testing), and the tokenizer that encoded them.
pub(super) struct MtData {
    train: EncodedSplit,
    keep: Vec<usize>,
    valid: EncodedSplit,
    test_files: Option<PairSource>,
    tokenizer: Subword,
}

/// Translation's start on the runner: the corpus read and encoded with the run's tokenizer
/// (trained on the training pairs, or a fine-tuned run's, inherited with its model's shape),
/// and the model, whose weights a fine-tuning run takes from the run it starts from.
struct MtSetup {
    /// `--init-from`, loaded before the run directory was made.
    early: Option<LoadedMt>,
    /// Fine-tuning: the run the weights and the tokenizer come from (a fresh run only; a
    /// resumed one continues from its own checkpoint and its own copy of the tokenizer).
    init: Option<(std::path::PathBuf, LoadedMt)>,
    /// The device a late `--init-from` loads onto.
    device: candle_core::Device,
    /// The settings given for this invocation, which a fine-tuning run's inherited shape
    /// must not contradict ([`inherit_model`]).
    given: Vec<runner::Given>,
}

impl runner::Setup for MtSetup {
    type Task = MtTask;
    type Tokenizer = Subword;
    type Data = MtData;

    fn data(
        &mut self,
        cfg: &mut MtTrainConfig,
        own: Option<Subword>,
        progress: &mut dyn Progress,
    ) -> Result<MtData> {
        // A resumed run (its own tokenizer given) continues from its own checkpoint.
        if let (Some(from), None) = (cfg.init_from.clone(), &own) {
            let loaded = match self.early.take() {
                Some(l) => l,
                None => load_init(&from, &self.device)?,
            };
            if let Some(note) = &loaded.note {
                progress.line(&format!("init: {note}"));
            }
            if loaded.model.decode_precision() != transformer_model::DecodePrecision::F32 {
                progress.line(&format!(
                    "init: {} holds int8 weights (written by `transformer mt quantize`): \
                     training starts from their values as rounded to int8, not from the \
                     f32 weights they were made from (--init-from the run that was quantized \
                     starts from those)",
                    from.display()
                ));
            }
            *cfg = inherit_model(cfg, &loaded.config, &from, &self.given)?;
            self.init = Some((from, loaded));
        }
        cfg.validate()?;
        read_data(cfg, own, self.init.as_ref(), progress)
    }

    fn tokenizer(data: &MtData) -> &Subword {
        &data.tokenizer
    }

    /// bf16 only where it measures faster here (fresh Transformer runs; a resumed run keeps
    /// its choice; the recurrent models train in f32).
    fn model(
        &self,
        cfg: &MtTrainConfig,
        data: &MtData,
    ) -> Result<runner::ModelPlan<MtModelConfig>> {
        let vocab = data.tokenizer.vocab_size();
        let recurrent = matches!(cfg.arch, Arch::Gru | Arch::GruDot | Arch::GruBahdanau);
        Ok(runner::ModelPlan {
            config: match &self.init {
                Some((_, loaded)) => loaded.model_config.clone(),
                None => cfg.model_config(vocab),
            },
            probe: (!recurrent).then(|| runner::PrecisionProbe {
                // The output layer runs on a batch's target tokens (at most the token budget).
                rows: cfg.max_tokens.min(2048),
                d_model: cfg.d_model,
                vocab,
                covers: BF16_COVERS,
            }),
            precision_note: (recurrent && cfg.precision == Precision::Bf16).then(|| {
                "precision: bf16 covers the Transformer's output layer only: training in f32"
                    .to_string()
            }),
        })
    }

    fn model_lines(&self, _: &MtTrainConfig, trained: &Trained<MtModelConfig>) -> Vec<String> {
        let arch = trained.config.arch();
        vec![arch.describe(trained.params.num_elements())]
    }

    fn task(
        self,
        cfg: MtTrainConfig,
        data: MtData,
        trained: Trained<MtModelConfig>,
        device: &candle_core::Device,
    ) -> Result<MtTask> {
        if let Some((from, loaded)) = &self.init {
            let tensors: HashMap<String, Tensor> =
                params_tensors(&loaded.params).into_iter().collect();
            trained
                .params
                .assign(&tensors)
                .map_err(|e| Error::Checkpoint {
                    path: from.clone(),
                    msg: e.to_string(),
                })?;
        }
        let vars = trained.params.vars();
        Ok(MtTask {
            opt: Adam::new(vars.clone(), 0.0)?,
            direct: DirectGrads::new(),
            schedule: NoamSchedule {
                d_model: cfg.d_model,
                warmup: cfg.warmup,
                factor: cfg.lr_factor,
            },
            vars,
            trained,
            tokenizer: data.tokenizer,
            train: data.train,
            keep: data.keep,
            valid: data.valid,
            test_files: data.test_files,
            device: device.clone(),
            batches: Vec::new(),
            test: None,
            cfg,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::RunConfig;

    #[test]
    fn per_source_counts_split_the_kept_pairs_by_source() {
        let count = |name: &str, read, excluded| SourceCount {
            name: name.into(),
            read,
            excluded,
        };
        let sizes = [count("a", 3, 0), count("b", 0, 0), count("c", 6, 2)];
        // Pairs 0..3 are a's, 3..7 c's (2 of its 6 dropped before); 1 and 5 were skipped.
        let keep = [0, 2, 3, 4, 6];
        assert_eq!(
            per_source_counts(&sizes, &keep),
            "a: 3 pairs (2 kept); b: 0 pairs (0 kept); c: 6 pairs (3 kept, 2 dropped as \
             held-out test pairs)"
        );
        let mut p = Pairs::default();
        for (s, t) in [("x", "1"), ("y", "2"), ("x", "2")] {
            p.src.push(s.into());
            p.tgt.push(t.into());
        }
        let drop: HashSet<(String, String)> = [("x".to_string(), "1".to_string())].into();
        let left = without(p, &drop);
        assert_eq!(left.src, ["y", "x"]);
        assert_eq!(left.tgt, ["2", "2"]);
    }

    #[test]
    fn reverse_follows_into_the_language_codes_and_explicit_codes_win() {
        let mut cfg = MtTrainConfig {
            corpus: Some(Corpus::KoEn),
            reverse: true,
            ..MtTrainConfig::default()
        };
        assert_eq!(cfg.language_pair(), Some(("en".into(), "ko".into())));
        cfg.src_lang = Some("en-GB".into());
        assert_eq!(cfg.language_pair(), Some(("en-GB".into(), "ko".into())));
        let toml = cfg.to_toml();
        assert!(toml.contains("reverse = true"), "{toml}");
        assert_eq!("ko-en-all".parse::<Corpus>(), Ok(Corpus::KoEnAll));
        assert!(toml::from_str::<MtTrainConfig>("corpus = \"ko-en-all\"").is_ok());
    }
}
