//! `transformer bench ...`: timings of our implementation at fixed shapes, for comparison
//! with PyTorch on the same machine (`scripts/bench_vs_pytorch.sh` runs both sides).

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use clap::{Args, Subcommand};
use std::time::Instant;
use transformer_decode::{generate_lm, Sampling};
use transformer_model::Backprop;
use transformer_model::{bf16, Precision};
use transformer_model::{LmConfig, ParamBuilder, Params, Rng, TransformerLm};
use transformer_train::lm::LmStep;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// The PyTorch tutorial's language model: training step, evaluation forward, generation
    /// and peak memory on random token ids (no data needed).
    Lm(LmBenchArgs),
    /// The default translation model (3 + 3 layers, d_model 256, 8 heads, FFN 512, joint
    /// vocabulary 8000 with shared embeddings): one training step (label smoothing 0.1,
    /// clipping, Adam) on a fixed padded batch that `scripts/bench_mt_torch.py train` builds
    /// identically (no data needed).
    Mt(MtBenchArgs),
    /// Translation speed of a trained run: beam search (and greedy single-sentence latency)
    /// over a source file, batched as `transformer mt translate` batches; with --dump, the
    /// source and output token ids for the PyTorch and CTranslate2 scripts to decode and
    /// compare against.
    MtDecode(MtDecodeBenchArgs),
    /// Load on a running `transformer serve`: concurrent clients posting one sentence per
    /// request to /translate for a fixed time; sentences per second and latency p50/p99 per
    /// number of clients, and the throughput ratio to the first.
    Serve(crate::serve::ServeBenchArgs),
}

#[derive(Args)]
#[command(
    after_help = "Examples:\n  transformer bench mt\n  transformer bench mt --batch 64 --repeats 5 --json\n  scripts/bench_mt_vs_pytorch.sh   # PyTorch and CTranslate2 side by side"
)]
#[command(args_override_self = true)]
pub struct MtBenchArgs {
    /// The model: `default` (3 + 3 layers, d_model 256, FFN 512) or `base`, the paper's base
    /// model (6 + 6 layers, d_model 512, FFN 2048); 8 heads, dropout 0.1 and a shared
    /// embedding either way.
    #[arg(long, value_enum, default_value_t = BenchModel::Default)]
    model: BenchModel,
    /// Sentences in the batch.
    #[arg(long, default_value_t = 128)]
    batch: usize,
    /// Longest source row (rows are 0-5 tokens shorter, padded).
    #[arg(long, default_value_t = 18)]
    src_len: usize,
    /// Longest target row (rows are 0-6 tokens shorter, padded).
    #[arg(long, default_value_t = 18)]
    tgt_len: usize,
    /// Joint vocabulary size.
    #[arg(long, default_value_t = 8000)]
    vocab: usize,
    #[command(flatten)]
    run: StepBenchRun,
}

/// The translation model `bench mt` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchModel {
    /// `mt train`'s default: 3 + 3 layers, d_model 256, 8 heads, FFN 512.
    Default,
    /// The paper's base model (Table 3): 6 + 6 layers, d_model 512, 8 heads, FFN 2048.
    Base,
}

impl BenchModel {
    fn describe(self) -> &'static str {
        match self {
            Self::Default => "3 + 3 layers, d_model 256, 8 heads, FFN 512",
            Self::Base => "the paper's base model: 6 + 6 layers, d_model 512, 8 heads, FFN 2048",
        }
    }
}

/// What bf16 training on `dev` runs on, or `None` where it does not run: the CPU's AMX or
/// AVX512-BF16 kernels, or autocast on a GPU.
fn bf16_training(dev: &Device) -> Option<String> {
    if dev.is_cpu() {
        bf16::backend().map(|u| u.describe().to_string())
    } else {
        Some("autocast: the composed layers' products in bf16 on the GPU".into())
    }
}

