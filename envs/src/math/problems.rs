//! The problem templates and the seeded draw of problems from them.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::config::MathConfig;
use crate::synthetic::rng::WorldRng;
use crate::task::Split;

/// One word problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    /// Stable id (`math-{seed}-{index}`).
    pub id: String,
    /// The template it came from.
    pub template: &'static str,
    /// The problem as the model reads it.
    pub text: String,
    /// The arithmetic that solves it, as the `calculator` tool takes it.
    pub expression: String,
    /// The answer (an integer for every template).
    pub answer: i64,
    /// Train or test.
    pub split: Split,
}

const NAMES: [(&str, &str); 12] = [
    ("Ada", "She"),
    ("Ben", "He"),
    ("Cleo", "She"),
    ("Dan", "He"),
    ("Eva", "She"),
    ("Finn", "He"),
    ("Gia", "She"),
    ("Hugo", "He"),
    ("Ines", "She"),
    ("Jack", "He"),
    ("Kara", "She"),
    ("Leo", "He"),
];

const ITEMS: [&str; 10] = [
    "apples", "pencils", "books", "stickers", "marbles", "cookies", "cards", "stamps", "shells",
    "coins",
];

/// Largest factor of a product.
const MAX_FACTOR: u32 = 12;

/// The numbers and words one problem is filled with.
struct Draw {
    name: &'static str,
    pronoun: &'static str,
    items: &'static str,
    a: i64,
    b: i64,
    c: i64,
}

/// A template: its name and how it turns a draw into (text, expression, answer), or `None`
/// when the draw does not fit (a negative answer).
struct Template {
    name: &'static str,
    fill: fn(&Draw) -> Option<(String, String, i64)>,
}

const TEMPLATES: [Template; 7] = [
    Template {
        name: "add",
        fill: |d| {
            Some((
                format!(
                    "{n} has {a} {i}. {p} finds {b} more. How many {i} does {n} have now?",
                    n = d.name,
                    p = d.pronoun,
                    i = d.items,
                    a = d.a,
                    b = d.b
                ),
                format!("{} + {}", d.a, d.b),
                d.a + d.b,
            ))
        },
    },
    Template {
        name: "sub",
        fill: |d| {
            (d.a > d.b).then(|| {
                (
                    format!(
                        "{n} has {a} {i} and gives {b} of them to a friend. How many {i} does {n} have left?",
                        n = d.name, i = d.items, a = d.a, b = d.b
                    ),
                    format!("{} - {}", d.a, d.b),
                    d.a - d.b,
                )
            })
        },
    },
    Template {
        name: "mul",
        fill: |d| {
            let (boxes, each) = (small(d.a), small(d.b));
            Some((
                format!(
                    "{n} buys {x} boxes of {i}. Each box holds {y} {i}. How many {i} does {n} buy?",
                    n = d.name,
                    i = d.items,
                    x = boxes,
                    y = each
                ),
                format!("{boxes} * {each}"),
                boxes * each,
            ))
        },
    },
    Template {
        name: "div",
        fill: |d| {
            let (friends, each) = (small(d.a), small(d.b));
            let total = friends * each;
            Some((
                format!(
                    "{n} shares {t} {i} equally among {f} friends. How many {i} does each friend get?",
                    n = d.name, i = d.items, t = total, f = friends
                ),
                format!("{total} / {friends}"),
                each,
            ))
        },
    },
    Template {
        name: "add_sub",
        fill: |d| {
            let answer = d.a + d.b - d.c;
            (answer >= 0).then(|| {
                (
                    format!(
                        "{n} has {a} {i}. {p} buys {b} more and then gives away {c}. How many {i} does {n} have now?",
                        n = d.name, p = d.pronoun, i = d.items, a = d.a, b = d.b, c = d.c
                    ),
                    format!("{} + {} - {}", d.a, d.b, d.c),
                    answer,
                )
            })
        },
    },
    Template {
        name: "mul_add",
        fill: |d| {
            let (bags, each) = (small(d.a), small(d.b));
            Some((
                format!(
                    "{n} has {c} {i}. {p} buys {x} bags with {y} {i} in each bag. How many {i} does {n} have in all?",
                    n = d.name, p = d.pronoun, i = d.items, c = d.c, x = bags, y = each
                ),
                format!("{} + {bags} * {each}", d.c),
                d.c + bags * each,
            ))
        },
    },
    Template {
        name: "change",
        fill: |d| {
            let (count, price) = (small(d.a), small(d.b));
            let paid = count * price + d.c;
            Some((
                format!(
                    "{n} buys {x} {i} at {y} dollars each and pays with {z} dollars. How many dollars of change does {n} get?",
                    n = d.name, i = d.items, x = count, y = price, z = paid
                ),
                format!("{paid} - {count} * {price}"),
                d.c,
            ))
        },
    },
];

/// A factor of a product: `n` folded into 2..=MAX_FACTOR.
fn small(n: i64) -> i64 {
    2 + n.rem_euclid(i64::from(MAX_FACTOR) - 1)
}

/// Draws distinct problems (by text), round-robin over the templates so each is equally
/// common, then splits them: a seeded `test_fraction` of them are held out.
pub fn generate_problems(config: &MathConfig) -> Vec<Problem> {
    let mut rng = WorldRng::new(config.seed, 0);
    let max = i64::from(config.max_number);
    let number = |rng: &mut WorldRng| 2 + rng.index(max as usize - 1) as i64;
    let mut seen = BTreeSet::new();
    let mut drawn: Vec<(&'static str, String, String, i64)> = Vec::new();
    let mut misses = 0usize;
    let mut next = 0usize;
    while drawn.len() < config.n_problems && misses < 100 * config.n_problems + 1000 {
        let template = &TEMPLATES[next % TEMPLATES.len()];
        let (name, pronoun) = NAMES[rng.index(NAMES.len())];
        let draw = Draw {
            name,
            pronoun,
            items: ITEMS[rng.index(ITEMS.len())],
            a: number(&mut rng),
            b: number(&mut rng),
            c: number(&mut rng),
        };
        match (template.fill)(&draw) {
            Some((text, expression, answer)) if seen.insert(text.clone()) => {
                drawn.push((template.name, text, expression, answer));
                next += 1;
            }
            _ => misses += 1,
        }
    }
    let mut order: Vec<usize> = (0..drawn.len()).collect();
    WorldRng::new(config.seed, 1).shuffle(&mut order);
    let n_test = (drawn.len() as f64 * config.test_fraction).round() as usize;
    let test: BTreeSet<usize> = order.into_iter().take(n_test).collect();
    drawn
        .into_iter()
        .enumerate()
        .map(|(i, (template, text, expression, answer))| Problem {
            id: format!("math-{}-{i}", config.seed),
            template,
            text,
            expression,
            answer,
            split: if test.contains(&i) {
                Split::Test
            } else {
                Split::Train
            },
        })
        .collect()
}

/// Template names, in order.
pub fn template_names() -> Vec<&'static str> {
    TEMPLATES.iter().map(|t| t.name).collect()
}
