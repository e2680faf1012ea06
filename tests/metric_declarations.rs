//! Every metric name exists in exactly one declaration (`metric_names` in each crate, see
//! `agent_r1_envs::metric`): recording sites name the declaration with the declared kind and
//! label keys, every declaration is recorded somewhere, and no `agent_r1_*` metric name is
//! written as a literal anywhere else in the sources (tests may read series by their names,
//! but only declared ones).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use agent_r1::metric_names;
use agent_r1_envs::metric::{Metric, MetricKind};

#[path = "support/rust_sources.rs"]
mod rust_sources;

use rust_sources::rust_files;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The declaration files, the only places a metric name is written.
const DECLARATIONS: [&str; 4] = [
    "envs/src/metric.rs",
    "envs/src/metric_names.rs",
    "actors/src/metric_names.rs",
    "src/metric_names.rs",
];

/// `agent_r1_`-prefixed literals that are not metric names.
const NOT_METRICS: [(&str, &str); 6] = [
    (
        "agent_r1_test_total",
        "a series tests/metrics_server.rs records to probe the exporter",
    ),
    ("agent_r1_qa", "a reward kind"),
    ("agent_r1_reward", "the reward kind's Python name"),
    ("agent_r1_parquet", "a dataset format"),
    ("agent_r1_cuda_shim", "the CUDA shim's library name"),
    (
        "agent_r1_dist_shim",
        "the torch.distributed shim's library name",
    ),
];

fn relative(path: &Path) -> String {
    path.strip_prefix(ROOT).unwrap().display().to_string()
}

fn declared() -> BTreeMap<&'static str, &'static Metric> {
    metric_names::all().map(|m| (m.ident, m)).collect()
}

/// One `counter!(` / `gauge!(` / `histogram!(` call: its kind, its first argument and the
/// label keys written as `"key" =>`.
#[derive(Debug)]
struct Site {
    at: String,
    kind: MetricKind,
    name_arg: String,
    label_keys: Vec<String>,
}

fn sites_in(text: &str, at: &str, out: &mut Vec<Site>) {
    for (macro_name, kind) in [
        ("counter!(", MetricKind::Counter),
        ("gauge!(", MetricKind::Gauge),
        ("histogram!(", MetricKind::Histogram),
    ] {
        for (start, _) in text.match_indices(macro_name) {
            let before = &text[..start];
            if before.ends_with("describe_") || before.ends_with("macro_rules! ") {
                continue;
            }
            let open = start + macro_name.len() - 1;
            let mut depth = 0;
            let mut end = open;
            for (i, c) in text[open..].char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            end = open + i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let args = &text[open + 1..end];
            let name_arg = args.split(',').next().unwrap().trim().to_string();
            let mut label_keys = Vec::new();
            for (arrow, _) in args.match_indices("=>") {
                let key = args[..arrow].trim_end();
                if let Some(key) = key.strip_suffix('"') {
                    label_keys.push(key[key.rfind('"').unwrap() + 1..].to_string());
                }
            }
            let line = before.matches('\n').count() + 1;
            out.push(Site {
                at: format!("{at}:{line}"),
                kind,
                name_arg,
                label_keys,
            });
        }
    }
}

fn library_sources() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in ["envs/src", "actors/src", "src"] {
        rust_files(&Path::new(ROOT).join(dir), &mut files);
    }
    files
}

fn sites() -> Vec<Site> {
    let mut out = Vec::new();
    for f in library_sources() {
        if DECLARATIONS.contains(&relative(&f).as_str()) {
            continue;
        }
        sites_in(
            &std::fs::read_to_string(&f).unwrap(),
            &relative(&f),
            &mut out,
        );
    }
    out
}

/// Checks each site against the declarations; returns the problems and the idents recorded.
fn check_sites(
    sites: &[Site],
    declared: &BTreeMap<&str, &Metric>,
) -> (Vec<String>, BTreeSet<String>) {
    let mut problems = Vec::new();
    let mut recorded = BTreeSet::new();
    for s in sites {
        let ident = s
            .name_arg
            .strip_suffix(".name")
            .and_then(|path| path.rsplit("::").next())
            .filter(|_| s.name_arg.contains("metric_names::"));
        let Some(ident) = ident else {
            problems.push(format!(
                "{}: records `{}`; name a declaration instead (`crate::metric_names::IDENT.name`)",
                s.at, s.name_arg
            ));
            continue;
        };
        let Some(m) = declared.get(ident) else {
            problems.push(format!("{}: `{ident}` is not declared", s.at));
            continue;
        };
        if m.kind != s.kind {
            problems.push(format!(
                "{}: {} is declared a {:?} but recorded as a {:?}",
                s.at, m.name, m.kind, s.kind
            ));
        }
        for key in &s.label_keys {
            if !m.labels.contains(&key.as_str()) {
                problems.push(format!(
                    "{}: {} gets label `{key}`, declared labels are {:?}",
                    s.at, m.name, m.labels
                ));
            }
        }
        recorded.insert(ident.to_string());
    }
    (problems, recorded)
}

