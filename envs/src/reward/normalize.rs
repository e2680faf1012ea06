//! SQuAD/HotpotQA answer normalisation, character for character as Python does it.
//!
//! `normalize_answer` in `hotpot_evaluate_v1.py` (and in Agent-R1's `qa_em_and_format.py`) is
//! `white_space_fix(remove_articles(remove_punc(lower(s))))`. Each step has a Python detail
//! that matters for exact parity:
//!
//! - `lower`: `str.lower()`, full Unicode lower-casing ([`str::to_lowercase`] is the same
//!   mapping, final sigma included).
//! - `remove_punc`: drops characters of `string.punctuation`, which is **ASCII only**:
//!   `“curly quotes”`, `é`, `，` (full-width comma) and other non-ASCII punctuation stay.
//! - `remove_articles`: `re.sub(r"\b(a|an|the)\b", " ", text)` where `\b` is Python's
//!   Unicode word boundary: a word character is `_` or a character of general category
//!   L* (letters) or Nd/Nl/No (numbers). Combining marks are *not* word characters.
//! - `white_space_fix`: `" ".join(text.split())`, where `str.split()` splits on Python's
//!   `str.isspace()` set: Rust's `char::is_whitespace` plus the ASCII separators
//!   U+001C..=U+001F.

use unicode_general_category::{get_general_category, GeneralCategory};

/// Python's `string.punctuation`.
pub const PY_PUNCTUATION: &str = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";

/// Normalises an answer exactly as `normalize_answer` of the official HotpotQA evaluator.
pub fn normalize_answer(s: &str) -> String {
    let lowered = s.to_lowercase();
    let no_punc: String = lowered.chars().filter(|c| !is_py_punctuation(*c)).collect();
    let no_articles = remove_articles(&no_punc);
    py_split_whitespace(&no_articles)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether `c` is in Python's `string.punctuation`.
pub fn is_py_punctuation(c: char) -> bool {
    c.is_ascii() && PY_PUNCTUATION.contains(c)
}

/// Whether `c` is a word character for Python's `re` module (`\w` on `str` patterns).
pub fn is_py_word_char(c: char) -> bool {
    if c == '_' {
        return true;
    }
    matches!(
        get_general_category(c),
        GeneralCategory::UppercaseLetter
            | GeneralCategory::LowercaseLetter
            | GeneralCategory::TitlecaseLetter
            | GeneralCategory::ModifierLetter
            | GeneralCategory::OtherLetter
            | GeneralCategory::DecimalNumber
            | GeneralCategory::LetterNumber
            | GeneralCategory::OtherNumber
    )
}

/// Whether `c` is white space for Python's `str.isspace()` / `str.split()`.
pub fn is_py_whitespace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.split()` with no arguments: splits on runs of white space, no empty parts.
pub fn py_split_whitespace(s: &str) -> impl Iterator<Item = &str> {
    s.split(is_py_whitespace).filter(|part| !part.is_empty())
}

/// Python's `str.strip()` with no arguments.
pub fn py_strip(s: &str) -> &str {
    s.trim_matches(is_py_whitespace)
}

/// `re.sub(r"\b(a|an|the)\b", " ", text)`: each article that stands as a whole word becomes
/// one space. Alternatives are tried in the regex's order at each position, left to right,
/// without overlap, and boundaries are judged on the original text.
pub fn remove_articles(text: &str) -> String {
    const ARTICLES: [&str; 3] = ["a", "an", "the"];
    let mut out = String::with_capacity(text.len());
    let mut prev: Option<char> = None;
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        let at_boundary = !prev.is_some_and(is_py_word_char);
        let matched = if at_boundary {
            ARTICLES.iter().find(|article| {
                rest.starts_with(**article)
                    && !rest[article.len()..]
                        .chars()
                        .next()
                        .is_some_and(is_py_word_char)
            })
        } else {
            None
        };
        match matched {
            Some(article) => {
                out.push(' ');
                prev = article.chars().last();
                i += article.len();
            }
            None => {
                let Some(c) = rest.chars().next() else { break };
                out.push(c);
                prev = Some(c);
                i += c.len_utf8();
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_basics() {
        assert_eq!(normalize_answer("The  Eiffel Tower!"), "eiffel tower");
        assert_eq!(normalize_answer("An apple, a day"), "apple day");
        assert_eq!(normalize_answer("theatre"), "theatre");
        assert_eq!(normalize_answer("Anthem"), "anthem");
        assert_eq!(normalize_answer(""), "");
        assert_eq!(normalize_answer("   "), "");
    }

    #[test]
    fn punctuation_joins_words_before_articles_are_removed() {
        // "a-team" -> "ateam": the article is no longer a whole word.
        assert_eq!(normalize_answer("A-Team"), "ateam");
        // The underscore is punctuation, so it is removed first.
        assert_eq!(normalize_answer("the_a"), "thea");
    }

    #[test]
    fn unicode_is_kept_as_python_keeps_it() {
        // “ is not a word character, so "the" after it is an article.
        assert_eq!(normalize_answer("“The Beatles”"), "“ beatles”");
        assert_eq!(normalize_answer("Café"), "café");
        // é is a word character, so "thé" is not an article.
        assert_eq!(normalize_answer("thé a"), "thé");
        // A combining mark is not a word character: "the" followed by U+0301 is an article.
        assert_eq!(normalize_answer("the\u{301} x"), "\u{301} x");
        // Full-width comma and full-width letters stay; ideographic space splits.
        assert_eq!(
            normalize_answer("Ｔｏｋｙｏ，\u{3000}Japan"),
            "ｔｏｋｙｏ， japan"
        );
        // ASCII unit separator is white space for Python.
        assert_eq!(normalize_answer("a\u{1f}b"), "b");
    }

    #[test]
    fn articles_are_matched_in_regex_order() {
        assert_eq!(remove_articles("an"), " ");
        assert_eq!(remove_articles("a an the"), "     ");
        assert_eq!(remove_articles("xa a"), "xa  ");
        assert_eq!(remove_articles("the1"), "the1");
    }
}
