//! `synthetic_math`: the `math` env over generated word problems (see [`crate::math`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::math::{MathEnv, MathOptions};
use super::options::{check_option_keys, parse_options};
use crate::demo::{Demo, DemoConfig};
use crate::env::{Env, Score};
use crate::error::Result;
use crate::generated_env::GeneratedEnv;
use crate::math::{math_demos, MathConfig, MathWorld};
use crate::message::Message;
use crate::task::{Split, Task};

/// Registry name.
pub const NAME: &str = "synthetic_math";

/// Options of `synthetic_math`: the generator (`problems`) and the `math` settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SyntheticMathOptions {
    /// The problems to generate (`[env.options.problems]`).
    #[serde(default)]
    pub problems: MathConfig,
    /// The math settings.
    #[serde(flatten)]
    pub math: MathOptions,
}

/// Math word problems from a seeded generator.
#[derive(Debug, Clone)]
pub struct SyntheticMathEnv {
    inner: MathEnv,
    world: MathWorld,
}

impl SyntheticMathEnv {
    /// Generates the problems.
    pub fn new(options: SyntheticMathOptions) -> Result<Self> {
        Ok(Self {
            world: MathWorld::generate(&options.problems)?,
            inner: MathEnv::named(NAME, options.math)?,
        })
    }

    /// Builds from registry options; unknown keys are errors.
    pub fn from_options(options: &Value) -> Result<Self> {
        check_option_keys::<SyntheticMathOptions>(NAME, options)?;
        Self::new(parse_options(NAME, options)?)
    }

    /// The generated problems.
    pub fn world(&self) -> &MathWorld {
        &self.world
    }
}

impl Env for SyntheticMathEnv {
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

    fn score(&self, task: &Task, transcript: &[Message]) -> Score {
        self.inner.score(task, transcript)
    }
}

impl GeneratedEnv for SyntheticMathEnv {
    fn tasks(&self, split: Split) -> Vec<Task> {
        self.world.tasks(split)
    }

    fn demonstrations(&self, config: &DemoConfig) -> Vec<Demo> {
        math_demos(&self.world.problems(Split::Train), config)
    }

    fn tokenizer_text(&self) -> String {
        self.world.tokenizer_text()
    }

    fn whole_words(&self) -> Vec<String> {
        self.world.whole_numbers()
    }
}