#[derive(Args)]
#[command(
    after_help = "Example:\n  M=../shared/data/multi30k/task1/raw\n  transformer bench mt-decode --run runs/de-en --src $M/test_2016_flickr.de.gz --beam 5 --dump runs/bench --json"
)]
#[command(args_override_self = true)]
pub struct MtDecodeBenchArgs {
    /// Run directory of a trained translation model.
    #[arg(long)]
    run: std::path::PathBuf,
    /// Source sentences, one per line (.gz read as gzip).
    #[arg(long)]
    src: std::path::PathBuf,
    /// Translate only the first N sentences.
    #[arg(long)]
    max_sentences: Option<usize>,
    /// Beam size (1 = greedy).
    #[arg(long, default_value_t = 5)]
    beam: usize,
    /// Sentences per batch [default: as `mt translate`, 128 decoder rows / beam].
    #[arg(long)]
    batch: Option<usize>,
    /// Greedy single-sentence latency over the first N sentences (0: skip).
    #[arg(long, default_value_t = 50)]
    latency_sentences: usize,
    /// Timed passes over the file (the median is reported).
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// Write src.ids (the encoder's input ids, one sentence per line), hyp.ids (the
    /// output ids) and greedy.ids (the greedy latency run's output ids) to this folder.
    #[arg(long)]
    dump: Option<std::path::PathBuf>,
    /// Arithmetic of decoding's products: none (f32), int8, int8-layers (as `mt translate`).
    /// [default: the run's]
    #[arg(long, value_enum)]
    quantize: Option<crate::mt::Quantize>,
    /// Score only each batch's candidate tokens (the run's `vocab_map.json`, as `mt
    /// translate --restrict-vocab`).
    #[arg(long)]
    restrict_vocab: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    device: crate::device::DeviceArg,
}

#[derive(Args)]
#[command(
    after_help = "Examples:\n  transformer bench lm\n  transformer bench lm --repeats 5 --json\n  scripts/bench_vs_pytorch.sh   # the same measurements for PyTorch, side by side"
)]
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
    #[command(flatten)]
    run: StepBenchRun,
}

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Lm(args) => lm(args),
        BenchCommand::Mt(args) => mt(args),
        BenchCommand::MtDecode(args) => mt_decode(args),
        BenchCommand::Serve(args) => crate::serve::bench(args),
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

/// What the step benchmarks (`bench lm`, `bench mt`) share: their seed, how they repeat and
/// report their measurements, and the device.
#[derive(Args)]
pub struct StepBenchRun {
    /// Seed for initialisation and dropout (and `bench lm`'s random token ids).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Untimed repetitions before each measurement.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Timed repetitions of each measurement (min and median are reported).
    #[arg(long, default_value_t = 10)]
    repeats: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    device: crate::device::DeviceArg,
}

/// A training step's f32 times, the peak memory after them, what bf16 training runs on
/// here and the bf16 times ([`StepBenchRun::precisions`]).
type StepTimes = (Stats, Option<f64>, Option<String>, Option<Stats>);

impl StepBenchRun {
    fn check(&self) -> Result<()> {
        anyhow::ensure!(self.repeats >= 1, "--repeats must be at least 1");
        Ok(())
    }

    /// Runs `f` `warmup` times untimed, then `repeats` times timed (milliseconds each).
    fn time(&self, mut f: impl FnMut() -> Result<()>) -> Result<Stats> {
        for _ in 0..self.warmup {
            f()?;
        }
        let mut ms = Vec::with_capacity(self.repeats);
        for _ in 0..self.repeats {
            let start = Instant::now();
            f()?;
            ms.push(start.elapsed().as_secs_f64() * 1e3);
        }
        Ok(Stats::of(ms))
    }

    /// Times `step` in f32, then in bf16 where the CPU has AMX or AVX512-BF16 (on a GPU:
    /// autocast, every product of the composed layers in bf16). Returns the f32 times, the
    /// peak memory after them, what bf16 training runs on here ([`bf16_training`]) and the
    /// bf16 times.
    fn precisions(
        &self,
        dev: &Device,
        mut step: impl FnMut(Precision) -> Result<()>,
    ) -> Result<StepTimes> {
        let f32 = self.time(|| step(Precision::F32))?;
        let peak_rss = peak_rss_mb();
        let bf16_unit = bf16_training(dev);
        let bf16 = match bf16_unit {
            Some(_) => Some(self.time(|| step(Precision::Bf16))?),
            None => None,
        };
        Ok((f32, peak_rss, bf16_unit, bf16))
    }
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
    a.run.check()?;
    anyhow::ensure!(
        a.vocab >= 1 && a.batch >= 1 && a.bptt >= 1 && a.eval_batch >= 1 && a.gen_prompt >= 1,
        "--vocab, --batch, --bptt, --eval-batch and --gen-prompt must be positive"
    );
    let dev = a.run.device.open()?;
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
    // A model trains in the precision it is built with: the bf16 steps run a second model
    // of the same initial weights, built when bf16 is timed.
    let build = |precision: Precision| -> Result<(TransformerLm, LmStep, Params)> {
        let pb = ParamBuilder::new(DType::F32, &dev, a.run.seed).with_precision(precision);
        let model = TransformerLm::new(&pb, &cfg).context("building the model")?;
        let step = LmStep::new(pb.params().vars(), a.lr, a.clip);
        Ok((model, step, pb.params()))
    };
    let (model, mut lm_step, params) = build(Precision::F32)?;
    let mut bf16 = None;
    let data_rng = Rng::new(a.run.seed ^ 0x5eed_da7a);
    let dropout_rng = Rng::new(a.run.seed.wrapping_add(1));

