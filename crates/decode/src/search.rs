//! Greedy search, beam search and sampling, written once against [`StepModel`].
//!
//! Every search works on a batch of sentences at once: the model encodes them once, then each
//! step feeds one token per live row. Rows whose sentence is finished are dropped from the
//! batch ([`StepModel::select_rows`]), so late steps cost only what is still being decoded.
//!
//! Scores are sums of natural-log probabilities of the tokens chosen, `<eos>` included.
//! Beam search ranks finished hypotheses by `score / len^alpha` (`alpha` =
//! [`DecodeOptions::length_penalty`], `len` counting `<eos>`; 0 ranks by raw score, 1 by the
//! mean log-probability per token, as fairseq's `--lenpen`).

use crate::step::{LogProbs, StepModel, StepOutput};
use candle_core::{Result, Tensor};

/// Which engine's search rules a decoding follows.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum SearchRules {
    /// This project's own ([`crate::greedy`], [`crate::beam_search_nbest`]): the length limit
    /// `max_len_a * source + max_len_b` counts tokens before `<eos>`.
    #[default]
    Native,
    /// CTranslate2's `translate_batch`: `max_len_b` is its `max_decoding_length` (the end
    /// token counted; `max_len_a` is ignored), with its `min_decoding_length` and
    /// `num_hypotheses`.
    CTranslate2 {
        /// No end token before this many tokens (CTranslate2's default 1: no empty output).
        min_length: usize,
        /// Hypotheses returned per sentence, at most the beam.
        num_hypotheses: usize,
    },
    /// Hugging Face `generate()` as MarianMT's generation configuration sets it: `max_len_b`
    /// is its `max_length` (the start token counted; the end token forced at the last
    /// position), `suppress` its `bad_words_ids` token, `early_stopping` false.
    HuggingFace {
        /// A token never generated (`bad_words_ids`: Marian's `<pad>`), masked after the
        /// log-softmax as `generate()` does.
        suppress: Option<u32>,
        /// `renormalize_logits`: the log-probabilities normalised again once the suppressed
        /// token is masked (newer OPUS-MT generation configurations set it).
        renormalize: bool,
    },
}

impl SearchRules {
    /// CTranslate2's rules with its defaults (`min_decoding_length` 1, one hypothesis).
    pub const CTRANSLATE2: SearchRules = SearchRules::CTranslate2 {
        min_length: 1,
        num_hypotheses: 1,
    };
}

/// How to decode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeOptions {
    /// Hypotheses kept per sentence (1 = greedy).
    pub beam: usize,
    /// The longest output is `max_len_a * source_length + max_len_b` tokens (before
    /// `<eos>`); the source length counts its tokens without padding.
    pub max_len_a: f64,
    /// See `max_len_a`.
    pub max_len_b: usize,
    /// Exponent of the length normalisation of beam scores (0 = none).
    pub length_penalty: f64,
    /// Start token of every output.
    pub bos: u32,
    /// End token: a hypothesis that emits it is finished.
    pub eos: u32,
    /// Padding id of the source batch.
    pub pad: u32,
    /// What ends every source sentence (`None`: nothing is appended), for the callers that
    /// batch sources; the searches do not read it.
    pub source_end: Option<u32>,
    /// Keep each step's encoder-decoder attention with the hypotheses.
    pub want_attention: bool,
    /// Score the hypotheses ([`Hypothesis::score`]). Greedy search without scores (nor
    /// attention) asks the model only for each step's most likely token
    /// ([`StepModel::step_argmax`]), which it may find without computing every logit
    /// exactly; the tokens are the same, the scores NaN. Beam search always scores.
    pub want_scores: bool,
    /// Whose search rules: this project's, or those of the engine a published model comes
    /// from ([`crate::engines`]).
    pub rules: SearchRules,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        Self {
            beam: 5,
            max_len_a: 1.2,
            max_len_b: 10,
            length_penalty: 1.0,
            bos: 1,
            eos: 2,
            pad: 0,
            source_end: Some(2),
            want_attention: false,
            want_scores: true,
            rules: SearchRules::Native,
        }
    }
}

impl DecodeOptions {
    /// The most tokens (before `<eos>`) for a source of `src_len` tokens.
    pub fn max_len(&self, src_len: usize) -> usize {
        (self.max_len_a * src_len as f64 + self.max_len_b as f64).floor() as usize
    }

