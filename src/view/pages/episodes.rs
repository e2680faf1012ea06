//! The episodes of one rollouts file: a table filtered, sorted and paged by URL parameters.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write;

use agent_r1_actors::trajectory::index::EpisodeSummary;

use crate::view::episode_index::EpisodeIndex;
use crate::view::html::{esc, frame, num};
use crate::view::query::{Column, EpisodeQuery};
use crate::view::run_dir::Source;
use crate::view::{Reply, Site, ViewError};

/// The source a page is about: `source=...`, or the newest training sample.
pub(crate) fn source_param(
    site: &Site,
    params: &HashMap<String, String>,
    key: &str,
) -> Result<Source, ViewError> {
    match params.get(key).filter(|s| !s.is_empty()) {
        Some(name) => Source::parse(name),
        None => {
            let sources = site.run.sources();
            sources
                .iter()
                .rev()
                .find(|s| s.kind == crate::view::run_dir::SourceKind::Train)
                .or(sources.last())
                .copied()
                .ok_or_else(|| ViewError::NotFound("this run has no rollouts files yet".into()))
        }
    }
}

/// The env metrics the rows report (from the first 1,000 rows).
pub(crate) fn metric_names(rows: &[EpisodeSummary]) -> Vec<String> {
    rows.iter()
        .take(1000)
        .flat_map(|r| r.metrics.keys().cloned())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

pub(crate) fn index_notes(source: Source, index: &EpisodeIndex) -> String {
    let mut b = String::new();
    if !index.damaged.is_empty() {
        let _ = write!(
            b,
            "<p class=\"warn damaged\">{}: {} line(s) could not be read and were skipped (line {}).</p>",
            source.name(),
            index.damaged.len(),
            index
                .damaged
                .iter()
                .take(20)
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if index.scanned {
        b.push_str("<p class=\"note\">This file has no index beside it (written before the trainer kept one); it was indexed by reading it once.</p>");
    }
    b
}

pub(crate) fn page(site: &Site, params: &HashMap<String, String>) -> Result<Reply, ViewError> {
    let source = source_param(site, params, "source")?;
    let query = EpisodeQuery::from_params(params)?;
    let index = site.indexes.get(&site.run, source)?;
    let rows = &index.rows;
    let selected = query.select(rows);
    let pages = selected.len().div_ceil(query.per_page).max(1);
    if query.page >= pages {
        return Err(ViewError::NotFound(format!(
            "`page`: got {}; this selection has pages 0 to {}",
            query.page,
            pages - 1
        )));
    }
    let metrics = metric_names(rows);
    let name = source.name();
    let mut b = String::new();
    b.push_str(&index_notes(source, &index));

    // Sources to switch to or compare with.
    let sources = site.run.sources();
    let options = |selected: Option<Source>| {
        sources
            .iter()
            .map(|s| {
                format!(
                    "<option value=\"{n}\"{sel}>{n}</option>",
                    n = s.name(),
                    sel = if Some(*s) == selected {
                        " selected"
                    } else {
                        ""
                    }
                )
            })
            .collect::<String>()
    };
    let _ = write!(
        b,
        "<p>{} · {} episodes, {} shown by the filter</p>\
         <form class=\"filter\" id=\"filter\" method=\"get\" action=\"/ui/episodes\">\
         <label>file<select name=\"source\">{}</select></label>\
         <label>reward ≥<input name=\"reward_min\" size=\"6\" value=\"{}\"></label>\
         <label>reward ≤<input name=\"reward_max\" size=\"6\" value=\"{}\"></label>\
         <label>task or question contains<input name=\"q\" size=\"18\" value=\"{}\"></label>\
         <label>end<select name=\"end\"><option value=\"\">any</option><option{}>completed</option><option{}>failed</option></select></label>\
         <label>with tool errors<input type=\"checkbox\" name=\"tool_errors\" value=\"1\"{}></label>\
         <input type=\"hidden\" name=\"sort\" value=\"{}\"><input type=\"hidden\" name=\"desc\" value=\"{}\">\
         <button type=\"submit\" id=\"apply\">filter</button></form>\
         <form class=\"filter\" id=\"compare\" method=\"get\" action=\"/ui/compare\"><input type=\"hidden\" name=\"a\" value=\"{name}\">\
         <label>compare with<select name=\"b\">{}</select></label><button type=\"submit\">side by side</button></form>",
        esc(&source.label()),
        rows.len(),
        selected.len(),
        options(Some(source)),
        query.reward_min.map(|v| v.to_string()).unwrap_or_default(),
        query.reward_max.map(|v| v.to_string()).unwrap_or_default(),
        esc(&query.text),
        if query.end == "completed" { " selected" } else { "" },
        if query.end == "failed" { " selected" } else { "" },
        if query.tool_errors_only { " checked" } else { "" },
        esc(&query.sort.name()),
        u8::from(query.desc),
        options(sources.iter().rev().find(|s| **s != source).copied()),
    );

    let header = |label: &str, col: Column| {
        let desc = if query.sort == col {
            !query.desc
        } else {
            col != Column::Row && col != Column::Task
        };
        let arrow = match (query.sort == col, query.desc) {
            (true, true) => " ▼",
            (true, false) => " ▲",
            _ => "",
        };
        format!(
            "<th><a href=\"/ui/episodes?source={name}&amp;{}\">{}{arrow}</a></th>",
            esc(&query.params(&col, desc, 0)),
            esc(label)
        )
    };
    b.push_str("<table id=\"episodes\"><thead><tr>");
    b.push_str(&header("#", Column::Row));
    b.push_str(&header("episode", Column::Episode));
    b.push_str(&header("task", Column::Task));
    b.push_str("<th>question</th>");
    b.push_str(&header("reward", Column::Reward));
    for m in &metrics {
        b.push_str(&header(m, Column::Metric(m.clone())));
    }
    b.push_str(&header("turns", Column::Turns));
    b.push_str(&header("tool calls", Column::ToolCalls));
    b.push_str(&header("tool errors", Column::ToolErrors));
    b.push_str(&header("tokens", Column::Tokens));
    b.push_str(&header("end", Column::End));
    b.push_str(&header("policy", Column::Version));
    b.push_str(&header("seconds", Column::Seconds));
    b.push_str("</tr></thead><tbody>");
    for &i in selected
        .iter()
        .skip(query.page * query.per_page)
        .take(query.per_page)
    {
        let r = &rows[i];
        let _ = write!(
            b,
            "<tr data-reward=\"{}\" data-tool-calls=\"{}\"><td class=\"n\"><a class=\"open\" href=\"/ui/episode?source={name}&amp;n={i}\">{i}</a></td>\
             <td class=\"n\">{}</td><td>{}</td><td>{}</td><td class=\"n reward\">{}</td>",
            r.reward,
            r.tool_calls,
            r.episode_id,
            esc(&r.task_id),
            esc(&r.question),
            num(Some(r.reward))
        );
        for m in &metrics {
            let _ = write!(b, "<td class=\"n\">{}</td>", num(r.metrics.get(m).copied()));
        }
        let versions = r
            .versions
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let _ = write!(
            b,
            "<td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{} ({})</td><td>{versions}</td><td class=\"n\">{:.2}</td></tr>",
            r.turns,
            r.tool_calls,
            r.tool_errors,
            r.tokens,
            esc(&r.end),
            esc(&r.end_reason),
            r.wall_seconds
        );
    }
    b.push_str("</tbody></table><p class=\"pager\">");
    let link = |p: usize, label: &str| {
        format!(
            "<a href=\"/ui/episodes?source={name}&amp;{}\">{label}</a>",
            esc(&query.params(&query.sort, query.desc, p))
        )
    };
    if query.page > 0 {
        b.push_str(&link(query.page - 1, "← previous"));
    }
    let _ = write!(b, "<span>page {} of {pages}</span>", query.page + 1);
    if query.page + 1 < pages {
        b.push_str(&link(query.page + 1, "next →"));
    }
    b.push_str("</p>");
    Ok(Reply::html(frame(
        &format!("Episodes: {}", source.label()),
        site.run_name(),
        &b,
    )))
}
