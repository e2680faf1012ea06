//! The synthetic world: countries, cities, people and companies, the facts that link them,
//! and one short document per entity.

use serde::{Deserialize, Serialize};

use super::config::SyntheticConfig;
use super::names::NameGen;
use super::rng::WorldRng;
use crate::error::{Error, Result};

pub use super::entity_kind::EntityKind;

/// A relation between two entities; every relation is a function (one object per subject).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    /// Company -> person who founded it.
    FoundedBy,
    /// Company -> city it is based in.
    BasedIn,
    /// Person -> city of birth.
    BornIn,
    /// City -> country it is in.
    LocatedIn,
    /// Country -> capital city.
    CapitalIs,
}

impl Relation {
    /// What the hop asks about `subject`, for the demo's reasoning ("who founded X").
    pub fn question_about(self, subject: &str) -> String {
        match self {
            Relation::FoundedBy => format!("who founded {subject}"),
            Relation::BasedIn => format!("where {subject} is based"),
            Relation::BornIn => format!("where {subject} was born"),
            Relation::LocatedIn => format!("which country {subject} is in"),
            Relation::CapitalIs => format!("what the capital of {subject} is"),
        }
    }

    /// The fact as a clause ("X was founded by Y").
    pub fn fact(self, subject: &str, object: &str) -> String {
        match self {
            Relation::FoundedBy => format!("{subject} was founded by {object}"),
            Relation::BasedIn => format!("{subject} is based in {object}"),
            Relation::BornIn => format!("{subject} was born in {object}"),
            Relation::LocatedIn => format!("{subject} is in {object}"),
            Relation::CapitalIs => format!("the capital of {subject} is {object}"),
        }
    }
}

/// The random stream of the documents' filler sentences (world 0, questions 1, demos 2).
const FILLER_STREAM: u64 = 3;

/// One background sentence that names no entity ("The old market is known for its quiet
/// harbour.").
fn filler_sentence(rng: &mut WorldRng) -> String {
    const WHAT: [&str; 12] = [
        "market", "harbour", "library", "bridge", "festival", "museum", "garden", "school",
        "railway", "theatre", "mill", "square",
    ];
    const LIKE: [&str; 10] = [
        "old", "busy", "quiet", "famous", "small", "large", "new", "green", "stone", "river",
    ];
    const DOES: [&str; 8] = [
        "is known for its",
        "was rebuilt near its",
        "is often compared with its",
        "draws visitors to its",
        "holds a yearly event at its",
        "is proud of its",
        "has records of its",
        "is described in guides with its",
    ];
    let mut pick = |items: &[&'static str]| items[rng.index(items.len())];
    let (a, b, c, d, e) = (
        pick(&LIKE),
        pick(&WHAT),
        pick(&DOES),
        pick(&LIKE),
        pick(&WHAT),
    );
    format!("The {a} {b} {c} {d} {e}.")
}

/// One entity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entity {
    /// Index into [`World::entities`].
    pub index: usize,
    /// Kind.
    pub kind: EntityKind,
    /// Unique name (also the title of its document).
    pub name: String,
}

/// A document of the search corpus: one per entity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Document {
    /// Stable id (`doc-<entity index>`).
    pub id: String,
    /// The entity's name.
    pub title: String,
    /// One to three sentences stating the entity's facts.
    pub text: String,
}

/// A generated world. Everything in it follows from [`SyntheticConfig`] alone.
#[derive(Debug, Clone, PartialEq)]
pub struct World {
    /// The configuration it was generated from.
    pub config: SyntheticConfig,
    /// All entities: countries, then cities, people, companies.
    pub entities: Vec<Entity>,
    /// Facts as `(subject, relation, object)` entity indices, in generation order.
    pub facts: Vec<(usize, Relation, usize)>,
    /// One document per entity, in entity order.
    pub documents: Vec<Document>,
}

impl World {
    /// Generates the entities, facts and documents for `config`.
    pub fn generate(config: &SyntheticConfig) -> Result<World> {
        crate::config::Section::validate(config).map_err(|e| e.under("synthetic"))?;
        let mut rng = WorldRng::new(config.seed, 0);
        let mut names = NameGen::default();
        let mut entities = Vec::new();
        let mut add = |kind: EntityKind, count: usize, rng: &mut WorldRng| -> Vec<usize> {
            (0..count)
                .map(|_| {
                    let index = entities.len();
                    entities.push(Entity {
                        index,
                        kind,
                        name: names.name(rng, kind),
                    });
                    index
                })
                .collect()
        };
        let countries = add(EntityKind::Country, config.n_countries, &mut rng);
        let cities = add(EntityKind::City, config.n_cities, &mut rng);
        let people = add(EntityKind::Person, config.n_people, &mut rng);
        let companies = add(EntityKind::Company, config.n_companies, &mut rng);

        let mut facts = Vec::new();
        // Every country gets at least one city; its first city is its capital.
        let mut city_country = Vec::with_capacity(cities.len());
        for (i, &city) in cities.iter().enumerate() {
            let country = if i < countries.len() {
                countries[i]
            } else {
                countries[rng.index(countries.len())]
            };
            city_country.push(country);
            facts.push((city, Relation::LocatedIn, country));
        }
        for (i, &country) in countries.iter().enumerate() {
            facts.push((country, Relation::CapitalIs, cities[i]));
        }
        for &person in &people {
            facts.push((person, Relation::BornIn, cities[rng.index(cities.len())]));
        }
        // Founders are distinct people while there are enough of them.
        let mut founders = people.clone();
        rng.shuffle(&mut founders);
        for (i, &company) in companies.iter().enumerate() {
            let founder = match founders.get(i) {
                Some(&p) => p,
                None => people[rng.index(people.len())],
            };
            facts.push((company, Relation::FoundedBy, founder));
            facts.push((company, Relation::BasedIn, cities[rng.index(cities.len())]));
        }
        let mut world = World {
            config: config.clone(),
            entities,
            facts,
            documents: Vec::new(),
        };
        world.documents = (0..world.entities.len())
            .map(|e| world.document_for(e, &mut rng))
            .collect();
        if config.document_filler > 0 {
            let mut rng = WorldRng::new(config.seed, FILLER_STREAM);
            for doc in &mut world.documents {
                for _ in 0..config.document_filler {
                    doc.text.push(' ');
                    doc.text.push_str(&filler_sentence(&mut rng));
                }
            }
        }
        Ok(world)
    }

