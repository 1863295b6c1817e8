//! A request's fields, whatever the body's encoding, and the key and size checks.

use super::*;
use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::{header, StatusCode};
use serde_json::{Map, Value};

/// A request's fields, whatever the body's encoding.
pub(super) struct Fields {
    pub(super) map: Map<String, Value>,
}

impl Fields {
    /// A field that must be a string when present.
    pub(super) fn string(&self, name: &str) -> Result<Option<String>, ApiError> {
        match self.map.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ApiError::bad(format!(
                "Invalid request: {name} must be a string"
            ))),
        }
    }

    /// A required, non-empty string field.
    pub(super) fn required(&self, name: &str) -> Result<String, ApiError> {
        match self.string(name)? {
            Some(s) if !s.is_empty() => Ok(s),
            _ => Err(ApiError::missing(name)),
        }
    }

    /// A non-negative integer field (a JSON number, or a string of digits in a form).
    pub(super) fn count(&self, name: &str) -> Result<usize, ApiError> {
        let bad = || ApiError::bad(format!("Invalid request: {name} parameter is not a number"));
        match self.map.get(name) {
            None | Some(Value::Null) => Ok(0),
            Some(Value::Number(n)) => n.as_u64().map(|v| v as usize).ok_or_else(bad),
            Some(Value::String(s)) if s.is_empty() => Ok(0),
            Some(Value::String(s)) => s.trim().parse().map_err(|_| bad()),
            Some(Value::Bool(_)) | Some(_) => Err(bad()),
        }
    }

    /// `q`: one text or a list of texts.
    pub(super) fn q(&self) -> Result<Q, ApiError> {
        match self.map.get("q") {
            None | Some(Value::Null) => Err(ApiError::missing("q")),
            Some(Value::String(s)) if s.is_empty() => Err(ApiError::missing("q")),
            Some(Value::String(s)) => Ok(Q::One(s.clone())),
            Some(Value::Array(a)) if a.is_empty() => Err(ApiError::missing("q")),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .map(Q::Many)
                .ok_or_else(|| {
                    ApiError::bad("Invalid request: q must be a string or a list of strings")
                }),
            Some(_) => Err(ApiError::bad(
                "Invalid request: q must be a string or a list of strings",
            )),
        }
    }
}

pub(super) enum Q {
    One(String),
    Many(Vec<String>),
}

impl Q {
    pub(super) fn texts(&self) -> Vec<&str> {
        match self {
            Q::One(s) => vec![s.as_str()],
            Q::Many(v) => v.iter().map(|s| s.as_str()).collect(),
        }
    }
}

/// Reads the body (bounded in size and time) and its fields: JSON, url-encoded or multipart
/// form; the query string's fields first, the body's over them.
pub(super) async fn read_fields(st: &AppState, req: Request) -> Result<Fields, ApiError> {
    let limit = st.limits.max_body;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("Request body too large: at most {limit} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        // A client that writes its whole body before it reads (Python's urllib and
        // requests) would meet a closed connection instead of the answer: the body is read
        // and dropped first, up to a bound.
        if declared.is_some_and(|n| n <= DRAIN_BOUND) {
            let _ = tokio::time::timeout(st.limits.body_timeout, drain(req.into_body())).await;
        }
        return Err(too_large());
    }
    let mut map = Map::new();
    if let Some(q) = req.uri().query() {
        for (k, v) in form_fields(q.as_bytes())? {
            map.insert(k, Value::String(v));
        }
    }
    let ctype = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let (parts, body) = req.into_parts();
    let bytes = match tokio::time::timeout(st.limits.body_timeout, read_body(body, limit)).await {
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "Request body not received in time",
            ))
        }
        Ok(Err(BodyError::TooLarge)) => return Err(too_large()),
        // A client that went away mid-body.
        Ok(Err(BodyError::Failed(e))) => {
            return Err(ApiError::bad(format!(
                "Invalid request: cannot read the body: {e}"
            )))
        }
        Ok(Ok(b)) => b,
    };
    if ctype.starts_with("application/json") || ctype.contains("+json") {
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad(format!("Invalid JSON format: {e}")))?;
        match v {
            Value::Object(o) => map.extend(o),
            _ => return Err(ApiError::bad("Invalid JSON format")),
        }
    } else if ctype.starts_with("multipart/form-data") {
        let req = Request::from_parts(parts, Body::from(bytes));
        let mut mp = axum::extract::Multipart::from_request(req, &())
            .await
            .map_err(|e| ApiError::bad(format!("Invalid multipart form: {}", e.body_text())))?;
        while let Some(field) = mp
            .next_field()
            .await
            .map_err(|e| ApiError::bad(format!("Invalid multipart form: {}", e.body_text())))?
        {
            let name = field.name().unwrap_or("").to_string();
            let text = field
                .text()
                .await
                .map_err(|e| ApiError::bad(format!("Invalid multipart form: {}", e.body_text())))?;
            map.insert(name, Value::String(text));
        }
    } else {
        if std::str::from_utf8(&bytes).is_err() {
            return Err(ApiError::bad("Invalid request: the body is not UTF-8"));
        }
        for (k, v) in form_fields(&bytes)? {
            map.insert(k, Value::String(v));
        }
    }
    Ok(Fields { map })
}

