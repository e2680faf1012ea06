//! `synthetic_multihop`: a seeded, made-up world with multi-hop questions, its search corpus,
//! tokenizer text and demonstrations.
//!
//! The world has countries, cities, people and companies linked by functional facts
//! (founded by, based in, born in, located in, capital). Each entity has a 1-3 sentence
//! document that names it, so a BM25 search on the name finds it. Questions chain 2 or 3
//! facts and name only the first entity ("In which country was the founder of Zorvex Labs
//! born?"), so the agent must search for the bridge entities it discovers. The same seed
//! gives the same world, questions, split and demos on every platform (ChaCha8).

pub mod config;
pub mod demo;
pub mod entity_kind;
pub mod names;
pub mod questions;
pub mod rng;
pub mod world;

use std::path::Path;

pub use config::SyntheticConfig;
pub use demo::{demos, gold_demo, Demo, DemoConfig, DemoTurn};
pub use questions::{Hop, Question, Split};
pub use world::{Document, Entity, EntityKind, Relation, World};

use crate::error::Result;
use crate::message::Message;
use crate::task::Task;

/// The `data_source` of synthetic tasks.
pub const DATA_SOURCE: &str = "synthetic_multihop";

/// A world with its questions.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticWorld {
    /// Entities, facts and documents.
    pub world: World,
    /// All questions, train and test, in a seeded order.
    pub questions: Vec<Question>,
}

impl SyntheticWorld {
    /// Generates the world and its questions.
    pub fn generate(config: &SyntheticConfig) -> Result<Self> {
        let world = World::generate(config)?;
        let questions = questions::generate_questions(&world);
        Ok(Self { world, questions })
    }

    /// The questions of one split.
    pub fn questions(&self, split: Split) -> Vec<&Question> {
        self.questions.iter().filter(|q| q.split == split).collect()
    }

    /// The question with this task id.
    pub fn question(&self, task_id: &str) -> Option<&Question> {
        self.questions.iter().find(|q| q.id == task_id)
    }

    /// The tasks of one split (`extra` holds split, template, hop count and chain).
    pub fn tasks(&self, split: Split) -> Vec<Task> {
        self.questions(split)
            .into_iter()
            .map(|q| self.task(q))
            .collect()
    }

    fn task(&self, q: &Question) -> Task {
        let chain: Vec<&str> = q
            .hops
            .iter()
            .map(|h| h.subject.as_str())
            .chain(std::iter::once(q.answer.as_str()))
            .collect();
        Task {
            id: q.id.clone(),
            data_source: DATA_SOURCE.to_string(),
            question: q.text.clone(),
            answers: vec![q.answer.clone()],
            prompt: None,
            extra: serde_json::json!({
                "split": q.split.as_str(),
                "template": q.template,
                "hops": q.hops.len(),
                "chain": chain,
                "seed": self.world.config.seed,
            }),
        }
    }

    /// Writes the search corpus (JSONL of `{"id", "title", "text"}`).
    pub fn write_corpus(&self, path: &Path) -> Result<()> {
        self.world.write_corpus(path)
    }

    /// A stand-in for the search tool, for demos and tests: the `top_k` documents sharing
    /// the most words with `query` (an exact title match first), as numbered lines
    /// `Doc 1 (Title: ...) text`.
    pub fn observe(&self, query: &str, top_k: usize) -> String {
        let words: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
        let q = query.trim().to_lowercase();
        let mut scored: Vec<(usize, usize)> = self
            .world
            .documents
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let hay = format!("{} {}", d.title, d.text).to_lowercase();
                let overlap = words.iter().filter(|w| hay.contains(w.as_str())).count();
                let title_bonus = if d.title.to_lowercase() == q { 100 } else { 0 };
                (overlap + title_bonus, i)
            })
            .filter(|(s, _)| *s > 0)
            .collect();
        scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        scored
            .iter()
            .take(top_k)
            .enumerate()
            .filter_map(|(rank, (_, i))| {
                self.world
                    .documents
                    .get(*i)
                    .map(|d| format!("Doc {} (Title: {}) {}", rank + 1, d.title, d.text))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Plain text to train a tokenizer on: every document, every question, and every
    /// training demo rendered with the chat/tool vocabulary (`<think>`, `<tool_call>`,
    /// `<tool_response>`, `<answer>`, the `search` call JSON).
    pub fn corpus_text(&self) -> String {
        let mut out = String::new();
        out.push_str("<think> </think> <tool_call> </tool_call> <tool_response> </tool_response> <answer> </answer>\n");
        out.push_str("{\"name\": \"search\", \"arguments\": {\"query\": \"\"}}\n");
        for d in &self.world.documents {
            out.push_str(&format!("{}\n{}\n", d.title, d.text));
        }
        for q in &self.questions {
            out.push_str(&q.text);
            out.push('\n');
        }
        for q in self.questions(Split::Train) {
            let demo = gold_demo(q);
            for m in demo.messages(vec![Message::user(q.text.clone())], |call| {
                self.observe(call.str_arg("query"), 3)
            }) {
                match m.role {
                    crate::message::Role::Tool => out.push_str(&format!(
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
