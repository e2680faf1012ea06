//! Plain JSONL rows `{question, answers[, id, data_source]}`.

use serde_json::Value;

use super::fields;
use crate::task::Task;

/// Converts one row. `answers` (or `answer`) may be a string or a list of strings; a
/// missing `id` becomes the line number; `data_source` defaults to `jsonl`. Other keys are
/// kept in `extra`.
pub fn task_from_row(row: &Value, line: usize) -> Result<Task, String> {
    let obj = fields::object(row)?;
    let question = fields::string(obj, "question")?;
    let answers = match obj.get("answers").or_else(|| obj.get("answer")) {
        Some(v) => fields::answers(v, "`answers`")?,
        None => {
            return Err(fields::missing_what(
                obj,
                "answers",
                " (a string or a list of strings)",
            ))
        }
    };
    let id = fields::id(obj, &["id", "_id"])?.unwrap_or_else(|| line.to_string());
    let data_source = match obj.get("data_source") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => "jsonl".to_string(),
    };
    Ok(Task {
        id,
        data_source,
        question,
        answers,
        prompt: None,
        extra: fields::rest(
            obj,
            &["question", "answers", "answer", "id", "_id", "data_source"],
        ),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn answers_as_string_or_list_and_id_from_line() {
        let t = task_from_row(&json!({"question": "Q", "answers": "A"}), 7).expect("task");
        assert_eq!(
            (t.id.as_str(), t.answers.clone()),
            ("7", vec!["A".to_string()])
        );
        let t = task_from_row(
            &json!({"question": "Q", "answers": ["A", "B"], "id": 3, "hint": 1}),
            7,
        )
        .expect("task");
        assert_eq!((t.id.as_str(), t.answers.len()), ("3", 2));
        assert_eq!(t.extra, json!({"hint": 1}));
        assert!(task_from_row(&json!({"question": "Q", "answers": []}), 1)
            .unwrap_err()
            .contains("empty"));
        assert!(task_from_row(&json!({"question": "Q", "answers": [1, {}]}), 1).is_err());
        assert!(task_from_row(&json!({"question": "Q"}), 1)
            .unwrap_err()
            .contains("answers"));
    }

    #[test]
    fn a_misspelt_key_is_named() {
        let e = task_from_row(&json!({"question": "Q", "anwsers": ["A"]}), 1).unwrap_err();
        assert!(
            e.contains("the row has `anwsers`: rename it to `answers`"),
            "{e}"
        );
        let e = task_from_row(&json!({"qestion": "Q", "answers": ["A"]}), 1).unwrap_err();
        assert!(e.contains("rename it to `question`"), "{e}");
        let e = task_from_row(&json!({"question": "Q", "solution": "A"}), 1).unwrap_err();
        assert!(e.contains("; the row has: question, solution"), "{e}");
    }
}
