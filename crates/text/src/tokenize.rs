//! torchtext's `basic_english` tokenizer (`torchtext.data.utils.get_tokenizer("basic_english")`),
//! reproduced without a regex engine.
//!
//! # Where the rules come from
//!
//! torchtext's `_basic_english_normalize(line)` lowercases the line with Python's `str.lower()`,
//! applies this table of `re.sub` calls in order, then returns `line.split()`:
//!
//! | # | pattern   | replacement | effect                          |
//! |---|-----------|-------------|---------------------------------|
//! | 1 | `\'`      | `" '  "`    | `'` becomes its own token       |
//! | 2 | `\"`      | `""`        | `"` is deleted                  |
//! | 3 | `\.`      | `" . "`     | `.` becomes its own token       |
//! | 4 | `<br \/>` | `" "`       | the HTML line break is a space  |
//! | 5 | `,`       | `" , "`     | `,` becomes its own token       |
//! | 6 | `\(`      | `" ( "`     | `(` becomes its own token       |
//! | 7 | `\)`      | `" ) "`     | `)` becomes its own token       |
//! | 8 | `\!`      | `" ! "`     | `!` becomes its own token       |
//! | 9 | `\?`      | `" ? "`     | `?` becomes its own token       |
//! | 10| `\;`      | `" "`       | `;` is a separator              |
//! | 11| `\:`      | `" "`       | `:` is a separator              |
//! | 12| `\s+`     | `" "`       | whitespace runs collapse        |
//!
//! Each rule is applied here with `str::replace`, in the same order. For a literal pattern that
//! is exactly `re.sub`: one left-to-right pass over non-overlapping matches that does not look
//! again at what it wrote, so `<br<br />/>` becomes `<br />`, which stays. Order matters around
//! rule 4: `"` is deleted before the `<br />` search (so `<br" />` is a line break) and `;`, `:`
//! become spaces after it (so `<br;/>` is not). Rule 12 only changes how much whitespace
//! separates tokens, so the final split on whitespace implies it.
//!
//! Everything else (`-`, `@`, `<`, `>`, `=`, digits, any other symbol) stays inside tokens, so
//! WikiText's `@-@` and `<unk>` pass through whole, while its `@,@` and `@.@` (number
//! separators) become three tokens each, `@ , @` and `@ . @`, as they do in the tutorial.
//!
//! # Unicode
//!
//! * Whitespace is Python's (`str.isspace`, which is also what `\s` and `str.split()` use):
//!   Rust's [`char::is_whitespace`] plus the four information separators U+001C..=U+001F. This
//!   set was checked against Python 3.11 over every code point.
//! * Lowercasing is Rust's [`str::to_lowercase`]. It agrees with Python's `str.lower()`
//!   (including the context-dependent final sigma and `İ` → `i̇`) on every code point of
//!   Python 3.11 (Unicode 14), except for 55 letters added in Unicode 16, which Rust lowercases
//!   and Python 3.11 leaves as they are. None occurs in WikiText-2.
//! * A byte-order mark is not whitespace for Python either, so it stays glued to the first
//!   token of a file, as it would in torchtext.

/// Tokenizes one line exactly as torchtext's `get_tokenizer("basic_english")` does.
///
/// ```
/// use transformer_text::basic_english;
/// assert_eq!(
///     basic_english("Hello, World! It's \"fine\"."),
///     ["hello", ",", "world", "!", "it", "'", "s", "fine", "."]
/// );
/// assert_eq!(
///     basic_english(" = Valkyria Chronicles III = \n"),
///     ["=", "valkyria", "chronicles", "iii", "="]
/// );
/// ```
pub fn basic_english(line: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    for_each_token(line, |token| tokens.push(token.to_string()));
    tokens
}

/// Calls `f` on each [`basic_english`] token of `line`, without allocating a `String` per
/// token (the corpus reader's path).
pub(crate) fn for_each_token(line: &str, f: impl FnMut(&str)) {
    normalize(line)
        .split(is_python_whitespace)
        .filter(|token| !token.is_empty())
        .for_each(f);
}

/// The line after torchtext's lowercasing and rules 1-11, in the table's order. Each
/// `str::replace` is, like `re.sub` with a literal pattern, one left-to-right pass over
/// non-overlapping matches that does not rescan its own output. Rule 12 is left to the split.
// One `replace` per row of the table, so that the code reads as torchtext's list does.
#[allow(clippy::collapsible_str_replace)]
fn normalize(line: &str) -> String {
    line.to_lowercase()
        .replace('\'', " '  ")
        .replace('"', "")
        .replace('.', " . ")
        .replace("<br />", " ")
        .replace(',', " , ")
        .replace('(', " ( ")
        .replace(')', " ) ")
        .replace('!', " ! ")
        .replace('?', " ? ")
        .replace(';', " ")
        .replace(':', " ")
}

