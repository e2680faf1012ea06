//! The kinds of entities a generated world holds.

use serde::{Deserialize, Serialize};

/// Kinds of entities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntityKind {
    /// A country (has a capital city).
    Country,
    /// A city (located in a country).
    City,
    /// A person (born in a city).
    Person,
    /// A company (founded by a person, based in a city).
    Company,
}
