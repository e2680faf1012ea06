//! `[scorer] type = "http_judge"`: a real `train` run scored by an LLM-judge endpoint, here a
//! small OpenAI-compatible chat-completions server in the test (fault injection: it can be
//! slow, hold a call, or fail, on purpose).
//!
//! - The judge's number is the reward trained on; the env's own stays reported.
//! - A call the judge holds does not hold other episodes: the first call is answered only
//!   after three later ones were (an order of events, not a clock; if scoring were serial
//!   the held call would wait out its fallback and the test fails).
//! - A judge that fails (HTTP 500 for some questions, every try) gives failed episodes with
//!   the reason logged and counted, never a made-up reward, and the run goes on to its end.
//!   Every call carries an `Idempotency-Key`, the same for each try of one judgement.

#[path = "support/trainer.rs"]
mod trainer;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use trainer::Trainer;

/// What the judge does with a call.
#[derive(Clone, Copy)]
enum Mode {
    /// Answers "1" after `delay`; the first call only once three later calls were answered.
    HoldFirst { delay: Duration },
    /// HTTP 500 for questions about a founder, "1" for the others.
    FailFounderQuestions,
}

#[derive(Default)]
struct Record {
    calls: usize,
    answered: usize,
    /// Calls answered while the first was held.
    answered_while_held: Option<usize>,
    /// Whether the held call was let go by its fallback instead of by the order of events.
    held_until_fallback: bool,
    failed_questions: Vec<String>,
    /// Each call's `Idempotency-Key` header and body.
    keys: Vec<(Option<String>, String)>,
}

struct Judge {
    url: String,
    state: Arc<(Mutex<Record>, Condvar)>,
}

/// Reads one HTTP/1.1 request's body (Content-Length framing, as ureq sends JSON) and its
/// `Idempotency-Key` header.
fn read_body(stream: &mut TcpStream) -> (Value, Option<String>) {
    let mut reader = BufReader::new(stream);
    let mut length = 0;
    let mut key = None;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap();
            }
            if name.eq_ignore_ascii_case("idempotency-key") {
                key = Some(value.trim().to_string());
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    (serde_json::from_slice(&body).unwrap(), key)
}

fn respond(stream: &mut TcpStream, status: &str, body: &Value) {
    let body = body.to_string();
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

fn question_of(request: &Value) -> String {
    let prompt = request["messages"][0]["content"]
        .as_str()
        .unwrap_or_default();
    prompt
        .lines()
        .find_map(|l| l.strip_prefix("Question: "))
        .unwrap_or_default()
        .to_string()
}

impl Judge {
    fn start(mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!(
            "http://{}/v1/chat/completions",
            listener.local_addr().unwrap()
        );
        let state: Arc<(Mutex<Record>, Condvar)> = Arc::default();
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let state = shared.clone();
                std::thread::spawn(move || {
                    let (request, key) = read_body(&mut stream);
                    let (lock, changed) = &*state;
                    let index = {
                        let mut r = lock.lock().unwrap();
                        r.keys.push((key, request.to_string()));
                        r.calls += 1;
                        r.calls - 1
                    };
                    match mode {
                        Mode::HoldFirst { delay } => {
                            // The injected fault itself (a judge that takes `delay` per
                            // call), not a wait for an event: no assertion depends on it,
                            // only the printed throughput figure.
                            std::thread::sleep(delay);
                            if index == 0 {
                                let r = lock.lock().unwrap();
                                let (mut r, wait) = changed
                                    .wait_timeout_while(r, Duration::from_secs(60), |r| {
                                        r.answered < 3
                                    })
                                    .unwrap();
                                r.held_until_fallback = wait.timed_out();
                                r.answered_while_held = Some(r.answered);
                            }
                            respond(
                                &mut stream,
                                "200 OK",
                                &json!({"choices": [{"message": {"role": "assistant", "content": "Score: 1"}}]}),
                            );
                        }
                        Mode::FailFounderQuestions => {
                            let question = question_of(&request);
                            if question.contains("founder") {
                                lock.lock().unwrap().failed_questions.push(question);
                                respond(
                                    &mut stream,
                                    "500 Internal Server Error",
                                    &json!({"error": "judge down"}),
                                );
                            } else {
                                respond(
                                    &mut stream,
                                    "200 OK",
                                    &json!({"choices": [{"message": {"role": "assistant", "content": "1"}}]}),
                                );
                            }
                        }
                    }
                    let mut r = lock.lock().unwrap();
                    r.answered += 1;
                    changed.notify_all();
                });
            }
        });
        Self { url, state }
    }
}

