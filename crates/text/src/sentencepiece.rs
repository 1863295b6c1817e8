//! A reader for SentencePiece `.model` files (what OPUS-MT/Marian and Argos Translate ship)
//! that gives the same pieces as the `sentencepiece` Python package
//! (`SentencePieceProcessor.encode(text, out_type=str)`) and decodes as it does.
//!
//! Written by hand, following sentencepiece's C++ sources (`normalizer.cc`,
//! `unigram_model.cc`'s `EncodeOptimized`, `bpe_model.cc`, `sentencepiece_processor.cc`),
//! because no well-kept pure-Rust crate reads `.model` files exactly: the `sentencepiece`
//! crate binds the C++ library (and needs cmake to build it), and the `tokenizers` crate
//! only approximates the normalizer (its `spm_precompiled` works grapheme by grapheme and
//! takes the shortest matching rule, where SentencePiece takes the longest rule at each
//! position), so the character map is read here too. The model file
//! is a protobuf (`sentencepiece_model.proto`); the few fields needed are read from the wire
//! format directly, without a protobuf crate.
//!
//! What it does, step by step, as SentencePiece does:
//!
//! 1. Normalization ([`SentencePiece::normalize`]): the model's precompiled character map
//!    (e.g. `nmt_nfkc`; the longest rule matching at each position), user-defined pieces
//!    passed through untouched, leading, trailing and repeated spaces removed
//!    (`remove_extra_whitespaces`), one space put in front (`add_dummy_prefix`) and every
//!    space written as `▁` (U+2581, `escape_whitespaces`). Only `' '` counts as a space here:
//!    `nmt_nfkc` maps tabs, no-break and other spaces to `' '` through its character map.
//! 2. Segmentation: Unigram models by the best path through the lattice of known pieces
//!    (sum of scores; unknown characters cost the lowest score minus 10; user-defined
//!    pieces always win; unused pieces never appear), BPE models by merging the adjacent
//!    pair whose merged piece has the highest score (leftmost on ties).
//! 3. Unknown characters: runs of them become one unknown piece (id of `<unk>`), or, in a
//!    model with byte fallback, their UTF-8 bytes as `<0xXX>` pieces.
//!
//! Decoding ([`SentencePiece::decode_pieces`], [`SentencePiece::decode_ids`]) joins the
//! pieces with `▁` back to spaces, drops the leading space, turns byte pieces back into
//! UTF-8 (each byte of an invalid sequence becomes U+FFFD), drops control pieces (`<s>`,
//! `</s>`) and writes `<unk>` as ` ⁇ `.
//!
//! WORD and CHAR models are refused (no published translation model uses them).
//!
//! ```no_run
//! use transformer_text::sentencepiece::SentencePiece;
//!
//! let sp = SentencePiece::load("opus-mt-de-en/source.spm".as_ref())?;
//! let pieces = sp.encode_pieces("Ein Hund läuft.");
//! let ids = sp.encode_ids("Ein Hund läuft.");
//! assert_eq!(sp.decode_pieces(&pieces), "Ein Hund läuft.");
//! # let _ = ids;
//! # Ok::<(), transformer_text::Error>(())
//! ```

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's written form of a space.
pub const SPACE_SYMBOL: &str = "\u{2581}";
const SPACE: &[u8] = SPACE_SYMBOL.as_bytes();
const REPLACEMENT: &[u8] = "\u{fffd}".as_bytes();
/// What `<unk>` decodes to unless the model says otherwise (`unk_surface`).
pub const DEFAULT_UNK_SURFACE: &str = " \u{2047} ";
/// The penalty below the lowest piece score that an unknown character costs (Unigram).
const UNK_PENALTY: f32 = 10.0;

/// The segmentation algorithm of a model (`TrainerSpec.model_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelType {
    /// Unigram language model: best path through the lattice of pieces.
    Unigram,
    /// Byte-pair encoding: repeated merges of the best-scored adjacent pair.
    Bpe,
}

impl fmt::Display for ModelType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Unigram => "Unigram",
            Self::Bpe => "BPE",
        })
    }
}

/// The kind of a vocabulary entry (`ModelProto.SentencePiece.Type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceType {
    /// An ordinary piece.
    Normal,
    /// The unknown piece (`<unk>`); a model has exactly one.
    Unknown,
    /// A control symbol (`<s>`, `</s>`, language tags): never produced from text, decoded to
    /// nothing.
    Control,
    /// A user-defined symbol: always kept whole, never normalized.
    UserDefined,
    /// A piece that segmentation never produces.
    Unused,
    /// A byte piece `<0xXX>` (byte fallback).
    Byte,
}

impl PieceType {
    fn from_proto(value: u64) -> Option<Self> {
        Some(match value {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => return None,
        })
    }

    /// Whether SentencePiece keeps the piece among the segmentable ones (its `pieces_`);
    /// the others (unknown, control, byte) are only looked up by exact string.
    fn is_normal(self) -> bool {
        matches!(self, Self::Normal | Self::UserDefined | Self::Unused)
    }
}

#[derive(Debug, Clone)]
struct Entry {
    piece: String,
    score: f32,
    kind: PieceType,
}

/// A SentencePiece model read from a `.model` file: normalizer, vocabulary and segmentation.
#[derive(Debug, Clone)]
pub struct SentencePiece {
    origin: PathBuf,
    model_type: ModelType,
    entries: Vec<Entry>,
    /// NORMAL, USER_DEFINED and UNUSED pieces.
    normal: HashMap<Vec<u8>, u32>,
    /// UNKNOWN, CONTROL and BYTE pieces.
    reserved: HashMap<Vec<u8>, u32>,
    /// The normal pieces as a trie (the Unigram lattice).
    trie: Trie,
    /// The user-defined pieces, matched longest first (empty when there are none).
    user_defined: Trie,
    unk_id: u32,
    byte_fallback: bool,
    normalizer: Normalizer,
    denormalizer: Option<Normalizer>,
    unk_surface: String,
    min_score: f32,
    max_score: f32,
}

