//! Which of the served source languages a text is written in (`POST /detect`,
//! `source=auto`).
//!
//! The decision uses two statistics a few words already carry:
//!
//! 1. **Script.** Every letter is counted by its Unicode script (Hangul, Han, Kana,
//!    Cyrillic, Greek, Arabic, Hebrew, Thai, Devanagari, Latin). A language whose script
//!    holds no letter of the text scores nothing; its score starts as the share of the
//!    text's letters in its script.
//! 2. **Words and letters of the language**, for the languages that share a script (the
//!    Latin ones, mostly): the share of the text's words that are among the language's most
//!    frequent short words (articles, pronouns, prepositions), and the letters only it uses
//!    (German ä ö ü ß, Spanish ñ, ...).
//!
//! Scores are turned into confidences (0-100) that sum to 100 over the candidates. A text
//! with no letters (digits, emoji) gives every candidate the same confidence, the first
//! served language first. This is a small detector for choosing among the few languages a
//! server has models for, not a general language identifier.

/// A script, by the Unicode blocks of its letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Script {
    Latin,
    Hangul,
    Han,
    Kana,
    Cyrillic,
    Greek,
    Arabic,
    Hebrew,
    Thai,
    Devanagari,
}

fn script_of(c: char) -> Option<Script> {
    let u = c as u32;
    Some(match u {
        0x41..=0x5a | 0x61..=0x7a | 0xc0..=0x24f | 0x1e00..=0x1eff => Script::Latin,
        0x1100..=0x11ff | 0x3130..=0x318f | 0xac00..=0xd7af => Script::Hangul,
        0x4e00..=0x9fff | 0x3400..=0x4dbf => Script::Han,
        0x3040..=0x30ff => Script::Kana,
        0x400..=0x4ff => Script::Cyrillic,
        0x370..=0x3ff => Script::Greek,
        0x600..=0x6ff => Script::Arabic,
        0x590..=0x5ff => Script::Hebrew,
        0xe00..=0xe7f => Script::Thai,
        0x900..=0x97f => Script::Devanagari,
        _ => return None,
    })
}

/// A language's script, frequent words and letters of its own.
struct Profile {
    script: Script,
    words: &'static [&'static str],
    letters: &'static str,
}

fn profile(code: &str) -> Profile {
    let base = code.split('-').next().unwrap_or(code);
    let (script, words, letters): (Script, &[&str], &str) = match base {
        "en" => (
            Script::Latin,
            &[
                "the", "a", "an", "and", "of", "to", "in", "is", "are", "on", "with", "at", "for",
                "it", "this", "that", "his", "her", "man", "woman", "was", "be", "by", "you", "i",
                "he", "she", "they", "we", "not", "from", "or", "two", "people", "while",
            ],
            "",
        ),
        "de" => (
            Script::Latin,
            &[
                "der", "die", "das", "und", "ein", "eine", "einem", "einen", "einer", "ist",
                "sind", "mit", "auf", "im", "in", "zu", "den", "dem", "des", "nicht", "ich", "sie",
                "er", "es", "wir", "von", "für", "zwei", "mann", "frau", "vor", "bei", "auch",
                "sich", "während",
            ],
            "äöüß",
        ),
        "fr" => (
            Script::Latin,
            &[
                "le", "la", "les", "un", "une", "des", "et", "est", "sont", "dans", "sur", "avec",
                "du", "de", "au", "en", "il", "elle", "ils", "je", "pas", "pour", "qui", "que",
                "homme", "femme", "deux",
            ],
            "éèêàçùœ",
        ),
        "es" => (
            Script::Latin,
            &[
                "el", "la", "los", "las", "un", "una", "y", "es", "son", "en", "con", "de", "del",
                "que", "por", "para", "no", "hombre", "mujer", "dos", "está", "están",
            ],
            "ñ¿¡áíóú",
        ),
        "it" => (
            Script::Latin,
            &[
                "il", "lo", "la", "gli", "le", "un", "una", "e", "è", "sono", "di", "del", "della",
                "che", "con", "per", "non", "uomo", "donna", "due",
            ],
            "àèìòù",
        ),
        "pt" => (
            Script::Latin,
            &[
                "o", "a", "os", "as", "um", "uma", "e", "é", "são", "em", "no", "na", "com", "de",
                "do", "da", "que", "não", "homem", "mulher", "dois",
            ],
            "ãõçáâêô",
        ),
        "nl" => (
            Script::Latin,
            &[
                "de", "het", "een", "en", "is", "zijn", "van", "op", "met", "in", "niet", "ik",
                "hij", "zij", "man", "vrouw", "twee",
            ],
            "ĳ",
        ),
        "ko" => (Script::Hangul, &[], ""),
        "zh" => (Script::Han, &[], ""),
        "ja" => (Script::Kana, &[], ""),
        "ru" | "uk" | "bg" | "sr" => (Script::Cyrillic, &[], ""),
        "el" => (Script::Greek, &[], ""),
        "ar" | "fa" | "ur" => (Script::Arabic, &[], ""),
        "he" => (Script::Hebrew, &[], ""),
        "th" => (Script::Thai, &[], ""),
        "hi" | "mr" | "ne" => (Script::Devanagari, &[], ""),
        _ => (Script::Latin, &[], ""),
    };
    Profile {
        script,
        words,
        letters,
    }
}

