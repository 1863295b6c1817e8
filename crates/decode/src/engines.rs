//! The searches of the engines that published models come from, rule for rule, so that an
//! imported model decodes as its own engine decodes it ([`SearchRules`]).
//!
//! - **CTranslate2** (`Translator.translate_batch`, the engine of Argos Translate and of
//!   converted OPUS-MT models): greedy search for beam 1, else its beam search. At every step
//!   the log-softmax of the logits after the end token is disabled (set to minus infinity)
//!   while fewer than `min_length` tokens are out; the `2 x beam` best extensions are ranked,
//!   and each of the first `beam` that ends (or every one, at the last step) is registered as
//!   a finished hypothesis while the next non-ending extension of the second `beam` takes its
//!   place. A sentence is done when `beam` hypotheses are registered (with a length penalty),
//!   or when the best one has finished and `num_hypotheses` are registered (without), or at
//!   the last step. `max_length` counts the end token: at step `max_length - 1` every live
//!   hypothesis is registered as it is. Scores are sums of log-probabilities, end token
//!   included; CTranslate2 reports them divided by `length^length_penalty`, the length counting
//!   the end token ([`Hypothesis::engine_score`]).
//!
//!   With target prefixes ([`ctranslate2_search_prefixed`], CTranslate2's `target_prefix`
//!   with `prefix_bias_beta` 0) a sentence's first steps are forced: at step `i < prefix
//!   length` every candidate becomes the prefix's token `i` from the first beam, at total
//!   score 0 for the first candidate and -1e10 for the others, so the prefix adds nothing to
//!   the score; at the step that ends the prefix an end token among the candidates after the
//!   first becomes token 0 at -1e10 (CTranslate2's mitigation of its issue #277; a sentence
//!   without a prefix has it at step 0 when another sentence of the batch has one). The
//!   end token ends no hypothesis inside the prefix. Hypotheses hold the prefix, which
//!   counts in the length penalty's length and in `max_length`.
//!
//! - **Hugging Face** (`generate()` of `transformers` 5, MarianMT's settings): greedy search
//!   takes the largest logit once the suppressed token is masked; beam search ranks the `2 x
//!   beam` best extensions by the log-softmax over the whole vocabulary (the suppressed token
//!   then masked), keeps the `beam` best finished hypotheses by `score / length^penalty`
//!   (the length counting the end token, not the start), continues the `beam` best unfinished
//!   ones, and stops a sentence once it has `beam` finished hypotheses that the best running
//!   one, normalised at its current length, cannot beat. At `max_length - 1` tokens the end
//!   token is forced with log-probability 0.
//!
//! The rules are CTranslate2's `src/decoding.cc` (`BeamSearch::search`, `GreedySearch::search`)
//! as its version 4 has them; the tests compare tokens and scores with `ctranslate2` itself.

pub use crate::search::SearchRules;
use crate::search::{scan_row, DecodeOptions, Hypothesis};
use crate::step::{LogProbs, StepModel, StepOutput};
use candle_core::{Result, Tensor};

impl Hypothesis {
    /// The score an engine reports for this hypothesis under `length_penalty`: for
    /// CTranslate2, `score / length^length_penalty` with the end token counted in the length
    /// when the hypothesis ended with it.
    pub fn engine_score(&self, length_penalty: f64) -> f64 {
        let len = self.tokens.len() + usize::from(self.finished);
        if length_penalty == 0.0 {
            self.score
        } else {
            self.score / (len.max(1) as f64).powf(length_penalty)
        }
    }
}

/// A live hypothesis of the engines' searches.
#[derive(Clone)]
struct Live {
    sentence: usize,
    tokens: Vec<u32>,
    score: f64,
    /// Each step's attention (when asked for): one row per token of `tokens`.
    attention: Vec<Vec<f32>>,
}

impl Live {
    /// The start of a search: one empty hypothesis per sentence.
    fn one_per_sentence(n: usize) -> Vec<Live> {
        (0..n)
            .map(|sentence| Live {
                sentence,
                tokens: Vec::new(),
                score: 0.0,
                attention: Vec::new(),
            })
            .collect()
    }

