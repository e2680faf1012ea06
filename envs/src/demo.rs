//! Demonstrations: whole episodes written by a generator, for a supervised warm start.
//!
//! A demonstration is the assistant's turns, each with the tool call it makes (if any); the
//! warm start runs those calls through the real tools to get the observations, so what the
//! model is taught to read is what it will read in RL.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::message::Message;
use crate::synthetic::rng::WorldRng;
use crate::tool_call::python_json;

/// How a generator's demonstrations are mixed: how many per task, and what share of them
/// carry the imperfection the generator knows how to make (answering before the work is done,
/// with a wrong answer), so that RL has a habit to unlearn.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DemoConfig {
    /// Share of the demos that answer early with a wrong answer.
    pub early_wrong_answer_prob: f64,
    /// Demos per task. With more than one, every task gets both kinds in the same
    /// proportion, so the warm-started policy learns to answer early with that probability on
    /// *every* task: a habit RL can see in its samples and unlearn. With one, each task's
    /// single demo is gold or imperfect by chance and the model memorises which tasks to
    /// answer early; its sampled episodes on those never explore the rest of the work.
    pub variants_per_question: usize,
    /// Seed of the imperfections (independent of the generator's own seed stream).
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

impl DemoConfig {
    /// A random source for the imperfections (its own stream of `seed`).
    pub fn rng(&self) -> WorldRng {
        WorldRng::new(self.seed, 2)
    }

    /// Variants per task (at least one).
    pub fn variants(&self) -> usize {
        self.variants_per_question.max(1)
    }

    /// How many of one task's variants answer early: `floor(p * v)`, plus one more with
    /// probability equal to the remainder, so that one variant per task is a coin flip at `p`.
    pub fn early_variants(&self, rng: &mut WorldRng) -> usize {
        let p = self.early_wrong_answer_prob.clamp(0.0, 1.0);
        let expected = p * self.variants() as f64;
        let mut wrong = expected.floor() as usize;
        if rng.chance(expected - expected.floor()) {
            wrong += 1;
        }
        wrong
    }
}

/// A tool call made by a demonstration turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DemoCall {
    /// The tool's name.
    pub tool: String,
    /// Its arguments, as the model writes them.
    pub arguments: Value,
}

impl DemoCall {
    /// A string argument (`""` when absent or not a string).
    pub fn str_arg(&self, key: &str) -> &str {
        self.arguments
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// The call in the hermes format Qwen models write (Python `json.dumps` spacing):
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.
    pub fn hermes(&self) -> String {
        format!(
            "<tool_call>\n{{\"name\": {}, \"arguments\": {}}}\n</tool_call>",
            Value::String(self.tool.clone()),
            python_json(&self.arguments)
        )
    }
}

/// One assistant turn of a demonstration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DemoTurn {
    /// The assistant text, exactly as the model should write it.
    pub assistant: String,
    /// The tool call of this turn (`None` for the final answer turn).
    pub call: Option<DemoCall>,
}

impl DemoTurn {
    /// `<think>{think}</think>\n` and the call.
    pub fn calling(think: &str, call: DemoCall) -> Self {
        Self {
            assistant: format!("<think>{think}</think>\n{}", call.hermes()),
            call: Some(call),
        }
    }

    /// `<think>{think}</think>\n<answer>{answer}</answer>`.
    pub fn answering(think: &str, answer: &str) -> Self {
        Self {
            assistant: format!("<think>{think}</think>\n<answer>{answer}</answer>"),
            call: None,
        }
    }
}

/// A demonstration for one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Demo {
    /// The task's id.
    pub task_id: String,
    /// Assistant turns in order; all but the last call a tool.
    pub turns: Vec<DemoTurn>,
    /// Whether the final answer is the gold answer.
    pub correct: bool,
}

impl Demo {
    /// The whole conversation: `prefix` (system prompt and question), then each assistant
    /// turn followed, for a calling turn, by one tool message with `observe(call)`.
    pub fn messages(
        &self,
        prefix: Vec<Message>,
        mut observe: impl FnMut(&DemoCall) -> String,
    ) -> Vec<Message> {
        let mut out = prefix;
        for turn in &self.turns {
            out.push(Message::assistant(turn.assistant.clone()));
            if let Some(call) = &turn.call {
                out.push(Message::tool(observe(call)));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn calls_are_written_as_qwen_writes_them() {
        let call = DemoCall {
            tool: "calculator".into(),
            arguments: json!({"expression": "3 + 4"}),
        };
        assert_eq!(
            call.hermes(),
            "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"3 + 4\"}}\n</tool_call>"
        );
        assert_eq!(call.str_arg("expression"), "3 + 4");
        assert_eq!(call.str_arg("query"), "");
    }

    #[test]
    fn early_variants_are_the_share_of_the_variants() {
        let config = DemoConfig {
            early_wrong_answer_prob: 0.6,
            variants_per_question: 5,
            seed: 1,
        };
        let mut rng = config.rng();
        assert!((0..20).all(|_| config.early_variants(&mut rng) == 3));
        let none = DemoConfig::default();
        assert_eq!(none.early_variants(&mut none.rng()), 0);
    }
}
