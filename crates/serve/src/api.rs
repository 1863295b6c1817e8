//! The HTTP API: LibreTranslate's endpoints as its clients call them, a native endpoint with
//! scores, n-best lists and alignments, and the web page.
//!
//! LibreTranslate's conventions kept here: the fields come as JSON, a url-encoded form or a
//! multipart form (query-string fields count too, the body's win); a single `q` answers a
//! single `translatedText`, a list answers a list in the same order; every error is
//! `{"error": "..."}` with status 400 (a bad request, naming the field), 403 (API key), 429
//! (`Slowdown: ...`, the queue is full) or 500 (a real fault); every answer carries
//! `Access-Control-Allow-Origin: *`, and `OPTIONS` answers a CORS preflight.
//!
//! Text is translated line by line, as `transformer mt translate` translates a file (each
//! line of `q` is one sentence to the model; the lines are joined back with `\n`), so an
//! answer is exactly what `mt translate` prints for the same lines.

use crate::detect::{detect, read, Detection, Reading};
use crate::engine::{encode_checked, Engine, EngineError};
use crate::{html, keep, languages};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use transformer_decode::Hypothesis;
use transformer_runtime::translate::hypothesis_text;
use transformer_text::subword::TextTokenizer;

mod fields;
mod native;

use fields::*;
use native::*;

/// Limits on what one request may ask.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Body bytes at most (413 beyond).
    pub max_body: usize,
    /// Characters of `q` per request at most (`None`: no limit).
    pub char_limit: Option<usize>,
    /// Texts in a list `q` at most.
    pub batch_limit: usize,
    /// Time to receive a body once its headers are in (408 beyond).
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body: 1 << 20,
            char_limit: Some(20_000),
            batch_limit: 256,
            body_timeout: Duration::from_secs(30),
        }
    }
}

/// What the server counts, for the summary it prints on shutdown.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// Requests answered.
    pub requests: usize,
    /// Of those, answered with a status of 400 or above.
    pub errors: usize,
    /// Of those, refused because the queue was full (429).
    pub refused: usize,
    /// Sentences translated.
    pub sentences: usize,
    /// Milliseconds per translation request (the first million).
    pub translate_ms: Vec<f64>,
}

/// The server's shared state.
pub struct AppState {
    /// The models and their worker.
    pub engine: Arc<Engine>,
    /// Request limits.
    pub limits: Limits,
    /// Accepted API keys (`None`: no key needed).
    pub api_keys: Option<HashSet<String>>,
    /// Counters for the shutdown summary.
    pub stats: Mutex<Stats>,
    /// Log one line per request to stderr.
    pub log: bool,
}

/// Sentences a response translated (read by the request log).
#[derive(Clone, Copy)]
struct Sentences(usize);

/// An error answer: `{"error": message}` with a status.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
    fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    fn missing(field: &str) -> Self {
        Self::bad(format!("Invalid request: missing {field} parameter"))
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Busy { .. } => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, format!("Slowdown: {e}"))
            }
            EngineError::Stopped => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
            EngineError::Failed(_) => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Cannot translate text: {e}"),
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({ "error": self.message }))).into_response()
    }
}

type ApiResult = Result<Response, ApiError>;

/// The router: every endpoint, the request log and CORS.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/translate", post(translate))
        .route("/detect", post(detect_route))
        .route("/languages", get(languages_route).post(languages_route))
        .route("/frontend/settings", get(frontend_settings))
        .route("/health", get(health))
        .route("/v1/translate", post(native_translate))
        .route("/v1/attention", post(attention_page))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            log_and_cors,
        ))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "Not found: see GET /languages, POST /translate, POST /detect",
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed")
}

/// Answers CORS preflights, adds LibreTranslate's CORS headers to every answer, counts and
/// logs each request.
async fn log_and_cors(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let t = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let mut resp = if method == Method::OPTIONS {
        StatusCode::NO_CONTENT.into_response()
    } else {
        next.run(req).await
    };
    let h = resp.headers_mut();
    for (k, v) in [
        ("access-control-allow-origin", "*"),
        (
            "access-control-allow-headers",
            "Authorization, Content-Type",
        ),
        ("access-control-expose-headers", "Authorization"),
        ("access-control-allow-methods", "GET, POST"),
        ("access-control-max-age", "1728000"),
    ] {
        h.insert(k, HeaderValue::from_static(v));
    }
    let sentences = resp.extensions().get::<Sentences>().map_or(0, |s| s.0);
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let status = resp.status();
    {
        let mut s = st.stats.lock().expect("stats lock");
        s.requests += 1;
        s.sentences += sentences;
        if status.as_u16() >= 400 {
            s.errors += 1;
        }
        if status == StatusCode::TOO_MANY_REQUESTS {
            s.refused += 1;
        }
        if path == "/translate" && status.is_success() && s.translate_ms.len() < 1_000_000 {
            s.translate_ms.push(ms);
        }
    }
    if st.log {
        eprintln!(
            "{method} {path} {} {sentences} sentences {ms:.1} ms",
            status.as_u16()
        );
    }
    resp
}

