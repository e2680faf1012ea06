//! Datasets: HotpotQA, 2WikiMultihopQA, MuSiQue, Agent-R1 parquet, GSM8K and plain JSONL,
//! all read into [`Task`]s.
//!
//! [`load_tasks`] detects the format (extension, parquet magic, keys of the first row) unless
//! [`LoadOptions::format`] names it, and applies the bad-row policy: a row that does not fit
//! is an [`Error::BadRow`] with file and line, either fatal or skipped with a warning.

pub mod agent_r1_parquet;
mod fields;
pub mod format;
pub mod gsm8k;
pub mod hotpotqa;
pub mod musique;
pub mod options;
pub mod plain;
pub mod rows;
pub mod two_wiki;

use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;

pub use format::DatasetFormat;
pub use options::{LoadOptions, OnBadRow};

use crate::error::{Error, Result};
use crate::task::Task;

/// Rows numbered by line (or parquet row), each parsed or with the reason it is not.
pub type NumberedRows = Vec<(usize, Result<Value, String>)>;

/// What [`load_tasks`] read.
#[derive(Debug)]
pub struct Loaded {
    /// The format used.
    pub format: DatasetFormat,
    /// The tasks, in file order.
    pub tasks: Vec<Task>,
    /// Bad rows that were skipped (only with [`OnBadRow::Skip`]), each a [`Error::BadRow`].
    pub skipped: Vec<Error>,
    /// Good rows left out on purpose (MuSiQue unanswerable rows).
    pub filtered: usize,
}

/// Reads a dataset file into tasks.
pub fn load_tasks(path: impl AsRef<Path>, options: &LoadOptions) -> Result<Loaded> {
    let path = path.as_ref();
    let parquet = match options.format {
        Some(f) => f == DatasetFormat::AgentR1Parquet,
        None => DatasetFormat::is_parquet(path, &read_head(path)?),
    };
    let (format, rows): (DatasetFormat, NumberedRows) = if parquet {
        (
            DatasetFormat::AgentR1Parquet,
            agent_r1_parquet::read_parquet_rows(path)?,
        )
    } else {
        let rows = rows::read_json_rows(path)?;
        let format = match options.format {
            Some(f) => f,
            None => detect_json_format(path, &rows)?,
        };
        (
            format,
            rows.into_iter().map(|r| (r.line, r.value)).collect(),
        )
    };
    let mut loaded = Loaded {
        format,
        tasks: Vec::new(),
        skipped: Vec::new(),
        filtered: 0,
    };
    for (line, value) in rows {
        if options.limit.is_some_and(|n| loaded.tasks.len() >= n) {
            break;
        }
        let converted = value.and_then(|v| convert(format, &v, line, options));
        match converted {
            Ok(Some(task)) => loaded.tasks.push(task),
            Ok(None) => loaded.filtered += 1,
            Err(message) => {
                let err = Error::BadRow {
                    path: path.to_path_buf(),
                    line,
                    message,
                };
                match options.on_bad_row {
                    OnBadRow::Fail => return Err(err),
                    OnBadRow::Skip => {
                        if loaded.skipped.len() < 20 {
                            tracing::warn!("skipping bad row: {err}");
                        }
                        loaded.skipped.push(err);
                    }
                }
            }
        }
    }
    if loaded.skipped.len() >= 20 {
        tracing::warn!(
            "{}: skipped {} bad rows in all",
            path.display(),
            loaded.skipped.len()
        );
    }
    Ok(loaded)
}

/// Reads several files with the same options and concatenates their tasks.
pub fn load_many(paths: &[PathBuf], options: &LoadOptions) -> Result<Vec<Task>> {
    let mut tasks = Vec::new();
    for path in paths {
        tasks.extend(load_tasks(path, options)?.tasks);
    }
    Ok(tasks)
}

fn convert(
    format: DatasetFormat,
    row: &Value,
    line: usize,
    options: &LoadOptions,
) -> Result<Option<Task>, String> {
    match format {
        DatasetFormat::HotpotQa => hotpotqa::task_from_row(row).map(Some),
        DatasetFormat::TwoWiki => two_wiki::task_from_row(row).map(Some),
        DatasetFormat::Musique => musique::task_from_row(row, options.include_unanswerable),
        DatasetFormat::AgentR1Parquet => agent_r1_parquet::task_from_row(row, line).map(Some),
        DatasetFormat::Jsonl => plain::task_from_row(row, line).map(Some),
        DatasetFormat::Gsm8k => gsm8k::task_from_row(row, line).map(Some),
    }
}

fn read_head(path: &Path) -> Result<Vec<u8>> {
    let mut head = Vec::with_capacity(4);
    std::fs::File::open(path)
        .and_then(|f| f.take(4).read_to_end(&mut head))
        .map_err(|e| Error::io(path, e))?;
    Ok(head)
}

/// Detects the format of a JSON/JSONL file from its first row that parses.
fn detect_json_format(path: &Path, rows: &[rows::JsonRow]) -> Result<DatasetFormat> {
    let first = rows.iter().find_map(|r| r.value.as_ref().ok());
    match first.and_then(DatasetFormat::detect_from_row) {
        Some(f) => Ok(f),
        None => Err(Error::BadFile {
            path: path.to_path_buf(),
            message: format!(
                "cannot tell the dataset format from the first row; set `format` to one of: {}",
                DatasetFormat::ALL.map(DatasetFormat::as_str).join(", ")
            ),
        }),
    }
}
