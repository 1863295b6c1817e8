//! `transformer serve` and `transformer bench serve`.

use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;
use transformer_serve::load::{self, LoadOptions};
use transformer_serve::{EngineOptions, Limits, RunSpec, ServeOptions};
use transformer_text::parallel::read_lines;

#[derive(Args)]
#[command(
    after_help = "Examples:\n  transformer serve --run runs/de-en\n  transformer serve --run de:en=runs/de-en --run ko:en=runs/ko-en --port 8080\n  curl -s localhost:5000/translate -H 'Content-Type: application/json' \\\n       -d '{\"q\": \"Ein Mann fährt Fahrrad.\", \"source\": \"de\", \"target\": \"en\"}'\n\nOpen http://127.0.0.1:5000/ for the web page. A LibreTranslate client takes the same\naddress, e.g. in Python: LibreTranslateAPI(\"http://127.0.0.1:5000/\").translate(\"Hallo\", \"de\", \"en\").\nSIGTERM or Ctrl-C stops accepting, finishes the requests in flight, and prints a summary."
)]
pub struct ServeArgs {
    /// A trained translation run to serve: DIR (its language codes come from the run:
    /// --src-lang/--tgt-lang or --corpus at training), or SRC:TGT=DIR to name them
    /// (de:en=runs/de-en). Repeat for more pairs.
    #[arg(long = "run", value_name = "[SRC:TGT=]DIR")]
    runs: Vec<RunSpec>,
    /// A published model to serve beside (or instead of) runs: an Argos Translate package
    /// (.argosmodel, its languages and names from its metadata), a CTranslate2 or MarianMT
    /// (OPUS-MT) directory (name its languages: de:en=DIR), or a run directory. Repeat for
    /// more.
    #[arg(long = "model", value_name = "[SRC:TGT=]PATH")]
    models: Vec<RunSpec>,
    /// Address to listen on: loopback by default; 0.0.0.0 to serve other machines.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port (0 picks a free one; the address is printed on stdout).
    #[arg(long, default_value_t = 5000)]
    port: u16,
    /// Beam size (1 = greedy) [default: each run's, 5]
    #[arg(long)]
    beam: Option<usize>,
    /// Threads for the model's kernels [default: every core the process may use]
    #[arg(long)]
    threads: Option<usize>,
    /// A file of accepted API keys, one per line: requests without one of them get 403.
    #[arg(long, value_name = "FILE")]
    api_keys: Option<PathBuf>,
    /// Milliseconds the batcher waits after a request for others to translate with it.
    #[arg(long, default_value_t = 2)]
    batch_wait_ms: u64,
    /// Sentences per batch at most.
    #[arg(long, default_value_t = 256)]
    max_batch: usize,
    /// Sentences queued at most; a request beyond answers 429 (Slowdown) at once.
    #[arg(long, default_value_t = 4096)]
    max_queue: usize,
    /// Texts in one request's q list at most.
    #[arg(long, default_value_t = 256)]
    batch_limit: usize,
    /// Characters of q per request at most (-1: no limit).
    #[arg(long, default_value_t = 20_000, allow_negative_numbers = true)]
    char_limit: i64,
    /// Request body bytes at most (larger bodies get 413).
    #[arg(long, default_value_t = 1 << 20)]
    max_body: usize,
    /// Seconds a client has to send its request headers.
    #[arg(long, default_value_t = 10)]
    header_timeout: u64,
    /// Connections served at once (more wait to be accepted).
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Do not log a line per request.
    #[arg(long)]
    quiet: bool,
    /// Arithmetic of decoding's products: none (f32), int8 (decoder layers and output
    /// layer), int8-layers (as `mt translate --quantize`).
    /// [default: each run's]
    #[arg(long, value_enum)]
    quantize: Option<crate::mt::Quantize>,
    #[command(flatten)]
    device: crate::device::DeviceArg,
}

/// Sets the number of threads the kernels and candle use, before any of them starts.
pub fn set_threads(threads: Option<usize>) -> Result<()> {
    if let Some(t) = threads {
        if t == 0 {
            bail!("--threads must be at least 1");
        }
        std::env::set_var("CANDLE_NUM_THREADS", t.to_string());
        std::env::set_var("RAYON_NUM_THREADS", t.to_string());
    }
    Ok(())
}