/// The source languages served.
fn sources(engine: &Engine) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in engine.pairs() {
        if !out.contains(&p.src) {
            out.push(p.src.clone());
        }
    }
    out
}

fn known(engine: &Engine, code: &str) -> bool {
    engine
        .pairs()
        .iter()
        .any(|p| p.src == code || p.tgt == code)
}

/// The pair translating `src` into `tgt`, or LibreTranslate's error for it.
fn pair_for(engine: &Engine, src: &str, tgt: &str) -> Result<usize, ApiError> {
    for code in [src, tgt] {
        if !known(engine, code) {
            return Err(ApiError::bad(format!("{code} is not supported")));
        }
    }
    engine.find(src, tgt).ok_or_else(|| {
        ApiError::bad(format!(
            "{} ({tgt}) is not available as a target language from {} ({src})",
            languages::name(tgt),
            languages::name(src)
        ))
    })
}

/// One text or text node cut into its parts ([`keep::parts`]), the parts to translate
/// being the segments from `first` on.
struct Unit {
    parts: Vec<keep::Part>,
    first: usize,
}

/// One text split into what the model translates: its lines (text) or text nodes (HTML),
/// each cut into sentences and kept parts.
enum Layout {
    /// Each line.
    Lines(Vec<Unit>),
    /// The fragment's pieces and each of its text nodes.
    Html(Vec<html::Piece>, Vec<Unit>),
}

/// Splits every text into segments, their token ids appended to `ids`; refuses a segment
/// longer than the model takes.
fn segment(
    engine: &Engine,
    pair: usize,
    texts: &[&str],
    format_html: bool,
    ids: &mut Vec<Vec<u32>>,
) -> Result<Vec<Layout>, ApiError> {
    let p = &engine.pairs()[pair];
    let unk = p.tokenizer.specials().unk;
    let mut spelled: std::collections::HashMap<char, bool> = Default::default();
    let mut spells = |c: char| {
        !p.spells_characters
            || *spelled.entry(c).or_insert_with(|| {
                !p.tokenizer
                    .encode(c.encode_utf8(&mut [0; 4]))
                    .contains(&unk)
            })
    };
    let mut layouts = Vec::with_capacity(texts.len());
    for (i, text) in texts.iter().enumerate() {
        let mut unit = |ids: &mut Vec<Vec<u32>>, s: &str, keep: keep::Keep| {
            let parts = keep::parts(s, keep, &mut spells);
            let first = ids.len();
            for t in transformer_text::sentence::to_translate(&parts) {
                let v = encode_checked(p, t).map_err(|n| {
                    ApiError::bad(format!(
                        "Invalid request: text {} holds a sentence of {n} tokens; this model \
                         takes at most {} tokens per sentence (split the text into shorter \
                         sentences or lines)",
                        i + 1,
                        p.max_source_tokens
                    ))
                })?;
                ids.push(v);
            }
            Ok::<_, ApiError>(Unit { parts, first })
        };
        if format_html {
            let pieces = html::split(text);
            let units = html::texts(&pieces)
                .into_iter()
                .map(|t| unit(ids, t, keep::Keep::Tokens))
                .collect::<Result<_, _>>()?;
            layouts.push(Layout::Html(pieces, units));
        } else {
            let units = text
                .split('\n')
                .map(|l| unit(ids, l.strip_suffix('\r').unwrap_or(l), keep::Keep::Spacing))
                .collect::<Result<_, _>>()?;
            layouts.push(Layout::Lines(units));
        }
    }
    Ok(layouts)
}

/// Translates the non-empty segments; an empty one gets an empty list.
async fn translate_segments(
    engine: &Engine,
    pair: usize,
    ids: Vec<Vec<u32>>,
) -> Result<Vec<Vec<Hypothesis>>, ApiError> {
    let nonempty: Vec<usize> = (0..ids.len()).filter(|&i| !ids[i].is_empty()).collect();
    let mut out = vec![Vec::new(); ids.len()];
    if nonempty.is_empty() {
        return Ok(out);
    }
    let run: Vec<Vec<u32>> = nonempty.iter().map(|&i| ids[i].clone()).collect();
    let h = engine.translate(pair, run).await?;
    for (i, hs) in nonempty.into_iter().zip(h) {
        out[i] = hs;
    }
    Ok(out)
}

