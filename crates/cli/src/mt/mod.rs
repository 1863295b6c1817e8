//! `transformer mt ...`: translation with an encoder-decoder Transformer.

use crate::console::Console;
use anyhow::{bail, Context, Result};
use candle_core::Device;
use clap::{Args, Subcommand};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;
use transformer_runtime::attention::attention_set;
use transformer_runtime::config::{Corpus, MtPreset, MtTrainConfig, TokenizerKind};
use transformer_runtime::load::{load_run, Execution, LoadedMt};
use transformer_runtime::model::{Arch, MtDecoder};
use transformer_runtime::translate::{over_long_lines, translate_lines, DecodeRequest, Truncated};
use transformer_runtime::viz;
use transformer_train::mt;
use transformer_train::runner::{Given, Progress};

mod eval;
pub use eval::EvalArgs;

#[derive(Subcommand)]
pub enum MtCommand {
    /// Train a translation model: joint BPE tokens, Adam with warm-up, label smoothing;
    /// validation loss, perplexity and BLEU every epoch; beam-search BLEU on the test set.
    Train(Box<TrainArgs>),
    /// Translate sentences, one per line (stdin, or --src FILE), to stdout in the same order.
    Translate(TranslateArgs),
    /// Translate a file and score it against references: BLEU and chrF (sacreBLEU's
    /// defaults) and lowercased-token BLEU.
    Eval(EvalArgs),
    /// Show attention: a heatmap (SVG) of which source tokens each target token attends to,
    /// and an HTML page to explore every layer and head of a translation.
    Attention(AttentionArgs),
    /// Write a copy of a run with its weight matrices in int8 (one scale per row; a quarter
    /// of the f32 size on disk); translate, eval, attention, bench mt-decode and serve load
    /// it as any run and decode it in int8.
    Quantize(QuantizeArgs),
    /// Learn a run's vocabulary map from its training pairs (`vocab_map.json` in the run):
    /// for each source token the target tokens it is translated by, and the most frequent
    /// ones; decoding with --restrict-vocab scores only a batch's candidates.
    VocabMap(VocabMapArgs),
}

#[derive(Args)]
#[command(
    after_help = "Example:\n  transformer mt vocab-map --run runs/de-en\n  transformer mt eval --run runs/de-en --test-set test --restrict-vocab"
)]
pub struct VocabMapArgs {
    /// The trained run (its config.toml names the training pairs).
    #[arg(long)]
    run: PathBuf,
    /// Candidates per source token.
    #[arg(long, default_value_t = 20)]
    per_source: usize,
    /// The most frequent target tokens, candidates for every sentence.
    #[arg(long, default_value_t = 500)]
    frequent: usize,
}

#[derive(Args)]
#[command(
    after_help = "Example:\n  transformer mt quantize --run runs/de-en --out runs/de-en-int8\n  echo \"Ein Mann fährt Fahrrad.\" | transformer mt translate --run runs/de-en-int8"
)]
pub struct QuantizeArgs {
    /// The trained run to quantize (its best weights).
    #[arg(long)]
    run: PathBuf,
    /// A new directory for the int8 run.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
#[command(
    after_help = "Examples:\n  transformer mt attention --run runs/de-en --src \"Ein Mann fährt Fahrrad.\" --out attention.svg\n  transformer mt attention --run runs/de-en --src \"Ein Mann fährt Fahrrad.\" --layer 2 --head 5 --out l2h5.svg\n  transformer mt attention --run runs/de-en --src \"Ein Mann fährt Fahrrad.\" --html attention.html\n\nFor the Transformer the heatmap is the encoder-decoder attention of one decoder layer\n(default: the last) averaged over its heads, or one --head; for gru-dot and gru-bahdanau\nit is their attention over the source. Open the SVG or HTML file in a browser."
)]
pub struct AttentionArgs {
    #[command(flatten)]
    decode: DecodeArgs,
    /// The sentence to translate (the source language).
    #[arg(long)]
    src: String,
    #[command(flatten)]
    picture: crate::lm::PictureArgs,
}

