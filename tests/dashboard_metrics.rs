//! The Grafana dashboard cannot drift from the code: every metric name in its PromQL must be
//! a declared series (`metric_names` in each crate; `tests/metric_declarations.rs` checks
//! that each is recorded), histogram suffixes only on histograms, and every panel must use
//! the datasource variable.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use agent_r1_envs::metric::MetricKind;

use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Every declared series and its kind.
fn declared_metrics() -> BTreeMap<String, MetricKind> {
    agent_r1::metric_names::all()
        .map(|m| (m.name.to_string(), m.kind))
        .collect()
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
fn the_promql_scan_finds_the_series_names() {
    assert_eq!(
        metric_names(
            "sum by (le) (rate(agent_r1_tool_call_duration_seconds_bucket[5m])) / agent_r1_episodes_in_flight"
        ),
        BTreeSet::from([
            "agent_r1_tool_call_duration_seconds_bucket".to_string(),
            "agent_r1_episodes_in_flight".to_string()
        ])
    );
}

#[test]
fn every_dashboard_metric_is_recorded_by_the_code() {
    let declared = declared_metrics();
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
                let ok = match declared.get(&name) {
                    Some(_) => true,
                    None => ["_bucket", "_sum", "_count"].iter().any(|s| {
                        name.strip_suffix(s)
                            .is_some_and(|base| declared.get(base) == Some(&MetricKind::Histogram))
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