/// The `k`-th best text of a layout (0 = the translation; a segment with fewer hypotheses
/// uses its best).
fn render(
    engine: &Engine,
    pair: usize,
    layout: &Layout,
    hyps: &[Vec<Hypothesis>],
    k: usize,
) -> String {
    let p = &engine.pairs()[pair];
    let text_of = |seg: usize, original: &str| -> Option<String> {
        let hs = &hyps[seg];
        let h = hs.get(k).or(hs.first())?;
        Some(hypothesis_text(&p.rules, &p.tokenizer, original, h))
    };
    let unit_text = |u: &Unit| -> String {
        let originals: Vec<&str> = transformer_text::sentence::to_translate(&u.parts).collect();
        let tr = originals
            .iter()
            .enumerate()
            .map(|(j, o)| text_of(u.first + j, o).unwrap_or_else(|| o.to_string()));
        keep::join(&u.parts, tr)
    };
    match layout {
        Layout::Lines(lines) => lines.iter().map(unit_text).collect::<Vec<_>>().join("\n"),
        Layout::Html(pieces, units) => {
            let tr: Vec<String> = units.iter().map(unit_text).collect();
            html::join(pieces, tr.iter().map(|s| s.as_str()))
        }
    }
}

/// `POST /translate`, as LibreTranslate.
async fn translate(State(st): State<Arc<AppState>>, req: Request) -> ApiResult {
    let f = read_fields(&st, req).await?;
    check_key(&st, &f)?;
    let q = f.q()?;
    let source = f.required("source")?;
    let target = f.required("target")?;
    let format = f.string("format")?.unwrap_or_else(|| "text".into());
    let format_html = match format.as_str() {
        "text" | "" => false,
        "html" => true,
        other => return Err(ApiError::bad(format!("{other} format is not supported"))),
    };
    let alternatives = f.count("alternatives")?;
    check_size(&st, &q)?;
    let engine = &st.engine;
    let texts = q.texts();
    // Each text's pair (with source=auto, each text's own detection).
    let (pairs, detected): (Vec<usize>, Option<Vec<Detection>>) = if source == "auto" {
        if !known(engine, &target) {
            return Err(ApiError::bad(format!("{target} is not supported")));
        }
        let candidates: Vec<String> = engine
            .pairs()
            .iter()
            .filter(|p| p.tgt == target)
            .map(|p| p.src.clone())
            .collect();
        if candidates.is_empty() {
            return Err(ApiError::bad(format!(
                "{} ({target}) is not available as a target language from any language served",
                languages::name(&target)
            )));
        }
        // A short text that its own letters do not settle (80% confidence) is judged with
        // the whole request's text, as LibreTranslate judges texts of 40 characters or
        // fewer; a short text in a script of its own (Korean among German) keeps its own.
        let all = texts.join("\n");
        let whole = read(&all, &candidates);
        let readings: Vec<Reading> = texts
            .iter()
            .map(|t| {
                let own = read(t, &candidates);
                if t.chars().count() > 40 || own.top().confidence >= 80.0 {
                    own
                } else {
                    whole.clone()
                }
            })
            .collect();
        // A text that no served language fits well enough is refused, not translated from
        // a language it is probably not in.
        if let Some((i, r)) = readings.iter().enumerate().find(|(_, r)| r.unsure()) {
            let served: Vec<String> = candidates
                .iter()
                .map(|c| format!("{} ({c})", languages::name(c)))
                .collect();
            let which = if texts.len() > 1 {
                format!("text {}", i + 1)
            } else {
                "the text".into()
            };
            let b = &r.best;
            return Err(ApiError::bad(format!(
                "Cannot detect the language of {which}: it reads as {} ({}) with confidence \
                 {:.1}, the best served language, {} ({}), has {:.1}; this server \
                 translates into {} from: {}. Give source to translate it anyway",
                languages::name(&b.language),
                b.language,
                b.confidence,
                languages::name(&r.top().language),
                r.top().language,
                r.top().confidence,
                languages::name(&target),
                served.join(", ")
            )));
        }
        let d: Vec<Detection> = readings.into_iter().map(|r| r.top().clone()).collect();
        let pairs = d
            .iter()
            .map(|x| pair_for(engine, &x.language, &target))
            .collect::<Result<_, _>>()?;
        (pairs, Some(d))
    } else {
        let p = pair_for(engine, &source, &target)?;
        (vec![p; texts.len()], None)
    };
    // Translate each pair's texts together.
    let mut outputs: Vec<(String, Vec<String>)> = vec![Default::default(); texts.len()];
    let mut sentences = 0;
    let mut order: Vec<usize> = pairs.clone();
    order.sort_unstable();
    order.dedup();
    for pair in order {
        let which: Vec<usize> = (0..texts.len()).filter(|&i| pairs[i] == pair).collect();
        let mine: Vec<&str> = which.iter().map(|&i| texts[i]).collect();
        let mut ids = Vec::new();
        let layouts = segment(engine, pair, &mine, format_html, &mut ids)?;
        sentences += ids.iter().filter(|v| !v.is_empty()).count();
        let hyps = translate_segments(engine, pair, ids).await?;
        for (&i, layout) in which.iter().zip(&layouts) {
            let best = render(engine, pair, layout, &hyps, 0);
            let mut alts: Vec<String> = Vec::new();
            if !format_html {
                for k in 1..=alternatives {
                    let a = render(engine, pair, layout, &hyps, k);
                    if a != best && !alts.contains(&a) {
                        alts.push(a);
                    }
                }
            }
            outputs[i] = (best, alts);
        }
    }
    let mut body = Map::new();
    match &q {
        Q::One(_) => {
            let (text, alts) = outputs.remove(0);
            body.insert("translatedText".into(), json!(text));
            if alternatives > 0 {
                body.insert("alternatives".into(), json!(alts));
            }
            if let Some(d) = detected {
                body.insert("detectedLanguage".into(), json!(d[0]));
            }
        }
        Q::Many(_) => {
            let (texts, alts): (Vec<String>, Vec<Vec<String>>) = outputs.into_iter().unzip();
            body.insert("translatedText".into(), json!(texts));
            if alternatives > 0 {
                body.insert("alternatives".into(), json!(alts));
            }
            if let Some(d) = detected {
                body.insert("detectedLanguage".into(), json!(d));
            }
        }
    }
    let mut resp = Json(Value::Object(body)).into_response();
    resp.extensions_mut().insert(Sentences(sentences));
    Ok(resp)
}

