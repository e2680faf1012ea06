//! Reading a run directory for the web UI: the logs, the rollouts files, the checkpoints,
//! the config and the tokenizer. Nothing here writes; everything tolerates a run that is
//! still being written (a half-written last line is counted as damaged and skipped).

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_envs::tool_call::ToolCallFormat;
use serde_json::Value;

use super::ViewError;

/// A run directory (`agent-r1 train`'s `--out`).
#[derive(Debug)]
pub struct RunDir {
    root: PathBuf,
    tokenizer: OnceLock<Option<Arc<HfTokenizer>>>,
}

/// The lines of a JSON-lines log that parse, and how many did not.
#[derive(Debug, Default)]
pub struct Log {
    /// Parsed lines, in file order.
    pub rows: Vec<Value>,
    /// 1-based numbers of the lines that did not parse.
    pub damaged: Vec<usize>,
    /// Whether the file exists.
    pub exists: bool,
}

/// What a rollouts file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SourceKind {
    /// A sample of an update's training episodes.
    Train,
    /// A held-out evaluation.
    Eval,
}

/// One rollouts file: `rollouts/{train,eval}-step-NNNNNN.jsonl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Source {
    /// Training sample or evaluation.
    pub kind: SourceKind,
    /// The update it belongs to.
    pub step: u64,
}

impl Source {
    /// Its name (`train-step-000012`), as URLs carry it.
    pub fn name(&self) -> String {
        let kind = match self.kind {
            SourceKind::Train => "train",
            SourceKind::Eval => "eval",
        };
        format!("{kind}-step-{:06}", self.step)
    }

    /// Parses a name strictly: `train-step-` or `eval-step-` and digits, nothing else (so a
    /// name can never reach outside `rollouts/`).
    pub fn parse(name: &str) -> Result<Self, ViewError> {
        let bad = || {
            ViewError::BadParam(format!(
                "`source`: got {name:?}; allowed: train-step-N or eval-step-N (N digits)"
            ))
        };
        let (kind, digits) = if let Some(d) = name.strip_prefix("train-step-") {
            (SourceKind::Train, d)
        } else if let Some(d) = name.strip_prefix("eval-step-") {
            (SourceKind::Eval, d)
        } else {
            return Err(bad());
        };
        if digits.is_empty() || digits.len() > 12 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        Ok(Self {
            kind,
            step: digits.parse().map_err(|_| bad())?,
        })
    }

    /// A label for pages (`update 12 (training sample)`).
    pub fn label(&self) -> String {
        match self.kind {
            SourceKind::Train => format!("update {} (training sample)", self.step),
            SourceKind::Eval => format!("evaluation at update {}", self.step),
        }
    }
}

/// A checkpoint directory.
#[derive(Debug, Clone)]
pub struct CheckpointRow {
    /// Its update.
    pub step: u64,
    /// Whether its manifest is there (written last, so the checkpoint is complete).
    pub complete: bool,
    /// Bytes of its files.
    pub bytes: u64,
}

