//! Remote rollout workers on loopback, three `agent-r1` processes and more: a
//! trainer that only trains, and workers that join it over ractor_cluster.
//!
//! Every step is ordered by construction, not by timing. The run is synchronous, so a
//! worker's n-th lease comes only after its earlier ones were reported. Worker `a` freezes
//! (fault injection: it stops sending anything, as a hung machine) on its 5th lease and is
//! killed with SIGKILL; worker `b` freezes on its 9th and is killed too; so the episodes
//! they held can only be finished by `c`, which is started after both are gone and so joins
//! mid-run. A fourth process with the wrong cookie is refused.
//!
//! The partition test puts the trainer and worker `b` in one network namespace and worker
//! `a` in another, joined by a veth pair the test makes (as root; skipped with the reason
//! where namespaces cannot be made), and cuts the link. `a` holds its leases from its 5th
//! on (fault injection: they run only once the trainer has dropped it and taken it back),
//! so it is cut off with work in hand, and `b` freezes on its 3rd lease, so only `a` can
//! finish the run once the link is back.

use std::path::{Path, PathBuf};

use serde_json::Value;

#[allow(dead_code)]
#[path = "support/debian.rs"]
mod debian;
#[path = "support/http_get.rs"]
mod http_get;
#[path = "support/run_log.rs"]
mod run_log;
#[path = "support/tiny_run.rs"]
mod tiny_run;
#[path = "support/trainer.rs"]
mod trainer;

use tiny_run::tiny_config;

use trainer::Trainer;

const UPDATES: u64 = 8;
/// Tasks per update x episodes per task.
const EPISODES_PER_UPDATE: u64 = 2 * 2;

/// The port the trainer says it listens on for workers: the tests ask for port 0, so that no
/// other process can take the port between choosing it and binding it.
fn listening_port(train: &mut Trainer) -> u16 {
    const SAYS: &str = "cluster: listening for workers on ";
    let line = train.wait_line(|l| l.contains(SAYS));
    let addr = line.split(SAYS).nth(1).unwrap_or_default();
    let addr = addr.split([' ', ';']).next().unwrap_or_default();
    addr.parse::<std::net::SocketAddr>()
        .unwrap_or_else(|e| panic!("{addr:?} in {line:?}: {e}"))
        .port()
}

fn config(dir: &Path, port: u16) -> PathBuf {
    config_on(dir, "127.0.0.1", port, UPDATES)
}

fn config_on(dir: &Path, ip: &str, port: u16, updates: u64) -> PathBuf {
    config_with(dir, ip, port, updates, 2, "")
}

