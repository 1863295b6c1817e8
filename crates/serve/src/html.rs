//! `format=html`: translate the text of an HTML fragment and keep its markup.
//!
//! The fragment is read by html5ever's tokenizer (the WHATWG algorithm browsers use), so
//! tags, attributes, comments and character references are read as a browser reads them.
//! Every text node is one unit to translate: its character references decoded, its inner
//! whitespace collapsed to single spaces, its leading and trailing whitespace kept around the
//! translation. Tags are written back with their attributes (values re-escaped), in the same
//! order and nesting; the contents of `<script>` and `<style>` are kept as they are and
//! never translated; translated text is escaped (`&`, `<`, `>`, the quotes, and the no-break
//! space as `&nbsp;`).
//!
//! A sentence split by inline markup (`Ein <b>Mann</b> fährt`) is translated piece by
//! piece, as LibreTranslate's own HTML mode does: the markup stays exactly where it was, at
//! some cost to the translation of such sentences.
//!
//! Text that is not to be translated is markup here, written back as it was: inside an
//! element with `translate="no"` or `class="notranslate"`, inside code (`<code>`, `<pre>`,
//! ...), inside the elements social-media HTML marks mentions, hashtags and URL parts with
//! (Mastodon's classes), and in a link whose text is a URL, a mention or a hashtag. What is
//! kept inside the remaining text (URLs, emoji, ...) is [`crate::keep`]'s.

use html5ever::tendril::StrTendril;
use html5ever::tokenizer::states::RawKind;
use html5ever::tokenizer::{
    BufferQueue, TagKind, Token, TokenSink, TokenSinkResult, Tokenizer, TokenizerOpts,
};
use std::cell::{Cell, RefCell};

/// A piece of a fragment: markup to keep, or text to translate.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// Written back as it is (already HTML).
    Markup(String),
    /// A text node: `text` (decoded, whitespace collapsed, non-empty) is translated; `lead`
    /// and `trail` are its original leading and trailing whitespace.
    Text {
        /// Leading whitespace.
        lead: String,
        /// The text to translate.
        text: String,
        /// Trailing whitespace.
        trail: String,
    },
}

struct Sink {
    pieces: RefCell<Vec<Piece>>,
    text: RefCell<String>,
    /// Inside `<script>` or `<style>`: text is kept raw.
    raw: Cell<bool>,
    /// The elements open, innermost last (void elements are never open).
    open: RefCell<Vec<Open>>,
}

/// An open element.
struct Open {
    /// Its tag name.
    name: String,
    /// Its text is not to be translated ([`keeps_its_text`]).
    keep: bool,
    /// For a link (`<a>`): what decides at its end whether it is a URL, a mention or a
    /// hashtag.
    link: Option<Link>,
}

/// An open link.
struct Link {
    /// The index of the first piece inside it.
    first: usize,
    /// Its text so far.
    text: String,
    /// Its `href`.
    href: String,
}

/// Elements that are never open: they have no content.
const VOID: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
    "wbr",
];

/// Whether an element's text is kept as written: `translate="no"` (HTML's attribute for it),
/// `class="notranslate"` (Google's and LibreTranslate's convention), code (`code`, `pre`,
/// `kbd`, `samp`, `var`), and the classes social-media HTML marks mentions, hashtags and the
/// parts of shortened URLs with (Mastodon's `mention`, `hashtag`, `h-card`, `u-url`,
/// `invisible`, `ellipsis`).
fn keeps_its_text(name: &str, attrs: &[html5ever::Attribute]) -> bool {
    if matches!(
        name,
        "code" | "pre" | "kbd" | "samp" | "var" | "math" | "svg"
    ) {
        return true;
    }
    attrs.iter().any(|a| match &*a.name.local {
        "translate" => a.value.trim().eq_ignore_ascii_case("no"),
        "class" => a.value.split_ascii_whitespace().any(|c| {
            matches!(
                c,
                "notranslate"
                    | "mention"
                    | "hashtag"
                    | "h-card"
                    | "u-url"
                    | "invisible"
                    | "ellipsis"
            )
        }),
        _ => false,
    })
}

/// Whether a link's text is a URL, a mention or a hashtag (kept as written) rather than
/// words (translated).
fn is_link_token(text: &str, href: &str) -> bool {
    let t: String = text.split(is_html_space).collect();
    if t.is_empty() {
        return false;
    }
    let bare = |u: &str| {
        let u = u.split_once("://").map_or(u, |(_, rest)| rest);
        u.trim_start_matches("www.")
            .trim_end_matches('/')
            .to_lowercase()
    };
    t.starts_with('@')
        || t.starts_with('#')
        || t.contains("://")
        || t.starts_with("www.")
        || (!href.is_empty() && bare(href).starts_with(&bare(&t)) && t.contains(['.', '/']))
}

