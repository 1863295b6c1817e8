//! The tokenizer of a published translation model (CTranslate2, Argos Translate, OPUS-MT):
//! each side's text split into pieces (by whitespace, for a model that takes tokens as they
//! are, or by its SentencePiece model) and the pieces looked up in that side's vocabulary, in
//! the model's own id order. The source and target sides may differ in both.
//!
//! A run directory keeps it in its `tokenizer.json` as one JSON object under the key
//! `"published"` (vocabularies as lists, SentencePiece models in base64), so that the run
//! needs nothing outside itself; [`crate::subword::Subword::load`] tells the two kinds apart.

use crate::error::{Error, Result};
use crate::sentencepiece::SentencePiece;
use crate::specials::Specials;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// How a side's text becomes pieces and pieces become text.
#[derive(Debug, Clone)]
pub enum Splitter {
    /// Pieces are the text's whitespace-separated tokens; joined by single spaces.
    Whitespace,
    /// A SentencePiece model's pieces (its normalization, its detokenization), and the
    /// model file's bytes (what a run keeps).
    SentencePiece(Arc<SentencePiece>, Arc<[u8]>),
}

impl Splitter {
    /// The SentencePiece model in `bytes` (a `.model` file; `path` names it in errors).
    pub fn sentencepiece(bytes: Vec<u8>, path: &Path) -> Result<Self> {
        let model = SentencePiece::from_bytes(&bytes, path)?;
        Ok(Splitter::SentencePiece(Arc::new(model), bytes.into()))
    }
}

/// One side's vocabulary: the model's tokens in id order.
#[derive(Debug, Clone)]
pub struct Vocabulary {
    tokens: Vec<String>,
    index: HashMap<String, u32>,
    unk: u32,
}

impl Vocabulary {
    /// The tokens in id order, `unk` the id unknown pieces map to. The first of duplicate
    /// tokens keeps the token's id (each line still takes an id), as CTranslate2 reads them.
    pub fn new(tokens: Vec<String>, unk: u32) -> Self {
        let mut index = HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            index.entry(t.clone()).or_insert(i as u32);
        }
        Self { tokens, index, unk }
    }

    /// The id of `token`, if it has one.
    pub fn id(&self, token: &str) -> Option<u32> {
        self.index.get(token).copied()
    }

    /// The tokens in id order.
    pub fn tokens(&self) -> &[String] {
        &self.tokens
    }

    /// The token of `id`.
    pub fn token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether it has no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The id unknown pieces become.
    pub fn unk(&self) -> u32 {
        self.unk
    }
}

/// One side: its splitter and vocabulary.
#[derive(Debug, Clone)]
pub struct Side {
    /// Text to pieces and back.
    pub splitter: Splitter,
    /// Pieces to ids and back.
    pub vocab: Vocabulary,
}

impl Side {
    fn pieces(&self, text: &str) -> Vec<String> {
        match &self.splitter {
            Splitter::Whitespace => text.split_whitespace().map(str::to_string).collect(),
            Splitter::SentencePiece(sp, _) => sp.encode_pieces(text),
        }
    }

    fn detokenize(&self, pieces: &[&str]) -> String {
        match &self.splitter {
            Splitter::Whitespace => pieces.join(" "),
            Splitter::SentencePiece(sp, _) => sp.decode_pieces(pieces),
        }
    }
}

/// A published model's tokenizer: source and target sides, the special ids, and the ids
/// put before every source sentence.
#[derive(Debug, Clone)]
pub struct PublishedTokenizer {
    /// The source side.
    pub source: Side,
    /// The target side.
    pub target: Side,
    /// The target's special ids (`bos`: the decoder's start token), the source's unknown id
    /// (`unk`) and what ends a source sentence (`source_end`).
    pub specials: Specials,
    /// Ids put before every source sentence (CTranslate2's `add_source_bos`).
    pub source_prefix: Vec<u32>,
    /// A leading `>>xxx<<` (a multilingual OPUS-MT model's target language) is one token,
    /// the rest of the text the splitter's, as `MarianTokenizer` reads it.
    pub language_tags: bool,
    /// Decoding leaves `<unk>` out (`MarianTokenizer.decode(skip_special_tokens=True)`);
    /// else its piece is detokenized as any other (CTranslate2 and Argos Translate).
    pub skip_unknown: bool,
    /// Text removed from the start of every decoded translation, and then one space (Argos
    /// Translate's handling of its `target_prefix`); set when a run is loaded, not saved.
    pub strip_prefix: Option<String>,
}

