//! Agent-R1's legacy QA reward, `qa_em_and_format`, reproduced rule for rule.
//!
//! Read from `agent_r1/src/reward_score/qa_em_and_format.py` of the original:
//!
//! - The *assistant blocks* are the texts of the assistant turns (the original finds them
//!   with `<|im_start|>assistant\n(.*?)<|im_end|>` over the decoded episode).
//! - Format: each non-final block that contains exactly one each of `<think>`, `</think>`,
//!   `<tool_call>`, `</tool_call>` and matches `^<think>(.*?)</think>(.*?)<tool_call>(.*?)</tool_call>$`
//!   (Python `re.search`, `DOTALL`) earns 0.5; the final block earns 0.5 when it matches
//!   `^<think>(.*?)</think>(.*?)<answer>(.*?)</answer>$` (no tag counting). Note that the
//!   original allows *any* text between `</think>` and `<tool_call>`, not only white space,
//!   and that Python's `$` also matches before one final `\n`.
//! - Answer: the first `<answer>(.*?)</answer>` of the final block, stripped; 1.0 when a
//!   normalised gold answer is a substring of the normalised answer, else 0.2 when a
//!   normalised gold is a substring of the normalised *whole final block*, else 0.
//! - Training reward: `f = min(format, 1)`; `-1 + f + answer` when `f >= 0.5`, else `-1 + f`.
//! - Its "EM" (`compute_score_em`) is the substring check on the `<answer>` only: reported
//!   here as `substring_em`, never as `em`.

use super::normalize::{normalize_answer, py_strip};
use crate::tool_call::{llama3_json, mistral, ToolCallFormat};

/// The parts of `qa_em_and_format` for one episode.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AgentR1Score {
    /// Format score before the cap (0.5 per well-formed block).
    pub format: f64,
    /// Answer score: 1.0, 0.2 or 0.
    pub answer: f64,
    /// `compute_score_em`: 1.0 when a gold answer is a substring of the `<answer>`.
    pub substring_em: f64,
    /// `compute_score_format_answer`: the training reward in [-1, 1].
    pub reward: f64,
}

/// Scores the assistant blocks of an episode against the gold answers, tool calls read in
/// hermes (the original's format).
pub fn qa_em_and_format(assistant_blocks: &[&str], golds: &[String]) -> AgentR1Score {
    qa_em_and_format_in(ToolCallFormat::Hermes, assistant_blocks, golds)
}

/// [`qa_em_and_format`] for a model that writes tool calls in `calls`.
pub fn qa_em_and_format_in(
    calls: ToolCallFormat,
    assistant_blocks: &[&str],
    golds: &[String],
) -> AgentR1Score {
    let format = format_score_in(calls, assistant_blocks);
    let (answer, substring_em) = match assistant_blocks.last() {
        None => (0.0, 0.0),
        Some(last) => {
            let extracted = extract_answer(last);
            let substring_em = match extracted {
                Some(a) if substring_match(a, golds) => 1.0,
                _ => 0.0,
            };
            let answer = if substring_em == 1.0 {
                1.0
            } else if substring_match(last, golds) {
                0.2
            } else {
                0.0
            };
            (answer, substring_em)
        }
    };
    AgentR1Score {
        format,
        answer,
        substring_em,
        reward: training_reward(format, answer),
    }
}

/// `compute_score_format_answer` from a format and an answer score.
pub fn training_reward(format: f64, answer: f64) -> f64 {
    let format = format.min(1.0);
    if format >= 0.5 {
        -1.0 + format + answer
    } else {
        -1.0 + format
    }
}

/// `compute_score_format`: 0.5 per well-formed tool-calling block, 0.5 for a well-formed
/// final answer block. No blocks score 0.
pub fn format_score(assistant_blocks: &[&str]) -> f64 {
    format_score_in(ToolCallFormat::Hermes, assistant_blocks)
}

/// [`format_score`] with tool calls in `calls`' format.
pub fn format_score_in(calls: ToolCallFormat, assistant_blocks: &[&str]) -> f64 {
    let Some((last, rest)) = assistant_blocks.split_last() else {
        return 0.0;
    };
    let mut score = 0.0;
    for block in rest {
        if is_tool_call_block_in(calls, block) {
            score += 0.5;
        }
    }
    if is_answer_block(last) {
        score += 0.5;
    }
    score
}