/// Python's `str.isspace()` (= what `\s` in a `str` regex and `str.split()` treat as
/// whitespace): Unicode `White_Space` plus the information separators U+001C..=U+001F, which
/// Python counts because their bidirectional class is B or S.
fn is_python_whitespace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(line: &str) -> Vec<String> {
        basic_english(line)
    }

    // Expected outputs are worked out by hand from the rule table in the module docs; they
    // were also confirmed with Python's `re` running torchtext's pattern table
    // (crates/text/scripts/torchtext_reference.py).

    #[test]
    fn punctuation_quotes_and_apostrophes() {
        assert_eq!(
            tok("Hello, World! It's \"fine\"."),
            ["hello", ",", "world", "!", "it", "'", "s", "fine", "."]
        );
        assert_eq!(tok("(a)b?c!"), ["(", "a", ")", "b", "?", "c", "!"]);
        assert_eq!(tok("don't"), ["don", "'", "t"]);
        assert_eq!(tok("''"), ["'", "'"]);
        assert_eq!(tok("\"\"\""), Vec::<String>::new());
        assert_eq!(tok("\"quoted\"word"), ["quotedword"]);
    }

    #[test]
    fn separators_and_numbers() {
        assert_eq!(tok("a;b:c"), ["a", "b", "c"]);
        assert_eq!(tok("1.5"), ["1", ".", "5"]);
        assert_eq!(tok("..."), [".", ".", "."]);
        assert_eq!(tok("e.g.,x"), ["e", ".", "g", ".", ",", "x"]);
        assert_eq!(tok("10:30;"), ["10", "30"]);
    }

    #[test]
    fn wikitext_lines() {
        assert_eq!(
            tok(" = Valkyria Chronicles III = \n"),
            ["=", "valkyria", "chronicles", "iii", "="]
        );
        assert_eq!(
            tok(" = = Gameplay = = \n"),
            ["=", "=", "gameplay", "=", "="]
        );
        assert_eq!(tok("@-@"), ["@-@"]);
        assert_eq!(tok("<unk>"), ["<unk>"]);
        assert_eq!(tok("<UNK>"), ["<unk>"]);
        assert_eq!(
            tok(" role @-@ playing 1 @,@ 000 3 @.@ 5 "),
            ["role", "@-@", "playing", "1", "@", ",", "@", "000", "3", "@", ".", "@", "5"]
        );
        assert_eq!(
            tok(" Senjō no Valkyria 3 : <unk> Chronicles ( Japanese : 戦場のヴァルキュリア3 , lit . "),
            [
                "senjō",
                "no",
                "valkyria",
                "3",
                "<unk>",
                "chronicles",
                "(",
                "japanese",
                "戦場のヴァルキュリア3",
                ",",
                "lit",
                "."
            ]
        );
        assert_eq!(tok(" \n"), Vec::<String>::new());
        assert_eq!(tok(""), Vec::<String>::new());
    }

    #[test]
    fn html_line_break() {
        assert_eq!(tok("a<br />b"), ["a", "b"]);
        assert_eq!(tok("a<BR />b"), ["a", "b"]);
        // `"` is deleted before the search, so this is a line break too.
        assert_eq!(tok("a<br\" />b"), ["a", "b"]);
        // `;` only becomes a space after the search.
        assert_eq!(tok("a<br;/>b"), ["a<br", "/>b"]);
        assert_eq!(tok("a<br/>b"), ["a<br/>b"]);
        // One pass: the `<br />` that the replacement creates is not replaced again.
        assert_eq!(tok("<br<br />/>"), ["<br", "/>"]);
        assert_eq!(tok("<br /><br />"), Vec::<String>::new());
    }

    #[test]
    fn unicode_lowercase_and_whitespace() {
        assert_eq!(tok("ÉCOLE Straße"), ["école", "straße"]);
        // Final sigma depends on context, in Python and in Rust alike.
        assert_eq!(tok("ΟΔΟΣ ΑΣΑ"), ["οδο\u{3c2}", "α\u{3c3}α"]);
        assert_eq!(tok("İ"), ["i\u{307}"]);
        // Python's whitespace: no-break space, ideographic space, U+001C..U+001F, U+2028.
        assert_eq!(
            tok("a\u{a0}b\u{3000}c\u{1c}d\u{1f}e\u{2028}f\u{85}g\tg\u{b}h\u{c}i\rj"),
            ["a", "b", "c", "d", "e", "f", "g", "g", "h", "i", "j"]
        );
        // Not whitespace for Python: zero-width space, byte-order mark.
        assert_eq!(tok("a\u{200b}b \u{feff}c"), ["a\u{200b}b", "\u{feff}c"]);
    }

    #[test]
    fn python_whitespace_set() {
        // Every code point for which Python 3.11's str.isspace() is true.
        let python: Vec<u32> = [
            0x9, 0xa, 0xb, 0xc, 0xd, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x85, 0xa0,
        ]
        .into_iter()
        .chain([0x1680])
        .chain(0x2000..=0x200a)
        .chain([0x2028, 0x2029, 0x202f, 0x205f, 0x3000])
        .collect();
        let ours: Vec<u32> = (0..=0x10ffff_u32)
            .filter_map(char::from_u32)
            .filter(|&c| is_python_whitespace(c))
            .map(u32::from)
            .collect();
        assert_eq!(ours, python);
    }
}
