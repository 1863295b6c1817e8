//! Parallel corpora: two files whose line i are translations of each other (Multi30k's
//! `train.de.gz` / `train.en.gz`), or one tab-separated file with a column per language
//! (Tatoeba's `kor.txt`). Files ending in `.gz` are decompressed as they are read.
//!
//! Rules for lines (the same for every corpus; counts are reported in [`PairStats`]):
//! - Every line is trimmed of surrounding whitespace (the files end in `\n`; some carry `\r`).
//! - For training ([`PairFilter::training`]), a pair where either side is empty is skipped,
//!   and so is a pair where either side has more than `max_tokens` subword tokens (the filter
//!   that applies it is [`keep_for_training`]).
//! - For validation and test nothing is skipped: every source line is translated (an empty
//!   one gives an empty translation), so outputs stay aligned with the reference file.

use crate::error::{Error, Result};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

/// Sentence pairs in file order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pairs {
    /// Source sentences.
    pub src: Vec<String>,
    /// Target sentences, `tgt[i]` the translation of `src[i]`.
    pub tgt: Vec<String>,
}

impl Pairs {
    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.src.len()
    }

    /// True when there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.src.is_empty()
    }

    /// Appends another corpus.
    pub fn extend(&mut self, other: Pairs) {
        self.src.extend(other.src);
        self.tgt.extend(other.tgt);
    }
}

/// Reads a whole text file (gzip when the name ends in `.gz`) as UTF-8 lines, trimmed.
pub fn read_lines(path: &Path) -> Result<Vec<String>> {
    let bytes = read_bytes(path)?;
    lines_of(path, &bytes)
}

/// Opens `path` for reading; a missing file is [`Error::FileNotFound`].
fn open_file(path: &Path) -> Result<std::fs::File> {
    std::fs::File::open(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            Error::FileNotFound { path: path.into() }
        } else {
            Error::Io {
                action: "read",
                path: path.into(),
                source,
            }
        }
    })
}

/// The bytes of a file, decompressed when its name ends in `.gz`.
pub fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    let file = open_file(path)?;
    let gz = path.extension().is_some_and(|e| e == "gz");
    let mut bytes = Vec::new();
    if gz {
        flate2::read::MultiGzDecoder::new(file)
            .read_to_end(&mut bytes)
            .map_err(|source| Error::Gzip {
                path: path.into(),
                source,
            })?;
    } else {
        BufReader::new(file)
            .read_to_end(&mut bytes)
            .map_err(|source| Error::Io {
                action: "read",
                path: path.into(),
                source,
            })?;
    }
    Ok(bytes)
}

/// Splits bytes into trimmed UTF-8 lines, a byte order mark at the start dropped
/// ([`crate::strip_bom`]); an invalid byte is an error naming its line.
pub fn lines_of(path: &Path, bytes: &[u8]) -> Result<Vec<String>> {
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => return Err(crate::error::utf8_error(path, bytes, e.valid_up_to())),
    };
    Ok(crate::strip_bom(text)
        .lines()
        .map(|l| l.trim().to_string())
        .collect())
}

/// Reads two files of one split, line i of `src` the translation of line i of `tgt`.
pub fn read_pair_files(src: &Path, tgt: &Path) -> Result<Pairs> {
    let s = read_lines(src)?;
    let t = read_lines(tgt)?;
    if s.len() != t.len() {
        return Err(Error::LineCountMismatch {
            src: src.into(),
            src_lines: s.len(),
            tgt: tgt.into(),
            tgt_lines: t.len(),
        });
    }
    if s.is_empty() {
        return Err(Error::EmptyCorpus {
            path: src.into(),
            hint: " (the file is empty)".into(),
        });
    }
    Ok(Pairs { src: s, tgt: t })
}

/// Reads a tab-separated file of pairs, the source in column `src_col` and the target in
/// `tgt_col` (0-based; other columns, such as Tatoeba's attribution, are ignored).
pub fn read_tsv_pairs(path: &Path, src_col: usize, tgt_col: usize) -> Result<Pairs> {
    let mut pairs = Pairs::default();
    let needed = src_col.max(tgt_col) + 1;
    let bytes = read_bytes(path)?;
    for (i, line) in lines_of(path, &bytes)?.iter().enumerate() {
        if line.is_empty() {
            continue;
        }
        let cols: Vec<&str> = line.split('\t').collect();
        if cols.len() < needed {
            return Err(Error::MissingColumn {
                path: path.into(),
                line: i + 1,
                needed,
                found: cols.len(),
            });
        }
        pairs.src.push(cols[src_col].trim().to_string());
        pairs.tgt.push(cols[tgt_col].trim().to_string());
    }
    if pairs.is_empty() {
        return Err(Error::EmptyCorpus {
            path: path.into(),
            hint: String::new(),
        });
    }
    Ok(pairs)
}

