//! Reading a JSON list or a JSONL file into rows that remember their line numbers.

use std::path::Path;

use serde_json::value::RawValue;
use serde_json::Value;

use crate::error::{Error, Result};

/// One row of a JSON/JSONL file: its 1-based line and its value, or why it is not JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonRow {
    /// 1-based line where the row starts.
    pub line: usize,
    /// The parsed row, or the JSON error of a JSONL line.
    pub value: Result<Value, String>,
}

/// Reads `path` as a JSON list (when its first non-blank byte is `[`) or as JSONL.
///
/// A JSON list that does not parse as a whole is a file error (its line is in the
/// message); a JSONL line that does not parse is a bad row, returned as such.
pub fn read_json_rows(path: &Path) -> Result<Vec<JsonRow>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    if text.trim_start().starts_with('[') {
        read_list(path, text)
    } else {
        Ok(read_lines(text))
    }
}

fn read_list(path: &Path, text: &str) -> Result<Vec<JsonRow>> {
    let raws: Vec<&RawValue> = serde_json::from_str(text).map_err(|e| Error::BadFile {
        path: path.to_path_buf(),
        message: format!("line {}: not a valid JSON list: {e}", e.line()),
    })?;
    let mut rows = Vec::with_capacity(raws.len());
    let mut line = 1;
    let mut counted_to = 0;
    for raw in raws {
        let start = (raw.get().as_ptr() as usize).saturating_sub(text.as_ptr() as usize);
        let start = start.min(text.len());
        if start >= counted_to {
            line += text.as_bytes()[counted_to..start]
                .iter()
                .filter(|b| **b == b'\n')
                .count();
            counted_to = start;
        }
        rows.push(JsonRow {
            line,
            value: serde_json::from_str(raw.get()).map_err(|e| e.to_string()),
        });
    }
    Ok(rows)
}

fn read_lines(text: &str) -> Vec<JsonRow> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| JsonRow {
            line: i + 1,
            value: serde_json::from_str(l).map_err(|e| format!("not valid JSON: {e}")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(text.as_bytes()).expect("write");
        f
    }

    #[test]
    fn list_rows_know_their_lines() {
        let f = file("[\n  {\"a\": 1},\n\n  {\"a\": [\n 2]},\n  3\n]\n");
        let rows = read_json_rows(f.path()).expect("rows");
        let lines: Vec<usize> = rows.iter().map(|r| r.line).collect();
        assert_eq!(lines, vec![2, 4, 6]);
        assert_eq!(rows[2].value, Ok(serde_json::json!(3)));
    }

    #[test]
    fn jsonl_bad_line_is_a_row_error_and_blank_lines_are_skipped() {
        let f = file("{\"a\": 1}\n\n{oops\n{\"a\": 2}\n");
        let rows = read_json_rows(f.path()).expect("rows");
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[1].line, 3);
        assert!(rows[1].value.is_err());
        assert_eq!(rows[2].line, 4);
    }

    #[test]
    fn broken_list_is_a_file_error_with_its_line() {
        let f = file("[\n{\"a\": 1},\n{\"a\": }\n]");
        let err = read_json_rows(f.path()).unwrap_err().to_string();
        assert!(err.contains("line 3"), "{err}");
    }
}
