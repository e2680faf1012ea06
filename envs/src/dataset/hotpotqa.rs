//! HotpotQA official JSON rows.

use serde_json::Value;

use super::fields;
use crate::task::Task;

/// Converts one row `{_id, question, answer, supporting_facts, context, type, level}`.
/// Everything but `_id`, `question` and `answer` is kept in `extra`.
pub fn task_from_row(row: &Value) -> Result<Task, String> {
    let obj = fields::object(row)?;
    let id = fields::id(obj, &["_id"])?.ok_or("missing `_id`")?;
    let question = fields::string(obj, "question")?;
    let answer = fields::string_allow_empty(obj, "answer")?;
    if let Some(context) = obj.get("context") {
        check_context(context)?;
    }
    Ok(Task {
        id,
        data_source: "hotpotqa".into(),
        question,
        answers: vec![answer],
        prompt: None,
        extra: fields::rest(obj, &["_id", "question", "answer"]),
    })
}

/// Checks the `[[title, [sentence, ...]], ...]` shape shared by HotpotQA and 2Wiki.
pub(crate) fn check_context(context: &Value) -> Result<(), String> {
    let bad = || "`context` must be a list of [title, [sentence, ...]]".to_string();
    let items = context.as_array().ok_or_else(bad)?;
    for item in items {
        match item.as_array().map(Vec::as_slice) {
            Some([Value::String(_), Value::Array(sentences)])
                if sentences.iter().all(Value::is_string) => {}
            _ => return Err(bad()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn keeps_context_and_facts_in_extra() {
        let row = json!({"_id": "x1", "question": "Q?", "answer": "A", "type": "bridge", "level": "hard",
            "supporting_facts": [["T", 0]], "context": [["T", ["s0.", "s1."]]]});
        let task = task_from_row(&row).expect("task");
        assert_eq!(task.id, "x1");
        assert_eq!(task.answers, vec!["A"]);
        assert_eq!(task.extra["type"], "bridge");
        assert_eq!(task.extra["supporting_facts"], json!([["T", 0]]));
        assert!(task.extra.get("answer").is_none());
    }

    #[test]
    fn rejects_bad_shapes() {
        assert!(task_from_row(&json!({"question": "Q", "answer": "A"}))
            .unwrap_err()
            .contains("_id"));
        assert!(
            task_from_row(&json!({"_id": "1", "question": 3, "answer": "A"}))
                .unwrap_err()
                .contains("question")
        );
        let bad_ctx =
            json!({"_id": "1", "question": "Q", "answer": "A", "context": [["T", "not a list"]]});
        assert!(task_from_row(&bad_ctx).unwrap_err().contains("context"));
    }
}