    // a. Training step, as the loop in transformer_train::lm::train takes it.
    let (input, target) = random_window(&data_rng, a.batch, a.bptt, a.vocab, &dev)?;
    let mut last_loss = f64::NAN;
    let mut step = |precision: Precision| -> Result<()> {
        let (m, s) = match precision {
            Precision::F32 => (&model, &mut lm_step),
            Precision::Bf16 => {
                let (m, s, _) = match &mut bf16 {
                    Some(built) => built,
                    None => bf16.insert(build(Precision::Bf16)?),
                };
                (&*m, s)
            }
        };
        last_loss = s.run(m, &input, &target, &dropout_rng)?;
        Ok(())
    };
    // In bf16, the output layer's products (mixed precision).
    let (train, peak_rss, bf16_unit, train_bf16) = a.run.precisions(&dev, &mut step)?;

    // b. Evaluation forward on the tutorial's evaluate batch.
    let (eval_input, eval_target) = random_window(&data_rng, a.eval_batch, a.bptt, a.vocab, &dev)?;
    // As transformer_train::lm::evaluate takes it (PyTorch's side runs under no_grad).
    let eval = a.run.time(|| {
        let loss = model.loss(
            &eval_input,
            &eval_target,
            transformer_model::Mode::Eval,
            Backprop::Off,
        )?;
        loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        Ok(())
    })?;