/// One candidate's confidence, as LibreTranslate answers it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Detection {
    /// 0 to 100.
    pub confidence: f64,
    /// The language code.
    pub language: String,
}

/// The confidence of each of `candidates` (language codes) that `text` is written in it,
/// best first (ties keep the candidates' order).
pub fn detect(text: &str, candidates: &[String]) -> Vec<Detection> {
    let mut letters = 0usize;
    let mut by_script: Vec<(Script, usize)> = Vec::new();
    let lower = text.to_lowercase();
    for c in lower.chars() {
        if let Some(s) = script_of(c) {
            letters += 1;
            match by_script.iter_mut().find(|(t, _)| *t == s) {
                Some((_, n)) => *n += 1,
                None => by_script.push((s, 1)),
            }
        }
    }
    // Japanese is written in kana and kanji together.
    let share = |s: Script| -> f64 {
        let n = |s| by_script.iter().find(|(t, _)| *t == s).map_or(0, |x| x.1);
        let count = if s == Script::Kana {
            n(Script::Kana) + n(Script::Han)
        } else {
            n(s)
        };
        count as f64 / letters.max(1) as f64
    };
    let words: Vec<&str> = lower
        .split(|c: char| !c.is_alphanumeric() && c != '\'')
        .filter(|w| !w.is_empty())
        .collect();
    let scores: Vec<f64> = candidates
        .iter()
        .map(|code| {
            if letters == 0 {
                return 1.0;
            }
            let p = profile(code);
            let script = share(p.script);
            if script == 0.0 {
                return 0.0;
            }
            let known = words.iter().filter(|w| p.words.contains(w)).count();
            let own = lower.chars().filter(|c| p.letters.contains(*c)).count();
            let word_share = known as f64 / words.len().max(1) as f64;
            let letter_share = (own as f64 * 5.0 / letters as f64).min(1.0);
            // Script decides between scripts; words and letters within one. A small
            // constant keeps a candidate of the right script above zero with no evidence.
            script * (0.05 + word_share + 0.5 * letter_share)
        })
        .collect();
    let total: f64 = scores.iter().sum();
    let mut out: Vec<Detection> = candidates
        .iter()
        .zip(&scores)
        .map(|(c, &s)| Detection {
            confidence: if total > 0.0 {
                (1000.0 * s / total).round() / 10.0
            } else {
                0.0
            },
            language: c.clone(),
        })
        .collect();
    out.sort_by(|a, b| b.confidence.total_cmp(&a.confidence));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn best(text: &str, among: &[&str]) -> String {
        let c: Vec<String> = among.iter().map(|s| s.to_string()).collect();
        detect(text, &c)[0].language.clone()
    }

    #[test]
    fn scripts_and_words_decide() {
        let all = ["de", "en", "ko", "fr"];
        assert_eq!(best("Ein Mann fährt Fahrrad auf der Straße.", &all), "de");
        assert_eq!(best("A man rides a bike on the street.", &all), "en");
        assert_eq!(best("남자가 자전거를 탄다.", &all), "ko");
        assert_eq!(best("Un homme fait du vélo dans la rue.", &all), "fr");
        assert_eq!(best("Zwei Hunde spielen im Schnee.", &["en", "de"]), "de");
        assert_eq!(best("Two dogs play in the snow.", &["de", "en"]), "en");
    }

    #[test]
    fn confidences_are_percentages_best_first() {
        let c = ["de".to_string(), "ko".to_string()];
        let d = detect("Hallo, wie geht es dir?", &c);
        assert_eq!(d[0].language, "de");
        assert!(d[0].confidence > 90.0 && d[0].confidence <= 100.0);
        let sum: f64 = d.iter().map(|x| x.confidence).sum();
        assert!((sum - 100.0).abs() < 0.2);
        // No letters: every candidate the same, in the order given.
        let d = detect("123 :-)", &c);
        assert_eq!(d[0].language, "de");
        assert_eq!(d[0].confidence, d[1].confidence);
    }
}
