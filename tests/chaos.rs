//! Chaos through the `train` binary: a run whose every turn calls tools with side effects is
//! SIGKILLed at 20 seeded instants and started again in the same directory each time.
//!
//! The tools are real: `effect` is a tool of an MCP server of the official Python SDK
//! (`envs/tests/py/mcp_sdk_server.py`) that appends every call it receives to one file and
//! each effect (a key it has not seen) to another, and `python` is the python tool (as plain
//! processes: the bubblewrap sandbox shows no host directory a run could leave a file in)
//! whose interpreter first appends the call's idempotency key to a file and writes a file
//! named by the key, unless one exists, then runs the snippet. `--inject-tool-faults 0` makes
//! every turn that made no call call every tool (no faults), with the turn's text as each
//! argument.
//!
//! Each life is killed on a seeded line: its start, its first update, its first checkpoint
//! write, or (for some) its first committed checkpoint. The injected learner and checkpoint
//! delays hold the commit after each line back, so a kill lands before it and the schedule
//! cannot run past the end. What every kill must leave:
//! - no call whose result is in the run's journal is made again (the next life's attempts
//!   hold none of its keys); the calls in flight at a kill are made again under the same
//!   keys, and the services take each key once (no key twice in either effect log);
//! - every episode trained in exactly one update;
//! - (async) each resume continues every episode the checkpoint holds in flight from its last
//!   finished step (the built-in env snapshots between turns: none restarts); each checkpoint
//!   waits for such an episode (fault injection), so some resume continues one;
//! - (deterministic) the final weights and AdamW state equal an uninterrupted run's bit for bit.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

#[path = "support/run_log.rs"]
mod run_log;
#[path = "support/trainer.rs"]
mod trainer;
#[path = "../actors/tests/support/venv.rs"]
mod venv;

use run_log::{jsonl_if_any, open_groups_held, resume_line};
use trainer::{newest_checkpoint, SplitMix, Trainer};

const UPDATES: u64 = 8;
const KILLS: usize = 20;
/// The learner's and the checkpoint write's injected sleeps: a kill sent on an update's or a
/// checkpoint write's line lands inside it.
const DELAY_MS: u64 = 700;
const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// The run id both runs of the deterministic test use, so that keys (which the `effect`
/// tool answers with) are the same in each.
const RUN_ID: &str = "chaos";

