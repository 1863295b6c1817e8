//! Subword tokens for translation: byte-pair encoding (Sennrich et al. 2016) trained with the
//! Hugging Face `tokenizers` crate and saved as its `tokenizer.json`, so that a run directory
//! carries everything a translation needs.
//!
//! The pipeline, chosen so that decoding gives back the text exactly (what sacreBLEU scores):
//! - normalizer NFKC (compatibility forms folded; Hangul stays composed);
//! - pre-tokenizer: whitespace becomes `▁` attached to the next word (SentencePiece's
//!   "metaspace"), then punctuation is split off into its own pieces. The `▁` markers keep
//!   every space, so splitting punctuation loses nothing: `▁young` `,` decodes to ` young,`;
//! - model: BPE over those pieces, no merges across them; characters never seen in training
//!   become `<unk>`;
//! - decoder: metaspace (pieces concatenated, `▁` back to spaces, the leading one dropped).
//!
//! A second kind, [`Subword::train_words`], is the word vocabulary of the published Multi30k
//! baselines: text lowercased, punctuation split off, one token per word, every word seen
//! fewer than twice mapped to `<unk>`. It exists so that a perplexity can be measured the
//! way those baselines measure it (per lowercased word, rare words sharing `<unk>`); it
//! decodes to the tokens joined by spaces, which sacreBLEU's mixed-case score penalises, so
//! its BLEU is read in the lowercased-token convention.
//!
//! Every tokenizer has four special tokens with fixed ids ([`Specials`]): `<pad>` 0,
//! `<bos>` 1, `<eos>` 2, `<unk>` 3.

use crate::error::{Error, Result};
use crate::published::PublishedTokenizer;
use std::path::Path;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::unigram::{Unigram, UnigramTrainerBuilder};
use tokenizers::models::wordlevel::{WordLevel, WordLevelTrainerBuilder};
use tokenizers::models::TrainerWrapper;
use tokenizers::normalizers::unicode::NFKC;
use tokenizers::normalizers::utils::{Lowercase, Sequence as Normalizers};
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::punctuation::Punctuation;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::whitespace::WhitespaceSplit;
use tokenizers::{AddedToken, Tokenizer};

pub use crate::specials::Specials;

/// The special tokens' spellings, in id order.
pub const SPECIAL_TOKENS: [&str; 4] = ["<pad>", "<bos>", "<eos>", "<unk>"];

/// What a translation model needs of a tokenizer: text to ids and back, the special ids, the
/// vocabulary size, and each id's spelling (to label attention pictures).
pub trait TextTokenizer {
    /// Source ids of `text`, without `<bos>` or `<eos>` (a published model's own source
    /// prefix included).
    fn encode(&self, text: &str) -> Vec<u32>;
    /// Text of target `ids`, special tokens left out.
    fn decode(&self, ids: &[u32]) -> String;
    /// The special ids.
    fn specials(&self) -> Specials;
    /// Number of target ids, specials included.
    fn vocab_size(&self) -> usize;
    /// Number of source ids: the target's for one joint vocabulary.
    fn source_vocab_size(&self) -> usize {
        self.vocab_size()
    }
    /// The spelling of one target id (`<unk>` style for specials).
    fn token(&self, id: u32) -> String;
    /// The spelling of one source id: [`TextTokenizer::token`] for one joint vocabulary.
    fn source_token(&self, id: u32) -> String {
        self.token(id)
    }
}

/// How to train a BPE tokenizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BpeOptions {
    /// Target vocabulary size, specials included.
    pub vocab_size: usize,
    /// A pair must occur this often to be merged.
    pub min_frequency: u64,
}

impl Default for BpeOptions {
    fn default() -> Self {
        Self {
            vocab_size: 8000,
            min_frequency: 2,
        }
    }
}

/// A run's tokenizer: one trained here (BPE subwords, or lowercased words) with the fixed
/// [`Specials`], or a published model's own ([`PublishedTokenizer`]: its vocabularies, its
/// SentencePiece models, its special ids).
#[derive(Clone)]
pub struct Subword {
    kind: Kind,
}

/// Which of the two a [`Subword`] is.
#[derive(Clone)]
enum Kind {
    /// Trained here: the `tokenizers` crate's model with the fixed specials.
    Trained(Tokenizer),
    /// A published model's own.
    Published(std::sync::Arc<PublishedTokenizer>),
}

impl std::fmt::Debug for Subword {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Subword(vocab {})", self.vocab_size())
    }
}

