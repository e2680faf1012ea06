//! Checkpoint layout, atomic commits, verification and retention (files only, no tensors).
//!
//! A training run can die at any instant (OOM killer, preemption, a full disk). A resume
//! must then start from a checkpoint that is whole, never from one half-written. So:
//!
//! - a checkpoint is built in `RUN/checkpoints/.tmp-step-K-<pid>/`: the caller writes the
//!   model directories there (the learner's `save`), plus files through
//!   [`PendingCheckpoint::write_file`] / [`PendingCheckpoint::write_jsonl`];
//! - [`PendingCheckpoint::commit`] hashes every file (SHA-256), writes `manifest.json` last
//!   (training state, file list with sizes and hashes, `complete: true`), fsyncs files and
//!   directories, then renames the directory to `RUN/checkpoints/step-K/` (atomic on one
//!   filesystem) and fsyncs the parent;
//! - [`latest_complete`] returns the newest `step-K` whose manifest verifies (every file
//!   present with its size and hash); anything else — no manifest, unreadable or
//!   incomplete manifest, missing/truncated/altered file, leftover tmp directory — is
//!   skipped with a `tracing::warn!` naming the directory and the reason;
//! - [`prune`] keeps the newest `keep_last` committed checkpoints and removes older ones
//!   and tmp directories left by dead processes.
//!
//! Trajectories collected but not yet trained on (async mode) travel inside the checkpoint
//! as `pending_trajectories.jsonl` ([`PENDING_TRAJECTORIES`]), so a resume loses no samples.

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The manifest's file name inside a checkpoint.
pub const MANIFEST: &str = "manifest.json";
/// Trajectories collected but not trained on, one JSON object per line.
pub const PENDING_TRAJECTORIES: &str = "pending_trajectories.jsonl";
/// The episodes in flight at the checkpoint, with their finished steps (a resume continues
/// them from there).
pub const IN_FLIGHT_EPISODES: &str = "in_flight_episodes.jsonl";
/// Manifest layout version; bumped on incompatible changes.
pub const FORMAT_VERSION: u32 = 1;

const TMP_PREFIX: &str = ".tmp-step-";
const STEP_PREFIX: &str = "step-";

/// Errors of checkpoint I/O.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file-system operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path operated on.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A checkpoint does not verify.
    #[error("checkpoint {}: {reason}", dir.display())]
    Damaged {
        /// The checkpoint directory.
        dir: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A caller-supplied file name would leave the checkpoint directory.
    #[error("bad file name {name:?} in a checkpoint: {reason}")]
    BadName {
        /// The name given.
        name: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A value could not be serialised.
    #[error("serialising {what}: {source}")]
    Json {
        /// What was being written.
        what: String,
        /// The serde error.
        source: serde_json::Error,
    },
}

type Result<T> = std::result::Result<T, CheckpointError>;

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where a run stands, enough to continue it exactly.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainingState {
    /// Learner updates done.
    pub step: u64,
    /// Policy version of the saved weights (the engine's clock for staleness).
    pub policy_version: u64,
    /// Tasks drawn so far from the run's (seeded) task stream.
    pub data_position: u64,
    /// Positions below `data_position` whose groups were still being sampled (async mode):
    /// a resume samples them again first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requeue_positions: Vec<u64>,
    /// The run's seed.
    pub seed: u64,
    /// Whatever state the loop's random generators need to continue their streams (opaque
    /// to this module, e.g. `{"sampler": [word_pos, stream]}`).
    #[serde(default)]
    pub rng_state: serde_json::Value,
}

/// One file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Path relative to the checkpoint directory, `/`-separated.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256 of the contents, lowercase hex.
    pub sha256: String,
}

/// `manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT_VERSION`] at write time.
    pub format_version: u32,
    /// The run's state at this step.
    pub state: TrainingState,
    /// Every file of the checkpoint except the manifest, sorted by path.
    pub files: Vec<FileEntry>,
    /// Written last; a manifest without `complete: true` is not a checkpoint.
    pub complete: bool,
}

/// A committed, verified checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// `RUN/checkpoints/step-K`.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
}

impl Checkpoint {
    /// The step (learner updates done).
    pub fn step(&self) -> u64 {
        self.manifest.state.step
    }

    /// A file of the checkpoint (e.g. `"policy"` for a model directory the caller saved).
    pub fn path(&self, relative: &str) -> PathBuf {
        self.dir.join(relative)
    }

