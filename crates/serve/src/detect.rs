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

/// The languages every text is weighed against besides the served ones, so that a
/// confidence says how well a served language fits the text among the languages it might
/// be in, not only among those served.
pub const KNOWN: &[&str] = &[
    "en", "de", "fr", "es", "it", "pt", "nl", "ko", "zh", "ja", "ru", "el", "ar", "he", "th", "hi",
];

/// Below this confidence (percent) `source=auto` refuses a text rather than translate it
/// from a language it is probably not written in.
pub const CONFIDENCE_FLOOR: f64 = 10.0;

/// A text that reads as a language no candidate is with at least this confidence (percent)
/// is refused by `source=auto` too.
pub const OTHER_LANGUAGE_FLOOR: f64 = 50.0;

/// What detection says about a text: the served candidates' confidences, best first, and
/// the language it reads as best among the candidates and [`KNOWN`] together.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// The candidates, best first (ties keep the candidates' order).
    pub candidates: Vec<Detection>,
    /// The best language of all, served or not.
    pub best: Detection,
}

impl Reading {
    /// The best candidate.
    pub fn top(&self) -> &Detection {
        &self.candidates[0]
    }

    /// Whether the best candidate is too unlikely to translate from: below
    /// [`CONFIDENCE_FLOOR`] (a text in a script no candidate reads has 0), or the text
    /// reads as another language with [`OTHER_LANGUAGE_FLOOR`] or more.
    pub fn unsure(&self) -> bool {
        let served = self
            .candidates
            .iter()
            .any(|c| c.language == self.best.language);
        self.top().confidence < CONFIDENCE_FLOOR
            || (!served && self.best.confidence >= OTHER_LANGUAGE_FLOOR)
    }
}

/// The confidence of each of `candidates` (language codes) that `text` is written in it,
/// best first (ties keep the candidates' order). Confidences are percentages of the
/// evidence over the candidates and the [`KNOWN`] languages together: a text in a script no
/// candidate reads gives every candidate 0, and a text that reads as English gives German a
/// low confidence even where German is the only candidate. A text with no letters gives
/// every candidate the same share of 100.
pub fn detect(text: &str, candidates: &[String]) -> Vec<Detection> {
    read(text, candidates).candidates
}

/// [`detect`], with the best language of all beside the candidates'.
pub fn read(text: &str, candidates: &[String]) -> Reading {
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
    if letters == 0 {
        let share = (1000.0 / candidates.len().max(1) as f64).round() / 10.0;
        let candidates: Vec<Detection> = candidates
            .iter()
            .map(|c| Detection {
                confidence: share,
                language: c.clone(),
            })
            .collect();
        let best = candidates.first().cloned().unwrap_or(Detection {
            confidence: 0.0,
            language: String::new(),
        });
        return Reading { candidates, best };
    }
    // Japanese is written in kana and kanji together.
    let share = |s: Script| -> f64 {
        let n = |s| by_script.iter().find(|(t, _)| *t == s).map_or(0, |x| x.1);
        let count = if s == Script::Kana {
            n(Script::Kana) + n(Script::Han)
        } else {
            n(s)
        };
        count as f64 / letters as f64
    };
    let words: Vec<&str> = lower
        .split(|c: char| !c.is_alphanumeric() && c != '\'')
        .filter(|w| !w.is_empty())
        .collect();
    let score = |code: &str| -> f64 {
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
        // constant keeps a language of the right script above zero with no evidence.
        script * (0.05 + word_share + 0.5 * letter_share)
    };
    // The candidates, then the known languages no candidate stands for (by base code: a
    // served `pt-BR` is Portuguese).
    let base = |c: &str| c.split('-').next().unwrap_or(c).to_string();
    let mut all: Vec<String> = candidates.to_vec();
    for k in KNOWN {
        if !all.iter().any(|c| base(c) == *k) {
            all.push(k.to_string());
        }
    }
    let scores: Vec<f64> = all.iter().map(|c| score(c)).collect();
    let total: f64 = scores.iter().sum();
    let confidence = |s: f64| {
        if total > 0.0 {
            (1000.0 * s / total).round() / 10.0
        } else {
            0.0
        }
    };
    let mut everything: Vec<Detection> = all
        .iter()
        .zip(&scores)
        .map(|(c, &s)| Detection {
            confidence: confidence(s),
            language: c.clone(),
        })
        .collect();
    let mut served: Vec<Detection> = everything[..candidates.len()].to_vec();
    served.sort_by(|a, b| b.confidence.total_cmp(&a.confidence));
    everything.sort_by(|a, b| b.confidence.total_cmp(&a.confidence));
    Reading {
        candidates: served,
        best: everything.swap_remove(0),
    }
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
        let d = detect("Hallo, wie geht es dir? Ich bin in der Stadt.", &c);
        assert_eq!(d[0].language, "de");
        // Well above a Latin language with no evidence (1 in 7), though English and Dutch
        // share "in".
        assert!(d[0].confidence > 30.0 && d[0].confidence <= 100.0, "{d:?}");
        assert_eq!(d[1].confidence, 0.0);
        let sum: f64 = d.iter().map(|x| x.confidence).sum();
        assert!(sum <= 100.05);
        // No letters: every candidate the same, in the order given.
        let d = detect("123 :-)", &c);
        assert_eq!(d[0].language, "de");
        assert_eq!(d[0].confidence, d[1].confidence);
    }

    #[test]
    fn a_text_no_candidate_reads_is_unsure_and_names_its_language() {
        let de = ["de".to_string()];
        let r = read("남자가 자전거를 탄다.", &de);
        assert_eq!(r.top().language, "de");
        assert_eq!(r.top().confidence, 0.0);
        assert!(r.unsure());
        assert_eq!(r.best.language, "ko");
        assert!(r.best.confidence > 90.0);
        // English sent to a German-only server reads as English.
        let r = read(
            "The man and the woman are riding a bike on the street with the dog.",
            &de,
        );
        assert!(r.unsure(), "{r:?}");
        assert_eq!(r.best.language, "en");
        // German is sure enough.
        let r = read("Ein Mann fährt mit seinem Hund auf der Straße.", &de);
        assert!(!r.unsure(), "{r:?}");
        assert_eq!(r.best.language, "de");
    }
}