impl SentencePiece {
    /// Reads a SentencePiece `.model` file (gzip-compressed when its name ends in `.gz`).
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = crate::parallel::read_bytes(path)?;
        Self::from_bytes(&bytes, path)
    }

    /// Reads a model from the bytes of a `.model` file; `origin` names it in errors.
    pub fn from_bytes(bytes: &[u8], origin: &Path) -> Result<Self> {
        let fail = |msg: String| Error::Tokenizer {
            path: origin.to_path_buf(),
            msg,
        };
        if bytes.is_empty() {
            return Err(fail(
                "not a SentencePiece model: the file is empty".to_string(),
            ));
        }
        let proto = ModelProto::parse(bytes).map_err(|e| {
            fail(format!(
                "not a SentencePiece model (a .model file is a protobuf): {e}"
            ))
        })?;
        Self::from_proto(proto, origin).map_err(fail)
    }

    fn from_proto(proto: ModelProto, origin: &Path) -> Result<Self, String> {
        let model_type = match proto.trainer.model_type {
            1 => ModelType::Unigram,
            2 => ModelType::Bpe,
            3 => return Err("WORD models are not supported (only Unigram and BPE)".to_string()),
            4 => return Err("CHAR models are not supported (only Unigram and BPE)".to_string()),
            other => {
                return Err(format!(
                    "unknown model type {other} (SentencePiece knows 1 Unigram, 2 BPE, \
                     3 WORD, 4 CHAR)"
                ))
            }
        };
        if proto.pieces.is_empty() {
            return Err("not a SentencePiece model: it has no pieces (no vocabulary)".to_string());
        }
        let byte_fallback = proto.trainer.byte_fallback;
        let mut normal = HashMap::new();
        let mut reserved = HashMap::new();
        let mut trie = Trie::default();
        let mut user_defined = Trie::default();
        let mut unk_id = None;
        let mut bytes_found = [false; 256];
        let mut min_score = f32::MAX;
        let mut max_score = f32::MIN_POSITIVE;
        for (i, entry) in proto.pieces.iter().enumerate() {
            let id = u32::try_from(i).map_err(|_| "too many pieces".to_string())?;
            if entry.piece.is_empty() {
                return Err(format!("piece {i} is empty (a piece must not be empty)"));
            }
            let key = entry.piece.as_bytes().to_vec();
            let map = if entry.kind.is_normal() {
                &mut normal
            } else {
                &mut reserved
            };
            if let Some(first) = map.insert(key, id) {
                return Err(format!(
                    "piece {i} {:?} is already defined (as piece {first})",
                    entry.piece
                ));
            }
            if entry.kind.is_normal() {
                trie.insert(entry.piece.as_bytes(), id);
            }
            match entry.kind {
                PieceType::Normal => {
                    min_score = min_score.min(entry.score);
                    max_score = max_score.max(entry.score);
                }
                PieceType::UserDefined => user_defined.insert(entry.piece.as_bytes(), id),
                PieceType::Unknown => {
                    if let Some(first) = unk_id {
                        return Err(format!(
                            "pieces {first} and {i} are both the unknown piece (a model has one)"
                        ));
                    }
                    unk_id = Some(id);
                }
                PieceType::Byte => {
                    if !byte_fallback {
                        return Err(format!(
                            "byte piece {i} {:?} is found although byte_fallback is false",
                            entry.piece
                        ));
                    }
                    match piece_to_byte(&entry.piece) {
                        Some(b) => bytes_found[b as usize] = true,
                        None => {
                            return Err(format!(
                                "byte piece {i} {:?} is not of the form <0xXX>",
                                entry.piece
                            ))
                        }
                    }
                }
                PieceType::Control | PieceType::Unused => {}
            }
        }
        let Some(unk_id) = unk_id else {
            return Err(
                "no unknown piece (<unk>, type UNKNOWN) is defined; SentencePiece \
                        needs one"
                    .to_string(),
            );
        };
        if byte_fallback && bytes_found.iter().any(|&f| !f) {
            let missing = bytes_found.iter().filter(|&&f| !f).count();
            return Err(format!(
                "byte_fallback is true but {missing} of the 256 byte pieces <0x00>..<0xFF> \
                 are missing"
            ));
        }
        if model_type == ModelType::Unigram && normal.is_empty() {
            return Err("a Unigram model needs at least one normal piece".to_string());
        }
        let normalizer = Normalizer::new(&proto.normalizer, proto.trainer.suffix)?;
        let denormalizer = match &proto.denormalizer {
            Some(spec) if !spec.charsmap.is_empty() => Some(Normalizer::new(spec, false)?),
            _ => None,
        };
        let entries = proto
            .pieces
            .into_iter()
            .map(|p| Entry {
                piece: p.piece,
                score: p.score,
                kind: p.kind,
            })
            .collect();
        Ok(Self {
            origin: origin.to_path_buf(),
            model_type,
            entries,
            normal,
            reserved,
            trie,
            user_defined,
            unk_id,
            byte_fallback,
            normalizer,
            denormalizer,
            unk_surface: proto
                .trainer
                .unk_surface
                .unwrap_or_else(|| DEFAULT_UNK_SURFACE.to_string()),
            min_score,
            max_score,
        })
    }

    /// The segmentation algorithm.
    pub fn model_type(&self) -> ModelType {
        self.model_type
    }

    /// The number of pieces (ids run from 0 to `len() - 1`).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the vocabulary is empty (never, for a loaded model).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The file the model came from (or the name given to [`SentencePiece::from_bytes`]).
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// The id of the unknown piece.
    pub fn unk_id(&self) -> u32 {
        self.unk_id
    }

    /// Whether unknown characters become byte pieces instead of the unknown piece.
    pub fn byte_fallback(&self) -> bool {
        self.byte_fallback
    }

    /// The id of `piece`, or the unknown piece's id when the vocabulary lacks it (as
    /// SentencePiece's `PieceToId`).
    pub fn piece_to_id(&self, piece: &str) -> u32 {
        self.id_of(piece.as_bytes())
    }

    /// The id of `piece` when the vocabulary has it.
    pub fn get_id(&self, piece: &str) -> Option<u32> {
        let key = piece.as_bytes();
        self.reserved
            .get(key)
            .or_else(|| self.normal.get(key))
            .copied()
    }

    /// The piece with this id.
    pub fn id_to_piece(&self, id: u32) -> Option<&str> {
        self.entries.get(id as usize).map(|e| e.piece.as_str())
    }

    /// The score of the piece with this id.
    pub fn score(&self, id: u32) -> Option<f32> {
        self.entries.get(id as usize).map(|e| e.score)
    }

    /// The kind of the piece with this id.
    pub fn piece_type(&self, id: u32) -> Option<PieceType> {
        self.entries.get(id as usize).map(|e| e.kind)
    }

    /// `text` as the model's normalizer writes it before segmentation (spaces as `▁`).
    pub fn normalize(&self, text: &str) -> String {
        let normalized = self
            .normalizer
            .normalize(text.as_bytes(), Some(&self.user_defined));
        String::from_utf8_lossy(&normalized).into_owned()
    }

    /// The pieces of `text`, as `encode(text, out_type=str)` of the Python package.
    pub fn encode_pieces(&self, text: &str) -> Vec<String> {
        self.encode(text).into_iter().map(|(p, _)| p).collect()
    }

    /// The ids of `text`, as `encode(text)` of the Python package.
    pub fn encode_ids(&self, text: &str) -> Vec<u32> {
        self.encode(text).into_iter().map(|(_, id)| id).collect()
    }

    /// The pieces of `text` with their ids. A run of unknown characters is one piece (its
    /// text) with the unknown id; with byte fallback it is one `<0xXX>` piece per byte.
    pub fn encode(&self, text: &str) -> Vec<(String, u32)> {
        let normalized = self
            .normalizer
            .normalize(text.as_bytes(), Some(&self.user_defined));
        let segments = match self.model_type {
            ModelType::Unigram => self.segment_unigram(&normalized),
            ModelType::Bpe => self.segment_bpe(&normalized),
        };
        self.populate(&normalized, &segments)
    }

    /// The text of `pieces`, as `decode(pieces)` of the Python package. A piece missing
    /// from the vocabulary is copied as it is.
    pub fn decode_pieces<S: AsRef<str>>(&self, pieces: &[S]) -> String {
        let pieces: Vec<(&str, u32)> = pieces
            .iter()
            .map(|p| (p.as_ref(), self.piece_to_id(p.as_ref())))
            .collect();
        self.decode(&pieces)
    }

    /// The text of `ids`, as `decode(ids)` of the Python package; an id outside the
    /// vocabulary is an error.
    pub fn decode_ids(&self, ids: &[u32]) -> Result<String> {
        let mut pieces = Vec::with_capacity(ids.len());
        for &id in ids {
            let Some(entry) = self.entries.get(id as usize) else {
                return Err(Error::Tokenizer {
                    path: self.origin.clone(),
                    msg: format!(
                        "id {id} is out of range: the model has {} pieces (ids 0 to {})",
                        self.len(),
                        self.len() - 1
                    ),
                });
            };
            // As SentencePiece: ids become pieces, which are looked up again.
            pieces.push((entry.piece.as_str(), self.piece_to_id(&entry.piece)));
        }
        Ok(self.decode(&pieces))
    }

    fn id_of(&self, piece: &[u8]) -> u32 {
        self.reserved
            .get(piece)
            .or_else(|| self.normal.get(piece))
            .copied()
            .unwrap_or(self.unk_id)
    }

    fn kind(&self, id: u32) -> PieceType {
        self.entries
            .get(id as usize)
            .map_or(PieceType::Normal, |e| e.kind)
    }

    /// `EncodeOptimized` of `unigram_model.cc`: the best path ending at each byte position,
    /// found left to right. Path scores are summed in `f32`, which is what the package
    /// (0.2.3) does: summing in `f64`, as the source of `EncodeOptimized` reads, picks
    /// `00 0` instead of its `0 00` for `1,000` in one Korean test line (equal scores up to
    /// rounding). The first candidate wins ties.
    fn segment_unigram(&self, s: &[u8]) -> Vec<(usize, usize, u32)> {
        #[derive(Clone, Copy)]
        struct Best {
            id: u32,
            score: f32,
            starts_at: Option<usize>,
        }
        if s.is_empty() {
            return Vec::new();
        }
        let size = s.len();
        let unk_score = self.min_score - UNK_PENALTY;
        let mut best = vec![
            Best {
                id: self.unk_id,
                score: 0.0,
                starts_at: None,
            };
            size + 1
        ];
        let mut starts_at = 0;
        while starts_at < size {
            let till_here = best[starts_at].score;
            let mut has_single_node = false;
            let mblen = one_char_len(s[starts_at]).min(size - starts_at);
            let mut node = 0;
            let mut key_pos = starts_at;
            while key_pos < size {
                let Some(next) = self.trie.child(node, s[key_pos]) else {
                    break;
                };
                node = next;
                key_pos += 1;
                let Some(id) = self.trie.value(node) else {
                    continue;
                };
                let entry = &self.entries[id as usize];
                if entry.kind == PieceType::Unused {
                    continue;
                }
                let length = key_pos - starts_at;
                // User-defined pieces get a bonus so that they are always chosen.
                let score = if entry.kind == PieceType::UserDefined {
                    (f64::from(length as f32 * self.max_score) - 0.1) as f32
                } else {
                    entry.score
                };
                let candidate = score + till_here;
                let target = &mut best[key_pos];
                if target.starts_at.is_none() || candidate > target.score {
                    *target = Best {
                        id,
                        score: candidate,
                        starts_at: Some(starts_at),
                    };
                }
                if length == mblen {
                    has_single_node = true;
                }
            }
            if !has_single_node {
                let target = &mut best[starts_at + mblen];
                let candidate = unk_score + till_here;
                if target.starts_at.is_none() || candidate > target.score {
                    *target = Best {
                        id: self.unk_id,
                        score: candidate,
                        starts_at: Some(starts_at),
                    };
                }
            }
            starts_at += mblen;
        }
        let mut out = Vec::new();
        let mut ends_at = size;
        while ends_at > 0 {
            let node = best[ends_at];
            let Some(start) = node.starts_at.filter(|&st| st < ends_at) else {
                break;
            };
            out.push((start, ends_at, node.id));
            ends_at = start;
        }
        out.reverse();
        out
    }

    /// `bpe_model.cc`: start from characters (user-defined pieces whole and frozen), merge
    /// the adjacent pair whose merged piece is in the vocabulary with the highest score,
    /// leftmost first on ties; unused pieces are split back into what they were merged from.
    fn segment_bpe(&self, s: &[u8]) -> Vec<(usize, usize, u32)> {
        struct Symbol {
            prev: Option<usize>,
            next: Option<usize>,
            freeze: bool,
            start: usize,
            len: usize,
        }
        let mut symbols: Vec<Symbol> = Vec::new();
        let mut pos = 0;
        while pos < s.len() {
            let (mblen, freeze) = match self.user_defined.longest_prefix(&s[pos..]) {
                Some((len, _)) => (len, true),
                None => (one_char_len(s[pos]).min(s.len() - pos), false),
            };
            let index = symbols.len();
            symbols.push(Symbol {
                prev: index.checked_sub(1),
                next: (pos + mblen < s.len()).then_some(index + 1),
                freeze,
                start: pos,
                len: mblen,
            });
            pos += mblen;
        }
        if symbols.is_empty() {
            return Vec::new();
        }

        /// Pushes the merge of `left` and `right` when the merged piece is in the vocabulary.
        #[allow(clippy::too_many_arguments)]
        fn add_pair<'s>(
            sp: &SentencePiece,
            s: &'s [u8],
            symbols: &[Symbol],
            agenda: &mut BinaryHeap<Pair>,
            rev_merge: &mut HashMap<&'s [u8], usize>,
            left: Option<usize>,
            right: Option<usize>,
        ) {
            let (Some(left), Some(right)) = (left, right) else {
                return;
            };
            let (l, r) = (&symbols[left], &symbols[right]);
            if l.freeze || r.freeze {
                return;
            }
            let piece = &s[l.start..l.start + l.len + r.len];
            let Some(&id) = sp.normal.get(piece) else {
                return;
            };
            let entry = &sp.entries[id as usize];
            agenda.push(Pair {
                score: entry.score,
                left,
                right,
                size: piece.len(),
            });
            if entry.kind == PieceType::Unused {
                rev_merge.insert(piece, l.len);
            }
        }

        let mut agenda = BinaryHeap::new();
        // Merged unused piece -> length of its left part, for resegmentation.
        let mut rev_merge: HashMap<&[u8], usize> = HashMap::new();
        for i in 1..symbols.len() {
            add_pair(
                self,
                s,
                &symbols,
                &mut agenda,
                &mut rev_merge,
                Some(i - 1),
                Some(i),
            );
        }
        while let Some(top) = agenda.pop() {
            let (l, r) = (&symbols[top.left], &symbols[top.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != top.size {
                continue;
            }
            let right_next = r.next;
            symbols[top.left].len += symbols[top.right].len;
            symbols[top.left].next = right_next;
            if let Some(n) = right_next {
                symbols[n].prev = Some(top.left);
            }
            symbols[top.right].len = 0;
            let prev = symbols[top.left].prev;
            add_pair(
                self,
                s,
                &symbols,
                &mut agenda,
                &mut rev_merge,
                prev,
                Some(top.left),
            );
            let next = symbols[top.left].next;
            add_pair(
                self,
                s,
                &symbols,
                &mut agenda,
                &mut rev_merge,
                Some(top.left),
                next,
            );
        }

        let mut out = Vec::new();
        let mut index = Some(0);
        let mut stack = Vec::new();
        while let Some(i) = index {
            let sym = &symbols[i];
            stack.push((sym.start, sym.start + sym.len));
            while let Some((start, end)) = stack.pop() {
                let piece = &s[start..end];
                let id = self.id_of(piece);
                if self.kind(id) == PieceType::Unused {
                    if let Some(&left_len) = rev_merge.get(piece) {
                        if left_len > 0 && left_len < piece.len() {
                            stack.push((start + left_len, end));
                            stack.push((start, start + left_len));
                            continue;
                        }
                    }
                }
                out.push((start, end, id));
            }
            index = sym.next;
        }
        out
    }

    /// `PopulateSentencePieceText`: unknown runs merged, or split into byte pieces.
    fn populate(&self, normalized: &[u8], segments: &[(usize, usize, u32)]) -> Vec<(String, u32)> {
        let mut out: Vec<(Vec<u8>, u32)> = Vec::with_capacity(segments.len());
        let mut is_prev_unk = false;
        for &(start, end, id) in segments {
            let w = &normalized[start..end];
            let kind = self.kind(id);
            let is_unk = kind == PieceType::Unknown;
            if kind == PieceType::Control {
                out.push((w.to_vec(), id));
            } else if is_unk && self.byte_fallback {
                for &b in w {
                    let piece = format!("<0x{b:02X}>");
                    let byte_id = self.id_of(piece.as_bytes());
                    out.push((piece.into_bytes(), byte_id));
                }
            } else if is_prev_unk && is_unk && !out.is_empty() {
                if let Some(last) = out.last_mut() {
                    last.0.extend_from_slice(w);
                }
            } else {
                out.push((w.to_vec(), id));
            }
            is_prev_unk = is_unk;
        }
        out.into_iter()
            .map(|(p, id)| (String::from_utf8_lossy(&p).into_owned(), id))
            .collect()
    }

    /// `SentencePieceProcessor::Decode` over (piece, id) pairs.
    fn decode(&self, pieces: &[(&str, u32)]) -> String {
        let mut text: Vec<u8> = Vec::new();
        let mut is_bos_ws = true;
        let mut bos_ws_seen = false;
        let mut byte_start = 0;
        for (i, &(piece, id)) in pieces.iter().enumerate() {
            if self.kind(id) == PieceType::Byte {
                continue;
            }
            self.decode_bytes(&pieces[byte_start..i], &mut text);
            if bos_ws_seen || !text.is_empty() {
                is_bos_ws = false;
            }
            byte_start = i + 1;
            bos_ws_seen = self.decode_piece(piece, id, is_bos_ws, &mut text);
        }
        self.decode_bytes(&pieces[byte_start..], &mut text);
        if let Some(denormalizer) = &self.denormalizer {
            text = denormalizer.normalize(&text, None);
        }
        String::from_utf8_lossy(&text).into_owned()
    }

    /// One piece that is not a byte piece; returns whether it consumed the leading space.
    fn decode_piece(&self, piece: &str, id: u32, is_bos_ws: bool, text: &mut Vec<u8>) -> bool {
        match self.kind(id) {
            PieceType::Control => return false,
            PieceType::Unknown => {
                if self.id_to_piece(id) == Some(piece) {
                    text.extend_from_slice(self.unk_surface.as_bytes());
                } else {
                    text.extend_from_slice(piece.as_bytes());
                }
                return false;
            }
            _ => {}
        }
        let spec = &self.normalizer;
        let mut piece = piece;
        let mut has_bos_ws = false;
        if is_bos_ws && (spec.add_dummy_prefix || spec.remove_extra_whitespaces) {
            if let Some(rest) = piece.strip_prefix(SPACE_SYMBOL) {
                piece = rest;
                has_bos_ws = true;
            }
            if spec.remove_extra_whitespaces {
                // Every leading space is removed, so the next piece is still at the start.
                has_bos_ws = false;
            }
        }
        text.extend_from_slice(piece.replace(SPACE_SYMBOL, " ").as_bytes());
        has_bos_ws
    }

    /// A run of byte pieces: UTF-8 characters, each byte of an invalid sequence U+FFFD.
    fn decode_bytes(&self, pieces: &[(&str, u32)], text: &mut Vec<u8>) {
        let bytes: Vec<u8> = pieces
            .iter()
            .filter_map(|(p, _)| piece_to_byte(p))
            .collect();
        let mut offset = 0;
        while offset < bytes.len() {
            let (valid, len) = decode_utf8(&bytes[offset..]);
            if valid {
                text.extend_from_slice(&bytes[offset..offset + len]);
            } else {
                text.extend_from_slice(REPLACEMENT);
            }
            offset += len;
        }
    }
}