    fn normalized(&self, score: f64, len: usize) -> f64 {
        if self.length_penalty == 0.0 {
            score
        } else {
            score / (len.max(1) as f64).powf(self.length_penalty)
        }
    }
}

/// One output sentence.
#[derive(Debug, Clone, PartialEq)]
pub struct Hypothesis {
    /// Tokens after `<bos>`, without `<eos>`.
    pub tokens: Vec<u32>,
    /// Sum of the log-probabilities of `tokens` and of `<eos>` (if emitted); NaN from
    /// greedy search without [`DecodeOptions::want_scores`].
    pub score: f64,
    /// Whether it ended with `<eos>` (else it hit the length limit).
    pub finished: bool,
    /// With [`DecodeOptions::want_attention`]: per output position (tokens, then `<eos>`),
    /// the encoder-decoder attention as the model returned it (for a Transformer, layers x
    /// heads x source positions, flattened).
    pub attention: Vec<Vec<f32>>,
}

/// The live rows of a search: which sentence each row belongs to, its tokens so far, score
/// and attention history.
struct Row {
    sentence: usize,
    tokens: Vec<u32>,
    score: f64,
    attention: Vec<Vec<f32>>,
    /// Whether this row is the greedy path (every token the most likely one).
    greedy: bool,
}

impl Row {
    /// This row's attention history with this step's row `r` of `att` appended (empty when
    /// attention was not asked for).
    fn attention_with(&self, att: &Option<Vec<Vec<f32>>>, r: usize) -> Vec<Vec<f32>> {
        match att {
            Some(a) => {
                let mut h = self.attention.clone();
                h.push(a[r].clone());
                h
            }
            None => Vec::new(),
        }
    }

    /// The hypothesis that ends this row here with `<eos>`, at total `score`.
    fn ended(&self, score: f64, attention: Vec<Vec<f32>>) -> Hypothesis {
        Hypothesis {
            tokens: self.tokens.clone(),
            score,
            finished: true,
            attention,
        }
    }

    /// This row extended by token `t`, at total `score`.
    fn extended(&self, t: u32, score: f64, attention: Vec<Vec<f32>>, greedy: bool) -> Row {
        let mut tokens = self.tokens.clone();
        tokens.push(t);
        Row {
            sentence: self.sentence,
            tokens,
            score,
            attention,
            greedy,
        }
    }

    /// The start of a search: one empty row per sentence.
    fn one_per_sentence(n: usize) -> Vec<Row> {
        (0..n)
            .map(|s| Row {
                sentence: s,
                tokens: Vec::new(),
                score: 0.0,
                attention: Vec::new(),
                greedy: true,
            })
            .collect()
    }
}

/// Every row's last token (`<bos>` before the first).
fn last_tokens(rows: &[Row], opts: &DecodeOptions) -> Vec<u32> {
    rows.iter()
        .map(|r| *r.tokens.last().unwrap_or(&opts.bos))
        .collect()
}

/// The most tokens (before `<eos>`) for a source of `src_len` tokens: the options' limit,
/// capped at what the model can produce ([`StepModel::max_output_len`]).
fn output_limit<M: StepModel>(model: &M, opts: &DecodeOptions, src_len: usize) -> usize {
    let limit = opts.max_len(src_len);
    model.max_output_len().map_or(limit, |m| limit.min(m))
}

/// Feeds every row's last token (`<bos>` first) and returns the step's output (read its
/// log-probabilities with [`LogProbs::of`]) and, when asked for, each row's attention
/// (flattened).
fn next_step<M: StepModel>(
    model: &M,
    state: &mut M::State,
    rows: &[Row],
    opts: &DecodeOptions,
) -> Result<(StepOutput, Option<Vec<Vec<f32>>>)> {
    let out = model.step(state, &last_tokens(rows, opts), opts.want_attention)?;
    let att = out
        .attention
        .as_ref()
        .map(|a| a.flatten_from(1)?.to_vec2::<f32>())
        .transpose()?;
    Ok((out, att))
}

/// Elements per block of the beam search's scan of a row: a block whose largest logit
/// cannot enter the candidates is passed over after one vectorised maximum.
const SCAN_BLOCK: usize = 64;

/// The largest element of `x` (`-inf` when empty or all NaN): per lane of 16, which the
/// compiler vectorises.
fn block_max(x: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = if v > *m { v } else { *m };
        }
    }
    let tail = chunks.remainder().iter();
    lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
}

