//! Decoding requests: token ids or lines translated with greedy or beam search, length-capped
//! ([`translate`]), and the corpus scores of translations.

use crate::error::{Error, Result};
use crate::model::{EngineRules, MtDecoder, MtModel};
use candle_core::{Device, Tensor};
use transformer_decode::{
    beam_search_nbest, ctranslate2_search_prefixed, greedy, huggingface_search, DecodeOptions,
    Hypothesis, SearchRules,
};
use transformer_text::bucket::{make_batch, source_batches};
use transformer_text::score::bleu::{corpus_bleu, BleuOptions};
use transformer_text::subword::{Subword, TextTokenizer};

/// Decoder rows (sentences x beam) per batch when translating: [`DecodeRequest`]'s default.
pub const DECODE_BATCH_ROWS: usize = 128;

/// A source longer than the model takes, cut to fit by the length rule of [`translate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated {
    /// The source's index in the input (0-based; line `index + 1` of a file).
    pub index: usize,
    /// Its tokens.
    pub tokens: usize,
    /// The tokens translated: its first `kept`.
    pub kept: usize,
}

impl std::fmt::Display for Truncated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "line {}: {} tokens, more than the model's {}: only its first {} tokens are \
             translated (split the line to translate all of it)",
            self.index + 1,
            self.tokens,
            self.kept,
            self.kept
        )
    }
}

/// The most source tokens (without `<eos>`) `model` takes: its positions less one for
/// `<eos>`; `None` for a model without a limit (the recurrent ones).
pub fn max_source_tokens(model: &MtModel) -> Option<usize> {
    model.max_positions().map(|p| p.saturating_sub(1))
}

/// The sources of `src` that the length rule of [`translate`] cuts, in input order.
pub fn over_long(model: &MtModel, src: &[Vec<u32>]) -> Vec<Truncated> {
    let Some(max) = max_source_tokens(model) else {
        return Vec::new();
    };
    src.iter()
        .enumerate()
        .filter(|(_, s)| s.len() > max)
        .map(|(index, s)| Truncated {
            index,
            tokens: s.len(),
            kept: max,
        })
        .collect()
}

/// The lines of `lines` that [`translate_lines`] cuts to fit the model (tokenized with
/// `tok`), in input order: what a caller reports as warnings.
pub fn over_long_lines(model: &MtModel, tok: &Subword, lines: &[String]) -> Vec<Truncated> {
    let ids: Vec<Vec<u32>> = lines.iter().map(|l| tok.encode(l)).collect();
    over_long(model, &ids)
}

/// `seqs` with every sequence longer than `max` tokens cut to its first `max` (borrowed when
/// none is): the length rule of [`translate`], which training's validation loss follows too.
pub fn fit(seqs: &[Vec<u32>], max: Option<usize>) -> std::borrow::Cow<'_, [Vec<u32>]> {
    match max {
        Some(m) if seqs.iter().any(|s| s.len() > m) => {
            std::borrow::Cow::Owned(seqs.iter().map(|s| s[..s.len().min(m)].to_vec()).collect())
        }
        _ => std::borrow::Cow::Borrowed(seqs),
    }
}

/// A decoding request: the search ([`DecodeOptions`]: beam, length limits and penalty, what
/// to return) and how many decoder rows (sentences x beam) a batch may hold. Every caller,
/// the server, `mt translate`, `mt eval`, validation in training and the benchmarks, decodes
/// through [`translate`] with one of these.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeRequest {
    /// The search.
    pub options: DecodeOptions,
    /// Decoder rows (sentences x beam) per batch at most; [`DECODE_BATCH_ROWS`] by default.
    pub batch_rows: usize,
    /// The target tokens each source's translation starts with (CTranslate2's
    /// `target_prefix`: one list per source, empty for none), forced after the start token;
    /// `None`: the model's own ([`MtModel::target_prefix`], usually none) for every source.
    /// Decoded by CTranslate2's rules only.
    pub target_prefix: Option<Vec<Vec<u32>>>,
}

impl DecodeRequest {
    /// A request for `options` with the default batch size ([`DECODE_BATCH_ROWS`] rows).
    pub fn new(options: DecodeOptions) -> Self {
        Self {
            options,
            batch_rows: DECODE_BATCH_ROWS,
            target_prefix: None,
        }
    }

    /// This request with these target prefixes ([`Self::target_prefix`]: one per source).
    pub fn with_target_prefix(mut self, prefixes: Vec<Vec<u32>>) -> Self {
        self.target_prefix = Some(prefixes);
        self
    }

    /// This request with at most `rows` decoder rows per batch.
    pub fn with_batch_rows(mut self, rows: usize) -> Self {
        self.batch_rows = rows;
        self
    }
}