/// A candidate merge of the BPE agenda: the highest score first, then the leftmost.
#[derive(Debug)]
struct Pair {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl Ord for Pair {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}

/// `<0xXX>` (upper-case hex, as SentencePiece writes it) to its byte.
fn piece_to_byte(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'A'..=b'F')) {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// SentencePiece's `OneCharLen`: the length of a UTF-8 sequence from its first byte.
fn one_char_len(first: u8) -> usize {
    const LEN: [u8; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LEN[(first >> 4) as usize] as usize
}

/// SentencePiece's `IsValidDecodeUTF8`: whether `s` starts with a valid UTF-8 character,
/// and how many bytes it takes (1 when invalid).
fn decode_utf8(s: &[u8]) -> (bool, usize) {
    let trail = |b: u8| b & 0xC0 == 0x80;
    let valid_cp = |c: u32| c < 0xD800 || (0xE000..=0x10FFFF).contains(&c);
    let Some(&b0) = s.first() else {
        return (false, 1);
    };
    let b = |i: usize| u32::from(s[i]);
    if b0 < 0x80 {
        return (true, 1);
    } else if s.len() >= 2 && b0 & 0xE0 == 0xC0 {
        let cp = ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
        if trail(s[1]) && cp >= 0x80 && valid_cp(cp) {
            return (true, 2);
        }
    } else if s.len() >= 3 && b0 & 0xF0 == 0xE0 {
        let cp = ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
        if trail(s[1]) && trail(s[2]) && cp >= 0x800 && valid_cp(cp) {
            return (true, 3);
        }
    } else if s.len() >= 4 && b0 & 0xF8 == 0xF0 {
        let cp =
            ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
        if trail(s[1]) && trail(s[2]) && trail(s[3]) && cp >= 0x10000 && valid_cp(cp) {
            return (true, 4);
        }
    }
    (false, 1)
}

/// A byte trie: the vocabulary's lattice (Unigram) and the user-defined pieces' matcher.
#[derive(Debug, Clone)]
struct Trie {
    nodes: Vec<TrieNode>,
}

#[derive(Debug, Clone, Default)]
struct TrieNode {
    /// Sorted by byte.
    children: Vec<(u8, u32)>,
    value: Option<u32>,
}

impl Default for Trie {
    fn default() -> Self {
        Self {
            nodes: vec![TrieNode::default()],
        }
    }
}

impl Trie {
    fn insert(&mut self, key: &[u8], value: u32) {
        let mut node = 0;
        for &b in key {
            node = match self.nodes[node].children.binary_search_by_key(&b, |c| c.0) {
                Ok(i) => self.nodes[node].children[i].1 as usize,
                Err(i) => {
                    let new = self.nodes.len();
                    self.nodes.push(TrieNode::default());
                    self.nodes[node].children.insert(i, (b, new as u32));
                    new
                }
            };
        }
        self.nodes[node].value.get_or_insert(value);
    }

    fn child(&self, node: usize, b: u8) -> Option<usize> {
        let children = &self.nodes.get(node)?.children;
        let i = children.binary_search_by_key(&b, |c| c.0).ok()?;
        Some(children[i].1 as usize)
    }

    fn value(&self, node: usize) -> Option<u32> {
        self.nodes.get(node)?.value
    }

    fn is_empty(&self) -> bool {
        self.nodes[0].children.is_empty()
    }

    /// The longest key that `s` starts with: (its length, its value).
    fn longest_prefix(&self, s: &[u8]) -> Option<(usize, u32)> {
        if self.is_empty() {
            return None;
        }
        let mut node = 0;
        let mut found = None;
        for (i, &b) in s.iter().enumerate() {
            let Some(next) = self.child(node, b) else {
                break;
            };
            node = next;
            if let Some(v) = self.value(node) {
                found = Some((i + 1, v));
            }
        }
        found
    }
}

/// The precompiled character map of a normalizer: a darts-clone double array over UTF-8
/// bytes whose values are offsets of NUL-terminated replacements in a string blob.
#[derive(Debug, Clone)]
struct CharsMap {
    units: Vec<u32>,
    normalized: Vec<u8>,
}

impl CharsMap {
    /// `<trie size in bytes: u32 LE><double array units: u32 LE><replacements>`.
    fn parse(blob: &[u8]) -> Result<Self, String> {
        if blob.len() <= 4 {
            return Err(format!(
                "the normalizer's precompiled_charsmap is broken ({} bytes)",
                blob.len()
            ));
        }
        let trie_size = u32::from_le_bytes([blob[0], blob[1], blob[2], blob[3]]) as usize;
        if trie_size > blob.len() - 4 {
            return Err(format!(
                "the normalizer's precompiled_charsmap is broken (a trie of {trie_size} bytes \
                 in a map of {} bytes)",
                blob.len()
            ));
        }
        let units = blob[4..4 + trie_size]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(Self {
            units,
            normalized: blob[4 + trie_size..].to_vec(),
        })
    }

    /// The longest rule matching the start of `key`: (bytes matched, replacement).
    fn longest_match(&self, key: &[u8]) -> Option<(usize, &[u8])> {
        let has_leaf = |u: u32| (u >> 8) & 1 == 1;
        let value = |u: u32| u & ((1 << 31) - 1);
        let label = |u: u32| u & ((1 << 31) | 0xFF);
        let offset = |u: u32| ((u >> 10) << ((u & (1 << 9)) >> 6)) as usize;
        let mut node_pos = offset(*self.units.first()?);
        let mut found = None;
        for (i, &c) in key.iter().enumerate() {
            node_pos ^= c as usize;
            let Some(&unit) = self.units.get(node_pos) else {
                break;
            };
            if label(unit) != u32::from(c) {
                break;
            }
            node_pos ^= offset(unit);
            if has_leaf(unit) {
                let Some(&leaf) = self.units.get(node_pos) else {
                    break;
                };
                found = Some((i + 1, value(leaf) as usize));
            }
        }
        let (len, start) = found?;
        let rest = self.normalized.get(start..).unwrap_or(&[]);
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        Some((len, &rest[..end]))
    }
}

/// SentencePiece's `Normalizer` for one `NormalizerSpec`.
#[derive(Debug, Clone)]
struct Normalizer {
    charsmap: Option<CharsMap>,
    add_dummy_prefix: bool,
    remove_extra_whitespaces: bool,
    escape_whitespaces: bool,
    treat_whitespace_as_suffix: bool,
}

impl Normalizer {
    fn new(spec: &NormalizerSpec, treat_whitespace_as_suffix: bool) -> Result<Self, String> {
        let charsmap = if spec.charsmap.is_empty() {
            None
        } else {
            Some(CharsMap::parse(&spec.charsmap)?)
        };
        Ok(Self {
            charsmap,
            add_dummy_prefix: spec.add_dummy_prefix,
            remove_extra_whitespaces: spec.remove_extra_whitespaces,
            escape_whitespaces: spec.escape_whitespaces,
            treat_whitespace_as_suffix,
        })
    }

    /// `NormalizePrefix`: the replacement of the start of `input` and how many bytes it
    /// consumes. User-defined pieces are kept as they are.
    fn normalize_prefix<'a>(
        &'a self,
        input: &'a [u8],
        matcher: Option<&Trie>,
    ) -> (&'a [u8], usize) {
        if let Some((len, _)) = matcher.and_then(|m| m.longest_prefix(input)) {
            return (&input[..len], len);
        }
        if let Some((len, replacement)) =
            self.charsmap.as_ref().and_then(|m| m.longest_match(input))
        {
            return (replacement, len);
        }
        match decode_utf8(input) {
            (true, len) => (&input[..len], len),
            (false, _) => (REPLACEMENT, 1),
        }
    }

    fn normalize(&self, mut input: &[u8], matcher: Option<&Trie>) -> Vec<u8> {
        let mut out = Vec::new();
        if self.remove_extra_whitespaces {
            while !input.is_empty() {
                let (sp, n) = self.normalize_prefix(input, matcher);
                if sp != b" " {
                    break;
                }
                input = &input[n..];
            }
        }
        if input.is_empty() {
            return out;
        }
        out.reserve(input.len() * 3);
        let ws: &[u8] = if self.escape_whitespaces { SPACE } else { b" " };
        if !self.treat_whitespace_as_suffix && self.add_dummy_prefix {
            out.extend_from_slice(ws);
        }
        let mut is_prev_space = self.remove_extra_whitespaces;
        while !input.is_empty() {
            let (mut sp, n) = self.normalize_prefix(input, matcher);
            while is_prev_space && sp.first() == Some(&b' ') {
                sp = &sp[1..];
            }
            if !sp.is_empty() {
                for &b in sp {
                    if self.escape_whitespaces && b == b' ' {
                        out.extend_from_slice(SPACE);
                    } else {
                        out.push(b);
                    }
                }
                is_prev_space = sp.last() == Some(&b' ');
            }
            input = &input[n.max(1).min(input.len())..];
            if !self.remove_extra_whitespaces {
                is_prev_space = false;
            }
        }
        if self.remove_extra_whitespaces {
            while out.ends_with(ws) {
                out.truncate(out.len() - ws.len());
            }
        }
        if self.treat_whitespace_as_suffix && self.add_dummy_prefix {
            out.extend_from_slice(ws);
        }
        out
    }
}

// ---------------------------------------------------------------------------------------
// The protobuf wire format, as far as `sentencepiece_model.proto` needs it.

/// `ModelProto`: 1 pieces, 2 trainer_spec, 3 normalizer_spec, 5 denormalizer_spec.
#[derive(Debug, Default)]
struct ModelProto {
    pieces: Vec<ProtoPiece>,
    trainer: TrainerSpec,
    normalizer: NormalizerSpec,
    denormalizer: Option<NormalizerSpec>,
}

/// `ModelProto.SentencePiece`: 1 piece, 2 score, 3 type.
#[derive(Debug)]
struct ProtoPiece {
    piece: String,
    score: f32,
    kind: PieceType,
}

/// The fields of `TrainerSpec` that encoding and decoding need.
#[derive(Debug)]
struct TrainerSpec {
    /// 3: 1 UNIGRAM, 2 BPE, 3 WORD, 4 CHAR.
    model_type: u64,
    /// 24.
    suffix: bool,
    /// 35.
    byte_fallback: bool,
    /// 44.
    unk_surface: Option<String>,
}

impl Default for TrainerSpec {
    fn default() -> Self {
        Self {
            model_type: 1,
            suffix: false,
            byte_fallback: false,
            unk_surface: None,
        }
    }
}

/// `NormalizerSpec`: 2 precompiled_charsmap, 3 add_dummy_prefix, 4 remove_extra_whitespaces,
/// 5 escape_whitespaces (1 name and 6 normalization_rule_tsv only matter for training).
#[derive(Debug)]
struct NormalizerSpec {
    charsmap: Vec<u8>,
    add_dummy_prefix: bool,
    remove_extra_whitespaces: bool,
    escape_whitespaces: bool,
}

impl Default for NormalizerSpec {
    fn default() -> Self {
        Self {
            charsmap: Vec::new(),
            add_dummy_prefix: true,
            remove_extra_whitespaces: true,
            escape_whitespaces: true,
        }
    }
}

/// One field's value by wire type.
enum Value<'a> {
    Varint(u64),
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32(u32),
}