/// Adds to `cand` (best first, at most `limit`) every `(score + log p(t), r, t)` of row `r`
/// that beats its last entry, in token order, a later equal one after the earlier.
pub(crate) fn scan_row(
    cand: &mut Vec<(f64, usize, u32)>,
    limit: usize,
    lp: &LogProbs,
    r: usize,
    score: f64,
) {
    let (logits, lse) = (lp.logits(r), lp.lse(r));
    // Monotone in the logit (each rounding is), so a block's maximum bounds all of it.
    let value = |l: f32| score + (l - lse) as f64;
    for (b, block) in logits.chunks(SCAN_BLOCK).enumerate() {
        if cand.len() >= limit && value(block_max(block)) <= cand[limit - 1].0 {
            continue;
        }
        for (j, &l) in block.iter().enumerate() {
            let s = value(l);
            if cand.len() < limit || s > cand[cand.len() - 1].0 {
                let pos = cand.partition_point(|c| c.0 >= s);
                cand.insert(pos, (s, r, lp.token(b * SCAN_BLOCK + j)));
                cand.truncate(limit);
            }
        }
    }
}

/// Greedy decoding: at every step the most likely token (the largest logit, the first of
/// equals). Returns one hypothesis per source row, in order. Without
/// [`DecodeOptions::want_scores`] and [`DecodeOptions::want_attention`] each step asks the
/// model for its most likely tokens alone ([`StepModel::step_argmax`]).
///
/// # Shapes
/// src (B, S) u32 padded with `opts.pad`
pub fn greedy<M: StepModel>(
    model: &M,
    src: &Tensor,
    opts: &DecodeOptions,
) -> Result<Vec<Hypothesis>> {
    let scored = opts.want_scores || opts.want_attention;
    pick_each_step(model, src, opts, scored, |lp, r, _| lp.argmax(r))
}

/// Sampling: each token drawn from the model's distribution, sharpened or flattened by
/// `sampling` ([`crate::Sampling`]); `uniform` gives numbers in [0, 1).
pub fn sample_decode<M: StepModel>(
    model: &M,
    src: &Tensor,
    opts: &DecodeOptions,
    sampling: crate::Sampling,
    mut uniform: impl FnMut() -> f64,
) -> Result<Vec<Hypothesis>> {
    pick_each_step(model, src, opts, true, |lp, r, _| {
        lp.token(crate::sample(&lp.row(r), sampling, uniform()) as usize)
    })
}

/// The one-hypothesis-per-sentence searches: `pick` chooses each next token from a row of
/// log-probabilities (`pick(lp, row, sentence)`); unless `scored`, the model's most likely
/// token is taken instead ([`StepModel::step_argmax`]) and the scores are NaN.
fn pick_each_step<M: StepModel>(
    model: &M,
    src: &Tensor,
    opts: &DecodeOptions,
    scored: bool,
    mut pick: impl FnMut(&LogProbs, usize, usize) -> u32,
) -> Result<Vec<Hypothesis>> {
    let mut state = model.start(src, opts.pad)?;
    let src_lens = model.src_lens(&state);
    let n = src_lens.len();
    let mut done: Vec<Option<Hypothesis>> = vec![None; n];
    let mut rows = Row::one_per_sentence(n);
    while !rows.is_empty() {
        // At the length limit `<eos>` is forced.
        let at_limit: Vec<bool> = rows
            .iter()
            .map(|row| row.tokens.len() >= output_limit(model, opts, src_lens[row.sentence]))
            .collect();
        let limited = |i: usize, t: u32| if at_limit[i] { opts.eos } else { t };
        // Each row's token and its log-probability, and the step's attention.
        let (chosen, att): (Vec<(u32, f64)>, _) = if scored {
            let (out, att) = next_step(model, &mut state, &rows, opts)?;
            let lp = LogProbs::of(&out)?;
            let chosen = rows
                .iter()
                .enumerate()
                .map(|(i, row)| {
                    let tok = limited(i, pick(&lp, i, row.sentence));
                    // (An `eos` outside the vocabulary, as the copy task's "none", scores
                    // nothing.)
                    (tok, lp.get(i, tok).unwrap_or(0.0) as f64)
                })
                .collect();
            (chosen, att)
        } else {
            let best = model.step_argmax(&mut state, &last_tokens(&rows, opts))?;
            let chosen = best
                .into_iter()
                .enumerate()
                .map(|(i, t)| (limited(i, t), f64::NAN))
                .collect();
            (chosen, None)
        };
        let mut keep = Vec::with_capacity(rows.len());
        for (i, (row, &(tok, logp))) in rows.iter_mut().zip(&chosen).enumerate() {
            if let Some(a) = &att {
                row.attention.push(a[i].clone());
            }
            row.score += logp;
            if tok == opts.eos {
                done[row.sentence] = Some(Hypothesis {
                    tokens: std::mem::take(&mut row.tokens),
                    score: row.score,
                    finished: !at_limit[i],
                    attention: std::mem::take(&mut row.attention),
                });
            } else {
                row.tokens.push(tok);
                keep.push(i);
            }
        }
        if keep.len() < rows.len() && !keep.is_empty() {
            let idx: Vec<u32> = keep.iter().map(|&i| i as u32).collect();
            model.select_rows(&mut state, &idx)?;
        }
        let mut old: Vec<Option<Row>> = rows.into_iter().map(Some).collect();
        rows = keep.iter().map(|&i| old[i].take().expect("row")).collect();
    }
    Ok(done.into_iter().map(|h| h.expect("decoded")).collect())
}