    /// The pending-trajectories file, when the checkpoint has one.
    pub fn pending_trajectories(&self) -> Option<PathBuf> {
        self.manifest
            .files
            .iter()
            .any(|f| f.path == PENDING_TRAJECTORIES)
            .then(|| self.dir.join(PENDING_TRAJECTORIES))
    }

    /// The in-flight episodes file, when the checkpoint has one.
    pub fn in_flight_episodes(&self) -> Option<PathBuf> {
        self.manifest
            .files
            .iter()
            .any(|f| f.path == IN_FLIGHT_EPISODES)
            .then(|| self.dir.join(IN_FLIGHT_EPISODES))
    }

    /// Opens and fully verifies the checkpoint in `dir` (sizes and hashes of every file).
    pub fn open(dir: &Path) -> Result<Self> {
        let damaged = |reason: String| CheckpointError::Damaged {
            dir: dir.to_path_buf(),
            reason,
        };
        let manifest_path = dir.join(MANIFEST);
        let text = match fs::read(&manifest_path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(damaged(format!("no {MANIFEST} (interrupted write?)")))
            }
            Err(e) => return Err(damaged(format!("cannot read {MANIFEST}: {e}"))),
        };
        let manifest: Manifest = serde_json::from_slice(&text)
            .map_err(|e| damaged(format!("{MANIFEST} is not a valid manifest: {e}")))?;
        if !manifest.complete {
            return Err(damaged(format!("{MANIFEST} does not say complete: true")));
        }
        if manifest.format_version != FORMAT_VERSION {
            return Err(damaged(format!(
                "manifest format {} (this build reads {FORMAT_VERSION})",
                manifest.format_version
            )));
        }
        if let Some(step) = step_of(dir) {
            if step != manifest.state.step {
                return Err(damaged(format!(
                    "directory says step {step} but the manifest says {}",
                    manifest.state.step
                )));
            }
        }
        for entry in &manifest.files {
            check_name(&entry.path).map_err(|e| damaged(e.to_string()))?;
            let path = dir.join(&entry.path);
            let (size, sha) = hash_file(&path).map_err(|e| match e {
                CheckpointError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound => {
                    damaged(format!("{} is missing", entry.path))
                }
                other => damaged(other.to_string()),
            })?;
            if size != entry.size {
                return Err(damaged(format!(
                    "{} has {size} bytes, the manifest says {} (truncated?)",
                    entry.path, entry.size
                )));
            }
            if sha != entry.sha256 {
                return Err(damaged(format!(
                    "{} does not match its SHA-256 in the manifest (altered or corrupted)",
                    entry.path
                )));
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            manifest,
        })
    }
}

/// `RUN/checkpoints`.
pub fn checkpoints_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

/// A checkpoint being written; dropped without [`Self::commit`], its tmp directory is
/// removed.
#[derive(Debug)]
pub struct PendingCheckpoint {
    tmp: PathBuf,
    step: u64,
    committed: bool,
}

