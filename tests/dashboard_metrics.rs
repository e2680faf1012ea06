//! The Grafana dashboard cannot drift from the code: every metric name in its PromQL must be
//! recorded somewhere in the sources (`counter!`, `gauge!`, `histogram!` calls), histogram
//! suffixes only on histograms, and every panel must use the datasource variable.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Names recorded in `text`: the first string literal after `counter!(` / `gauge!(` /
/// `histogram!(` (with or without a `metrics::` path), not `describe_*!` calls.
fn recorded_in(text: &str, out: &mut BTreeMap<String, Kind>) {
    for (macro_name, kind) in [
        ("counter!(", Kind::Counter),
        ("gauge!(", Kind::Gauge),
        ("histogram!(", Kind::Histogram),
    ] {
        for (at, _) in text.match_indices(macro_name) {
            if text[..at].ends_with("describe_") {
                continue;
            }
            let rest = text[at + macro_name.len()..].trim_start();
            let Some(rest) = rest.strip_prefix('"') else {
                continue;
            };
            if let Some(end) = rest.find('"') {
                out.insert(rest[..end].to_string(), kind);
            }
        }
    }
}

fn recorded_metrics() -> BTreeMap<String, Kind> {
    let mut files = Vec::new();
    for dir in ["actors/src", "envs/src", "src"] {
        rust_files(&Path::new(ROOT).join(dir), &mut files);
    }
    let mut names = BTreeMap::new();
    for f in files {
        recorded_in(&std::fs::read_to_string(&f).unwrap(), &mut names);
    }
    names
}

/// `agent_r1_*` identifiers in a PromQL expression.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(off) = expr[i..].find("agent_r1_") {
        let start = i + off;
        let boundary =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        if boundary {
            names.insert(expr[start..end].to_string());
        }
        i = end;
    }
    names
}

fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().expect("panels") {
        out.push(p);
        if let Some(inner) = p["panels"].as_array() {
            out.extend(inner);
        }
    }
    out
}

fn dashboard() -> Value {
    let text = std::fs::read_to_string(Path::new(ROOT).join("grafana/agent-r1.json")).unwrap();
    serde_json::from_str(&text).expect("grafana/agent-r1.json is JSON")
}

#[test]
fn the_source_scan_finds_the_known_series() {
    let recorded = recorded_metrics();
    assert_eq!(
        recorded.get("agent_r1_engine_tokens_generated_total"),
        Some(&Kind::Counter)
    );
    assert_eq!(
        recorded.get("agent_r1_tool_call_duration_seconds"),
        Some(&Kind::Histogram)
    );
    assert_eq!(
        recorded.get("agent_r1_episodes_in_flight"),
        Some(&Kind::Gauge)
    );
    let mut scan = BTreeMap::new();
    recorded_in(
        "describe_counter!(\"agent_r1_x_total\", \"h\"); metrics::gauge!(\n  \"agent_r1_y\")",
        &mut scan,
    );
    assert_eq!(scan.keys().collect::<Vec<_>>(), ["agent_r1_y"]);
    assert_eq!(
        metric_names("sum by (le) (rate(agent_r1_a_bucket[5m])) / agent_r1_b"),
        BTreeSet::from(["agent_r1_a_bucket".to_string(), "agent_r1_b".to_string()])
    );
}

