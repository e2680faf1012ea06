//! The call journal: every finished tool call's result, on disk before the episode sees it,
//! so that an episode run again after a crash takes the recorded result instead of calling
//! again.
//!
//! One JSON line per call: its [`CallKey`], the call (tool and arguments), its outcome, and a
//! check (SHA-256 over the rest) that ties the key to the call. Lines are appended and
//! flushed to the disk (`fdatasync`) one call at a time. On open, a last line cut short by a
//! crash is dropped (that call is made again, under the same key); any other line that does
//! not read, does not match its check, or belongs to another run refuses the whole journal
//! with one line naming the file and line.
//!
//! The journal only grows between checkpoints: [`CallJournal::retain`] drops the calls of
//! episodes a checkpoint no longer needs.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::call_key::CallKey;
use crate::tool::{CallOutcome, ToolCall};

/// Why a journal cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Reading or writing the file failed.
    #[error("the call journal {path}: {source}")]
    Io {
        /// The journal.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// A line is not a journal entry of this run.
    #[error(
        "the call journal {path}, line {line}: {reason}; refused (move the file aside to \
         resume without it: the calls it holds would be made again)"
    )]
    Corrupt {
        /// The journal.
        path: PathBuf,
        /// The line (from 1).
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
}

/// What the journal knows of a call about to be made.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    /// This call was made under this key: its recorded outcome.
    Replay(CallOutcome),
    /// A different call was made under this key (the episode was sampled again and went
    /// another way): the call is a new one, under [`CallKey::next_branch`].
    Diverged,
    /// No call was made under this key.
    Absent,
}

/// One line of the journal.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    key: CallKey,
    tool: String,
    arguments: Value,
    outcome: CallOutcome,
    check: String,
}

impl Entry {
    fn new(key: &CallKey, call: &ToolCall, outcome: &CallOutcome) -> Self {
        let mut entry = Self {
            key: key.clone(),
            tool: call.name.clone(),
            arguments: call.arguments.clone(),
            outcome: outcome.clone(),
            check: String::new(),
        };
        entry.check = entry.digest();
        entry
    }

    fn digest(&self) -> String {
        let mut h = Sha256::new();
        for part in [
            self.key.to_string(),
            self.tool.clone(),
            self.arguments.to_string(),
            serde_json::to_string(&self.outcome).unwrap_or_default(),
        ] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    fn is_call(&self, call: &ToolCall) -> bool {
        self.tool == call.name && self.arguments == call.arguments
    }
}

/// A run's call journal (see the module docs). Shared by every episode of the run.
#[derive(Debug)]
pub struct CallJournal {
    path: PathBuf,
    run: String,
    entries: Mutex<HashMap<CallKey, Entry>>,
    file: Arc<Mutex<File>>,
}

impl CallJournal {
    /// Opens (or creates) the journal of run `run` at `path`, reading what it holds.
    pub fn open(path: &Path, run: &str) -> Result<Self, JournalError> {
        let io = |source| JournalError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(io)?;
        let (entries, good_len, torn) = read_entries(path, &file, run)?;
        if let Some(line) = torn {
            tracing::warn!(
                journal = %path.display(),
                "line {line} of the call journal was cut short by a crash; dropped (that call will be made again under its key)"
            );
            file.set_len(good_len).map_err(io)?;
            file.seek(std::io::SeekFrom::End(0)).map_err(io)?;
            file.sync_data().map_err(io)?;
        }
        Ok(Self {
            path: path.to_path_buf(),
            run: run.to_string(),
            entries: Mutex::new(entries),
            file: Arc::new(Mutex::new(file)),
        })
    }

    /// The journal's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The run whose calls it holds.
    pub fn run(&self) -> &str {
        &self.run
    }

    /// Calls recorded.
    pub fn len(&self) -> usize {
        self.lock_entries().len()
    }

    /// Whether no call is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What the journal knows of `call` under `key`.
    pub fn lookup(&self, key: &CallKey, call: &ToolCall) -> Lookup {
        match self.lock_entries().get(key) {
            None => Lookup::Absent,
            Some(e) if e.is_call(call) => Lookup::Replay(e.outcome.clone()),
            Some(_) => Lookup::Diverged,
        }
    }

