//! Numeric answer match, for math problems: the final `<answer>` and the gold answer are read
//! as numbers and compared, so `1,200`, `$1200` and `1200.0` all match `1200`.

use std::collections::BTreeMap;

use super::agent_r1::{extract_answer, format_score_in};
use super::qa::assistant_blocks;
use crate::env::Score;
use crate::message::Message;
use crate::tool_call::ToolCallFormat;

/// The number a text states: the last number in it. Thousands separators (`1,234`), a
/// currency sign, a trailing `%` or unit and a sentence's final `.` are ignored; `p/q` reads
/// as a fraction. `None` when there is no number.
pub fn parse_number(text: &str) -> Option<f64> {
    let chars: Vec<char> = text.chars().collect();
    let mut cleaned = String::with_capacity(text.len());
    for (i, &c) in chars.iter().enumerate() {
        let between_digits = |j: Option<usize>| {
            j.and_then(|j| chars.get(j))
                .is_some_and(char::is_ascii_digit)
        };
        if c == ',' && between_digits(i.checked_sub(1)) && between_digits(Some(i + 1)) {
            continue;
        }
        cleaned.push(if c.is_ascii_digit() || matches!(c, '.' | '-' | '/') {
            c
        } else {
            ' '
        });
    }
    cleaned
        .split_whitespace()
        .filter_map(|token| read_number(token.trim_end_matches('.')))
        .next_back()
}

fn read_number(token: &str) -> Option<f64> {
    let plain = |s: &str| {
        let digits = s.strip_prefix('-').unwrap_or(s);
        let ok = !digits.is_empty()
            && digits.chars().next().is_some_and(|c| c.is_ascii_digit())
            && digits.chars().all(|c| c.is_ascii_digit() || c == '.')
            && digits.matches('.').count() <= 1;
        ok.then(|| s.parse::<f64>().ok()).flatten()
    };
    match token.split_once('/') {
        Some((p, q)) => {
            let (p, q) = (plain(p)?, plain(q)?);
            (q != 0.0).then_some(p / q)
        }
        None => plain(token),
    }
}

/// Whether `answer` equals `gold` within a relative `tolerance` (absolute below 1).
pub fn numbers_match(answer: f64, gold: f64, tolerance: f64) -> bool {
    (answer - gold).abs() <= tolerance * gold.abs().max(1.0)
}

/// Scores a math transcript: the reward is `em`, 1 when the number in the final `<answer>`
/// matches a gold answer's number.
///
/// Metrics (all always present): `em`; `has_answer` (0/1); `format` (Agent-R1's format
/// score of the turns); `turns` (assistant turns); `tool_calls_written` (tool calls the model
/// wrote, read in
/// the model's format `calls`).
pub fn score_numeric(
    calls: ToolCallFormat,
    golds: &[String],
    transcript: &[Message],
    tolerance: f64,
) -> Score {
    let blocks = assistant_blocks(transcript);
    let answer = blocks.last().and_then(|b| extract_answer(b));
    let correct = answer.and_then(parse_number).is_some_and(|a| {
        golds
            .iter()
            .filter_map(|g| parse_number(g))
            .any(|g| numbers_match(a, g, tolerance))
    });
    let tool_calls: usize = blocks.iter().map(|b| calls.parse(b).len()).sum();
    let flag = |b: bool| if b { 1.0 } else { 0.0 };
    let metrics = BTreeMap::from([
        ("em".to_string(), flag(correct)),
        ("has_answer".to_string(), flag(answer.is_some())),
        ("format".to_string(), format_score_in(calls, &blocks)),
        ("turns".to_string(), blocks.len() as f64),
        ("tool_calls_written".to_string(), tool_calls as f64),
    ]);
    Score {
        reward: flag(correct),
        metrics,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_read_as_people_write_them() {
        for (text, want) in [
            ("72", Some(72.0)),
            ("$1,200.50", Some(1200.5)),
            ("1,234,567 apples", Some(1_234_567.0)),
            ("The answer is 42.", Some(42.0)),
            ("-5", Some(-5.0)),
            ("22/3 (≈ 7.3333333333)", Some(7.3333333333)),
            ("3/4", Some(0.75)),
            ("12%", Some(12.0)),
            ("from 3 to 8", Some(8.0)),
            ("1/0", None),
            ("none", None),
            ("", None),
            ("1.2.3", None),
        ] {
            assert_eq!(parse_number(text), want, "{text:?}");
        }
        assert!(numbers_match(1200.0, 1200.0, 1e-6));
        assert!(numbers_match(7.3333333333, 22.0 / 3.0, 1e-6));
        assert!(!numbers_match(71.0, 72.0, 1e-6));
        assert!(!numbers_match(0.001, 0.0, 1e-6));
    }

    #[test]
    fn the_final_answer_is_compared_as_a_number() {
        let transcript = |last: &str| {
            vec![
                Message::user("Question: ..."),
                Message::assistant("<think>Let me calculate it.</think>\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"70 + 2\"}}\n</tool_call>"),
                Message::tool("72"),
                Message::assistant(last),
            ]
        };
        let golds = vec!["72".to_string()];
        let s = score_numeric(
            ToolCallFormat::Hermes,
            &golds,
            &transcript("<think>ok</think>\n<answer>72.0</answer>"),
            1e-6,
        );
        assert_eq!(s.reward, 1.0);
        assert_eq!(
            (
                s.metrics["format"],
                s.metrics["tool_calls_written"],
                s.metrics["turns"]
            ),
            (1.0, 1.0, 2.0)
        );
        let s = score_numeric(
            ToolCallFormat::Hermes,
            &golds,
            &transcript("<think>ok</think>\n<answer>71</answer>"),
            1e-6,
        );
        assert_eq!((s.reward, s.metrics["has_answer"]), (0.0, 1.0));
        let s = score_numeric(
            ToolCallFormat::Hermes,
            &golds,
            &transcript("I think 72"),
            1e-6,
        );
        assert_eq!((s.reward, s.metrics["has_answer"]), (0.0, 0.0));
    }
}