impl Value<'_> {
    fn wire_name(&self) -> &'static str {
        match self {
            Value::Varint(_) => "a varint",
            Value::Fixed64 => "a 64-bit value",
            Value::Bytes(_) => "a length-delimited value",
            Value::Fixed32(_) => "a 32-bit value",
        }
    }
}

/// Reads fields from one message; `base` is the message's offset in the file (for errors).
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    base: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], base: usize) -> Self {
        Self { buf, pos: 0, base }
    }

    fn at(&self) -> usize {
        self.base + self.pos
    }

    fn varint(&mut self) -> Result<u64, String> {
        let start = self.at();
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(format!(
                    "truncated: a varint at byte {start} runs past the end of the data"
                ));
            };
            self.pos += 1;
            if shift == 63 && b > 1 {
                return Err(format!("a varint at byte {start} is longer than 64 bits"));
            }
            value |= u64::from(b & 0x7F) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(format!("a varint at byte {start} is longer than 10 bytes"))
    }

    fn take(&mut self, n: usize, what: &str, start: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            return Err(format!(
                "truncated: {what} at byte {start} needs {n} bytes but {} are left",
                self.buf.len() - self.pos
            ));
        };
        let bytes = &self.buf[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    /// The next (field number, value, offset of the value), or `None` at the end.
    fn field(&mut self) -> Result<Option<(u64, Value<'a>, usize)>, String> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let start = self.at();
        let key = self.varint()?;
        let (number, wire) = (key >> 3, key & 7);
        if number == 0 {
            return Err(format!("field number 0 at byte {start} (not a protobuf)"));
        }
        let value_at = self.at();
        let value = match wire {
            0 => Value::Varint(self.varint()?),
            1 => {
                self.take(8, "a 64-bit field", start)?;
                Value::Fixed64
            }
            2 => {
                let len = self.varint()?;
                let len = usize::try_from(len).unwrap_or(usize::MAX);
                let at = self.at();
                let bytes = self.take(len, "a length-delimited field", start)?;
                return Ok(Some((number, Value::Bytes(bytes), at)));
            }
            5 => {
                let b = self.take(4, "a 32-bit field", start)?;
                Value::Fixed32(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            other => {
                return Err(format!(
                    "field {number} at byte {start} has wire type {other}, which this reader \
                     does not take (groups) or which does not exist"
                ))
            }
        };
        Ok(Some((number, value, value_at)))
    }
}

fn wrong_wire(message: &str, number: u64, want: &str, got: &Value<'_>, at: usize) -> String {
    format!(
        "{message} field {number} at byte {at} should be {want} but is {}",
        got.wire_name()
    )
}

fn utf8(bytes: &[u8], what: &str, at: usize) -> Result<String, String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| format!("{what} at byte {at} is not UTF-8"))
}

