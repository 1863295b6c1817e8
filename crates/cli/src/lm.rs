//! `transformer lm ...`: the PyTorch tutorial's WikiText-2 language model.

use crate::console::warn_note;
use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};
use transformer_decode::Sampling;
use transformer_model::Precision;
use transformer_model::Rng;
use transformer_runtime::viz;
use transformer_text::basic_english;
use transformer_train::lm::{self, LmTrainConfig};
use transformer_train::runner::Given;

#[derive(Subcommand)]
pub enum LmCommand {
    /// Train the tutorial's language model (defaults: the tutorial's settings on WikiText-2).
    Train(Box<TrainArgs>),
    /// Loss and perplexity of a text file under a trained model (the tutorial's evaluate).
    Eval(EvalArgs),
    /// Generate text from a prompt with a key/value cache.
    Generate(GenerateArgs),
    /// Import the tutorial's PyTorch model (`safetensors.torch.save_file(model.state_dict(), FILE)`).
    ImportTorch(ImportArgs),
    /// Show attention: a heatmap (SVG) of which earlier words each word attends to, and an
    /// HTML page to explore every layer and head.
    Attention(AttentionArgs),
}

#[derive(Args)]
#[command(
    after_help = "Examples:\n  transformer lm train --out runs/lm\n  transformer lm train --out runs/lm --resume          # continue after an interruption\n  transformer lm train --config lm.toml --epochs 6    # flags override the file\n  transformer lm train --out runs/quick --max-batches 100 --epochs 1\n  transformer lm train --out runs/tutorial --average-decay 0   # the tutorial's read-out only"
)]
pub struct TrainArgs {
    /// Folder with train.txt, valid.txt and test.txt [default: ../shared/data/wikitext-2]
    #[arg(long)]
    data: Option<PathBuf>,
    /// Run directory for config, vocabulary, checkpoints, metrics and the loss plot.
    #[arg(long, default_value = "runs/lm")]
    out: PathBuf,
    /// Continue the run in --out from its last checkpoint, exactly where it stopped, from any
    /// directory. Flags given with it may change --epochs, --max-batches, --log-interval,
    /// --checkpoint-interval and --data; the others are the run's own, and changing them is an
    /// error that lists them.
    #[arg(long)]
    resume: bool,
    /// TOML file with any of the settings below: the keys are the flags' names with
    /// underscores (emsize = 200, eval_batch_size = 10), except --no-precision-check
    /// (measure_precision = false). A run's own config.toml is such a file. Flags override
    /// the file.
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    invocation: crate::training::InvocationArgs,
    /// Embedding size [default: 200]
    #[arg(long)]
    emsize: Option<usize>,
    /// Feed-forward width [default: 200]
    #[arg(long)]
    nhid: Option<usize>,
    /// Encoder layers [default: 2]
    #[arg(long)]
    nlayers: Option<usize>,
    /// Attention heads [default: 2]
    #[arg(long)]
    nhead: Option<usize>,
    /// Dropout probability [default: 0.2]
    #[arg(long, allow_negative_numbers = true)]
    dropout: Option<f64>,
    /// SGD learning rate [default: 5.0]
    #[arg(long, allow_negative_numbers = true)]
    lr: Option<f64>,
    /// Learning-rate decay per epoch (StepLR) [default: 0.95]
    #[arg(long, allow_negative_numbers = true)]
    gamma: Option<f64>,
    /// Gradient-norm clipping threshold [default: 0.5]
    #[arg(long, allow_negative_numbers = true)]
    clip: Option<f64>,
    /// Epochs [default: 3]
    #[arg(long)]
    epochs: Option<usize>,
    /// Training batch columns [default: 20]
    #[arg(long)]
    batch_size: Option<usize>,
    /// Evaluation batch columns [default: 10]
    #[arg(long)]
    eval_batch_size: Option<usize>,
    /// Window length [default: 35]
    #[arg(long)]
    bptt: Option<usize>,
    /// Sum this many windows' gradients before each SGD step (gradient accumulation; per
    /// process under mpirun, where the global batch is this x processes, see
    /// docs/DISTRIBUTED.md) [default: 1]
    #[arg(long, value_name = "K")]
    accumulate: Option<usize>,
    /// Log every N batches [default: 200]
    #[arg(long)]
    log_interval: Option<usize>,
    /// Checkpoint every N batches, 0 = only at epoch ends [default: 500]
    #[arg(long)]
    checkpoint_interval: Option<usize>,
    /// Batches per epoch, for quick runs [default: all]
    #[arg(long)]
    max_batches: Option<usize>,
    /// Seed for initialisation and dropout [default: 42]
    #[arg(long)]
    seed: Option<u64>,
    /// Output-layer products in training: f32 (the tutorial's) or bf16 (mixed precision on
    /// the CPU's AMX units or AVX512-BF16: a step about 1.5-1.7x faster where they pay). A
    /// fresh run times the output layer both ways first and trains in bf16 only if it was
    /// faster on this CPU (the log says what it measured; config.toml keeps the choice). On
    /// a GPU (--device cuda), autocast: every product in bf16, f32 master weights, as asked.
    /// Validation and test are always f32 [default: f32]
    #[arg(long)]
    precision: Option<Precision>,
    /// With --precision bf16: train in bf16 without first timing it against f32 on this CPU
    /// (for comparing the two arithmetics, or where the timing misleads)
    #[arg(long)]
    no_precision_check: bool,
    /// Share the embedding matrix with the output layer (weight tying; not the tutorial's
    /// model, 5.8M fewer parameters)
    #[arg(long)]
    tie_weights: bool,
    /// Read the text as the older tutorial did: an <eos> token after every line, empty lines
    /// included (its published test perplexity 229.27 counts them; the default is the newer
    /// tutorial's, which drops line ends)
    #[arg(long)]
    eos_per_line: bool,
    /// Decay per step of the moving average of the weights, validated beside the SGD
    /// weights at every epoch end; the better of the two by validation loss is the best
    /// model (training itself is the tutorial's either way). 0 = no average, the tutorial's
    /// read-out alone [default: 0.999]
    #[arg(long, value_name = "DECAY", allow_negative_numbers = true)]
    average_decay: Option<f64>,
    #[command(flatten)]
    pub(crate) device: crate::device::DeviceArg,
}

