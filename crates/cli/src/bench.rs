//! `transformer bench ...`: timings of our implementation at fixed shapes, for comparison
//! with PyTorch on the same machine (`scripts/bench_vs_pytorch.sh` runs both sides).

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use clap::{Args, Subcommand};
use std::time::Instant;
use transformer_decode::{generate_lm, Sampling};
use transformer_model::kernels::{bf16, Precision};
use transformer_model::{LmConfig, ParamBuilder, Rng, TransformerLm};
use transformer_train::lm::LmStep;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// The PyTorch tutorial's language model: training step, evaluation forward, generation
    /// and peak memory on random token ids (no data needed).
    #[command(
        after_help = "Examples:\n  transformer bench lm\n  transformer bench lm --repeats 5 --json\n  scripts/bench_vs_pytorch.sh   # the same measurements for PyTorch, side by side"
    )]
    Lm(LmBenchArgs),
}

#[derive(Args)]
// A later flag overrides an earlier one (scripts/bench_vs_pytorch.sh passes its own
// --warmup/--repeats before the user's flags).
#[command(args_override_self = true)]
pub struct LmBenchArgs {
    /// Vocabulary size (28782: the tutorial's basic_english vocabulary of WikiText-2).
    #[arg(long, default_value_t = 28_782)]
    vocab: usize,
    /// Embedding size.
    #[arg(long, default_value_t = 200)]
    emsize: usize,
    /// Feed-forward width.
    #[arg(long, default_value_t = 200)]
    nhid: usize,
    /// Encoder layers.
    #[arg(long, default_value_t = 2)]
    nlayers: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 2)]
    nhead: usize,
    /// Dropout probability (training step only).
    #[arg(long, default_value_t = 0.2)]
    dropout: f64,
    /// Training batch columns.
    #[arg(long, default_value_t = 20)]
    batch: usize,
    /// Window length.
    #[arg(long, default_value_t = 35)]
    bptt: usize,
    /// Evaluation batch columns (the tutorial's evaluate batch).
    #[arg(long, default_value_t = 10)]
    eval_batch: usize,
    /// Prompt length for generation (batch 1).
    #[arg(long, default_value_t = 10)]
    gen_prompt: usize,
    /// Tokens generated greedily per repetition.
    #[arg(long, default_value_t = 100)]
    gen_tokens: usize,
    /// SGD learning rate.
    #[arg(long, default_value_t = 5.0)]
    lr: f64,
    /// Gradient-norm clipping threshold.
    #[arg(long, default_value_t = 0.5)]
    clip: f64,
    /// Untimed repetitions before each measurement.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Timed repetitions of each measurement (min and median are reported).
    #[arg(long, default_value_t = 10)]
    repeats: usize,
    /// Seed for initialisation, token ids and dropout.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Lm(args) => lm(args),
    }
}

/// Min and median of a list of milliseconds.
#[derive(Debug, Clone, Copy)]
struct Stats {
    min: f64,
    median: f64,
}

impl Stats {
    fn of(mut ms: Vec<f64>) -> Self {
        ms.sort_by(f64::total_cmp);
        let n = ms.len();
        let median = if n % 2 == 1 {
            ms[n / 2]
        } else {
            0.5 * (ms[n / 2 - 1] + ms[n / 2])
        };
        Self { min: ms[0], median }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({ "min": self.min, "median": self.median })
    }
}

/// Runs `f` `warmup` times untimed, then `repeats` times timed (milliseconds each).
fn time(warmup: usize, repeats: usize, mut f: impl FnMut() -> Result<()>) -> Result<Stats> {
    for _ in 0..warmup {
        f()?;
    }
    let mut ms = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let start = Instant::now();
        f()?;
        ms.push(start.elapsed().as_secs_f64() * 1e3);
    }
    Ok(Stats::of(ms))
}

/// The process's peak resident set size in MiB (`VmHWM` in /proc/self/status; Linux only).
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// `n` token ids uniform in `0..vocab`.
fn random_ids(rng: &Rng, n: usize, vocab: usize) -> Vec<u32> {
    rng.uniform_vec(n)
        .into_iter()
        .map(|u| ((u * vocab as f64) as usize).min(vocab - 1) as u32)
        .collect()
}

/// Input `(B, T)` and next-token targets `(B * T,)` from a random stream of `B` rows of
/// `T + 1` ids, as `window_tensors` lays out a window.
fn random_window(
    rng: &Rng,
    b: usize,
    t: usize,
    vocab: usize,
    dev: &Device,
) -> Result<(Tensor, Tensor)> {
    let ids = Tensor::from_vec(random_ids(rng, b * (t + 1), vocab), (b, t + 1), dev)?;
    let input = ids.narrow(1, 0, t)?.contiguous()?;
    let target = ids.narrow(1, 1, t)?.flatten_all()?;
    Ok((input, target))
}