/// Calls `f` with every field of the message in `buf` (which starts at byte `base` of the
/// file), in order: its number, value and offset. A field that cannot be read is an error
/// prefixed with `prefix` (the message's name).
fn each_field<'a>(
    buf: &'a [u8],
    base: usize,
    prefix: &str,
    mut f: impl FnMut(u64, Value<'a>, usize) -> Result<(), String>,
) -> Result<(), String> {
    let mut r = Reader::new(buf, base);
    while let Some((number, value, at)) = r.field().map_err(|e| format!("{prefix}{e}"))? {
        f(number, value, at)?;
    }
    Ok(())
}

impl ModelProto {
    fn parse(buf: &[u8]) -> Result<Self, String> {
        let mut proto = Self::default();
        each_field(buf, 0, "", |number, value, at| {
            match (number, value) {
                (1, Value::Bytes(b)) => {
                    let i = proto.pieces.len();
                    proto.pieces.push(ProtoPiece::parse(b, at, i)?);
                }
                (2, Value::Bytes(b)) => proto.trainer.merge(b, at)?,
                (3, Value::Bytes(b)) => proto.normalizer.merge(b, at)?,
                (5, Value::Bytes(b)) => proto
                    .denormalizer
                    .get_or_insert_with(NormalizerSpec::default)
                    .merge(b, at)?,
                (1 | 2 | 3 | 5, v) => {
                    return Err(wrong_wire("ModelProto", number, "a message", &v, at))
                }
                _ => {}
            }
            Ok(())
        })?;
        Ok(proto)
    }
}