/// The heatmap of `set`'s encoder-decoder attention at `layer` and `head` (1-based; `None`:
/// the last layer, the heads averaged).
fn cross_heatmap(
    set: &viz::AttentionSet,
    layer: Option<usize>,
    head: Option<usize>,
) -> Result<viz::Heatmap> {
    let (values, which) =
        viz::select_map(&set.cross, layer, head).map_err(|e| anyhow::anyhow!("--{e}"))?;
    let which = match set.model.as_str() {
        "transformer" => format!("encoder-decoder attention, {which}"),
        m => format!("{m} attention"),
    };
    Ok(viz::Heatmap {
        title: format!(
            "{which}: \u{201c}{}\u{201d} \u{2192} \u{201c}{}\u{201d}",
            set.source, set.translation
        ),
        rows: set.tgt_out_tokens.clone(),
        cols: set.src_tokens.clone(),
        values,
        scale: viz::Scale::Unit,
        row_axis: "output token".into(),
        col_axis: "source token".into(),
    })
}

#[derive(Args)]
#[command(
    after_help = "Examples:\n  transformer mt train --corpus multi30k-de-en --out runs/de-en\n  transformer mt train --corpus ko-en --out runs/ko-en\n  transformer mt train --corpus ko-en-all --reverse --out runs/en-ko-all\n  transformer mt train --corpus ko-en-all --init-from runs/ko-en --warmup 100 --epochs 5 --out runs/ko-en-ft\n  transformer mt train --corpus multi30k-de-en --arch gru-bahdanau --epochs 10 --out runs/gru-bahdanau\n  transformer mt train --train-src train.de --train-tgt train.en --valid-src val.de --valid-tgt val.en --out runs/mine\n  transformer mt train --out runs/de-en --resume      # continue after an interruption\n  transformer mt train --corpus multi30k-de-en --out runs/quick --epochs 1 --max-batches 50"
)]
pub struct TrainArgs {
    /// A bundled corpus read from --data: multi30k-de-en, ko-en (Tatoeba + JHE, 7,189
    /// pairs), or ko-en-all (every Korean-English pair not held out for testing: ko-en plus
    /// the Python docs, LibreOffice and Korean PUD; see docs/MT.md).
    #[arg(long)]
    corpus: Option<Corpus>,
    /// Exchange source and target in every split: --corpus ko-en or ko-en-all then trains
    /// English to Korean (the language codes recorded for `transformer serve` follow). Fixed
    /// for the run's life (not changeable on --resume).
    #[arg(long)]
    reverse: bool,
    /// Fine-tune: start from a trained run's weights (its best.safetensors) and tokenizer
    /// (copied; the vocabulary cannot change). The model's shape comes from that run, and
    /// flags that would change it are refused; the warm-up, learning rate, data and epochs
    /// are this run's, and Adam starts afresh. The log says how many training tokens are
    /// <unk> under the inherited tokenizer.
    #[arg(long, value_name = "RUN_DIR")]
    init_from: Option<PathBuf>,
    /// Folder holding the bundled corpora (multi30k/, ko-en/) [default: ../shared/data]
    #[arg(long)]
    data: Option<PathBuf>,
    /// Training source sentences, one per line (.gz read as gzip).
    #[arg(long)]
    train_src: Option<PathBuf>,
    /// Training target sentences, line i translating line i of --train-src.
    #[arg(long)]
    train_tgt: Option<PathBuf>,
    /// Validation source sentences, one per line: loss, perplexity and BLEU every epoch choose
    /// the best model.
    #[arg(long)]
    valid_src: Option<PathBuf>,
    /// Validation target sentences, line i translating line i of --valid-src.
    #[arg(long)]
    valid_tgt: Option<PathBuf>,
    /// Test source sentences: translated with beam search by the best model at the end
    /// (into test.hyp in the run directory) and scored.
    #[arg(long)]
    test_src: Option<PathBuf>,
    /// Test target sentences, line i translating line i of --test-src.
    #[arg(long)]
    test_tgt: Option<PathBuf>,
    /// The language of the source files (--train-src ...), ISO 639-1 as de; the run
    /// records the languages it translates from and to for `transformer serve`, so with
    /// --reverse it translates into this language [default: the corpus's, de for
    /// multi30k-de-en, ko for ko-en]
    #[arg(long)]
    src_lang: Option<String>,
    /// The language of the target files (--train-tgt ...), as en; into Korean (ko) the best
    /// model is chosen by validation chrF instead of BLEU [default: the corpus's]
    #[arg(long)]
    tgt_lang: Option<String>,
    /// Run directory for config, tokenizer, checkpoints, metrics and the loss plot.
    #[arg(long, default_value = "runs/mt")]
    out: PathBuf,
    /// Continue the run in --out from its last checkpoint, from any directory. Flags given
    /// with it may change how long the run trains (--epochs, --max-batches), what it logs and
    /// validates, how it decodes the test set, and where its data lies; the model, tokenizer,
    /// optimizer and seed are the run's own, and changing them is an error that lists them.
    #[arg(long)]
    resume: bool,
    /// TOML file with any of the settings: the keys are the flags' names with underscores
    /// (d_model = 256, train_src = "train.de"), except --layers (encoder_layers and
    /// decoder_layers), --no-share-embeddings (share_embeddings = false),
    /// --no-precision-check (measure_precision = false) and --preset (no key); keys without a
    /// flag: clip, max_sentence_tokens, length_penalty, max_len_a, max_len_b. A run's own
    /// config.toml is such a file. Flags override the file.
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    invocation: crate::training::InvocationArgs,
    /// Model sizes: small (3+3 layers, d_model 256, 8 heads, FFN 512, dropout 0.1), or the
    /// paper's base (6+6, 512, 8, 2048, 0.1) or big (6+6, 1024, 16, 4096, 0.3); the size
    /// flags below override single values [default: small]
    #[arg(long)]
    preset: Option<MtPreset>,
    /// Pre-norm layers (LayerNorm before each sublayer) instead of the paper's post-norm.
    #[arg(long)]
    norm_first: bool,
    /// Model: transformer, or a recurrent baseline: gru (no attention: the source as one
    /// fixed-size vector), gru-dot (dot-product attention, Luong) or gru-bahdanau (additive
    /// attention, Bahdanau) [default: transformer]
    #[arg(long)]
    arch: Option<Arch>,
    /// GRU units per encoder direction of the recurrent models; the decoder has twice as
    /// many, and the embeddings are --d-model wide [default: 256]
    #[arg(long)]
    rnn_hidden: Option<usize>,
    /// Tokens: bpe (joint subwords, exact detokenization), unigram (SentencePiece's
    /// unigram language model), bpe-bytes or unigram-bytes (with byte fallback: a character
    /// never seen in training is spelled in its UTF-8 bytes instead of <unk>; 256 of the
    /// vocabulary's ids are bytes), or words (lowercased words, rare ones as <unk>: the
    /// published Multi30k baselines' vocabulary, for a perplexity per word comparable with
    /// theirs; score its BLEU lowercased) [default: bpe]
    #[arg(long)]
    tokenizer: Option<TokenizerKind>,
    /// Joint subword vocabulary size [default: 8000]
    #[arg(long)]
    vocab_size: Option<usize>,
    /// Separate embedding and output matrices (default: shared, section 3.4).
    #[arg(long)]
    no_share_embeddings: bool,
    /// Model width [default: 256]
    #[arg(long)]
    d_model: Option<usize>,
    /// Attention heads [default: 8]
    #[arg(long)]
    nhead: Option<usize>,
    /// Encoder and decoder layers each [default: 3]
    #[arg(long)]
    layers: Option<usize>,
    /// Feed-forward width [default: 512]
    #[arg(long)]
    dim_feedforward: Option<usize>,
    /// Dropout [default: 0.1]
    #[arg(long, allow_negative_numbers = true)]
    dropout: Option<f64>,
    /// Label smoothing [default: 0.1]
    #[arg(long, allow_negative_numbers = true)]
    label_smoothing: Option<f64>,
    /// Warm-up steps of the learning-rate schedule [default: 400]
    #[arg(long)]
    warmup: Option<usize>,
    /// Multiplies the schedule's learning rate [default: 0.4]
    #[arg(long, allow_negative_numbers = true)]
    lr_factor: Option<f64>,
    /// Epochs [default: 20]
    #[arg(long)]
    epochs: Option<usize>,
    /// Padded tokens per side and batch [default: 2048]
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Sum this many batches' gradients before each optimizer step (gradient accumulation;
    /// per process under mpirun, where the global batch is this x processes, see
    /// docs/DISTRIBUTED.md) [default: 1]
    #[arg(long, value_name = "K")]
    accumulate: Option<usize>,
    /// Batches per epoch at most (quick runs).
    #[arg(long)]
    max_batches: Option<usize>,
    /// Print and record the mean training loss every N batches [default: 50]
    #[arg(long)]
    log_interval: Option<usize>,
    /// Write a resumable checkpoint every N batches, and at every epoch end [default: 200]
    #[arg(long)]
    checkpoint_interval: Option<usize>,
    /// Validate on the first N sentences only (quick runs).
    #[arg(long)]
    max_valid: Option<usize>,
    /// Beam size of the final test translation [default: 5]
    #[arg(long)]
    beam: Option<usize>,
    /// Seed for initialisation, batch order and dropout [default: 1]
    #[arg(long)]
    seed: Option<u64>,
    /// Decay per step of a moving average of the weights, validated beside the trained
    /// weights every epoch (the better by BLEU, chrF into Korean, is kept); 0 turns it off
    /// [default: 0.999]
    #[arg(long, allow_negative_numbers = true)]
    average_decay: Option<f64>,
    /// The products in training: f32, or bf16 mixed precision. On the CPU, the output
    /// layer's and the layers' products on the AMX units or AVX512-BF16: a fresh run times
    /// the output layer both ways first and trains in bf16 only if it was faster on this CPU
    /// (the log says what it measured; config.toml keeps the choice). On a GPU (--device
    /// cuda), autocast: every product in bf16 on the tensor cores, f32 master weights, as
    /// asked [default: f32]
    #[arg(long)]
    precision: Option<transformer_model::Precision>,
    /// With --precision bf16: train in bf16 without first timing it against f32 on this CPU
    /// (for comparing the two arithmetics, or where the timing misleads)
    #[arg(long)]
    no_precision_check: bool,
    #[command(flatten)]
    pub(crate) device: crate::device::DeviceArg,
}