impl TrainArgs {
    /// The configuration these arguments ask for, and the settings they give explicitly
    /// (flags first, then the keys of --config), which a resumed run checks against its own.
    fn resolve(&self) -> Result<(LmTrainConfig, Vec<Given>)> {
        let mut given = Vec::new();
        let mut c = match &self.config {
            Some(p) => LmTrainConfig::from_toml_file(p).context("--config")?,
            None => LmTrainConfig::default(),
        };
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = self.$f {
                c.$f = v;
                given.push(Given::new(stringify!($f), format!("--{}", stringify!($f).replace('_', "-"))));
            } )* };
        }
        set!(
            emsize,
            nhid,
            nlayers,
            nhead,
            dropout,
            lr,
            gamma,
            clip,
            epochs,
            batch_size,
            eval_batch_size,
            bptt,
            accumulate,
            log_interval,
            checkpoint_interval,
            seed,
            precision,
            average_decay
        );
        if self.tie_weights {
            c.tie_weights = true;
            given.push(Given::new("tie_weights", "--tie-weights"));
        }
        if self.no_precision_check {
            c.measure_precision = false;
            given.push(Given::new("measure_precision", "--no-precision-check"));
        }
        if self.eos_per_line {
            c.eos_per_line = true;
            given.push(Given::new("eos_per_line", "--eos-per-line"));
        }
        if self.max_batches.is_some() {
            c.max_batches = self.max_batches;
            given.push(Given::new("max_batches", "--max-batches"));
        }
        if self.data.is_some() {
            c.data = self.data.clone();
            given.push(Given::new("data", "--data"));
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
#[command(
    after_help = "Example:\n  transformer lm eval --run runs/lm --text ../shared/data/wikitext-2/test.txt --json"
)]
pub struct EvalArgs {
    /// Run directory (from `lm train` or `lm import-torch`).
    #[arg(long)]
    run: PathBuf,
    /// Text file to evaluate, tokenized like the training data.
    #[arg(long)]
    text: PathBuf,
    /// Print one JSON object: {"loss", "ppl", "tokens"}.
    #[arg(long)]
    json: bool,
    /// Evaluation batch columns (the tutorial's 10).
    #[arg(long, default_value_t = 10)]
    batch_size: usize,
    /// Window length (the tutorial's 35).
    #[arg(long, default_value_t = 35)]
    bptt: usize,
    #[command(flatten)]
    pub(crate) device: crate::device::DeviceArg,
}

