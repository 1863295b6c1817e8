//! `transformer`: a thin command line over the library crates. Arguments are parsed by clap,
//! validated into the libraries' configs (which say what to change when they are wrong),
//! then run.

// The argument structs' doc comments are clap's `--help` text, in which `<unk>` and `<eos>`
// are meant literally, not as HTML tags.
#![allow(rustdoc::invalid_html_tags)]

use anyhow::{Context, Result};
use candle_core::{DType, Device};
use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::time::Instant;
use transformer_model::{
    Activation, LmConfig, ParamBuilder, PositionalEncoding, Seq2Seq, TransformerConfig,
    TransformerLm,
};
use transformer_train::copy_task::{self, CopyTaskConfig};
use transformer_train::runner::{Progress, RunOptions};

mod bench;
mod bleu;
mod console;
mod device;
mod dist;
mod import;
mod lm;
mod mt;
mod serve;
mod training;

#[derive(Parser)]
#[command(
    name = "transformer",
    version,
    about = "Build, train, evaluate and decode Transformers (\"Attention Is All You Need\").",
    long_about = "Build, train, evaluate and decode Transformers (\"Attention Is All You Need\", \
                  Vaswani et al. 2017) on the CPU, with results checked against PyTorch.\n\n\
                  Start with `transformer copy-task`: it trains a small encoder-decoder from \
                  scratch to copy random sequences and decodes them back (about half a minute)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train an encoder-decoder on the copy task (the Annotated Transformer's smoke test) and
    /// decode held-out sequences greedily.
    #[command(after_help = "Example:\n  transformer copy-task --steps 800 --seed 1")]
    CopyTask(CopyArgs),
    /// The PyTorch tutorial's language model on WikiText-2: train, eval, generate, import.
    #[command(subcommand)]
    Lm(lm::LmCommand),
    /// Translation: train an encoder-decoder (the Transformer, or a recurrent baseline),
    /// translate, score with BLEU and chrF, show attention.
    #[command(subcommand)]
    Mt(mt::MtCommand),
    /// Serve trained translation runs over HTTP with LibreTranslate's API (its clients work
    /// unchanged), a native API with scores and alignments, and a web page; requests that
    /// arrive together are translated in one batch.
    Serve(serve::ServeArgs),
    /// Benchmark our implementation at fixed shapes (compare with PyTorch:
    /// scripts/bench_vs_pytorch.sh).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Import a published translation model (CTranslate2, Argos Translate, OPUS-MT's
    /// MarianMT) as a run directory that every command takes.
    Import(import::ImportArgs),
    /// Print a model configuration and its parameter count (checks the configuration).
    Info(InfoArgs),
    /// Score a translation: corpus BLEU and chrF as sacreBLEU computes them, with signatures.
    Bleu(bleu::BleuArgs),
    /// Draw a picture of a building block (open the SVG in a browser).
    #[command(subcommand)]
    Show(ShowCommand),
}

#[derive(Subcommand)]
enum ShowCommand {
    /// The sinusoidal positional encoding (section 3.5) as a heatmap: one row per position,
    /// one column per dimension; sines in even columns, cosines in odd ones, each pair a
    /// lower frequency than the one before.
    PositionalEncoding(PeArgs),
}

#[derive(clap::Args)]
#[command(
    after_help = "Example:\n  transformer show positional-encoding --d-model 128 --max-len 100 --out pe.svg"
)]
struct PeArgs {
    /// Model width: columns of the picture (even).
    #[arg(long, default_value_t = 128)]
    d_model: usize,
    /// Positions: rows of the picture.
    #[arg(long, default_value_t = 100)]
    max_len: usize,
    /// The SVG file to write.
    #[arg(long)]
    out: PathBuf,
}

fn show(cmd: ShowCommand) -> Result<()> {
    match cmd {
        ShowCommand::PositionalEncoding(a) => {
            if a.d_model == 0 || a.d_model % 2 == 1 || a.max_len == 0 {
                anyhow::bail!(
                    "--d-model must be even and positive and --max-len positive (got {} and {})",
                    a.d_model,
                    a.max_len
                );
            }
            if a.out.extension().and_then(|e| e.to_str()) != Some("svg") {
                anyhow::bail!(
                    "{}: the picture is written as SVG; name the file *.svg",
                    a.out.display()
                );
            }
            let pe = PositionalEncoding::table(a.d_model, a.max_len, &Device::Cpu)?
                .to_dtype(DType::F32)?
                .to_vec2::<f32>()?;
            let map = transformer_runtime::viz::Heatmap {
                title: format!(
                    "Positional encoding, d_model {}, positions 0-{}: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...)",
                    a.d_model,
                    a.max_len - 1
                ),
                rows: (0..a.max_len).map(|p| p.to_string()).collect(),
                cols: (0..a.d_model).map(|i| i.to_string()).collect(),
                values: pe,
                scale: transformer_runtime::viz::Scale::Signed,
                row_axis: "position".into(),
                col_axis: "dimension".into(),
            };
            std::fs::write(&a.out, transformer_runtime::viz::heatmap_svg(&map))
                .with_context(|| format!("writing {}", a.out.display()))?;
            eprintln!("wrote {}", a.out.display());
            Ok(())
        }
    }
}