    /// Each sentence's rows: (sentence, first row, row after the last), in row order.
    fn groups(rows: &[Live]) -> Vec<(usize, usize, usize)> {
        let mut out = Vec::new();
        let mut start = 0;
        while start < rows.len() {
            let sentence = rows[start].sentence;
            let end = start + rows[start..].partition_point(|r| r.sentence == sentence);
            out.push((sentence, start, end));
            start = end;
        }
        out
    }

    /// Every row's last token (`bos` before the first).
    fn last_tokens(rows: &[Live], bos: u32) -> Vec<u32> {
        rows.iter()
            .map(|r| *r.tokens.last().unwrap_or(&bos))
            .collect()
    }
}

/// An engine's `max_length` (which counts the start or the end token), at most one more than
/// the model's longest output.
fn length_limit<M: StepModel>(model: &M, max_length: usize) -> usize {
    model
        .max_output_len()
        .map_or(max_length, |m| max_length.min(m + 1))
}

/// One step of the model over every live row (its last token, `bos` before the first), the
/// column of token `disabled` set to minus infinity in the output's logits; with
/// `attention`, each row's attention of the step (flattened).
fn step_rows<M: StepModel>(
    model: &M,
    state: &mut M::State,
    rows: &[Live],
    bos: u32,
    disabled: Option<u32>,
    attention: bool,
) -> Result<(StepOutput, Option<Vec<Vec<f32>>>)> {
    let last = Live::last_tokens(rows, bos);
    let mut out = model.step(state, &last, attention)?;
    if let Some(t) = disabled {
        out.logits = disable_column(&out.logits, t, out.vocab.as_deref())?;
    }
    let att = match (&out.attention, attention) {
        (Some(a), true) => Some(a.flatten_from(1)?.to_vec2::<f32>()?),
        _ => None,
    };
    Ok((out, att))
}

/// `row`'s attention history with row `r` of a step's attention `att` appended (empty
/// without attention).
fn attention_with(row: &Live, att: Option<&[Vec<f32>]>, r: usize) -> Vec<Vec<f32>> {
    match att {
        Some(a) => {
            let mut h = row.attention.clone();
            h.push(a[r].clone());
            h
        }
        None => Vec::new(),
    }
}

/// The next step's rows, each with its parent among the current rows (for the state's row
/// selection).
struct NextRows {
    rows: Vec<Live>,
    parents: Vec<u32>,
}

impl NextRows {
    fn with_capacity(n: usize) -> Self {
        Self {
            rows: Vec::with_capacity(n),
            parents: Vec::with_capacity(n),
        }
    }

    /// Row `r` of `rows` extended by token `t` at total score `s` (`att`: the step's
    /// attention rows, when kept).
    fn extend(
        &mut self,
        rows: &[Live],
        sentence: usize,
        (s, r, t): (f64, usize, u32),
        att: Option<&[Vec<f32>]>,
    ) {
        let mut tokens = rows[r].tokens.clone();
        tokens.push(t);
        self.rows.push(Live {
            sentence,
            tokens,
            score: s,
            attention: attention_with(&rows[r], att, r),
        });
        self.parents.push(r as u32);
    }

    /// Makes these the live `rows`, the model's state following; `false` (and nothing
    /// changed) when there are none.
    fn advance<M: StepModel>(
        self,
        model: &M,
        state: &mut M::State,
        rows: &mut Vec<Live>,
    ) -> Result<bool> {
        if self.rows.is_empty() {
            return Ok(false);
        }
        model.select_rows(state, &self.parents)?;
        *rows = self.rows;
        Ok(true)
    }
}

/// Decodes `src` by CTranslate2's rules (see the module docs), `opts.beam` 1 greedy; returns
/// each sentence's hypotheses, best first by [`Hypothesis::engine_score`].
///
/// # Shapes
/// src (B, S) u32 padded with `opts.pad`
pub fn ctranslate2_search<M: StepModel>(
    model: &M,
    src: &Tensor,
    opts: &DecodeOptions,
    min_length: usize,
    num_hypotheses: usize,
) -> Result<Vec<Vec<Hypothesis>>> {
    ctranslate2_search_prefixed(model, src, opts, min_length, num_hypotheses, None)
}