impl Sink {
    fn flush(&self) {
        let text = std::mem::take(&mut *self.text.borrow_mut());
        if text.is_empty() {
            return;
        }
        let mut open = self.open.borrow_mut();
        if let Some(link) = open.iter_mut().rev().find_map(|o| o.link.as_mut()) {
            link.text.push_str(&text);
        }
        let piece = if self.raw.get() {
            Piece::Markup(text)
        } else if open.iter().any(|o| o.keep) {
            Piece::Markup(escape(&text))
        } else {
            text_piece(&text)
        };
        self.pieces.borrow_mut().push(piece);
    }

    /// Notes an element's start (before its tag is pushed as a piece).
    fn start(&self, name: &str, attrs: &[html5ever::Attribute]) {
        if VOID.contains(&name) {
            return;
        }
        let link = (name == "a").then(|| Link {
            first: self.pieces.borrow().len() + 1,
            text: String::new(),
            href: attrs
                .iter()
                .find(|a| &*a.name.local == "href")
                .map(|a| a.value.to_string())
                .unwrap_or_default(),
        });
        self.open.borrow_mut().push(Open {
            name: name.to_string(),
            keep: keeps_its_text(name, attrs),
            link,
        });
    }

    /// Notes an element's end: closes it and what was left open inside it. A link whose
    /// text is a URL, a mention or a hashtag has its text turned back into markup.
    fn end(&self, name: &str) {
        let mut open = self.open.borrow_mut();
        let Some(at) = open.iter().rposition(|o| o.name == name) else {
            return;
        };
        for o in open.drain(at..).rev() {
            let Some(link) = o.link else {
                continue;
            };
            if !is_link_token(&link.text, &link.href) {
                continue;
            }
            for p in self.pieces.borrow_mut()[link.first..].iter_mut() {
                if let Piece::Text { lead, text, trail } = p {
                    *p = Piece::Markup(escape(&format!("{lead}{text}{trail}")));
                }
            }
        }
    }
}

fn text_piece(text: &str) -> Piece {
    let core = text.trim_matches(is_html_space);
    if core.is_empty() {
        return Piece::Markup(escape(text));
    }
    let start = text.len() - text.trim_start_matches(is_html_space).len();
    let end = text.trim_end_matches(is_html_space).len();
    Piece::Text {
        lead: text[..start].to_string(),
        text: core
            .split(is_html_space)
            .filter(|w| !w.is_empty())
            .collect::<Vec<_>>()
            .join(" "),
        trail: text[end..].to_string(),
    }
}

/// HTML's ASCII whitespace (the no-break space is text, not whitespace).
fn is_html_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0c')
}

impl TokenSink for Sink {
    type Handle = ();

    fn process_token(&self, token: Token, _line: u64) -> TokenSinkResult<()> {
        match token {
            Token::CharacterTokens(t) => self.text.borrow_mut().push_str(&t),
            Token::NullCharacterToken | Token::ParseError(_) => {}
            Token::TagToken(tag) => {
                self.flush();
                let name = tag.name.to_string();
                match tag.kind {
                    TagKind::StartTag if !tag.self_closing => self.start(&name, &tag.attrs),
                    TagKind::StartTag => {}
                    TagKind::EndTag => self.end(&name),
                }
                let mut s = String::new();
                match tag.kind {
                    TagKind::StartTag => {
                        s.push('<');
                        s.push_str(&name);
                        for a in &tag.attrs {
                            s.push(' ');
                            if let Some(p) = &a.name.prefix {
                                s.push_str(p);
                                s.push(':');
                            }
                            s.push_str(&a.name.local);
                            s.push_str("=\"");
                            s.push_str(&escape(&a.value));
                            s.push('"');
                        }
                        s.push_str(if tag.self_closing { " />" } else { ">" });
                    }
                    TagKind::EndTag => {
                        s.push_str("</");
                        s.push_str(&name);
                        s.push('>');
                    }
                }
                self.pieces.borrow_mut().push(Piece::Markup(s));
                match (tag.kind, name.as_str()) {
                    (TagKind::StartTag, "script") if !tag.self_closing => {
                        self.raw.set(true);
                        return TokenSinkResult::RawData(RawKind::ScriptData);
                    }
                    (TagKind::StartTag, "style" | "xmp" | "iframe" | "noembed" | "noframes")
                        if !tag.self_closing =>
                    {
                        self.raw.set(true);
                        return TokenSinkResult::RawData(RawKind::Rawtext);
                    }
                    (TagKind::StartTag, "textarea" | "title") if !tag.self_closing => {
                        return TokenSinkResult::RawData(RawKind::Rcdata);
                    }
                    (TagKind::EndTag, _) => self.raw.set(false),
                    _ => {}
                }
            }
            Token::CommentToken(c) => {
                self.flush();
                self.pieces
                    .borrow_mut()
                    .push(Piece::Markup(format!("<!--{c}-->")));
            }
            Token::DoctypeToken(d) => {
                self.flush();
                let name = d
                    .name
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "html".into());
                self.pieces
                    .borrow_mut()
                    .push(Piece::Markup(format!("<!DOCTYPE {name}>")));
            }
            Token::EOFToken => self.flush(),
        }
        TokenSinkResult::Continue
    }
}