/// `POST /detect`: the served source languages, most likely first.
async fn detect_route(State(st): State<Arc<AppState>>, req: Request) -> ApiResult {
    let f = read_fields(&st, req).await?;
    check_key(&st, &f)?;
    let q = match f.q()? {
        Q::One(s) => s,
        Q::Many(v) => v.join("\n"),
    };
    Ok(Json(detect(&q, &sources(&st.engine))).into_response())
}

/// `GET /languages` (and POST): every language served, with the targets it translates to.
async fn languages_route(State(st): State<Arc<AppState>>) -> Response {
    Json(language_list(&st.engine)).into_response()
}

fn language_list(engine: &Engine) -> Value {
    let mut codes: Vec<String> = Vec::new();
    for p in engine.pairs() {
        for c in [&p.src, &p.tgt] {
            if !codes.contains(c) {
                codes.push(c.clone());
            }
        }
    }
    Value::Array(
        codes
            .iter()
            .map(|c| {
                let mut targets: Vec<&str> = engine
                    .pairs()
                    .iter()
                    .filter(|p| &p.src == c)
                    .map(|p| p.tgt.as_str())
                    .collect();
                targets.sort_unstable();
                // A published model's own name for its language (an Argos package's), as
                // LibreTranslate answers with it; else the code's name.
                let own = engine.pairs().iter().find_map(|p| {
                    let (s, t) = p.names.as_ref()?;
                    (&p.src == c)
                        .then(|| s.clone())
                        .or_else(|| (&p.tgt == c).then(|| t.clone()))
                });
                let name = own.unwrap_or_else(|| languages::name(c));
                json!({ "code": c, "name": name, "targets": targets })
            })
            .collect(),
    )
}

/// `GET /frontend/settings`, with LibreTranslate's fields as far as they apply.
async fn frontend_settings(State(st): State<Arc<AppState>>) -> Response {
    let target = st.engine.pairs()[0].tgt.clone();
    let keys = st.api_keys.is_some();
    Json(json!({
        "charLimit": st.limits.char_limit.map_or(-1, |c| c as i64),
        "frontendTimeout": 500,
        "apiKeys": keys,
        "keyRequired": keys,
        "suggestions": false,
        "filesTranslation": false,
        "supportedFilesFormat": [],
        "language": {
            "source": { "code": "auto", "name": "Auto Detect" },
            "target": { "code": target, "name": languages::name(&target) },
        },
    }))
    .into_response()
}

async fn health() -> Response {
    Json(json!({ "status": "ok" })).into_response()
}

/// `GET /`: the web page (self-contained: no script, style or font from elsewhere).
async fn page() -> Response {
    Html(include_str!("page.html")).into_response()
}