impl PublishedTokenizer {
    /// The source ids of `text`: its pieces looked up (unknown ones as the source's unknown
    /// id) after [`Self::source_prefix`]; without the source end, which batching adds.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let pieces = self.source_pieces(text);
        if pieces.is_empty() {
            return Vec::new();
        }
        let v = &self.source.vocab;
        let mut ids = self.source_prefix.clone();
        ids.extend(pieces.iter().map(|p| v.id(p).unwrap_or(v.unk)));
        ids
    }

    /// The target ids of `text` (a reference, for training): the target side's pieces
    /// looked up, without the end token.
    pub fn encode_target(&self, text: &str) -> Vec<u32> {
        let v = &self.target.vocab;
        self.target
            .pieces(text)
            .iter()
            .map(|p| v.id(p).unwrap_or(v.unk))
            .collect()
    }

    /// The source pieces of `text`, before the lookup: a leading `>>xxx<<` kept whole when
    /// the model has language tags.
    pub fn source_pieces(&self, text: &str) -> Vec<String> {
        if self.language_tags && text.starts_with(">>") {
            if let Some(end) = text.find("<<") {
                let tag = &text[..end + 2];
                let mut pieces = vec![tag.to_string()];
                pieces.extend(self.source.pieces(&text[end + 2..]));
                return pieces;
            }
        }
        self.source.pieces(text)
    }

    /// The text of target `ids`: the start, end and padding tokens left out.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_with(ids, |_| None)
    }

    /// [`Self::decode`] with the token at position `i` of `ids` spelled `spell(i)` where that
    /// gives a piece (CTranslate2's `replace_unknowns` puts source pieces in place of
    /// `<unk>`), detokenized with the others.
    pub fn decode_with(&self, ids: &[u32], spell: impl Fn(usize) -> Option<String>) -> String {
        let sp = self.specials;
        let unk = self.target.vocab.unk();
        let pieces: Vec<String> = ids
            .iter()
            .enumerate()
            .filter(|(_, &i)| i != sp.bos && i != sp.eos && i != sp.pad)
            .filter_map(|(at, &i)| match spell(at) {
                Some(piece) => Some(piece),
                None if self.skip_unknown && i == unk => None,
                None => self.target.vocab.token(i).map(str::to_string),
            })
            .collect();
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let text = self.target.detokenize(&pieces);
        match &self.strip_prefix {
            Some(p) if text.starts_with(p.as_str()) => {
                let rest = &text[p.len()..];
                rest.strip_prefix(' ').unwrap_or(rest).to_string()
            }
            _ => text,
        }
    }

    /// The JSON a run's `tokenizer.json` holds for it.
    pub fn to_json(&self) -> Value {
        let side = |s: &Side| {
            let split = match &s.splitter {
                Splitter::Whitespace => json!("whitespace"),
                Splitter::SentencePiece(_, bytes) => {
                    json!({ "sentencepiece": base64::encode(bytes) })
                }
            };
            json!({ "split": split, "vocab": s.vocab.tokens(), "unk": s.vocab.unk })
        };
        let sp = self.specials;
        json!({ "published": {
            "version": 1,
            "source": side(&self.source),
            "target": side(&self.target),
            "specials": {
                "pad": sp.pad, "bos": sp.bos, "eos": sp.eos, "unk": sp.unk,
                "source_end": sp.source_end,
            },
            "source_prefix": self.source_prefix,
            "language_tags": self.language_tags,
            "skip_unknown": self.skip_unknown,
        }})
    }

    /// Reads [`Self::to_json`]'s object (`v["published"]`); `path` names the file in errors.
    pub fn from_json(v: &Value, path: &Path) -> Result<Self> {
        let err = |msg: String| Error::Tokenizer {
            path: path.into(),
            msg: format!("{msg}: the file is damaged; import the model again"),
        };
        let p = &v["published"];
        if p["version"] != 1 {
            return Err(err(format!("published tokenizer version {}", p["version"])));
        }
        let id = |x: &Value, what: &str| -> Result<u32> {
            x.as_u64()
                .map(|i| i as u32)
                .ok_or_else(|| err(format!("no {what} id")))
        };
        let side = |s: &Value, name: &str| -> Result<Side> {
            let tokens: Vec<String> = serde_json::from_value(s["vocab"].clone())
                .map_err(|e| err(format!("the {name} vocabulary: {e}")))?;
            let unk = id(&s["unk"], &format!("{name} unknown"))?;
            let splitter = match &s["split"] {
                Value::String(w) if w == "whitespace" => Splitter::Whitespace,
                Value::Object(o) if o.contains_key("sentencepiece") => {
                    let b64 = o["sentencepiece"].as_str().unwrap_or_default();
                    let bytes = base64::decode(b64)
                        .map_err(|e| err(format!("the {name} SentencePiece model: {e}")))?;
                    Splitter::sentencepiece(bytes, path)?
                }
                other => return Err(err(format!("the {name} splitter {other}"))),
            };
            Ok(Side {
                splitter,
                vocab: Vocabulary::new(tokens, unk),
            })
        };
        let s = &p["specials"];
        let specials = Specials {
            pad: id(&s["pad"], "padding")?,
            bos: id(&s["bos"], "start")?,
            eos: id(&s["eos"], "end")?,
            unk: id(&s["unk"], "unknown")?,
            source_end: match &s["source_end"] {
                Value::Null => None,
                x => Some(id(x, "source end")?),
            },
        };
        let source_prefix: Vec<u32> = serde_json::from_value(p["source_prefix"].clone())
            .map_err(|e| err(format!("the source prefix: {e}")))?;
        let t = Self {
            source: side(&p["source"], "source")?,
            target: side(&p["target"], "target")?,
            specials,
            source_prefix,
            language_tags: p["language_tags"].as_bool().unwrap_or(false),
            skip_unknown: p["skip_unknown"].as_bool().unwrap_or(false),
            strip_prefix: None,
        };
        t.check(path)?;
        Ok(t)
    }

    /// Every special id inside its side's vocabulary.
    pub fn check(&self, path: &Path) -> Result<()> {
        let (s, t) = (
            self.source.vocab.len() as u32,
            self.target.vocab.len() as u32,
        );
        let sp = self.specials;
        let bad = [
            ("start", sp.bos, t),
            ("end", sp.eos, t),
            ("padding", sp.pad, s.max(t)),
            ("source unknown", sp.unk, s),
            ("target unknown", self.target.vocab.unk, t),
        ]
        .into_iter()
        .chain(sp.source_end.map(|e| ("source end", e, s)))
        .chain(self.source_prefix.iter().map(|&b| ("source start", b, s)))
        .find(|(_, id, n)| id >= n);
        match bad {
            Some((what, id, n)) => Err(Error::Tokenizer {
                path: path.into(),
                msg: format!("the {what} id {id} is outside its vocabulary of {n} tokens"),
            }),
            None => Ok(()),
        }
    }
}