fn config_with(
    dir: &Path,
    ip: &str,
    port: u16,
    updates: u64,
    min_workers: usize,
    extra: &str,
) -> PathBuf {
    std::fs::write(dir.join("cookie"), "the-cluster-secret\n").unwrap();
    // The weight server wants a token (on any address once one is set): workers are sent it
    // as they join, so every fetch below presents it.
    std::fs::write(dir.join("weights-token"), "the-weight-server-token\n").unwrap();
    let text = format!(
        r#"{base}
[checkpoint]
every = 100

[eval]
every = 100
questions = 4

[metrics]
enabled = false

[cluster]
listen = "{ip}:{port}"
weights_listen = "{ip}:0"
cookie_file = "{cookie}"
weights_token_file = "{weights_token}"
lease_secs = 10.0
heartbeat_secs = 1.0
min_workers = {min_workers}
local_rollout = false
{extra}
"#,
        base = tiny_config(dir, updates, 2, 4),
        cookie = dir.join("cookie").display(),
        weights_token = dir.join("weights-token").display(),
    );
    let path = dir.join("train.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn worker(dir: &Path, port: u16, name: &str, cookie: &str, extra: &[&str]) -> Trainer {
    Trainer::command(&worker_args(dir, "127.0.0.1", port, name, cookie, extra))
}

fn worker_args(
    dir: &Path,
    ip: &str,
    port: u16,
    name: &str,
    cookie: &str,
    extra: &[&str],
) -> Vec<String> {
    let mut args: Vec<String> = [
        "worker",
        "--join",
        &format!("{ip}:{port}"),
        "--cookie-file",
        &dir.join(cookie).display().to_string(),
        "--name",
        name,
        "--concurrency",
        "2",
        "--dir",
        &dir.join(format!("worker-{name}")).display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn last_json(stdout: &str) -> Value {
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON summary ({e}): {stdout}"))
}

#[test]
fn workers_on_loopback_train_to_the_end_through_a_kill_a_mid_run_join_and_a_wrong_cookie() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 0);
    std::fs::write(dir.path().join("wrong-cookie"), "not-the-secret\n").unwrap();
    let mut train = Trainer::start(&cfg, &dir.path().join("run"), false);
    let port = listening_port(&mut train);
    train.wait_line(|l| l.contains("cluster: waiting for 2 workers"));

    // A wrong cookie is refused by the trainer, logged there, and the worker says so.
    let intruder = worker(dir.path(), port, "intruder", "wrong-cookie", &[]);
    let (code, _, log) = intruder.finish();
    assert_eq!(code, Some(2), "the intruder must fail: {log}");
    assert!(
        log.contains("refused this worker: the cookie check failed"),
        "{log}"
    );
    train.wait_line(|l| l.contains("refused: it did not pass the cookie check"));

    let mut a = worker(dir.path(), port, "a", "cookie", &["--freeze-at-lease", "5"]);
    let mut b = worker(dir.path(), port, "b", "cookie", &["--freeze-at-lease", "9"]);
    train.wait_line(|l| l.contains("worker a joined") || l.contains("worker b joined"));
    train.wait_line(|l| l.contains("worker a joined") || l.contains("worker b joined"));

    a.wait_line(|l| l.contains("fault injection: frozen at lease"));
    a.signal("KILL");
    let (_, a_out, _) = a.finish();
    assert!(a_out.is_empty(), "a was killed before any summary");
    b.wait_line(|l| l.contains("fault injection: frozen at lease"));
    b.signal("KILL");
    let _ = b.finish();

    // Only `c` is left to finish the episodes `a` and `b` held and the rest of the run.
    let c = worker(dir.path(), port, "c", "cookie", &[]);
    let (code, train_out, train_log) = train.finish();
    assert_eq!(code, Some(0), "train failed:\n{train_log}");
    let (c_code, c_out, c_log) = c.finish();
    assert_eq!(c_code, Some(0), "worker c failed:\n{c_log}");

    let summary = last_json(&train_out);
    assert_eq!(summary["updates"], UPDATES, "{summary}");
    let cluster = &summary["cluster"];
    let stat = |w: &str, k: &str| cluster["workers"][w][k].as_u64().unwrap_or(0);
    // Every episode of every update was accepted exactly once: nothing lost, nothing twice.
    assert_eq!(
        cluster["accepted"],
        UPDATES * EPISODES_PER_UPDATE,
        "{cluster}"
    );
    assert_eq!(cluster["duplicates"], 0, "{cluster}");
    assert_eq!(
        (cluster["waiting"].as_u64(), cluster["outstanding"].as_u64()),
        (Some(0), Some(0))
    );
    let accepted: u64 = ["a", "b", "c"].iter().map(|w| stat(w, "episodes")).sum();
    assert_eq!(accepted, UPDATES * EPISODES_PER_UPDATE, "{cluster}");
    for w in ["a", "b", "c"] {
        assert!(
            stat(w, "episodes") >= 1,
            "worker {w} sampled nothing: {cluster}"
        );
    }
    // The killed workers' leases ran out and were queued again, each logged.
    assert!(
        stat("a", "requeued") >= 1 && stat("b", "requeued") >= 1,
        "{cluster}"
    );
    assert!(train_log.contains("of worker a (episode"), "{train_log}");
    assert!(train_log.contains("of worker b (episode"), "{train_log}");
    assert!(train_log.contains("worker a silent for"), "{train_log}");

    // `c` joined mid-run with the weights of that moment and sampled only with them or newer.
    let c_summary = last_json(&c_out);
    let joined = c_summary["joined_at_version"].as_u64().unwrap();
    assert!(joined >= 2, "c joined at version {joined}: {c_summary}");
    let sampled: Vec<u64> = c_summary["versions_sampled"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert!(!sampled.is_empty() && sampled[0] >= joined, "{c_summary}");
    assert_eq!(
        c_summary["stopped"], "the trainer finished the run",
        "{c_summary}"
    );
    assert_eq!(
        c_summary["episodes_reported"].as_u64(),
        Some(stat("c", "episodes"))
    );
}

#[test]
fn with_local_rollout_the_tasks_of_a_worker_that_is_gone_go_to_the_trainer_and_the_run_ends() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_with(dir.path(), "127.0.0.1", 0, 4, 1, "");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace("local_rollout = false", "local_rollout = true"),
    )
    .unwrap();
    let mut train = Trainer::start(&cfg, &dir.path().join("run"), false);
    let port = listening_port(&mut train);
    // Feeding starts once `a` has joined, and workers with room come first: `a` gets the
    // first lease, freezes on it (fault injection: it sends nothing more, as a hung machine)
    // and is killed. Its leases can then only run out, and no worker is left to take them.
    let mut a = worker(dir.path(), port, "a", "cookie", &["--freeze-at-lease", "1"]);
    a.wait_line(|l| l.contains("fault injection: frozen at lease"));
    a.signal("KILL");
    let _ = a.finish();

    let (code, train_out, train_log) = train.finish();
    assert_eq!(code, Some(0), "train failed:\n{train_log}");
    let summary = last_json(&train_out);
    assert_eq!(summary["updates"], 4, "{summary}");
    let cluster = &summary["cluster"];
    assert!(
        cluster["workers"]["a"]["requeued"].as_u64() >= Some(1),
        "{cluster}"
    );
    assert_eq!(cluster["accepted"], 0, "{cluster}");
    assert!(cluster["handed_back"].as_u64() >= Some(1), "{cluster}");
    assert_eq!(
        (cluster["waiting"].as_u64(), cluster["outstanding"].as_u64()),
        (Some(0), Some(0)),
        "{cluster}"
    );
    assert!(
        train_log.contains("went to the trainer's own rollout"),
        "{train_log}"
    );
}

