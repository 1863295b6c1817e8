//! Sentence splitting: a paragraph cut into the sentences a translation model, trained on
//! single sentences, translates one at a time.
//!
//! The boundaries are Unicode's sentence boundaries (UAX #29, from `unicode-segmentation`):
//! they break after `.`, `?`, `!` and their CJK and other scripts' forms, with the closing
//! quotes and brackets that follow them, and never inside a number (`3.5`) or before a
//! lowercase word (`z.B. das`, `e.g. the`, `Warte... was?`). UAX #29 knows no words, so two
//! kinds of break it makes are taken back here:
//! - after an abbreviation of English or German (`Dr.`, `Mr.`, `z.B.`, `usw.`, `Nr.`; see
//!   [`ABBREVIATIONS`]), a run of single letters and dots (`U.S.`, `d.h.`) or an initial
//!   (`J. R. R. Tolkien`);
//! - after a German ordinal before a month or a word of the kind an ordinal counts
//!   (`am 1. Mai`, `im 19. Jahrhundert`; see [`ORDINAL_NOUNS`]).
//!
//! - where no space follows the punctuation (`"안녕."이라고`, a Korean particle after a
//!   quotation; `e.g.the`).
//!
//! Korean needs nothing else of its own: Hangul after `다. ` or `요? ` starts a sentence.

use std::ops::Range;
use unicode_segmentation::UnicodeSegmentation;

/// Abbreviations that end with a full stop inside a sentence, lowercased and without their
/// final dot (English and German).
pub const ABBREVIATIONS: &[&str] = &[
    // English
    "mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "vs", "etc", "e.g", "i.e", "cf", "inc",
    "ltd", "co", "corp", "no", "nos", "approx", "dept", "est", "fig", "figs", "gen", "gov", "lt",
    "mt", "rev", "sgt", "capt", "col", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep",
    "sept", "oct", "nov", "dec", "mon", "tue", "wed", "thu", "fri", "sat", "sun", "al", "vol",
    "ed", "eds", "p", "pp", "ch", "sec", "ca", // German
    "z.b", "d.h", "u.a", "usw", "bzw", "vgl", "evtl", "ggf", "inkl", "exkl", "sog", "hr", "fr",
    "frl", "nr", "str", "mio", "mrd", "jh", "jhd", "abs", "bd", "bspw", "zb", "dh", "ua", "u.ä",
    "o.ä", "s.o", "s.u", "z.t", "u.u", "v.a", "i.d.r", "m.e", "geb", "gest", "tel", "max", "min",
    "mind", "ggü", "allg", "ehem", "einschl", "gegr", "verh", "zzgl", "dez", "okt", "aug", "sept",
    "mär", "febr",
];

/// Words an ordinal number counts in German (`am 1. Mai`, `im 19. Jahrhundert`, `der 3.
/// Platz`): after `N.` before one of them the sentence goes on.
pub const ORDINAL_NOUNS: &[&str] = &[
    "januar",
    "februar",
    "märz",
    "april",
    "mai",
    "juni",
    "juli",
    "august",
    "september",
    "oktober",
    "november",
    "dezember",
    "jänner",
    "jahrhundert",
    "jahrhunderts",
    "jahrtausend",
    "platz",
    "stock",
    "stockwerk",
    "klasse",
    "mal",
    "liga",
    "runde",
    "tag",
    "woche",
    "kapitel",
    "auflage",
    "geburtstag",
    "jahrestag",
    "bundesliga",
    "etage",
    "grades",
    "grad",
    "quartal",
    "semester",
    "weltkrieg",
    "teil",
    "satz",
    "akt",
    "band",
];

/// The sentences of `text` as byte ranges, in order, each without the whitespace around it;
/// the text between two ranges (and before the first, after the last) is only whitespace.
/// Text with no letter, digit or symbol gives no range.
pub fn sentence_ranges(text: &str) -> Vec<Range<usize>> {
    // Unicode's boundaries, then each piece trimmed.
    let mut pieces: Vec<Range<usize>> = text
        .split_sentence_bound_indices()
        .filter_map(|(start, s)| trimmed(start, s))
        .collect();
    // Take back the breaks after abbreviations and German ordinals.
    let mut out: Vec<Range<usize>> = Vec::with_capacity(pieces.len());
    for piece in pieces.drain(..) {
        match out.last_mut() {
            Some(prev)
                if (prev.end == piece.start && attached(&text[prev.clone()]))
                    || goes_on(&text[prev.clone()], &text[piece.clone()]) =>
            {
                prev.end = piece.end;
            }
            _ => out.push(piece),
        }
    }
    out
}

/// The sentences of `text` as slices ([`sentence_ranges`]).
pub fn sentences(text: &str) -> Vec<&str> {
    sentence_ranges(text)
        .into_iter()
        .map(|r| &text[r])
        .collect()
}

/// `text` with its sentences replaced, in order, by `translations` and the whitespace
/// between them kept as it was: the inverse of [`sentence_ranges`] for translated text.
/// Missing translations leave their sentence as it was.
pub fn join_sentences<S: AsRef<str>>(
    text: &str,
    ranges: &[Range<usize>],
    translations: &[S],
) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (i, r) in ranges.iter().enumerate() {
        out.push_str(&text[at..r.start]);
        match translations.get(i) {
            Some(t) => out.push_str(t.as_ref()),
            None => out.push_str(&text[r.clone()]),
        }
        at = r.end;
    }
    out.push_str(&text[at..]);
    out
}

