//! English names of language codes, for `GET /languages` (LibreTranslate lists each language
//! with its name).

/// The English name of a language code (ISO 639-1, optionally with a region or script);
/// the code itself when it is not in the table.
pub fn name(code: &str) -> String {
    let known = NAMES.iter().find(|(c, _)| *c == code).or_else(|| {
        let base = code.split('-').next().unwrap_or(code);
        NAMES.iter().find(|(c, _)| *c == base)
    });
    match known {
        Some((_, n)) => n.to_string(),
        None => code.to_string(),
    }
}

const NAMES: &[(&str, &str)] = &[
    ("ar", "Arabic"),
    ("az", "Azerbaijani"),
    ("bg", "Bulgarian"),
    ("bn", "Bengali"),
    ("ca", "Catalan"),
    ("cs", "Czech"),
    ("da", "Danish"),
    ("de", "German"),
    ("el", "Greek"),
    ("en", "English"),
    ("eo", "Esperanto"),
    ("es", "Spanish"),
    ("et", "Estonian"),
    ("eu", "Basque"),
    ("fa", "Persian"),
    ("fi", "Finnish"),
    ("fr", "French"),
    ("ga", "Irish"),
    ("gl", "Galician"),
    ("he", "Hebrew"),
    ("hi", "Hindi"),
    ("hu", "Hungarian"),
    ("id", "Indonesian"),
    ("it", "Italian"),
    ("ja", "Japanese"),
    ("ko", "Korean"),
    ("lt", "Lithuanian"),
    ("lv", "Latvian"),
    ("ms", "Malay"),
    ("nb", "Norwegian"),
    ("nl", "Dutch"),
    ("pl", "Polish"),
    ("pt", "Portuguese"),
    ("pt-BR", "Portuguese (Brazil)"),
    ("ro", "Romanian"),
    ("ru", "Russian"),
    ("sk", "Slovak"),
    ("sl", "Slovenian"),
    ("sq", "Albanian"),
    ("sv", "Swedish"),
    ("th", "Thai"),
    ("tl", "Tagalog"),
    ("tr", "Turkish"),
    ("uk", "Ukrainian"),
    ("ur", "Urdu"),
    ("vi", "Vietnamese"),
    ("zh", "Chinese"),
    ("zh-Hans", "Chinese (Simplified)"),
    ("zh-Hant", "Chinese (Traditional)"),
];

#[cfg(test)]
mod tests {
    #[test]
    fn names_fall_back_to_the_base_code_then_the_code() {
        assert_eq!(super::name("de"), "German");
        assert_eq!(super::name("pt-BR"), "Portuguese (Brazil)");
        assert_eq!(super::name("de-AT"), "German");
        assert_eq!(super::name("xx"), "xx");
    }
}