#[test]
fn every_dashboard_metric_is_recorded_by_the_code() {
    let recorded = recorded_metrics();
    let dashboard = dashboard();
    let mut used = BTreeSet::new();
    let mut problems = Vec::new();
    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().unwrap_or("?");
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "panel {title:?} must use the datasource variable"
        );
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {title:?} has no queries");
        for t in targets {
            let expr = t["expr"].as_str().expect("expr");
            let names = metric_names(expr);
            assert!(
                !names.is_empty(),
                "{title:?}: {expr} names no agent_r1_ series"
            );
            for name in names {
                let ok = match recorded.get(&name) {
                    Some(_) => true,
                    None => ["_bucket", "_sum", "_count"].iter().any(|s| {
                        name.strip_suffix(s)
                            .is_some_and(|base| recorded.get(base) == Some(&Kind::Histogram))
                    }),
                };
                if ok {
                    used.insert(name);
                } else {
                    problems.push(format!("{title:?}: {name} (in {expr})"));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "dashboard series not recorded anywhere in actors/src, envs/src, src:\n{}",
        problems.join("\n")
    );
    // The series the issue asks for are on the dashboard.
    for must in [
        "agent_r1_episodes_in_flight",
        "agent_r1_engine_batch_size_bucket",
        "agent_r1_engine_tokens_generated_total",
        "agent_r1_tool_call_duration_seconds_bucket",
        "agent_r1_tool_errors_total",
        "agent_r1_tool_restarts_total",
        "agent_r1_env_restarts_total",
        "agent_r1_learner_policy_loss",
        "agent_r1_learner_reward_mean",
        "agent_r1_learner_staleness_mean",
        "agent_r1_tool_calls_total",
        "agent_r1_train_metric_mean",
        "agent_r1_learner_skipped_updates_total",
        "agent_r1_process_resident_memory_bytes",
        "agent_r1_train_update_seconds_sum",
        "agent_r1_train_last_checkpoint_timestamp_seconds",
    ] {
        assert!(used.contains(must), "the dashboard lacks {must}");
    }
    let templating = dashboard["templating"]["list"].as_array().unwrap();
    assert!(templating.iter().any(|v| v["type"] == "datasource"
        && v["name"] == "datasource"
        && v["query"] == "prometheus"));
}

/// The rows the issue asks for, in order.
#[test]
fn the_dashboard_has_the_rollout_tools_learning_process_and_cluster_rows() {
    let dashboard = dashboard();
    let rows: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "row")
        .map(|p| p["title"].as_str().unwrap())
        .collect();
    assert_eq!(rows, ["Rollout", "Tools", "Learning", "Process", "Cluster"]);
}

/// Names in `describe_*!` calls of `src/metrics_server.rs`.
fn described() -> BTreeSet<String> {
    let text = std::fs::read_to_string(Path::new(ROOT).join("src/metrics_server.rs")).unwrap();
    let mut out = BTreeSet::new();
    for kind in [
        "describe_counter!(",
        "describe_gauge!(",
        "describe_histogram!(",
    ] {
        for (at, _) in text.match_indices(kind) {
            let rest = text[at + kind.len()..].trim_start();
            let rest = rest.strip_prefix('"').expect("a literal name");
            out.insert(rest[..rest.find('"').unwrap()].to_string());
        }
    }
    out
}

#[test]
fn every_recorded_series_has_help_text_and_follows_the_naming_conventions() {
    // `promtool check metrics` wants `# HELP` on every series; counters end in `_total`,
    // only counters do; histograms must get explicit buckets from the metrics server (it
    // sets them for `*_seconds` and the engine batch size), or they would be exported as
    // summaries, whose quantiles cannot be aggregated across processes.
    let described = described();
    let mut problems = Vec::new();
    for (name, kind) in recorded_metrics() {
        if !name.starts_with("agent_r1_") {
            problems.push(format!("{name}: not agent_r1_ prefixed"));
        }
        if !described.contains(&name) {
            problems.push(format!("{name}: no describe_*! in src/metrics_server.rs"));
        }
        match kind {
            Kind::Counter if !name.ends_with("_total") => {
                problems.push(format!("{name}: a counter without _total"))
            }
            Kind::Gauge | Kind::Histogram if name.ends_with("_total") => {
                problems.push(format!("{name}: _total on a {kind:?}"))
            }
            Kind::Histogram
                if !(name.ends_with("_seconds") || name == "agent_r1_engine_batch_size") =>
            {
                problems.push(format!(
                    "{name}: a histogram without explicit buckets in metrics_server::start"
                ))
            }
            _ => {}
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn described_series_are_recorded_too() {
    // The metrics server's `# HELP` texts must not describe series nobody records.
    let recorded = recorded_metrics();
    let text = std::fs::read_to_string(Path::new(ROOT).join("src/metrics_server.rs")).unwrap();
    let mut described = 0;
    for kind in [
        "describe_counter!(",
        "describe_gauge!(",
        "describe_histogram!(",
    ] {
        for (at, _) in text.match_indices(kind) {
            let rest = text[at + kind.len()..].trim_start();
            let rest = rest.strip_prefix('"').expect("a literal name");
            let name = &rest[..rest.find('"').unwrap()];
            assert!(
                recorded.contains_key(name),
                "{name} is described but never recorded"
            );
            described += 1;
        }
    }
    assert!(described >= 20, "{described}");
}
