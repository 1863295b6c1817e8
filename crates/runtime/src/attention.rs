//! The attention weights of one translation, for pictures ([`crate::viz`]).

use crate::error::{Error, Result};
use crate::load::LoadedMt;
use crate::model::{Arch, MtModel};
use crate::translate::{best, max_source_tokens, translate, DecodeRequest};
use candle_core::{DType, Device, Tensor};
use transformer_decode::DecodeOptions;
use transformer_text::subword::{Subword, TextTokenizer};

/// `(1, H, Q, K)` attention weights as `[head][query][key]`.
fn heads_of(w: &Tensor) -> Result<Vec<Vec<Vec<f32>>>> {
    Ok(w.squeeze(0)?.to_dtype(DType::F32)?.to_vec3::<f32>()?)
}

/// Translates `sentence` (greedy for beam 1, else beam search) and returns every attention
/// the model computed for it, for pictures ([`crate::viz`]): the Transformer's encoder
/// self-attention, decoder self-attention and encoder-decoder attention of every layer and
/// head, or a recurrent model's attention over the source. The translation is fed back
/// through the model with teacher forcing, which gives the same weights as decoding step by
/// step.
pub fn attention_set(
    run: &LoadedMt,
    sentence: &str,
    opts: &DecodeOptions,
    dev: &Device,
) -> Result<crate::viz::AttentionSet> {
    let tok = &run.tokenizer;
    let mut ids = tok.encode(sentence);
    // The length rule of `translate` (the caller warns with `over_long_lines`).
    if let Some(max) = max_source_tokens(&run.model) {
        ids.truncate(max);
    }
    if ids.is_empty() {
        return Err(Error::Usage(
            "the sentence has no tokens: give a sentence to translate".into(),
        ));
    }
    let request = DecodeRequest::new(*opts);
    let decoded = translate(
        &run.model.decoder()?,
        std::slice::from_ref(&ids),
        &request,
        dev,
        |_, _| {},
    )?;
    let hyp = best(decoded).remove(0).tokens;
    attention_of(&run.model, tok, run.config.arch, sentence, &ids, &hyp, dev)
}

/// The subword marker of the tokenizers' pieces: `▁woman` starts a word, `man` continues
/// one.
const WORD_START: char = '\u{2581}';

/// Shown before a piece that continues the word before it.
pub const CONTINUES: char = '\u{b7}';

/// Token labels as a reader reads them: a piece that starts a word without its marker
/// (`▁woman` as `woman`), a piece that continues a word marked with [`CONTINUES`] (`·man`),
/// specials as they are. Tokens of a tokenizer without the marker (words) stay as they are.
pub fn readable_tokens(tokens: &[String]) -> Vec<String> {
    let marked = tokens.iter().any(|t| t.starts_with(WORD_START));
    tokens
        .iter()
        .map(|t| {
            let special = t.starts_with('<') && t.ends_with('>');
            match t.strip_prefix(WORD_START) {
                Some(word) if !word.is_empty() => word.to_string(),
                Some(_) => t.clone(),
                None if marked && !special => format!("{CONTINUES}{t}"),
                None => t.clone(),
            }
        })
        .collect()
}

/// Every attention of `model` translating `sentence` (tokens `ids`, without `<eos>`) as
/// `hyp` (output tokens, without `<bos>` and `<eos>`), fed through the model with teacher
/// forcing: what [`attention_set`] returns once it has translated.
pub fn attention_of(
    model: &MtModel,
    tok: &Subword,
    arch: Arch,
    sentence: &str,
    ids: &[u32],
    hyp: &[u32],
    dev: &Device,
) -> Result<crate::viz::AttentionSet> {
    let sp = tok.specials();
    let mut src_ids = ids.to_vec();
    src_ids.extend(sp.source_end);
    let mut tgt_ids = vec![sp.bos];
    tgt_ids.extend(hyp);
    let src = Tensor::from_vec(src_ids.clone(), (1, src_ids.len()), dev)?;
    let tgt_in = Tensor::from_vec(tgt_ids.clone(), (1, tgt_ids.len()), dev)?;
    let name = |ids: &[u32]| -> Vec<String> {
        readable_tokens(&ids.iter().map(|&i| tok.token(i)).collect::<Vec<_>>())
    };
    let source_name = |ids: &[u32]| -> Vec<String> {
        readable_tokens(&ids.iter().map(|&i| tok.source_token(i)).collect::<Vec<_>>())
    };
    let mut tgt_out = hyp.to_vec();
    tgt_out.push(sp.eos);
    let mut set = crate::viz::AttentionSet {
        source: sentence.to_string(),
        translation: tok.decode(hyp),
        src_tokens: source_name(&src_ids),
        tgt_in_tokens: name(&tgt_ids),
        tgt_out_tokens: name(&tgt_out),
        model: arch.name().to_string(),
        ..Default::default()
    };
    let w = model.attention(&src, &tgt_in, sp.pad)?;
    if w.cross.is_empty() {
        return Err(Error::Usage(format!(
            "the {} model has no attention to show: it reads the source as one fixed-size \
             vector (train gru-dot or gru-bahdanau for attention)",
            arch.name()
        )));
    }
    set.encoder = w.encoder.iter().map(heads_of).collect::<Result<_>>()?;
    set.decoder = w.decoder.iter().map(heads_of).collect::<Result<_>>()?;
    set.cross = w.cross.iter().map(heads_of).collect::<Result<_>>()?;
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_drop_the_word_marker_and_mark_continuations() {
        let t = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            readable_tokens(&t(&[
                "<bos>",
                "\u{2581}A",
                "\u{2581}wo",
                "man",
                "\u{2581}.",
                "<eos>"
            ])),
            t(&["<bos>", "A", "wo", "\u{b7}man", ".", "<eos>"])
        );
        // Words (no marker anywhere) stay as they are.
        assert_eq!(
            readable_tokens(&t(&["a", "dog", "<eos>"])),
            t(&["a", "dog", "<eos>"])
        );
    }
}
