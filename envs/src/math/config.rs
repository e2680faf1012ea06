//! How many math problems to generate, and how big their numbers are.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The generator's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MathConfig {
    /// Seed: the same seed gives the same problems and split everywhere.
    pub seed: u64,
    /// Number of problems, train and test together (fewer when the templates cannot
    /// provide that many distinct ones).
    pub n_problems: usize,
    /// Fraction of the problems in the test split.
    pub test_fraction: f64,
    /// Largest number in a sum or difference (at least 10); factors of products stay at
    /// most 12, so answers are at most a few thousand.
    pub max_number: u32,
}

impl Default for MathConfig {
    fn default() -> Self {
        Self {
            seed: 0,
            n_problems: 400,
            test_fraction: 0.2,
            max_number: 60,
        }
    }
}

impl MathConfig {
    /// Checks the ranges; errors name the key (`env.problems.KEY`, which `train` reports as
    /// `env.options.problems.KEY`).
    pub fn validate(&self) -> Result<()> {
        let bad = |key: &str, value: String, allowed: &str| Error::Config {
            key: format!("env.problems.{key}"),
            message: format!("got {value}; allowed: {allowed}"),
        };
        if !(1..=100_000).contains(&self.n_problems) {
            return Err(bad(
                "n_problems",
                self.n_problems.to_string(),
                "1 to 100000",
            ));
        }
        if !(0.0..1.0).contains(&self.test_fraction) {
            return Err(bad(
                "test_fraction",
                self.test_fraction.to_string(),
                "[0, 1)",
            ));
        }
        if !(10..=1_000_000).contains(&self.max_number) {
            return Err(bad(
                "max_number",
                self.max_number.to_string(),
                "10 to 1000000",
            ));
        }
        Ok(())
    }
}