fn config(dir: &Path, judge_url: &str, updates: u64) -> PathBuf {
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

[scorer]
type = "http_judge"
url = "{judge_url}"
timeout_secs = 120
retries = 2
max_concurrency = 8

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
max_response_length = 16
max_context_length = 1024
concurrency = 8
env_timeout_secs = 300

[training]
updates = {updates}
seed = 0
run_dir = "{run}"

[checkpoint]
every = 0

[eval]
every = 0
questions = 4

[metrics]
address = "127.0.0.1:0"
"#,
        run = dir.join("unused-run-dir").display(),
    );
    let path = dir.join("train.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn rows(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_slow_judge_scores_episodes_and_a_held_call_holds_no_other_episode() {
    let judge = Judge::start(Mode::HoldFirst {
        delay: Duration::from_secs(2),
    });
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), &judge.url, 2);
    let run = tmp.path().join("run");
    let started = Instant::now();
    let (code, _stdout, stderr) = Trainer::start(&cfg, &run, false).finish();
    let wall = started.elapsed();
    assert_eq!(code, Some(0), "{stderr}");

    let r = judge.state.0.lock().unwrap();
    assert!(
        !r.held_until_fallback,
        "the held judge call held up the others: only {:?} answered meanwhile",
        r.answered_while_held
    );
    assert!(r.answered_while_held.unwrap() >= 3);

    let rows = rows(&run.join("metrics.jsonl"));
    assert_eq!(rows.len(), 2);
    for row in &rows {
        assert_eq!(row["failed"], 0, "{row}");
        // Every episode's reward is the judge's (1), whatever the env's own says.
        assert_eq!(row["reward_mean"], 1.0, "{row}");
        assert_eq!(row["metrics"]["judge"], 1.0, "{row}");
        assert!(
            row["metrics"]["env_reward"].as_f64().unwrap() < 1.0,
            "{row}"
        );
    }
    let episodes: u64 = rows.iter().map(|r| r["episodes"].as_u64().unwrap()).sum();
    let sample_s: f64 = rows
        .iter()
        .map(|r| r["sample_seconds"].as_f64().unwrap_or(f64::NAN))
        .sum();
    // A figure, not a check: with a judge taking 2 s per call, serial scoring would need at
    // least 2 s per episode.
    eprintln!(
        "judge at 2 s per call: {} calls, {episodes} training episodes sampled in {sample_s:.1} s \
         ({:.2} episodes/s; serial scoring would be at most 0.5/s); run wall {:.1} s",
        r.calls,
        episodes as f64 / sample_s,
        wall.as_secs_f64()
    );
}

#[test]
fn a_failing_judge_gives_recorded_score_errors_and_the_run_goes_on() {
    let judge = Judge::start(Mode::FailFounderQuestions);
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), &judge.url, 2);
    let run = tmp.path().join("run");
    let (code, stdout, stderr) = Trainer::start(&cfg, &run, false).finish();
    assert_eq!(code, Some(0), "{stderr}");
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["updates"], 2, "{summary}");

    let r = judge.state.0.lock().unwrap();
    assert!(
        !r.failed_questions.is_empty(),
        "no question failed at the judge"
    );
    // Each attempt of a failing episode asked 1 + retries = 3 times (a failed episode is
    // re-queued once, as any episode whose env failed).
    let mut per_question = std::collections::BTreeMap::<&str, usize>::new();
    for q in &r.failed_questions {
        *per_question.entry(q.as_str()).or_default() += 1;
    }
    assert!(
        per_question.values().all(|n| n % 3 == 0),
        "{per_question:?}"
    );
    // Every call carries an idempotency key; the tries of one judgement carry the same one,
    // and other judgements other ones.
    let mut by_key = std::collections::BTreeMap::<&str, std::collections::BTreeSet<&str>>::new();
    for (key, body) in &r.keys {
        let key = key
            .as_deref()
            .expect("every judge call has an Idempotency-Key");
        assert!(key.starts_with("judge/") && key.len() == 38, "{key}");
        by_key.entry(key).or_default().insert(body);
    }
    assert!(
        by_key.values().all(|bodies| bodies.len() == 1),
        "{by_key:?}"
    );
    assert!(
        by_key.len() > 1 && by_key.len() < r.keys.len(),
        "{by_key:?}"
    );

    let rows = rows(&run.join("metrics.jsonl"));
    let failed: u64 = rows.iter().map(|r| r["failed"].as_u64().unwrap()).sum();
    let episodes: u64 = rows.iter().map(|r| r["episodes"].as_u64().unwrap()).sum();
    let reasons: Vec<String> = std::fs::read_dir(run.join("rollouts"))
        .unwrap()
        .filter_map(|e| {
            let path = e.unwrap().path();
            (path.extension()? == "idx").then(|| std::fs::read_to_string(path).unwrap())
        })
        .flat_map(|text| {
            text.lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap()["end_reason"].to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        failed > 0 && failed < episodes,
        "{failed} of {episodes} failed: {reasons:?}"
    );
    assert!(
        stderr.contains("scorer `judge`") && stderr.contains("HTTP 500"),
        "the reason is logged: {stderr}"
    );
}