#[derive(Args)]
#[command(
    after_help = "Examples:\n  transformer lm attention --run runs/lm --text \"the game began in the first quarter\" --out lm-attention.svg\n  transformer lm attention --run runs/lm --text \"the game began\" --layer 1 --head 2 --out l1h2.svg --html lm-attention.html"
)]
pub struct AttentionArgs {
    /// Run directory of a trained (or imported) model.
    #[arg(long)]
    run: PathBuf,
    /// The text whose self-attention to draw (tokenized like the training data).
    #[arg(long)]
    text: String,
    #[command(flatten)]
    picture: PictureArgs,
    #[command(flatten)]
    pub(crate) device: crate::device::DeviceArg,
}

/// Where attention pictures go and which layer and head the heatmap shows (`lm attention`,
/// `mt attention`).
#[derive(Args)]
pub struct PictureArgs {
    /// Write the heatmap here (SVG).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write a self-contained HTML page exploring every layer and head here.
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// Layer of the heatmap, from 1 [default: the last]
    #[arg(long)]
    pub layer: Option<usize>,
    /// Attention head of the heatmap, from 1 [default: the average of the heads]
    #[arg(long)]
    pub head: Option<usize>,
}

impl PictureArgs {
    /// Something to write, and a heatmap file named `*.svg`; checked before any model loads.
    pub fn check(&self) -> Result<()> {
        anyhow::ensure!(
            self.out.is_some() || self.html.is_some(),
            "nothing to write: give --out FILE.svg (a heatmap) and/or --html FILE.html (the explorer)"
        );
        if let Some(p) = &self.out {
            anyhow::ensure!(
                p.extension().and_then(|e| e.to_str()) == Some("svg"),
                "{}: the heatmap is written as SVG; name the file *.svg (any browser opens it)",
                p.display()
            );
        }
        Ok(())
    }

    /// Writes `map` to `--out` and the explorer page of `set` to `--html`, where given.
    pub fn write(&self, map: Option<&viz::Heatmap>, set: &viz::AttentionSet) -> Result<()> {
        if let (Some(p), Some(map)) = (&self.out, map) {
            write_picture(p, "--out", &viz::heatmap_svg(map), set)?;
        }
        if let Some(p) = &self.html {
            write_picture(p, "--html", &viz::attention_html(set), set)?;
        }
        Ok(())
    }
}

/// Pictures above this size come with a warning: browsers slow down on them.
const LARGE_PICTURE_BYTES: usize = 8 << 20;