/// The four specials as the trainers take them (so they get ids 0-3 in order).
fn special_tokens() -> Vec<AddedToken> {
    SPECIAL_TOKENS
        .iter()
        .map(|t| AddedToken::from(*t, true))
        .collect()
}

/// A subword model in the pipeline of the module docs: NFKC, metaspace and punctuation
/// pre-tokenization, metaspace decoding.
fn subword_pipeline(
    model: impl Into<tokenizers::models::ModelWrapper>,
    origin: &Path,
) -> Result<Tokenizer> {
    let mut tokenizer = Tokenizer::new(model);
    tokenizer
        .with_normalizer(Some(NFKC))
        .map_err(|e| tok_err(origin, e))?;
    tokenizer.with_pre_tokenizer(Some(Sequence::new(vec![
        Metaspace::new('▁', PrependScheme::Always, true).into(),
        Punctuation::default().into(),
    ])));
    tokenizer.with_decoder(Some(Metaspace::new('▁', PrependScheme::Always, true)));
    Ok(tokenizer)
}

/// A vocabulary must have room beside the specials.
fn check_vocab_size(vocab_size: usize, origin: &Path) -> Result<()> {
    if vocab_size <= SPECIAL_TOKENS.len() {
        return Err(tok_err(
            origin,
            format!(
                "a vocabulary of {vocab_size} leaves no room beside the {} special tokens; ask \
                 for thousands (8000 is the default)",
                SPECIAL_TOKENS.len()
            ),
        ));
    }
    Ok(())
}

fn tok_err(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::Tokenizer {
        path: path.into(),
        msg: msg.to_string(),
    }
}

