//! Parity with the official HotpotQA evaluator: `fixtures/data/answer_cases.json` holds the
//! outputs of `hotpot_evaluate_v1.py`'s functions (see `make_answer_cases.py`).

use agent_r1_envs::reward::hotpotqa::{exact_match, f1_score};
use agent_r1_envs::reward::normalize_answer;

#[derive(serde::Deserialize)]
struct Case {
    prediction: String,
    gold: String,
    norm_prediction: String,
    norm_gold: String,
    em: f64,
    f1: f64,
    precision: f64,
    recall: f64,
}

fn cases() -> Vec<Case> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/data/answer_cases.json"
    );
    let text = std::fs::read_to_string(path).expect("fixture");
    serde_json::from_str(&text).expect("fixture JSON")
}

#[test]
fn normalize_answer_matches_python() {
    let cases = cases();
    assert!(cases.len() >= 25);
    for c in &cases {
        assert_eq!(
            normalize_answer(&c.prediction),
            c.norm_prediction,
            "{:?}",
            c.prediction
        );
        assert_eq!(normalize_answer(&c.gold), c.norm_gold, "{:?}", c.gold);
    }
}

#[test]
fn em_and_f1_match_python() {
    for c in cases() {
        let em = if exact_match(&c.prediction, &c.gold) {
            1.0
        } else {
            0.0
        };
        assert_eq!(em, c.em, "em {:?} vs {:?}", c.prediction, c.gold);
        let (f1, p, r) = f1_score(&c.prediction, &c.gold);
        for (mine, theirs, name) in [
            (f1, c.f1, "f1"),
            (p, c.precision, "precision"),
            (r, c.recall, "recall"),
        ] {
            assert!(
                (mine - theirs).abs() < 1e-12,
                "{name} {:?} vs {:?}: {mine} != {theirs}",
                c.prediction,
                c.gold
            );
        }
    }
}
