//! The official HotpotQA answer metrics (`hotpot_evaluate_v1.py`): exact match, F1,
//! precision and recall on normalised answers, and the whole-file answer evaluation.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::normalize::{normalize_answer, py_split_whitespace};
use crate::error::{Error, Result};

/// Normalised answers that only match themselves in F1 (`ZERO_METRIC` otherwise).
const SPECIAL_ANSWERS: [&str; 3] = ["yes", "no", "noanswer"];

/// Exact match, F1, precision and recall of one prediction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct AnswerScore {
    /// 1.0 when the normalised prediction equals the normalised gold.
    pub em: f64,
    /// Token-bag F1.
    pub f1: f64,
    /// Token-bag precision.
    pub precision: f64,
    /// Token-bag recall.
    pub recall: f64,
}

/// `exact_match_score`: whether the normalised strings are equal.
pub fn exact_match(prediction: &str, gold: &str) -> bool {
    normalize_answer(prediction) == normalize_answer(gold)
}

/// `f1_score`: `(f1, precision, recall)` on the bag of normalised tokens.
///
/// When either normalised side is `yes`, `no` or `noanswer` and the two differ, all three
/// are 0, as in the official evaluator.
pub fn f1_score(prediction: &str, gold: &str) -> (f64, f64, f64) {
    let pred = normalize_answer(prediction);
    let gold = normalize_answer(gold);
    if (SPECIAL_ANSWERS.contains(&pred.as_str()) || SPECIAL_ANSWERS.contains(&gold.as_str()))
        && pred != gold
    {
        return (0.0, 0.0, 0.0);
    }
    let pred_tokens: Vec<&str> = py_split_whitespace(&pred).collect();
    let gold_tokens: Vec<&str> = py_split_whitespace(&gold).collect();
    let mut gold_counts: HashMap<&str, usize> = HashMap::new();
    for token in &gold_tokens {
        *gold_counts.entry(token).or_default() += 1;
    }
    let mut num_same = 0usize;
    for token in &pred_tokens {
        if let Some(count) = gold_counts.get_mut(token) {
            if *count > 0 {
                *count -= 1;
                num_same += 1;
            }
        }
    }
    if num_same == 0 {
        return (0.0, 0.0, 0.0);
    }
    let precision = num_same as f64 / pred_tokens.len() as f64;
    let recall = num_same as f64 / gold_tokens.len() as f64;
    let f1 = 2.0 * precision * recall / (precision + recall);
    (f1, precision, recall)
}

/// EM and F1 of `prediction` against one gold answer.
pub fn score_answer(prediction: &str, gold: &str) -> AnswerScore {
    let (f1, precision, recall) = f1_score(prediction, gold);
    AnswerScore {
        em: if exact_match(prediction, gold) {
            1.0
        } else {
            0.0
        },
        f1,
        precision,
        recall,
    }
}

/// The best score over several accepted gold answers: the maximum EM, and the F1 triple of
/// the gold with the highest F1. No gold answers score 0.
pub fn best_score(prediction: &str, golds: &[String]) -> AnswerScore {
    let mut best = AnswerScore::default();
    for gold in golds {
        let score = score_answer(prediction, gold);
        best.em = best.em.max(score.em);
        if score.f1 > best.f1 {
            best.f1 = score.f1;
            best.precision = score.precision;
            best.recall = score.recall;
        }
    }
    best
}

/// The result of [`evaluate_answers`]: averages over *all* gold rows (a missing
/// prediction counts 0), as the official evaluator divides by the number of gold rows.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AnswerEval {
    /// Mean exact match.
    pub em: f64,
    /// Mean F1.
    pub f1: f64,
    /// Mean precision.
    pub precision: f64,
    /// Mean recall.
    pub recall: f64,
    /// Number of gold rows.
    pub n: usize,
    /// Ids of gold rows with no prediction, in gold order.
    pub missing: Vec<String>,
}

/// Scores predictions (`id -> answer text`) against gold rows (`(id, answer)`), the answer
/// half of `hotpot_evaluate_v1.eval`.
pub fn evaluate_answers(
    gold: &[(String, String)],
    predictions: &BTreeMap<String, String>,
) -> AnswerEval {
    let mut eval = AnswerEval {
        n: gold.len(),
        ..AnswerEval::default()
    };
    for (id, answer) in gold {
        match predictions.get(id) {
            None => eval.missing.push(id.clone()),
            Some(prediction) => {
                let score = score_answer(prediction, answer);
                eval.em += score.em;
                eval.f1 += score.f1;
                eval.precision += score.precision;
                eval.recall += score.recall;
            }
        }
    }
    if eval.n > 0 {
        let n = eval.n as f64;
        eval.em /= n;
        eval.f1 /= n;
        eval.precision /= n;
        eval.recall /= n;
    }
    eval
}

