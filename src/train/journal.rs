//! The run's id and its tool-call journal, kept in the run directory across restarts: an
//! episode sampled again after a crash makes its tool calls under the keys it made them
//! under before, and takes the journaled results of those that finished.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;

use agent_r1_envs::call_journal::CallJournal;
use agent_r1_envs::call_key::{check_run_id, new_run_id};

/// The run id, one line, written once.
pub(crate) const RUN_ID_FILE: &str = "run-id";
/// The journal of finished tool calls.
pub(crate) const JOURNAL_FILE: &str = "tool-calls.jsonl";

/// The run directory's id (made and written on first use) and its call journal.
pub(super) fn open(run_dir: &Path) -> anyhow::Result<Arc<CallJournal>> {
    let id = run_id(run_dir)?;
    let path = run_dir.join(JOURNAL_FILE);
    let journal = CallJournal::open(&path, &id)?;
    if !journal.is_empty() {
        eprintln!(
            "tool-call journal: {} finished calls in {} (answered from there when made again)",
            journal.len(),
            path.display()
        );
    }
    Ok(Arc::new(journal))
}

fn run_id(run_dir: &Path) -> anyhow::Result<String> {
    let path = run_dir.join(RUN_ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let id = text.trim();
            check_run_id(id).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            Ok(id.to_string())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = new_run_id();
            let tmp = run_dir.join(format!("{RUN_ID_FILE}.tmp"));
            std::fs::write(&tmp, format!("{id}\n"))
                .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
                .and_then(|()| std::fs::rename(&tmp, &path))
                .and_then(|()| std::fs::File::open(run_dir)?.sync_all())
                .with_context(|| format!("{}: cannot write the run id", path.display()))?;
            Ok(id)
        }
        Err(e) => Err(e).with_context(|| format!("{}: cannot read the run id", path.display())),
    }
}
