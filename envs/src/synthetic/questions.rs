//! Multi-hop questions over a [`World`]: chains of functional relations where only the
//! first entity is named, so each hop needs a search for the entity the previous hop found.

use serde::{Deserialize, Serialize};

use super::rng::WorldRng;
use super::world::{EntityKind, Relation, World};

pub use crate::task::Split;

/// A question template: the start kind, the relation chain, and the wording.
struct Template {
    name: &'static str,
    start: EntityKind,
    chain: &'static [Relation],
    text: fn(&str) -> String,
}

const TEMPLATES: [Template; 7] = [
    Template {
        name: "founder_birthplace",
        start: EntityKind::Company,
        chain: &[Relation::FoundedBy, Relation::BornIn],
        text: |x| format!("Where was the founder of {x} born?"),
    },
    Template {
        name: "company_country",
        start: EntityKind::Company,
        chain: &[Relation::BasedIn, Relation::LocatedIn],
        text: |x| format!("In which country is {x} based?"),
    },
    Template {
        name: "person_country",
        start: EntityKind::Person,
        chain: &[Relation::BornIn, Relation::LocatedIn],
        text: |x| format!("In which country was {x} born?"),
    },
    Template {
        name: "city_capital",
        start: EntityKind::City,
        chain: &[Relation::LocatedIn, Relation::CapitalIs],
        text: |x| format!("What is the capital of the country where {x} is located?"),
    },
    Template {
        name: "founder_country",
        start: EntityKind::Company,
        chain: &[Relation::FoundedBy, Relation::BornIn, Relation::LocatedIn],
        text: |x| format!("In which country was the founder of {x} born?"),
    },
    Template {
        name: "person_capital",
        start: EntityKind::Person,
        chain: &[Relation::BornIn, Relation::LocatedIn, Relation::CapitalIs],
        text: |x| format!("What is the capital of the country where {x} was born?"),
    },
    Template {
        name: "company_capital",
        start: EntityKind::Company,
        chain: &[Relation::BasedIn, Relation::LocatedIn, Relation::CapitalIs],
        text: |x| format!("What is the capital of the country where {x} is based?"),
    },
];

/// One hop of a question: search `subject`, read `relation`, find `object`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hop {
    /// The entity searched for (its name is the query).
    pub subject: String,
    /// The relation read from its document.
    pub relation: Relation,
    /// The entity found.
    pub object: String,
}

/// A generated question with its gold answer and reasoning chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Question {
    /// Stable id (`synth-<seed>-<n>`).
    pub id: String,
    /// The question text (names only the first entity).
    pub text: String,
    /// The gold answer (an entity name).
    pub answer: String,
    /// Kind of the answer entity (a one-hop question's early answer in demos is of this kind).
    pub answer_kind: EntityKind,
    /// Template name (`founder_birthplace`, ...).
    pub template: String,
    /// The hops, in order; `hops.len()` is 2 or 3.
    pub hops: Vec<Hop>,
    /// Which split it belongs to.
    pub split: Split,
}

/// Every answerable question of the world, then a seeded pick of `n_questions` with the
/// configured hop mix, split into train and test by question text.
pub fn generate_questions(world: &World) -> Vec<Question> {
    let cfg = &world.config;
    let mut two = Vec::new();
    let mut three = Vec::new();
    for template in &TEMPLATES {
        for start in world.of_kind(template.start) {
            if let Some(q) = instantiate(world, template, start) {
                if q.hops.len() == 3 {
                    three.push(q);
                } else {
                    two.push(q);
                }
            }
        }
    }
    let mut rng = WorldRng::new(cfg.seed, 1);
    rng.shuffle(&mut two);
    rng.shuffle(&mut three);
    let want_three = ((cfg.n_questions as f64) * cfg.three_hop_fraction).round() as usize;
    let n_three = want_three.min(three.len());
    let n_two = (cfg.n_questions - n_three.min(cfg.n_questions)).min(two.len());
    let mut picked: Vec<Question> = three
        .into_iter()
        .take(n_three)
        .chain(two.into_iter().take(n_two))
        .collect();
    rng.shuffle(&mut picked);
    let n_test = ((picked.len() as f64) * cfg.test_fraction).round() as usize;
    for (i, q) in picked.iter_mut().enumerate() {
        q.id = format!("synth-{}-{i}", cfg.seed);
        q.split = if i < n_test {
            Split::Test
        } else {
            Split::Train
        };
    }
    picked
}

fn instantiate(world: &World, template: &Template, start: usize) -> Option<Question> {
    let mut hops = Vec::with_capacity(template.chain.len());
    let mut visited = vec![start];
    let mut current = start;
    for &relation in template.chain {
        let next = world.object(current, relation)?;
        // A chain that comes back to an entity it passed (a capital asked about from
        // itself) would be answerable in fewer hops: leave it out.
        if visited.contains(&next) {
            return None;
        }
        hops.push(Hop {
            subject: world.name(current).to_string(),
            relation,
            object: world.name(next).to_string(),
        });
        visited.push(next);
        current = next;
    }
    let answer_kind = world.entities.get(current)?.kind;
    Some(Question {
        id: String::new(),
        text: (template.text)(world.name(start)),
        answer: world.name(current).to_string(),
        answer_kind,
        template: template.name.to_string(),
        hops,
        split: Split::Train,
    })
}
