//! Sizes and mix of a synthetic world.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How big a world to generate and which questions to ask about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SyntheticConfig {
    /// Seed: the same seed gives the same world, questions and split everywhere.
    pub seed: u64,
    /// Number of countries (at least 2).
    pub n_countries: usize,
    /// Number of cities (at least `n_countries`).
    pub n_cities: usize,
    /// Number of people (at least 1).
    pub n_people: usize,
    /// Number of companies (at least 1).
    pub n_companies: usize,
    /// Number of questions, train and test together (fewer when the world cannot provide
    /// that many distinct ones).
    pub n_questions: usize,
    /// Fraction of 3-hop questions; the rest are 2-hop.
    pub three_hop_fraction: f64,
    /// Fraction of questions in the test split.
    pub test_fraction: f64,
}

impl Default for SyntheticConfig {
    fn default() -> Self {
        Self {
            seed: 0,
            n_countries: 8,
            n_cities: 30,
            n_people: 120,
            n_companies: 80,
            n_questions: 400,
            three_hop_fraction: 0.4,
            test_fraction: 0.2,
        }
    }
}

impl SyntheticConfig {
    /// Checks the sizes and fractions.
    pub fn validate(&self) -> Result<()> {
        let bad = |key: &str, message: &str| Error::Config {
            key: format!("synthetic.{key}"),
            message: message.to_string(),
        };
        if self.n_countries < 2 {
            return Err(bad("n_countries", "must be at least 2"));
        }
        if self.n_cities < self.n_countries {
            return Err(bad(
                "n_cities",
                "must be at least n_countries (every country has a city)",
            ));
        }
        if self.n_people == 0 || self.n_companies == 0 {
            return Err(bad(
                "n_people",
                "n_people and n_companies must be at least 1",
            ));
        }
        if self.n_countries + self.n_cities + self.n_people + self.n_companies > 1_000_000 {
            return Err(bad("n_people", "at most 1,000,000 entities in all"));
        }
        if !(0.0..=1.0).contains(&self.three_hop_fraction) {
            return Err(bad("three_hop_fraction", "must be in [0, 1]"));
        }
        if !(0.0..1.0).contains(&self.test_fraction) {
            return Err(bad("test_fraction", "must be in [0, 1)"));
        }
        Ok(())
    }
}