impl TrainArgs {
    /// The configuration these arguments ask for, and the settings they give explicitly
    /// (flags first, then the keys of --config), which a resumed run checks against its own.
    fn resolve(&self) -> Result<(MtTrainConfig, Vec<Given>)> {
        let mut given = Vec::new();
        let mut c = match &self.config {
            Some(p) => MtTrainConfig::from_toml_file(p).context("--config")?,
            None => MtTrainConfig::default(),
        };
        if let Some(p) = self.preset {
            c.apply_preset(p);
            for key in [
                "d_model",
                "nhead",
                "encoder_layers",
                "decoder_layers",
                "dim_feedforward",
                "dropout",
            ] {
                given.push(Given::new(key, "--preset"));
            }
        }
        if self.norm_first {
            c.norm_first = true;
            given.push(Given::new("norm_first", "--norm-first"));
        }
        if self.no_precision_check {
            c.measure_precision = false;
            given.push(Given::new("measure_precision", "--no-precision-check"));
        }
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = self.$f.clone() {
                c.$f = v.into();
                given.push(Given::new(stringify!($f), format!("--{}", stringify!($f).replace('_', "-"))));
            } )* };
        }
        set!(
            arch,
            rnn_hidden,
            tokenizer,
            vocab_size,
            d_model,
            nhead,
            dim_feedforward,
            dropout,
            label_smoothing,
            warmup,
            lr_factor,
            epochs,
            max_tokens,
            accumulate,
            log_interval,
            checkpoint_interval,
            beam,
            seed,
            average_decay,
            precision
        );
        for (key, dst, src) in [
            ("train_src", &mut c.train_src, &self.train_src),
            ("train_tgt", &mut c.train_tgt, &self.train_tgt),
            ("valid_src", &mut c.valid_src, &self.valid_src),
            ("valid_tgt", &mut c.valid_tgt, &self.valid_tgt),
            ("test_src", &mut c.test_src, &self.test_src),
            ("test_tgt", &mut c.test_tgt, &self.test_tgt),
            ("data", &mut c.data, &self.data),
        ] {
            if src.is_some() {
                dst.clone_from(src);
                given.push(Given::new(key, format!("--{}", key.replace('_', "-"))));
            }
        }
        if self.corpus.is_some() {
            c.corpus = self.corpus;
            given.push(Given::new("corpus", "--corpus"));
        }
        if self.reverse {
            c.reverse = true;
            given.push(Given::new("reverse", "--reverse"));
        }
        if self.init_from.is_some() {
            c.init_from.clone_from(&self.init_from);
            given.push(Given::new("init_from", "--init-from"));
        }
        // The flags name the languages of the files (--train-src, --train-tgt), as --corpus
        // does; the run records the languages it translates from and to, so --reverse
        // exchanges them.
        let (src_lang, tgt_lang) = if c.reverse {
            (&self.tgt_lang, &self.src_lang)
        } else {
            (&self.src_lang, &self.tgt_lang)
        };
        if src_lang.is_some() {
            c.src_lang.clone_from(src_lang);
        }
        if tgt_lang.is_some() {
            c.tgt_lang.clone_from(tgt_lang);
        }
        if let Some(l) = self.layers {
            c.encoder_layers = l;
            c.decoder_layers = l;
            given.push(Given::new("encoder_layers", "--layers"));
            given.push(Given::new("decoder_layers", "--layers"));
        }
        if self.no_share_embeddings {
            c.share_embeddings = false;
            given.push(Given::new("share_embeddings", "--no-share-embeddings"));
        }
        if self.max_batches.is_some() {
            c.max_batches = self.max_batches;
            given.push(Given::new("max_batches", "--max-batches"));
        }
        if self.max_valid.is_some() {
            c.max_valid = self.max_valid;
            given.push(Given::new("max_valid", "--max-valid"));
        }
        if let Some(p) = &self.config {
            given.extend(Given::from_config_file(p)?);
        }
        // A resumed run checks the settings against its own first, then validates the result.
        if !self.resume {
            c.validate()?;
        }
        Ok((c, given))
    }
}