/// Reads a HotpotQA-format gold file (a JSON list of rows with `_id` and `answer`) and a
/// prediction file (`{"answer": {id: text, ...}, ...}`) and scores them.
pub fn evaluate_answer_files(gold_path: &Path, pred_path: &Path) -> Result<AnswerEval> {
    let gold = read_gold(gold_path)?;
    let predictions = read_predictions(pred_path)?;
    Ok(evaluate_answers(&gold, &predictions))
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::BadRow {
        path: path.to_path_buf(),
        line: e.line(),
        message: format!("not valid JSON: {e}"),
    })
}

fn read_gold(path: &Path) -> Result<Vec<(String, String)>> {
    let serde_json::Value::Array(rows) = read_json(path)? else {
        return Err(Error::BadRow {
            path: path.to_path_buf(),
            line: 1,
            message: "gold file must be a JSON list of HotpotQA rows".into(),
        });
    };
    let mut gold = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        let bad = |message: &str| Error::BadRow {
            path: path.to_path_buf(),
            line: i + 1,
            message: format!("gold row {}: {message}", i + 1),
        };
        let id = match row.get("_id").or_else(|| row.get("id")) {
            Some(serde_json::Value::String(id)) => id.clone(),
            Some(serde_json::Value::Number(n)) => n.to_string(),
            _ => return Err(bad("no string `_id`")),
        };
        let Some(answer) = row.get("answer").and_then(|a| a.as_str()) else {
            return Err(bad("no string `answer`"));
        };
        gold.push((id, answer.to_string()));
    }
    Ok(gold)
}

fn read_predictions(path: &Path) -> Result<BTreeMap<String, String>> {
    let value = read_json(path)?;
    let Some(answers) = value.get("answer").and_then(|a| a.as_object()) else {
        return Err(Error::BadRow {
            path: path.to_path_buf(),
            line: 1,
            message: "prediction file must be an object with an `answer` object {id: text}".into(),
        });
    };
    let mut predictions = BTreeMap::new();
    for (id, text) in answers {
        let text = match text {
            serde_json::Value::String(s) => s.clone(),
            // The official script would str() other values; keep them as JSON text.
            other => other.to_string(),
        };
        predictions.insert(id.clone(), text);
    }
    Ok(predictions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f1_counts_repeated_tokens_as_a_bag() {
        let (f1, p, r) = f1_score("red red blue", "red blue blue");
        assert!((p - 2.0 / 3.0).abs() < 1e-12);
        assert!((r - 2.0 / 3.0).abs() < 1e-12);
        assert!((f1 - 2.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn yes_no_noanswer_only_match_themselves() {
        assert_eq!(f1_score("yes it is", "yes"), (0.0, 0.0, 0.0));
        assert_eq!(f1_score("no", "No."), (1.0, 1.0, 1.0));
        assert_eq!(f1_score("the noanswer", "noanswer"), (1.0, 1.0, 1.0));
        assert_eq!(f1_score("no answer", "noanswer"), (0.0, 0.0, 0.0));
    }

    #[test]
    fn empty_strings_match_exactly_but_have_zero_f1() {
        assert!(exact_match("", "The"));
        assert_eq!(f1_score("", ""), (0.0, 0.0, 0.0));
    }

    #[test]
    fn best_score_takes_the_max_over_golds() {
        let golds = vec!["Barack Obama".to_string(), "Obama".to_string()];
        let s = best_score("obama", &golds);
        assert_eq!(s.em, 1.0);
        assert_eq!(s.f1, 1.0);
        assert_eq!(best_score("obama", &[]), AnswerScore::default());
    }

    #[test]
    fn evaluate_divides_by_all_gold_rows() {
        let gold = vec![
            ("a".to_string(), "Paris".to_string()),
            ("b".to_string(), "London".to_string()),
        ];
        let preds = BTreeMap::from([("a".to_string(), "paris".to_string())]);
        let eval = evaluate_answers(&gold, &preds);
        assert_eq!(eval.em, 0.5);
        assert_eq!(eval.f1, 0.5);
        assert_eq!(eval.missing, vec!["b".to_string()]);
        assert_eq!(evaluate_answers(&[], &preds).em, 0.0);
    }
}
