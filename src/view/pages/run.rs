//! The run page: curves over updates, the evaluation table, the rollouts files, the
//! checkpoints and the resolved config.

use std::fmt::Write;

use serde_json::Value;

use crate::view::html::{curve, esc, frame, num, Series};
use crate::view::run_dir::{Log, SourceKind};
use crate::view::{Reply, Site, ViewError};

/// Curves drawn from `metrics.jsonl` when the rows have them: (key, title).
const UPDATE_CURVES: &[(&str, &str)] = &[
    ("reward_mean", "reward (training batch)"),
    ("em", "EM (training batch)"),
    ("f1", "F1 (training batch)"),
    ("kl", "KL to the reference"),
    ("approx_kl", "approx. KL to the old policy"),
    ("entropy", "entropy"),
    ("clip_fraction", "clip fraction"),
    ("grad_norm", "gradient norm"),
    ("policy_loss", "policy loss"),
    ("tool_calls_per_episode", "tool calls per episode"),
    ("turns_per_episode", "turns per episode"),
    ("seconds", "seconds per update"),
    ("mismatch.abs_mean", "sampler/trainer mean |Δ log-prob|"),
    ("mismatch.abs_max", "sampler/trainer max |Δ log-prob|"),
    ("mismatch.kl_k3", "sampler/trainer KL (k3)"),
    ("correction_weight_mean", "rollout correction: mean weight"),
    (
        "distill.reverse_kl",
        "distillation: reverse KL to the teacher",
    ),
];
/// Curves drawn from `eval.jsonl`.
const EVAL_CURVES: &[(&str, &str)] = &[
    ("em", "held-out EM"),
    ("f1", "held-out F1"),
    ("reward_mean", "held-out reward"),
    ("tool_calls_per_episode", "held-out tool calls per episode"),
];

fn points(log: &Log, key: &str) -> Vec<(f64, f64)> {
    log.rows
        .iter()
        .filter_map(|r| {
            // A dotted key reads inside an object (`mismatch.abs_mean`).
            let value = r.pointer(&format!("/{}", key.replace('.', "/")))?;
            Some((r.get("step")?.as_f64()?, value.as_f64()?))
        })
        .filter(|(_, y)| y.is_finite())
        .collect()
}

/// The charts of `log`'s keys that have points, as one `<div id=...>`; each SVG's series is
/// `{prefix}.{key}`.
fn curves(id: &str, prefix: &str, log: &Log, keys: &[(&str, &str)]) -> String {
    let mut b = format!("<div class=\"curves\" id=\"{id}\">");
    for (key, title) in keys {
        let pts = points(log, key);
        if !pts.is_empty() {
            b.push_str(&curve(&Series {
                key: &format!("{prefix}.{key}"),
                title,
                points: pts,
            }));
        }
    }
    b.push_str("</div>");
    b
}

fn damaged_note(name: &str, log: &Log) -> String {
    if log.damaged.is_empty() {
        return String::new();
    }
    format!(
        "<p class=\"warn damaged\">{name}: {} line(s) could not be read and were skipped (line {}); a line cut short by a crash, or a damaged file.</p>",
        log.damaged.len(),
        log.damaged
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

pub(crate) fn page(site: &Site) -> Result<Reply, ViewError> {
    let run = &site.run;
    let metrics = run.metrics();
    let evals = run.evals();
    let mut b = String::new();

    b.push_str("<h2>Training curves</h2>");
    b.push_str(&damaged_note("metrics.jsonl", &metrics));
    if !metrics.exists {
        b.push_str("<p class=\"note\">No metrics.jsonl yet: no update has finished in this run directory.</p>");
    } else {
        b.push_str(&curves("update-curves", "updates", &metrics, UPDATE_CURVES));
    }

    b.push_str("<h2>Evaluations (held-out)</h2>");
    b.push_str(&damaged_note("eval.jsonl", &evals));
    if evals.rows.is_empty() {
        b.push_str("<p class=\"note\">No evaluation yet.</p>");
    } else {
        b.push_str(&curves("eval-curves", "evals", &evals, EVAL_CURVES));
        let metric_keys: Vec<String> = evals
            .rows
            .iter()
            .filter_map(|r| r.get("metrics").and_then(Value::as_object))
            .flat_map(|m| m.keys().cloned())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        b.push_str("<table id=\"evals\"><tr><th>update</th><th>policy</th><th>episodes</th><th>reward</th>");
        for k in &metric_keys {
            let _ = write!(b, "<th>{}</th>", esc(k));
        }
        b.push_str("<th>seconds</th><th>episodes</th></tr>");
        for r in &evals.rows {
            let step = r.get("step").and_then(Value::as_u64);
            let f = |k: &str| num(r.get(k).and_then(Value::as_f64));
            let _ = write!(
                b,
                "<tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>",
                f("step"),
                f("policy_version"),
                f("episodes"),
                f("reward_mean")
            );
            for k in &metric_keys {
                let v = r
                    .get("metrics")
                    .and_then(|m| m.get(k))
                    .and_then(Value::as_f64);
                let _ = write!(b, "<td class=\"n\">{}</td>", num(v));
            }
            let link = match step {
                Some(s)
                    if run
                        .data_path(crate::view::run_dir::Source {
                            kind: SourceKind::Eval,
                            step: s,
                        })
                        .is_file() =>
                {
                    format!("<a href=\"/ui/episodes?source=eval-step-{s:06}\">episodes</a>")
                }
                _ => "—".into(),
            };
            let _ = write!(
                b,
                "<td class=\"n\">{}</td><td>{link}</td></tr>",
                f("seconds")
            );
        }
        b.push_str("</table>");
    }

    b.push_str("<h2>Rollouts</h2>");
    let sources = run.sources();
    if sources.is_empty() {
        b.push_str("<p class=\"note\">No rollouts/ files yet.</p>");
    } else {
        b.push_str("<table id=\"sources\"><tr><th>file</th><th>what</th></tr>");
        for s in &sources {
            let _ = write!(
                b,
                "<tr><td><a href=\"/ui/episodes?source={n}\">{n}</a></td><td>{}</td></tr>",
                esc(&s.label()),
                n = s.name()
            );
        }
        b.push_str("</table>");
    }

    b.push_str("<h2>Checkpoints</h2>");
    let checkpoints = run.checkpoints();
    if checkpoints.is_empty() {
        b.push_str("<p class=\"note\">No checkpoints yet.</p>");
    } else {
        b.push_str("<table id=\"checkpoints\"><tr><th>update</th><th>state</th><th>size</th></tr>");
        for c in &checkpoints {
            let _ = write!(
                b,
                "<tr><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{:.1} MB</td></tr>",
                c.step,
                if c.complete {
                    "complete"
                } else {
                    "incomplete (no manifest; a resume skips it)"
                },
                c.bytes as f64 / 1e6
            );
        }
        b.push_str("</table>");
    }

    b.push_str("<h2>Config</h2>");
    match run.config_text() {
        Some((path, text)) => {
            let _ = write!(
                b,
                "<details open><summary class=\"note\">{}</summary><pre id=\"config\">{}</pre></details>",
                esc(&path.display().to_string()),
                esc(&text)
            );
        }
        None => b.push_str(
            "<p class=\"note\">No config.toml in the run directory or its checkpoints.</p>",
        ),
    }
    Ok(Reply::html(frame("Run", site.run_name(), &b)))
}
