//! sacreBLEU's BLEU tokenizers: `13a` (mteval-v13a.pl, its default), `intl` (mteval-v14.pl's
//! international tokenization), `char` and `none`.
//!
//! Each rule below is a regular-expression substitution in sacreBLEU that matches one or two
//! characters; applied left to right without overlaps, as Python's `re.sub` does, it is a
//! single scan that is written out here by hand. The outputs are compared with sacreBLEU's own
//! in `crates/text/tests/bleu.rs` (`tokenize.json`).

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use regex::Regex;

use super::{normalize_whitespace, ScoreError};

/// How a segment is cut into the words whose n-grams BLEU counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Tokenizer {
    /// `13a`: mteval-v13a.pl (WMT's standard, sacreBLEU's default): unescapes `&quot;`,
    /// `&amp;`, `&lt;`, `&gt;`, then splits off ASCII punctuation, except periods and commas
    /// between digits and dashes not after a digit. See [`tokenize_13a`].
    #[default]
    V13a,
    /// `intl`: mteval-v14.pl's international tokenization: splits off every Unicode symbol,
    /// and Unicode punctuation unless it has a number on both sides. See
    /// [`tokenize_intl`].
    Intl,
    /// `char`: every character is a word. See [`tokenize_char`].
    Char,
    /// `none`: words are the whitespace-separated pieces of the text as it is.
    None,
}

impl Tokenizer {
    /// Every tokenizer, in the order of [`Tokenizer::name`]'s list.
    pub const ALL: [Tokenizer; 4] = [
        Tokenizer::V13a,
        Tokenizer::Intl,
        Tokenizer::Char,
        Tokenizer::None,
    ];

    /// The name sacreBLEU uses (`--tokenize` and the signature's `tok:`): `13a`, `intl`,
    /// `char` or `none`.
    pub fn name(self) -> &'static str {
        match self {
            Tokenizer::V13a => "13a",
            Tokenizer::Intl => "intl",
            Tokenizer::Char => "char",
            Tokenizer::None => "none",
        }
    }

    /// The tokenized line, words separated by single spaces (for `none`, the line itself).
    pub fn tokenize(self, line: &str) -> String {
        match self {
            Tokenizer::V13a => tokenize_13a(line),
            Tokenizer::Intl => tokenize_intl(line),
            Tokenizer::Char => tokenize_char(line),
            Tokenizer::None => line.to_string(),
        }
    }
}

impl fmt::Display for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Tokenizer {
    type Err = ScoreError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Tokenizer::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| ScoreError::UnknownTokenizer(s.to_string()))
    }
}

