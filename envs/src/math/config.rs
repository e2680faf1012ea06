//! How many math problems to generate, and how big their numbers are.

use serde::{Deserialize, Serialize};

use crate::config::Section;

/// The generator's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MathConfig {
    /// Seed: the same seed gives the same problems and split everywhere.
    pub seed: u64,
    /// Number of problems, train and test together (fewer when the templates cannot
    /// provide that many distinct ones).
    #[schemars(range(min = 1, max = 100000))]
    pub n_problems: usize,
    /// Fraction of the problems in the test split.
    #[schemars(range(min = 0.0), extend("exclusiveMaximum" = 1))]
    pub test_fraction: f64,
    /// Largest number in a sum or difference (at least 10); factors of products stay at
    /// most 12, so answers are at most a few thousand.
    #[schemars(range(min = 10, max = 1000000))]
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

impl Section for MathConfig {}