/// Starts checkpoint `step` of the run in `run_dir`: creates (afresh) the tmp directory the
/// caller writes into.
pub fn begin(run_dir: &Path, step: u64) -> Result<PendingCheckpoint> {
    let root = checkpoints_dir(run_dir);
    fs::create_dir_all(&root).map_err(io_err(&root))?;
    let tmp = root.join(format!("{TMP_PREFIX}{step}-{}", std::process::id()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(io_err(&tmp))?;
    }
    fs::create_dir(&tmp).map_err(io_err(&tmp))?;
    Ok(PendingCheckpoint {
        tmp,
        step,
        committed: false,
    })
}

impl PendingCheckpoint {
    /// The directory to write into (e.g. `learner.save(&pending.dir().join("policy"))`).
    pub fn dir(&self) -> &Path {
        &self.tmp
    }

    /// The step being saved.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Writes `bytes` to `relative` (a `/`-separated path inside the checkpoint).
    pub fn write_file(&self, relative: &str, bytes: &[u8]) -> Result<()> {
        let path = self.target(relative)?;
        fs::write(&path, bytes).map_err(io_err(&path))
    }

    /// Copies a file from elsewhere into the checkpoint as `relative`.
    pub fn copy_file(&self, relative: &str, from: &Path) -> Result<()> {
        let path = self.target(relative)?;
        fs::copy(from, &path).map_err(io_err(from))?;
        Ok(())
    }

    /// Writes items as JSON lines to `relative` (for [`PENDING_TRAJECTORIES`]).
    pub fn write_jsonl<'a, T: Serialize + 'a>(
        &self,
        relative: &str,
        items: impl IntoIterator<Item = &'a T>,
    ) -> Result<()> {
        let path = self.target(relative)?;
        let mut out = BufWriter::new(File::create(&path).map_err(io_err(&path))?);
        for item in items {
            serde_json::to_writer(&mut out, item).map_err(|source| CheckpointError::Json {
                what: relative.to_string(),
                source,
            })?;
            out.write_all(b"\n").map_err(io_err(&path))?;
        }
        out.flush().map_err(io_err(&path))
    }

    fn target(&self, relative: &str) -> Result<PathBuf> {
        check_name(relative)?;
        if relative == MANIFEST {
            return Err(CheckpointError::BadName {
                name: relative.into(),
                reason: "the manifest is written by commit",
            });
        }
        let path = self.tmp.join(relative);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io_err(parent))?;
        }
        Ok(path)
    }

    /// Hashes and fsyncs every file, writes the manifest with `state` (its `step` is set to
    /// this checkpoint's), and renames the directory into place. A checkpoint of the same
    /// step already there (a damaged one a resume skipped) is replaced.
    pub fn commit(mut self, mut state: TrainingState) -> Result<Checkpoint> {
        state.step = self.step;
        let mut files = Vec::new();
        collect_files(&self.tmp, &self.tmp, &mut files)?;
        files.sort();
        let mut entries = Vec::with_capacity(files.len());
        for relative in files {
            let path = self.tmp.join(&relative);
            File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(io_err(&path))?;
            let (size, sha256) = hash_file(&path)?;
            entries.push(FileEntry {
                path: relative,
                size,
                sha256,
            });
        }
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            state,
            files: entries,
            complete: true,
        };
        let json =
            serde_json::to_vec_pretty(&manifest).map_err(|source| CheckpointError::Json {
                what: MANIFEST.into(),
                source,
            })?;
        let manifest_path = self.tmp.join(MANIFEST);
        let mut f = File::create(&manifest_path).map_err(io_err(&manifest_path))?;
        f.write_all(&json)
            .and_then(|()| f.sync_all())
            .map_err(io_err(&manifest_path))?;
        sync_dirs(&self.tmp)?;

        let root = self.tmp.parent().unwrap_or(Path::new(".")).to_path_buf();
        let dir = root.join(format!("{STEP_PREFIX}{}", self.step));
        if dir.exists() {
            let trash = root.join(format!(".trash-step-{}-{}", self.step, std::process::id()));
            fs::rename(&dir, &trash).map_err(io_err(&dir))?;
            fs::rename(&self.tmp, &dir).map_err(io_err(&self.tmp))?;
            fs::remove_dir_all(&trash).map_err(io_err(&trash))?;
        } else {
            fs::rename(&self.tmp, &dir).map_err(io_err(&self.tmp))?;
        }
        self.committed = true;
        sync_dir(&root)?;
        tracing::info!(dir = %dir.display(), "checkpoint committed");
        Ok(Checkpoint { dir, manifest })
    }
}

impl Drop for PendingCheckpoint {
    fn drop(&mut self) {
        if !self.committed {
            // Best effort: a leftover is skipped by `latest_complete` and removed by `prune`.
            let _ = fs::remove_dir_all(&self.tmp);
        }
    }
}

