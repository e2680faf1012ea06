//! The Grafana dashboard against a real Prometheus: a short `agent-r1 train` run of the tiny
//! model (warm-started so that it calls its search tool; PPO with a critic and a KL term so
//! that every learner series exists) is scraped every second by Prometheus from Debian's
//! `prometheus` package on loopback, and every query of every panel in
//! `grafana/agent-r1.json` must return data through Prometheus's HTTP API. The daemon's
//! `/metrics` text must pass `promtool check metrics` without a lint problem.
//!
//! Prometheus is found on `PATH` (or `/usr/bin`). Where it is missing and the test runs as
//! root, it installs the package with apt-get (`AGENT_R1_INSTALL_PROMETHEUS=0` forbids that).
//! Where it still cannot be had, the test prints `SKIPPED: ...` with the reason and returns;
//! `AGENT_R1_REQUIRE_PROMETHEUS=1` turns that skip into a failure.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_agent-r1");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// What `$__rate_interval` becomes: several 1 s scrapes, and longer than a tiny update.
const RATE_INTERVAL: &str = "30s";
/// From the trainer's start until every panel has data: a bound against a hang, far above an
/// idle machine's time (about 40 s), so a loaded machine stays within it.
const RUN_TIMEOUT: Duration = Duration::from_secs(900);

#[path = "support/debian.rs"]
mod debian;
use debian::{debian_programs, Killed};

/// `(prometheus, promtool)`; Err is why they cannot be had.
fn prometheus_and_promtool() -> Result<(PathBuf, PathBuf), String> {
    let found = debian_programs(
        "prometheus_scrape",
        "prometheus",
        &["prometheus", "promtool"],
        "PROMETHEUS",
    )?;
    Ok((found[0].clone(), found[1].clone()))
}

