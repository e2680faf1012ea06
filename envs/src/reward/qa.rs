//! Scoring a finished QA episode: every metric, named, and the selected one as the reward.

use std::collections::BTreeMap;

use super::agent_r1::{extract_answer, qa_em_and_format_in};
use super::hotpotqa::best_score;
use super::kind::RewardKind;
use crate::env::Score;
use crate::message::{Message, Role};
use crate::tool_call::ToolCallFormat;

/// The texts of the assistant turns of a transcript, in order.
pub fn assistant_blocks(transcript: &[Message]) -> Vec<&str> {
    transcript
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .map(|m| m.content.as_str())
        .collect()
}

/// The final answer: the first `<answer>...</answer>` of the last assistant turn.
pub fn final_answer(transcript: &[Message]) -> Option<&str> {
    assistant_blocks(transcript)
        .last()
        .and_then(|b| extract_answer(b))
}

/// Scores a QA transcript against the gold answers.
///
/// Metrics (all always present):
/// - `em`, `f1`, `precision`, `recall`: official HotpotQA metrics of the final `<answer>`
///   against the best gold (0 when there is no `<answer>`);
/// - `substring_em`: Agent-R1's "EM" (a gold is a substring of the `<answer>`);
/// - `format`, `answer_score`, `agent_r1_reward`: the parts of Agent-R1's `qa_em_and_format`;
/// - `has_answer` (0/1), `turns` (assistant turns), `tool_calls_written` (tool calls the
///   model wrote, well-formed or not; the runtime's `tool_calls_per_episode` counts the calls
///   it ran).
///
/// `calls` is the model's tool-call format: `format` and `tool_calls_written` read the calls as the
/// model writes them.
pub fn score_qa(
    kind: RewardKind,
    calls: ToolCallFormat,
    golds: &[String],
    transcript: &[Message],
) -> Score {
    let blocks = assistant_blocks(transcript);
    let answer = blocks.last().and_then(|b| extract_answer(b));
    let official = answer.map(|a| best_score(a, golds)).unwrap_or_default();
    let legacy = qa_em_and_format_in(calls, &blocks, golds);
    let tool_calls: usize = blocks.iter().map(|b| calls.parse(b).len()).sum();
    let metrics = BTreeMap::from([
        ("em".to_string(), official.em),
        ("f1".to_string(), official.f1),
        ("precision".to_string(), official.precision),
        ("recall".to_string(), official.recall),
        ("substring_em".to_string(), legacy.substring_em),
        ("format".to_string(), legacy.format),
        ("answer_score".to_string(), legacy.answer),
        ("agent_r1_reward".to_string(), legacy.reward),
        (
            "has_answer".to_string(),
            if answer.is_some() { 1.0 } else { 0.0 },
        ),
        ("turns".to_string(), blocks.len() as f64),
        ("tool_calls_written".to_string(), tool_calls as f64),
    ]);
    let reward = metrics.get(kind.metric()).copied().unwrap_or(0.0);
    Score { reward, metrics }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_named_and_the_kind_picks_the_reward() {
        let transcript = vec![
            Message::system("sys"),
            Message::user("Where is the Louvre?"),
            Message::assistant("<think>search</think>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"Louvre\"}}\n</tool_call>"),
            Message::tool("The Louvre is in Paris."),
            Message::assistant("<think>found</think>\n<answer>Paris, France</answer>"),
        ];
        let golds = vec!["Paris".to_string()];
        let s = score_qa(
            RewardKind::AgentR1Qa,
            ToolCallFormat::Hermes,
            &golds,
            &transcript,
        );
        assert_eq!(s.reward, 1.0);
        assert_eq!(s.metrics["substring_em"], 1.0);
        assert_eq!(s.metrics["em"], 0.0);
        assert!((s.metrics["f1"] - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(s.metrics["tool_calls_written"], 1.0);
        assert_eq!(s.metrics["turns"], 2.0);
        let em = score_qa(
            RewardKind::HotpotqaEm,
            ToolCallFormat::Hermes,
            &golds,
            &transcript,
        );
        assert_eq!(em.reward, 0.0);
        let f1 = score_qa(
            RewardKind::HotpotqaF1,
            ToolCallFormat::Hermes,
            &golds,
            &transcript,
        );
        assert!((f1.reward - 2.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn no_answer_tag_scores_zero_em_even_for_empty_gold() {
        let transcript = vec![Message::assistant("I don't know")];
        let s = score_qa(
            RewardKind::HotpotqaEm,
            ToolCallFormat::Hermes,
            &[String::new()],
            &transcript,
        );
        assert_eq!(s.metrics["em"], 0.0);
        assert_eq!(s.metrics["has_answer"], 0.0);
    }
}