#[derive(Args)]
pub struct DecodeArgs {
    /// Run directory of a trained model.
    #[arg(long)]
    run: PathBuf,
    /// Beam size (1 = greedy) [default: the run's, 5]
    #[arg(long)]
    beam: Option<usize>,
    /// Longest output: A * source tokens + B, A at least 0, and never more than the model's
    /// positions (1,023 tokens); a source longer than the model takes is translated from its
    /// first 1,023 tokens, with a warning naming the line [default: the run's, 1.2]
    #[arg(long, allow_negative_numbers = true)]
    max_len_a: Option<f64>,
    /// See --max-len-a [default: the run's, 10]
    #[arg(long)]
    max_len_b: Option<usize>,
    /// Beam scores are divided by length^P, P at least 0 (0 = raw log-probabilities)
    /// [default: the run's, 1.0]
    #[arg(long, allow_negative_numbers = true)]
    length_penalty: Option<f64>,
    /// Arithmetic of decoding's products: none (f32), int8 (the decoder layers and the
    /// output layer in int8: weights with one scale per output row, activations per row,
    /// the fastest int8 kernel of this CPU), or int8-layers (the decoder layers only)
    /// [default: the run's: int8 for a run written by `mt quantize`, else none]
    #[arg(long, value_enum)]
    quantize: Option<Quantize>,
    /// Score only the target tokens the batch's sources make plausible (the run's
    /// vocabulary map, `vocab_map.json`, written by `transformer mt vocab-map`): a smaller
    /// output layer, faster decoding; translations can differ where the best token is not
    /// among the candidates
    #[arg(long)]
    restrict_vocab: bool,
    #[command(flatten)]
    pub(crate) device: crate::device::DeviceArg,
}

