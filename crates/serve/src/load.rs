//! A load generator for the server (`transformer bench serve`): `clients` concurrent clients,
//! each posting one sentence per request to `/translate` as LibreTranslate's clients do, for
//! a fixed time; reports sentences per second and latency percentiles.

use anyhow::{bail, Context};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to send, how many at once, and for how long.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The server's base address (`http://127.0.0.1:5000`).
    pub url: String,
    /// Source language code.
    pub source: String,
    /// Target language code.
    pub target: String,
    /// The sentences, sent in turn (client `c` starts at sentence `c`).
    pub sentences: Vec<String>,
    /// Concurrent clients, each with one request in flight at a time.
    pub clients: usize,
    /// How long to measure.
    pub duration: Duration,
    /// How long to send before measuring (answers in this time are not counted).
    pub warmup: Duration,
}

/// What a load run measured.
#[derive(Debug, Clone)]
pub struct LoadReport {
    /// Concurrent clients.
    pub clients: usize,
    /// Requests answered with 200 in the measured time.
    pub ok: usize,
    /// Other answers (any status) and failed connections in the measured time.
    pub failed: usize,
    /// Answers by status.
    pub statuses: BTreeMap<u16, usize>,
    /// The measured time.
    pub seconds: f64,
    /// Sentences translated per second (one per request).
    pub sentences_per_s: f64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th-percentile latency, ms.
    pub p99_ms: f64,
}

impl std::fmt::Display for LoadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} clients: {:.1} sentences/s over {:.1} s ({} ok, {} failed), latency p50 {:.1} ms, p99 {:.1} ms",
            self.clients, self.sentences_per_s, self.seconds, self.ok, self.failed, self.p50_ms, self.p99_ms
        )
    }
}

/// Runs the load on a fresh runtime and returns what it measured.
pub fn run(opts: &LoadOptions) -> anyhow::Result<LoadReport> {
    if opts.sentences.is_empty() {
        bail!("no sentences to send");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the load generator's runtime")?;
    rt.block_on(run_async(opts))
}

async fn run_async(opts: &LoadOptions) -> anyhow::Result<LoadReport> {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(opts.clients.max(1))
        .build_http();
    let uri: hyper::Uri = format!("{}/translate", opts.url.trim_end_matches('/'))
        .parse()
        .with_context(|| format!("{}: not a URL", opts.url))?;
    let start = Instant::now();
    let measure_from = start + opts.warmup;
    let end = measure_from + opts.duration;
    let sentences = Arc::new(opts.sentences.clone());
    let mut tasks = Vec::new();
    for c in 0..opts.clients.max(1) {
        let (client, uri, sentences) = (client.clone(), uri.clone(), sentences.clone());
        let (source, target) = (opts.source.clone(), opts.target.clone());
        let clients = opts.clients.max(1);
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
            let mut failed = 0usize;
            let mut i = c;
            while Instant::now() < end {
                let q = &sentences[i % sentences.len()];
                i += clients;
                let body = serde_json::json!({ "q": q, "source": source, "target": target });
                let req = hyper::Request::post(uri.clone())
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body.to_string())))
                    .expect("a valid request");
                let t = Instant::now();
                let result = match client.request(req).await {
                    Ok(resp) => {
                        let status = resp.status().as_u16();
                        let _ = resp.into_body().collect().await;
                        Some(status)
                    }
                    Err(_) => None,
                };
                if t < measure_from {
                    continue;
                }
                let done = Instant::now();
                if done > end {
                    break;
                }
                match result {
                    Some(200) => lat.push((done - t).as_secs_f64() * 1e3),
                    Some(s) => {
                        *statuses.entry(s).or_default() += 1;
                        failed += 1;
                    }
                    None => failed += 1,
                }
            }
            (lat, statuses, failed)
        }));
    }
    let mut lat = Vec::new();
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    let mut failed = 0;
    for t in tasks {
        let (l, s, f) = t.await.context("a load client failed")?;
        lat.extend(l);
        for (k, v) in s {
            *statuses.entry(k).or_default() += v;
        }
        failed += f;
    }
    let ok = lat.len();
    *statuses.entry(200).or_default() += ok;
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if lat.is_empty() {
            0.0
        } else {
            lat[((lat.len() - 1) as f64 * p).round() as usize]
        }
    };
    let seconds = opts.duration.as_secs_f64();
    Ok(LoadReport {
        clients: opts.clients.max(1),
        ok,
        failed,
        statuses,
        seconds,
        sentences_per_s: ok as f64 / seconds.max(1e-9),
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
    })
}
