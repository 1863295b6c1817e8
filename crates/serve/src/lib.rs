//! `transformer serve`: trained translation runs behind LibreTranslate's HTTP API, so that
//! its existing clients (libretranslatepy, Mastodon, browser extensions, the npm package)
//! work unchanged, with requests batched together on the model.
//!
//! - [`engine`]: the loaded runs and the one worker thread that translates the queued
//!   requests in batches.
//! - [`api`]: the endpoints (`/translate`, `/detect`, `/languages`, `/frontend/settings`,
//!   `/health`, the native `/v1/translate` and `/v1/attention`, the web page at `/`).
//! - [`html`]: `format=html`, text translated and markup kept.
//! - [`keep`]: what of a text goes to the model (its sentences) and what is kept as written
//!   (URLs, mentions, hashtags, emoji in social-media HTML).
//! - [`detect`]: which served language a text is in.
//! - [`load`]: the load generator of `transformer bench serve`.
//!
//! The HTTP stack is hyper (through axum's router) on tokio; each connection is served by
//! hyper's HTTP/1 connection builder so that a client that sends its headers slowly is cut
//! off (`header_timeout`), and the listener stops on SIGTERM or Ctrl-C while the requests
//! in flight finish.

#![warn(missing_docs)]

pub mod api;
pub mod detect;
pub mod engine;
pub mod html;
pub mod keep;
pub mod languages;
pub mod load;

pub use api::{AppState, Limits, Stats};
pub use engine::{Engine, EngineOptions, RunSpec};

use anyhow::Context;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::collections::HashSet;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Everything `transformer serve` is told.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The runs to serve.
    pub runs: Vec<RunSpec>,
    /// Address to bind (loopback unless told otherwise).
    pub host: String,
    /// Port (0: any free one; the chosen port is printed).
    pub port: u16,
    /// Decoding and batching.
    pub engine: EngineOptions,
    /// Per-request limits.
    pub limits: Limits,
    /// A file of accepted API keys, one per line (`#` starts a comment).
    pub api_keys: Option<PathBuf>,
    /// Time a client has to send a request's headers.
    pub header_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// Time the requests in flight get to finish after SIGTERM.
    pub grace: Duration,
    /// Log one line per request to stderr.
    pub log: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            runs: Vec::new(),
            host: "127.0.0.1".into(),
            port: 5000,
            engine: EngineOptions::default(),
            limits: Limits::default(),
            api_keys: None,
            header_timeout: Duration::from_secs(10),
            max_connections: 1024,
            grace: Duration::from_secs(30),
            log: true,
        }
    }
}

/// Reads an API key file: one key per line, blank lines and `#` comments skipped.
pub fn read_api_keys(path: &std::path::Path) -> anyhow::Result<HashSet<String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the API key file {}", path.display()))?;
    let keys: HashSet<String> = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    if keys.is_empty() {
        anyhow::bail!(
            "{}: no API keys in it (one key per line; # starts a comment)",
            path.display()
        );
    }
    Ok(keys)
}

/// Loads the runs and builds the server's state.
pub fn build_state(opts: &ServeOptions) -> anyhow::Result<Arc<AppState>> {
    let api_keys = match &opts.api_keys {
        Some(p) => Some(read_api_keys(p)?),
        None => None,
    };
    let engine = Arc::new(Engine::load(&opts.runs, &opts.engine)?);
    Ok(Arc::new(AppState {
        engine,
        limits: opts.limits.clone(),
        api_keys,
        stats: Mutex::new(Stats::default()),
        log: opts.log,
    }))
}

/// Serves `state` on `listener` until `shutdown` completes; then stops accepting, lets the
/// requests in flight finish (at most `opts.grace`), and returns.
pub async fn serve_until(
    listener: TcpListener,
    state: Arc<AppState>,
    opts: &ServeOptions,
    shutdown: impl Future<Output = ()>,
) {
    let app = api::router(state);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(opts.max_connections.max(1)));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            _ = &mut shutdown => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before it was
                    // accepted: the server stays up and tries again.
                    eprintln!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(opts.header_timeout)
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(opts.grace) => {
            eprintln!("stopping with requests still in flight after {:?}", opts.grace);
        }
    }
}

/// Resolves when the process gets SIGTERM or Ctrl-C (SIGINT).
pub async fn termination() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("a SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// `transformer serve`: loads the runs, binds, serves until SIGTERM or Ctrl-C, and prints a
/// summary.
pub fn run(opts: ServeOptions) -> anyhow::Result<()> {
    let started = Instant::now();
    let state = build_state(&opts)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the server's runtime")?;
    rt.block_on(async {
        let addr: SocketAddr = format!("{}:{}", opts.host, opts.port)
            .parse()
            .or_else(|_| {
                std::net::ToSocketAddrs::to_socket_addrs(&(opts.host.as_str(), opts.port))
                    .ok()
                    .and_then(|mut a| a.next())
                    .ok_or(())
            })
            .map_err(|_| anyhow::anyhow!("--host {}: not an address to bind", opts.host))?;
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} (--host, --port)"))?;
        let bound = listener.local_addr()?;
        for p in state.engine.pairs() {
            eprintln!(
                "serving {} -> {} from {} ({}, beam {}, at most {} tokens per sentence; {})",
                p.src,
                p.tgt,
                p.run.display(),
                p.arch.name(),
                p.opts.beam,
                p.max_source_tokens,
                p.decoding
            );
        }
        if state.api_keys.is_some() {
            eprintln!("API keys required");
        }
        // The line scripts wait for (the port is the one bound, also when --port 0).
        println!("listening on http://{bound}");
        serve_until(listener, state.clone(), &opts, termination()).await;
        anyhow::Ok(())
    })?;
    state.engine.shutdown();
    let s = state.stats.lock().expect("stats lock").clone();
    let mut ms = s.translate_ms.clone();
    ms.sort_by(f64::total_cmp);
    let pct = |p: f64| -> f64 {
        if ms.is_empty() {
            0.0
        } else {
            ms[((ms.len() - 1) as f64 * p).round() as usize]
        }
    };
    eprintln!(
        "stopped after {:.0} s: {} requests ({} errors, {} refused as busy), {} sentences \
         translated in {} batches; /translate p50 {:.1} ms, p99 {:.1} ms",
        started.elapsed().as_secs_f64(),
        s.requests,
        s.errors,
        s.refused,
        s.sentences,
        state.engine.batches(),
        pct(0.5),
        pct(0.99)
    );
    Ok(())
}