/// Adds `h` to a sentence's `finished` hypotheses while fewer than `k` are there; after that,
/// puts it in place of the worst (by normalised score) when it normalises better. Returns
/// whether `h` was kept.
fn keep_finished(
    finished: &mut Vec<Hypothesis>,
    h: Hypothesis,
    k: usize,
    opts: &DecodeOptions,
) -> bool {
    if finished.len() < k {
        finished.push(h);
        return true;
    }
    let norm = |h: &Hypothesis| opts.normalized(h.score, h.tokens.len() + 1);
    let worst = finished
        .iter()
        .enumerate()
        .min_by(|a, b| norm(a.1).total_cmp(&norm(b.1)))
        .map(|(i, _)| i);
    match worst {
        Some(w) if norm(&h) > norm(&finished[w]) => {
            finished[w] = h;
            true
        }
        _ => false,
    }
}

/// Beam search with `opts.beam` hypotheses per sentence, all sentences of `src` at once.
///
/// At each step every live hypothesis is extended by every token; per sentence the `2 x
/// beam` best extensions are examined in order: one ending in `<eos>` among the first `beam`
/// joins the sentence's finished list, any other fills the next beam until it holds `beam`
/// hypotheses. A sentence
/// is done when it has `beam` finished hypotheses whose worst normalised score no live
/// hypothesis can still beat, or when it reaches its length limit (its live hypotheses are
/// then finished as they are). The greedy path is carried along (one extra row while it is
/// outside the beam), so with `length_penalty` 0 the result never scores below
/// [`greedy`]'s. The best finished hypothesis by normalised score is returned.
///
/// # Shapes
/// src (B, S) u32 padded with `opts.pad`
pub fn beam_search<M: StepModel>(
    model: &M,
    src: &Tensor,
    opts: &DecodeOptions,
) -> Result<Vec<Hypothesis>> {
    Ok(beam_search_nbest(model, src, opts)?
        .into_iter()
        .map(|mut hs| hs.swap_remove(0))
        .collect())
}

