//! What every running episode is doing right now, for the live page of the web UI.
//!
//! Each episode holds a [`LiveEntry`] for its whole life and moves it through the
//! [`Stage`]s of a turn; dropping the entry (the episode actor stopped, however it ended)
//! takes the episode off the board. Reading the board is a snapshot under one short lock.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde::Serialize;

/// Rows a snapshot lists at most (the longest-waiting first); counts cover all episodes.
const SNAPSHOT_ROWS: usize = 500;

/// Where an episode is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stage {
    /// The env is building the prompt.
    Starting,
    /// The engine is generating its turn (queued for a slot, prefilling or decoding).
    Generating,
    /// The env is reading the turn (answer or tool calls).
    Deciding,
    /// Its tool calls are running.
    InTools(Vec<String>),
    /// The env is turning tool results into the observation.
    Observing,
    /// The env is scoring the finished episode.
    Scoring,
}

impl Stage {
    /// A short label (`generating`, `in tool search`, ...).
    pub fn label(&self) -> String {
        match self {
            Stage::Starting => "starting".into(),
            Stage::Generating => "generating".into(),
            Stage::Deciding => "env reading the turn".into(),
            Stage::InTools(names) => format!("in tool {}", names.join(", ")),
            Stage::Observing => "env observing".into(),
            Stage::Scoring => "scoring".into(),
        }
    }
}

#[derive(Debug)]
struct LiveEpisode {
    episode_id: u64,
    task_id: String,
    question: String,
    stage: Stage,
    stage_since: Instant,
    started: Instant,
    turns: usize,
    tool_calls: usize,
    tokens: usize,
}

#[derive(Debug)]
struct Board {
    /// By entry serial: a re-queued episode's new attempt may enter before the old
    /// attempt's entry is dropped.
    episodes: BTreeMap<u64, LiveEpisode>,
    next_serial: u64,
    completed: u64,
    ended_otherwise: u64,
    /// When anything last moved, and what (rendered only when asked, off the episodes' path).
    last_activity: (Instant, Activity),
}

/// What moved last.
#[derive(Debug, Clone)]
enum Activity {
    /// An episode entered the board, changed stage, or (`ended`) left it.
    Episode { id: u64, serial: u64, ended: bool },
    /// Progress outside the episodes ([`LiveBoard::touch`]).
    Note(String),
}

impl Default for Board {
    fn default() -> Self {
        Self {
            episodes: BTreeMap::new(),
            next_serial: 0,
            completed: 0,
            ended_otherwise: 0,
            last_activity: (Instant::now(), Activity::Note("started".into())),
        }
    }
}

/// The board all episodes of a run write to (cheap to clone; one per run).
#[derive(Debug, Clone, Default)]
pub struct LiveBoard {
    inner: Arc<Mutex<Board>>,
}

/// One episode's place on the board; dropping it takes the episode off.
#[derive(Debug)]
pub struct LiveEntry {
    board: LiveBoard,
    serial: u64,
    completed: bool,
}

/// An episode in flight, as the live page shows it.
#[derive(Debug, Clone, Serialize)]
pub struct LiveRow {
    /// Episode id.
    pub episode_id: u64,
    /// Task id.
    pub task_id: String,
    /// The question.
    pub question: String,
    /// [`Stage::label`].
    pub stage: String,
    /// Seconds in that stage.
    pub stage_seconds: f64,
    /// Seconds since the episode started.
    pub seconds: f64,
    /// Turns finished.
    pub turns: usize,
    /// Tool calls made.
    pub tool_calls: usize,
    /// Tokens generated.
    pub tokens: usize,
}

/// The board at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct LiveSnapshot {
    /// Episodes in flight.
    pub in_flight: usize,
    /// Episodes in flight per stage label.
    pub stages: BTreeMap<String, usize>,
    /// Episodes that completed since the board was made.
    pub completed: u64,
    /// Episodes that ended otherwise (failed, re-queued, stopped).
    pub ended_otherwise: u64,
    /// Up to 500 episodes in flight, the longest in their stage first.
    pub episodes: Vec<LiveRow>,
}

impl LiveBoard {
    fn lock(&self) -> MutexGuard<'_, Board> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts an episode on the board (stage [`Stage::Starting`]).
    pub fn enter(&self, episode_id: u64, task_id: &str, question: &str) -> LiveEntry {
        let now = Instant::now();
        let mut board = self.lock();
        let serial = board.next_serial;
        board.next_serial += 1;
        board.last_activity = (
            now,
            Activity::Episode {
                id: episode_id,
                serial,
                ended: false,
            },
        );
        board.episodes.insert(
            serial,
            LiveEpisode {
                episode_id,
                task_id: task_id.into(),
                question: question.chars().take(200).collect(),
                stage: Stage::Starting,
                stage_since: now,
                started: now,
                turns: 0,
                tool_calls: 0,
                tokens: 0,
            },
        );
        drop(board);
        LiveEntry {
            board: self.clone(),
            serial,
            completed: false,
        }
    }