    // c. Greedy generation, batch 1, with the key/value cache.
    let prompt = random_ids(&data_rng, a.gen_prompt, a.vocab);
    let greedy = Sampling {
        temperature: 0.0,
        top_k: None,
    };
    let gen_rng = Rng::new(a.run.seed);
    let gen = a.run.time(|| {
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
        "warmup": a.run.warmup,
        "repeats": a.run.repeats,
    });
    if a.run.json {
        let out = serde_json::json!({
            "impl": "transformer (candle-core 0.11, fp32)",
            "device": crate::device::name_of(&dev),
            "train_step_bf16_ms": train_bf16.as_ref().map(|t| t.json()),
            "bf16_products": bf16_unit,
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
            a.run.warmup, a.run.repeats
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
                "training step ms, bf16 products", t.min, t.median
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

/// The benchmark batch, identical to `scripts/bench_mt_torch.py`'s: row `i` has source length
/// `S - i % 6` and target length `T - 5i % 7`; source ids `4 + (977 i + 7919 j + 13) mod
/// (V - 4)`, target ids `y(i, j) = 4 + (131 i + 7919 j) mod (V - 4)`, `tgt_in = y(i, j)` and
/// `tgt_out = y(i, j + 1)`; pad (id 0) elsewhere. Returns the tensors and the target tokens.
fn mt_batch(a: &MtBenchArgs, dev: &Device) -> Result<(Tensor, Tensor, Tensor, usize)> {
    let (b, s, t, v) = (a.batch, a.src_len, a.tgt_len, a.vocab);
    let span = (v - 4) as u64;
    let (mut src, mut tin, mut tout) = (vec![0u32; b * s], vec![0u32; b * t], vec![0u32; b * t]);
    let mut tokens = 0;
    for i in 0..b {
        let sl = s - i % 6;
        let tl = t - (i * 5) % 7;
        for j in 0..sl {
            src[i * s + j] = 4 + ((i as u64 * 977 + j as u64 * 7919 + 13) % span) as u32;
        }
        let y = |j: usize| 4 + ((i as u64 * 131 + j as u64 * 7919) % span) as u32;
        for j in 0..tl {
            tin[i * t + j] = y(j);
            tout[i * t + j] = y(j + 1);
        }
        tokens += tl;
    }
    Ok((
        Tensor::from_vec(src, (b, s), dev)?,
        Tensor::from_vec(tin, (b, t), dev)?,
        Tensor::from_vec(tout, (b, t), dev)?,
        tokens,
    ))
}

fn mt(a: MtBenchArgs) -> Result<()> {
    use transformer_runtime::config::MtTrainConfig;
    use transformer_runtime::model::MtModel;
    use transformer_train::mt::train_step;
    use transformer_train::optim::Adam;
    a.run.check()?;
    anyhow::ensure!(
        a.batch >= 1 && a.src_len >= 6 && a.tgt_len >= 7 && a.vocab > 4,
        "--batch must be positive, --src-len at least 6, --tgt-len at least 7, --vocab above 4"
    );
    let dev = a.run.device.open()?;
    let mut cfg = MtTrainConfig::default();
    if a.model == BenchModel::Base {
        cfg.d_model = 512;
        cfg.dim_feedforward = 2048;
        cfg.encoder_layers = 6;
        cfg.decoder_layers = 6;
    }
    let model_cfg = cfg.model_config(a.vocab);
    // A model trains in the precision it is built with: the bf16 steps run a second model
    // of the same initial weights, built when bf16 is timed.
    struct Trainee {
        model: MtModel,
        params: Params,
        opt: Adam,
        direct: transformer_model::DirectGrads,
    }
    let build = |precision: Precision| -> Result<Trainee> {
        let pb = ParamBuilder::new(DType::F32, &dev, a.run.seed).with_precision(precision);
        let model = MtModel::build(&pb, &model_cfg).context("building the model")?;
        let params = pb.params();
        let opt = Adam::new(params.vars(), 5e-4)?;
        let direct = transformer_model::DirectGrads::new();
        Ok(Trainee {
            model,
            params,
            opt,
            direct,
        })
    };
    let mut f32_trainee = build(Precision::F32)?;
    let mut bf16 = None;
    let (src, tgt_in, tgt_out, tokens) = mt_batch(&a, &dev)?;
    let rng = Rng::new(a.run.seed.wrapping_add(1));
    let mut last = (f64::NAN, f64::NAN);
    let mut step = |precision: Precision| -> Result<()> {
        let t = match precision {
            Precision::F32 => &mut f32_trainee,
            Precision::Bf16 => match &mut bf16 {
                Some(built) => built,
                None => bf16.insert(build(Precision::Bf16)?),
            },
        };
        last = train_step(
            &t.model,
            &t.params.vars(),
            &mut t.opt,
            &t.direct,
            cfg.clip,
            [&src, &tgt_in, &tgt_out],
            0,
            cfg.label_smoothing,
            &rng,
        )?;
        Ok(())
    };
    // In bf16, the output layer's and the encoder and decoder layers' projection and
    // feed-forward products (mixed precision).
    let (train, peak_rss, bf16_unit, train_bf16) = a.run.precisions(&dev, &mut step)?;
    let Trainee {
        model,
        params,
        mut opt,
        direct,
    } = f32_trainee;
    let phases = mt_phases(
        &a,
        &dev,
        &model,
        &params.vars(),
        &mut opt,
        &direct,
        &cfg,
        [&src, &tgt_in, &tgt_out],
        &rng,
    )?;
    let threads = candle_core::utils::get_num_threads();
    if a.run.json {
        let out = serde_json::json!({
            "impl": "transformer (candle-core 0.11, fp32)",
            "device": crate::device::name_of(&dev),
            "model": format!("{:?}", a.model).to_lowercase(),
            "train_step_ms": train.json(),
            "train_step_bf16_ms": train_bf16.as_ref().map(|t| t.json()),
            "bf16_products": bf16_unit,
            "tgt_tokens": tokens,
            "tokens_per_s": tokens as f64 / (train.median / 1e3),
            "tokens_per_s_bf16": train_bf16.as_ref().map(|t| tokens as f64 / (t.median / 1e3)),
            "phases_ms": phases,
            "peak_rss_mb": peak_rss,
            "threads": threads,
            "parameters": params.num_elements(),
            "final_loss": last.0,
            "shapes": {"batch": a.batch, "src_len": a.src_len, "tgt_len": a.tgt_len,
                       "vocab": a.vocab, "warmup": a.run.warmup, "repeats": a.run.repeats},
        });
        println!("{out}");
    } else {
        println!(
            "translation model: {}, vocabulary {} (shared); {} parameters; {} threads",
            a.model.describe(),
            a.vocab,
            params.num_elements(),
            threads
        );
        println!(
            "training step ({} x {} -> {}, {} target tokens; label smoothing 0.1, clip, Adam): best {:.1} ms, median {:.1} ms ({:.0} target tokens/s)",
            a.batch,
            a.src_len,
            a.tgt_len,
            tokens,
            train.min,
            train.median,
            tokens as f64 / (train.median / 1e3)
        );
        match &train_bf16 {
            Some(t) => println!(
                "training step, bf16 products (the output layer's and the layers' projections and feed-forward; attention's too on a GPU): best {:.1} ms, median {:.1} ms",
                t.min, t.median
            ),
            None => println!(
                "training step, bf16: no AMX or AVX512-BF16 on this CPU (or TRANSFORMER_NO_BF16)"
            ),
        }
        println!(
            "the f32 step's phases, median ms: forward with the loss {:.1}, backward {:.1}, clipping and Adam {:.1}",
            phases["forward_loss"].as_f64().unwrap_or(f64::NAN),
            phases["backward"].as_f64().unwrap_or(f64::NAN),
            phases["clip_optimizer"].as_f64().unwrap_or(f64::NAN)
        );
        if let Some(mb) = peak_rss {
            println!("peak RSS: {mb:.0} MB");
        }
    }
    Ok(())
}

/// The f32 training step of [`mt`] in its three phases, each timed to the device's completion
/// (median ms over the repeats): the forward pass with the loss, the backward pass, and
/// clipping with the optimizer step. Where the time goes, on a GPU above all, where a step is
/// launched asynchronously and only the loss read back waits for it.
#[allow(clippy::too_many_arguments)]
fn mt_phases(
    a: &MtBenchArgs,
    dev: &Device,
    model: &transformer_runtime::model::MtModel,
    vars: &[candle_core::Var],
    opt: &mut transformer_train::optim::Adam,
    direct: &transformer_model::DirectGrads,
    cfg: &transformer_runtime::config::MtTrainConfig,
    [src, tgt_in, tgt_out]: [&Tensor; 3],
    rng: &Rng,
) -> Result<serde_json::Value> {
    use transformer_model::Mode;
    use transformer_train::{clip::clip_coefficient, Gradients};
    let mut ms = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..a.run.repeats {
        dev.synchronize()?;
        let t = Instant::now();
        let l = model.loss(
            [src, tgt_in, tgt_out],
            (0, cfg.label_smoothing),
            Mode::Train(rng),
            transformer_model::Backprop::Direct(direct),
        )?;
        dev.synchronize()?;
        let t1 = Instant::now();
        let grads = Gradients::from_backward(&l.loss, vars, direct)?;
        dev.synchronize()?;
        let t2 = Instant::now();
        let (_, coef) = clip_coefficient(&grads, cfg.clip)?;
        opt.step(&grads, coef)?;
        drop(grads);
        dev.synchronize()?;
        let t3 = Instant::now();
        for (v, d) in ms.iter_mut().zip([t1 - t, t2 - t1, t3 - t2]) {
            v.push(d.as_secs_f64() * 1e3);
        }
    }
    let [f, b, o] = ms.map(|v| Stats::of(v).median);
    Ok(serde_json::json!({ "forward_loss": f, "backward": b, "clip_optimizer": o }))
}

fn mt_decode(a: MtDecodeBenchArgs) -> Result<()> {
    use transformer_decode::greedy;
    use transformer_runtime::translate::{best, translate, DecodeRequest, DECODE_BATCH_ROWS};
    use transformer_text::subword::TextTokenizer;
    anyhow::ensure!(a.beam >= 1, "--beam must be at least 1 (1 = greedy)");
    anyhow::ensure!(a.repeats >= 1, "--repeats must be at least 1");
    let dev = a.device.open()?;
    let how = crate::mt::execution(&dev, a.quantize, a.restrict_vocab);
    let run = crate::mt::load_and_say(&a.run, &how)?;
    let mut lines = transformer_text::parallel::read_lines(&a.src)?;
    if let Some(n) = a.max_sentences {
        lines.truncate(n);
    }
    let src: Vec<Vec<u32>> = lines
        .iter()
        .map(|l| run.tokenizer.encode(l))
        .filter(|ids| !ids.is_empty())
        .collect();
    anyhow::ensure!(
        !src.is_empty(),
        "{}: no sentences to translate",
        a.src.display()
    );
    let opts = run.config.decode_options(a.beam);
    let batch = a.batch.unwrap_or((DECODE_BATCH_ROWS / a.beam).max(1));
    anyhow::ensure!(batch >= 1, "--batch must be at least 1");
    let request = DecodeRequest::new(opts).with_batch_rows(batch * a.beam);
    let mut hyps = Vec::new();
    let mut secs = Vec::with_capacity(a.repeats);
    for _ in 0..a.repeats {
        let t = Instant::now();
        // The decoding weights are prepared inside the timed part, once per pass.
        hyps = best(translate(
            &run.model.decoder()?,
            &src,
            &request,
            &dev,
            |_, _| {},
        )?);
        secs.push(t.elapsed().as_secs_f64());
    }
    let peak_rss = peak_rss_mb();
    let seconds = Stats::of(secs).median;
    let tokens: usize = hyps.iter().map(|h| h.tokens.len()).sum();
    // Greedy, one sentence at a time: the interactive case, a loaded model (its decoding
    // weights made ready once, as a translation server keeps them) given one sentence.
    let decoder = run.model.decoder()?;
    // The translation alone, as an interactive user wants it (no scores).
    let greedy_opts = transformer_decode::DecodeOptions {
        want_scores: false,
        ..run.config.decode_options(1)
    };
    let n_lat = a.latency_sentences.min(src.len());
    let mut lat = Vec::with_capacity(n_lat);
    let mut greedy_hyps = Vec::with_capacity(n_lat);
    for ids in src.iter().take(n_lat) {
        let mut row = ids.clone();
        row.extend(greedy_opts.source_end);
        let len = row.len();
        let s = Tensor::from_vec(row, (1, len), &dev)?;
        let t = Instant::now();
        let h = greedy(&decoder, &s, &greedy_opts)?;
        lat.push(t.elapsed().as_secs_f64() * 1e3);
        greedy_hyps.extend(h);
    }
    let latency = (!lat.is_empty()).then(|| Stats::of(lat).median);
    if let Some(dir) = &a.dump {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let join = |rows: &mut dyn Iterator<Item = Vec<u32>>| -> String {
            rows.map(|r| r.iter().map(u32::to_string).collect::<Vec<_>>().join(" ") + "\n")
                .collect()
        };
        let src_ids = join(&mut src.iter().map(|s| {
            let mut r = s.clone();
            r.extend(greedy_opts.source_end);
            r
        }));
        let hyp_ids = join(&mut hyps.iter().map(|h| h.tokens.clone()));
        let greedy_ids = join(&mut greedy_hyps.iter().map(|h| h.tokens.clone()));
        for (name, text) in [
            ("src.ids", src_ids),
            ("hyp.ids", hyp_ids),
            ("greedy.ids", greedy_ids),
        ] {
            let p = dir.join(name);
            std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))?;
        }
    }
    let threads = candle_core::utils::get_num_threads();
    let (sps, tps) = (src.len() as f64 / seconds, tokens as f64 / seconds);
    if a.json {
        let out = serde_json::json!({
            "impl": format!("transformer (candle-core 0.11, {})", run.model.describe_decoding()?),
            "quantize": format!("{:?}", run.model.decode_precision()).to_lowercase(),
            "sentences": src.len(),
            "tokens": tokens,
            "seconds": seconds,
            "sentences_per_s": sps,
            "tokens_per_s": tps,
            "greedy_latency_ms": latency,
            "beam": a.beam,
            "batch": batch,
            "length_penalty": opts.length_penalty,
            "max_len_a": opts.max_len_a,
            "max_len_b": opts.max_len_b,
            "peak_rss_mb": peak_rss,
            "threads": threads,
        });
        println!("{out}");
    } else {
        println!(
            "{} sentences, beam {}: {:.2} s ({sps:.1} sentences/s, {tps:.0} tokens/s); {} threads",
            src.len(),
            a.beam,
            seconds,
            threads
        );
        if let Some(l) = latency {
            println!("greedy, one sentence at a time: median {l:.1} ms over {n_lat} sentences");
        }
        if let Some(mb) = peak_rss {
            println!("peak RSS: {mb:.0} MB");
        }
    }
    Ok(())
}