/// Where `closing` would have to start for `^...{closing}$` to match in Python: at the very
/// end, or just before one final `\n`.
fn ends_with_tag(block: &str, closing: &str) -> Option<usize> {
    if let Some(body) = block.strip_suffix(closing) {
        return Some(body.len());
    }
    block
        .strip_suffix('\n')
        .and_then(|b| b.strip_suffix(closing))
        .map(str::len)
}

/// A well-formed non-final block in the model's own format: a `<think>...</think>` block,
/// then exactly one call. Hermes keeps the original's rule ([`is_tool_call_block`]); in the
/// JSON formats (Llama 3.1's object, Mistral's `[TOOL_CALLS]` list) the call must be the
/// rest of the turn.
pub fn is_tool_call_block_in(calls: ToolCallFormat, block: &str) -> bool {
    let once = |tag: &str| block.matches(tag).count() == 1;
    let thinks = block.starts_with("<think>") && once("<think>") && once("</think>");
    match calls {
        ToolCallFormat::Hermes => is_tool_call_block(block),
        ToolCallFormat::Llama3Json => thinks && llama3_json::is_whole_call(block),
        ToolCallFormat::Mistral => {
            thinks && mistral::is_whole_call_list(block) && calls.parse(block).len() == 1
        }
    }
}

/// A non-final hermes block: exactly one of each tag and
/// `^<think>(.*?)</think>(.*?)<tool_call>(.*?)</tool_call>$` (DOTALL).
pub fn is_tool_call_block(block: &str) -> bool {
    let once = |tag: &str| block.matches(tag).count() == 1;
    if !(once("<think>") && once("</think>") && once("<tool_call>") && once("</tool_call>")) {
        return false;
    }
    if !block.starts_with("<think>") {
        return false;
    }
    let Some(close_at) = ends_with_tag(block, "</tool_call>") else {
        return false;
    };
    let (Some(think_end), Some(call_start)) =
        (find_from(block, "</think>", 7), block.find("<tool_call>"))
    else {
        return false;
    };
    call_start >= think_end + "</think>".len() && close_at >= call_start + "<tool_call>".len()
}

/// The final block: `^<think>(.*?)</think>(.*?)<answer>(.*?)</answer>$` (DOTALL).
pub fn is_answer_block(block: &str) -> bool {
    if !block.starts_with("<think>") {
        return false;
    }
    let Some(close_at) = ends_with_tag(block, "</answer>") else {
        return false;
    };
    // The earliest `</think>` leaves the most room; then the earliest `<answer>` after it.
    let Some(think_end) = find_from(block, "</think>", "<think>".len()) else {
        return false;
    };
    let after_think = think_end + "</think>".len();
    match find_from(block, "<answer>", after_think) {
        Some(open) => open + "<answer>".len() <= close_at,
        None => false,
    }
}

fn find_from(haystack: &str, needle: &str, from: usize) -> Option<usize> {
    haystack
        .get(from..)
        .and_then(|tail| tail.find(needle))
        .map(|i| i + from)
}

/// `extract_solution`: the text of the first `<answer>...</answer>`, stripped (Python
/// `str.strip()`); `None` without a complete pair.
pub fn extract_answer(block: &str) -> Option<&str> {
    let open = block.find("<answer>")? + "<answer>".len();
    let close = block[open..].find("</answer>")? + open;
    Some(py_strip(&block[open..close]))
}

