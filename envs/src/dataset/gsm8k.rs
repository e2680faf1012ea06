//! GSM8K JSONL rows `{question, answer}`: the answer is a worked solution whose last line is
//! `#### <number>`.

use serde_json::Value;

use super::fields;
use crate::task::Task;

/// The data source of GSM8K tasks.
pub const DATA_SOURCE: &str = "gsm8k";

/// Converts one row. The gold answer is what follows the last `####` (thousands separators
/// dropped); the worked solution is kept in `extra.solution`. A missing `id` becomes the line
/// number; other keys are kept in `extra`.
pub fn task_from_row(row: &Value, line: usize) -> Result<Task, String> {
    let obj = fields::object(row)?;
    let question = fields::string(obj, "question")?;
    let solution = fields::string(obj, "answer")?;
    let Some((worked, answer)) = solution.rsplit_once("####") else {
        return Err("`answer` has no `#### <number>` line (GSM8K's final answer)".into());
    };
    let answer = answer.trim().replace(',', "");
    if answer.is_empty() {
        return Err("`answer` has nothing after `####`".into());
    }
    let id = fields::id(obj, &["id", "_id"])?.unwrap_or_else(|| line.to_string());
    let mut extra = fields::rest(obj, &["question", "answer", "id", "_id"]);
    if let Value::Object(map) = &mut extra {
        map.insert("solution".into(), Value::String(worked.trim().to_string()));
    }
    Ok(Task {
        id,
        data_source: DATA_SOURCE.to_string(),
        question,
        answers: vec![answer],
        prompt: None,
        extra,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_answer_is_what_follows_the_marks() {
        let row = json!({
            "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?",
            "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
        });
        let t = task_from_row(&row, 3).expect("task");
        assert_eq!(
            (t.id.as_str(), t.answers.clone()),
            ("3", vec!["72".to_string()])
        );
        assert_eq!(t.data_source, "gsm8k");
        assert!(t.extra["solution"]
            .as_str()
            .unwrap()
            .ends_with("April and May."));
        let t = task_from_row(&json!({"question": "Q", "answer": "x\n#### 1,200"}), 1).unwrap();
        assert_eq!(t.answers, vec!["1200".to_string()]);
        let e = task_from_row(&json!({"question": "Q", "answer": "72"}), 1).unwrap_err();
        assert!(e.contains("####"), "{e}");
        let e = task_from_row(&json!({"question": "Q", "answer": "x ####  "}), 1).unwrap_err();
        assert!(e.contains("after"), "{e}");
    }
}