/// `--quantize`: the arithmetic of decoding's products.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Quantize {
    /// f32 throughout.
    None,
    /// The decoder layers and the output layer in int8.
    Int8,
    /// The decoder layers in int8, the output layer in f32.
    Int8Layers,
}

impl Quantize {
    /// The model setting it stands for.
    pub(crate) fn precision(self) -> transformer_model::DecodePrecision {
        match self {
            Quantize::None => transformer_model::DecodePrecision::F32,
            Quantize::Int8 => transformer_model::DecodePrecision::Int8 { output_layer: true },
            Quantize::Int8Layers => transformer_model::DecodePrecision::Int8 {
                output_layer: false,
            },
        }
    }
}

/// How `args` asks a run to be loaded on `device` ([`Execution`]).
pub(crate) fn execution(
    device: &Device,
    quantize: Option<Quantize>,
    restrict_vocab: bool,
) -> Execution {
    Execution {
        device: device.clone(),
        decoding: quantize.map(Quantize::precision),
        restrict_vocab,
    }
}

/// Loads a run as `how` says, and prints what was chosen (the weights' origin, the decoding
/// arithmetic and vocabulary) on stderr.
pub(crate) fn load_and_say(run: &std::path::Path, how: &Execution) -> Result<LoadedMt> {
    let run = load_run(run, how)?;
    crate::console::warn_note(&run.note);
    for line in &run.decoding {
        eprintln!("{line}");
    }
    Ok(run)
}