    /// Records `call`'s outcome under `key`, on disk before it returns (the write and flush
    /// run on the blocking pool).
    pub async fn record(
        &self,
        key: &CallKey,
        call: &ToolCall,
        outcome: &CallOutcome,
    ) -> Result<(), JournalError> {
        let entry = Entry::new(key, call, outcome);
        let mut line = serde_json::to_vec(&entry).map_err(|e| JournalError::Io {
            path: self.path.clone(),
            source: e.into(),
        })?;
        line.push(b'\n');
        let file = self.file.clone();
        let write = tokio::task::spawn_blocking(move || {
            let mut f = file.lock().unwrap_or_else(|p| p.into_inner());
            f.write_all(&line)?;
            f.sync_data()
        });
        let written = match write.await {
            Ok(r) => r,
            Err(join) => Err(std::io::Error::other(join.to_string())),
        };
        written.map_err(|source| JournalError::Io {
            path: self.path.clone(),
            source,
        })?;
        self.lock_entries().insert(key.clone(), entry);
        Ok(())
    }

    /// Keeps only the calls of episodes for which `keep(episode)` holds: the file is
    /// rewritten beside itself and renamed over, so a crash leaves the old or the new one.
    /// Returns the calls dropped. Blocking.
    pub fn retain(&self, keep: impl Fn(u64) -> bool) -> Result<usize, JournalError> {
        let io = |source| JournalError::Io {
            path: self.path.clone(),
            source,
        };
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let mut entries = self.lock_entries();
        let before = entries.len();
        entries.retain(|key, _| keep(key.episode));
        if entries.len() == before {
            return Ok(0);
        }
        let tmp = self.path.with_extension("jsonl.tmp");
        {
            let mut out = std::io::BufWriter::new(File::create(&tmp).map_err(io)?);
            let mut kept: Vec<&Entry> = entries.values().collect();
            kept.sort_by(|a, b| {
                (a.key.episode, a.key.step, a.key.index, a.key.branch).cmp(&(
                    b.key.episode,
                    b.key.step,
                    b.key.index,
                    b.key.branch,
                ))
            });
            for e in kept {
                serde_json::to_writer(&mut out, e).map_err(|e| io(e.into()))?;
                out.write_all(b"\n").map_err(io)?;
            }
            let out = out.into_inner().map_err(|e| io(e.into_error()))?;
            out.sync_all().map_err(io)?;
        }
        std::fs::rename(&tmp, &self.path).map_err(io)?;
        if let Some(dir) = self.path.parent() {
            File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
        }
        *file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(&self.path)
            .map_err(io)?;
        Ok(before - entries.len())
    }

