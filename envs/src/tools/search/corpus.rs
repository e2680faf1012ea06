//! Reading the documents of a search corpus: JSONL or HotpotQA `context` paragraphs.

use std::collections::HashSet;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};

/// Where the documents come from.
///
/// In config (`[tools.search] corpus = ...`) it is written like the env's corpus spec:
/// `{ jsonl = "docs.jsonl" }` or `{ hotpotqa = ["dev.json", ...] }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum CorpusSource {
    /// JSON lines `{"id", "title", "text"}` (`id` may be a string or a number; a FlashRAG-style
    /// `contents` field whose first line is the title is accepted in place of title + text).
    Jsonl(PathBuf),
    /// HotpotQA-format JSON files; each distinct `context` paragraph (by title) is a document.
    #[serde(rename = "hotpotqa")]
    HotpotQa(Vec<PathBuf>),
}

impl Default for CorpusSource {
    /// An empty JSONL path: a placeholder that [`super::SearchTool::open`] rejects.
    fn default() -> Self {
        CorpusSource::Jsonl(PathBuf::new())
    }
}

impl CorpusSource {
    /// The files the corpus is read from.
    pub fn files(&self) -> Vec<&Path> {
        match self {
            CorpusSource::Jsonl(p) => vec![p.as_path()],
            CorpusSource::HotpotQa(ps) => ps.iter().map(PathBuf::as_path).collect(),
        }
    }

    /// Calls `add(id, title, text)` for each document, in file order.
    pub fn for_each_document(
        &self,
        mut add: impl FnMut(&str, &str, &str) -> Result<()>,
    ) -> Result<()> {
        match self {
            CorpusSource::Jsonl(path) => read_jsonl(path, &mut add),
            CorpusSource::HotpotQa(paths) => {
                let mut seen = HashSet::new();
                for path in paths {
                    read_hotpotqa(path, &mut seen, &mut add)?;
                }
                Ok(())
            }
        }
    }
}

fn read_jsonl(path: &Path, add: &mut impl FnMut(&str, &str, &str) -> Result<()>) -> Result<()> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| Error::io(path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |message: String| Error::BadRow {
            path: path.to_path_buf(),
            line: i + 1,
            message,
        };
        let v: Value = serde_json::from_str(&line).map_err(|e| bad(format!("not JSON: {e}")))?;
        let Some(obj) = v.as_object() else {
            return Err(bad(
                "expected an object {\"id\", \"title\", \"text\"}".into()
            ));
        };
        let id = match obj.get("id") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            None | Some(Value::Null) => (i + 1).to_string(),
            Some(other) => {
                return Err(bad(format!("`id` must be a string or number, got {other}")))
            }
        };
        let title = match obj.get("title") {
            Some(Value::String(s)) => Some(s.as_str()),
            None | Some(Value::Null) => None,
            Some(other) => return Err(bad(format!("`title` must be a string, got {other}"))),
        };
        match (obj.get("text"), obj.get("contents")) {
            (Some(Value::String(text)), _) => add(&id, title.unwrap_or(""), text)?,
            (None, Some(Value::String(contents))) => {
                let (head, body) = contents.split_once('\n').unwrap_or((contents, ""));
                let head = head.trim().trim_matches('"');
                add(&id, title.unwrap_or(head), body)?;
            }
            (Some(other), _) => return Err(bad(format!("`text` must be a string, got {other}"))),
            _ => return Err(bad("missing string field `text`".into())),
        }
    }
    Ok(())
}

/// Only the field the corpus needs; other HotpotQA fields are skipped unparsed.
#[derive(Deserialize)]
struct ContextRow {
    context: Vec<(String, Vec<String>)>,
}

fn read_hotpotqa(
    path: &Path,
    seen: &mut HashSet<String>,
    add: &mut impl FnMut(&str, &str, &str) -> Result<()>,
) -> Result<()> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let rows: Vec<Value> =
        serde_json::from_reader(std::io::BufReader::new(file)).map_err(|e| Error::BadFile {
            path: path.to_path_buf(),
            message: format!("not a JSON list of HotpotQA rows: {e}"),
        })?;
    for (r, row) in rows.into_iter().enumerate() {
        let row: ContextRow = serde_json::from_value(row).map_err(|e| Error::BadRow {
            path: path.to_path_buf(),
            line: r + 1,
            message: format!(
                "row {}: `context` must be [[title, [sentence, ...]], ...]: {e}",
                r + 1
            ),
        })?;
        for (title, sentences) in row.context {
            let body: String = sentences.concat();
            if !body.trim().is_empty() && seen.insert(title.clone()) {
                add(&title, &title, &body)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(source: &CorpusSource) -> Result<Vec<(String, String, String)>> {
        let mut docs = Vec::new();
        source.for_each_document(|i, t, x| {
            docs.push((i.into(), t.into(), x.into()));
            Ok(())
        })?;
        Ok(docs)
    }

    #[test]
    fn jsonl_ids_titles_and_contents() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("c.jsonl");
        std::fs::write(
            &p,
            "{\"id\": 7, \"title\": \"A\", \"text\": \"x\"}\n\n{\"contents\": \"\\\"B\\\"\\ny z\"}\n",
        )
        .unwrap();
        let docs = collect(&CorpusSource::Jsonl(p)).unwrap();
        assert_eq!(docs[0], ("7".into(), "A".into(), "x".into()));
        assert_eq!(docs[1], ("3".into(), "B".into(), "y z".into()));
    }

    #[test]
    fn bad_jsonl_rows_name_file_and_line() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("c.jsonl");
        for (body, needle) in [
            ("{\"text\": \"ok\"}\n{oops\n", "c.jsonl:2: not JSON"),
            ("[1]\n", "c.jsonl:1: expected an object"),
            (
                "{\"title\": \"t\"}\n",
                "c.jsonl:1: missing string field `text`",
            ),
            ("{\"text\": 3}\n", "c.jsonl:1: `text` must be a string"),
            ("{\"id\": [], \"text\": \"a\"}\n", "c.jsonl:1: `id` must be"),
        ] {
            std::fs::write(&p, body).unwrap();
            let e = collect(&CorpusSource::Jsonl(p.clone()))
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{e} lacks {needle}");
        }
    }

    #[test]
    fn hotpotqa_paragraphs_are_deduplicated_by_title() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("h.json");
        std::fs::write(
            &p,
            r#"[{"_id": "1", "context": [["A", ["A is ", "a letter."]], ["B", ["B."]]]},
                {"_id": "2", "context": [["A", ["A again."]]]}]"#,
        )
        .unwrap();
        let docs = collect(&CorpusSource::HotpotQa(vec![p.clone()])).unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0].2, "A is a letter.");
        std::fs::write(&p, r#"[{"context": [["A", ["x"]]]}, {"context": "nope"}]"#).unwrap();
        let e = collect(&CorpusSource::HotpotQa(vec![p]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("h.json:2"), "{e}");
    }

    #[test]
    fn config_form_matches_the_env_corpus_spec() {
        let s: CorpusSource = serde_json::from_str(r#"{"hotpotqa": ["a.json"]}"#).unwrap();
        assert_eq!(s, CorpusSource::HotpotQa(vec!["a.json".into()]));
        let s: CorpusSource = serde_json::from_str(r#"{"jsonl": "a.jsonl"}"#).unwrap();
        assert_eq!(s, CorpusSource::Jsonl("a.jsonl".into()));
    }
}