#[derive(Args)]
#[command(
    after_help = "Examples:\n  echo \"Ein Mann fährt Fahrrad.\" | transformer mt translate --run runs/de-en\n  echo \"Ein Hund läuft. Dr. Müller kommt am 1. Mai.\" | transformer mt translate --run runs/de-en\n  transformer mt translate --run runs/de-en --src test.de --beam 5 > test.hyp"
)]
pub struct TranslateArgs {
    #[command(flatten)]
    decode: DecodeArgs,
    /// Read sentences from this file instead of stdin.
    #[arg(long)]
    src: Option<PathBuf>,
    /// Translate each line whole, as one sentence. By default a line is cut into its
    /// sentences (abbreviations, numbers and quotes kept inside them), which are translated
    /// as one batch and joined back with the line's own spacing: the models are trained on
    /// single sentences.
    #[arg(long)]
    no_split_sentences: bool,
}

fn load(
    args: &DecodeArgs,
    device: &Device,
) -> Result<(LoadedMt, transformer_decode::DecodeOptions)> {
    let how = execution(device, args.quantize, args.restrict_vocab);
    let run = load_and_say(&args.run, &how)?;
    let mut c = run.config.clone();
    if let Some(a) = args.max_len_a {
        c.max_len_a = a;
    }
    if let Some(b) = args.max_len_b {
        c.max_len_b = b;
    }
    if let Some(p) = args.length_penalty {
        c.length_penalty = p;
    }
    let beam = args.beam.unwrap_or(c.beam);
    if beam == 0 {
        bail!("--beam must be at least 1 (1 = greedy)");
    }
    c.validate_decoding()?;
    // Only the translations are printed: greedy search need not score them.
    let opts = transformer_decode::DecodeOptions {
        want_scores: false,
        ..c.decode_options(beam)
    };
    Ok((run, opts))
}

