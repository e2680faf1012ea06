//! Agent-R1 (verl) training parquet rows.
//!
//! Columns: `data_source`, `prompt` (a list of `{role, content}`), `ability`,
//! `reward_model {style, ground_truth}`, `extra_info` (struct or map) and, in newer files,
//! `agent_name` and `env_kwargs` (a JSON string). Read with the `parquet` crate's record
//! API, one row at a time, converted to JSON.

use std::fs::File;
use std::path::Path;

use parquet::file::reader::{FileReader, SerializedFileReader};
use serde_json::Value;

use super::fields;
use crate::error::{Error, Result};
use crate::message::{Message, Role};
use crate::task::Task;

/// Reads every row of a parquet file as JSON, numbered from 1. A row that cannot be decoded
/// is returned as an error for that row.
pub fn read_parquet_rows(path: &Path) -> Result<super::NumberedRows> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let reader = SerializedFileReader::new(file).map_err(|e| Error::BadFile {
        path: path.to_path_buf(),
        message: format!("not a readable parquet file: {e}"),
    })?;
    let iter = reader.get_row_iter(None).map_err(|e| Error::BadFile {
        path: path.to_path_buf(),
        message: format!("cannot read parquet rows: {e}"),
    })?;
    Ok(iter
        .enumerate()
        .map(|(i, row)| {
            (
                i + 1,
                row.map(|r| r.to_json_value())
                    .map_err(|e| format!("cannot decode row: {e}")),
            )
        })
        .collect())
}

/// Converts one row. The question is `extra_info.question` when present, else the last user
/// message of `prompt`; the id is `extra_info.id`, else `extra_info.index`, else the row
/// number. `reward_model.ground_truth` may be a string, a list of strings, or
/// `{"target": string | [string]}`. `ability`, `reward_model.style`, `extra_info`,
/// `agent_name` and the parsed `env_kwargs` are kept in `extra`.
pub fn task_from_row(row: &Value, row_number: usize) -> Result<Task, String> {
    let obj = fields::object(row)?;
    let data_source = match obj.get("data_source") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        None | Some(Value::Null) => "agent_r1".to_string(),
        Some(other) => {
            return Err(format!(
                "`data_source` must be a string, got {}",
                fields::kind(other)
            ))
        }
    };
    let prompt = match obj.get("prompt") {
        None | Some(Value::Null) => Vec::new(),
        Some(p) => messages(p)?,
    };
    let extra_info = match obj.get("extra_info") {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => {
            return Err(format!(
                "`extra_info` must be a map, got {}",
                fields::kind(other)
            ))
        }
    };
    let question = match extra_info.get("question") {
        Some(Value::String(q)) if !q.trim().is_empty() => q.clone(),
        _ => prompt
            .iter()
            .rev()
            .find(|m| m.role == Role::User)
            .map(|m| m.content.clone())
            .filter(|q| !q.trim().is_empty())
            .ok_or("no question: neither `extra_info.question` nor a user message in `prompt`")?,
    };
    let reward_model = obj
        .get("reward_model")
        .and_then(Value::as_object)
        .ok_or("missing `reward_model` {style, ground_truth}")?;
    let answers = ground_truth(reward_model.get("ground_truth").unwrap_or(&Value::Null))?;
    let id = fields::id(&extra_info, &["id", "index"])?.unwrap_or_else(|| row_number.to_string());
    let env_kwargs = match obj.get("env_kwargs") {
        None | Some(Value::Null) => Value::Null,
        Some(Value::String(s)) if s.trim().is_empty() => Value::Null,
        Some(Value::String(s)) => serde_json::from_str(s)
            .map_err(|e| format!("`env_kwargs` is not a JSON string: {e}"))?,
        Some(Value::Object(m)) => Value::Object(m.clone()),
        Some(other) => {
            return Err(format!(
                "`env_kwargs` must be a JSON string, got {}",
                fields::kind(other)
            ))
        }
    };
    let mut extra = serde_json::Map::new();
    for key in ["ability", "agent_name"] {
        if let Some(v) = obj.get(key).filter(|v| !v.is_null()) {
            extra.insert(key.into(), v.clone());
        }
    }
    if let Some(style) = reward_model.get("style").filter(|v| !v.is_null()) {
        extra.insert("reward_style".into(), style.clone());
    }
    extra.insert("extra_info".into(), Value::Object(extra_info));
    if !env_kwargs.is_null() {
        extra.insert("env_kwargs".into(), env_kwargs);
    }
    Ok(Task {
        id,
        data_source,
        question,
        answers,
        prompt: (!prompt.is_empty()).then_some(prompt),
        extra: Value::Object(extra),
    })
}