/// Writes a picture to `path` (from `flag`), warning when it is large.
fn write_picture(path: &Path, flag: &str, text: &str, set: &viz::AttentionSet) -> Result<()> {
    if text.len() > LARGE_PICTURE_BYTES {
        eprintln!(
            "warning: {flag} {}: {:.0} MB for {} source and {} output tokens; browsers are slow \
             on pictures this large: a shorter text makes a smaller one",
            path.display(),
            text.len() as f64 / 1e6,
            set.src_tokens.len(),
            set.tgt_out_tokens.len()
        );
    }
    std::fs::write(path, text)
        .with_context(|| format!("{flag} {}: cannot write it", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

impl PictureArgs {
    /// Checks --layer and --head against a model of `layers` layers of `heads` heads each
    /// (before any long work).
    pub fn check_against(&self, layers: usize, heads: usize) -> Result<()> {
        let shape = vec![vec![Vec::new(); heads.max(1)]; layers];
        if self.layer.is_some() || self.head.is_some() {
            viz::select_map(&shape, self.layer, self.head).map_err(|e| anyhow::anyhow!("--{e}"))?;
        }
        Ok(())
    }
}

#[derive(Args)]
#[command(
    after_help = "Example:\n  transformer lm generate --run runs/lm --prompt \"the game\" --max-tokens 40 --temperature 0.8 --top-k 40"
)]
pub struct GenerateArgs {
    /// Run directory of a trained (or imported) model.
    #[arg(long)]
    run: PathBuf,
    /// Text to continue (tokenized like the training data; unknown words become <unk>).
    #[arg(long)]
    prompt: String,
    /// Tokens to generate (the prompt and these must fit the model's positions).
    #[arg(long, default_value_t = 50)]
    max_tokens: usize,
    /// Sampling temperature, at least 0; 0 = greedy.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    temperature: f64,
    /// Sample among the K most likely tokens only (K at least 1).
    #[arg(long)]
    top_k: Option<usize>,
    /// Seed of the sampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    pub(crate) device: crate::device::DeviceArg,
}

#[derive(Args)]
#[command(
    after_help = "Example:\n  transformer lm import-torch --state-dict model.safetensors --vocab vocab.txt --nhead 2 --out runs/torch"
)]
pub struct ImportArgs {
    /// safetensors file of the tutorial model's state_dict.
    #[arg(long)]
    state_dict: PathBuf,
    /// Vocabulary, one token per line in index order.
    #[arg(long)]
    vocab: PathBuf,
    /// Attention heads (PyTorch does not store it).
    #[arg(long)]
    nhead: usize,
    /// Run directory to create.
    #[arg(long)]
    out: PathBuf,
}