    /// Records progress made outside the episodes (an update, a checkpoint, a warm-start
    /// step), for [`LiveBoard::idle`].
    pub fn touch(&self, what: impl Into<String>) {
        self.lock().last_activity = (Instant::now(), Activity::Note(what.into()));
    }

    /// How long nothing has moved, and the last thing that did.
    pub fn idle(&self) -> (std::time::Duration, String) {
        let board = self.lock();
        let (at, what) = &board.last_activity;
        let what = match what {
            Activity::Note(text) => text.clone(),
            Activity::Episode {
                id, ended: true, ..
            } => format!("episode {id} ended"),
            Activity::Episode { id, serial, .. } => match board.episodes.get(serial) {
                Some(e) => format!("episode {id}: {}", e.stage.label()),
                None => format!("episode {id} ended"),
            },
        };
        (at.elapsed(), what)
    }

    /// What is in flight now.
    pub fn snapshot(&self) -> LiveSnapshot {
        let now = Instant::now();
        let board = self.lock();
        let mut stages = BTreeMap::new();
        let mut rows: Vec<LiveRow> = board
            .episodes
            .values()
            .map(|e| {
                let stage = e.stage.label();
                *stages.entry(stage.clone()).or_insert(0) += 1;
                LiveRow {
                    episode_id: e.episode_id,
                    task_id: e.task_id.clone(),
                    question: e.question.clone(),
                    stage,
                    stage_seconds: (now - e.stage_since).as_secs_f64(),
                    seconds: (now - e.started).as_secs_f64(),
                    turns: e.turns,
                    tool_calls: e.tool_calls,
                    tokens: e.tokens,
                }
            })
            .collect();
        rows.sort_by(|a, b| b.stage_seconds.total_cmp(&a.stage_seconds));
        rows.truncate(SNAPSHOT_ROWS);
        LiveSnapshot {
            in_flight: board.episodes.len(),
            stages,
            completed: board.completed,
            ended_otherwise: board.ended_otherwise,
            episodes: rows,
        }
    }
}

impl LiveEntry {
    fn update(&self, f: impl FnOnce(&mut LiveEpisode)) {
        let mut board = self.board.lock();
        if let Some(e) = board.episodes.get_mut(&self.serial) {
            f(e);
            let id = e.episode_id;
            board.last_activity = (
                Instant::now(),
                Activity::Episode {
                    id,
                    serial: self.serial,
                    ended: false,
                },
            );
        }
    }

    /// Moves the episode to `stage`.
    pub fn set(&self, stage: Stage) {
        self.update(|e| {
            e.stage = stage;
            e.stage_since = Instant::now();
        });
    }

    /// Counts a finished turn.
    pub fn turn_done(&self, tokens: usize, tool_calls: usize) {
        self.update(|e| {
            e.turns += 1;
            e.tokens += tokens;
            e.tool_calls += tool_calls;
        });
    }

    /// Marks the episode completed (counted when the entry is dropped).
    pub fn completed(&mut self) {
        self.completed = true;
    }
}

impl Drop for LiveEntry {
    fn drop(&mut self) {
        let mut board = self.board.lock();
        if let Some(e) = board.episodes.remove(&self.serial) {
            board.last_activity = (
                Instant::now(),
                Activity::Episode {
                    id: e.episode_id,
                    serial: self.serial,
                    ended: true,
                },
            );
            if self.completed {
                board.completed += 1;
            } else {
                board.ended_otherwise += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_move_through_stages_and_leave_when_dropped() {
        let board = LiveBoard::default();
        let mut a = board.enter(1, "t1", "q1");
        let b = board.enter(2, "t2", "q2");
        a.set(Stage::InTools(vec!["search".into()]));
        a.turn_done(12, 1);
        let s = board.snapshot();
        assert_eq!(s.in_flight, 2);
        assert_eq!(s.stages["in tool search"], 1);
        assert_eq!(s.stages["starting"], 1);
        let row = s.episodes.iter().find(|r| r.episode_id == 1).unwrap();
        assert_eq!((row.turns, row.tokens, row.tool_calls), (1, 12, 1));
        a.completed();
        drop(a);
        drop(b);
        let s = board.snapshot();
        assert_eq!((s.in_flight, s.completed, s.ended_otherwise), (0, 1, 1));
        assert_eq!(board.idle().1, "episode 2 ended");
        board.touch("update 1");
        assert_eq!(board.idle().1, "update 1");
    }
}