#[test]
fn each_name_is_declared_once_and_follows_the_prometheus_conventions() {
    let all: Vec<&Metric> = metric_names::all().collect();
    assert!(all.len() >= 90, "{}", all.len());
    let mut names = BTreeSet::new();
    let mut idents = BTreeSet::new();
    let mut problems = Vec::new();
    for m in &all {
        if !names.insert(m.name) {
            problems.push(format!("{}: declared twice", m.name));
        }
        if !idents.insert(m.ident) {
            problems.push(format!("{}: two declarations named {}", m.name, m.ident));
        }
        if !m.name.starts_with("agent_r1_") {
            problems.push(format!("{}: not agent_r1_ prefixed", m.name));
        }
        if m.help_text().len() < 10 {
            problems.push(format!("{}: no help text", m.name));
        }
        // Counters end in `_total`, only counters do; histograms get explicit buckets from
        // the metrics server (`*_seconds` and the engine batch size), or they would be
        // exported as summaries, whose quantiles cannot be aggregated across processes.
        match m.kind {
            MetricKind::Counter if !m.name.ends_with("_total") => {
                problems.push(format!("{}: a counter without _total", m.name))
            }
            MetricKind::Gauge | MetricKind::Histogram if m.name.ends_with("_total") => {
                problems.push(format!("{}: _total on a {:?}", m.name, m.kind))
            }
            MetricKind::Histogram
                if !(m.name.ends_with("_seconds") || m.name == "agent_r1_engine_batch_size") =>
            {
                problems.push(format!(
                    "{}: a histogram without explicit buckets in metrics_server::start",
                    m.name
                ))
            }
            _ => {}
        }
        if m.name.ends_with("_seconds") && m.unit.is_none() {
            problems.push(format!("{}: `_seconds` without the Seconds unit", m.name));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_recording_site_names_a_declaration_of_its_kind_and_labels() {
    let declared = declared();
    let sites = sites();
    assert!(sites.len() >= 100, "{}", sites.len());
    let (problems, recorded) = check_sites(&sites, &declared);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let unrecorded: Vec<_> = declared
        .keys()
        .filter(|i| !recorded.contains(**i))
        .collect();
    assert!(
        unrecorded.is_empty(),
        "declared but never recorded: {unrecorded:?}"
    );
}

#[test]
fn the_site_check_catches_a_literal_a_wrong_kind_and_an_undeclared_label() {
    let declared = declared();
    let mut sites = Vec::new();
    sites_in(
        r#"metrics::counter!("agent_r1_episodes_total", "status" => "x").increment(1);
           metrics::gauge!(crate::metric_names::EPISODES_TOTAL.name).set(1.0);
           metrics::counter!(crate::metric_names::EPISODES_TOTAL.name, "colour" => c).increment(1);
           metrics::describe_counter!("agent_r1_nothing_total", "h");"#,
        "probe.rs",
        &mut sites,
    );
    assert_eq!(sites.len(), 3, "{sites:?}");
    let (problems, _) = check_sites(&sites, &declared);
    assert_eq!(problems.len(), 3, "{problems:#?}");
    for expected in [
        "probe.rs:1: records `\"agent_r1_episodes_total\"`; name a declaration",
        "probe.rs:2: agent_r1_episodes_total is declared a Counter but recorded as a Gauge",
        "probe.rs:3: agent_r1_episodes_total gets label `colour`",
    ] {
        assert!(
            problems.iter().any(|p| p.starts_with(expected)),
            "{expected} not in {problems:#?}"
        );
    }
}

/// String literals in `text` that are a whole `agent_r1_…` name, with their line numbers.
fn literals(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("\"agent_r1_") {
        let rest = &text[at + 1..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if !rest[end..].starts_with('"') {
            continue;
        }
        out.push((
            text[..at].matches('\n').count() + 1,
            rest[..end].to_string(),
        ));
    }
    out
}

#[test]
fn no_metric_name_is_written_outside_its_declaration() {
    let names: BTreeSet<&str> = metric_names::all().map(|m| m.name).collect();
    let not_metrics: BTreeSet<&str> = NOT_METRICS.iter().map(|(n, _)| *n).collect();
    let mut files = Vec::new();
    for dir in ["envs", "actors", "src", "tests", "examples"] {
        rust_files(&Path::new(ROOT).join(dir), &mut files);
    }
    let mut problems = Vec::new();
    let mut test_reads = 0;
    for f in &files {
        let at = relative(f);
        if DECLARATIONS.contains(&at.as_str()) || at == "tests/metric_declarations.rs" {
            continue;
        }
        let in_tests = at.starts_with("tests/") || at.contains("/tests/");
        for (line, lit) in literals(&std::fs::read_to_string(f).unwrap()) {
            if not_metrics.contains(lit.as_str()) {
                continue;
            }
            // Tests may also match a family of series by a prefix (`"agent_r1_engine_"`).
            let declared = names.contains(lit.as_str())
                || ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|s| lit.strip_suffix(s).is_some_and(|b| names.contains(b)))
                || (in_tests && lit.ends_with('_') && names.iter().any(|n| n.starts_with(&lit)));
            match (declared, in_tests) {
                (true, true) => test_reads += 1,
                (true, false) => problems.push(format!(
                    "{at}:{line}: \"{lit}\" written out; use its declaration's `.name`"
                )),
                (false, _) => problems.push(format!(
                    "{at}:{line}: \"{lit}\" is not a declared metric (declare it in a \
                     metric_names module, or list it in NOT_METRICS if it is no metric)"
                )),
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(
        test_reads > 0,
        "the scan found no test reading a series by name"
    );
}

#[test]
fn check_config_explain_metrics_lists_each_declaration() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent-r1"))
        .args(["check-config", "--explain-metrics"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let all: Vec<&Metric> = metric_names::all().collect();
    assert_eq!(lines.len(), all.len(), "{text}");
    for (line, m) in lines.iter().zip(&all) {
        let kind = format!("{:?}", m.kind).to_lowercase();
        assert!(
            line.starts_with(&format!("{}  # {kind}; ", m.name)) && line.ends_with(&m.help_text()),
            "{line:?} is not {m:?}"
        );
    }
    let duration = lines
        .iter()
        .find(|l| l.starts_with("agent_r1_tool_call_duration_seconds "))
        .unwrap();
    assert!(duration.contains("; seconds; labels tool; "), "{duration}");
}