/// What the training filter did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PairStats {
    /// Pairs read.
    pub read: usize,
    /// Pairs kept.
    pub kept: usize,
    /// Skipped because a side was empty.
    pub empty: usize,
    /// Skipped because a side had more than the token limit.
    pub too_long: usize,
}

impl std::fmt::Display for PairStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} pairs read, {} kept ({} skipped with an empty side, {} with a side over the \
             token limit)",
            self.read, self.kept, self.empty, self.too_long
        )
    }
}

/// The rule for training pairs: both sides non-empty and at most `max_tokens` tokens each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairFilter {
    /// The most subword tokens a side may have (before `<bos>`/`<eos>`).
    pub max_tokens: usize,
}

impl PairFilter {
    /// The training rule with a limit of `max_tokens` tokens per side.
    pub fn training(max_tokens: usize) -> Self {
        Self { max_tokens }
    }
}

/// Applies `filter` to tokenized pairs; returns the indices kept and the counts.
pub fn keep_for_training(
    src: &[Vec<u32>],
    tgt: &[Vec<u32>],
    filter: PairFilter,
) -> (Vec<usize>, PairStats) {
    let mut stats = PairStats {
        read: src.len(),
        ..PairStats::default()
    };
    let mut kept = Vec::with_capacity(src.len());
    for (i, (s, t)) in src.iter().zip(tgt).enumerate() {
        if s.is_empty() || t.is_empty() {
            stats.empty += 1;
        } else if s.len() > filter.max_tokens || t.len() > filter.max_tokens {
            stats.too_long += 1;
        } else {
            kept.push(i);
        }
    }
    stats.kept = kept.len();
    (kept, stats)
}

/// The files of one split of a parallel corpus: two files, or one tab-separated file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PairSource {
    /// Line i of `src` translates line i of `tgt`.
    Files {
        /// The source-language file.
        src: PathBuf,
        /// The target-language file.
        tgt: PathBuf,
    },
    /// One tab-separated file.
    Tsv {
        /// The file.
        path: PathBuf,
        /// 0-based column of the source sentence.
        src_col: usize,
        /// 0-based column of the target sentence.
        tgt_col: usize,
    },
    /// A deterministic subset of another source's pairs, by position ([`Slice`]): how a
    /// held-out slice and the rest of one corpus are both named.
    Slice {
        /// The source the pairs are taken from.
        of: Box<PairSource>,
        /// Which of its pairs.
        slice: Slice,
    },
}

/// Which pairs of a source. By position: the held-out slice is every `n`-th pair (1-based
/// position `k` a multiple of `n`, line `k` of a two-file source), the rest is everything
/// else. By sentence: a pair is held out when the MD5 digest of one side's text (trimmed),
/// read as a big-endian number, leaves `residue` modulo `modulus`, so that every pair sharing
/// that sentence (one English sentence with several Korean translations) lands on the same
/// side. Either way a slice and its rest never share a pair and together are the whole source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slice {
    /// Pairs `n`, `2n`, `3n`, ...: the held-out slice.
    EveryNth(usize),
    /// All pairs but `n`, `2n`, `3n`, ...: the rest, for training.
    AllButEveryNth(usize),
    /// The pairs whose `side`'s sentence hashes to `residue` modulo `modulus`: held out by
    /// sentence.
    BySentence {
        /// Which side's text is hashed.
        side: Side,
        /// The modulus, at least 1.
        modulus: u32,
        /// The residue held out.
        residue: u32,
    },
    /// All pairs but [`Slice::BySentence`]'s: the rest, for training.
    AllButSentence {
        /// Which side's text is hashed.
        side: Side,
        /// The modulus, at least 1.
        modulus: u32,
        /// The residue held out.
        residue: u32,
    },
}

/// One side of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The source sentence.
    Src,
    /// The target sentence.
    Tgt,
}

