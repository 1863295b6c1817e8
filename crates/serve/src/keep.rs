//! What of a text goes to the model, and what is kept as written.
//!
//! A text is cut into parts: sentences to translate ([`transformer_text::sentence`]: the
//! model is trained on single sentences), and between them the text kept as it was, the
//! spacing first. In social-media text ([`Keep::Tokens`], HTML as Mastodon sends it) these
//! are kept too, wherever they stand in a sentence, and the prose around them is translated
//! piece by piece in their places:
//! - URLs (`https://...`, `www....`, `example.com/path`, and bare domains of common
//!   top-level domains);
//! - mentions (`@bob`, `@bob@m.social`), hashtags (`#cats`) and e-mail addresses;
//! - emoji (pictographs, flags, keycaps, with their joiners and modifiers), and any other
//!   character the model's vocabulary cannot spell (its tokenizer gives `<unk>` for it).

use regex::Regex;
use std::ops::Range;
use std::sync::OnceLock;
pub use transformer_text::sentence::{join_parts as join, Part};
use transformer_text::sentence::{push_keep, push_parts};

/// What to keep beside the spacing between sentences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Nothing else: the text is prose, cut into sentences (`format=text`).
    Spacing,
    /// URLs, mentions, hashtags, emoji and characters the vocabulary cannot spell
    /// (`format=html`).
    Tokens,
}

/// The parts of `text`: its sentences to translate and what lies between them, kept
/// ([`transformer_text::sentence::parts`]), and with [`Keep::Tokens`] the tokens kept in
/// their places. Concatenated, the parts are `text` again. `spells` says whether the
/// model's vocabulary spells a character (asked only of non-ASCII characters, with
/// [`Keep::Tokens`]).
pub fn parts(text: &str, keep: Keep, spells: &mut dyn FnMut(char) -> bool) -> Vec<Part> {
    let kept = match keep {
        Keep::Spacing => Vec::new(),
        Keep::Tokens => kept_ranges(text, spells),
    };
    let mut out = Vec::new();
    let mut at = 0;
    for r in kept
        .iter()
        .cloned()
        .chain(std::iter::once(text.len()..text.len()))
    {
        let mut prose = &text[at..r.start];
        if at > 0 {
            // Punctuation right after a kept token (`www.a.org, see`) is its sentence's, not
            // the start of the next.
            let rest = prose.trim_start_matches(|c: char| {
                c.is_whitespace() || matches!(c, ',' | ';' | ':' | '.' | '!' | '?' | ')' | ']')
            });
            push_keep(&mut out, &prose[..prose.len() - rest.len()]);
            prose = rest;
        }
        push_parts(prose, &mut out);
        push_keep(&mut out, &text[r.clone()]);
        at = r.end;
    }
    out
}

/// URLs, mentions and hashtags.
fn tokens_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(
            r"(?xi)
              [\p{L}\p{N}_.+-]+@[\p{L}\p{N}_-]+(?:\.[\p{L}\p{N}_-]+)+
            | \b(?:https?|ftp)://\S+
            | \bwww\.\S+
            | \b[a-z0-9][a-z0-9-]*(?:\.[a-z0-9-]+)*\.[a-z]{2,}/\S*
            | \b[a-z0-9][a-z0-9-]*(?:\.[a-z0-9-]+)*\.(?:com|org|net|edu|gov|io|dev|app|social|info|eu|de|at|ch|uk|fr|kr|jp|us|me|co)\b
            | \B@[\p{L}\p{N}_]+(?:@[\p{L}\p{N}_-]+(?:\.[\p{L}\p{N}_-]+)+)?
            | \B\#[\p{L}\p{N}_]+
            ",
        )
        .expect("a valid pattern")
    })
}

