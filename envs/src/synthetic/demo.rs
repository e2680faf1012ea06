//! Demonstrations: gold trajectories in the exact hermes format, for a supervised warm start.
//!
//! A tool-calling turn is `<think>...</think>\n<tool_call>\n{"name": "search", "arguments":
//! {"query": "..."}}\n</tool_call>`; the final turn is `<think>...</think>\n<answer>...</answer>`.
//! Both pass Agent-R1's format rules.

use serde::{Deserialize, Serialize};

use super::questions::Question;
use super::rng::WorldRng;
use super::world::World;
use crate::message::Message;

/// Options of imperfect demonstrations.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DemoConfig {
    /// Share of the demos that answer right after the first search with a wrong guess.
    pub early_wrong_answer_prob: f64,
    /// Demos per question. With more than one, every question gets both kinds in the same
    /// proportion, so the warm-started policy learns to answer early with that probability on
    /// *every* question: a habit RL can see in its samples and unlearn. With one, each
    /// question's single demo is gold or imperfect by chance and the model memorises which
    /// questions to answer early; its sampled episodes on those never explore the second hop.
    pub variants_per_question: usize,
    /// Seed of the imperfections (independent of the world's seed stream).
    pub seed: u64,
}

impl Default for DemoConfig {
    fn default() -> Self {
        Self {
            early_wrong_answer_prob: 0.0,
            variants_per_question: 1,
            seed: 0,
        }
    }
}

/// One assistant turn of a demonstration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DemoTurn {
    /// The assistant text, exactly as the model should write it.
    pub assistant: String,
    /// The search query of this turn (`None` for the final answer turn).
    pub query: Option<String>,
}

/// A demonstration for one question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Demo {
    /// The question's id.
    pub task_id: String,
    /// Assistant turns in order; all but the last call `search`.
    pub turns: Vec<DemoTurn>,
    /// Whether the final answer is the gold answer.
    pub correct: bool,
}

/// A `search` call as Qwen models write it (Python `json.dumps` spacing).
pub fn search_call_text(query: &str) -> String {
    let q = serde_json::Value::String(query.to_string());
    format!(
        "<tool_call>\n{{\"name\": \"search\", \"arguments\": {{\"query\": {q}}}}}\n</tool_call>"
    )
}

fn call_turn(think: String, query: &str) -> DemoTurn {
    DemoTurn {
        assistant: format!("<think>{think}</think>\n{}", search_call_text(query)),
        query: Some(query.to_string()),
    }
}

fn answer_turn(think: String, answer: &str) -> DemoTurn {
    DemoTurn {
        assistant: format!("<think>{think}</think>\n<answer>{answer}</answer>"),
        query: None,
    }
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

/// A demo that searches once, then guesses a wrong entity of the answer's kind.
pub fn early_wrong_demo(world: &World, question: &Question, rng: &mut WorldRng) -> Demo {
    let gold = gold_demo(question);
    let candidates: Vec<usize> = world
        .of_kind(question.answer_kind)
        .into_iter()
        .filter(|&e| world.name(e) != question.answer)
        .collect();
    let Some(&wrong) = rng.choose(&candidates) else {
        return gold;
    };
    let wrong = world.name(wrong).to_string();
    let mut turns: Vec<DemoTurn> = gold.turns.into_iter().take(1).collect();
    let think = match question.hops.first() {
        Some(h) => format!(
            "{}. I think the answer is {wrong}.",
            sentence(&h.relation.fact(&h.subject, &h.object))
        ),
        None => format!("I think the answer is {wrong}."),
    };
    turns.push(answer_turn(think, &wrong));
    Demo {
        task_id: question.id.clone(),
        turns,
        correct: false,
    }
}

/// Demos for `questions`, `variants_per_question` each (at least one) in question order. Of a
/// question's `v` demos, `floor(p * v)` answer early with a wrong guess, plus one more with
/// probability equal to the remainder, so that one variant per question is a coin flip at `p`.
pub fn demos(world: &World, questions: &[Question], config: &DemoConfig) -> Vec<Demo> {
    let mut rng = WorldRng::new(config.seed, 2);
    let v = config.variants_per_question.max(1);
    let p = config.early_wrong_answer_prob.clamp(0.0, 1.0);
    let expected = p * v as f64;
    let mut out = Vec::with_capacity(questions.len() * v);
    for q in questions {
        let mut wrong = expected.floor() as usize;
        if rng.chance(expected - expected.floor()) {
            wrong += 1;
        }
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

impl Demo {
    /// The whole conversation: `prefix` (system prompt and question), then each assistant
    /// turn followed, for a search turn, by one tool message with `observe(query)`.
    pub fn messages(
        &self,
        prefix: Vec<Message>,
        mut observe: impl FnMut(&str) -> String,
    ) -> Vec<Message> {
        let mut out = prefix;
        for turn in &self.turns {
            out.push(Message::assistant(turn.assistant.clone()));
            if let Some(q) = &turn.query {
                out.push(Message::tool(observe(q)));
            }
        }
        out
    }
}