impl Side {
    /// The other side.
    pub fn other(self) -> Side {
        match self {
            Side::Src => Side::Tgt,
            Side::Tgt => Side::Src,
        }
    }
}

/// The MD5 digest of `text` (trimmed) modulo `modulus`: the rule of
/// `scripts/split_ko_en_tatoeba.py` (`int(md5(text).hexdigest(), 16) % modulus`), so the
/// split made here and the one that script writes are the same pairs.
pub fn sentence_bucket(text: &str, modulus: u32) -> u32 {
    use md5::Digest;
    let digest = md5::Md5::digest(text.trim().as_bytes());
    // The 128-bit number modulo m, one byte at a time (Horner's rule).
    let m = u64::from(modulus.max(1));
    digest
        .iter()
        .fold(0u64, |r, &b| (r * 256 + u64::from(b)) % m) as u32
}

impl Slice {
    /// Whether the pair at 0-based index `i`, `src` and `tgt`, belongs to the slice.
    pub fn contains(self, i: usize, src: &str, tgt: &str) -> bool {
        let held = |side: Side, modulus: u32, residue: u32| {
            let text = match side {
                Side::Src => src,
                Side::Tgt => tgt,
            };
            sentence_bucket(text, modulus) == residue
        };
        match self {
            Slice::EveryNth(n) => (i + 1).is_multiple_of(n.max(1)),
            Slice::AllButEveryNth(n) => !(i + 1).is_multiple_of(n.max(1)),
            Slice::BySentence {
                side,
                modulus,
                residue,
            } => held(side, modulus, residue),
            Slice::AllButSentence {
                side,
                modulus,
                residue,
            } => !held(side, modulus, residue),
        }
    }

    /// The same pairs once each pair's sides are exchanged ([`PairSource::reversed`]).
    pub fn reversed(self) -> Slice {
        match self {
            Slice::BySentence {
                side,
                modulus,
                residue,
            } => Slice::BySentence {
                side: side.other(),
                modulus,
                residue,
            },
            Slice::AllButSentence {
                side,
                modulus,
                residue,
            } => Slice::AllButSentence {
                side: side.other(),
                modulus,
                residue,
            },
            by_position => by_position,
        }
    }

    /// The slice's pairs of `pairs`, in order.
    pub fn apply(self, pairs: Pairs) -> Pairs {
        let mut out = Pairs::default();
        for (i, (s, t)) in pairs.src.into_iter().zip(pairs.tgt).enumerate() {
            if self.contains(i, &s, &t) {
                out.src.push(s);
                out.tgt.push(t);
            }
        }
        out
    }
}

impl std::fmt::Display for Slice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let side = |s: &Side| match s {
            Side::Src => "source",
            Side::Tgt => "target",
        };
        match self {
            Slice::EveryNth(n) => write!(f, "pairs {n}, {}, {}, ...", 2 * n, 3 * n),
            Slice::AllButEveryNth(n) => {
                write!(f, "all but pairs {n}, {}, {}, ...", 2 * n, 3 * n)
            }
            Slice::BySentence {
                side: s,
                modulus,
                residue,
            } => write!(
                f,
                "pairs whose {} sentence's MD5 is {residue} modulo {modulus}",
                side(s)
            ),
            Slice::AllButSentence {
                side: s,
                modulus,
                residue,
            } => write!(
                f,
                "all but pairs whose {} sentence's MD5 is {residue} modulo {modulus}",
                side(s)
            ),
        }
    }
}

impl PairSource {
    /// Reads the pairs.
    pub fn read(&self) -> Result<Pairs> {
        match self {
            PairSource::Files { src, tgt } => read_pair_files(src, tgt),
            PairSource::Tsv {
                path,
                src_col,
                tgt_col,
            } => read_tsv_pairs(path, *src_col, *tgt_col),
            PairSource::Slice { of, slice } => Ok(slice.apply(of.read()?)),
        }
    }

    /// The same pairs with source and target exchanged (the other translation direction).
    pub fn reversed(&self) -> PairSource {
        match self {
            PairSource::Files { src, tgt } => PairSource::Files {
                src: tgt.clone(),
                tgt: src.clone(),
            },
            PairSource::Tsv {
                path,
                src_col,
                tgt_col,
            } => PairSource::Tsv {
                path: path.clone(),
                src_col: *tgt_col,
                tgt_col: *src_col,
            },
            PairSource::Slice { of, slice } => PairSource::Slice {
                of: Box::new(of.reversed()),
                slice: slice.reversed(),
            },
        }
    }