impl Subword {
    /// The id of the piece `token` as [`TextTokenizer::token`] spells it (`▁Ein`, `<unk>`),
    /// or `None` when the vocabulary has no such piece.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match &self.kind {
            Kind::Published(p) => p.target.vocab.id(token),
            Kind::Trained(inner) => inner.token_to_id(token),
        }
    }

    /// The target's unknown id: a published model's target vocabulary's, else the fixed
    /// `<unk>`.
    pub fn target_unk(&self) -> u32 {
        match &self.kind {
            Kind::Published(p) => p.target.vocab.unk(),
            Kind::Trained(_) => Specials::FIXED.unk,
        }
    }

    /// The target ids of the pieces `tokens` (a forced target prefix), a piece the vocabulary
    /// lacks as [`Self::target_unk`] (CTranslate2 forces `<unk>` there).
    pub fn target_ids(&self, tokens: &[String]) -> Vec<u32> {
        let unk = self.target_unk();
        tokens
            .iter()
            .map(|t| self.token_to_id(t).unwrap_or(unk))
            .collect()
    }

    /// The source id of the piece `token` (a published model's source vocabulary; else
    /// [`Subword::token_to_id`]).
    pub fn source_token_to_id(&self, token: &str) -> Option<u32> {
        match &self.kind {
            Kind::Published(p) => p.source.vocab.id(token),
            Kind::Trained(inner) => inner.token_to_id(token),
        }
    }

    /// Trains BPE on `texts` (every sentence of the training split, both languages for a
    /// joint vocabulary). `origin` names the data in errors.
    pub fn train_bpe<S: AsRef<str> + Send>(
        texts: impl Iterator<Item = S> + Send,
        opts: BpeOptions,
        origin: &Path,
    ) -> Result<Self> {
        check_vocab_size(opts.vocab_size, origin)?;
        let model = BPE::builder()
            .unk_token(SPECIAL_TOKENS[3].to_string())
            .build()
            .map_err(|e| tok_err(origin, e))?;
        let tokenizer = subword_pipeline(model, origin)?;
        let trainer = TrainerWrapper::BpeTrainer(
            BpeTrainerBuilder::new()
                .vocab_size(opts.vocab_size)
                .min_frequency(opts.min_frequency)
                .show_progress(false)
                .special_tokens(special_tokens())
                .build(),
        );
        Self::trained(tokenizer, trainer, texts, origin)
    }

    /// Trains a unigram language-model tokenizer (Kudo 2018, SentencePiece's default) on
    /// `texts`, with the same normalizer, pre-tokenizer and decoder as [`Subword::train_bpe`]
    /// and `opts.vocab_size` pieces (`min_frequency` does not apply).
    pub fn train_unigram<S: AsRef<str> + Send>(
        texts: impl Iterator<Item = S> + Send,
        opts: BpeOptions,
        origin: &Path,
    ) -> Result<Self> {
        check_vocab_size(opts.vocab_size, origin)?;
        let tokenizer = subword_pipeline(Unigram::default(), origin)?;
        let trainer = TrainerWrapper::UnigramTrainer(
            UnigramTrainerBuilder::default()
                .vocab_size(opts.vocab_size as u32)
                .unk_token(Some(SPECIAL_TOKENS[3].to_string()))
                .special_tokens(special_tokens())
                .show_progress(false)
                .build()
                .map_err(|e| tok_err(origin, e))?,
        );
        Self::trained(tokenizer, trainer, texts, origin)
    }

    /// The same tokenizer with byte fallback: 256 pieces `<0x00>` ... `<0xFF>` added after its
    /// own, and a character it has no piece for is spelled as its UTF-8 bytes instead of
    /// `<unk>` (SentencePiece's `byte_fallback`); decoding turns the bytes back into the
    /// character. For the subword kinds (BPE, unigram) only.
    pub fn with_byte_fallback(&self, origin: &Path) -> Result<Self> {
        // The `tokenizers` crate reads byte fallback from a model's vocabulary but has no
        // call that adds the byte pieces to a trained model; its JSON form is where they go.
        let inner = self
            .hf()
            .ok_or_else(|| tok_err(origin, "a published model's tokenizer has its own pieces"))?;
        let json = inner.to_string(false).map_err(|e| tok_err(origin, e))?;
        let mut v: serde_json::Value =
            serde_json::from_str(&json).map_err(|e| tok_err(origin, e))?;
        let bytes = (0..=255u8).map(|b| format!("<0x{b:02X}>"));
        let model = &mut v["model"];
        match model["type"].as_str() {
            Some("BPE") => {
                let vocab = model["vocab"]
                    .as_object_mut()
                    .ok_or_else(|| tok_err(origin, "a BPE model without a vocabulary"))?;
                let mut next = vocab.len();
                for b in bytes {
                    vocab.insert(b, next.into());
                    next += 1;
                }
            }
            Some("Unigram") => {
                let vocab = model["vocab"]
                    .as_array_mut()
                    .ok_or_else(|| tok_err(origin, "a unigram model without a vocabulary"))?;
                // The byte pieces are only ever chosen for characters without a piece; the
                // lowest score keeps them last among equals.
                let lowest = vocab
                    .iter()
                    .filter_map(|p| p[1].as_f64())
                    .fold(0.0f64, f64::min);
                for b in bytes {
                    vocab.push(serde_json::json!([b, lowest]));
                }
            }
            other => {
                return Err(tok_err(
                    origin,
                    format!("byte fallback needs a subword model, not {other:?}"),
                ))
            }
        }
        model["byte_fallback"] = true.into();
        let metaspace = v["decoder"].clone();
        v["decoder"] = serde_json::json!({
            "type": "Sequence",
            "decoders": [{"type": "ByteFallback"}, metaspace],
        });
        Self::from_bytes(v.to_string().as_bytes(), origin)
    }

    /// The `model` object of a tokenizer trained here, as `tokenizer.json` holds it; `None`
    /// for a published model's.
    fn trained_model(&self) -> Option<serde_json::Value> {
        let json = self.hf()?.to_string(false).ok()?;
        let mut v: serde_json::Value = serde_json::from_str(&json).ok()?;
        Some(v["model"].take())
    }

    /// Whether this is the word tokenizer (`words`): its pieces are whole words, so a
    /// character alone says nothing of what it spells.
    pub fn is_words(&self) -> bool {
        self.trained_model()
            .is_some_and(|m| m["type"] == "WordLevel")
    }

    /// Whether a character the tokenizer has no piece for is spelled as bytes.
    pub fn byte_fallback(&self) -> bool {
        self.trained_model()
            .is_some_and(|m| m["byte_fallback"] == true)
    }

    /// Trains a word vocabulary on `texts`: NFKC and lowercase, split at whitespace and
    /// around every punctuation character, and every word seen at least `min_frequency`
    /// times gets an id (the others become `<unk>`). Decoding joins the words with spaces.
    pub fn train_words<S: AsRef<str> + Send>(
        texts: impl Iterator<Item = S> + Send,
        min_frequency: u64,
        origin: &Path,
    ) -> Result<Self> {
        let model = WordLevel::builder()
            .unk_token(SPECIAL_TOKENS[3].to_string())
            .build()
            .map_err(|e| tok_err(origin, e))?;
        let mut tokenizer = Tokenizer::new(model);
        tokenizer
            .with_normalizer(Some(Normalizers::new(vec![NFKC.into(), Lowercase.into()])))
            .map_err(|e| tok_err(origin, e))?;
        tokenizer.with_pre_tokenizer(Some(Sequence::new(vec![
            WhitespaceSplit.into(),
            Punctuation::default().into(),
        ])));
        let trainer = TrainerWrapper::WordLevelTrainer(
            WordLevelTrainerBuilder::default()
                .min_frequency(min_frequency)
                .vocab_size(usize::MAX)
                .show_progress(false)
                .special_tokens(special_tokens())
                .build()
                .map_err(|e| tok_err(origin, e))?,
        );
        Self::trained(tokenizer, trainer, texts, origin)
    }

    /// `tokenizer` trained by `trainer` on `texts`, its specials checked.
    fn trained<S: AsRef<str> + Send>(
        mut tokenizer: Tokenizer,
        mut trainer: TrainerWrapper,
        texts: impl Iterator<Item = S> + Send,
        origin: &Path,
    ) -> Result<Self> {
        tokenizer
            .train(&mut trainer, texts)
            .map_err(|e| tok_err(origin, e))?;
        Self::checked(tokenizer, origin)
    }

    /// Checks that the four specials have their fixed ids.
    fn checked(inner: Tokenizer, origin: &Path) -> Result<Self> {
        for (id, tok) in SPECIAL_TOKENS.iter().enumerate() {
            if inner.token_to_id(tok) != Some(id as u32) {
                return Err(tok_err(
                    origin,
                    format!(
                        "the special token {tok} must have id {id} (found {:?}); this file \
                         was not written by `transformer mt train`",
                        inner.token_to_id(tok)
                    ),
                ));
            }
        }
        Ok(Self {
            kind: Kind::Trained(inner),
        })
    }

    /// A published model's tokenizer.
    pub fn published(p: PublishedTokenizer) -> Self {
        Self {
            kind: Kind::Published(std::sync::Arc::new(p)),
        }
    }

    /// This tokenizer, removing `prefix` (and then one space) from the start of every
    /// decoded text, as Argos Translate removes its `target_prefix` (a published model's
    /// tokenizer only; `None`: nothing is removed).
    pub fn with_strip_prefix(mut self, prefix: Option<String>) -> Self {
        if let Kind::Published(p) = &mut self.kind {
            std::sync::Arc::make_mut(p).strip_prefix = prefix;
        }
        self
    }

    /// The published model's tokenizer, if this is one.
    pub fn as_published(&self) -> Option<&PublishedTokenizer> {
        match &self.kind {
            Kind::Published(p) => Some(p),
            Kind::Trained(_) => None,
        }
    }

    /// The `tokenizers` model of a tokenizer trained here; `None` for a published model's.
    fn hf(&self) -> Option<&Tokenizer> {
        match &self.kind {
            Kind::Trained(t) => Some(t),
            Kind::Published(_) => None,
        }
    }

    /// Target ids of `text` (a reference, for training): the target side's own pieces for a
    /// published model with two, else [`TextTokenizer::encode`].
    pub fn encode_target(&self, text: &str) -> Vec<u32> {
        match &self.kind {
            Kind::Published(p) if !text.trim().is_empty() => p.encode_target(text),
            _ => self.encode(text),
        }
    }

    /// The source side's pieces of `text` (what [`TextTokenizer::encode`] looks up).
    pub fn pieces(&self, text: &str) -> Vec<String> {
        match &self.kind {
            Kind::Published(p) => p.source_pieces(text),
            Kind::Trained(_) => self
                .encode(text)
                .into_iter()
                .map(|i| self.token(i))
                .collect(),
        }
    }

    /// Writes `tokenizer.json` (the `tokenizers` crate's format; Python's `tokenizers`
    /// reads it too).
    pub fn save(&self, path: &Path) -> Result<()> {
        let json = match &self.kind {
            Kind::Published(p) => p.to_json().to_string(),
            Kind::Trained(inner) => inner.to_string(false).map_err(|e| tok_err(path, e))?,
        };
        std::fs::write(path, json).map_err(|source| Error::Io {
            action: "write",
            path: path.into(),
            source,
        })
    }

    /// Reads a `tokenizer.json` written by [`Subword::save`].
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            action: "read",
            path: path.into(),
            source,
        })?;
        Self::from_bytes(&bytes, path)
    }

    /// Parses the bytes of a `tokenizer.json`; `path` names it in errors.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self> {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(bytes) {
            if v.get("published").is_some() {
                return Ok(Self::published(PublishedTokenizer::from_json(&v, path)?));
            }
        }
        // The `tokenizers` crate panics (an `expect` inside its decoder deserializer) on some
        // damaged files instead of returning an error; a damaged file must be an error here.
        let parsed = std::panic::catch_unwind(|| Tokenizer::from_bytes(bytes)).map_err(|_| {
            tok_err(
                path,
                "not a usable tokenizer.json (damaged or truncated): copy it again from the \
                 run that wrote it",
            )
        })?;
        let inner =
            parsed.map_err(|e| tok_err(path, format!("not a usable tokenizer.json: {e}")))?;
        Self::checked(inner, path)
    }
}

