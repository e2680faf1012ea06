//! Made-up, pronounceable names: syllables of consonant clusters and vowels, with a suffix
//! per entity kind ("Valdoria", "Kestonburg", "Mira Tolan", "Zorvex Labs").

use std::collections::BTreeSet;

use super::entity_kind::EntityKind;
use super::rng::WorldRng;

const ONSETS: [&str; 20] = [
    "b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st",
    "tr", "sh",
];
const VOWELS: [&str; 7] = ["a", "e", "i", "o", "u", "ai", "ou"];
const CODAS: [&str; 6] = ["", "", "", "n", "r", "l"];
const COUNTRY_SUFFIXES: [&str; 5] = ["ia", "land", "stan", "ora", "ria"];
const CITY_SUFFIXES: [&str; 6] = ["", "ton", "burg", "ville", "port", "ford"];
const COMPANY_SUFFIXES: [&str; 7] = [
    "Labs",
    "Systems",
    "Works",
    "Industries",
    "Foods",
    "Motors",
    "Media",
];

/// Draws unique names.
#[derive(Debug, Default)]
pub struct NameGen {
    used: BTreeSet<String>,
}

fn capitalize(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

fn word(rng: &mut WorldRng, min_syllables: usize, max_syllables: usize) -> String {
    let n = min_syllables + rng.index(max_syllables - min_syllables + 1);
    let mut w = String::new();
    for i in 0..n {
        w.push_str(ONSETS[rng.index(ONSETS.len())]);
        w.push_str(VOWELS[rng.index(VOWELS.len())]);
        if i + 1 == n {
            w.push_str(CODAS[rng.index(CODAS.len())]);
        }
    }
    w
}

impl NameGen {
    /// A name for an entity of `kind` that no earlier call returned (case-insensitively).
    pub fn name(&mut self, rng: &mut WorldRng, kind: EntityKind) -> String {
        let mut attempt = 0usize;
        loop {
            let mut name = match kind {
                EntityKind::Country => capitalize(&format!(
                    "{}{}",
                    word(rng, 1, 2),
                    COUNTRY_SUFFIXES[rng.index(COUNTRY_SUFFIXES.len())]
                )),
                EntityKind::City => capitalize(&format!(
                    "{}{}",
                    word(rng, 2, 2),
                    CITY_SUFFIXES[rng.index(CITY_SUFFIXES.len())]
                )),
                EntityKind::Person => format!(
                    "{} {}",
                    capitalize(&word(rng, 2, 2)),
                    capitalize(&word(rng, 2, 3))
                ),
                EntityKind::Company => {
                    format!(
                        "{} {}",
                        capitalize(&word(rng, 2, 3)),
                        COMPANY_SUFFIXES[rng.index(COMPANY_SUFFIXES.len())]
                    )
                }
            };
            if attempt >= 100 {
                // A crowded name space: disambiguate instead of looping forever.
                name = format!("{name} {}", roman(attempt - 99));
            }
            if self.used.insert(name.to_lowercase()) {
                return name;
            }
            attempt += 1;
        }
    }
}

fn roman(n: usize) -> String {
    const TABLE: [(usize, &str); 7] = [
        (100, "C"),
        (90, "XC"),
        (50, "L"),
        (40, "XL"),
        (10, "X"),
        (9, "IX"),
        (5, "V"),
    ];
    let mut n = n;
    let mut out = String::new();
    for (value, digits) in TABLE {
        while n >= value {
            out.push_str(digits);
            n -= value;
        }
    }
    match n {
        4 => out.push_str("IV"),
        _ => out.push_str(&"I".repeat(n)),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_capitalised_and_ascii() {
        let mut gen = NameGen::default();
        let mut rng = WorldRng::new(5, 0);
        let mut seen = BTreeSet::new();
        for kind in [
            EntityKind::Country,
            EntityKind::City,
            EntityKind::Person,
            EntityKind::Company,
        ] {
            for _ in 0..200 {
                let n = gen.name(&mut rng, kind);
                assert!(
                    n.is_ascii() && n.chars().next().is_some_and(|c| c.is_ascii_uppercase()),
                    "{n}"
                );
                assert!(seen.insert(n.to_lowercase()), "duplicate {n}");
            }
        }
        assert_eq!(roman(14), "XIV");
    }
}