/// The newest checkpoint of the run that verifies, or `None`. Damaged or partial ones and
/// leftover tmp directories are skipped with a warning saying which and why.
pub fn latest_complete(run_dir: &Path) -> Result<Option<Checkpoint>> {
    let root = checkpoints_dir(run_dir);
    let entries = match list(&root) {
        Ok(e) => e,
        Err(CheckpointError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    for (name, _) in entries.iter().filter(|(n, _)| n.starts_with(TMP_PREFIX)) {
        tracing::warn!(
            dir = %root.join(name).display(),
            "skipping checkpoint: leftover temporary directory of an interrupted save"
        );
    }
    let mut steps: Vec<(u64, PathBuf)> = entries
        .into_iter()
        .filter_map(|(_, path)| step_of(&path).map(|s| (s, path)))
        .collect();
    steps.sort_by_key(|s| std::cmp::Reverse(s.0));
    for (_, dir) in steps {
        match Checkpoint::open(&dir) {
            Ok(c) => return Ok(Some(c)),
            Err(CheckpointError::Damaged { dir, reason }) => {
                tracing::warn!(dir = %dir.display(), %reason, "skipping checkpoint: {reason}");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// Keeps the newest `keep_last` committed checkpoints (a manifest saying `complete: true`
/// and every file at its recorded size; hashes are not re-read here) and deletes older `step-K` directories, plus tmp
/// directories of other processes. Newer damaged directories are left for inspection.
/// Returns what was removed.
pub fn prune(run_dir: &Path, keep_last: usize) -> Result<Vec<PathBuf>> {
    let root = checkpoints_dir(run_dir);
    let entries = list(&root)?;
    let mut removed = Vec::new();
    let own = format!("-{}", std::process::id());
    for (name, path) in &entries {
        let stale_tmp = (name.starts_with(TMP_PREFIX) || name.starts_with(".trash-step-"))
            && !name.ends_with(&own);
        if stale_tmp {
            fs::remove_dir_all(path).map_err(io_err(path))?;
            removed.push(path.clone());
        }
    }
    let mut steps: Vec<(u64, PathBuf)> = entries
        .into_iter()
        .filter_map(|(_, path)| step_of(&path).map(|s| (s, path)))
        .collect();
    steps.sort_by_key(|s| std::cmp::Reverse(s.0));
    let committed: Vec<u64> = steps
        .iter()
        .filter(|(_, dir)| looks_complete(dir))
        .map(|(s, _)| *s)
        .take(keep_last.max(1))
        .collect();
    let Some(&oldest_kept) = committed.last() else {
        return Ok(removed);
    };
    for (step, dir) in steps {
        if step < oldest_kept {
            fs::remove_dir_all(&dir).map_err(io_err(&dir))?;
            removed.push(dir);
        }
    }
    Ok(removed)
}

/// The cheap half of [`Checkpoint::open`]: a complete manifest and every file at its size
/// (no hashing, so pruning after each save stays fast with multi-GB weights).
fn looks_complete(dir: &Path) -> bool {
    let Some(m) = fs::read(dir.join(MANIFEST))
        .ok()
        .and_then(|t| serde_json::from_slice::<Manifest>(&t).ok())
    else {
        return false;
    };
    m.complete
        && m.files.iter().all(|f| {
            check_name(&f.path).is_ok()
                && fs::metadata(dir.join(&f.path)).is_ok_and(|md| md.len() == f.size)
        })
}

/// `(name, path)` of the entries of `root` that are directories.
fn list(root: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(root).map_err(io_err(root))? {
        let entry = entry.map_err(io_err(root))?;
        let path = entry.path();
        if path.is_dir() {
            if let Some(name) = entry.file_name().to_str() {
                out.push((name.to_string(), path));
            }
        }
    }
    Ok(out)
}

/// `K` of a `step-K` directory.
fn step_of(dir: &Path) -> Option<u64> {
    dir.file_name()?
        .to_str()?
        .strip_prefix(STEP_PREFIX)?
        .parse()
        .ok()
}

/// Refuses names that are absolute, empty, or climb out with `..`.
fn check_name(relative: &str) -> Result<()> {
    let bad = |reason| {
        Err(CheckpointError::BadName {
            name: relative.into(),
            reason,
        })
    };
    if relative.is_empty() {
        return bad("empty");
    }
    for c in Path::new(relative).components() {
        match c {
            Component::Normal(_) => {}
            Component::CurDir => return bad("contains `.`"),
            Component::ParentDir => return bad("contains `..`"),
            Component::RootDir | Component::Prefix(_) => return bad("absolute"),
        }
    }
    Ok(())
}

/// Relative `/`-separated paths of the regular files under `dir` (the manifest excluded).
fn collect_files(base: &Path, dir: &Path, out: &mut Vec<String>) -> Result<()> {
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(io_err(&path))?;
        if kind.is_dir() {
            collect_files(base, &path, out)?;
        } else if kind.is_file() {
            let rel = path.strip_prefix(base).unwrap_or(&path);
            let rel: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let rel = rel.join("/");
            if rel != MANIFEST {
                out.push(rel);
            }
        }
    }
    Ok(())
}

/// Size and SHA-256 (hex) of a file, streamed.
fn hash_file(path: &Path) -> Result<(u64, String)> {
    crate::file_digest::sha256_file(path).map_err(io_err(path))
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

/// fsyncs `dir` and every directory under it, so new entries are durable before the rename.
fn sync_dirs(dir: &Path) -> Result<()> {
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        if entry.file_type().map_err(io_err(dir))?.is_dir() {
            sync_dirs(&entry.path())?;
        }
    }
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Runs `f` with a subscriber that captures log lines, and returns them.
    fn capture_logs<R>(f: impl FnOnce() -> R) -> (R, String) {
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl Write for Buf {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        let r = tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        (r, text)
    }

    fn save(run: &Path, step: u64, payload: &[u8]) -> Checkpoint {
        let p = begin(run, step).unwrap();
        // As the learner's `save` would: a model directory inside the checkpoint.
        fs::create_dir_all(p.dir().join("policy")).unwrap();
        fs::write(p.dir().join("policy/model.safetensors"), payload).unwrap();
        fs::write(p.dir().join("policy/config.json"), b"{}").unwrap();
        p.commit(TrainingState {
            step,
            policy_version: step + 100,
            data_position: step * 32,
            requeue_positions: vec![],
            seed: 7,
            rng_state: serde_json::json!({"sampler": [step, 1]}),
        })
        .unwrap()
    }

    #[test]
    fn round_trip_with_state_files_and_pending_trajectories() {
        let run = tempfile::tempdir().unwrap();
        assert!(latest_complete(run.path()).unwrap().is_none());
        let p = begin(run.path(), 3).unwrap();
        fs::create_dir_all(p.dir().join("policy")).unwrap();
        fs::write(p.dir().join("policy/model.safetensors"), vec![7u8; 3000]).unwrap();
        let pending = vec![
            serde_json::json!({"id": 1, "reward": 0.5}),
            serde_json::json!({"id": 2, "reward": -1.0}),
        ];
        p.write_jsonl(PENDING_TRAJECTORIES, &pending).unwrap();
        p.write_file("optimizer/state.bin", b"adam").unwrap();
        let tmp = p.dir().to_path_buf();
        let state = TrainingState {
            step: 999, // overwritten by the checkpoint's own step
            policy_version: 4,
            data_position: 96,
            requeue_positions: vec![90, 94],
            seed: 11,
            rng_state: serde_json::json!([1, 2, 3]),
        };
        let written = p.commit(state.clone()).unwrap();
        assert!(!tmp.exists(), "the tmp directory was renamed");
        assert_eq!(written.dir, checkpoints_dir(run.path()).join("step-3"));

        let c = latest_complete(run.path()).unwrap().unwrap();
        assert_eq!(c, written);
        assert_eq!(c.step(), 3);
        assert_eq!(c.manifest.state.policy_version, 4);
        assert_eq!(c.manifest.state.data_position, 96);
        assert_eq!(c.manifest.state.rng_state, serde_json::json!([1, 2, 3]));
        let names: Vec<&str> = c.manifest.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            names,
            [
                "optimizer/state.bin",
                PENDING_TRAJECTORIES,
                "policy/model.safetensors"
            ]
        );
        assert_eq!(c.manifest.files[2].size, 3000);
        // SHA-256 of "adam".
        assert_eq!(
            c.manifest.files[0].sha256,
            "f7f376a1fcd0d0e11a10ed1b6577c99784d3a6bbe669b1d13fae43eb64634f6e"
        );
        let lines = fs::read_to_string(c.pending_trajectories().unwrap()).unwrap();
        let back: Vec<serde_json::Value> = lines
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(back, pending);
        assert_eq!(
            fs::read(c.path("policy/model.safetensors")).unwrap(),
            vec![7u8; 3000]
        );
    }

    #[test]
    fn names_that_escape_the_checkpoint_are_refused() {
        let run = tempfile::tempdir().unwrap();
        let p = begin(run.path(), 1).unwrap();
        for bad in ["../x", "/etc/passwd", "", "a/../../b", MANIFEST] {
            assert!(
                matches!(
                    p.write_file(bad, b"x"),
                    Err(CheckpointError::BadName { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn dropped_without_commit_leaves_nothing() {
        let run = tempfile::tempdir().unwrap();
        let p = begin(run.path(), 1).unwrap();
        p.write_file("a", b"x").unwrap();
        let tmp = p.dir().to_path_buf();
        drop(p);
        assert!(!tmp.exists());
        assert!(latest_complete(run.path()).unwrap().is_none());
    }

    #[test]
    fn retention_keeps_the_last_k() {
        let run = tempfile::tempdir().unwrap();
        for step in [1, 2, 3, 4, 5] {
            save(run.path(), step, b"w");
        }
        // A leftover of a dead process (pid 0 is never ours) is removed too.
        let stale = checkpoints_dir(run.path()).join(".tmp-step-6-0");
        fs::create_dir_all(&stale).unwrap();
        let removed = prune(run.path(), 2).unwrap();
        assert_eq!(removed.len(), 4, "{removed:?}");
        let mut left: Vec<String> = fs::read_dir(checkpoints_dir(run.path()))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["step-4", "step-5"]);
        assert_eq!(latest_complete(run.path()).unwrap().unwrap().step(), 5);
        // Saving the same step again replaces it.
        let again = save(run.path(), 5, b"new weights");
        assert_eq!(again.manifest.files[0].path, "policy/config.json");
        assert_eq!(
            fs::read(again.path("policy/model.safetensors")).unwrap(),
            b"new weights"
        );
    }

    #[test]
    fn truncated_file_and_leftover_tmp_dir_are_skipped_with_warnings() {
        let run = tempfile::tempdir().unwrap();
        save(run.path(), 10, b"good weights");
        let newer = save(run.path(), 20, b"weights that will be truncated");
        let f = File::options()
            .write(true)
            .open(newer.path("policy/model.safetensors"))
            .unwrap();
        f.set_len(5).unwrap();
        drop(f);
        // An interrupted save of a later step: no manifest, tmp name.
        let tmp = checkpoints_dir(run.path()).join(".tmp-step-30-12345");
        fs::create_dir_all(tmp.join("policy")).unwrap();
        fs::write(tmp.join("policy/model.safetensors"), b"half").unwrap();

        let (found, logs) = capture_logs(|| latest_complete(run.path()).unwrap());
        assert_eq!(found.unwrap().step(), 10);
        assert!(logs.contains("WARN"), "{logs}");
        assert!(
            logs.contains(".tmp-step-30-12345") && logs.contains("interrupted save"),
            "{logs}"
        );
        assert!(
            logs.contains("step-20") && logs.contains("policy/model.safetensors has 5 bytes"),
            "{logs}"
        );
        // Retention does not count the truncated checkpoint as a kept one: step 10 stays,
        // and the dead process's tmp directory goes.
        let removed = prune(run.path(), 1).unwrap();
        assert_eq!(removed, [tmp], "{removed:?}");
        assert_eq!(latest_complete(run.path()).unwrap().unwrap().step(), 10);
    }

    #[test]
    fn corrupted_or_missing_manifest_and_altered_bytes_are_skipped() {
        let run = tempfile::tempdir().unwrap();
        save(run.path(), 1, b"first");
        // Manifest cut short (as by a crash without the tmp+rename protocol).
        let c2 = save(run.path(), 2, b"second");
        let m = fs::read(c2.path(MANIFEST)).unwrap();
        fs::write(c2.path(MANIFEST), &m[..m.len() / 2]).unwrap();
        // A directory with files but no manifest at all.
        let c3 = checkpoints_dir(run.path()).join("step-3");
        fs::create_dir_all(&c3).unwrap();
        fs::write(c3.join("x"), b"x").unwrap();
        // Same size, different bytes: only the hash can tell.
        let c4 = save(run.path(), 4, b"fourth");
        fs::write(c4.path("policy/model.safetensors"), b"FOURTH").unwrap();
        // A manifest that never got `complete: true`.
        let c5 = save(run.path(), 5, b"fifth");
        let mut m: Manifest =
            serde_json::from_slice(&fs::read(c5.path(MANIFEST)).unwrap()).unwrap();
        m.complete = false;
        fs::write(c5.path(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();

        let (found, logs) = capture_logs(|| latest_complete(run.path()).unwrap());
        assert_eq!(found.unwrap().step(), 1, "{logs}");
        assert!(logs.contains("complete: true"), "{logs}");
        assert!(logs.contains("SHA-256"), "{logs}");
        assert!(logs.contains("no manifest.json"), "{logs}");
        assert!(logs.contains("not a valid manifest"), "{logs}");
        assert_eq!(logs.matches("WARN").count(), 4, "{logs}");
    }
}