fn messages(prompt: &Value) -> Result<Vec<Message>, String> {
    let items = prompt
        .as_array()
        .ok_or("`prompt` must be a list of {role, content}")?;
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.get("role").and_then(Value::as_str) {
                Some("system") => Role::System,
                Some("user") => Role::User,
                Some("assistant") => Role::Assistant,
                Some("tool") => Role::Tool,
                Some(other) => {
                    return Err(format!(
                        "`prompt[{i}].role` `{other}` is not system, user, assistant or tool"
                    ))
                }
                None => return Err(format!("`prompt[{i}]` has no string `role`")),
            };
            let content = m
                .get("content")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("`prompt[{i}]` has no string `content`"))?;
            Ok(Message::new(role, content))
        })
        .collect()
}

/// `reward_model.ground_truth`: a string, a list of strings, or `{"target": ...}`.
fn ground_truth(gt: &Value) -> Result<Vec<String>, String> {
    match gt {
        Value::Object(m) => match m.get("target") {
            Some(target) => fields::answers(target, "`reward_model.ground_truth.target`"),
            None => Err("`reward_model.ground_truth` is a map without `target`".into()),
        },
        Value::Null => Err("missing `reward_model.ground_truth`".into()),
        other => fields::answers(other, "`reward_model.ground_truth`"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn row(gt: Value) -> Value {
        json!({"data_source": "hotpotqa", "prompt": [{"role": "user", "content": "Q?"}], "ability": "qa",
               "reward_model": {"style": "rule", "ground_truth": gt}, "extra_info": {"index": 4}})
    }

    #[test]
    fn ground_truth_in_every_shape() {
        assert_eq!(
            task_from_row(&row(json!("A")), 1).expect("task").answers,
            vec!["A"]
        );
        assert_eq!(
            task_from_row(&row(json!(["A", "B"])), 1)
                .expect("task")
                .answers,
            vec!["A", "B"]
        );
        assert_eq!(
            task_from_row(&row(json!({"target": ["A"]})), 1)
                .expect("task")
                .answers,
            vec!["A"]
        );
        assert_eq!(
            task_from_row(&row(json!({"target": "A"})), 1)
                .expect("task")
                .answers,
            vec!["A"]
        );
        assert_eq!(
            task_from_row(&row(json!(72)), 1).expect("task").answers,
            vec!["72"]
        );
        assert!(task_from_row(&row(json!({"answer": "A"})), 1)
            .unwrap_err()
            .contains("target"));
        assert!(task_from_row(&row(Value::Null), 1)
            .unwrap_err()
            .contains("ground_truth"));
    }

    #[test]
    fn question_id_and_prompt() {
        let t = task_from_row(&row(json!("A")), 9).expect("task");
        assert_eq!((t.id.as_str(), t.question.as_str()), ("4", "Q?"));
        assert_eq!(t.prompt.as_ref().map(Vec::len), Some(1));
        let mut r = row(json!("A"));
        r["env_kwargs"] = json!("{not json");
        assert!(task_from_row(&r, 1).unwrap_err().contains("env_kwargs"));
        let mut r = row(json!("A"));
        r["prompt"] = json!([{"role": "robot", "content": "x"}]);
        assert!(task_from_row(&r, 1).unwrap_err().contains("robot"));
    }
}