impl ProtoPiece {
    fn parse(buf: &[u8], base: usize, index: usize) -> Result<Self, String> {
        let mut piece = Self {
            piece: String::new(),
            score: 0.0,
            kind: PieceType::Normal,
        };
        let what = format!("piece {index}:");
        each_field(buf, base, &format!("{what} "), |number, value, at| {
            match (number, value) {
                (1, Value::Bytes(b)) => piece.piece = utf8(b, &format!("piece {index}"), at)?,
                (2, Value::Fixed32(bits)) => piece.score = f32::from_bits(bits),
                (3, Value::Varint(v)) => {
                    piece.kind = PieceType::from_proto(v).ok_or_else(|| {
                        format!(
                            "piece {index} has type {v}, which is not a SentencePiece piece \
                             type (1 to 6)"
                        )
                    })?
                }
                (1, v) => return Err(wrong_wire(&what, number, "a string", &v, at)),
                (2, v) => return Err(wrong_wire(&what, number, "a float", &v, at)),
                (3, v) => return Err(wrong_wire(&what, number, "an enum", &v, at)),
                _ => {}
            }
            Ok(())
        })?;
        Ok(piece)
    }
}

impl TrainerSpec {
    fn merge(&mut self, buf: &[u8], base: usize) -> Result<(), String> {
        let what = "trainer_spec";
        each_field(buf, base, &format!("{what}: "), |number, value, at| {
            match (number, value) {
                (3, Value::Varint(v)) => self.model_type = v,
                (24, Value::Varint(v)) => self.suffix = v != 0,
                (35, Value::Varint(v)) => self.byte_fallback = v != 0,
                (44, Value::Bytes(b)) => self.unk_surface = Some(utf8(b, "unk_surface", at)?),
                (3 | 24 | 35, v) => return Err(wrong_wire(what, number, "a varint", &v, at)),
                (44, v) => return Err(wrong_wire(what, number, "a string", &v, at)),
                _ => {}
            }
            Ok(())
        })
    }
}

