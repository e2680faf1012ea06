//! Two rollouts files side by side on the same tasks (two evaluations, say): per task, the
//! mean reward, metrics, turns and tool calls in each, and the change.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

use agent_r1_actors::trajectory::index::EpisodeSummary;

use super::episodes::{index_notes, metric_names};
use crate::view::html::{esc, frame, num};
use crate::view::run_dir::Source;
use crate::view::{Reply, Site, ViewError};

/// Most tasks listed (the largest changes first).
const MAX_ROWS: usize = 1000;

#[derive(Default)]
struct Side {
    n: usize,
    reward: f64,
    turns: f64,
    calls: f64,
    metrics: BTreeMap<String, f64>,
    first: usize,
}

fn by_task(rows: &[EpisodeSummary]) -> BTreeMap<&str, Side> {
    let mut out: BTreeMap<&str, Side> = BTreeMap::new();
    for (i, r) in rows.iter().enumerate() {
        let s = out.entry(&r.task_id).or_insert_with(|| Side {
            first: i,
            ..Side::default()
        });
        s.n += 1;
        s.reward += r.reward;
        s.turns += r.turns as f64;
        s.calls += r.tool_calls as f64;
        for (k, v) in &r.metrics {
            *s.metrics.entry(k.clone()).or_default() += v;
        }
    }
    for s in out.values_mut() {
        let n = s.n as f64;
        s.reward /= n;
        s.turns /= n;
        s.calls /= n;
        s.metrics.values_mut().for_each(|v| *v /= n);
    }
    out
}

pub(crate) fn page(site: &Site, params: &HashMap<String, String>) -> Result<Reply, ViewError> {
    let get = |k: &str| {
        params
            .get(k)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                ViewError::BadParam(format!(
                    "`{k}`: missing; /ui/compare takes a=SOURCE&b=SOURCE (e.g. a=eval-step-000000&b=eval-step-000012)"
                ))
            })
            .and_then(|s| Source::parse(s))
    };
    let (a, b) = (get("a")?, get("b")?);
    let (ia, ib) = (
        site.indexes.get(&site.run, a)?,
        site.indexes.get(&site.run, b)?,
    );
    let (ta, tb) = (by_task(&ia.rows), by_task(&ib.rows));
    let metrics = metric_names(&ia.rows);
    let mut common: Vec<(&str, &Side, &Side)> = ta
        .iter()
        .filter_map(|(task, sa)| Some((*task, sa, tb.get(task)?)))
        .collect();
    common.sort_by(|x, y| {
        (y.2.reward - y.1.reward)
            .abs()
            .total_cmp(&(x.2.reward - x.1.reward).abs())
            .then(x.0.cmp(y.0))
    });
    let questions: HashMap<&str, &str> = ia
        .rows
        .iter()
        .map(|r| (r.task_id.as_str(), r.question.as_str()))
        .collect();
    let mean = |rows: &[(&str, &Side, &Side)], f: &dyn Fn(&Side, &Side) -> f64| {
        rows.iter().map(|(_, x, y)| f(x, y)).sum::<f64>() / rows.len().max(1) as f64
    };
    let mut body = String::new();
    body.push_str(&index_notes(a, &ia));
    body.push_str(&index_notes(b, &ib));
    let _ = write!(
        body,
        "<p>A = <a href=\"/ui/episodes?source={an}\">{}</a> ({} episodes), B = <a href=\"/ui/episodes?source={bn}\">{}</a> ({} episodes). \
         {} tasks in both; mean reward over them: A {}, B {}; {} tasks changed reward.</p>",
        esc(&a.label()),
        ia.rows.len(),
        esc(&b.label()),
        ib.rows.len(),
        common.len(),
        num(Some(mean(&common, &|x, _| x.reward))),
        num(Some(mean(&common, &|_, y| y.reward))),
        common
            .iter()
            .filter(|(_, x, y)| (x.reward - y.reward).abs() > 1e-12)
            .count(),
        an = a.name(),
        bn = b.name(),
    );
    if common.is_empty() {
        body.push_str("<p class=\"note\">No task appears in both files (training samples draw different tasks each update; compare two evaluations).</p>");
    }
    body.push_str("<table id=\"compare\"><tr><th>task</th><th>question</th><th>reward A</th><th>reward B</th><th>change</th>");
    for m in &metrics {
        let _ = write!(body, "<th>{m} A</th><th>{m} B</th>", m = esc(m));
    }
    body.push_str(
        "<th>turns A</th><th>turns B</th><th>calls A</th><th>calls B</th><th>episodes</th></tr>",
    );
    for (task, x, y) in common.iter().take(MAX_ROWS) {
        let change = y.reward - x.reward;
        let _ = write!(
            body,
            "<tr{}><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{:+.4}</td>",
            if change.abs() > 1e-12 { " class=\"changed\"" } else { "" },
            esc(task),
            esc(questions.get(task).copied().unwrap_or("")),
            num(Some(x.reward)),
            num(Some(y.reward)),
            change
        );
        for m in &metrics {
            let _ = write!(
                body,
                "<td class=\"n\">{}</td><td class=\"n\">{}</td>",
                num(x.metrics.get(m).copied()),
                num(y.metrics.get(m).copied())
            );
        }
        let _ = write!(
            body,
            "<td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td><a href=\"/ui/episode?source={}&amp;n={}\">A</a> · <a href=\"/ui/episode?source={}&amp;n={}\">B</a></td></tr>",
            num(Some(x.turns)),
            num(Some(y.turns)),
            num(Some(x.calls)),
            num(Some(y.calls)),
            a.name(),
            x.first,
            b.name(),
            y.first
        );
    }
    body.push_str("</table>");
    if common.len() > MAX_ROWS {
        let _ = write!(
            body,
            "<p class=\"note\">The {MAX_ROWS} largest changes of {} tasks are listed.</p>",
            common.len()
        );
    }
    Ok(Reply::html(frame("Side by side", site.run_name(), &body)))
}