/// The score CTranslate2 gives the candidates it forces: -1e10 (`update_sample_with_prefix`).
const FORCED_AWAY: f64 = -1e10;

/// [`ctranslate2_search`] with target prefixes (CTranslate2's `target_prefix`, a hard
/// prefix): `prefixes`, one per sentence of `src` (empty for none), the tokens every
/// hypothesis of that sentence starts with after the start token (see the module docs).
/// `None`, or only empty prefixes, decodes as [`ctranslate2_search`]; `Some` with at least
/// one prefix gives the sentences without one the rule of the step that ends a prefix at
/// step 0, as CTranslate2 does for a batch where some sentence has one.
///
/// # Shapes
/// src (B, S) u32 padded with `opts.pad`; `prefixes`: B lists
pub fn ctranslate2_search_prefixed<M: StepModel>(
    model: &M,
    src: &Tensor,
    opts: &DecodeOptions,
    min_length: usize,
    num_hypotheses: usize,
    prefixes: Option<&[Vec<u32>]>,
) -> Result<Vec<Vec<Hypothesis>>> {
    let k = opts.beam.max(1);
    let max_length = length_limit(model, opts.max_len_b.max(1));
    let num_hypotheses = num_hypotheses.clamp(1, k);
    let mut state = model.start(src, opts.pad)?;
    let n = model.src_lens(&state).len();
    let prefixes = prefixes.filter(|p| p.iter().any(|x| !x.is_empty()));
    if let Some(p) = prefixes {
        if p.len() != n {
            candle_core::bail!("{} target prefixes for {n} sentences", p.len());
        }
    }
    let prefix_of = |sentence: usize| -> &[u32] { prefixes.map_or(&[], |p| &p[sentence]) };
    let mut results: Vec<Vec<Hypothesis>> = vec![Vec::new(); n];
    let mut top_finished = vec![false; n];
    let mut rows = Live::one_per_sentence(n);
    let finish = |hyps: &mut Vec<Hypothesis>, keep: usize| {
        hyps.sort_by(|a, b| {
            b.engine_score(opts.length_penalty)
                .total_cmp(&a.engine_score(opts.length_penalty))
        });
        hyps.truncate(keep);
    };
    for step in 0..max_length {
        // The end token disabled before the softmax while the output is shorter than
        // `min_length`: the other tokens' probabilities then sum to one.
        let disabled = (step < min_length).then_some(opts.eos);
        let (out, att) = step_rows(
            model,
            &mut state,
            &rows,
            opts.bos,
            disabled,
            opts.want_attention,
        )?;
        let att = att.as_deref();
        let lp = LogProbs::of(&out)?;
        let is_last = step + 1 == max_length;
        let mut next = NextRows::with_capacity(rows.len());
        for (sentence, start, end) in Live::groups(&rows) {
            let prefix = prefix_of(sentence);
            let in_prefix = step < prefix.len();
            // The end token ends a hypothesis only after the prefix.
            let ends = |t: u32| t == opts.eos && !in_prefix;
            let result = &mut results[sentence];
            let mut group_next = Vec::with_capacity(k);
            if k == 1 {
                // Greedy: the most likely token (of the disabled-aware log-probabilities), or
                // the prefix's, which adds nothing to the score.
                let r = start;
                let (t, s) = if in_prefix {
                    (prefix[step], rows[r].score)
                } else {
                    let t = lp.argmax(r);
                    (
                        t,
                        rows[r].score + lp.get(r, t).unwrap_or(f32::NEG_INFINITY) as f64,
                    )
                };
                if ends(t) || is_last {
                    let a = attention_with(&rows[r], att, r);
                    result.push(hypothesis(&rows[r], t, s, ends(t), a));
                    top_finished[sentence] = true;
                } else {
                    group_next.push((s, r, t));
                }
            } else {
                let mut cand: Vec<(f64, usize, u32)> = Vec::with_capacity(2 * k + 1);
                if in_prefix {
                    // Every candidate is the prefix's token from the first beam: the first at
                    // total score 0, the others out of reach.
                    let t = prefix[step];
                    cand.push((0.0, start, t));
                    cand.extend(std::iter::repeat_n((FORCED_AWAY, start, t), 2 * k - 1));
                } else {
                    for (r, row) in rows.iter().enumerate().take(end).skip(start) {
                        scan_row(&mut cand, 2 * k, &lp, r, row.score);
                    }
                    if prefixes.is_some() && step == prefix.len() {
                        // The first free step: no end token from the candidates after the
                        // first (CTranslate2's issue #277).
                        for c in cand.iter_mut().skip(1) {
                            if c.2 == opts.eos {
                                *c = (FORCED_AWAY, start, 0);
                            }
                        }
                    }
                }
                let mut secondary = k;
                for kk in 0..k.min(cand.len()) {
                    let (s, r, t) = cand[kk];
                    let mut chosen = kk;
                    if ends(t) || is_last {
                        if kk == 0 {
                            top_finished[sentence] = true;
                        }
                        let a = attention_with(&rows[r], att, r);
                        result.push(hypothesis(&rows[r], t, s, ends(t), a));
                        if let Some(j) = (secondary..cand.len()).find(|&j| cand[j].2 != opts.eos) {
                            chosen = j;
                            secondary = j + 1;
                        }
                    }
                    group_next.push(cand[chosen]);
                }
            }
            let done = is_last
                || if k == 1 {
                    top_finished[sentence]
                } else if opts.length_penalty == 0.0 {
                    top_finished[sentence] && result.len() >= num_hypotheses
                } else {
                    result.len() >= k
                };
            if done {
                finish(result, num_hypotheses);
            } else {
                for c in group_next {
                    next.extend(&rows, sentence, c, att);
                }
            }
        }
        if !next.advance(model, &mut state, &mut rows)? {
            break;
        }
    }
    Ok(results)
}