/// Translates token sequences in batches of at most `request.batch_rows` decoder rows
/// (greedy for beam 1, else beam search); returns each input's n-best list, best first, in
/// input order: beam search's finished hypotheses, or the one greedy hypothesis for beam 1
/// ([`best`] keeps the first of each). `on_batch(done, total)` reports progress. The
/// `decoder` ([`MtModel::decoder`]) holds the decoding weights made ready once, so a caller
/// that translates many times with the same weights (the server) prepares it once.
///
/// The length rule: a Transformer takes at most its positions (1,024) less one tokens of
/// source, so a longer source is translated from its first [`max_source_tokens`] tokens
/// ([`over_long`] names them, for warnings), and no output is longer than the positions less
/// one, whatever `max_len_a * source + max_len_b` says; every other sentence of the job is
/// translated as usual.
pub fn translate(
    decoder: &MtDecoder<'_>,
    src: &[Vec<u32>],
    request: &DecodeRequest,
    dev: &Device,
    mut on_batch: impl FnMut(usize, usize),
) -> Result<Vec<Vec<Hypothesis>>> {
    let mut options = request.options.clone();
    if let (Some(_), SearchRules::CTranslate2 { .. }) = (
        &decoder.model().engine_rules().replace_unknowns,
        options.rules,
    ) {
        // Each output `<unk>` is replaced from its alignment ([`hypothesis_text`]).
        options.want_attention = true;
    }
    let opts = &options;
    let sp = transformer_text::Specials {
        pad: opts.pad,
        bos: opts.bos,
        eos: opts.eos,
        unk: transformer_text::Specials::FIXED.unk,
        source_end: opts.source_end,
    };
    let own = decoder.model().target_prefix();
    let prefixes: Option<Vec<Vec<u32>>> = match &request.target_prefix {
        Some(p) if p.len() != src.len() => {
            return Err(Error::Usage(format!(
                "{} target prefixes for {} sources: give one per source (empty for none)",
                p.len(),
                src.len()
            )))
        }
        Some(p) => Some(p.clone()),
        None if own.is_empty() => None,
        None => Some(vec![own.to_vec(); src.len()]),
    }
    // As CTranslate2: prefixes in force when some source has one.
    .filter(|p| p.iter().any(|x| !x.is_empty()));
    if prefixes.is_some() && !matches!(opts.rules, SearchRules::CTranslate2 { .. }) {
        return Err(Error::Usage(
            "target prefixes are decoded by CTranslate2's search rules only (a CTranslate2 \
             or Argos Translate model)"
                .into(),
        ));
    }
    let src = &*fit(src, max_source_tokens(decoder.model()));
    // Sentences per batch: beams multiply the decoder's rows.
    let max_rows = (request.batch_rows / opts.beam.max(1)).max(1);
    let groups = source_batches(src, 2048, max_rows);
    let mut out: Vec<Vec<Hypothesis>> = vec![Vec::new(); src.len()];
    let mut done = 0;
    for g in &groups {
        let empty: Vec<Vec<u32>> = vec![Vec::new(); src.len()];
        let b = make_batch(src, &empty, g.clone(), sp);
        let s = Tensor::from_vec(b.src.clone(), (b.rows, b.src_len), dev)?;
        let hyps = if let SearchRules::CTranslate2 {
            min_length,
            num_hypotheses,
        } = opts.rules
        {
            let group_prefixes: Option<Vec<Vec<u32>>> = prefixes
                .as_ref()
                .map(|p| b.indices.iter().map(|&i| p[i].clone()).collect());
            ctranslate2_search_prefixed(
                decoder,
                &s,
                opts,
                min_length,
                num_hypotheses,
                group_prefixes.as_deref(),
            )?
        } else if let SearchRules::HuggingFace {
            suppress,
            renormalize,
        } = opts.rules
        {
            huggingface_search(decoder, &s, opts, suppress, renormalize)?
        } else if opts.beam <= 1 {
            greedy(decoder, &s, opts)?
                .into_iter()
                .map(|h| vec![h])
                .collect()
        } else {
            beam_search_nbest(decoder, &s, opts)?
        };
        for (&i, h) in g.iter().zip(hyps) {
            out[i] = h;
        }
        done += g.len();
        on_batch(done, src.len());
    }
    Ok(out)
}

/// The best hypothesis of each n-best list [`translate`] returned.
pub fn best(nbest: Vec<Vec<Hypothesis>>) -> Vec<Hypothesis> {
    nbest.into_iter().map(|mut hs| hs.swap_remove(0)).collect()
}