/// Splits an HTML fragment into markup and text nodes.
pub fn split(html: &str) -> Vec<Piece> {
    let sink = Sink {
        pieces: RefCell::new(Vec::new()),
        text: RefCell::new(String::new()),
        raw: Cell::new(false),
        open: RefCell::new(Vec::new()),
    };
    let tok = Tokenizer::new(sink, TokenizerOpts::default());
    let input = BufferQueue::default();
    input.push_back(StrTendril::from_slice(html));
    let _ = tok.feed(&input);
    tok.end();
    tok.sink.flush();
    tok.sink.pieces.take()
}

/// Writes the pieces back, each text node's `text` replaced by the next of `translations`
/// (in the order of the text pieces).
pub fn join<'a>(pieces: &[Piece], translations: impl IntoIterator<Item = &'a str>) -> String {
    let mut tr = translations.into_iter();
    let mut out = String::new();
    for p in pieces {
        match p {
            Piece::Markup(m) => out.push_str(m),
            Piece::Text { lead, text, trail } => {
                out.push_str(&escape(lead));
                out.push_str(&escape(tr.next().unwrap_or(text)));
                out.push_str(&escape(trail));
            }
        }
    }
    out
}

/// The texts to translate, in order.
pub fn texts(pieces: &[Piece]) -> Vec<&str> {
    pieces
        .iter()
        .filter_map(|p| match p {
            Piece::Text { text, .. } => Some(text.as_str()),
            Piece::Markup(_) => None,
        })
        .collect()
}

/// `s` escaped for HTML text and attribute values alike: the XML special characters
/// ([`transformer_runtime::viz::escape`]) and the no-break space as `&nbsp;`, so that a
/// translated `&nbsp;` stays visible in the markup.
fn escape(s: &str) -> String {
    transformer_runtime::viz::escape(s).replace('\u{a0}', "&nbsp;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upper(html: &str) -> String {
        let pieces = split(html);
        let t: Vec<String> = texts(&pieces).iter().map(|s| s.to_uppercase()).collect();
        join(&pieces, t.iter().map(|s| s.as_str()))
    }

    #[test]
    fn markup_and_nesting_are_kept_and_text_is_replaced() {
        // (The mention is kept: see `text_not_to_translate_is_markup`.)
        let html = "<p>Ein <b>großer <i>Hund</i></b> läuft.<br>Zweite Zeile<br/></p>\
                    <p><a href=\"https://example.org/?a=1&amp;b=2\" class=\"mention\">@ana</a> hallo</p>";
        assert_eq!(
            upper(html),
            "<p>EIN <b>GROSSER <i>HUND</i></b> LÄUFT.<br>ZWEITE ZEILE<br /></p>\
             <p><a href=\"https://example.org/?a=1&amp;b=2\" class=\"mention\">@ana</a> HALLO</p>"
        );
    }

    #[test]
    fn entities_are_decoded_for_translation_and_encoded_after() {
        let pieces = split("<p>Tom &amp; Jerry &lt;3&nbsp;&eacute;t&#233;</p>");
        assert_eq!(texts(&pieces), vec!["Tom & Jerry <3\u{a0}été"]);
        assert_eq!(
            join(&pieces, ["A & B <c>\u{a0}d"]),
            "<p>A &amp; B &lt;c&gt;&nbsp;d</p>"
        );
    }

    #[test]
    fn scripts_styles_and_comments_are_not_translated() {
        let html = "<style>p { color: red; }</style><!-- note --><script>if (a < b) x();</script><p>hi</p>";
        let pieces = split(html);
        assert_eq!(texts(&pieces), vec!["hi"]);
        assert_eq!(upper(html), html.replace("hi", "HI"));
    }

    #[test]
    fn text_not_to_translate_is_markup() {
        let html = "<p>hi <span translate=\"no\">keep <b>me</b></span> <code>x = 1</code> \
                    <pre>a &lt; b</pre><span class=\"x notranslate\">no</span>\
                    <a href=\"https://a.org/x\">a.org/x</a> <a href=\"https://a.org\">words here</a> \
                    <a href=\"https://m.social/@ana\">@<span>ana</span></a>\
                    <a href=\"https://m.social/tags/x\">#<span>x</span></a> bye<br>now</p>";
        let pieces = split(html);
        assert_eq!(texts(&pieces), vec!["hi", "words here", "bye", "now"]);
        assert_eq!(
            upper(html),
            html.replace("hi", "HI")
                .replace("words here", "WORDS HERE")
                .replace("bye", "BYE")
                .replace("now", "NOW")
        );
        // An element closed implicitly does not keep what follows.
        let pieces = split("<p><code>x</p><p>text</p>");
        assert_eq!(texts(&pieces), vec!["text"]);
    }

    #[test]
    fn whitespace_around_text_is_kept_and_inside_collapsed() {
        let pieces = split("<p>\n  two\n   words  </p>");
        assert_eq!(texts(&pieces), vec!["two words"]);
        assert_eq!(join(&pieces, ["zwei Wörter"]), "<p>\n  zwei Wörter  </p>");
        // Plain text is one text node.
        assert_eq!(texts(&split("just text")), vec!["just text"]);
        assert!(texts(&split("<p> </p><br>")).is_empty());
    }
}
