//! `synthetic_multihop`: multi-hop QA over a generated world (see [`crate::synthetic`]).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::corpus::CorpusSpec;
use super::multihop_qa::{MultihopQaEnv, MultihopQaOptions, QaOptions};
use super::options::{check_option_keys, parse_options};
use crate::demo::{Demo, DemoConfig};
use crate::env::{Env, Score};
use crate::error::Result;
use crate::generated_env::GeneratedEnv;
use crate::message::Message;
use crate::synthetic::{demos, Split, SyntheticConfig, SyntheticWorld};
use crate::task::Task;
use crate::tool::CallOutcome;

/// Registry name.
pub const NAME: &str = "synthetic_multihop";

/// Options of `synthetic_multihop`: the world, where to write its corpus, and the QA settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SyntheticMultihopOptions {
    /// The world to generate.
    #[serde(default)]
    pub world: SyntheticConfig,
    /// Where to write the corpus JSONL for the `search` tool (not written when `None`).
    #[serde(default)]
    pub corpus_path: Option<PathBuf>,
    /// The QA settings.
    #[serde(flatten)]
    pub qa: QaOptions,
}

/// Multi-hop QA over a seeded synthetic world.
#[derive(Debug, Clone)]
pub struct SyntheticMultihopEnv {
    inner: MultihopQaEnv,
    world: SyntheticWorld,
}

impl SyntheticMultihopEnv {
    /// Generates the world and, if `corpus_path` is set, writes its corpus there.
    pub fn new(options: SyntheticMultihopOptions) -> Result<Self> {
        let world = SyntheticWorld::generate(&options.world)?;
        if let Some(path) = &options.corpus_path {
            world.write_corpus(path)?;
        }
        let inner = MultihopQaEnv::named(
            NAME,
            MultihopQaOptions {
                qa: options.qa,
                corpus: options.corpus_path.map(CorpusSpec::Jsonl),
            },
        )?;
        Ok(Self { inner, world })
    }

    /// Builds from registry options; unknown keys are errors.
    pub fn from_options(options: &Value) -> Result<Self> {
        check_option_keys::<SyntheticMultihopOptions>(NAME, options)?;
        Self::new(parse_options(NAME, options)?)
    }

    /// The generated world and its questions.
    pub fn world(&self) -> &SyntheticWorld {
        &self.world
    }

    /// The corpus the `search` tool should index (set when `corpus_path` was given).
    pub fn corpus(&self) -> Option<&CorpusSpec> {
        self.inner.corpus()
    }
}

impl Env for SyntheticMultihopEnv {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn tool_names(&self) -> Vec<String> {
        self.inner.tool_names()
    }

    fn reset(&self, task: &Task) -> Result<Vec<Message>> {
        self.inner.reset(task)
    }

    fn max_observation_chars(&self) -> usize {
        self.inner.max_observation_chars()
    }

    fn step_reward(&self, task: &Task, outcomes: &[CallOutcome]) -> f64 {
        self.inner.step_reward(task, outcomes)
    }

    fn score(&self, task: &Task, transcript: &[Message]) -> Score {
        self.inner.score(task, transcript)
    }
}

impl GeneratedEnv for SyntheticMultihopEnv {
    fn tasks(&self, split: Split) -> Vec<Task> {
        self.world.tasks(split)
    }

    fn demonstrations(&self, config: &DemoConfig) -> Vec<Demo> {
        let questions: Vec<_> = self
            .world
            .questions(Split::Train)
            .into_iter()
            .cloned()
            .collect();
        demos(&self.world.world, &questions, config)
    }

    fn tokenizer_text(&self) -> String {
        self.world.corpus_text()
    }

    fn whole_words(&self) -> Vec<String> {
        self.world
            .world
            .entities
            .iter()
            .map(|e| e.name.clone())
            .collect()
    }
}