#[test]
fn a_worker_swapping_weights_for_longer_than_a_lease_keeps_its_membership() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_with(dir.path(), "127.0.0.1", 0, 2, 1, "");
    let mut train = Trainer::start(&cfg, &dir.path().join("run"), false);
    let port = listening_port(&mut train);
    // Its swap to version 1 waits 12 s (fault injection: a large model's load), longer than
    // the 10 s lease; the sync run needs it to sample the second update.
    let a = worker(dir.path(), port, "a", "cookie", &["--slow-swap-secs", "12"]);
    let (code, train_out, train_log) = train.finish();
    assert_eq!(code, Some(0), "train failed:\n{train_log}");
    let (a_code, _, a_log) = a.finish();
    assert_eq!(a_code, Some(0), "worker a failed:\n{a_log}");
    assert!(
        a_log.contains("fault injection: the swap to version 1 waits 12.0 s"),
        "{a_log}"
    );
    assert!(!train_log.contains("worker a silent"), "{train_log}");
    let summary = last_json(&train_out);
    assert_eq!(summary["updates"], 2, "{summary}");
    let a_stats = &summary["cluster"]["workers"]["a"];
    assert_eq!(
        (a_stats["joins"].as_u64(), a_stats["requeued"].as_u64()),
        (Some(1), Some(0)),
        "{a_stats}"
    );
    assert_eq!(
        summary["cluster"]["accepted"],
        2 * EPISODES_PER_UPDATE,
        "{summary}"
    );
}

