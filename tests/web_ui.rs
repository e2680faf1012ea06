//! The web UI in a real browser: a short `agent-r1 train` run (the tiny model, warm-started
//! so that it calls its search tool) is watched on its live page in headless Chromium while
//! it samples; then `agent-r1 view` serves the run directory and the browser reads a curve's
//! points off the run page, filters the episodes by reward with the page's form, opens an
//! episode by its link and finds a tool call with its arguments and result. Screenshots of
//! the pages are kept under the run directory (`target/tmp/web_ui/run/screenshots/`).
//!
//! Chromium is Debian's `chromium` package, found on PATH or installed with apt-get where the
//! test runs as root (`AGENT_R1_INSTALL_CHROMIUM=0` forbids that); where it cannot be had the
//! test prints `SKIPPED: ...` and returns (`AGENT_R1_REQUIRE_CHROMIUM=1` makes that a
//! failure).

#[path = "support/cdp.rs"]
mod cdp;
#[path = "support/debian.rs"]
mod debian;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use cdp::Browser;
use debian::Killed;

const BIN: &str = env!("CARGO_BIN_EXE_agent-r1");
/// The most a phase (the warm start, two updates, a shutdown) may take: a bound against a
/// hang, not a speed check. The warm start takes about 30 s on an idle 2-core machine; with
/// a test build and a busy loop beside it, it once passed only step 50 of 120 in 400 s.
const PHASE_TIMEOUT: Duration = Duration::from_secs(1500);

fn config(dir: &Path) -> PathBuf {
    let text = format!(
        r#"
[model]
preset = "tiny"
device = "cpu"
dtype = "float32"

[env]
name = "synthetic_multihop"

[env.world]
seed = 0
n_questions = 40
test_fraction = 0.2

[tools.search]
top_k = 2

[algorithm]
estimator = "grpo"
actor_lr = 2e-3
micro_batch_size = 8

[algorithm.kl]
placement = "off"

[rollout]
batch_size = 4
group_size = 2
max_turns = 2
max_prompt_length = 384
max_response_length = 48
max_context_length = 1024
concurrency = 8

[training]
updates = 1000
seed = 0
run_dir = "{unused}"

[warm_start]
steps = 120
batch_size = 8
learning_rate = 5e-3
final_lr_fraction = 1.0
early_wrong_answer_prob = 0.0
variants_per_question = 1

[checkpoint]
every = 2
keep_last = 2

[eval]
every = 1
questions = 8

[metrics]
address = "127.0.0.1:0"
"#,
        unused = dir.join("unused").display()
    );
    let path = dir.join("train.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A child whose stderr (or stdout) lines arrive on a channel.
struct Lines {
    rx: mpsc::Receiver<String>,
    log: Vec<String>,
}

impl Lines {
    fn of(stream: impl std::io::Read + Send + 'static) -> Self {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { rx, log: vec![] }
    }

    fn wait(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + PHASE_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    self.log.push(line.clone());
                    if pred(&line) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no {what} within {PHASE_TIMEOUT:?}; output so far:\n{}",
                    self.log.join("\n")
                ),
            }
        }
    }

    /// Waits for the end of the stream (the process closed it: it exited).
    fn wait_end(&mut self, what: &str) {
        let deadline = Instant::now() + PHASE_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => self.log.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
                Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                    "{what}: not within {PHASE_TIMEOUT:?}; output so far:\n{}",
                    self.log.join("\n")
                ),
            }
        }
    }
}

/// The line's last URL (the UI's: `.../ui`).
fn url_in(line: &str) -> String {
    let start = line.rfind("http://").expect("a URL in the line");
    let url = line[start..].split_whitespace().next().unwrap();
    assert!(url.ends_with("/ui"), "{line}");
    url.to_string()
}

fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn chromium() -> Option<PathBuf> {
    match debian::debian_programs("web_ui", "chromium", &["chromium"], "CHROMIUM") {
        Ok(found) => Some(found[0].clone()),
        Err(why) => {
            debian::skip("web_ui", "CHROMIUM", &why);
            None
        }
    }
}