/// The fault-injection flags of every life; `async` runs also make each checkpoint wait for
/// an episode in flight that has finished a step, so each resume from a checkpoint with open
/// groups has one to continue (however the cores are shared).
fn flags(asynchronous: bool) -> Vec<String> {
    let mut flags: Vec<String> = [
        "--inject-tool-faults",
        "0",
        "--learner-delay-ms",
        &DELAY_MS.to_string(),
        "--checkpoint-delay-ms",
        &DELAY_MS.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if asynchronous {
        flags.push("--checkpoint-with-a-finished-step".into());
    }
    flags
}

/// Where one run's tools leave their side effects.
struct Effects {
    /// The MCP `effect` tool's log (each key once) and its `.attempts` (every call).
    mcp: PathBuf,
    /// The python tool's log of files written (each key once) and its `.attempts`.
    python: PathBuf,
    /// The files the python tool writes, one per key.
    files: PathBuf,
}

impl Effects {
    fn new(dir: &Path) -> Self {
        let files = dir.join("files");
        std::fs::create_dir_all(&files).unwrap();
        Self {
            mcp: dir.join("mcp-effects.jsonl"),
            python: dir.join("python-effects.jsonl"),
            files,
        }
    }
}

/// The python tool's interpreter: a Python program that appends the call's key to the
/// attempts log and writes a file named by the key (a key's file is written once: the
/// write is exclusive), then runs the snippet in a fresh interpreter.
fn python_interpreter(dir: &Path, effects: &Effects) -> PathBuf {
    let path = dir.join("python-with-effects");
    let text = format!(
        r#"#!{python}
import json, os, sys
key = os.environ["AGENT_R1_IDEMPOTENCY_KEY"]
line = json.dumps({{"key": key}}) + "\n"
with open({attempts:?}, "a") as f:
    f.write(line)
try:
    fd = os.open(os.path.join({files:?}, key.replace("/", "_")), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
except FileExistsError:
    pass
else:
    with os.fdopen(fd, "w") as f, open("main.py") as snippet:
        f.write(snippet.read())
        f.flush()
        os.fsync(f.fileno())
    with open({log:?}, "a") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())
os.execv(sys.executable, [sys.executable] + sys.argv[1:])
"#,
        python = venv::python_required(&[]).display(),
        attempts = format!("{}.attempts", effects.python.display()),
        files = effects.files.display().to_string(),
        log = effects.python.display().to_string(),
    );
    std::fs::write(&path, text).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn config(dir: &Path, effects: &Effects, asynchronous: bool) -> PathBuf {
    let (mode, deterministic, concurrency, response) = if asynchronous {
        // One long episode at a time: sampling trails the learner, and a checkpoint may
        // find a group with one episode finished and the other in flight.
        (
            "mode = \"async\"\nbatches_ahead = 2\nmax_staleness = 2",
            false,
            1,
            128,
        )
    } else {
        ("mode = \"sync\"", true, 8, 16)
    };
    let text = format!(
        r#"
[model]
preset = "tiny"
device = "cpu"
dtype = "float32"

[env]
name = "synthetic_multihop"
max_tool_calls_per_turn = 3

[env.world]
seed = 0
n_questions = 40
test_fraction = 0.2

[tools.search]
top_k = 2

[tools.effect]
type = "mcp"
command = "{python}"
args = ["{server}", "stdio"]
env = {{ AGENT_R1_TEST_EFFECTS = "{mcp_log}" }}
tools = ["effect"]
timeout_secs = 120.0
init_timeout_secs = 300.0

[tools.python]
python = "{interpreter}"
sandbox = false
timeout_secs = 120.0
cpu_secs = 60

[algorithm]
estimator = "gae"
critic_warmup_updates = 0
actor_lr = 1e-3
micro_batch_size = 4
mini_batch_size = 8
ppo_epochs = 2

[algorithm.kl]
placement = "off"

[rollout]
batch_size = 4
group_size = 2
max_turns = 2
max_prompt_length = 768
max_response_length = {response}
max_context_length = 2048
concurrency = {concurrency}
deterministic = {deterministic}

[training]
updates = {UPDATES}
{mode}
seed = 7

[checkpoint]
every = 1
keep_last = 2

[eval]
every = 0

[metrics]
address = "127.0.0.1:0"
"#,
        python = venv::python_required(&[]).display(),
        server = Path::new(ROOT)
            .join("envs/tests/py/mcp_sdk_server.py")
            .display(),
        mcp_log = effects.mcp.display(),
        interpreter = python_interpreter(dir, effects).display(),
    );
    let path = dir.join("train.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A new run directory with the given run id.
fn run_dir(path: &Path) -> PathBuf {
    std::fs::create_dir_all(path).unwrap();
    std::fs::write(path.join("run-id"), format!("{RUN_ID}\n")).unwrap();
    path.to_path_buf()
}

/// `run/e12/s3/c0` (`/b1` on a branch), as the tools see it.
fn key_text(key: &Value) -> String {
    let mut text = format!(
        "{}/e{}/s{}/c{}",
        key["run"].as_str().unwrap(),
        key["episode"],
        key["step"],
        key["index"]
    );
    if let Some(b) = key["branch"].as_u64().filter(|&b| b > 0) {
        text.push_str(&format!("/b{b}"));
    }
    text
}

/// The keys of the calls whose results the run's journal holds.
fn journaled(run: &Path) -> BTreeSet<String> {
    jsonl_if_any(&run.join("tool-calls.jsonl"))
        .iter()
        .map(|e| key_text(&e["key"]))
        .collect()
}

fn keys(path: &Path) -> Vec<String> {
    jsonl_if_any(path)
        .iter()
        .map(|l| l["key"].as_str().unwrap().to_string())
        .collect()
}

/// Every call each tool received so far: the MCP server's, then the python tool's.
fn attempts(effects: &Effects) -> [Vec<String>; 2] {
    [&effects.mcp, &effects.python]
        .map(|log| keys(&PathBuf::from(format!("{}.attempts", log.display()))))
}

/// How many calls each tool had received.
fn attempt_counts(effects: &Effects) -> [usize; 2] {
    attempts(effects).map(|a| a.len())
}

/// The calls received after `before` whose keys are in `done`.
fn made_again(effects: &Effects, before: [usize; 2], done: &BTreeSet<String>) -> Vec<String> {
    attempts(effects)
        .iter()
        .zip(before)
        .flat_map(|(all, from)| all[from..].iter().filter(|k| done.contains(*k)).cloned())
        .collect()
}

/// What the kills did, for the test's output and its checks.
#[derive(Default)]
struct Tally {
    kills: Vec<String>,
    /// Episodes of open groups at resumes: (restored, continued, sampled from the start).
    resumed: (usize, usize, usize),
}

/// Kills `run` 20 times at seeded instants, starting it again each time, then lets it
/// finish; checks after each life that no journaled call was made again.
fn kill_20_times(
    cfg: &Path,
    run: &Path,
    effects: &Effects,
    seed: u64,
    asynchronous: bool,
) -> Tally {
    let flags = flags(asynchronous);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut rng = SplitMix(seed);
    let mut tally = Tally::default();
    while tally.kills.len() < KILLS {
        let from = newest_checkpoint(run);
        assert!(
            from < UPDATES,
            "the run ended after {} kills: {:?}",
            tally.kills.len(),
            tally.kills
        );
        let done = journaled(run);
        let before = attempt_counts(effects);
        let expect = (from > 0)
            .then(|| open_groups_held(run, from))
            .filter(|h| h.0 > 0);

        let mut t = Trainer::start_with(cfg, run, &flags);
        if let Some((open, finished, continued)) = expect {
            let line = t.wait_line(|l| l.starts_with("resuming "));
            assert_eq!(
                line,
                resume_line(open, 2, finished, continued),
                "kill {}",
                tally.kills.len()
            );
            tally.resumed.0 += finished;
            tally.resumed.1 += continued;
            tally.resumed.2 += open * 2 - finished - continued;
        }
        let target = from + 1;
        // A third of the lives (while there is room) commit a checkpoint before their kill.
        let commit = target + 1 < UPDATES && rng.next() % 3 == 0;
        let phase = if commit {
            "sampling after a checkpoint"
        } else {
            ["start", "update", "checkpoint write"][(rng.next() % 3) as usize]
        };
        match phase {
            // A resume's line comes after the start's.
            "start" if expect.is_some() => String::new(),
            "start" => t.wait_line(|l| l.starts_with("env ")),
            "update" => t.wait_line(|l| l.starts_with(&format!("sampled update {target}:"))),
            "checkpoint write" => {
                t.wait_line(|l| l.starts_with(&format!("checkpoint step {target}: writing")))
            }
            _ => t.wait_line(|l| l.starts_with(&format!("checkpoint step {target} -> "))),
        };
        t.signal("KILL");
        let (code, _, log) = t.finish();
        assert_eq!(
            code,
            None,
            "kill {}: the run ended before it; log:\n{log}",
            tally.kills.len()
        );
        let again = made_again(effects, before, &done);
        assert!(
            again.is_empty(),
            "kill {}: calls journaled before this life were made again: {again:?}",
            tally.kills.len()
        );
        tally
            .kills
            .push(format!("{phase} of update {target} (resumed from {from})"));
    }
    let done = journaled(run);
    let before = attempt_counts(effects);
    let (code, stdout, log) = Trainer::start_with(cfg, run, &flags).finish();
    assert_eq!(code, Some(0), "{log}");
    assert!(
        stdout.contains(&format!("\"updates\":{UPDATES}")),
        "{stdout}"
    );
    let again = made_again(effects, before, &done);
    assert!(
        again.is_empty(),
        "the last life made journaled calls again: {again:?}"
    );
    tally
}

/// Each side effect once, and how many calls were made again (those in flight at a kill).
fn check_effects(effects: &Effects) -> (usize, usize, usize) {
    for log in [&effects.mcp, &effects.python] {
        let keys = keys(log);
        let unique: BTreeSet<&String> = keys.iter().collect();
        assert_eq!(
            unique.len(),
            keys.len(),
            "{}: a side effect happened twice",
            log.display()
        );
        assert!(!keys.is_empty(), "{}: no side effects", log.display());
    }
    let files = std::fs::read_dir(&effects.files).unwrap().count();
    assert_eq!(files, keys(&effects.python).len());
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for k in attempts(effects).into_iter().flatten() {
        *counts.entry(k).or_default() += 1;
    }
    let effects_total = keys(&effects.mcp).len() + files;
    let made_again = counts.values().map(|&n| n - 1).sum();
    (effects_total, counts.values().sum(), made_again)
}

/// Every episode of the stream trained in exactly one update, each update once.
fn check_trained_once(run: &Path) -> Vec<Value> {
    let rows = run_log::jsonl(&run.join("metrics.jsonl"));
    let steps: Vec<u64> = rows.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, (1..=UPDATES).collect::<Vec<_>>());
    for r in &rows {
        assert_eq!(r["failed"], 0, "step {}: episodes failed", r["step"]);
        assert!(
            r["kept"].as_u64().unwrap() > 0,
            "step {}: nothing trained",
            r["step"]
        );
    }
    let mut trained: Vec<u64> = rows
        .iter()
        .flat_map(|r| r["episode_ids"].as_array().unwrap().clone())
        .map(|id| id.as_u64().unwrap() & !(1 << 63))
        .collect();
    trained.sort_unstable();
    assert_eq!(
        trained,
        (0..UPDATES * 8).collect::<Vec<_>>(),
        "each episode once"
    );
    rows
}

#[test]
fn async_run_killed_20_times_makes_each_side_effect_once_and_trains_each_episode_once() {
    let dir = tempfile::tempdir().unwrap();
    let effects = Effects::new(&dir.path().join("effects"));
    let cfg = config(dir.path(), &effects, true);
    let run = run_dir(&dir.path().join("run"));
    let tally = kill_20_times(&cfg, &run, &effects, 49, true);
    check_trained_once(&run);
    let (made, attempted, again) = check_effects(&effects);
    println!("kills: {}", tally.kills.join("; "));
    println!(
        "episodes of open groups at resumes: {} restored from checkpoints, {} continued from \
         their last finished step, {} sampled from the start",
        tally.resumed.0, tally.resumed.1, tally.resumed.2
    );
    println!(
        "side effects: {made}, each once; calls received: {attempted}, of which {again} made \
         again under their key (in flight at a kill)"
    );
    assert!(
        tally.resumed.1 > 0,
        "no resume continued an episode from a finished step"
    );
}

#[test]
fn deterministic_run_killed_20_times_ends_with_the_uninterrupted_weights_and_each_effect_once() {
    let dir = tempfile::tempdir().unwrap();
    let ref_effects = Effects::new(&dir.path().join("reference-effects"));
    let ref_dir = dir.path().join("reference-config");
    std::fs::create_dir_all(&ref_dir).unwrap();
    let ref_cfg = config(&ref_dir, &ref_effects, false);
    let reference = run_dir(&dir.path().join("reference"));
    let flags = flags(false);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let (code, _, log) = Trainer::start_with(&ref_cfg, &reference, &flags).finish();
    assert_eq!(code, Some(0), "{log}");

    let effects = Effects::new(&dir.path().join("effects"));
    let cfg = config(dir.path(), &effects, false);
    let run = run_dir(&dir.path().join("killed"));
    let tally = kill_20_times(&cfg, &run, &effects, 2026, false);
    let (want, got) = (check_trained_once(&reference), check_trained_once(&run));
    for (w, g) in want.iter().zip(&got) {
        assert_eq!(g["episode_ids"], w["episode_ids"], "step {}", g["step"]);
        for key in ["policy_loss", "value_loss", "grad_norm", "reward_mean"] {
            assert_eq!(g[key], w[key], "step {}: {key}", g["step"]);
        }
    }
    let (made, attempted, again) = check_effects(&effects);
    let (ref_made, _, ref_again) = check_effects(&ref_effects);
    assert_eq!(ref_again, 0, "the uninterrupted run made a call twice");
    // The killed run made the uninterrupted run's calls (the same keys, as the run ids are
    // the same), each once.
    assert_eq!(keys(&effects.mcp).len(), keys(&ref_effects.mcp).len());
    assert_eq!(made, ref_made);
    println!("kills: {}", tally.kills.join("; "));
    println!(
        "side effects: {made}, each once (the uninterrupted run: {ref_made}); calls received: \
         {attempted}, of which {again} made again under their key (in flight at a kill)"
    );
    for file in ["policy/model.safetensors", "optimizer.safetensors"] {
        let path = |run: &Path| run.join(format!("checkpoints/step-{UPDATES}/{file}"));
        assert!(
            std::fs::read(path(&run)).unwrap() == std::fs::read(path(&reference)).unwrap(),
            "{file}: the killed run's differs from the uninterrupted run's"
        );
    }
}