pub fn run(cmd: LmCommand) -> Result<()> {
    let device = match &cmd {
        LmCommand::Train(a) => a.device.open()?,
        LmCommand::Eval(a) => a.device.open()?,
        LmCommand::Generate(a) => a.device.open()?,
        LmCommand::Attention(a) => a.device.open()?,
        LmCommand::ImportTorch(_) => Device::Cpu,
    };
    match cmd {
        LmCommand::Train(args) => {
            let cmd = crate::training::TrainCommand {
                name: "lm",
                out: &args.out,
                resume: args.resume,
                max_steps: args.invocation.max_steps,
                show_run_dir: true,
                log_file: args.invocation.log_file.as_deref(),
            };
            crate::training::run(
                cmd,
                device,
                || args.resolve(),
                |opts, progress| {
                    // The library says what the data folder must hold; the flag that sets it is
                    // ours.
                    let summary = lm::train(opts, progress).map_err(|e| {
                        let data_error = matches!(
                            &e,
                            transformer_train::Error::Text(
                                transformer_text::Error::MissingDataDir { .. }
                                    | transformer_text::Error::MissingSplit { .. }
                            )
                        );
                        let e = anyhow::Error::from(e);
                        if data_error {
                            e.context("the data folder is wrong: pass --data DIR")
                        } else {
                            e
                        }
                    })?;
                    Ok(crate::training::Trained {
                        stopped_after: summary
                            .test_loss
                            .is_none()
                            .then_some(summary.step_losses.len()),
                    })
                },
            )?;
        }
        LmCommand::Eval(args) => {
            anyhow::ensure!(
                args.batch_size >= 1 && args.bptt >= 1,
                "--batch-size and --bptt must be at least 1"
            );
            let loaded = lm::load_run(&args.run, &device)?;
            warn_note(&loaded.note);
            let r = lm::evaluate_file(&loaded, &args.text, args.batch_size, args.bptt, &device)
                .context("--text")?;
            if args.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "{}: loss {:.4} | ppl {:.2} | {} tokens",
                    args.text.display(),
                    r.loss,
                    r.ppl,
                    r.tokens
                );
            }
        }
        LmCommand::Attention(args) => {
            let pic = &args.picture;
            pic.check()?;
            let loaded = lm::load_run(&args.run, &device)?;
            warn_note(&loaded.note);
            pic.check_against(loaded.config.nlayers, loaded.config.nhead)?;
            let ids: Vec<u32> = loaded.vocab.encode(basic_english(&args.text));
            anyhow::ensure!(!ids.is_empty(), "the text has no tokens after tokenization");
            anyhow::ensure!(
                ids.len() <= loaded.config.max_len,
                "the text has {} tokens; the model has {} positions",
                ids.len(),
                loaded.config.max_len
            );
            let input = Tensor::from_vec(ids.clone(), (1, ids.len()), &device)?;
            let maps = loaded
                .model
                .attention(&input)?
                .iter()
                .map(|w| w.squeeze(0)?.to_dtype(DType::F32)?.to_vec3::<f32>())
                .collect::<candle_core::Result<Vec<_>>>()?;
            let tokens: Vec<String> = ids
                .iter()
                .map(|&i| loaded.vocab.token(i).to_string())
                .collect();
            let map = match &pic.out {
                Some(_) => {
                    let (values, which) = viz::select_map(&maps, pic.layer, pic.head)
                        .map_err(|e| anyhow::anyhow!("--{e}"))?;
                    Some(viz::Heatmap {
                        title: format!(
                            "causal self-attention, {which}: \u{201c}{}\u{201d}",
                            args.text
                        ),
                        rows: tokens.clone(),
                        cols: tokens.clone(),
                        values,
                        scale: viz::Scale::Unit,
                        row_axis: "word".into(),
                        col_axis: "attends to".into(),
                    })
                }
                None => None,
            };
            let set = viz::AttentionSet {
                source: args.text.clone(),
                src_tokens: tokens,
                encoder: maps,
                model: "language model (causal self-attention)".into(),
                ..Default::default()
            };
            pic.write(map.as_ref(), &set)?;
        }
        LmCommand::Generate(args) => {
            anyhow::ensure!(
                args.temperature.is_finite() && args.temperature >= 0.0,
                "--temperature is {}: it must be a number at least 0 (0 = greedy, 1 = the \
                 model's distribution)",
                args.temperature
            );
            anyhow::ensure!(
                args.top_k != Some(0),
                "--top-k must be at least 1 (1 = greedy; leave it out to sample from every token)"
            );
            anyhow::ensure!(args.max_tokens >= 1, "--max-tokens must be at least 1");
            let loaded = lm::load_run(&args.run, &device)?;
            warn_note(&loaded.note);
            let prompt: Vec<u32> = loaded.vocab.encode(basic_english(&args.prompt));
            anyhow::ensure!(
                !prompt.is_empty(),
                "the prompt has no tokens after tokenization"
            );
            let max_len = loaded.config.max_len;
            anyhow::ensure!(
                prompt.len() + args.max_tokens <= max_len,
                "prompt ({}) plus --max-tokens ({}) exceeds the model's {max_len} positions",
                prompt.len(),
                args.max_tokens
            );
            let sampling = Sampling {
                temperature: args.temperature,
                top_k: args.top_k,
            };
            let rng = Rng::new(args.seed);
            let out = transformer_decode::generate_lm(
                &loaded.model,
                &prompt,
                args.max_tokens,
                sampling,
                &rng,
                &device,
            )
            .context("generating")?;
            println!(
                "{} {}",
                loaded.vocab.decode(&prompt),
                loaded.vocab.decode(&out)
            );
        }
        LmCommand::ImportTorch(args) => {
            let (cfg, layout) =
                lm::import_torch(&args.state_dict, &args.vocab, args.nhead, &args.out)?;
            println!("detected {}", layout.describe());
            println!(
                "imported: vocab {}, d_model {}, nhead {}, d_hid {}, {} layers -> {}",
                cfg.ntoken,
                cfg.d_model,
                cfg.nhead,
                cfg.d_hid,
                cfg.nlayers,
                args.out.display()
            );
        }
    }
    Ok(())
}