    /// The first file the pairs are read from (the source side's, for two files).
    pub fn first_file(&self) -> &Path {
        match self {
            PairSource::Files { src, .. } => src,
            PairSource::Tsv { path, .. } => path,
            PairSource::Slice { of, .. } => of.first_file(),
        }
    }

    /// A short name for logs: the files' folder and names, and the slice if any
    /// (`jhe/jhe-koen-dev.ko + .en`, `tatoeba/kor.txt columns 1, 0`).
    pub fn describe(&self) -> String {
        let short = |p: &Path| {
            let name = p.file_name().map_or_else(
                || p.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            );
            match p.parent().and_then(|d| d.file_name()) {
                Some(d) => format!("{}/{name}", d.to_string_lossy()),
                None => name,
            }
        };
        match self {
            PairSource::Files { src, tgt } => {
                let (s, t) = (short(src), short(tgt));
                // `dir/name.ko + .en` when the two differ only in their extension.
                match (src.file_stem(), tgt.file_stem(), tgt.extension()) {
                    (Some(a), Some(b), Some(ext)) if a == b && src.parent() == tgt.parent() => {
                        format!("{s} + .{}", ext.to_string_lossy())
                    }
                    _ => format!("{s} + {t}"),
                }
            }
            PairSource::Tsv {
                path,
                src_col,
                tgt_col,
            } => format!("{} columns {src_col}, {tgt_col}", short(path)),
            PairSource::Slice { of, slice } => format!("{} ({slice})", of.describe()),
        }
    }

    /// Reads several sources into one corpus, in order.
    pub fn read_all(sources: &[PairSource]) -> Result<Pairs> {
        let mut all = Pairs::default();
        for s in sources {
            all.extend(s.read()?);
        }
        Ok(all)
    }
}

/// Lines read a chunk at a time (trimmed, as [`read_lines`] gives them), so that a file of
/// any length is translated in bounded memory; invalid UTF-8 is an error naming the line.
pub struct LineReader {
    input: Input,
    name: PathBuf,
    /// Lines read so far.
    line: usize,
    /// Bytes read so far.
    offset: u64,
    done: bool,
}

enum Input {
    File(Box<dyn BufRead>),
    /// Standard input: a chunk ends where the input buffered so far ends, so that lines
    /// typed or sent one at a time are answered one at a time.
    Stdin(BufReader<std::io::Stdin>),
}

impl Input {
    fn reader(&mut self) -> &mut dyn BufRead {
        match self {
            Input::File(r) => r.as_mut(),
            Input::Stdin(r) => r,
        }
    }
}

impl LineReader {
    /// Reads `path` (gzip when its name ends in `.gz`).
    pub fn open(path: &Path) -> Result<Self> {
        let file = open_file(path)?;
        let reader: Box<dyn BufRead> = if path.extension().is_some_and(|e| e == "gz") {
            Box::new(BufReader::new(flate2::read::MultiGzDecoder::new(file)))
        } else {
            Box::new(BufReader::new(file))
        };
        Ok(Self::with(Input::File(reader), path))
    }

    /// Reads standard input (called `<stdin>` in errors).
    pub fn stdin() -> Self {
        // A large buffer: a pipe hands over what it holds (up to 64 KiB) per read.
        let r = BufReader::with_capacity(1 << 20, std::io::stdin());
        Self::with(Input::Stdin(r), Path::new("<stdin>"))
    }

    fn with(input: Input, name: &Path) -> Self {
        Self {
            input,
            name: name.into(),
            line: 0,
            offset: 0,
            done: false,
        }
    }

    /// Lines read so far.
    pub fn lines_read(&self) -> usize {
        self.line
    }