impl TextTokenizer for Subword {
    fn encode(&self, text: &str) -> Vec<u32> {
        if text.trim().is_empty() {
            return Vec::new();
        }
        if let Kind::Published(p) = &self.kind {
            return p.encode(text);
        }
        // Encoding only fails on a model error; this model maps anything unknown to <unk>.
        self.hf()
            .and_then(|t| t.encode(text, false).ok())
            .map(|e| e.get_ids().to_vec())
            .unwrap_or_default()
    }

    fn decode(&self, ids: &[u32]) -> String {
        if let Kind::Published(p) = &self.kind {
            return p.decode(ids);
        }
        self.hf()
            .and_then(|t| t.decode(ids, true).ok())
            .unwrap_or_default()
    }

    fn specials(&self) -> Specials {
        match &self.kind {
            Kind::Published(p) => p.specials,
            Kind::Trained(_) => Specials::FIXED,
        }
    }

    fn vocab_size(&self) -> usize {
        match &self.kind {
            Kind::Published(p) => p.target.vocab.len(),
            Kind::Trained(inner) => inner.get_vocab_size(true),
        }
    }

    fn source_vocab_size(&self) -> usize {
        match &self.kind {
            Kind::Published(p) => p.source.vocab.len(),
            Kind::Trained(_) => self.vocab_size(),
        }
    }