#[derive(clap::Args)]
struct CopyArgs {
    /// Training steps (Adam with the paper's warm-up schedule, section 5.3).
    #[arg(long, default_value_t = 800)]
    steps: usize,
    /// Sequences per batch.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Symbols per sequence, including the start symbol.
    #[arg(long, default_value_t = 10)]
    seq_len: usize,
    /// Vocabulary size (0 = padding, 1 = start symbol, 2.. = data).
    #[arg(long, default_value_t = 11)]
    vocab: usize,
    /// Seed for initialisation, data and dropout.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the loss every N steps.
    #[arg(long, default_value_t = 100)]
    log_every: usize,
    /// Keep the run directory here (config, checkpoint, best weights, metrics, loss plot);
    /// without it the run lives in a temporary folder removed at the end.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Append the log to this file too (created if missing); a closed stdout does not stop
    /// the run.
    #[arg(long, value_name = "PATH")]
    log_file: Option<PathBuf>,
    #[command(flatten)]
    device: device::DeviceArg,
}

#[derive(Clone, Copy, ValueEnum)]
enum Preset {
    /// The paper's base model (Table 3).
    Base,
    /// The paper's big model (Table 3).
    Big,
    /// A model small enough for tests and the copy task.
    Tiny,
    /// The PyTorch tutorial's WikiText-2 language model.
    Lm,
}

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  transformer info --preset base\n  transformer info --preset lm --json\n  transformer info --preset base --nhead 6   # an error that says what to change"
)]
struct InfoArgs {
    /// The configuration to start from; the flags below override single values.
    #[arg(long, value_enum, default_value_t = Preset::Base)]
    preset: Preset,
    /// Override d_model.
    #[arg(long)]
    d_model: Option<usize>,
    /// Override the number of heads.
    #[arg(long)]
    nhead: Option<usize>,
    /// Override the feed-forward width.
    #[arg(long)]
    d_ff: Option<usize>,
    /// Override the number of layers (encoder and decoder).
    #[arg(long)]
    layers: Option<usize>,
    /// Feed-forward activation.
    #[arg(long)]
    activation: Option<Activation>,
    /// Vocabulary size [default: 37000, the paper's shared English-German BPE vocabulary
    /// (section 5.1); 33278, WikiText-2's, for `lm`].
    #[arg(long)]
    vocab: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

fn main() {
    let cli = Cli::parse();
    // Reuse freed step buffers where training steps run; a shorter spin for candle's pool
    // (see the module docs).
    transformer_train::runtime::configure(cli.command.runs_training_steps());
    quiet_on_closed_stdout();
    if let Err(e) = run(cli) {
        // Output into a closed pipe (`| head -1`): the reader has what it wanted.
        if is_broken_pipe(&e) {
            std::process::exit(0);
        }
        eprintln!("error: {}", said_once(&e));
        std::process::exit(1);
    }
}

impl Command {
    /// Whether the command runs training steps (training, and the benchmarks of a step),
    /// whose buffers freed at each step are better kept for the next
    /// ([`transformer_train::runtime::keep_freed_memory`]).
    fn runs_training_steps(&self) -> bool {
        matches!(
            self,
            Command::CopyTask(_)
                | Command::Lm(lm::LmCommand::Train(_))
                | Command::Mt(mt::MtCommand::Train(_))
                | Command::Bench(bench::BenchCommand::Lm(_) | bench::BenchCommand::Mt(_))
        )
    }
}

/// Whether an io error of kind `BrokenPipe` is anywhere in the error's chain.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The error and its causes, `: `-separated, each said once: a cause whose text its
/// parent's message already ends with (an OS error that a library error quotes) is skipped.
fn said_once(e: &anyhow::Error) -> String {
    let mut out = String::new();
    let mut last = String::new();
    for cause in e.chain() {
        let msg = cause.to_string();
        if !last.is_empty() && last.ends_with(&msg) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&msg);
        last = msg;
    }
    out
}

/// `println!` panics when stdout is a closed pipe; end quietly with status 0 instead, as
/// for any other output cut short by its reader.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let p = info.payload();
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info);
    }));
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::CopyTask(args) => copy(args),
        Command::Info(args) => info(args),
        Command::Import(args) => import::run(args),
        Command::Lm(cmd) => lm::run(cmd),
        Command::Mt(cmd) => mt::run(cmd),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Serve(args) => serve::serve(args),
        Command::Bleu(args) => bleu::run(args),
        Command::Show(cmd) => show(cmd),
    }
}