/// A part of a text cut for translation ([`parts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Written back as it is: the spacing between sentences, or text with no letter or
    /// digit.
    Keep(String),
    /// A sentence to translate.
    Translate(String),
}

/// `text` cut for translation: each sentence with a letter or digit to translate, and the
/// rest (the whitespace around sentences, a "sentence" of punctuation or emoji alone) kept.
/// Concatenated, the parts are `text` again; [`join_parts`] puts translations in.
pub fn parts(text: &str) -> Vec<Part> {
    let mut out = Vec::new();
    push_parts(text, &mut out);
    out
}

/// Appends the [`parts`] of `text` to `out`, a kept part merged into a kept part before it.
pub fn push_parts(text: &str, out: &mut Vec<Part>) {
    if !text.chars().any(char::is_alphanumeric) {
        push_keep(out, text);
        return;
    }
    let mut at = 0;
    for r in sentence_ranges(text) {
        push_keep(out, &text[at..r.start]);
        let s = &text[r.clone()];
        if s.chars().any(char::is_alphanumeric) {
            out.push(Part::Translate(s.to_string()));
        } else {
            push_keep(out, s);
        }
        at = r.end;
    }
    push_keep(out, &text[at..]);
}

/// Appends `s` to `out` as kept text (merged into a kept part before it).
pub fn push_keep(out: &mut Vec<Part>, s: &str) {
    if s.is_empty() {
        return;
    }
    match out.last_mut() {
        Some(Part::Keep(k)) => k.push_str(s),
        _ => out.push(Part::Keep(s.to_string())),
    }
}

/// The text of `parts`, each part to translate replaced by the next of `translations` (the
/// part's own text where they run out).
pub fn join_parts<S: AsRef<str>>(
    parts: &[Part],
    translations: impl IntoIterator<Item = S>,
) -> String {
    let mut tr = translations.into_iter();
    let mut out = String::new();
    for p in parts {
        match p {
            Part::Keep(k) => out.push_str(k),
            Part::Translate(t) => match tr.next() {
                Some(x) => out.push_str(x.as_ref()),
                None => out.push_str(t),
            },
        }
    }
    out
}

/// The texts to translate of `parts`, in order.
pub fn to_translate(parts: &[Part]) -> impl Iterator<Item = &str> {
    parts.iter().filter_map(|p| match p {
        Part::Translate(t) => Some(t.as_str()),
        Part::Keep(_) => None,
    })
}

/// The range of `s` (at `start` in the text) without its surrounding whitespace; `None`
/// when nothing is left.
fn trimmed(start: usize, s: &str) -> Option<Range<usize>> {
    let lead = s.len() - s.trim_start().len();
    let core = s.trim();
    (!core.is_empty()).then(|| start + lead..start + lead + core.len())
}

/// Whether a piece that ends with no space before the next one is no sentence of its own:
/// an ASCII `.`, `?` or `!` (then closing quotes or brackets) with a word right after it, as
/// a Korean particle after a quotation (`"안녕."이라고`). CJK full stops (`。`) are not
/// ASCII: a sentence after them starts without a space.
fn attached(prev: &str) -> bool {
    let end = prev.trim_end_matches(|c: char| {
        matches!(
            c,
            '"' | '\'' | ')' | ']' | '}' | '»' | '«' | '“' | '”' | '’' | '‘' | '›'
        )
    });
    end.ends_with(['.', '?', '!'])
}

/// Whether the sentence `prev` goes on into `next`: UAX #29 broke after a full stop that
/// ends an abbreviation, an initial, or a German ordinal before what it counts.
fn goes_on(prev: &str, next: &str) -> bool {
    let Some(stem) = prev.strip_suffix('.') else {
        return false;
    };
    // The last word, without an opening bracket or quote before it.
    let word = stem
        .rsplit(char::is_whitespace)
        .next()
        .unwrap_or("")
        .trim_start_matches(|c: char| !c.is_alphanumeric());
    if word.is_empty() || stem.ends_with('.') {
        // An ellipsis (`...`) ends a sentence when what follows starts a new one.
        return false;
    }
    let lower = word.to_lowercase();
    if ABBREVIATIONS.contains(&lower.as_str()) {
        return true;
    }
    // An initial (`J.`) or letters with dots (`U.S`, `d.h`, `z.B`): single letters each.
    // (Not the English pronoun: `So did I. Then ...` ends there.)
    if word != "I"
        && word
            .split('.')
            .all(|p| p.chars().count() == 1 && p.chars().all(char::is_alphabetic))
    {
        return true;
    }
    // A German ordinal (`1.`, `19.`) before a month or what it counts.
    if word.len() <= 4 && word.chars().all(|c| c.is_ascii_digit()) {
        let first = next
            .split(|c: char| !c.is_alphanumeric())
            .find(|w| !w.is_empty())
            .unwrap_or("")
            .to_lowercase();
        return ORDINAL_NOUNS.contains(&first.as_str());
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_keeps_the_spacing_between_sentences() {
        let text = "  Eins.   Zwei?\tDrei!  ";
        let r = sentence_ranges(text);
        assert_eq!(sentences(text), ["Eins.", "Zwei?", "Drei!"]);
        assert_eq!(
            join_sentences(text, &r, &["One.", "Two?", "Three!"]),
            "  One.   Two?\tThree!  "
        );
        assert_eq!(
            join_sentences(text, &r, &["One."]),
            "  One.   Zwei?\tDrei!  "
        );
        assert!(sentence_ranges(" \t ").is_empty());
    }
}