    fn source_token(&self, id: u32) -> String {
        match &self.kind {
            Kind::Published(p) => p.source.vocab.token(id).unwrap_or("<unk>").to_string(),
            Kind::Trained(_) => self.token(id),
        }
    }

    fn token(&self, id: u32) -> String {
        if let Kind::Published(p) = &self.kind {
            return p.target.vocab.token(id).unwrap_or("<unk>").to_string();
        }
        self.hf()
            .and_then(|t| t.id_to_token(id))
            .unwrap_or_else(|| SPECIAL_TOKENS[3].to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Subword {
        let text = [
            "Two young, White males are outside near many bushes.",
            "Several men in hard hats are operating a giant pulley system.",
            "A little girl climbing into a wooden playhouse.",
            "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
            "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.",
            "개가 공원에서 뛰어 논다.",
        ];
        let many: Vec<&str> = text.iter().cycle().take(60).copied().collect();
        Subword::train_bpe(
            many.into_iter(),
            BpeOptions {
                vocab_size: 200,
                min_frequency: 2,
            },
            Path::new("test"),
        )
        .unwrap()
    }

    #[test]
    fn round_trip_specials_and_unknowns() {
        let t = small();
        assert_eq!(t.specials(), Specials::FIXED);
        for s in [
            "Two young, White males are outside.",
            "Ein kleines Mädchen klettert „in“ ein Spielhaus.",
            "개가 공원에서 뛰어 논다.",
        ] {
            let ids = t.encode(s);
            assert!(!ids.is_empty());
            assert!(ids.iter().all(|&i| (i as usize) < t.vocab_size() && i != 0));
        }
        // Text made of seen characters round-trips exactly.
        let s = "Two young, White males are outside near many bushes.";
        assert_eq!(t.decode(&t.encode(s)), s);
        // An unseen character becomes <unk> (id 3), and specials are left out of decoding.
        let ids = t.encode("Two ☃ males");
        assert!(ids.contains(&3), "{ids:?}");
        assert_eq!(t.decode(&[1, t.encode("Two")[0], 2, 0]), "Two");
        assert!(t.encode("   ").is_empty());
        // Every id's spelling maps back to the id; an unknown spelling to none.
        for id in t.encode(s).into_iter().chain([0, 1, 2, 3]) {
            assert_eq!(t.token_to_id(&t.token(id)), Some(id));
        }
        assert_eq!(t.token_to_id("no such piece ☃"), None);
    }

    /// Unigram and byte fallback: text of seen characters round-trips; with byte fallback an
    /// unseen character is spelled in its UTF-8 bytes (no `<unk>`) and decodes back exactly;
    /// the 256 byte pieces come after the trained ones; the file written loads the same.
    #[test]
    fn unigram_and_byte_fallback_round_trip_unseen_characters() {
        let text = [
            "Two young, White males are outside near many bushes.",
            "A little girl climbing into a wooden playhouse.",
            "개가 공원에서 뛰어 논다.",
            "아이들이 공원에서 논다.",
        ];
        let many: Vec<&str> = text.iter().cycle().take(80).copied().collect();
        let opts = BpeOptions {
            vocab_size: 120,
            min_frequency: 2,
        };
        let origin = Path::new("test");
        let unigram = Subword::train_unigram(many.iter(), opts, origin).unwrap();
        let bpe = Subword::train_bpe(many.iter(), opts, origin).unwrap();
        assert!(unigram.vocab_size() <= 120);
        for s in text {
            assert_eq!(unigram.decode(&unigram.encode(s)), s);
        }
        let unseen = "개가 ☃ 뛰어 놉니다.";
        for t in [&unigram, &bpe] {
            assert!(!t.byte_fallback());
            assert!(t.encode(unseen).contains(&3));
            let b = t.with_byte_fallback(origin).unwrap();
            assert!(b.byte_fallback());
            assert_eq!(b.vocab_size(), t.vocab_size() + 256);
            let ids = b.encode(unseen);
            assert!(!ids.contains(&3), "{ids:?}");
            assert_eq!(b.decode(&ids), unseen);
            // ☃ is E2 98 83: three byte pieces, the last 256 ids.
            let first_byte = t.vocab_size() as u32;
            assert_eq!(b.token(first_byte + 0xE2), "<0xE2>");
            assert!(ids.contains(&(first_byte + 0xE2)) && ids.contains(&(first_byte + 0x83)));
            for s in text {
                assert_eq!(b.encode(s), t.encode(s), "seen text is spelled as before");
            }
            let dir = std::env::temp_dir().join(format!("bytes-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let p = dir.join("tokenizer.json");
            b.save(&p).unwrap();
            let back = Subword::load(&p).unwrap();
            assert_eq!(back.encode(unseen), ids);
            assert_eq!(back.decode(&ids), unseen);
            std::fs::remove_dir_all(&dir).ok();
        }
    }

    #[test]
    fn words_lowercase_split_punctuation_and_map_rare_words_to_unk() {
        let text = [
            "Two young, White males are outside.",
            "Two dogs are outside.",
            "A zebra.",
        ];
        let many = text.iter().take(2).cycle().take(4).chain(&text[2..]);
        let t = Subword::train_words(many, 2, Path::new("test")).unwrap();
        assert_eq!(t.specials(), Specials::FIXED);
        // "a" and "zebra" were seen once: <unk>. Everything else has its own id.
        let ids = t.encode("TWO young, white zebra.");
        assert_eq!(ids.len(), 6, "{ids:?}");
        assert_eq!(ids.iter().filter(|&&i| i == 3).count(), 1, "{ids:?}");
        assert_eq!(
            t.decode(&t.encode("Two young, White males.")),
            "two young , white males ."
        );
        let dir = std::env::temp_dir().join(format!("words-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("tokenizer.json");
        t.save(&p).unwrap();
        let u = Subword::load(&p).unwrap();
        assert_eq!(
            u.encode("Two DOGS, outside!"),
            t.encode("two dogs , outside !")
        );
        assert_eq!(u.vocab_size(), t.vocab_size());
    }

    #[test]
    fn save_load_and_bad_files() {
        let t = small();
        let dir = std::env::temp_dir().join(format!("subword-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("tokenizer.json");
        t.save(&p).unwrap();
        let u = Subword::load(&p).unwrap();
        let s = "Several men in hard hats.";
        assert_eq!(t.encode(s), u.encode(s));
        assert_eq!(t.vocab_size(), u.vocab_size());
        let err = Subword::from_bytes(b"{not json", &p)
            .unwrap_err()
            .to_string();
        assert!(err.contains("tokenizer.json"), "{err}");
    }
}