fn translate_with_bar(
    run: &LoadedMt,
    lines: &[String],
    split: bool,
    opts: &transformer_decode::DecodeOptions,
    device: &Device,
) -> Result<Vec<String>> {
    let mut console = Console::new("sentences");
    let decoder = run.model.decoder()?;
    let request = DecodeRequest::new(*opts);
    let out = translate_chunk(run, &decoder, lines, 0, split, &request, device, |d, t| {
        console.batch(0, d, t)
    })?;
    console.finish();
    Ok(out)
}

/// Translates `lines` (the first being line `first + 1` of the input), with a warning for
/// each sentence longer than the model takes. With `split`, each line is cut into its
/// sentences ([`transformer_text::sentence::parts`]), the sentences of every line are
/// translated as one batch, and each line's translations are joined back with its own
/// spacing; without, each line is one sentence to the model. `on_batch(done, total)` counts
/// sentences.
#[allow(clippy::too_many_arguments)]
pub(crate) fn translate_chunk(
    run: &LoadedMt,
    decoder: &MtDecoder<'_>,
    lines: &[String],
    first: usize,
    split: bool,
    request: &DecodeRequest,
    device: &Device,
    on_batch: impl FnMut(usize, usize),
) -> Result<Vec<String>> {
    use transformer_text::sentence::{join_parts, parts, to_translate, Part};
    let cut: Vec<Vec<Part>> = if split {
        lines.iter().map(|l| parts(l)).collect()
    } else {
        lines
            .iter()
            .map(|l| vec![Part::Translate(l.clone())])
            .collect()
    };
    let mut sentences = Vec::new();
    let mut line_of = Vec::new();
    for (i, p) in cut.iter().enumerate() {
        for t in to_translate(p) {
            sentences.push(t.to_string());
            line_of.push(first + i);
        }
    }
    for t in over_long_lines(&run.model, &run.tokenizer, &sentences) {
        let t = Truncated {
            index: line_of[t.index],
            ..t
        };
        eprintln!("warning: {t}");
    }
    let translated = translate_lines(
        decoder,
        &run.tokenizer,
        &sentences,
        request,
        device,
        on_batch,
    )?;
    let mut next = translated.into_iter();
    Ok(cut
        .iter()
        .map(|p| {
            let n = to_translate(p).count();
            join_parts(p, next.by_ref().take(n).collect::<Vec<_>>())
        })
        .collect())
}

/// Lines read and translated at a time by `mt translate`: enough to batch sentences of
/// similar length together, few enough to print the first translations at once.
const TRANSLATE_CHUNK: usize = 1000;

/// `mt translate`: reads a chunk of lines, translates it, prints it, and goes on, so that
/// memory stays bounded on a file of any length and output follows input; a progress bar
/// with ETA on stderr for a file; a closed output pipe (`| head`) ends quietly.
fn translate_stream(args: &TranslateArgs, device: &Device) -> Result<()> {
    let (run, opts) = load(&args.decode, device)?;
    let request = DecodeRequest::new(opts);
    let decoder = run.model.decoder()?;
    let (mut reader, total) = match &args.src {
        Some(p) => (
            transformer_text::parallel::LineReader::open(p)?,
            Some(transformer_text::parallel::count_lines(p)?),
        ),
        None => (transformer_text::parallel::LineReader::stdin(), None),
    };
    let mut console = Console::new("sentences");
    let mut stdout = std::io::stdout().lock();
    loop {
        let lines = reader.next_chunk(TRANSLATE_CHUNK)?;
        if lines.is_empty() {
            break;
        }
        let before = reader.lines_read() - lines.len();
        let split = !args.no_split_sentences;
        let n = lines.len();
        let out = translate_chunk(
            &run,
            &decoder,
            &lines,
            before,
            split,
            &request,
            device,
            |d, all| {
                if let Some(t) = total {
                    console.batch(0, before + d * n / all.max(1), t)
                }
            },
        )?;
        let mut text = out.join("\n");
        text.push('\n');
        let written = stdout
            .write_all(text.as_bytes())
            .and_then(|_| stdout.flush());
        if let Err(e) = written {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                // The reader has what it wanted (`| head`): not an error.
                console.finish();
                return Ok(());
            }
            return Err(e).context("cannot write the translations to stdout");
        }
    }
    console.finish();
    Ok(())
}