impl RunDir {
    /// Opens `root`, which must be a directory.
    pub fn open(root: &Path) -> Result<Self, ViewError> {
        let meta = fs::metadata(root).map_err(|e| {
            ViewError::RunDir(format!(
                "{}: cannot open the run directory: {e}",
                root.display()
            ))
        })?;
        if !meta.is_dir() {
            return Err(ViewError::RunDir(format!(
                "{}: not a directory (pass the run directory `train --out` wrote)",
                root.display()
            )));
        }
        Ok(Self {
            root: root.to_path_buf(),
            tokenizer: OnceLock::new(),
        })
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Fails with a clear message when the directory is gone (deleted while serving).
    pub fn check(&self) -> Result<(), ViewError> {
        if self.root.is_dir() {
            Ok(())
        } else {
            Err(ViewError::RunDir(format!(
                "{}: the run directory is gone",
                self.root.display()
            )))
        }
    }

    /// `metrics.jsonl`.
    pub fn metrics(&self) -> Log {
        read_log(&self.root.join("metrics.jsonl"))
    }

    /// `eval.jsonl`.
    pub fn evals(&self) -> Log {
        read_log(&self.root.join("eval.jsonl"))
    }

    /// The data file of a source.
    pub fn data_path(&self, source: Source) -> PathBuf {
        self.root
            .join("rollouts")
            .join(format!("{}.jsonl", source.name()))
    }

    /// The rollouts files there are, sorted by kind then update.
    pub fn sources(&self) -> Vec<Source> {
        let Ok(entries) = fs::read_dir(self.root.join("rollouts")) else {
            return vec![];
        };
        let mut out: Vec<Source> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                Source::parse(name.strip_suffix(".jsonl")?).ok()
            })
            .collect();
        out.sort();
        out
    }

    /// `checkpoints/step-N/`, by update.
    pub fn checkpoints(&self) -> Vec<CheckpointRow> {
        let Ok(entries) = fs::read_dir(self.root.join("checkpoints")) else {
            return vec![];
        };
        let mut out: Vec<CheckpointRow> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let step = name.strip_prefix("step-")?.parse().ok()?;
                Some(CheckpointRow {
                    step,
                    complete: e.path().join("manifest.json").is_file(),
                    bytes: dir_bytes(&e.path()),
                })
            })
            .collect();
        out.sort_by_key(|c| c.step);
        out
    }

    /// The resolved config: `config.toml` of the run, else of its newest checkpoint.
    pub fn config_text(&self) -> Option<(PathBuf, String)> {
        let mut candidates = vec![self.root.join("config.toml")];
        candidates.extend(
            self.checkpoints()
                .iter()
                .rev()
                .map(|c| self.checkpoint_dir(c.step).join("config.toml")),
        );
        candidates
            .into_iter()
            .find_map(|p| fs::read_to_string(&p).ok().map(|t| (p, t)))
    }

    fn checkpoint_dir(&self, step: u64) -> PathBuf {
        self.root.join("checkpoints").join(format!("step-{step}"))
    }

    /// The tool-call format the run's model used (from its config; hermes when unsaid).
    pub fn tool_call_format(&self) -> ToolCallFormat {
        self.config_text()
            .and_then(|(_, text)| toml::from_str::<toml::Value>(&text).ok())
            .and_then(|v| {
                let name = v
                    .get("model")?
                    .get("tool_call_format")?
                    .as_str()?
                    .to_string();
                serde_json::from_value(Value::String(name)).ok()
            })
            .unwrap_or_default()
    }

    /// The run's tokenizer (the preset model's, the warm start's, or a checkpoint's), loaded
    /// once; `None` when the directory has none.
    pub fn tokenizer(&self) -> Option<Arc<HfTokenizer>> {
        self.tokenizer
            .get_or_init(|| {
                let mut dirs = vec![self.root.join("model-init"), self.root.join("model-sft")];
                dirs.extend(
                    self.checkpoints()
                        .iter()
                        .rev()
                        .map(|c| self.checkpoint_dir(c.step).join("policy")),
                );
                dirs.into_iter()
                    .filter(|d| d.join("tokenizer.json").is_file())
                    .find_map(|d| HfTokenizer::from_dir(&d).ok().map(Arc::new))
            })
            .clone()
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

fn read_log(path: &Path) -> Log {
    let Ok(file) = fs::File::open(path) else {
        return Log::default();
    };
    let mut log = Log {
        exists: true,
        ..Log::default()
    };
    for (i, line) in BufReader::new(file).split(b'\n').enumerate() {
        let Ok(line) = line else {
            log.damaged.push(i + 1);
            break;
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Value>(&line) {
            Ok(v) if v.is_object() => log.rows.push(v),
            _ => log.damaged.push(i + 1),
        }
    }
    log
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_names_round_trip_and_nothing_else_parses() {
        let s = Source::parse("train-step-000012").unwrap();
        assert_eq!((s.kind, s.step), (SourceKind::Train, 12));
        assert_eq!(s.name(), "train-step-000012");
        assert_eq!(
            Source::parse("eval-step-3").unwrap().name(),
            "eval-step-000003"
        );
        for bad in [
            "",
            "train-step-",
            "../metrics",
            "train-step-1/../../x",
            "train-step-01.jsonl",
            "eval-step--1",
            "train-step-99999999999999999999",
        ] {
            assert!(Source::parse(bad).is_err(), "{bad}");
        }
    }
}
