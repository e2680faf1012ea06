//! One episode, step by step: the context, the action's tokens coloured by the probability
//! the policy gave them (with id, log-probability and policy version on each), the tool
//! calls with their arguments, results, latencies and errors, the observation and the
//! rewards; the raw ids on demand.

use std::collections::HashMap;
use std::fmt::Write;

use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_actors::trajectory::Trajectory;
use serde_json::Value;

use super::episodes::source_param;
use crate::view::episode_index::read_episode;
use crate::view::html::{esc, frame, logprob_colour, num};
use crate::view::{Reply, Site, ViewError};

fn text_of(value: &Value, key: &str, ids: &[u32], tok: Option<&HfTokenizer>) -> String {
    if let Some(t) = value.get(key).and_then(Value::as_str) {
        return t.to_string();
    }
    match tok.and_then(|t| t.decode(ids, false).ok()) {
        Some(t) => t,
        None => format!("{ids:?}"),
    }
}

fn ids_block(label: &str, ids: &[u32]) -> String {
    format!(
        "<details class=\"raw\"><summary>{label} ids ({})</summary><pre>{}</pre></details>",
        ids.len(),
        ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
    )
}

pub(crate) fn page(site: &Site, params: &HashMap<String, String>) -> Result<Reply, ViewError> {
    let source = source_param(site, params, "source")?;
    let index = site.indexes.get(&site.run, source)?;
    let n: usize = match params.get("n") {
        Some(s) => s.trim().parse().map_err(|_| {
            ViewError::BadParam(format!(
                "`n`: got {s:?}; allowed: a row number of the file, 0 to {}",
                index.rows.len().saturating_sub(1)
            ))
        })?,
        None => {
            return Err(ViewError::BadParam(
                "`n`: missing; /ui/episode takes source=NAME&n=ROW".into(),
            ))
        }
    };
    let row = index.rows.get(n).ok_or_else(|| {
        ViewError::NotFound(format!(
            "`n`: {} has {} episodes (rows 0 to {}); there is no row {n}",
            source.name(),
            index.rows.len(),
            index.rows.len().saturating_sub(1)
        ))
    })?;
    let value = read_episode(&site.run, source, row)?;
    let t: Trajectory = serde_json::from_value(value.clone()).map_err(|e| {
        ViewError::RunDir(format!(
            "{}: episode {} is not a trajectory ({e})",
            source.name(),
            row.episode_id
        ))
    })?;
    let tokenizer = site.run.tokenizer();
    let tok = tokenizer.as_deref();
    let format = site.run.tool_call_format();

    let mut b = String::new();
    let _ = write!(
        b,
        "<p><a href=\"/ui/episodes?source={src}\">← {label}</a> · row {n}{prev}{next}</p>\
         <table id=\"summary\"><tr><th>episode</th><td>{}</td><th>group</th><td>{}</td><th>task</th><td>{}</td></tr>\
         <tr><th>question</th><td colspan=\"5\">{}</td></tr><tr><th>gold answers</th><td colspan=\"5\">{}</td></tr>\
         <tr><th>reward</th><td id=\"reward\">{}</td><th>end</th><td>{} ({})</td><th>attempts · seconds</th><td>{} · {:.2}</td></tr>\
         <tr><th>metrics</th><td colspan=\"5\">{}</td></tr></table>",
        t.episode_id,
        t.group_id,
        esc(&t.task.id),
        esc(&t.task.question),
        esc(&t.task.answers.join(" | ")),
        num(Some(t.reward)),
        esc(&row.end),
        esc(&row.end_reason),
        t.attempts,
        t.wall_seconds,
        t.metrics
            .iter()
            .map(|(k, v)| format!("{} = {}", esc(k), num(Some(*v))))
            .collect::<Vec<_>>()
            .join(" · "),
        src = source.name(),
        label = esc(&source.label()),
        prev = if n > 0 {
            format!(" · <a href=\"/ui/episode?source={}&amp;n={}\">previous</a>", source.name(), n - 1)
        } else {
            String::new()
        },
        next = if n + 1 < index.rows.len() {
            format!(" · <a href=\"/ui/episode?source={}&amp;n={}\">next</a>", source.name(), n + 1)
        } else {
            String::new()
        },
    );
    if tok.is_none() {
        b.push_str("<p class=\"warn\">No tokenizer in this run directory (model-init/, model-sft/ or a checkpoint's policy/): tokens are shown as ids.</p>");
    }
    b.push_str("<p class=\"note\">Action tokens are shaded by the probability the sampling policy gave them (white: near 1, red: low); hover a token for its id, log-probability and policy version. Advantages are not kept in rollouts files.</p>");

    let _ = write!(
        b,
        "<h2>Prompt ({} tokens)</h2><details><summary>show the prompt</summary><pre class=\"prompt\">{}</pre></details>{}",
        t.prompt_ids.len(),
        esc(&text_of(&value, "prompt_text", &t.prompt_ids, tok)),
        ids_block("prompt", &t.prompt_ids)
    );

    for (k, step) in t.steps.iter().enumerate() {
        let sv = value
            .get("steps")
            .and_then(|s| s.get(k))
            .unwrap_or(&Value::Null);
        let action_text = text_of(sv, "action_text", &step.action_ids, tok);
        let _ = write!(
            b,
            "<section class=\"step\" id=\"step-{k}\"><h2>Step {} · policy version {} · {} tokens · {:?}</h2>\
             <p class=\"note\">context {} tokens ({} prefilled, the rest reused) · generation {:.3} s · tools {:.3} s · process reward {}</p>\
             <div class=\"tokens\">",
            k + 1,
            step.policy_version,
            step.action_ids.len(),
            step.finish_reason,
            step.context_len,
            step.prefill_tokens,
            step.generate_seconds,
            step.tool_seconds,
            num(Some(step.reward)),
        );
        if let Some(r) = &step.rebuilt {
            let _ = write!(
                b,
                "</div><div class=\"rebuilt\"><p class=\"warn\">Context rebuilt by <b>{}</b>: kept the first {} tokens of the full history, dropped {}, then {} tokens of its own.</p>\
                 <details><summary>show this step's context after the kept tokens</summary><pre class=\"prompt\">{}</pre></details></div><div class=\"tokens\">",
                esc(&r.by),
                r.kept,
                r.dropped,
                r.ids.len(),
                esc(&match tok.and_then(|t| t.decode(&r.ids, false).ok()) {
                    Some(text) => text,
                    None => format!("{:?}", r.ids),
                }),
            );
        }
        for (i, id) in step.action_ids.iter().enumerate() {
            let lp = step.logprobs.get(i).copied().unwrap_or(f32::NAN) as f64;
            let piece = match tok.and_then(|t| t.decode(&[*id], false).ok()) {
                Some(s) => s,
                None => format!("[{id}]"),
            };
            let _ = write!(
                b,
                "<span class=\"tok\" style=\"background:{}\" data-id=\"{id}\" data-logprob=\"{lp}\" data-version=\"{}\" title=\"id {id} · logprob {lp:.4} · p {:.3} · version {}\">{}</span>",
                logprob_colour(lp),
                step.policy_version,
                lp.exp(),
                step.policy_version,
                esc(&piece)
            );
        }
        b.push_str("</div>");
        if !step.tool_calls.is_empty() {
            let parsed = format.parse(&action_text);
            b.push_str("<table class=\"calls\"><tr><th>#</th><th>tool</th><th>arguments</th><th>result</th><th>latency</th><th>error</th></tr>");
            for (i, call) in step.tool_calls.iter().enumerate() {
                let args = match parsed.get(i) {
                    Some(Ok(c)) => serde_json::to_string_pretty(&c.arguments).unwrap_or_default(),
                    Some(Err(e)) => format!("(did not parse: {e})"),
                    None => "—".into(),
                };
                let (result, error) = match &call.result {
                    Ok(out) => (out.text.clone(), String::new()),
                    Err(e) => (String::new(), e.to_string()),
                };
                let _ = write!(
                    b,
                    "<tr class=\"call\"><td>{}</td><td class=\"tool\">{}</td><td><pre class=\"args\">{}</pre></td><td><pre class=\"result\">{}</pre></td><td class=\"n\">{:.1} ms</td><td class=\"err\">{}</td></tr>",
                    i + 1,
                    esc(call.name.as_deref().unwrap_or("(none)")),
                    esc(&args),
                    esc(&result),
                    call.latency.as_secs_f64() * 1e3,
                    esc(&error)
                );
            }
            let _ = write!(
                b,
                "</table><p class=\"note\">Arguments as the run's tool-call format ({}) parses the action.</p>",
                format.name()
            );
        }
        if !step.observation_ids.is_empty() {
            let _ = write!(
                b,
                "<p class=\"note\">observation ({} tokens, not trained on):</p><div class=\"obs\">{}</div>",
                step.observation_ids.len(),
                esc(&text_of(sv, "observation_text", &step.observation_ids, tok))
            );
        }
        b.push_str(&ids_block("action", &step.action_ids));
        if !step.observation_ids.is_empty() {
            b.push_str(&ids_block("observation", &step.observation_ids));
        }
        b.push_str("</section>");
    }
    Ok(Reply::html(frame(
        &format!("Episode {} ({})", t.episode_id, source.name()),
        site.run_name(),
        &b,
    )))
}