/// [`beam_search`] returning every finished hypothesis of each sentence (at most `beam`,
/// plus the greedy path's ending when it fell outside the beam), best first by normalised
/// score: the first is exactly [`beam_search`]'s result, the rest are its runners-up (the
/// n-best list).
///
/// # Shapes
/// src (B, S) u32 padded with `opts.pad`
pub fn beam_search_nbest<M: StepModel>(
    model: &M,
    src: &Tensor,
    opts: &DecodeOptions,
) -> Result<Vec<Vec<Hypothesis>>> {
    let k = opts.beam.max(1);
    let mut state = model.start(src, opts.pad)?;
    let src_lens = model.src_lens(&state);
    let n = src_lens.len();
    let mut finished: Vec<Vec<Hypothesis>> = vec![Vec::new(); n];
    // Live rows, grouped by sentence; at the start one per sentence.
    let mut rows = Row::one_per_sentence(n);
    while !rows.is_empty() {
        let (out, att) = next_step(model, &mut state, &rows, opts)?;
        let lp = LogProbs::of(&out)?;
        let mut next_rows: Vec<Row> = Vec::with_capacity(n * k);
        let mut parents: Vec<u32> = Vec::with_capacity(n * k);
        let mut start = 0;
        while start < rows.len() {
            let sentence = rows[start].sentence;
            let mut end = start;
            while end < rows.len() && rows[end].sentence == sentence {
                end += 1;
            }
            let at_limit =
                rows[start].tokens.len() >= output_limit(model, opts, src_lens[sentence]);
            if at_limit {
                // The length limit: every live hypothesis ends here, `<eos>` forced.
                for (r, row) in rows.iter().enumerate().take(end).skip(start) {
                    let mut attention = row.attention.clone();
                    if let Some(a) = &att {
                        attention.push(a[r].clone());
                    }
                    finished[sentence].push(Hypothesis {
                        tokens: row.tokens.clone(),
                        score: row.score + lp.get(r, opts.eos).unwrap_or(0.0) as f64,
                        finished: false,
                        attention,
                    });
                }
                start = end;
                continue;
            }
            // The 2k best (score, row, token) over this sentence's rows.
            let mut cand: Vec<(f64, usize, u32)> = Vec::with_capacity(2 * k + 1);
            for (r, row) in rows.iter().enumerate().take(end).skip(start) {
                scan_row(&mut cand, 2 * k, &lp, r, row.score);
            }
            // The greedy row's own next step, which the beam must not lose (below).
            let greedy_next = (start..end)
                .find(|&r| rows[r].greedy)
                .map(|r| (r, lp.argmax(r)));
            let mut greedy_kept = false;
            let mut live = 0;
            for (rank, &(s, r, t)) in cand.iter().enumerate() {
                let parent = &rows[r];
                let greedy = greedy_next == Some((r, t));
                if t == opts.eos {
                    // As fairseq: an ending counts only from among the k best extensions
                    // (so beam 1 is exactly greedy). Once k are finished, a later ending
                    // that normalises better replaces the worst of them (the search goes on
                    // while a live hypothesis can still beat that worst one).
                    if rank < k {
                        let ended = parent.ended(s, parent.attention_with(&att, r));
                        if keep_finished(&mut finished[sentence], ended, k, opts) {
                            greedy_kept |= greedy;
                        }
                    }
                } else if live < k {
                    live += 1;
                    greedy_kept |= greedy;
                    next_rows.push(parent.extended(t, s, parent.attention_with(&att, r), greedy));
                    parents.push(r as u32);
                }
            }
            // Beam search alone can end below greedy decoding: the greedy path may fall out of
            // the beam while the prefixes that pushed it out end badly. So the greedy path is
            // carried along as one extra row while it is outside the beam, and its ending
            // joins the finished list: the result never scores below greedy decoding
            // (length_penalty 0; otherwise by normalised score among what was found).
            if let (Some((r, t)), false) = (greedy_next, greedy_kept) {
                let parent = &rows[r];
                let s = parent.score + lp.get(r, t).expect("a token of the vocabulary") as f64;
                let attention = parent.attention_with(&att, r);
                if t == opts.eos {
                    finished[sentence].push(parent.ended(s, attention));
                } else {
                    next_rows.push(parent.extended(t, s, attention, true));
                    parents.push(r as u32);
                }
            }
            // Done when k hypotheses are finished and the best live one, normalised at its
            // next length, cannot beat the worst of them (Hugging Face's default stopping
            // rule; exact when `length_penalty` is 0, since scores only fall).
            let done = finished[sentence].len() >= k && {
                let worst = finished[sentence]
                    .iter()
                    .map(|h| opts.normalized(h.score, h.tokens.len() + 1))
                    .fold(f64::INFINITY, f64::min);
                let best_live = next_rows
                    .iter()
                    .filter(|r| r.sentence == sentence)
                    .map(|r| opts.normalized(r.score, r.tokens.len() + 1))
                    .fold(f64::NEG_INFINITY, f64::max);
                best_live <= worst
            };
            if done {
                while next_rows.last().is_some_and(|r| r.sentence == sentence) {
                    next_rows.pop();
                    parents.pop();
                }
            }
            start = end;
        }
        if !next_rows.is_empty() {
            model.select_rows(&mut state, &parents)?;
        }
        rows = next_rows;
    }
    Ok(finished
        .into_iter()
        .map(|mut hs| {
            let norm = |h: &Hypothesis| opts.normalized(h.score, h.tokens.len() + 1);
            // The best is the last of the largest (`max_by`'s choice among ties); the rest
            // follow, better first.
            let best = hs
                .iter()
                .enumerate()
                .max_by(|a, b| norm(a.1).total_cmp(&norm(b.1)))
                .map(|(i, _)| i)
                .expect("a finished hypothesis per sentence");
            let first = hs.remove(best);
            hs.sort_by(|a, b| norm(b).total_cmp(&norm(a)));
            hs.insert(0, first);
            hs
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hyp(score: f64, len: usize) -> Hypothesis {
        Hypothesis {
            tokens: vec![5; len],
            score,
            finished: true,
            attention: Vec::new(),
        }
    }

    /// The block-skipping scan keeps exactly the candidates, in the same order, that adding
    /// every token one by one keeps: with ties, blocks that hold the maximum only at their
    /// end, rows whose scores differ, and a vocabulary that is not a multiple of the block.
    #[test]
    fn the_block_scan_keeps_what_the_plain_scan_keeps() -> Result<()> {
        let (rows, width) = (4, 3 * SCAN_BLOCK + 17);
        let mut x = 12345u64;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % 4000) as f32 / 400.0 - 5.0
        };
        let mut logits: Vec<f32> = (0..rows * width).map(|_| next()).collect();
        // Ties inside and across rows, and a block whose largest entry is its last.
        logits[5] = 4.0;
        logits[width + 9] = 4.0;
        logits[2 * width + SCAN_BLOCK - 1] = 6.0;
        logits[2 * width + 2 * SCAN_BLOCK - 1] = 6.0;
        let t = Tensor::from_vec(logits, (rows, width), &candle_core::Device::Cpu)?;
        let lp = LogProbs::new(&t)?;
        let scores = [-0.5, 0.0, -1.25, -0.5];
        for limit in [1, 3, 10, 40] {
            let mut fast = Vec::new();
            let mut plain: Vec<(f64, usize, u32)> = Vec::new();
            for (r, &score) in scores.iter().enumerate() {
                scan_row(&mut fast, limit, &lp, r, score);
                for tok in 0..width as u32 {
                    let s = score + lp.get(r, tok).unwrap() as f64;
                    if plain.len() < limit || s > plain[plain.len() - 1].0 {
                        let pos = plain.partition_point(|c| c.0 >= s);
                        plain.insert(pos, (s, r, tok));
                        plain.truncate(limit);
                    }
                }
            }
            assert_eq!(fast, plain, "limit {limit}");
        }
        Ok(())
    }

    /// [`LogProbs`] gives, bit for bit, the log-softmax written out, and its argmax is the
    /// first of the largest.
    #[test]
    fn log_probs_are_the_written_out_log_softmax() -> Result<()> {
        let (rows, width) = (3, 1000);
        let data: Vec<f32> = (0..rows * width)
            .map(|i| ((i * 7919) % 1013) as f32 / 50.0 - 10.0)
            .collect();
        let mut want = data.clone();
        transformer_model::log_softmax_rows_f32(&mut want, width);
        let t = Tensor::from_vec(data, (rows, width), &candle_core::Device::Cpu)?;
        let lp = LogProbs::new(&t)?;
        for r in 0..rows {
            let row = &want[r * width..(r + 1) * width];
            assert_eq!(lp.row(r), row);
            let best = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let first = row.iter().position(|&v| v == best).unwrap() as u32;
            assert_eq!(lp.argmax(r), first);
            assert_eq!(lp.get(r, width as u32), None);
        }
        Ok(())
    }

    /// Once `k` hypotheses are finished, a later one that normalises better takes the worst
    /// one's place, and one that normalises worse is dropped.
    #[test]
    fn a_better_ending_replaces_the_worst_finished_one() {
        let opts = DecodeOptions::default();
        let norm = |h: &Hypothesis| opts.normalized(h.score, h.tokens.len() + 1);
        let mut finished = Vec::new();
        assert!(keep_finished(&mut finished, hyp(-3.0, 2), 2, &opts));
        assert!(keep_finished(&mut finished, hyp(-4.0, 4), 2, &opts));
        // -1.04 normalised against the worst, -1.0 (the first): not kept.
        assert!(!keep_finished(&mut finished, hyp(-5.2, 4), 2, &opts));
        // -0.9 beats -1.0: replaces the first, the list stays at 2.
        assert!(keep_finished(&mut finished, hyp(-4.5, 4), 2, &opts));
        let mut scores: Vec<f64> = finished.iter().map(norm).collect();
        scores.sort_by(f64::total_cmp);
        assert_eq!(scores, vec![-0.9, -0.8]);
    }
}