pub fn serve(a: ServeArgs) -> Result<()> {
    set_threads(a.threads)?;
    transformer_runtime::run_dir::require_at_least_one(&[
        ("--max-batch", a.max_batch),
        ("--max-queue", a.max_queue),
        ("--batch-limit", a.batch_limit),
        ("--max-body", a.max_body),
        ("--max-connections", a.max_connections),
    ])
    .map_err(anyhow::Error::msg)?;
    if a.char_limit == 0 || a.char_limit < -1 {
        bail!("--char-limit must be positive, or -1 for no limit");
    }
    if a.header_timeout == 0 {
        bail!("--header-timeout must be at least 1 second");
    }
    if a.beam == Some(0) {
        bail!("--beam must be at least 1 (1 = greedy)");
    }
    let device = a.device.open()?;
    crate::mt::execution(&device, a.quantize, false).check()?;
    let precision = a.quantize.map(|q| q.precision());
    if a.runs.is_empty() && a.models.is_empty() {
        bail!("give a run (--run DIR) or a published model (--model PATH) to serve");
    }
    let opts = ServeOptions {
        runs: a.runs.into_iter().chain(a.models).collect(),
        host: a.host,
        port: a.port,
        engine: EngineOptions {
            beam: a.beam,
            batch_wait: Duration::from_millis(a.batch_wait_ms),
            max_batch_sentences: a.max_batch,
            max_queue: a.max_queue,
            precision,
            device,
            ..EngineOptions::default()
        },
        limits: Limits {
            max_body: a.max_body,
            char_limit: (a.char_limit > 0).then_some(a.char_limit as usize),
            batch_limit: a.batch_limit,
            ..Limits::default()
        },
        api_keys: a.api_keys,
        header_timeout: Duration::from_secs(a.header_timeout),
        max_connections: a.max_connections,
        log: !a.quiet,
        ..ServeOptions::default()
    };
    transformer_serve::run(opts)
}

#[derive(Args)]
#[command(
    after_help = "Example:\n  M=../shared/data/multi30k/task1/raw\n  transformer bench serve --url http://127.0.0.1:5000 --src $M/test_2016_flickr.de.gz --source de --target en --clients 1,64\n  scripts/bench_serve.sh   # starts the server, runs this, and CTranslate2's translate_batch beside it"
)]
pub struct ServeBenchArgs {
    /// The server's address.
    #[arg(long, default_value = "http://127.0.0.1:5000")]
    url: String,
    /// Sentences to send, one per line (.gz read as gzip); each request carries one.
    #[arg(long)]
    src: PathBuf,
    /// Source language code.
    #[arg(long)]
    source: String,
    /// Target language code.
    #[arg(long)]
    target: String,
    /// Concurrent clients, each with one request in flight; several values run one after
    /// another (for example 1,64).
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    clients: Vec<usize>,
    /// Seconds to measure each load.
    #[arg(long, default_value_t = 20.0)]
    seconds: f64,
    /// Seconds to send before measuring each load.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Print one JSON object per load.
    #[arg(long)]
    json: bool,
}

pub fn bench(a: ServeBenchArgs) -> Result<()> {
    if a.clients.contains(&0) {
        bail!("--clients must be at least 1");
    }
    if !(a.seconds > 0.0 && a.warmup >= 0.0) {
        bail!("--seconds must be positive and --warmup not negative");
    }
    let sentences: Vec<String> = read_lines(&a.src)?
        .into_iter()
        .filter(|l| !l.trim().is_empty())
        .collect();
    if sentences.is_empty() {
        bail!("{}: no sentences in it", a.src.display());
    }
    let mut first: Option<f64> = None;
    for &clients in &a.clients {
        let r = load::run(&LoadOptions {
            url: a.url.clone(),
            source: a.source.clone(),
            target: a.target.clone(),
            sentences: sentences.clone(),
            clients,
            duration: Duration::from_secs_f64(a.seconds),
            warmup: Duration::from_secs_f64(a.warmup),
        })?;
        if a.json {
            println!(
                "{}",
                serde_json::json!({
                    "clients": r.clients,
                    "sentences_per_s": r.sentences_per_s,
                    "p50_ms": r.p50_ms,
                    "p99_ms": r.p99_ms,
                    "ok": r.ok,
                    "failed": r.failed,
                    "statuses": r.statuses,
                    "seconds": r.seconds,
                })
            );
        } else {
            println!("{r}");
        }
        if r.ok == 0 {
            bail!(
                "no request succeeded with {clients} clients (answers by status: {:?}): is the server at {} serving {} -> {}?",
                r.statuses,
                a.url,
                a.source,
                a.target
            );
        }
        match first {
            None => first = Some(r.sentences_per_s),
            Some(base) => println!(
                "serve_throughput_{}_vs_{}={:.2}",
                clients,
                a.clients[0],
                r.sentences_per_s / base.max(1e-9)
            ),
        }
    }
    Ok(())
}
