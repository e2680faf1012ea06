//! The live page of a running `train`: the episodes in flight with their stage and how long
//! they have been in it, counts per stage, episodes finished, and the newest update. The
//! page polls `/ui/live.json` once a second and redraws itself without reloading.

use serde_json::json;

use crate::view::html::frame;
use crate::view::{Reply, Site};

const SCRIPT: &str = r#"
<script>
function cell(tr, text, cls) { const td = document.createElement('td'); td.textContent = text; if (cls) td.className = cls; tr.appendChild(td); }
async function refresh() {
  let data;
  try { const r = await fetch('/ui/live.json', {cache: 'no-store'}); data = await r.json(); }
  catch (e) { document.getElementById('status').textContent = 'cannot reach the trainer: ' + e; return; }
  document.getElementById('status').textContent = data.live ? 'live' : data.reason;
  if (!data.live) return;
  const s = data.snapshot;
  document.getElementById('in-flight').textContent = s.in_flight;
  document.getElementById('completed').textContent = s.completed;
  document.getElementById('ended-otherwise').textContent = s.ended_otherwise;
  document.getElementById('stages').textContent = Object.entries(s.stages).map(([k, v]) => k + ': ' + v).join(' · ') || 'none';
  const u = data.latest_update;
  document.getElementById('latest').textContent = u ? ('update ' + u.step + ' · reward ' + Number(u.reward_mean).toFixed(3) + ' · ' + Number(u.seconds).toFixed(1) + ' s') : 'none yet';
  const body = document.getElementById('live-rows');
  body.replaceChildren();
  for (const e of s.episodes) {
    const tr = document.createElement('tr'); tr.className = 'live-episode'; tr.dataset.episode = e.episode_id;
    cell(tr, e.episode_id, 'n'); cell(tr, e.task_id); cell(tr, e.question); cell(tr, e.stage, 'stage');
    cell(tr, e.stage_seconds.toFixed(1), 'n'); cell(tr, e.seconds.toFixed(1), 'n'); cell(tr, e.turns, 'n'); cell(tr, e.tool_calls, 'n'); cell(tr, e.tokens, 'n');
    body.appendChild(tr);
  }
  document.getElementById('refreshes').textContent = Number(document.getElementById('refreshes').textContent) + 1;
}
refresh(); setInterval(refresh, 1000);
</script>"#;

pub(crate) fn page(site: &Site) -> Reply {
    let body = format!(
        "<p>Status: <b id=\"status\">loading</b> · refreshed <span id=\"refreshes\">0</span> times</p>\
         <table><tr><th>in flight</th><td id=\"in-flight\" class=\"n\">—</td><th>completed</th><td id=\"completed\" class=\"n\">—</td>\
         <th>ended otherwise (failed, re-queued)</th><td id=\"ended-otherwise\" class=\"n\">—</td></tr>\
         <tr><th>stages</th><td colspan=\"5\" id=\"stages\">—</td></tr><tr><th>newest update</th><td colspan=\"5\" id=\"latest\">—</td></tr></table>\
         <h2>Episodes in flight (longest in their stage first)</h2>\
         <table id=\"live\"><thead><tr><th>episode</th><th>task</th><th>question</th><th>stage</th><th>in stage (s)</th><th>running (s)</th>\
         <th>turns</th><th>tool calls</th><th>tokens</th></tr></thead><tbody id=\"live-rows\"></tbody></table>\
         <p class=\"note\">The stall detector's warnings will appear here once the rollout service has one.</p>{SCRIPT}"
    );
    Reply::html(frame("Live", site.run_name(), &body))
}

pub(crate) fn json(site: &Site) -> Reply {
    let value = match &site.live {
        Some(board) => json!({
            "live": true,
            "snapshot": board.snapshot(),
            "latest_update": site.run.metrics().rows.last(),
        }),
        None => json!({
            "live": false,
            "reason": "not live: this server reads a run directory (agent-r1 view); a running `agent-r1 train` serves its live page at /ui/live on its metrics address",
        }),
    };
    Reply {
        status: 200,
        content_type: "application/json",
        body: value.to_string(),
    }
}
