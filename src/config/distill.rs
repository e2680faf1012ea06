//! `[distill]`'s checks across files: the teacher is a model directory whose tokenizer is the
//! policy's, with an embedding row for every id that tokenizer makes.

use std::path::Path;

use serde_json::Value;

use super::model::model_dir;
use super::ConfigError;

const KEY: &str = "distill.teacher";

fn read_json(key: &str, path: &Path) -> Result<Value, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(key, format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| ConfigError::new(key, format!("{}: not JSON: {e}", path.display())))
}

/// Token id -> content of a `tokenizer.json`'s added tokens.
fn added_tokens(tokenizer: &Value) -> Vec<(u64, String)> {
    tokenizer["added_tokens"]
        .as_array()
        .map(|tokens| {
            tokens
                .iter()
                .filter_map(|t| Some((t["id"].as_u64()?, t["content"].as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// The number of ids `tokenizer` can produce: its model's vocabulary and added tokens.
fn id_count(tokenizer: &Value) -> u64 {
    let vocab = tokenizer["model"]["vocab"]
        .as_object()
        .map(|v| {
            v.values()
                .filter_map(Value::as_u64)
                .max()
                .map_or(0, |m| m + 1)
        })
        .unwrap_or(0);
    let added = added_tokens(tokenizer)
        .iter()
        .map(|(id, _)| id + 1)
        .max()
        .unwrap_or(0);
    vocab.max(added)
}

/// Refuses a teacher that cannot score the policy's tokens: no model directory, no
/// `tokenizer.json`, a different tokenizer (its vocabulary and merges, or an added token
/// both define with different text), or fewer embedding rows than the policy's tokenizer
/// has ids. Added tokens only one of them defines are allowed (Qwen2.5 and Qwen3 share a
/// vocabulary; Qwen3 adds its thinking tokens).
pub fn check_teacher(policy_dir: &Path, teacher_dir: &Path) -> Result<(), ConfigError> {
    model_dir(KEY, teacher_dir)?;
    let tokenizer_of = |dir: &Path| -> Result<Value, ConfigError> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(ConfigError::new(
                KEY,
                format!(
                    "{}: no tokenizer.json (the teacher and the policy must share a tokenizer, \
                     and it is compared before training)",
                    dir.display()
                ),
            ));
        }
        read_json(KEY, &path)
    };
    let (policy, teacher) = (tokenizer_of(policy_dir)?, tokenizer_of(teacher_dir)?);
    if policy["model"] != teacher["model"] {
        return Err(ConfigError::new(
            KEY,
            format!(
                "{}: the teacher's tokenizer is not the policy's ({}): their vocabularies or \
                 merges differ; distill from a teacher of the same tokenizer family",
                teacher_dir.display(),
                policy_dir.display()
            ),
        ));
    }
    let theirs = added_tokens(&teacher);
    if let Some((id, text, other)) = added_tokens(&policy).into_iter().find_map(|(id, text)| {
        theirs
            .iter()
            .find(|(tid, ttext)| *tid == id && *ttext != text)
            .map(|(_, ttext)| (id, text, ttext.clone()))
    }) {
        return Err(ConfigError::new(
            KEY,
            format!(
                "{}: token id {id} is {other:?} for the teacher and {text:?} for the policy: \
                 the tokenizers differ",
                teacher_dir.display()
            ),
        ));
    }
    let rows = read_json(KEY, &teacher_dir.join("config.json"))?["vocab_size"]
        .as_u64()
        .unwrap_or(0);
    let ids = id_count(&policy);
    if rows < ids {
        return Err(ConfigError::new(
            KEY,
            format!(
                "{}: the teacher's vocab_size is {rows}, but the policy's tokenizer makes ids up \
                 to {}: the teacher cannot score them",
                teacher_dir.display(),
                ids - 1
            ),
        ));
    }
    Ok(())
}