#[test]
fn live_run_and_episode_pages_work_in_headless_chromium() {
    let Some(chromium) = chromium() else { return };
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("web_ui");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let run = root.join("run");
    let shots = run.join("screenshots");

    // 1. The daemon: its stderr names the UI's address before the warm start begins.
    let mut trainer = Killed(
        Command::new(BIN)
            .arg("train")
            .arg("--config")
            .arg(config(&root))
            .arg("--out")
            .arg(&run)
            .env("AGENT_R1_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting agent-r1 train"),
    );
    let mut log = Lines::of(trainer.0.stderr.take().unwrap());
    let live_ui = url_in(&log.wait("the web UI's address", |l| l.contains("web UI: http://")));

    let mut browser = Browser::start(&chromium, 1400, 1000);
    browser.open(&format!("{live_ui}/live"));
    browser.eval("window.notReloaded = true");
    // The warm start comes first and takes long on a loaded machine; the page's own wait
    // starts once it has ended (its last step's line), when episodes begin.
    log.wait("the warm start's last step", |l| {
        l.trim_start().starts_with("sft step  119 ")
    });
    let first = browser.wait_for(
        "(() => { const rows = document.querySelectorAll('tr.live-episode'); \
           return rows.length > 0 ? { rows: rows.length, completed: Number(document.getElementById('completed').textContent), \
           stage: rows[0].querySelector('.stage').textContent } : null })()",
        "episodes in flight on the live page",
    );
    std::fs::create_dir_all(&shots).unwrap();
    browser.screenshot(&shots.join("live.png"));
    let stage = first["stage"].as_str().unwrap();
    assert!(
        [
            "starting",
            "generating",
            "env reading the turn",
            "env observing",
            "scoring"
        ]
        .contains(&stage)
            || stage.starts_with("in tool "),
        "stage {stage:?}"
    );
    let before = first["completed"].as_u64().unwrap();
    browser.wait_for(
        &format!("Number(document.getElementById('completed').textContent) > {before}"),
        "the live page's count of completed episodes to grow",
    );
    assert_eq!(
        browser.eval("window.notReloaded === true && Number(document.getElementById('refreshes').textContent) > 1"),
        Value::Bool(true),
        "the live page redraws itself without reloading"
    );

    // Two updates, then a graceful stop.
    log.wait("the second update", |l| l.starts_with("update    2/"));
    let ok = Command::new("kill")
        .arg("-TERM")
        .arg(trainer.0.id().to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok);
    // Its stderr closes when it exits; then it is reaped.
    log.wait_end("train stopping after SIGTERM");
    trainer.0.wait().unwrap();

    // 2. `agent-r1 view` on the run directory; its stdout names the address.
    let mut viewer = Killed(
        Command::new(BIN)
            .arg("view")
            .arg(&run)
            .arg("--address")
            .arg("127.0.0.1:0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting agent-r1 view"),
    );
    let mut out = Lines::of(viewer.0.stdout.take().unwrap());
    let ui = url_in(&out.wait("the viewer's address", |l| l.starts_with("serving ")));

    // The run page: the reward curve's points are metrics.jsonl's.
    browser.open(&ui);
    let points: Vec<(f64, f64)> = serde_json::from_value(browser.eval(
        "[...document.querySelectorAll('svg[data-series=\"updates.reward_mean\"] circle.pt')]\
           .map(c => [Number(c.dataset.x), Number(c.dataset.y)])",
    ))
    .unwrap();
    let expected: Vec<(f64, f64)> = jsonl(&run.join("metrics.jsonl"))
        .iter()
        .map(|r| {
            (
                r["step"].as_f64().unwrap(),
                r["reward_mean"].as_f64().unwrap(),
            )
        })
        .collect();
    assert!(expected.len() >= 2, "{expected:?}");
    assert_eq!(points, expected, "the reward curve's points");
    // The sampler/trainer gap measured on every update, read from inside each row's object.
    let gap: Vec<(f64, f64)> = serde_json::from_value(browser.eval(
        "[...document.querySelectorAll('svg[data-series=\"updates.mismatch.abs_mean\"] circle.pt')]\
           .map(c => [Number(c.dataset.x), Number(c.dataset.y)])",
    ))
    .unwrap();
    let expected: Vec<(f64, f64)> = jsonl(&run.join("metrics.jsonl"))
        .iter()
        .map(|r| {
            (
                r["step"].as_f64().unwrap(),
                r["mismatch"]["abs_mean"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(gap, expected, "the mismatch curve's points");
    let eval_points =
        browser.eval("document.querySelectorAll('svg[data-series=\"evals.em\"] circle.pt').length");
    assert!(eval_points.as_u64().unwrap() >= 2);
    browser.screenshot(&shots.join("run.png"));

    // The episodes of the first evaluation, filtered by reward with the page's form.
    let source = "eval-step-000000";
    let rewards: Vec<f64> = jsonl(&run.join("rollouts").join(format!("{source}.jsonl")))
        .iter()
        .map(|t| t["reward"].as_f64().unwrap())
        .collect();
    let (lo, hi) = rewards
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &r| (a.min(r), b.max(r)));
    let threshold = if hi > lo { (lo + hi) / 2.0 } else { lo };
    let kept = rewards.iter().filter(|&&r| r >= threshold).count();
    browser.open(&format!("{ui}/episodes?source={source}"));
    assert_eq!(
        browser.eval("document.querySelectorAll('#episodes tbody tr').length"),
        serde_json::json!(rewards.len())
    );
    browser.navigate_by(&format!(
        "document.querySelector('#filter input[name=reward_min]').value = '{threshold}'; \
         document.querySelector('#filter').submit()"
    ));
    let shown = browser.eval(
        "[...document.querySelectorAll('#episodes tbody tr')].map(tr => Number(tr.dataset.reward))",
    );
    let shown: Vec<f64> = serde_json::from_value(shown).unwrap();
    assert_eq!(
        shown.len(),
        kept,
        "rows with reward >= {threshold}: {shown:?} of {rewards:?}"
    );
    assert!(shown.iter().all(|&r| r >= threshold));
    browser.screenshot(&shots.join("episodes.png"));

    // An episode whose search call succeeded, opened by its link: the call's arguments and
    // result as recorded.
    let mut files: Vec<PathBuf> = std::fs::read_dir(run.join("rollouts"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    let (file, row, episode) = files
        .iter()
        .find_map(|f| {
            jsonl(f).into_iter().enumerate().find_map(|(i, t)| {
                let called = t["steps"].as_array()?.iter().any(|s| {
                    s["tool_calls"]
                        .as_array()
                        .is_some_and(|c| c.iter().any(|c| c["result"].get("Ok").is_some()))
                });
                called.then(|| (f.clone(), i, t))
            })
        })
        .expect("no episode of the run called its tool successfully (the warm start failed?)");
    let name = file.file_stem().unwrap().to_str().unwrap().to_string();
    browser.open(&format!("{ui}/episodes?source={name}&per_page=1000"));
    browser.navigate_by(&format!(
        "document.querySelector('#episodes tbody a.open[href$=\"n={row}\"]').click()"
    ));
    assert_eq!(
        browser.eval("new URLSearchParams(location.search).get('n')"),
        serde_json::json!(row.to_string())
    );
    let call = browser.eval(
        "(() => { const c = [...document.querySelectorAll('tr.call')].find(c => !c.querySelector('.err').textContent); \
           return c && { tool: c.querySelector('.tool').textContent, \
           args: c.querySelector('.args').textContent, result: c.querySelector('.result').textContent } })()",
    );
    let recorded = episode["steps"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["tool_calls"].as_array().unwrap())
        .find(|c| c["result"].get("Ok").is_some())
        .unwrap();
    assert_eq!(call["tool"], recorded["name"], "{call}");
    assert_eq!(call["result"], recorded["result"]["Ok"]["text"]);
    assert!(
        call["args"].as_str().unwrap().contains("\"query\""),
        "{call}"
    );
    let tokens = browser.eval("document.querySelectorAll('.tok[data-logprob]').length");
    let generated: usize = episode["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["action_ids"].as_array().unwrap().len())
        .sum();
    assert_eq!(
        tokens,
        serde_json::json!(generated),
        "one shaded span per sampled token"
    );
    browser.screenshot(&shots.join("episode.png"));

    // A row that is not there gets a page that says so.
    browser.open(&format!("{ui}/episode?source={name}&n=999"));
    let error = browser.eval("document.getElementById('error').textContent");
    assert!(error.as_str().unwrap().contains("no row 999"), "{error}");

    for name in ["live", "run", "episodes", "episode"] {
        let png = std::fs::read(shots.join(format!("{name}.png"))).unwrap();
        assert!(png.len() > 10_000, "{name}.png is {} bytes", png.len());
    }
    drop(viewer);
}