#[test]
fn with_lora_the_worker_fetches_the_base_once_and_samples_with_each_versions_adapters() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_with(
        dir.path(),
        "127.0.0.1",
        0,
        3,
        1,
        "\n[lora]\nrank = 4\nalpha = 8\n",
    );
    let run = dir.path().join("run");
    let mut train = Trainer::start(&cfg, &run, false);
    let port = listening_port(&mut train);
    let a = worker(dir.path(), port, "a", "cookie", &[]);
    let (code, train_out, train_log) = train.finish();
    assert_eq!(code, Some(0), "train failed:\n{train_log}");
    let (a_code, _, a_log) = a.finish();
    assert_eq!(a_code, Some(0), "worker a failed:\n{a_log}");
    assert!(
        train_log.contains("cluster: the frozen base published once for workers"),
        "{train_log}"
    );
    // The base crossed once; every version is the adapters alone.
    assert_eq!(a_log.matches("the frozen base:").count(), 1, "{a_log}");
    let summary = last_json(&train_out);
    assert_eq!(summary["updates"], 3, "{summary}");
    assert_eq!(
        summary["cluster"]["accepted"],
        3 * EPISODES_PER_UPDATE,
        "{summary}"
    );
    let manifest = |dir: PathBuf| -> Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap()
    };
    let bytes = |m: &Value| -> u64 {
        m["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["bytes"].as_u64().unwrap())
            .sum()
    };
    let base = manifest(run.join("weights/base"));
    let latest = manifest(run.join("weights/v00000003"));
    let names: Vec<&str> = latest["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"adapter_model.safetensors") && !names.contains(&"model.safetensors"),
        "{names:?}"
    );
    assert!(bytes(&latest) * 10 < bytes(&base), "{latest} vs {base}");
    // The worker sampled every update with the adapters the learner had: its log-probs
    // are the learner's recomputation (float32 CPU), also after the adapters have moved.
    let rows = run_log::jsonl(&run.join("metrics.jsonl"));
    assert_eq!(rows.len(), 3);
    for row in &rows {
        let worst = row["mismatch"]["abs_max"].as_f64().unwrap();
        assert!(
            worst <= 1e-5,
            "update {}: |Δ log-prob| {worst}",
            row["step"]
        );
    }
}

/// Two network namespaces joined by a veth pair: `t` (10.77.0.1) and `w` (10.77.0.2),
/// deleted (with whatever runs in them) on drop.
struct Namespaces {
    t: String,
    w: String,
}

impl Namespaces {
    fn make() -> Result<Self, String> {
        if !debian::is_root() {
            return Err("not root".into());
        }
        let pid = std::process::id();
        let ns = Namespaces {
            t: format!("ar1t{pid}"),
            w: format!("ar1w{pid}"),
        };
        let (t, w) = (ns.t.as_str(), ns.w.as_str());
        for cmd in [
            vec!["netns", "add", t],
            vec!["netns", "add", w],
            vec![
                "link", "add", "vT", "netns", t, "type", "veth", "peer", "name", "vW", "netns", w,
            ],
            vec!["-n", t, "addr", "add", "10.77.0.1/24", "dev", "vT"],
            vec!["-n", w, "addr", "add", "10.77.0.2/24", "dev", "vW"],
            vec!["-n", t, "link", "set", "vT", "up"],
            vec!["-n", w, "link", "set", "vW", "up"],
            vec!["-n", t, "link", "set", "lo", "up"],
            vec!["-n", w, "link", "set", "lo", "up"],
        ] {
            ip(&cmd)?;
        }
        Ok(ns)
    }