impl NormalizerSpec {
    fn merge(&mut self, buf: &[u8], base: usize) -> Result<(), String> {
        let what = "normalizer_spec";
        each_field(buf, base, &format!("{what}: "), |number, value, at| {
            match (number, value) {
                (2, Value::Bytes(b)) => self.charsmap = b.to_vec(),
                (3, Value::Varint(v)) => self.add_dummy_prefix = v != 0,
                (4, Value::Varint(v)) => self.remove_extra_whitespaces = v != 0,
                (5, Value::Varint(v)) => self.escape_whitespaces = v != 0,
                (2, v) => return Err(wrong_wire(what, number, "bytes", &v, at)),
                (3..=5, v) => return Err(wrong_wire(what, number, "a bool", &v, at)),
                _ => {}
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_truncation() {
        let mut r = Reader::new(&[0x96, 0x01], 0);
        assert_eq!(r.varint().unwrap(), 150);
        let mut r = Reader::new(&[0x96], 0);
        assert!(r.varint().unwrap_err().contains("truncated"));
        let mut r = Reader::new(&[0xff; 11], 0);
        assert!(r.varint().is_err());
    }

    #[test]
    fn utf8_decoding_as_sentencepiece() {
        assert_eq!(decode_utf8(b"a"), (true, 1));
        assert_eq!(decode_utf8("é".as_bytes()), (true, 2));
        assert_eq!(decode_utf8("\u{fffd}".as_bytes()), (true, 3));
        assert_eq!(decode_utf8(&[0xE3, 0x81]), (false, 1));
        assert_eq!(decode_utf8(&[0xC0, 0x80]), (false, 1)); // overlong
        assert_eq!(decode_utf8(&[0xED, 0xA0, 0x80]), (false, 1)); // surrogate
        assert_eq!(decode_utf8(&[0x80]), (false, 1));
    }

    #[test]
    fn byte_pieces() {
        assert_eq!(piece_to_byte("<0x41>"), Some(0x41));
        assert_eq!(piece_to_byte("<0xff>"), None);
        assert_eq!(piece_to_byte("<0x4>"), None);
        assert_eq!(piece_to_byte("A"), None);
    }

    /// A model written field by field: pieces and a normalizer without a character map.
    fn tiny_model(pieces: &[(&str, f32, u64)], model_type: u64) -> Vec<u8> {
        fn varint(mut v: u64, out: &mut Vec<u8>) {
            loop {
                let b = (v & 0x7f) as u8;
                v >>= 7;
                if v == 0 {
                    out.push(b);
                    return;
                }
                out.push(b | 0x80);
            }
        }
        fn bytes_field(number: u64, b: &[u8], out: &mut Vec<u8>) {
            varint(number << 3 | 2, out);
            varint(b.len() as u64, out);
            out.extend_from_slice(b);
        }
        let mut out = Vec::new();
        for &(piece, score, kind) in pieces {
            let mut p = Vec::new();
            bytes_field(1, piece.as_bytes(), &mut p);
            varint(2 << 3 | 5, &mut p);
            p.extend_from_slice(&score.to_le_bytes());
            varint(3 << 3, &mut p);
            varint(kind, &mut p);
            bytes_field(1, &p, &mut out);
        }
        let mut trainer = Vec::new();
        varint(3 << 3, &mut trainer);
        varint(model_type, &mut trainer);
        bytes_field(2, &trainer, &mut out);
        out
    }

    #[test]
    fn a_tiny_unigram_model() {
        let bytes = tiny_model(
            &[
                ("<unk>", 0.0, 2),
                ("<s>", 0.0, 3),
                ("▁", -2.0, 1),
                ("▁ab", -1.0, 1),
                ("a", -3.0, 1),
                ("b", -3.0, 1),
                ("c", -3.0, 1),
            ],
            1,
        );
        let sp = SentencePiece::from_bytes(&bytes, Path::new("tiny.model")).unwrap();
        assert_eq!(sp.encode_pieces("ab  cx"), ["▁ab", "▁", "c", "x"]);
        assert_eq!(sp.encode_ids("ab  cx"), [3, 2, 6, 0]);
        assert_eq!(sp.encode_pieces("xy"), ["▁", "xy"]);
        assert_eq!(sp.decode_pieces(&["▁ab", "▁", "c", "<s>"]), "ab c");
        assert_eq!(sp.decode_ids(&[3, 0, 6]).unwrap(), "ab ⁇ c");
        assert!(sp.decode_ids(&[7]).is_err());
        let bpe = SentencePiece::from_bytes(&tiny_model(&[("<unk>", 0.0, 2)], 2), Path::new("b"));
        assert_eq!(bpe.unwrap().encode_pieces("ab"), ["▁ab"]);
        let word = SentencePiece::from_bytes(&tiny_model(&[("<unk>", 0.0, 2)], 3), Path::new("w"));
        assert!(word.unwrap_err().to_string().contains("WORD"));
    }
}