/// Percent-encodes a query-string value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// GET `path` (with its query string) over HTTP/1.0; `(status, body)`.
/// The child's stderr, line by line, on a channel (and copied to `log` where given).
fn stderr_lines(child: &mut Child, mut log: Option<std::fs::File>) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().expect("stderr piped");
    std::thread::spawn(move || {
        use std::io::Write;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(file) = log.as_mut() {
                let _ = writeln!(file, "{line}");
            }
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")
        .map_err(|e| format!("GET {path}: {e}"))?;
    let mut response = String::new();
    s.read_to_string(&mut response)
        .map_err(|e| format!("GET {path}: {e}"))?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Every `(panel title, expr)` of the dashboard, Grafana variables substituted.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(Path::new(ROOT).join("grafana/agent-r1.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut panels = Vec::new();
    for p in dashboard["panels"].as_array().unwrap() {
        panels.push(p);
        panels.extend(p["panels"].as_array().into_iter().flatten());
    }
    let mut out = Vec::new();
    for p in panels {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap();
            let expr = expr
                .replace("$__rate_interval", RATE_INTERVAL)
                .replace("$__interval", RATE_INTERVAL)
                .replace("$__range", RATE_INTERVAL);
            assert!(!expr.contains('$'), "an unknown Grafana variable in {expr}");
            out.push((p["title"].as_str().unwrap_or("?").to_string(), expr));
        }
    }
    out
}

/// Runs `expr` over `[start, now]`; Ok(number of series with at least one finite value), or
/// Err(what Prometheus said).
fn query_range(prom: SocketAddr, expr: &str, start: f64) -> Result<usize, String> {
    let path = format!(
        "/api/v1/query_range?query={}&start={start:.3}&end={:.3}&step=1",
        encode(expr),
        unix_now()
    );
    let (status, body) = http_get(prom, &path)?;
    let v: Value = serde_json::from_str(&body)
        .map_err(|e| format!("HTTP {status}, not JSON ({e}): {body}"))?;
    if v["status"] != "success" {
        return Err(format!("HTTP {status}: {}", v["error"]));
    }
    let finite = v["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|series| {
            series["values"].as_array().into_iter().flatten().any(|p| {
                p[1].as_str()
                    .and_then(|s| s.parse::<f64>().ok())
                    .is_some_and(f64::is_finite)
            })
        })
        .count();
    Ok(finite)
}

fn train_config(dir: &Path) -> PathBuf {
    std::fs::write(dir.join("cookie"), "scrape-cookie\n").unwrap();
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

# PPO with a critic and a KL term to a reference, so that every learner series exists.
[algorithm]
estimator = "gae"
actor_lr = 1e-5
critic_warmup_updates = 0
micro_batch_size = 8

[algorithm.kl]
placement = "loss"

# Rollout correction's importance weight on (in float32 it stays within rounding of 1), so
# that its series exist too.
[algorithm.rollout_correction]
weight = "token"

[rollout]
batch_size = 2
group_size = 2
max_turns = 2
max_prompt_length = 384
max_response_length = 64
max_context_length = 1024
concurrency = 4

[training]
updates = 40
seed = 0
run_dir = "{run}"

# The warm start teaches the tool-call format, so that episodes call `search` (and the small
# actor_lr above keeps it calling).
[warm_start]
steps = 80
batch_size = 4
learning_rate = 5e-3

[checkpoint]
every = 1
keep_last = 1

[eval]
every = 2
questions = 2

[metrics]
address = "127.0.0.1:0"

# One remote worker beside the trainer's own engine, so the Cluster row has data.
[cluster]
listen = "127.0.0.1:0"
cookie_file = "{cookie}"
min_workers = 1
"#,
        run = dir.join("run").display(),
        cookie = dir.join("cookie").display(),
    );
    let path = dir.join("train.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn every_dashboard_query_has_data_in_a_real_prometheus() {
    let (prometheus, promtool) = match prometheus_and_promtool() {
        Ok(both) => both,
        Err(why) => {
            debian::skip(
                "every_dashboard_query_has_data_in_a_real_prometheus",
                "PROMETHEUS",
                &why,
            );
            return;
        }
    };
    let queries = dashboard_queries();
    assert!(queries.len() >= 40, "{} queries", queries.len());
    let tmp = tempfile::tempdir().unwrap();

    // 1. The daemon, on a free loopback port (it prints the address it bound).
    let started = Instant::now();
    let start_unix = unix_now() - 1.0;
    let mut trainer = Killed(
        Command::new(BIN)
            .arg("train")
            .arg("--config")
            .arg(train_config(tmp.path()))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .env("AGENT_R1_LOG", "warn")
            // One torch thread: with two spinning OpenMP threads, a tiny model slows down many
            // times over whenever anything else (a parallel build or test) shares the cores.
            .env("OMP_NUM_THREADS", "1")
            .spawn()
            .expect("starting agent-r1 train"),
    );
    let lines = stderr_lines(&mut trainer.0, None);
    let mut log = Vec::new();
    let metrics_addr: SocketAddr = loop {
        let line = lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no `metrics:` line; log:\n{}", log.join("\n")));
        log.push(line.clone());
        if let Some(rest) = line.strip_prefix("metrics: http://") {
            break rest.trim_end_matches("/metrics").parse().unwrap();
        }
    };

    // A worker, with its own metrics endpoint (its weight fetches), once the trainer listens.
    // Both ask for port 0 and say what they bound, so no other process can take a port
    // between its choice and its use.
    const LISTENING: &str = "cluster: listening for workers on ";
    let cluster: SocketAddr = loop {
        let line = lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no `{LISTENING}` line; log:\n{}", log.join("\n")));
        log.push(line.clone());
        if let Some(rest) = line.split(LISTENING).nth(1) {
            break rest.split([' ', ';']).next().unwrap().parse().unwrap();
        }
    };
    let mut worker = Killed(
        Command::new(BIN)
            .args(["worker", "--join", &cluster.to_string()])
            .arg("--cookie-file")
            .arg(tmp.path().join("cookie"))
            .args(["--name", "w1", "--concurrency", "2"])
            .arg("--dir")
            .arg(tmp.path().join("worker"))
            .args(["--metrics-address", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .env("AGENT_R1_LOG", "warn")
            .env("OMP_NUM_THREADS", "1")
            .spawn()
            .expect("starting agent-r1 worker"),
    );
    let worker_lines = stderr_lines(&mut worker.0, None);
    let mut worker_log = Vec::new();
    let worker_metrics: SocketAddr = loop {
        let line = worker_lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| {
                panic!(
                    "no worker `metrics at` line; its log:\n{}",
                    worker_log.join("\n")
                )
            });
        worker_log.push(line.clone());
        if let Some(rest) = line.split("metrics at http://").nth(1) {
            break rest.trim_end_matches("/metrics").parse().unwrap();
        }
    };

    // 2. Prometheus scraping both every second, on a port of its choice (it logs it).
    let prom_config = tmp.path().join("prometheus.yml");
    std::fs::write(
        &prom_config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: agent-r1\n    static_configs:\n      - targets: [\"{metrics_addr}\", \"{worker_metrics}\"]\n"
        ),
    )
    .unwrap();
    let mut prometheus_child = Killed(
        Command::new(&prometheus)
            .arg(format!("--config.file={}", prom_config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                tmp.path().join("tsdb").display()
            ))
            .arg("--web.listen-address=127.0.0.1:0")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting prometheus"),
    );
    // Its log goes to a file (for failure messages) and, line by line, to the wait below.
    let log_file = std::fs::File::create(tmp.path().join("prometheus.log")).unwrap();
    let prom_lines = stderr_lines(&mut prometheus_child.0, Some(log_file));
    let _prometheus = prometheus_child;
    let prom_log =
        || std::fs::read_to_string(tmp.path().join("prometheus.log")).unwrap_or_default();
    let ready_by = Instant::now() + Duration::from_secs(300);
    // Two lines of its log, in either order: where it listens (the port it chose) and that it
    // is ready (the TSDB is open and the config loaded).
    let mut listening: Option<SocketAddr> = None;
    let mut ready_said = false;
    let prom_addr = loop {
        if let (Some(addr), true) = (listening, ready_said) {
            break addr;
        }
        let line = prom_lines
            .recv_timeout(ready_by.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| {
                panic!(
                    "prometheus did not say where it listens and that it is ready within 300s \
                     (listening on {listening:?}, ready: {ready_said}); its log:\n{}",
                    prom_log()
                )
            });
        if let Some(rest) = line.split("msg=\"Listening on\" address=").nth(1) {
            listening = Some(rest.split_whitespace().next().unwrap().parse().unwrap());
        }
        ready_said |= line.contains("msg=\"Server is ready to receive web requests.\"");
    };
    let ready = http_get(prom_addr, "/-/ready");
    assert!(
        ready.as_ref().is_ok_and(|(s, _)| *s == 200),
        "prometheus said it was ready, but /-/ready answered {ready:?}"
    );

    // 3. Poll: fetch /metrics while the daemon runs, and run every panel query over the run
    //    so far, until all have data, the daemon has exited (one last round after that), or
    //    the time is up.
    let mut exposition = String::new();
    let mut failing: Vec<String>;
    let mut exited_rounds = 0;
    loop {
        while let Ok(line) = lines.try_recv() {
            log.push(line);
        }
        let exited = trainer.0.try_wait().unwrap().is_some();
        if exited {
            exited_rounds += 1;
        } else if let Ok((200, body)) = http_get(metrics_addr, "/metrics") {
            exposition = body;
        }
        failing = Vec::new();
        for (title, expr) in &queries {
            match query_range(prom_addr, expr, start_unix) {
                Ok(0) => failing.push(format!("{title:?}: {expr} (no series with data)")),
                Ok(_) => {}
                Err(e) => failing.push(format!("{title:?}: {expr} ({e})")),
            }
        }
        if failing.is_empty() || exited_rounds > 1 || started.elapsed() > RUN_TIMEOUT {
            break;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    let up = query_range(prom_addr, "up{job=\"agent-r1\"} == 1", start_unix);
    assert!(
        failing.is_empty(),
        "{} of {} dashboard queries returned no data from Prometheus after {:.0}s (daemon {}; \
         target up: {up:?}):\n{}\n\ntrainer log (tail):\n{}\n\nprometheus log (tail):\n{}",
        failing.len(),
        queries.len(),
        started.elapsed().as_secs_f64(),
        if exited_rounds > 0 {
            "exited"
        } else {
            "running"
        },
        failing.join("\n"),
        tail(&log.join("\n"), 30),
        tail(&prom_log(), 15),
    );
    eprintln!(
        "all {} dashboard queries have data after {:.0}s",
        queries.len(),
        started.elapsed().as_secs_f64()
    );

    // 4. The exposition the daemon served passes promtool's checks and lints, and its
    //    histograms are Prometheus histograms (aggregatable buckets), not summaries.
    assert!(
        exposition.contains("agent_r1_tool_call_duration_seconds_bucket{"),
        "/metrics fetched during the run lacks tool-call buckets:\n{exposition}"
    );
    assert!(
        !exposition.contains("quantile=\""),
        "a histogram is exported as a summary:\n{exposition}"
    );
    let mut check = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics ({}): {said}",
        out.status
    );
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
