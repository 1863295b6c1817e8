//! The sentence splitter on German, English and Korean paragraphs: abbreviations, numbers,
//! ordinals, quotes, ellipses, and the spacing kept when translations are joined back.

use transformer_text::sentence::{join_sentences, sentence_ranges, sentences};

#[track_caller]
fn check(text: &str, want: &[&str]) {
    assert_eq!(sentences(text), want, "{text:?}");
}

#[test]
fn german() {
    check(
        "Ein Mann fährt Fahrrad. Zwei Hunde spielen im Park!",
        &["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Park!"],
    );
    // Abbreviations, a decimal number, an ordinal date and a century.
    check(
        "Wir treffen uns z.B. am 1. Mai mit Dr. Müller. Es kostet 3.5 Euro, d.h. nicht viel. \
         Im 19. Jahrhundert war das anders.",
        &[
            "Wir treffen uns z.B. am 1. Mai mit Dr. Müller.",
            "Es kostet 3.5 Euro, d.h. nicht viel.",
            "Im 19. Jahrhundert war das anders.",
        ],
    );
    check(
        "Sprich mit Hr. Weber oder Fr. Schmidt. Nr. 5 ist frei.",
        &["Sprich mit Hr. Weber oder Fr. Schmidt.", "Nr. 5 ist frei."],
    );
    // Quotes close the sentence they end; an ellipsis before a lowercase word does not end it.
    check(
        "Sie sagte: „Komm her.“ Dann ging sie. Warte... was ist das?",
        &[
            "Sie sagte: „Komm her.“",
            "Dann ging sie.",
            "Warte... was ist das?",
        ],
    );
}

#[test]
fn english() {
    check(
        "Mr. Smith went to Washington. He arrived at 3.30 p.m. on Monday, e.g. early. \
         Did he stay? Yes!",
        &[
            "Mr. Smith went to Washington.",
            "He arrived at 3.30 p.m. on Monday, e.g. early.",
            "Did he stay?",
            "Yes!",
        ],
    );
    check(
        "\"Stop.\" She turned. J. R. R. Tolkien wrote it... Then he slept.",
        &[
            "\"Stop.\"",
            "She turned.",
            "J. R. R. Tolkien wrote it...",
            "Then he slept.",
        ],
    );
    // The pronoun is not an initial; a number ending a sentence ends it.
    check(
        "So did I. Then we left. The answer is 42. Nobody knew.",
        &[
            "So did I.",
            "Then we left.",
            "The answer is 42.",
            "Nobody knew.",
        ],
    );
    // No final punctuation: one sentence.
    check("a dog runs fast", &["a dog runs fast"]);
}

#[test]
fn korean() {
    check(
        "나는 학생입니다. 어디에 가요? 학교에 가요! 3.5킬로미터를 걸었다.",
        &[
            "나는 학생입니다.",
            "어디에 가요?",
            "학교에 가요!",
            "3.5킬로미터를 걸었다.",
        ],
    );
    check(
        "그가 \"안녕.\"이라고 말했다. 그리고 떠났다...",
        &["그가 \"안녕.\"이라고 말했다.", "그리고 떠났다..."],
    );
}

#[test]
fn translations_are_joined_with_the_original_spacing() {
    let text = "Erster Satz.  Zweiter Satz!\tDritter Satz? ";
    let ranges = sentence_ranges(text);
    assert_eq!(ranges.len(), 3);
    assert_eq!(
        join_sentences(text, &ranges, &["First.", "Second!", "Third?"]),
        "First.  Second!\tThird? "
    );
    // Every byte outside the ranges is whitespace.
    let mut at = 0;
    for r in &ranges {
        assert!(text[at..r.start].chars().all(char::is_whitespace));
        at = r.end;
    }
    assert!(text[at..].chars().all(char::is_whitespace));
}