/// Applies a rule that matches two characters `(a)(b)` at a time, left to right and without
/// overlaps (Python's `re.sub`), writing `emit(a, b, out)` for each match.
fn pair_rule(
    chars: &[char],
    first: impl Fn(char) -> bool,
    second: impl Fn(char) -> bool,
    emit: impl Fn(char, char, &mut Vec<char>),
) -> Vec<char> {
    let mut out = Vec::with_capacity(chars.len() + chars.len() / 2);
    let mut i = 0;
    while i < chars.len() {
        if i + 1 < chars.len() && first(chars[i]) && second(chars[i + 1]) {
            emit(chars[i], chars[i + 1], &mut out);
            i += 2;
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

/// Applies a one-character rule `(c)` -> ` c ` to every character it matches.
fn pad_rule(chars: &[char], matches: impl Fn(char) -> bool) -> Vec<char> {
    let mut out = Vec::with_capacity(chars.len() + chars.len() / 2);
    for &c in chars {
        if matches(c) {
            out.extend([' ', c, ' ']);
        } else {
            out.push(c);
        }
    }
    out
}

/// Splits each `punctuation` character from a neighbour that is not a `number`, in two
/// passes: `([^N])(P) -> "\1 \2 "`, then `(P)([^N]) -> " \1 \2"`.
fn split_from_non_numbers(
    chars: &[char],
    number: impl Fn(char) -> bool + Copy,
    punctuation: impl Fn(char) -> bool + Copy,
) -> Vec<char> {
    let chars = pair_rule(
        chars,
        |a| !number(a),
        punctuation,
        |a, b, out| out.extend([a, ' ', b, ' ']),
    );
    pair_rule(
        &chars,
        punctuation,
        |b| !number(b),
        |a, b, out| out.extend([' ', a, ' ', b]),
    )
}

/// `[0-9]` (ASCII digits only, as in the Perl and Python rules).
fn is_digit(c: char) -> bool {
    c.is_ascii_digit()
}

/// mteval-v13a's first class, `[\{-\~\[-\` -\&\(-\+\:-\@\/]`: ASCII punctuation and symbols
/// except `'`, `,`, `-`, `.` (and the space, which it also pads, harmlessly).
fn is_13a_split(c: char) -> bool {
    matches!(c, '{'..='~' | '['..='`' | ' '..='&' | '('..='+' | ':'..='@' | '/')
}

/// Tokenizes like sacreBLEU's `13a` (mteval-v13a.pl), in its order:
///
/// 1. remove `<skipped>`, join `-\n` line breaks, turn other `\n` into spaces;
/// 2. if the line has a `&`: `&quot;` -> `"`, then `&amp;` -> `&`, `&lt;` -> `<`, `&gt;` -> `>`
///    (one after the other, so `&amp;lt;` becomes `<`);
/// 3. pad the line with a space on each side, then: split off `{|}~[\]^_`` `!"#$%&()*+:;<=>?@/`;
///    split off `.` and `,` after a non-digit; split off `.` and `,` before a non-digit; split
///    off `-` after a digit;
/// 4. normalise whitespace (Python's `' '.join(line.split())`).
///
/// ```
/// use transformer_text::score::tokenize_13a;
/// assert_eq!(tokenize_13a("It cost $1,234.56, &quot;really&quot;."), "It cost $ 1,234.56 , \" really \" .");
/// ```
pub fn tokenize_13a(line: &str) -> String {
    let mut s = line
        .replace("<skipped>", "")
        .replace("-\n", "")
        .replace('\n', " ");
    if s.contains('&') {
        s = s
            .replace("&quot;", "\"")
            .replace("&amp;", "&")
            .replace("&lt;", "<")
            .replace("&gt;", ">");
    }
    let mut chars: Vec<char> = Vec::with_capacity(s.len() + 2);
    chars.push(' ');
    chars.extend(s.chars());
    chars.push(' ');

    let chars = pad_rule(&chars, is_13a_split);
    // ([^0-9])([\.,]) -> "\1 \2 ", then ([\.,])([^0-9]) -> " \1 \2"
    let chars = split_from_non_numbers(&chars, is_digit, |c| c == '.' || c == ',');
    // ([0-9])(-) -> "\1 \2 "
    let chars = pair_rule(
        &chars,
        is_digit,
        |b| b == '-',
        |a, b, out| out.extend([a, ' ', b, ' ']),
    );
    normalize_whitespace(&chars.into_iter().collect::<String>())
}

/// Unicode general-category tests for the `intl` rules (`\p{N}`, `\p{P}`, `\p{S}`), from the
/// `regex` crate's Unicode tables.
struct Classes {
    number: Regex,
    punctuation: Regex,
    symbol: Regex,
}

fn classes() -> &'static Classes {
    static CLASSES: OnceLock<Classes> = OnceLock::new();
    CLASSES.get_or_init(|| Classes {
        number: Regex::new(r"^\p{N}$").expect("valid class"),
        punctuation: Regex::new(r"^\p{P}$").expect("valid class"),
        symbol: Regex::new(r"^\p{S}$").expect("valid class"),
    })
}

fn in_class(re: &Regex, c: char) -> bool {
    let mut buf = [0u8; 4];
    re.is_match(c.encode_utf8(&mut buf))
}

/// ASCII symbols (general category S: Sm, Sc, Sk); the other ASCII punctuation is in P.
fn is_ascii_symbol(c: char) -> bool {
    matches!(c, '$' | '+' | '<' | '=' | '>' | '^' | '`' | '|' | '~')
}

/// Whether `c` is in Unicode general category N (`\p{N}`: Nd, Nl, No).
pub fn is_unicode_number(c: char) -> bool {
    if c.is_ascii() {
        c.is_ascii_digit()
    } else {
        in_class(&classes().number, c)
    }
}

/// Whether `c` is in Unicode general category P (`\p{P}`: Pc, Pd, Ps, Pe, Pi, Pf, Po).
pub fn is_unicode_punctuation(c: char) -> bool {
    if c.is_ascii() {
        c.is_ascii_punctuation() && !is_ascii_symbol(c)
    } else {
        in_class(&classes().punctuation, c)
    }
}

/// Whether `c` is in Unicode general category S (`\p{S}`: Sm, Sc, Sk, So).
pub fn is_unicode_symbol(c: char) -> bool {
    if c.is_ascii() {
        is_ascii_symbol(c)
    } else {
        in_class(&classes().symbol, c)
    }
}

/// Tokenizes like sacreBLEU's `intl` (mteval-v14.pl's international tokenization):
///
/// 1. split off punctuation after a non-number: `(\P{N})(\p{P})` -> `\1 \2 `;
/// 2. split off punctuation before a non-number: `(\p{P})(\P{N})` -> ` \1 \2`;
/// 3. split off every symbol: `(\p{S})` -> ` \1 `;
/// 4. normalise whitespace.
///
/// Unlike `13a` there is no padding and no unescaping, so a number ending the line keeps its
/// period (`in 1999.` -> `in 1999.`), as in mteval-v14.pl.
///
/// ```
/// use transformer_text::score::tokenize_intl;
/// assert_eq!(tokenize_intl("„Gut“ — 5 € in 1999."), "„ Gut “ — 5 € in 1999.");
/// ```
pub fn tokenize_intl(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let chars = split_from_non_numbers(&chars, is_unicode_number, is_unicode_punctuation);
    let chars = pad_rule(&chars, is_unicode_symbol);
    normalize_whitespace(&chars.into_iter().collect::<String>())
}

/// Tokenizes like sacreBLEU's `char`: every character (code point) becomes a word, separated
/// by single spaces (`" ".join(line)`; a space in the line becomes a run of spaces, which the
/// n-gram count then treats as one separator).
pub fn tokenize_char(line: &str) -> String {
    let mut out = String::with_capacity(line.len() * 2);
    for (i, c) in line.chars().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_fast_path_agrees_with_the_unicode_tables() {
        let c = classes();
        for b in 0u8..128 {
            let ch = b as char;
            let mut buf = [0u8; 4];
            let s = ch.encode_utf8(&mut buf);
            assert_eq!(is_unicode_number(ch), c.number.is_match(s), "{ch:?}");
            assert_eq!(
                is_unicode_punctuation(ch),
                c.punctuation.is_match(s),
                "{ch:?}"
            );
            assert_eq!(is_unicode_symbol(ch), c.symbol.is_match(s), "{ch:?}");
        }
    }

    #[test]
    fn names_round_trip() {
        for t in Tokenizer::ALL {
            assert_eq!(t.name().parse::<Tokenizer>(), Ok(t));
        }
        assert!("13A".parse::<Tokenizer>().is_err());
    }

    #[test]
    fn thirteen_a_rules() {
        assert_eq!(tokenize_13a("Hello, world!"), "Hello , world !");
        assert_eq!(tokenize_13a("3.14, 3,14. a.b"), "3.14 , 3,14 . a . b");
        assert_eq!(tokenize_13a("&amp;lt; <skipped>x"), "< x");
        assert_eq!(tokenize_13a("10-20 a-b"), "10 - 20 a-b");
        assert_eq!(tokenize_13a(""), "");
    }

    #[test]
    fn char_tokens() {
        assert_eq!(tokenize_char("ab c"), "a b   c");
        assert_eq!(tokenize_char(""), "");
    }
}