pub fn run(cmd: MtCommand) -> Result<()> {
    let device = match &cmd {
        MtCommand::Train(a) => a.device.open()?,
        MtCommand::Translate(a) => a.decode.device.open()?,
        MtCommand::Eval(a) => a.decode.device.open()?,
        MtCommand::Attention(a) => a.decode.device.open()?,
        MtCommand::Quantize(_) | MtCommand::VocabMap(_) => Device::Cpu,
    };
    match cmd {
        MtCommand::Attention(args) => {
            args.picture.check()?;
            let (run, opts) = load(&args.decode, &device)?;
            let (layers, heads) = run.model_config.arch().attention_shape();
            args.picture.check_against(layers, heads)?;
            for t in over_long_lines(&run.model, &run.tokenizer, std::slice::from_ref(&args.src)) {
                eprintln!("warning: --src {t}");
            }
            let set = attention_set(&run, &args.src, &opts, &device)?;
            println!("{}", set.translation);
            let pic = &args.picture;
            let map = match &pic.out {
                Some(_) => Some(cross_heatmap(&set, pic.layer, pic.head)?),
                None => None,
            };
            pic.write(map.as_ref(), &set)?;
        }
        MtCommand::Train(args) => {
            let cmd = crate::training::TrainCommand {
                name: "mt",
                out: &args.out,
                resume: args.resume,
                max_steps: args.invocation.max_steps,
                show_run_dir: false,
                log_file: args.invocation.log_file.as_deref(),
            };
            crate::training::run(
                cmd,
                device,
                || args.resolve(),
                |opts, progress| {
                    let summary = mt::train(opts, progress)?;
                    Ok(crate::training::Trained {
                        stopped_after: (!summary.state.finished).then_some(summary.state.step),
                    })
                },
            )?;
        }
        MtCommand::Translate(args) => {
            crate::dist::refuse_several("transformer mt translate")?;
            translate_stream(&args, &device)?
        }
        MtCommand::Quantize(args) => {
            if args.run.is_dir() {
                if let (_, Some(note)) = transformer_runtime::run_dir::weights_file(&args.run) {
                    eprintln!("warning: {note}");
                }
            }
            let s = transformer_runtime::quantize::quantize_run(&args.run, &args.out)?;
            println!(
                "wrote {}: {} weight matrices in int8; weights {:.1} MB -> {:.1} MB",
                args.out.display(),
                s.matrices,
                s.bytes_before as f64 / 1e6,
                s.bytes_after as f64 / 1e6
            );
        }
        MtCommand::VocabMap(args) => {
            use transformer_runtime::vocab_map::{VocabMapOptions, FILE};
            let opts = VocabMapOptions {
                per_source: args.per_source,
                frequent: args.frequent,
            };
            let t = Instant::now();
            let (map, pairs) = mt::learn_vocab_map(&args.run, opts)?;
            let path = args.run.join(FILE);
            map.save(&path)?;
            println!(
                "wrote {}: learnt from {pairs} training pairs in {:.1}s; {} tokens for every \
                 sentence, up to {} more per source token, of a vocabulary of {}",
                path.display(),
                t.elapsed().as_secs_f64(),
                map.always.len(),
                opts.per_source,
                map.vocab
            );
        }
        MtCommand::Eval(args) => {
            crate::dist::refuse_several("transformer mt eval")?;
            eval::run(&args, &device)?
        }
    }
    Ok(())
}
