//! The native endpoint (`POST /v1/translate`: scores, n-best lists, alignments) and the attention page.

use super::*;
use crate::engine::encode_checked;
use axum::extract::{Request, State};
use axum::response::{Html, IntoResponse};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;
use transformer_decode::Hypothesis;
use transformer_runtime::translate::hypothesis_text;
use transformer_text::subword::TextTokenizer;

/// `POST /v1/translate`: each text of `q` as one sentence, with its score, its n-best list
/// (`n_best`, at most the beam) and, with `alignment: true`, the source token each output
/// token attends to most (the last decoder layer's encoder-decoder attention, averaged over
/// its heads).
pub(super) async fn native_translate(State(st): State<Arc<AppState>>, req: Request) -> ApiResult {
    let f = read_fields(&st, req).await?;
    check_key(&st, &f)?;
    let q = f.q()?;
    check_size(&st, &q)?;
    let pair = pair_for(&st.engine, &f.required("source")?, &f.required("target")?)?;
    let n_best = f.count("n_best")?.max(1);
    let alignment = match f.map.get("alignment") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => matches!(s.as_str(), "true" | "1"),
        Some(_) => {
            return Err(ApiError::bad(
                "Invalid request: alignment must be true or false",
            ))
        }
    };
    let engine = &st.engine;
    let p = &engine.pairs()[pair];
    let texts = q.texts();
    let mut ids = Vec::new();
    for (i, t) in texts.iter().enumerate() {
        ids.push(encode_checked(p, t).map_err(|n| {
            ApiError::bad(format!(
                "Invalid request: text {} has {n} tokens; this model takes at most {}",
                i + 1,
                p.max_source_tokens
            ))
        })?);
    }
    let hyps = translate_segments(engine, pair, ids.clone()).await?;
    let tok = &p.tokenizer;
    let lp = p.opts.length_penalty;
    let norm = |h: &Hypothesis| {
        if lp == 0.0 {
            h.score
        } else {
            h.score / ((h.tokens.len() + 1) as f64).powf(lp)
        }
    };
    let mut out = Vec::new();
    for (i, hs) in hyps.iter().enumerate() {
        let Some(best) = hs.first() else {
            out.push(json!({ "text": "", "score": 0.0, "tokens": [], "source_tokens": [], "n_best": [] }));
            continue;
        };
        let mut item = json!({
            "text": hypothesis_text(&p.rules, tok, texts[i], best),
            "score": best.score,
            "normalized_score": norm(best),
            "finished": best.finished,
            "tokens": best.tokens.iter().map(|&t| tok.token(t)).collect::<Vec<_>>(),
            "source_tokens": ids[i].iter().map(|&t| tok.token(t)).collect::<Vec<_>>(),
            "n_best": hs.iter().take(n_best).map(|h| json!({
                "text": hypothesis_text(&p.rules, tok, texts[i], h),
                "score": h.score,
                "normalized_score": norm(h),
            })).collect::<Vec<_>>(),
        });
        if alignment {
            let set = engine
                .attention(
                    pair,
                    texts[i].to_string(),
                    ids[i].clone(),
                    Some(best.tokens.clone()),
                )
                .await?;
            item["alignment"] = json!(align(&set, ids[i].len(), best.tokens.len()));
        }
        out.push(item);
    }
    let mut resp = Json(json!({ "translations": out })).into_response();
    resp.extensions_mut()
        .insert(Sentences(hyps.iter().filter(|h| !h.is_empty()).count()));
    Ok(resp)
}

/// `[target index, source index]` per output token: the source token (its `<eos>` left out)
/// with the most encoder-decoder attention in the last layer, heads averaged.
pub(super) fn align(
    set: &transformer_runtime::viz::AttentionSet,
    src_len: usize,
    out_len: usize,
) -> Vec<[usize; 2]> {
    let Some(layer) = set.cross.last() else {
        return Vec::new();
    };
    let heads = layer.len().max(1) as f32;
    (0..out_len)
        .filter_map(|t| {
            let row: Vec<f32> = (0..src_len)
                .map(|s| {
                    layer
                        .iter()
                        .map(|h| h.get(t).and_then(|r| r.get(s)).copied().unwrap_or(0.0))
                        .sum::<f32>()
                        / heads
                })
                .collect();
            row.iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(s, _)| [t, s])
        })
        .collect()
}

/// `POST /v1/attention`: the attention explorer page (as `mt attention --html` writes it)
/// of one sentence's translation.
pub(super) async fn attention_page(State(st): State<Arc<AppState>>, req: Request) -> ApiResult {
    let f = read_fields(&st, req).await?;
    check_key(&st, &f)?;
    let text = match f.q()? {
        Q::One(s) => s,
        Q::Many(_) => return Err(ApiError::bad("Invalid request: q must be one sentence")),
    };
    let pair = pair_for(&st.engine, &f.required("source")?, &f.required("target")?)?;
    let p = &st.engine.pairs()[pair];
    let sentence = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let ids = encode_checked(p, &sentence).map_err(|n| {
        ApiError::bad(format!(
            "Invalid request: the sentence has {n} tokens; this model takes at most {}",
            p.max_source_tokens
        ))
    })?;
    if ids.is_empty() {
        return Err(ApiError::missing("q"));
    }
    // The page draws one cell per token pair: keep it to what a screen shows.
    if ids.len() > 120 {
        return Err(ApiError::bad(format!(
            "Invalid request: the sentence has {} tokens; the attention page shows at most 120",
            ids.len()
        )));
    }
    let set = st.engine.attention(pair, sentence, ids, None).await?;
    let mut resp = Html(transformer_runtime::viz::attention_html(&set)).into_response();
    resp.extensions_mut().insert(Sentences(1));
    Ok(resp)
}