/// The hypothesis that `row` extended by `t` (at total score `s`) registers: finished when
/// `ended` (`t` the end token, which it does not keep), else cut at the length limit with
/// `t`; `attention`: its rows, the step of `t` included.
fn hypothesis(row: &Live, t: u32, s: f64, ended: bool, attention: Vec<Vec<f32>>) -> Hypothesis {
    let mut tokens = row.tokens.clone();
    if !ended {
        tokens.push(t);
    }
    Hypothesis {
        tokens,
        score: s,
        finished: ended,
        attention,
    }
}

/// `logits` (B, V) with the column of token `t` set to minus infinity (`vocab`: the token of
/// each column when restricted).
fn disable_column(logits: &Tensor, t: u32, vocab: Option<&[u32]>) -> Result<Tensor> {
    let (b, v) = logits.dims2()?;
    let col = match vocab {
        Some(v) => match v.binary_search(&t) {
            Ok(c) => c,
            Err(_) => return Ok(logits.clone()),
        },
        None => t as usize,
    };
    if col >= v {
        return Ok(logits.clone());
    }
    let mut data = logits
        .to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    for r in 0..b {
        data[r * v + col] = f32::NEG_INFINITY;
    }
    Tensor::from_vec(data, (b, v), logits.device())
}

/// Decodes `src` by Hugging Face `generate()`'s rules (see the module docs), `opts.beam` 1
/// greedy; returns each sentence's finished hypotheses, best first by
/// [`Hypothesis::engine_score`] (greedy: the one).
///
/// # Shapes
/// src (B, S) u32 padded with `opts.pad`
pub fn huggingface_search<M: StepModel>(
    model: &M,
    src: &Tensor,
    opts: &DecodeOptions,
    suppress: Option<u32>,
    renormalize: bool,
) -> Result<Vec<Vec<Hypothesis>>> {
    let k = opts.beam.max(1);
    // `max_length` counts the start token: at most `max_length - 1` generated tokens.
    let max_length = length_limit(model, opts.max_len_b.max(2));
    let lp = opts.length_penalty;
    let norm = |score: f64, len: usize| score / (len.max(1) as f64).powf(lp);
    let mut state = model.start(src, opts.pad)?;
    let n = model.src_lens(&state).len();
    let mut results: Vec<Vec<Hypothesis>> = vec![Vec::new(); n];
    let mut rows = Live::one_per_sentence(n);
    // `cur_len`: the sequences' length with the start token.
    for cur_len in 1..max_length {
        // Renormalised: the suppressed token is out of the softmax's sum.
        let disabled = suppress.filter(|_| renormalize);
        let (out, _) = step_rows(model, &mut state, &rows, opts.bos, disabled, false)?;
        let lp_rows = LogProbs::of(&out)?;
        let forced = cur_len + 1 == max_length;
        let mut next = NextRows::with_capacity(rows.len());
        for (sentence, start, end) in Live::groups(&rows) {
            // Candidates (score, row, token), best first: the end token alone when forced.
            let cand: Vec<(f64, usize, u32)> = if forced {
                let mut c: Vec<(f64, usize, u32)> =
                    (start..end).map(|r| (rows[r].score, r, opts.eos)).collect();
                c.sort_by(|a, b| b.0.total_cmp(&a.0));
                c
            } else if k == 1 {
                let r = start;
                let t = argmax_except(&lp_rows, r, suppress);
                let s = rows[r].score + lp_rows.get(r, t).unwrap_or(f32::NEG_INFINITY) as f64;
                vec![(s, r, t)]
            } else {
                let mut c: Vec<(f64, usize, u32)> = Vec::with_capacity(2 * k + end - start);
                for (r, row) in rows.iter().enumerate().take(end).skip(start) {
                    scan_row(&mut c, 2 * k + (end - start), &lp_rows, r, row.score);
                }
                c.retain(|&(_, _, t)| Some(t) != suppress);
                c.truncate(2 * k);
                c
            };
            let result = &mut results[sentence];
            if k == 1 {
                let (s, r, t) = cand[0];
                // An ending, or the last position: a hypothesis (unfinished without `</s>`).
                if t == opts.eos || cur_len + 1 >= max_length {
                    result.push(hypothesis(&rows[r], t, s, t == opts.eos, Vec::new()));
                } else {
                    next.extend(&rows, sentence, (s, r, t), None);
                }
                continue;
            }
            // Endings among the first `k` candidates join the finished set, which keeps the
            // `k` best by normalised score.
            for &(s, r, t) in cand.iter().take(k) {
                if t == opts.eos {
                    result.push(hypothesis(&rows[r], t, s, true, Vec::new()));
                }
            }
            let len_of = |h: &Hypothesis| h.tokens.len() + usize::from(h.finished);
            result.sort_by(|a, b| norm(b.score, len_of(b)).total_cmp(&norm(a.score, len_of(a))));
            result.truncate(k);
            // The `k` best unfinished extensions run on.
            let running: Vec<(f64, usize, u32)> = cand
                .iter()
                .filter(|c| c.2 != opts.eos)
                .take(k)
                .copied()
                .collect();
            let done = cur_len + 1 >= max_length
                || (result.len() >= k
                    && running.first().is_none_or(|&(s, r, _)| {
                        // The best running hypothesis at its new length (generated tokens).
                        let worst = result
                            .iter()
                            .map(|h| norm(h.score, len_of(h)))
                            .fold(f64::INFINITY, f64::min);
                        norm(s, rows[r].tokens.len() + 1) <= worst
                    }));
            if !done {
                for c in running {
                    next.extend(&rows, sentence, c, None);
                }
            }
        }
        if !next.advance(model, &mut state, &mut rows)? {
            break;
        }
    }
    Ok(results)
}

/// The token of row `r`'s largest logit other than `suppress`, the first of equals.
fn argmax_except(lp: &LogProbs, r: usize, suppress: Option<u32>) -> u32 {
    let logits = lp.logits(r);
    let mut best: Option<(usize, f32)> = None;
    for (c, &l) in logits.iter().enumerate() {
        if Some(lp.token(c)) == suppress {
            continue;
        }
        if best.is_none_or(|(_, b)| l > b) {
            best = Some((c, l));
        }
    }
    lp.token(best.map_or(0, |b| b.0))
}
