//! The episodes of one rollouts file, listed from its index (`X.idx`, written by the
//! trainer beside `X.jsonl`) and kept in memory while the files do not change. A file
//! without an index (older runs) is indexed by reading it once.

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use agent_r1_actors::trajectory::index::{index_path, EpisodeSummary};
use agent_r1_actors::trajectory::Trajectory;
use serde_json::Value;

use super::run_dir::{RunDir, Source};
use super::ViewError;

/// Longest episode line the viewer reads (a longer one is reported, not loaded).
const MAX_EPISODE_BYTES: u64 = 256 << 20;
/// Indexes kept in memory at once (the least recently used goes first).
const CACHED_INDEXES: usize = 16;

/// The episodes of a rollouts file.
#[derive(Debug)]
pub struct EpisodeIndex {
    /// One row per episode, in file order.
    pub rows: Vec<EpisodeSummary>,
    /// 1-based numbers of lines that did not parse (a line cut short by a crash, say).
    pub damaged: Vec<usize>,
    /// Whether the rows came from reading the data file (no index beside it).
    pub scanned: bool,
}

type Stamp = (u64, Option<SystemTime>, u64, Option<SystemTime>);

/// Indexes by source, reloaded when their files change; at most 16 are kept.
#[derive(Debug, Default)]
pub struct IndexCache {
    loaded: Mutex<Loaded>,
}

/// Cached indexes with their files' stamps and when each was last used.
#[derive(Debug, Default)]
struct Loaded {
    entries: HashMap<Source, (Stamp, Arc<EpisodeIndex>, u64)>,
    clock: u64,
}

fn stamp(path: &Path) -> (u64, Option<SystemTime>) {
    match fs::metadata(path) {
        Ok(m) => (m.len(), m.modified().ok()),
        Err(_) => (0, None),
    }
}

impl IndexCache {
    /// The index of `source`.
    pub fn get(&self, run: &RunDir, source: Source) -> Result<Arc<EpisodeIndex>, ViewError> {
        let data = run.data_path(source);
        if !data.is_file() {
            let known: Vec<String> = run.sources().iter().map(Source::name).collect();
            return Err(ViewError::NotFound(format!(
                "no rollouts file {} in this run; there are: {}",
                source.name(),
                if known.is_empty() {
                    "none yet".to_string()
                } else {
                    known.join(", ")
                }
            )));
        }
        let idx = index_path(&data);
        let (a, b) = (stamp(&data), stamp(&idx));
        let key: Stamp = (a.0, a.1, b.0, b.1);
        {
            let mut loaded = self.lock();
            loaded.clock += 1;
            let now = loaded.clock;
            if let Some((k, index, used)) = loaded.entries.get_mut(&source) {
                if *k == key {
                    *used = now;
                    return Ok(index.clone());
                }
            }
        }
        let index = Arc::new(if idx.is_file() {
            load_index(&idx)?
        } else {
            scan(&data)?
        });
        let mut loaded = self.lock();
        if loaded.entries.len() >= CACHED_INDEXES && !loaded.entries.contains_key(&source) {
            let oldest = loaded
                .entries
                .iter()
                .min_by_key(|(_, (_, _, used))| *used)
                .map(|(s, _)| *s);
            if let Some(oldest) = oldest {
                loaded.entries.remove(&oldest);
            }
        }
        let now = loaded.clock;
        loaded.entries.insert(source, (key, index.clone(), now));
        Ok(index)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Loaded> {
        self.loaded.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn io_error(path: &Path, e: std::io::Error) -> ViewError {
    ViewError::RunDir(format!("{}: cannot read: {e}", path.display()))
}

fn load_index(path: &Path) -> Result<EpisodeIndex, ViewError> {
    let bytes = fs::read(path).map_err(|e| io_error(path, e))?;
    let mut out = EpisodeIndex {
        rows: Vec::new(),
        damaged: vec![],
        scanned: false,
    };
    for (i, line) in bytes.split(|b| *b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        match serde_json::from_slice::<EpisodeSummary>(line) {
            Ok(row) => out.rows.push(row),
            Err(_) => out.damaged.push(i + 1),
        }
    }
    Ok(out)
}

fn scan(path: &Path) -> Result<EpisodeIndex, ViewError> {
    let file = fs::File::open(path).map_err(|e| io_error(path, e))?;
    let mut reader = BufReader::new(file);
    let mut out = EpisodeIndex {
        rows: Vec::new(),
        damaged: vec![],
        scanned: true,
    };
    let (mut offset, mut line, mut number) = (0u64, Vec::new(), 0usize);
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(|e| io_error(path, e))?;
        if n == 0 {
            break;
        }
        number += 1;
        let body = line.strip_suffix(b"\n").unwrap_or(&line);
        match serde_json::from_slice::<Trajectory>(body) {
            Ok(t) => out
                .rows
                .push(EpisodeSummary::of(&t, offset, body.len() as u64)),
            Err(_) if body.iter().all(u8::is_ascii_whitespace) => {}
            Err(_) => out.damaged.push(number),
        }
        offset += n as u64;
    }
    Ok(out)
}

/// Reads one episode's line (as JSON, with the decoded texts the trainer added).
pub fn read_episode(
    run: &RunDir,
    source: Source,
    row: &EpisodeSummary,
) -> Result<Value, ViewError> {
    let path = run.data_path(source);
    if row.bytes > MAX_EPISODE_BYTES {
        return Err(ViewError::RunDir(format!(
            "{}: episode {} is {} bytes, more than the viewer reads ({MAX_EPISODE_BYTES})",
            path.display(),
            row.episode_id,
            row.bytes
        )));
    }
    let mut file = fs::File::open(&path).map_err(|e| io_error(&path, e))?;
    file.seek(SeekFrom::Start(row.offset))
        .map_err(|e| io_error(&path, e))?;
    let mut buf = vec![0u8; row.bytes as usize];
    file.read_exact(&mut buf).map_err(|_| {
        ViewError::RunDir(format!(
            "{}: episode {} is not all there (the file is shorter than its index says; still being written, or damaged)",
            path.display(),
            row.episode_id
        ))
    })?;
    serde_json::from_slice(&buf).map_err(|e| {
        ViewError::RunDir(format!(
            "{}: episode {} at byte {} does not parse ({e}); the file is damaged",
            path.display(),
            row.episode_id,
            row.offset
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::run_dir::SourceKind;

    #[test]
    fn at_most_sixteen_indexes_stay_in_memory_and_the_recent_ones_stay() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("rollouts")).unwrap();
        let run = RunDir::open(dir.path()).unwrap();
        let cache = IndexCache::default();
        let source = |step| Source {
            kind: SourceKind::Train,
            step,
        };
        for step in 1..=20 {
            std::fs::write(run.data_path(source(step)), "").unwrap();
            let first = cache.get(&run, source(1)).unwrap();
            let index = cache.get(&run, source(step)).unwrap();
            assert!(index.rows.is_empty() && index.scanned);
            // Update 1 is used every time, so it is never the one evicted.
            assert!(Arc::ptr_eq(&first, &cache.get(&run, source(1)).unwrap()));
        }
        let loaded = cache.lock();
        assert_eq!(loaded.entries.len(), CACHED_INDEXES);
        assert!(loaded.entries.contains_key(&source(1)));
        assert!(loaded.entries.contains_key(&source(20)));
        assert!(!loaded.entries.contains_key(&source(2)));
    }
}