    /// Cuts (false) or restores (true) `w`'s link.
    fn link(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&["-n", &self.w, "link", "set", "vW", state]).unwrap();
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in [&self.t, &self.w] {
            if let Ok(out) = std::process::Command::new("ip")
                .args(["netns", "pids", ns])
                .output()
            {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = std::process::Command::new("kill")
                        .args(["-KILL", pid])
                        .status();
                }
            }
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[test]
fn a_worker_partitioned_longer_than_its_lease_loses_its_leases_and_rejoins_without_duplicates() {
    let ns = match Namespaces::make() {
        Ok(ns) => ns,
        Err(why) => {
            debian::skip(
                "a_worker_partitioned_longer_than_its_lease_loses_its_leases_and_rejoins_without_duplicates",
                "NETNS",
                &format!("cannot make network namespaces here ({why})"),
            );
            return;
        }
    };
    const UPDATES_HERE: u64 = 10;
    let dir = tempfile::tempdir().unwrap();
    let (ip_t, port) = ("10.77.0.1", 17700);
    let cfg = config_on(dir.path(), ip_t, port, UPDATES_HERE);
    let mut args: Vec<String> = ["train", "--config"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(cfg.display().to_string());
    args.push("--out".into());
    args.push(dir.path().join("run").display().to_string());
    let mut train = Trainer::command_in_netns(&ns.t, &args);
    train.wait_line(|l| l.contains("cluster: waiting for 2 workers"));
    let mut a = Trainer::command_in_netns(
        &ns.w,
        &worker_args(
            dir.path(),
            ip_t,
            port,
            "a",
            "cookie",
            &["--hold-from-lease", "5"],
        ),
    );
    let mut b = Trainer::command_in_netns(
        &ns.t,
        &worker_args(
            dir.path(),
            ip_t,
            port,
            "b",
            "cookie",
            &["--freeze-at-lease", "3"],
        ),
    );

    // Cut off with leases in hand, for longer than a lease: the trainer drops it.
    a.wait_line(|l| l.contains("held until it rejoins"));
    ns.link(false);
    train.wait_line(|l| l.contains("worker a silent for"));
    ns.link(true);
    // Back: the trainer takes it again and says so; its held leases run now.
    a.wait_line(|l| l.contains("welcomed again after being dropped"));
    b.wait_line(|l| l.contains("fault injection: frozen at lease"));
    b.signal("KILL");
    let _ = b.finish();

    let (code, train_out, train_log) = train.finish();
    assert_eq!(code, Some(0), "train failed:\n{train_log}");
    let (a_code, a_out, a_log) = a.finish();
    assert_eq!(a_code, Some(0), "worker a failed:\n{a_log}");
    let summary = last_json(&train_out);
    assert_eq!(summary["updates"], UPDATES_HERE, "{summary}");
    let cluster = &summary["cluster"];
    let stat = |w: &str, k: &str| cluster["workers"][w][k].as_u64().unwrap_or(0);
    // Each episode once in the batcher, whichever copy (the held one or the re-queued one)
    // finished first.
    assert_eq!(
        cluster["accepted"],
        UPDATES_HERE * EPISODES_PER_UPDATE,
        "{cluster}"
    );
    assert_eq!(
        stat("a", "episodes") + stat("b", "episodes"),
        UPDATES_HERE * EPISODES_PER_UPDATE,
        "{cluster}"
    );
    assert!(stat("a", "requeued") >= 1, "{cluster}");
    assert!(stat("a", "joins") >= 2, "{cluster}");
    assert!(train_log.contains("of worker a (episode"), "{train_log}");
    assert!(train_log.contains("worker a rejoined"), "{train_log}");
    assert_eq!(last_json(&a_out)["stopped"], "the trainer finished the run");
}

#[test]
fn with_cluster_tls_a_worker_joins_past_silent_peers_and_a_plain_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let make = |name: &str| {
        let (cert, key) = (
            dir.path().join(format!("{name}.pem")),
            dir.path().join(format!("{name}.key")),
        );
        let made = std::process::Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args([
                "-subj",
                "/CN=agent-r1-test",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
            ])
            .args(["-addext", "basicConstraints=critical,CA:FALSE", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output();
        match made {
            Ok(o) if o.status.success() => Ok((cert, key)),
            other => Err(format!("{other:?}")),
        }
    };
    let (cert, key, other) = match (make("cert"), make("other")) {
        (Ok((cert, key)), Ok((other, _))) => (cert, key, other),
        (Err(e), _) | (_, Err(e)) => {
            debian::skip(
                "with_cluster_tls_a_worker_joins_past_silent_peers_and_a_plain_one_is_refused",
                "OPENSSL",
                &format!("openssl cannot make a test certificate here: {e}"),
            );
            return;
        }
    };
    let tls = format!(
        "[cluster.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        cert.display(),
        key.display()
    );
    let cfg = config_with(dir.path(), "127.0.0.1", 0, 2, 1, &tls);
    let mut train = Trainer::start(&cfg, &dir.path().join("run"), false);
    let port = listening_port(&mut train);
    // Without TLS the handshake never happens: refused, and it says what to check.
    let (code, _, log) = worker(dir.path(), port, "plain", "cookie", &[]).finish();
    assert_eq!(code, Some(2), "{log}");
    assert!(
        log.contains("refused this worker") && log.contains("--tls-ca"),
        "{log}"
    );
    // Trusting another certificate: the worker refuses the trainer's.
    let other = other.display().to_string();
    let (code, _, log) = worker(dir.path(), port, "wary", "cookie", &["--tls-ca", &other]).finish();
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("InvalidCertificate"), "{log}");
    // Peers that connect and say nothing hold no one up: each handshake has a task and a
    // deadline of its own, so the worker below joins while they hang.
    let _silent: Vec<_> = (0..3)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let ca = cert.display().to_string();
    let w = worker(dir.path(), port, "a", "cookie", &["--tls-ca", &ca]);
    let (code, out, train_log) = train.finish();
    assert_eq!(code, Some(0), "{train_log}");
    assert_eq!(
        last_json(&out)["cluster"]["workers"]["a"]["episodes"],
        2 * EPISODES_PER_UPDATE
    );
    let (code, out, log) = w.finish();
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(last_json(&out)["stopped"], "the trainer finished the run");
}

/// A worker's metrics endpoint off loopback: refused at start in one line without a token
/// (naming the flags); with one, `/metrics` wants it and `/healthz`, opened, does not. The
/// trainer it joins is a socket that never answers, so the worker stays up, waiting.
#[test]
fn a_workers_metrics_off_loopback_want_the_token_given_on_its_command_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cookie"), "the-cluster-secret\n").unwrap();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let metrics = ["--metrics-address", "0.0.0.0:0"];
    let refused = worker(dir.path(), port, "m", "cookie", &metrics);
    let (code, _, log) = refused.finish();
    assert_eq!(code, Some(2), "{log}");
    assert_eq!(log.trim().lines().count(), 1, "{log}");
    assert!(
        log.contains("--metrics-address") && log.contains("--metrics-token-file"),
        "{log}"
    );

    let token = "5eb63bbbe01eeed093cb22bb";
    std::fs::write(dir.path().join("metrics-token"), format!("{token}\n")).unwrap();
    let token_file = dir.path().join("metrics-token").display().to_string();
    let mut w = worker(
        dir.path(),
        port,
        "m",
        "cookie",
        &[
            "--metrics-address",
            "0.0.0.0:0",
            "--metrics-token-file",
            &token_file,
            "--metrics-open-path",
            "/healthz",
            "--join-timeout-secs",
            "600",
        ],
    );
    let line = w.wait_line(|l| l.contains("metrics at http://"));
    let addr = line
        .rsplit("http://")
        .next()
        .unwrap()
        .trim_end_matches("/metrics");
    let port = addr.parse::<std::net::SocketAddr>().expect(&line).port();
    let status = |path: &str, token: Option<&str>| -> u16 {
        http_get::get_as(([127, 0, 0, 1], port).into(), path, token).0
    };
    assert_eq!(status("/metrics", None), 401);
    assert_eq!(status("/metrics", Some(token)), 200);
    assert_eq!(status("/healthz", None), 200);
    w.signal("KILL");
    let _ = w.finish();
    drop(silent);
}