fn copy(args: CopyArgs) -> Result<()> {
    anyhow::ensure!(
        args.vocab >= 3,
        "--vocab must be at least 3 (padding, start, one symbol)"
    );
    anyhow::ensure!(
        args.seq_len >= 2,
        "--seq-len must be at least 2 (start symbol and one symbol)"
    );
    anyhow::ensure!(
        args.steps >= 1 && args.batch_size >= 1,
        "--steps and --batch-size must be positive"
    );
    let cfg = CopyTaskConfig {
        steps: args.steps,
        batch_size: args.batch_size,
        seq_len: args.seq_len,
        vocab: args.vocab,
        seed: args.seed,
        ..CopyTaskConfig::default()
    };
    cfg.model.validate()?;
    let dev = args.device.open()?;
    let m = &cfg.model;
    let mut console = console::Console::new("steps").with_log_file(args.log_file.as_deref())?;
    console.line(&format!(
        "copy task: {} symbols, length {}, batch {}; model d_model {}, {} heads, {}+{} layers, d_ff {}, dropout {}",
        cfg.vocab, cfg.seq_len, cfg.batch_size, m.d_model, m.nhead, m.num_encoder_layers,
        m.num_decoder_layers, m.dim_feedforward, m.dropout
    ));
    let (out, temporary) = match &args.out {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("transformer-copy-{}", std::process::id())),
            true,
        ),
    };
    if temporary {
        let _ = std::fs::remove_dir_all(&out);
    }
    let opts = RunOptions {
        config: CopyTaskConfig {
            log_every: args.log_every.max(1),
            ..cfg
        },
        out: out.clone(),
        resume: false,
        stop_after_steps: None,
        crash_after_steps: None,
        dist: Default::default(),
        interrupt: None,
        device: dev,
        given: Vec::new(),
    };
    let start = Instant::now();
    let summary = copy_task::train(&opts, &mut console);
    console.finish();
    if temporary {
        let _ = std::fs::remove_dir_all(&out);
    } else {
        console.line(&format!("run directory: {}", out.display()));
    }
    let summary = summary?;
    console.line(&format!(
        "{} parameters, {:.1}s in all",
        summary.parameters,
        start.elapsed().as_secs_f64()
    ));
    Ok(())
}

impl InfoArgs {
    /// Sets the sizes given as flags, keeping the preset's elsewhere: `[d_model, nhead,
    /// d_ff]` and every stack's layer count in `layers` (the same for both of a
    /// Transformer's), the language model's and the Transformer's fields alike.
    fn give_sizes<const N: usize>(
        &self,
        [d_model, nhead, d_ff]: [&mut usize; 3],
        layers: [&mut usize; N],
    ) {
        let given = [
            (d_model, self.d_model),
            (nhead, self.nhead),
            (d_ff, self.d_ff),
        ];
        let layers = layers.map(|l| (l, self.layers));
        for (size, flag) in given.into_iter().chain(layers) {
            *size = flag.unwrap_or(*size);
        }
    }
}

fn info(args: InfoArgs) -> Result<()> {
    let dev = Device::Cpu;
    // Parameters are counted on a model built in memory; `bf16` halves what that costs.
    let pb = ParamBuilder::new(DType::BF16, &dev, 0);
    let (config, params) = match args.preset {
        Preset::Lm => {
            let mut c = LmConfig::default();
            c.ntoken = args.vocab.unwrap_or(c.ntoken);
            args.give_sizes(
                [&mut c.d_model, &mut c.nhead, &mut c.d_hid],
                [&mut c.nlayers],
            );
            c.validate()?;
            TransformerLm::new(&pb, &c).context("building the model")?;
            (serde_json::to_value(&c)?, pb.params())
        }
        p => {
            let mut c = match p {
                Preset::Base => TransformerConfig::base(),
                Preset::Big => TransformerConfig::big(),
                _ => TransformerConfig::tiny(),
            };
            let layers = [&mut c.num_encoder_layers, &mut c.num_decoder_layers];
            args.give_sizes(
                [&mut c.d_model, &mut c.nhead, &mut c.dim_feedforward],
                layers,
            );
            c.activation = args.activation.unwrap_or(c.activation);
            c.validate()?;
            let vocab = args.vocab.unwrap_or(37_000);
            Seq2Seq::new(&pb, &c, vocab, vocab).context("building the model")?;
            (serde_json::to_value(&c)?, pb.params())
        }
    };
    if args.json {
        let out = serde_json::json!({
            "config": config,
            "parameters": params.num_elements(),
            "tensors": params.len(),
        });
        println!("{out}");
    } else {
        println!("{}", serde_json::to_string_pretty(&config)?);
        println!(
            "parameters: {} in {} tensors",
            params.num_elements(),
            params.len()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every option of every subcommand says what it is in `--help`.
    #[test]
    fn every_option_has_help_text() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} --{id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "transformer", &mut missing);
        assert!(missing.is_empty(), "options without help: {missing:#?}");
    }
}