/// The ranges of `text` to keep as written, in order and disjoint.
fn kept_ranges(text: &str, spells: &mut dyn FnMut(char) -> bool) -> Vec<Range<usize>> {
    let mut ranges: Vec<Range<usize>> = tokens_regex()
        .find_iter(text)
        .map(|m| {
            // A URL's last character is not the sentence's full stop or closing bracket.
            let s = m.as_str();
            let end = s.trim_end_matches(['.', ',', ';', ':', '!', '?', ')', ']', '"', '\'']);
            m.start()..m.start() + end.len()
        })
        .filter(|r| !r.is_empty())
        .collect();
    // Runs of emoji and unspellable characters (with the joiners, modifiers and selectors
    // that hold an emoji sequence together).
    let mut run: Option<Range<usize>> = None;
    for (i, c) in text.char_indices() {
        let end = i + c.len_utf8();
        let keep = is_emoji(c) || (!c.is_ascii() && !c.is_whitespace() && !spells(c));
        let glue = is_emoji_glue(c);
        match (&mut run, keep || glue) {
            (Some(r), true) => r.end = end,
            (None, true) if keep => run = Some(i..end),
            (Some(_), false) => ranges.extend(run.take()),
            _ => {}
        }
    }
    ranges.extend(run);
    ranges.sort_by_key(|r| (r.start, std::cmp::Reverse(r.end)));
    // Overlaps merged.
    let mut out: Vec<Range<usize>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// Emoji: pictographs and symbols of the emoji blocks, regional indicators (flags). Written
/// out here (no maintained crate of emoji properties is in the dependency tree); the
/// blocks are Unicode 15's.
fn is_emoji(c: char) -> bool {
    matches!(c as u32,
        0x1F000..=0x1FAFF   // Mahjong .. Symbols and Pictographs Extended-A, flags
        | 0x2600..=0x27BF   // Miscellaneous Symbols, Dingbats
        | 0x2B00..=0x2BFF   // Miscellaneous Symbols and Arrows (⭐)
        | 0x2300..=0x23FF   // Miscellaneous Technical (⌚ ⏰)
        | 0x2190..=0x21FF   // Arrows
        | 0x3030 | 0x303D | 0x3297 | 0x3299)
}

/// What holds an emoji sequence together: the zero-width joiner, variation selectors,
/// skin-tone modifiers (in [`is_emoji`]'s range), the keycap and tag characters.
fn is_emoji_glue(c: char) -> bool {
    matches!(
        c as u32,
        0x200D | 0xFE0E | 0xFE0F | 0x20E3 | 0xE0020..=0xE007F
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(parts: &[Part]) -> Vec<String> {
        parts
            .iter()
            .map(|p| match p {
                Part::Keep(k) => format!("={k}"),
                Part::Translate(t) => format!("+{t}"),
            })
            .collect()
    }

    #[test]
    fn tokens_are_kept_in_their_places_and_prose_is_translated() {
        let text = "Hi @bob look https://example.com/x. #cats 🐱 and www.a.org, see m.social/@x!";
        let p = parts(text, Keep::Tokens, &mut |_| true);
        assert_eq!(
            shown(&p),
            [
                "+Hi",
                "= @bob ",
                "+look",
                "= https://example.com/x. #cats 🐱 ",
                "+and",
                "= www.a.org, ",
                "+see",
                "= m.social/@x!",
            ]
        );
        assert_eq!(join(&p, std::iter::empty::<&str>()), text);
    }

    #[test]
    fn emoji_sequences_and_unspellable_characters_are_kept_whole() {
        let text = "Ein 👍🏽 Hund 👨‍👩‍👧 läuft 日本 schnell.";
        let p = parts(text, Keep::Tokens, &mut |c| !matches!(c, '日' | '本'));
        assert_eq!(
            shown(&p),
            [
                "+Ein",
                "= 👍🏽 ",
                "+Hund",
                "= 👨‍👩‍👧 ",
                "+läuft",
                "= 日本 ",
                "+schnell."
            ]
        );
        // In-word characters are no mentions or hashtags; an e-mail address is kept whole.
        let p = parts("C# and a@b are fine.", Keep::Tokens, &mut |_| true);
        assert_eq!(shown(&p), ["+C# and a@b are fine."]);
        let p = parts("Schreib an info@firma.de bitte.", Keep::Tokens, &mut |_| {
            true
        });
        assert_eq!(shown(&p), ["+Schreib an", "= info@firma.de ", "+bitte."]);
    }

    #[test]
    fn text_is_cut_into_sentences_only() {
        let text = "Eins. Zwei! @x 🐱";
        let p = parts(text, Keep::Spacing, &mut |_| false);
        assert_eq!(shown(&p), ["+Eins.", "= ", "+Zwei!", "= ", "+@x 🐱"]);
        assert_eq!(join(&p, ["One.", "Two!", "@x 🐱"]), "One. Two! @x 🐱");
        assert_eq!(shown(&parts("  ", Keep::Spacing, &mut |_| true)), ["=  "]);
    }
}
