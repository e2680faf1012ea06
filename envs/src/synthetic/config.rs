//! Sizes and mix of a synthetic world.

use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, Section};

/// How big a world to generate and which questions to ask about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SyntheticConfig {
    /// Seed: the same seed gives the same world, questions and split everywhere.
    pub seed: u64,
    /// Number of countries (at least 2).
    #[schemars(range(min = 2, max = 1000000))]
    pub n_countries: usize,
    /// Number of cities (at least `n_countries`).
    #[schemars(range(max = 1000000))]
    pub n_cities: usize,
    /// Number of people (at least 1).
    #[schemars(range(min = 1, max = 1000000))]
    pub n_people: usize,
    /// Number of companies (at least 1).
    #[schemars(range(min = 1, max = 1000000))]
    pub n_companies: usize,
    /// Number of questions, train and test together (fewer when the world cannot provide
    /// that many distinct ones).
    pub n_questions: usize,
    /// Fraction of 3-hop questions; the rest are 2-hop.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub three_hop_fraction: f64,
    /// Fraction of questions in the test split.
    #[schemars(range(min = 0.0), extend("exclusiveMaximum" = 1))]
    pub test_fraction: f64,
    /// Sentences of background added to every document after its facts (0: none). They
    /// name no other entity, so they change no answer; they make search results long, for
    /// agents whose history outgrows their context (the long-horizon variant). Drawn from
    /// their own random stream: the entities, facts and questions do not depend on it.
    #[schemars(range(max = 64))]
    pub document_filler: usize,
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
            document_filler: 0,
        }
    }
}

impl Section for SyntheticConfig {
    fn rules(&self) -> Result<(), ConfigError> {
        if self.n_cities < self.n_countries {
            return Err(ConfigError::range(
                "n_cities",
                self.n_cities,
                format!(
                    "at least n_countries ({}): every country has a city",
                    self.n_countries
                ),
            ));
        }
        if self.document_filler > 64 {
            return Err(ConfigError::range(
                "document_filler",
                self.document_filler,
                "at most 64 sentences per document",
            ));
        }
        let entities = self.n_countries + self.n_cities + self.n_people + self.n_companies;
        if entities > 1_000_000 {
            return Err(ConfigError::range(
                "n_people",
                format!("{entities} entities in all"),
                "at most 1,000,000 entities in all",
            ));
        }
        Ok(())
    }
}