    /// The next `n` lines at most; empty at the end of the input.
    pub fn next_chunk(&mut self, n: usize) -> Result<Vec<String>> {
        let mut out = Vec::new();
        let mut buf = Vec::new();
        while out.len() < n && !self.done {
            buf.clear();
            let read = self
                .input
                .reader()
                .read_until(b'\n', &mut buf)
                .map_err(|source| {
                    if self.name.extension().is_some_and(|e| e == "gz") {
                        Error::Gzip {
                            path: self.name.clone(),
                            source,
                        }
                    } else {
                        Error::Io {
                            action: "read",
                            path: self.name.clone(),
                            source,
                        }
                    }
                })?;
            if read == 0 {
                self.done = true;
                break;
            }
            let text = std::str::from_utf8(&buf).map_err(|e| Error::InvalidUtf8 {
                path: self.name.clone(),
                line: self.line + 1,
                column: e.valid_up_to() + 1,
                byte_offset: self.offset + e.valid_up_to() as u64,
                byte: buf[e.valid_up_to()],
            })?;
            // A byte order mark where the input begins is not text.
            let text = if self.line == 0 {
                crate::strip_bom(text)
            } else {
                text
            };
            out.push(text.trim().to_string());
            self.line += 1;
            self.offset += read as u64;
            if let Input::Stdin(r) = &self.input {
                if r.buffer().is_empty() {
                    break;
                }
            }
        }
        Ok(out)
    }
}

/// The lines of a file (gzip when its name ends in `.gz`), counted without keeping them.
pub fn count_lines(path: &Path) -> Result<usize> {
    let mut r = LineReader::open(path)?;
    let mut n = 0;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let read = r
            .input
            .reader()
            .read_until(b'\n', &mut buf)
            .map_err(|source| Error::Io {
                action: "read",
                path: path.into(),
                source,
            })?;
        if read == 0 {
            return Ok(n);
        }
        n += 1;
    }
}