/// `subem_check`: whether some normalised gold is a substring of the normalised text.
pub fn substring_match(text: &str, golds: &[String]) -> bool {
    let text = normalize_answer(text);
    golds.iter().any(|g| text.contains(&normalize_answer(g)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn golds(g: &[&str]) -> Vec<String> {
        g.iter().map(|s| s.to_string()).collect()
    }

    const CALL: &str = "<think>look it up</think>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}\n</tool_call>";

    #[test]
    fn tool_call_blocks() {
        assert!(is_tool_call_block(CALL));
        assert!(is_tool_call_block(&format!("{CALL}\n")));
        assert!(!is_tool_call_block(&format!("{CALL}\n\n")));
        assert!(!is_tool_call_block(&format!(" {CALL}")));
        // The original allows any text between </think> and <tool_call>.
        assert!(is_tool_call_block(
            "<think>a</think>I will search.<tool_call>{}</tool_call>"
        ));
        // Two calls in one block: not well formed.
        assert!(!is_tool_call_block(&format!(
            "{CALL}<tool_call>{{}}</tool_call>"
        )));
        // Wrong order.
        assert!(!is_tool_call_block(
            "<tool_call>{}</tool_call><think>a</think>"
        ));
        assert!(!is_tool_call_block(
            "<think>a<tool_call>{}</think></tool_call>"
        ));
    }

    #[test]
    fn tool_call_blocks_in_each_format() {
        let llama =
            "<think>look it up</think>{\"name\": \"search\", \"parameters\": {\"query\": \"x\"}}";
        let mistral = "<think>look it up</think>[TOOL_CALLS] [{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}]";
        let untagged =
            "<think>look it up</think> [{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}]";
        use ToolCallFormat::*;
        for (format, good) in [
            (Hermes, CALL),
            (Llama3Json, llama),
            (Mistral, mistral),
            (Mistral, untagged),
        ] {
            assert!(is_tool_call_block_in(format, good), "{format}: {good}");
            // Each format's call is not a call in the others.
            for other in ToolCallFormat::ALL.into_iter().filter(|f| *f != format) {
                assert!(!is_tool_call_block_in(other, good), "{other}: {good}");
            }
            // No think block, text after the call, two think blocks: not well formed.
            let bare = &good[good.find("</think>").unwrap() + 8..];
            assert!(!is_tool_call_block_in(format, bare), "{format}: {bare}");
            assert!(!is_tool_call_block_in(
                format,
                &format!("<think>a</think>{good}")
            ));
        }
        assert!(!is_tool_call_block_in(Llama3Json, &format!("{llama} done")));
        assert!(!is_tool_call_block_in(Mistral, &format!("{mistral} done")));
        let two = "<think>a</think>[TOOL_CALLS] [{\"name\": \"a\"}, {\"name\": \"b\"}]";
        assert!(!is_tool_call_block_in(Mistral, two));
        let last = "<think>found</think><answer>Paris</answer>";
        let golds = golds(&["Paris"]);
        for (format, good) in [(Hermes, CALL), (Llama3Json, llama), (Mistral, mistral)] {
            let s = qa_em_and_format_in(format, &[good, last], &golds);
            assert_eq!((s.format, s.reward), (1.0, 1.0), "{format}");
        }
        // A hermes call read as Llama's is malformed: only the answer block scores.
        assert_eq!(
            qa_em_and_format_in(Llama3Json, &[CALL, last], &golds).format,
            0.5
        );
    }

    #[test]
    fn answer_blocks() {
        assert!(is_answer_block("<think>so</think>\n<answer>Paris</answer>"));
        assert!(is_answer_block("<think>so</think><answer></answer>\n"));
        // No tag counting in the final block.
        assert!(is_answer_block(
            "<think>a</think><think>b</think><answer>x</answer><answer>y</answer>"
        ));
        assert!(!is_answer_block(
            "<think>so</think><answer>Paris</answer> done"
        ));
        assert!(!is_answer_block("<answer>Paris</answer>"));
        assert!(!is_answer_block("<think>so <answer>Paris</answer>"));
    }

    #[test]
    fn extract_takes_the_first_pair_and_strips() {
        assert_eq!(
            extract_answer("<answer>  Paris \n</answer><answer>x</answer>"),
            Some("Paris")
        );
        assert_eq!(extract_answer("<answer>open"), None);
        assert_eq!(extract_answer("none"), None);
    }

    #[test]
    fn full_scores() {
        let g = golds(&["Paris"]);
        let last = "<think>found it</think>\n<answer>It is Paris, France</answer>";
        let s = qa_em_and_format(&[CALL, last], &g);
        assert_eq!(
            (s.format, s.answer, s.substring_em, s.reward),
            (1.0, 1.0, 1.0, 1.0)
        );

        // Right answer mentioned outside <answer>: 0.2.
        let s = qa_em_and_format(&["<think>Paris?</think><answer>Lyon</answer>"], &g);
        assert_eq!((s.format, s.answer, s.substring_em), (0.5, 0.2, 0.0));
        assert!((s.reward - (-1.0 + 0.5 + 0.2)).abs() < 1e-12);

        // Bad format: the answer does not count.
        let s = qa_em_and_format(&["<answer>Paris</answer>"], &g);
        assert_eq!(
            (s.format, s.answer, s.substring_em, s.reward),
            (0.0, 1.0, 1.0, -1.0)
        );

        // Format is capped at 1.
        let s = qa_em_and_format(&[CALL, CALL, CALL, last], &g);
        assert_eq!(s.format, 2.0);
        assert_eq!(s.reward, 1.0);

        assert_eq!(qa_em_and_format(&[], &g).reward, -1.0);
    }
}