    /// The object of `relation` for `subject`, if it has one.
    pub fn object(&self, subject: usize, relation: Relation) -> Option<usize> {
        self.facts
            .iter()
            .find(|(s, r, _)| *s == subject && *r == relation)
            .map(|(_, _, o)| *o)
    }

    /// The subjects that have `relation` to `object` (e.g. companies founded by a person).
    pub fn subjects(&self, relation: Relation, object: usize) -> Vec<usize> {
        self.facts
            .iter()
            .filter(|(_, r, o)| *r == relation && *o == object)
            .map(|(s, _, _)| *s)
            .collect()
    }

    /// The name of entity `index` (empty for an index out of range).
    pub fn name(&self, index: usize) -> &str {
        self.entities
            .get(index)
            .map(|e| e.name.as_str())
            .unwrap_or("")
    }

    /// Indices of all entities of `kind`.
    pub fn of_kind(&self, kind: EntityKind) -> Vec<usize> {
        self.entities
            .iter()
            .filter(|e| e.kind == kind)
            .map(|e| e.index)
            .collect()
    }

    /// The document of the entity whose name is `title` (exact, case-insensitive).
    pub fn document_by_title(&self, title: &str) -> Option<&Document> {
        let t = title.trim().to_lowercase();
        self.documents.iter().find(|d| d.title.to_lowercase() == t)
    }

    fn document_for(&self, e: usize, rng: &mut WorldRng) -> Document {
        let name = self.name(e);
        let obj = |r| {
            self.object(e, r)
                .map(|o| self.name(o).to_string())
                .unwrap_or_default()
        };
        let pick = |rng: &mut WorldRng, options: &[String]| {
            options
                .get(rng.index(options.len()))
                .cloned()
                .unwrap_or_default()
        };
        let kind = self
            .entities
            .get(e)
            .map(|x| x.kind)
            .unwrap_or(EntityKind::City);
        let text = match kind {
            EntityKind::Country => {
                let capital = obj(Relation::CapitalIs);
                pick(
                    rng,
                    &[
                        format!("{name} is a country. Its capital is {capital}."),
                        format!("{name} is a small country. The capital of {name} is {capital}."),
                    ],
                )
            }
            EntityKind::City => {
                let country = obj(Relation::LocatedIn);
                let mut s = pick(
                    rng,
                    &[
                        format!("{name} is a city in {country}."),
                        format!("{name} is a town located in {country}."),
                    ],
                );
                if self.object(
                    self.object(e, Relation::LocatedIn).unwrap_or(usize::MAX),
                    Relation::CapitalIs,
                ) == Some(e)
                {
                    s.push_str(&format!(" It is the capital of {country}."));
                }
                s
            }
            EntityKind::Person => {
                let city = obj(Relation::BornIn);
                let mut s = pick(
                    rng,
                    &[
                        format!("{name} was born in {city}."),
                        format!("{name} is a person who was born in {city}."),
                    ],
                );
                let founded: Vec<String> = self
                    .subjects(Relation::FoundedBy, e)
                    .into_iter()
                    .map(|c| self.name(c).to_string())
                    .collect();
                if !founded.is_empty() {
                    s.push_str(&format!(" {name} founded {}.", founded.join(" and ")));
                }
                s
            }
            EntityKind::Company => {
                let founder = obj(Relation::FoundedBy);
                let city = obj(Relation::BasedIn);
                pick(
                    rng,
                    &[
                        format!("{name} is a company founded by {founder}. It is based in {city}."),
                        format!("{name} was founded by {founder}. The company is based in {city}."),
                    ],
                )
            }
        };
        Document {
            id: format!("doc-{e}"),
            title: name.to_string(),
            text,
        }
    }

    /// Writes the documents as JSONL (`{"id", "title", "text"}` per line) for the search tool.
    pub fn write_corpus(&self, path: &std::path::Path) -> Result<()> {
        let mut out = String::new();
        for doc in &self.documents {
            let line = serde_json::to_string(doc)
                .map_err(|e| Error::Other(format!("cannot encode document: {e}")))?;
            out.push_str(&line);
            out.push('\n');
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        }
        std::fs::write(path, out).map_err(|e| Error::io(path, e))
    }
}
