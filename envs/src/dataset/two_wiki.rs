//! 2WikiMultihopQA rows (JSON list or JSONL).

use serde_json::Value;

use super::{fields, hotpotqa::check_context};
use crate::task::Task;

/// Converts one row `{_id | id, question, answer, context, type, evidences, ...}`. An
/// `answer_aliases` list, where present, adds accepted answers. Everything but the id,
/// `question`, `answer` and `answer_aliases` is kept in `extra`.
pub fn task_from_row(row: &Value) -> Result<Task, String> {
    let obj = fields::object(row)?;
    let id = fields::id(obj, &["_id", "id"])?.ok_or("missing `_id` (or `id`)")?;
    let question = fields::string(obj, "question")?;
    let mut answers = vec![fields::string_allow_empty(obj, "answer")?];
    if let Some(aliases) = obj.get("answer_aliases") {
        if aliases.as_array().is_some_and(|a| !a.is_empty()) {
            answers.extend(fields::answers(aliases, "`answer_aliases`")?);
        }
    }
    if let Some(context) = obj.get("context") {
        check_context(context)?;
    }
    Ok(Task {
        id,
        data_source: "2wikimultihopqa".into(),
        question,
        answers,
        prompt: None,
        extra: fields::rest(obj, &["_id", "id", "question", "answer", "answer_aliases"]),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn accepts_id_or_underscore_id() {
        let a =
            task_from_row(&json!({"_id": "a", "question": "Q", "answer": "A", "evidences": []}))
                .expect("task");
        let b = task_from_row(
            &json!({"id": "b", "question": "Q", "answer": "A", "type": "comparison"}),
        )
        .expect("task");
        assert_eq!((a.id.as_str(), b.id.as_str()), ("a", "b"));
        assert_eq!(b.extra["type"], "comparison");
        assert!(task_from_row(&json!({"question": "Q", "answer": "A"})).is_err());
    }
}
