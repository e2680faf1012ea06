//! Demonstrations: gold trajectories in the exact hermes format, for a supervised warm start.
//!
//! A tool-calling turn is `<think>...</think>\n<tool_call>\n{"name": "search", "arguments":
//! {"query": "..."}}\n</tool_call>`; the final turn is `<think>...</think>\n<answer>...</answer>`.
//! Both pass Agent-R1's format rules.

use super::questions::Question;
use super::rng::WorldRng;
use super::world::World;
pub use crate::demo::{Demo, DemoCall, DemoConfig, DemoTurn};

/// A `search` call.
pub fn search_call(query: &str) -> DemoCall {
    DemoCall {
        tool: "search".into(),
        arguments: serde_json::json!({ "query": query }),
    }
}

/// A `search` call as Qwen models write it (Python `json.dumps` spacing).
pub fn search_call_text(query: &str) -> String {
    search_call(query).hermes()
}

fn call_turn(think: String, query: &str) -> DemoTurn {
    DemoTurn::calling(&think, search_call(query))
}

fn answer_turn(think: String, answer: &str) -> DemoTurn {
    DemoTurn::answering(&think, answer)
}

fn sentence(clause: &str) -> String {
    let mut chars = clause.chars();
    match chars.next() {
        Some(c) => c.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// The gold trajectory: one search per hop, then the answer.
pub fn gold_demo(question: &Question) -> Demo {
    let mut turns = Vec::with_capacity(question.hops.len() + 1);
    for (i, hop) in question.hops.iter().enumerate() {
        let need = format!(
            "I need to find out {}.",
            hop.relation.question_about(&hop.subject)
        );
        let think = match i.checked_sub(1).and_then(|p| question.hops.get(p)) {
            None => format!("{need} Let me search for {}.", hop.subject),
            Some(prev) => format!(
                "{}. Now {need}",
                sentence(&prev.relation.fact(&prev.subject, &prev.object))
            ),
        };
        turns.push(call_turn(think, &hop.subject));
    }
    let last = question.hops.last();
    let think = match last {
        Some(h) => format!(
            "{}. So the answer is {}.",
            sentence(&h.relation.fact(&h.subject, &h.object)),
            question.answer
        ),
        None => format!("The answer is {}.", question.answer),
    };
    turns.push(answer_turn(think, &question.answer));
    Demo {
        task_id: question.id.clone(),
        turns,
        correct: true,
    }
}

/// A demo that searches once, then answers with what that search found: the first hop's
/// entity, the classic multi-hop mistake (or, on a one-hop question, a wrong entity of the
/// answer's kind). The early answer is still copied from the context, so a phase of these
/// demonstrations teaches when to stop without eroding the copying of names.
pub fn early_wrong_demo(world: &World, question: &Question, rng: &mut WorldRng) -> Demo {
    let gold = gold_demo(question);
    let bridge = question
        .hops
        .first()
        .map(|h| h.object.clone())
        .filter(|o| *o != question.answer);
    let Some(wrong) = bridge.or_else(|| other_of_answer_kind(world, question, rng)) else {
        return gold;
    };
    let mut turns: Vec<DemoTurn> = gold.turns.into_iter().take(1).collect();
    let think = match question.hops.first() {
        Some(h) => format!(
            "{}. So the answer is {wrong}.",
            sentence(&h.relation.fact(&h.subject, &h.object))
        ),
        None => format!("The answer is {wrong}."),
    };
    turns.push(answer_turn(think, &wrong));
    Demo {
        task_id: question.id.clone(),
        turns,
        correct: false,
    }
}

/// A random entity of the answer's kind other than the answer (none in a world with one).
fn other_of_answer_kind(world: &World, question: &Question, rng: &mut WorldRng) -> Option<String> {
    let candidates: Vec<usize> = world
        .of_kind(question.answer_kind)
        .into_iter()
        .filter(|&e| world.name(e) != question.answer)
        .collect();
    rng.choose(&candidates).map(|&e| world.name(e).to_string())
}

/// Demos for `questions`, `variants_per_question` each (at least one) in question order; of
/// a question's variants, [`DemoConfig::early_variants`] answer early with the first search's
/// entity.
pub fn demos(world: &World, questions: &[Question], config: &DemoConfig) -> Vec<Demo> {
    let mut rng = config.rng();
    let v = config.variants();
    let mut out = Vec::with_capacity(questions.len() * v);
    for q in questions {
        let wrong = config.early_variants(&mut rng);
        for i in 0..v {
            out.push(if i < wrong {
                early_wrong_demo(world, q, &mut rng)
            } else {
                gold_demo(q)
            });
        }
    }
    out
}