    fn lock_entries(&self) -> std::sync::MutexGuard<'_, HashMap<CallKey, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What a journal file holds: its entries, the length of its good part, and the number of
/// a last line cut short (no newline, not an entry), if any.
type Read = (HashMap<CallKey, Entry>, u64, Option<usize>);

/// Reads the entries of `file`.
fn read_entries(path: &Path, file: &File, run: &str) -> Result<Read, JournalError> {
    let io = |source| JournalError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut reader = BufReader::new(file);
    reader.rewind().map_err(io)?;
    let mut entries = HashMap::new();
    let mut good_len = 0u64;
    let mut buf = Vec::new();
    let mut number = 0;
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf).map_err(io)?;
        if n == 0 {
            return Ok((entries, good_len, None));
        }
        number += 1;
        let complete = buf.last() == Some(&b'\n');
        let corrupt = |reason: String| JournalError::Corrupt {
            path: path.to_path_buf(),
            line: number,
            reason,
        };
        let entry: Entry = match serde_json::from_slice(&buf) {
            Ok(e) => e,
            Err(_) if !complete => return Ok((entries, good_len, Some(number))),
            Err(e) => return Err(corrupt(format!("not a journal entry ({e})"))),
        };
        if entry.digest() != entry.check {
            return Err(corrupt(format!(
                "the key {} does not match its call (the check differs)",
                entry.key
            )));
        }
        if entry.key.run != run {
            return Err(corrupt(format!(
                "the key {} belongs to run `{}`, not this run (`{run}`)",
                entry.key, entry.key.run
            )));
        }
        if let Some(earlier) = entries.get(&entry.key) {
            if !Entry::is_call(
                earlier,
                &ToolCall {
                    name: entry.tool.clone(),
                    arguments: entry.arguments.clone(),
                },
            ) {
                return Err(corrupt(format!(
                    "the key {} was recorded before for another call",
                    entry.key
                )));
            }
        }
        good_len += n as u64;
        if !complete {
            // A whole entry whose newline the crash cut: keep it, end the line.
            let mut f = file;
            f.write_all(b"\n").map_err(io)?;
            good_len += 1;
        }
        entries.entry(entry.key.clone()).or_insert(entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::ToolOutput;
    use serde_json::json;
    use std::time::Duration;

    fn key(episode: u64, step: u32) -> CallKey {
        CallKey {
            run: "run1".into(),
            episode,
            step,
            index: 0,
            branch: 0,
        }
    }

    fn call(code: &str) -> ToolCall {
        ToolCall {
            name: "python".into(),
            arguments: json!({"code": code}),
        }
    }

    fn outcome(text: &str) -> CallOutcome {
        CallOutcome {
            name: Some("python".into()),
            result: Ok(ToolOutput::text(text)),
            latency: Duration::from_millis(7),
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn recorded_calls_are_replayed_after_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.jsonl");
        let j = CallJournal::open(&path, "run1").unwrap();
        assert_eq!(j.lookup(&key(1, 0), &call("a")), Lookup::Absent);
        rt().block_on(async {
            j.record(&key(1, 0), &call("a"), &outcome("A"))
                .await
                .unwrap();
            j.record(&key(2, 1), &call("b"), &outcome("B"))
                .await
                .unwrap();
        });
        drop(j);
        let j = CallJournal::open(&path, "run1").unwrap();
        assert_eq!(j.len(), 2);
        assert_eq!(
            j.lookup(&key(1, 0), &call("a")),
            Lookup::Replay(outcome("A"))
        );
        assert_eq!(j.lookup(&key(1, 0), &call("other")), Lookup::Diverged);
        assert_eq!(
            j.lookup(&key(1, 0).next_branch(), &call("other")),
            Lookup::Absent
        );
    }

    #[test]
    fn a_line_cut_by_a_crash_is_dropped_and_later_appends_stay_readable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.jsonl");
        let j = CallJournal::open(&path, "run1").unwrap();
        rt().block_on(j.record(&key(1, 0), &call("a"), &outcome("A")))
            .unwrap();
        drop(j);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"key":{"run":"run1","episode":2,"st"#)
            .unwrap();
        drop(f);
        let j = CallJournal::open(&path, "run1").unwrap();
        assert_eq!(j.len(), 1);
        rt().block_on(j.record(&key(3, 0), &call("c"), &outcome("C")))
            .unwrap();
        drop(j);
        let j = CallJournal::open(&path, "run1").unwrap();
        assert_eq!(j.len(), 2);
        assert_eq!(
            j.lookup(&key(3, 0), &call("c")),
            Lookup::Replay(outcome("C"))
        );
    }

    #[test]
    fn altered_foreign_or_unreadable_lines_refuse_the_journal_naming_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.jsonl");
        let j = CallJournal::open(&path, "run1").unwrap();
        rt().block_on(async {
            j.record(&key(1, 0), &call("a"), &outcome("A"))
                .await
                .unwrap();
            j.record(&key(2, 0), &call("b"), &outcome("B"))
                .await
                .unwrap();
        });
        drop(j);
        let good = std::fs::read_to_string(&path).unwrap();
        let cases = [
            (
                good.replacen(r#""episode":2"#, r#""episode":9"#, 1),
                "does not match its call",
            ),
            (
                good.replacen(r#""code":"b""#, r#""code":"rm""#, 1),
                "does not match its call",
            ),
            (format!("not json\n{good}"), "not a journal entry"),
        ];
        for (text, why) in cases {
            std::fs::write(&path, &text).unwrap();
            let err = CallJournal::open(&path, "run1").unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
            assert!(err.contains(&path.display().to_string()), "{err}");
            assert!(err.contains("line "), "{err}");
            assert_eq!(err.lines().count(), 1, "{err}");
            // Nothing was changed by the refusal.
            assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        }
        std::fs::write(&path, &good).unwrap();
        let err = CallJournal::open(&path, "run2").unwrap_err().to_string();
        assert!(err.contains("belongs to run `run1`"), "{err}");
    }

    #[test]
    fn retain_drops_other_episodes_on_disk_too() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.jsonl");
        let j = CallJournal::open(&path, "run1").unwrap();
        rt().block_on(async {
            for e in 0..6 {
                j.record(&key(e, 0), &call("x"), &outcome("X"))
                    .await
                    .unwrap();
            }
        });
        assert_eq!(j.retain(|episode| episode % 2 == 0).unwrap(), 3);
        rt().block_on(j.record(&key(8, 0), &call("y"), &outcome("Y")))
            .unwrap();
        drop(j);
        let j = CallJournal::open(&path, "run1").unwrap();
        assert_eq!(j.len(), 4);
        assert_eq!(j.lookup(&key(1, 0), &call("x")), Lookup::Absent);
        assert_eq!(
            j.lookup(&key(4, 0), &call("x")),
            Lookup::Replay(outcome("X"))
        );
        assert!(!dir.path().join("journal.jsonl.tmp").exists());
    }
}