/// The most bytes of an over-large body read and dropped before the 413 is sent.
pub(super) const DRAIN_BOUND: usize = 64 << 20;

/// Why a body could not be read.
enum BodyError {
    /// Over the limit (the rest read and dropped, up to [`DRAIN_BOUND`]).
    TooLarge,
    /// The connection failed.
    Failed(String),
}

/// The body's bytes, at most `limit`. A body over it is read on and dropped, up to
/// [`DRAIN_BOUND`] bytes in all, so that a client still writing it gets the answer.
async fn read_body(mut body: Body, limit: usize) -> Result<Vec<u8>, BodyError> {
    use http_body_util::BodyExt;
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyError::Failed(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limit {
                let seen = out.len() + data.len();
                if seen <= DRAIN_BOUND {
                    drain_from(body, seen).await;
                }
                return Err(BodyError::TooLarge);
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

/// Reads and drops a body, up to [`DRAIN_BOUND`] bytes.
async fn drain(body: Body) {
    drain_from(body, 0).await
}

/// Reads and drops the rest of a body of which `seen` bytes were read, until it ends,
/// fails, or [`DRAIN_BOUND`] bytes were read in all.
async fn drain_from(mut body: Body, mut seen: usize) {
    use http_body_util::BodyExt;
    while let Some(Ok(frame)) = body.frame().await {
        if let Ok(data) = frame.into_data() {
            seen += data.len();
            if seen > DRAIN_BOUND {
                return;
            }
        }
    }
}

/// The fields of a url-encoded form (or query string): `+` is a space and `%XX` a byte, and
/// the bytes of every name and value must be UTF-8 once decoded (a `%FF` is refused, as
/// invalid UTF-8 in JSON is, rather than replaced).
fn form_fields(bytes: &[u8]) -> Result<Vec<(String, String)>, ApiError> {
    let decode = |part: &[u8]| -> Result<String, ApiError> {
        let spaced: Vec<u8> = part
            .iter()
            .map(|&b| if b == b'+' { b' ' } else { b })
            .collect();
        percent_encoding::percent_decode(&spaced)
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|_| {
                ApiError::bad(format!(
                    "Invalid request: the form field {:?} is not UTF-8 once its %-escapes are \
                     decoded",
                    String::from_utf8_lossy(part)
                ))
            })
    };
    bytes
        .split(|&b| b == b'&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = match pair.iter().position(|&b| b == b'=') {
                Some(i) => (&pair[..i], &pair[i + 1..]),
                None => (pair, &pair[..0]),
            };
            Ok((decode(k)?, decode(v)?))
        })
        .collect()
}

pub(super) fn check_key(st: &AppState, f: &Fields) -> Result<(), ApiError> {
    let Some(keys) = &st.api_keys else {
        return Ok(());
    };
    match f.string("api_key")? {
        Some(k) if keys.contains(&k) => Ok(()),
        Some(_) => Err(ApiError::new(StatusCode::FORBIDDEN, "Invalid API key")),
        None => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "Invalid request: missing api_key parameter (this server needs an API key; ask its operator for one)",
        )),
    }
}

pub(super) fn check_size(st: &AppState, q: &Q) -> Result<(), ApiError> {
    if let Q::Many(v) = q {
        if v.len() > st.limits.batch_limit {
            return Err(ApiError::bad(format!(
                "Invalid request: request ({} texts) exceeds the batch limit ({}): send fewer texts per request",
                v.len(),
                st.limits.batch_limit
            )));
        }
    }
    if let Some(limit) = st.limits.char_limit {
        let chars: usize = q.texts().iter().map(|t| t.chars().count()).sum();
        if chars > limit {
            return Err(ApiError::bad(format!(
                "Invalid request: request ({chars} characters) exceeds text limit ({limit})"
            )));
        }
    }
    Ok(())
}