/// Reads lines from any reader (stdin for `mt translate`), trimmed.
pub fn read_lines_from(reader: impl BufRead, name: &Path) -> Result<Vec<String>> {
    let mut bytes = Vec::new();
    let mut reader = reader;
    reader.read_to_end(&mut bytes).map_err(|source| Error::Io {
        action: "read",
        path: name.into(),
        source,
    })?;
    lines_of(name, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// The hash rule against Python's: `int(hashlib.md5(t.strip().encode()).hexdigest(), 16)
    /// % m` printed these (the rule of `scripts/split_ko_en_tatoeba.py`).
    #[test]
    fn sentence_bucket_is_pythons_md5_modulo() {
        let cases = [
            ("hello", 14, 4),
            ("Tom is here.", 18, 6),
            ("I love you.", 4, 0),
            ("  padded  ", 15, 3),
        ];
        for (text, mod20, mod7) in cases {
            assert_eq!(sentence_bucket(text, 20), mod20, "{text:?}");
            assert_eq!(sentence_bucket(text, 7), mod7, "{text:?}");
        }
        // By sentence: a slice and its rest split the pairs; reversing hashes the same side.
        let pairs = Pairs {
            src: vec!["a".into(), "b".into(), "c".into()],
            tgt: vec!["hello".into(), "I love you.".into(), "hello".into()],
        };
        let held = Slice::BySentence {
            side: Side::Tgt,
            modulus: 20,
            residue: 14,
        };
        let rest = Slice::AllButSentence {
            side: Side::Tgt,
            modulus: 20,
            residue: 14,
        };
        assert_eq!(held.apply(pairs.clone()).src, ["a", "c"]);
        assert_eq!(rest.apply(pairs.clone()).src, ["b"]);
        let swapped = Pairs {
            src: pairs.tgt.clone(),
            tgt: pairs.src.clone(),
        };
        assert_eq!(held.reversed().apply(swapped).tgt, ["a", "c"]);
    }

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("parallel-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn gzip_and_plain_read_the_same_and_counts_must_agree() {
        let d = temp_dir("gz");
        let text = "Ein Hund .\r\n  Zwei Katzen\n\n";
        std::fs::write(d.join("a.de"), text).unwrap();
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(d.join("a.de.gz")).unwrap(),
            flate2::Compression::default(),
        );
        gz.write_all(text.as_bytes()).unwrap();
        gz.finish().unwrap();
        let plain = read_lines(&d.join("a.de")).unwrap();
        assert_eq!(plain, vec!["Ein Hund .", "Zwei Katzen", ""]);
        assert_eq!(read_lines(&d.join("a.de.gz")).unwrap(), plain);

        std::fs::write(d.join("a.en"), "A dog .\nTwo cats\n").unwrap();
        let err = read_pair_files(&d.join("a.de"), &d.join("a.en"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("has 3 lines") && err.contains("has 2"),
            "{err}"
        );

        // Read in chunks, the same lines.
        let mut r = LineReader::open(&d.join("a.de.gz")).unwrap();
        let mut chunks = Vec::new();
        loop {
            let c = r.next_chunk(2).unwrap();
            if c.is_empty() {
                break;
            }
            chunks.push(c);
        }
        assert_eq!(chunks, vec![plain[..2].to_vec(), plain[2..].to_vec()]);
        assert_eq!(count_lines(&d.join("a.de")).unwrap(), 3);
        std::fs::write(d.join("bad.txt"), b"fine\nbad \xff here\n").unwrap();
        let mut r = LineReader::open(&d.join("bad.txt")).unwrap();
        let err = r.next_chunk(10).unwrap_err().to_string();
        assert!(err.contains("bad.txt:2:5"), "{err}");

        // A .gz that is not gzip names the file.
        std::fs::write(d.join("bad.de.gz"), b"not gzip at all").unwrap();
        let err = read_lines(&d.join("bad.de.gz")).unwrap_err().to_string();
        assert!(err.contains("bad.de.gz") && err.contains("gzip"), "{err}");
    }

    #[test]
    fn slices_partition_a_source_and_reversal_swaps_the_sides() {
        let d = temp_dir("slice");
        let ko: Vec<String> = (1..=7).map(|i| format!("k{i}")).collect();
        let en: Vec<String> = (1..=7).map(|i| format!("e{i}")).collect();
        std::fs::write(d.join("s.ko"), ko.join("\n") + "\n").unwrap();
        std::fs::write(d.join("s.en"), en.join("\n") + "\n").unwrap();
        let whole = PairSource::Files {
            src: d.join("s.ko"),
            tgt: d.join("s.en"),
        };
        let held = PairSource::Slice {
            of: Box::new(whole.clone()),
            slice: Slice::EveryNth(3),
        };
        let rest = PairSource::Slice {
            of: Box::new(whole.clone()),
            slice: Slice::AllButEveryNth(3),
        };
        let h = held.read().unwrap();
        assert_eq!(h.src, vec!["k3", "k6"]);
        assert_eq!(h.tgt, vec!["e3", "e6"]);
        let r = rest.read().unwrap();
        assert_eq!(r.src, vec!["k1", "k2", "k4", "k5", "k7"]);
        assert_eq!(r.tgt, vec!["e1", "e2", "e4", "e5", "e7"]);
        assert_eq!(h.len() + r.len(), whole.read().unwrap().len());

        let back = rest.reversed().read().unwrap();
        assert_eq!((back.src, back.tgt), (r.tgt, r.src));
        assert_eq!(rest.reversed().reversed(), rest);
        std::fs::write(d.join("t.txt"), "Go.\t가.\n").unwrap();
        let tsv = PairSource::Tsv {
            path: d.join("t.txt"),
            src_col: 1,
            tgt_col: 0,
        };
        assert_eq!(tsv.reversed().read().unwrap().src, vec!["Go."]);
        assert!(
            held.describe().ends_with("s.ko + .en (pairs 3, 6, 9, ...)"),
            "{}",
            held.describe()
        );
        assert_eq!(held.first_file(), d.join("s.ko"));
    }

    #[test]
    fn tsv_columns_and_the_training_filter() {
        let d = temp_dir("tsv");
        std::fs::write(d.join("kor.txt"), "Go.\t가.\tCC-BY\nHi.\t안녕.\tCC\n").unwrap();
        let p = read_tsv_pairs(&d.join("kor.txt"), 1, 0).unwrap();
        assert_eq!(p.src, vec!["가.", "안녕."]);
        assert_eq!(p.tgt, vec!["Go.", "Hi."]);
        std::fs::write(d.join("short.txt"), "Go.\n").unwrap();
        let err = read_tsv_pairs(&d.join("short.txt"), 1, 0).unwrap_err();
        assert!(err.to_string().contains(":1: expected at least 2"), "{err}");

        let src = vec![vec![1], vec![], vec![1, 2, 3], vec![4]];
        let tgt = vec![vec![1], vec![2], vec![1], vec![4, 5, 6, 7]];
        let (kept, stats) = keep_for_training(&src, &tgt, PairFilter::training(3));
        assert_eq!(kept, vec![0, 2]);
        assert_eq!(
            (stats.read, stats.kept, stats.empty, stats.too_long),
            (4, 2, 1, 1)
        );
    }
}
