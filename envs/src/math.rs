//! `synthetic_math`: seeded arithmetic word problems, their worked calculator solutions and
//! tokenizer text.
//!
//! A problem is one of a few templates ("Ada has 17 apples. She buys 25 more and then gives
//! away 8. How many apples does Ada have now?") filled with names, items and numbers, with
//! the expression that solves it (`17 + 25 - 8`) and its integer answer. Every answer is
//! an integer, so a numeric match is exact. The same seed gives the same problems, split and
//! demos on every platform (ChaCha8, like the multi-hop world).

pub mod config;
pub mod demo;
pub mod problems;

pub use config::MathConfig;
pub use demo::{gold_demo, math_demos};
pub use problems::{generate_problems, Problem};

use crate::error::Result;
use crate::message::Role;
use crate::task::{Split, Task};
use crate::tools::calculator::{evaluate, format_value};

/// The `data_source` of generated math tasks.
pub const DATA_SOURCE: &str = "synthetic_math";

/// The generated problems.
#[derive(Debug, Clone, PartialEq)]
pub struct MathWorld {
    /// What was generated.
    pub config: MathConfig,
    /// All problems, train and test, in a seeded order.
    pub problems: Vec<Problem>,
}

impl MathWorld {
    /// Generates the problems of `config` (validated first).
    pub fn generate(config: &MathConfig) -> Result<Self> {
        crate::config::Section::validate(config).map_err(|e| e.under("env.problems"))?;
        Ok(Self {
            config: config.clone(),
            problems: generate_problems(config),
        })
    }

    /// The problems of one split.
    pub fn problems(&self, split: Split) -> Vec<&Problem> {
        self.problems.iter().filter(|p| p.split == split).collect()
    }

    /// The tasks of one split (`extra` holds split, template and expression).
    pub fn tasks(&self, split: Split) -> Vec<Task> {
        self.problems(split)
            .into_iter()
            .map(|p| Task {
                id: p.id.clone(),
                data_source: DATA_SOURCE.to_string(),
                question: p.text.clone(),
                answers: vec![p.answer.to_string()],
                prompt: None,
                extra: serde_json::json!({
                    "split": p.split.as_str(),
                    "template": p.template,
                    "expression": p.expression,
                    "seed": self.config.seed,
                }),
            })
            .collect()
    }

    /// Plain text to train a tokenizer on: every problem, and every training problem's gold
    /// solution with the calculator's real answers.
    pub fn tokenizer_text(&self) -> String {
        let mut out = String::new();
        out.push_str("<think> </think> <tool_call> </tool_call> <tool_response> </tool_response> <answer> </answer>\n");
        for p in &self.problems {
            out.push_str(&p.text);
            out.push('\n');
        }
        for p in self.problems(Split::Train) {
            for m in gold_demo(p).messages(Vec::new(), |call| calculate(call.str_arg("expression")))
            {
                match m.role {
                    Role::Tool => out.push_str(&format!(
                        "<tool_response>\n{}\n</tool_response>\n",
                        m.content
                    )),
                    _ => {
                        out.push_str(&m.content);
                        out.push('\n');
                    }
                }
            }
        }
        out
    }
}

/// Most numbers a tokenizer keeps whole (see [`MathWorld::whole_numbers`]).
const MAX_WHOLE_NUMBERS: i64 = 1000;

impl MathWorld {
    /// The numbers `0..=n` as words for a tokenizer to keep whole, `n` the largest number a
    /// problem, its expression, its answer or a demonstration's slip (the answer + 9) uses,
    /// at most 999. Why: a byte-level tokenizer splits numbers into digits, and copying a
    /// digit sequence from the question into the call and from the result into the answer
    /// is far harder for a tiny model than copying one token (the multi-hop world keeps its
    /// entity names whole for the same reason). Real tokenizers are unaffected: this only
    /// shapes a preset model's tokenizer trained for this env.
    pub fn whole_numbers(&self) -> Vec<String> {
        let largest = self
            .problems
            .iter()
            .flat_map(|p| {
                p.text
                    .split(|c: char| !c.is_ascii_digit())
                    .filter_map(|n| n.parse::<i64>().ok())
                    .chain([p.answer + 9])
            })
            .max()
            .unwrap_or(0);
        (0..=largest.min(MAX_WHOLE_NUMBERS - 1))
            .map(|n| n.to_string())
            .collect()
    }
}

/// What the `calculator` tool answers for `expression` (its error text when it fails).
pub fn calculate(expression: &str) -> String {
    match evaluate(expression) {
        Ok(v) => format_value(&v),
        Err(e) => format!("Error: {e}"),
    }
}
