//! `make demo-math` shortened, in `make test`, so that a change which stops the demos from
//! learning fails a test: the built-in `math` preset as `--preset math` reads it, on its
//! seed 0, with a shorter warm start, a third of its updates and reproducible rollouts
//! (`rollout.deterministic`). The held-out accuracy after RL must beat the one after the
//! warm start by `LIFT`.
//!
//! The run repeats bit for bit (seeded, `mode = "sync"`, one turn decoded at a time, MKL's
//! results independent of buffer alignment): two runs side by side on two busy
//! cores give the same losses, rewards and accuracies. What it does not survive is a change
//! that moves the warm start's numerics (a prompt, the tokenizer's corpus, a kernel): copying
//! numbers from the problem is learnt abruptly, at a step that moves with such a change, so
//! the warm start is kept well past it.
//!
//! The math demo rather than `make demo`: its RL is the same loop (GRPO over the actor
//! runtime, a tool, a warm start with a bad habit RL has to remove) at about a third of the
//! multi-hop demo's cost per update, and its warm start costs about 0.25 s a step against
//! 0.9 s: the whole run takes about 7-8 minutes on two cores.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Steps of the first warm-start phase (the preset's 2000): copying numbers from the problem
/// and the calculator's result is learnt (loss from about 0.3 to under 0.06) at about step
/// 1,225 on seed 0 at this version, and between 775 and 1,225 on the seeds and versions
/// measured (docs/demo.md); 1,000 was too few at this version.
const WARM_START_STEPS: i64 = 1600;
/// Updates (the preset's 12): the preset's runs remove the bad habit within 4.
const UPDATES: i64 = 4;
/// The least held-out lift (80 problems) that counts as learning; the demo's own bar is 0.4
/// (`agent-r1 bench demo --preset math`), and a policy that does not change lifts by 0.
const LIFT: f64 = 0.25;

/// The `math` preset with the shortened warm start and RL, its metrics on a free port and
/// its run directory under `dir`.
fn shortened_math_preset(dir: &Path) -> String {
    let mut config: toml::Table = agent_r1::config::preset_text("math")
        .unwrap()
        .parse()
        .unwrap();
    let mut set = |section: &str, key: &str, value: toml::Value| {
        let table = config[section]
            .as_table_mut()
            .unwrap_or_else(|| panic!("the math preset has no [{section}]"));
        assert!(
            table.contains_key(key),
            "the math preset has no {section}.{key} to shorten"
        );
        table.insert(key.into(), value);
    };
    set(
        "warm_start",
        "steps",
        toml::Value::Integer(WARM_START_STEPS),
    );
    set("training", "updates", toml::Value::Integer(UPDATES));
    set("training", "seed", toml::Value::Integer(0));
    set(
        "training",
        "run_dir",
        toml::Value::String(dir.join("unused").display().to_string()),
    );
    set(
        "metrics",
        "address",
        toml::Value::String("127.0.0.1:0".into()),
    );
    // Not in the preset (its default is off): the same run on every machine load.
    config["rollout"]
        .as_table_mut()
        .unwrap()
        .insert("deterministic".into(), toml::Value::Boolean(true));
    toml::to_string(&config).unwrap()
}

#[test]
fn the_math_demo_shortened_still_lifts_held_out_accuracy() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("math-short.toml");
    std::fs::write(&config, shortened_math_preset(tmp.path())).unwrap();
    let run = tmp.path().join("run");
    let out = Command::new(env!("CARGO_BIN_EXE_agent-r1"))
        .args(["train", "--config"])
        .arg(&config)
        .arg("--out")
        .arg(&run)
        .env("AGENT_R1_LOG", "warn")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "train failed: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no summary line in {stdout}"));
    assert_eq!(summary["updates"], UPDATES, "{summary}");
    assert!(
        summary["warm_start"]["steps"].as_i64().unwrap() > WARM_START_STEPS,
        "the shortened warm start and its bad-habit phase: {summary}"
    );
    let (before, after) = (
        summary["em_before"].as_f64().unwrap(),
        summary["em_after"].as_f64().unwrap(),
    );
    eprintln!("held-out accuracy {before:.3} -> {after:.3} in {UPDATES} updates");
    assert!(
        after - before >= LIFT,
        "the shortened math demo lifted held-out accuracy by {:.3} ({before:.3} -> {after:.3}), \
         less than {LIFT}: RL or the warm start stopped working; the end of the run's log:\n{}",
        after - before,
        tail(&stderr, 40)
    );
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