/// Translates sentences with a tokenizer; returns the detokenized outputs in order. Lines
/// longer than the model takes follow the length rule of [`translate`]
/// ([`over_long_lines`] names them).
pub fn translate_lines(
    decoder: &MtDecoder<'_>,
    tok: &Subword,
    lines: &[String],
    request: &DecodeRequest,
    dev: &Device,
    on_batch: impl FnMut(usize, usize),
) -> Result<Vec<String>> {
    // An empty line (no tokens) translates to an empty line, without running the model.
    let ids: Vec<Vec<u32>> = lines.iter().map(|l| tok.encode(l)).collect();
    let nonempty: Vec<usize> = (0..ids.len()).filter(|&i| !ids[i].is_empty()).collect();
    let to_run: Vec<Vec<u32>> = nonempty.iter().map(|&i| ids[i].clone()).collect();
    let hyps = best(translate(decoder, &to_run, request, dev, on_batch)?);
    let rules = decoder.model().engine_rules();
    let mut out = vec![String::new(); lines.len()];
    for (&i, h) in nonempty.iter().zip(&hyps) {
        out[i] = hypothesis_text(rules, tok, &lines[i], h);
    }
    Ok(out)
}

/// The text of `h`, a translation of `source` by a model made under `rules`: its tokens
/// detokenized, where the model replaces unknown tokens (an Argos package's run, as Argos
/// Translate's call to CTranslate2 does) each `<unk>` spelled as the source piece its
/// alignment weighs most ([`replace_unknowns`]; `h` decoded with attention, as
/// [`translate`] decodes for such a model).
pub fn hypothesis_text(rules: &EngineRules, tok: &Subword, source: &str, h: &Hypothesis) -> String {
    let (Some(align), Some(p)) = (rules.replace_unknowns, tok.as_published()) else {
        return tok.decode(&h.tokens);
    };
    let unk = p.target.vocab.unk();
    if !h.tokens.contains(&unk) || h.attention.is_empty() {
        return tok.decode(&h.tokens);
    }
    // The source's ids are its prefix ids, then one per piece: the alignment's columns.
    let pieces = p.source_pieces(source);
    let start = p.source_prefix.len();
    let rows = alignment_rows(
        h,
        align.shape,
        (align.layer, align.heads),
        h.tokens.len(),
        start..start + pieces.len(),
    );
    let unk_piece = tok.token(unk);
    let mut spelled: Vec<String> = h.tokens.iter().map(|&t| tok.token(t)).collect();
    replace_unknowns(&mut spelled, &unk_piece, &rows, &pieces);
    p.decode_with(&h.tokens, |i| {
        (h.tokens[i] == unk && spelled[i] != unk_piece).then(|| spelled[i].clone())
    })
}

/// sacreBLEU's default corpus chrF of `hyps` against `refs`.
pub fn chrf(hyps: &[String], refs: &[String]) -> Result<f64> {
    transformer_text::score::chrf::corpus_chrf(
        hyps,
        refs,
        &transformer_text::score::chrf::ChrfOptions::default(),
    )
    .map(|s| s.score)
    .map_err(|e| Error::Usage(e.to_string()))
}

/// sacreBLEU's default corpus BLEU of `hyps` against `refs`.
pub fn bleu(hyps: &[String], refs: &[String]) -> Result<f64> {
    corpus_bleu(hyps, refs, &BleuOptions::default())
        .map(|s| s.score)
        .map_err(|e| Error::Usage(e.to_string()))
}

/// A hypothesis's alignment as CTranslate2 returns it: for each of its first `rows` output
/// positions, the encoder-decoder attention of decoder layer `layer`, averaged over its
/// first `heads` heads, at source positions `cols` (clamped to the positions decoded). The
/// hypothesis's attention is a model of `shape` (layers, heads)'s ([`Hypothesis::attention`]).
pub fn alignment_rows(
    h: &Hypothesis,
    shape: (usize, usize),
    (layer, heads): (usize, usize),
    rows: usize,
    cols: std::ops::Range<usize>,
) -> Vec<Vec<f32>> {
    let (layers, all_heads) = (shape.0.max(1), shape.1.max(1));
    let (layer, heads) = (layer.min(layers - 1), heads.clamp(1, all_heads));
    h.attention
        .iter()
        .take(rows)
        .map(|v| {
            let s = v.len() / (layers * all_heads);
            let at = &v[layer * all_heads * s..(layer + 1) * all_heads * s];
            let cols = cols.start.min(s)..cols.end.min(s);
            cols.map(|c| (0..heads).map(|hd| at[hd * s + c]).sum::<f32>() / heads as f32)
                .collect()
        })
        .collect()
}

/// CTranslate2's `replace_unknowns`: every `unk` among `tokens` becomes the token of
/// `source` that its alignment row (`alignment[i]` for `tokens[i]`, over the source's
/// positions; missing positions count 0) weighs most, the first of equals.
pub fn replace_unknowns(
    tokens: &mut [String],
    unk: &str,
    alignment: &[Vec<f32>],
    source: &[String],
) {
    for (t, row) in tokens.iter_mut().zip(alignment) {
        if t != unk || source.is_empty() {
            continue;
        }
        let weight = |i: usize| row.get(i).copied().unwrap_or(0.0);
        let mut best = 0;
        for i in 1..source.len() {
            if weight(i) > weight(best) {
                best = i;
            }
        }
        *t = source[best].clone();
    }
}
