//! MuSiQue JSONL rows.

use serde_json::Value;

use super::fields;
use crate::task::Task;

/// Converts one row `{id, question, answer, answer_aliases, answerable, paragraphs}`.
/// Returns `Ok(None)` for an unanswerable row unless `include_unanswerable`. Accepted answers
/// are `answer` then `answer_aliases`; the rest of the row is kept in `extra`.
pub fn task_from_row(row: &Value, include_unanswerable: bool) -> Result<Option<Task>, String> {
    let obj = fields::object(row)?;
    let answerable = match obj.get("answerable") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(format!(
                "`answerable` must be a boolean, got {}",
                fields::kind(other)
            ))
        }
    };
    let id = fields::id(obj, &["id"])?.ok_or("missing `id`")?;
    let question = fields::string(obj, "question")?;
    let mut answers = vec![fields::string_allow_empty(obj, "answer")?];
    match obj.get("answer_aliases") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) if a.is_empty() => {}
        Some(aliases) => answers.extend(fields::answers(aliases, "`answer_aliases`")?),
    }
    if let Some(paragraphs) = obj.get("paragraphs") {
        check_paragraphs(paragraphs)?;
    }
    if !answerable && !include_unanswerable {
        return Ok(None);
    }
    Ok(Some(Task {
        id,
        data_source: "musique".into(),
        question,
        answers,
        prompt: None,
        extra: fields::rest(obj, &["id", "question", "answer", "answer_aliases"]),
    }))
}

fn check_paragraphs(paragraphs: &Value) -> Result<(), String> {
    let bad = |why: &str| {
        format!(
            "`paragraphs` must be a list of {{idx, title, paragraph_text, is_supporting}}: {why}"
        )
    };
    let items = paragraphs.as_array().ok_or_else(|| bad("not a list"))?;
    for (i, p) in items.iter().enumerate() {
        let p = p
            .as_object()
            .ok_or_else(|| bad(&format!("item {i} is not an object")))?;
        if !p.get("paragraph_text").is_some_and(Value::is_string) {
            return Err(bad(&format!("item {i} has no string `paragraph_text`")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn unanswerable_rows_are_filtered_unless_asked_for() {
        let row = json!({"id": "m1", "question": "Q", "answer": "A", "answer_aliases": ["a1"], "answerable": false, "paragraphs": []});
        assert_eq!(task_from_row(&row, false), Ok(None));
        let task = task_from_row(&row, true).expect("row").expect("kept");
        assert_eq!(task.answers, vec!["A", "a1"]);
        assert_eq!(task.extra["answerable"], false);
    }

    #[test]
    fn bad_paragraphs_and_answerable_are_reported() {
        let row = json!({"id": "m1", "question": "Q", "answer": "A", "paragraphs": [{"idx": 0}]});
        assert!(task_from_row(&row, false)
            .unwrap_err()
            .contains("paragraph_text"));
        let row = json!({"id": "m1", "question": "Q", "answer": "A", "answerable": "yes"});
        assert!(task_from_row(&row, false)
            .unwrap_err()
            .contains("answerable"));
    }
}