fn lm(a: LmBenchArgs) -> Result<()> {
    anyhow::ensure!(a.repeats >= 1, "--repeats must be at least 1");
    anyhow::ensure!(
        a.vocab >= 1 && a.batch >= 1 && a.bptt >= 1 && a.eval_batch >= 1 && a.gen_prompt >= 1,
        "--vocab, --batch, --bptt, --eval-batch and --gen-prompt must be positive"
    );
    let dev = Device::Cpu;
    let cfg = LmConfig {
        ntoken: a.vocab,
        d_model: a.emsize,
        nhead: a.nhead,
        d_hid: a.nhid,
        nlayers: a.nlayers,
        dropout: a.dropout,
        ..LmConfig::default()
    };
    cfg.validate()?;
    let pb = ParamBuilder::new(DType::F32, &dev, a.seed);
    let model = TransformerLm::new(&pb, &cfg).context("building the model")?;
    let params = pb.params();
    let vars = params.vars();
    let data_rng = Rng::new(a.seed ^ 0x5eed_da7a);
    let dropout_rng = Rng::new(a.seed.wrapping_add(1));

    // a. Training step, as the loop in transformer_train::lm::train takes it.
    let (input, target) = random_window(&data_rng, a.batch, a.bptt, a.vocab, &dev)?;
    let mut lm_step = LmStep::new(vars, a.lr, a.clip);
    let mut last_loss = f64::NAN;
    let mut step = |precision: Precision| -> Result<()> {
        last_loss = lm_step.run(&model, &input, &target, &dropout_rng, precision)?;
        Ok(())
    };
    let train = time(a.warmup, a.repeats, || step(Precision::F32))?;
    let peak_rss = peak_rss_mb();
    // The same step with the output layer's products in bf16 (mixed precision), where the
    // CPU has AMX or AVX512-BF16.
    let train_bf16 = if bf16::available() {
        Some(time(a.warmup, a.repeats, || step(Precision::Bf16))?)
    } else {
        None
    };

    // b. Evaluation forward on the tutorial's evaluate batch.
    let (eval_input, eval_target) = random_window(&data_rng, a.eval_batch, a.bptt, a.vocab, &dev)?;
    // As transformer_train::lm::evaluate takes it (PyTorch's side runs under no_grad).
    let eval = time(a.warmup, a.repeats, || {
        let loss = model.loss_no_grad(&eval_input, &eval_target)?;
        loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        Ok(())
    })?;

    // c. Greedy generation, batch 1, with the key/value cache.
    let prompt = random_ids(&data_rng, a.gen_prompt, a.vocab);
    let greedy = Sampling {
        temperature: 0.0,
        top_k: None,
    };
    let gen_rng = Rng::new(a.seed);
    let gen = time(a.warmup, a.repeats, || {
        let out = generate_lm(&model, &prompt, a.gen_tokens, greedy, &gen_rng, &dev)?;
        anyhow::ensure!(out.len() == a.gen_tokens, "generated {} tokens", out.len());
        Ok(())
    })?;
    let gen_tokens_per_s = a.gen_tokens as f64 / (gen.median / 1e3);

    let threads = candle_core::utils::get_num_threads();
    let shapes = serde_json::json!({
        "vocab": a.vocab,
        "emsize": a.emsize,
        "nhid": a.nhid,
        "nlayers": a.nlayers,
        "nhead": a.nhead,
        "dropout": a.dropout,
        "batch": a.batch,
        "bptt": a.bptt,
        "eval_batch": a.eval_batch,
        "gen_prompt": a.gen_prompt,
        "gen_tokens": a.gen_tokens,
        "warmup": a.warmup,
        "repeats": a.repeats,
    });
    if a.json {
        let out = serde_json::json!({
            "impl": "transformer (candle-core 0.11, fp32)",
            "train_step_bf16_ms": train_bf16.as_ref().map(|t| t.json()),
            "bf16_products": train_bf16.as_ref().and(bf16::backend()).map(|u| u.describe()),
            "train_step_ms": train.json(),
            "eval_ms": eval.json(),
            "gen_ms": gen.json(),
            "gen_tokens_per_s": gen_tokens_per_s,
            "gen_kv_cache": true,
            "peak_rss_mb": peak_rss,
            "threads": threads,
            "parameters": params.num_elements(),
            "final_train_loss": last_loss,
            "shapes": shapes,
        });
        println!("{out}");
    } else {
        println!(
            "tutorial LM: vocab {}, emsize {}, nhid {}, {} layers, {} heads, dropout {}; {} parameters; {} threads",
            a.vocab, a.emsize, a.nhid, a.nlayers, a.nhead, a.dropout, params.num_elements(), threads
        );
        println!(
            "{} warm-up + {} timed repetitions each",
            a.warmup, a.repeats
        );
        println!("{:<44} {:>10} {:>10}", "measurement", "best", "median");
        println!(
            "{:<44} {:>10.1} {:>10.1}",
            format!("training step ms ({} x {}, SGD, clip)", a.batch, a.bptt),
            train.min,
            train.median
        );
        match &train_bf16 {
            Some(t) => println!(
                "{:<44} {:>10.1} {:>10.1}",
                "training step ms, bf16 output layer", t.min, t.median
            ),
            None => println!(
                "training step, bf16: no AMX or AVX512-BF16 on this CPU (or TRANSFORMER_NO_BF16)"
            ),
        }
        println!(
            "{:<44} {:>10.1} {:>10.1}",
            format!("evaluation forward ms ({} x {})", a.eval_batch, a.bptt),
            eval.min,
            eval.median
        );
        println!(
            "{:<44} {:>10.1} {:>10.1}",
            format!(
                "generation tokens/s ({} from {}, greedy)",
                a.gen_tokens, a.gen_prompt
            ),
            a.gen_tokens as f64 / (gen.min / 1e3),
            gen_tokens_per_s
        );
        match peak_rss {
            Some(mb) => println!("peak RSS after the training steps: {mb:.0} MB"),
            None => println!("peak RSS: unavailable (no /proc/self/status)"),
        }
    }
    Ok(())
}
