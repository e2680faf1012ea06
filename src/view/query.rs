//! Query strings: decoding, and the episodes table's filter, sort and page, validated once.

use std::cmp::Ordering;
use std::collections::HashMap;

use agent_r1_actors::trajectory::index::EpisodeSummary;

use super::ViewError;

/// Rows per page when the URL does not say.
pub const PER_PAGE: usize = 50;
/// Most rows a page may ask for.
const MAX_PER_PAGE: usize = 1000;

/// Decoded `key=value` pairs (the last of a repeated key wins; `+` is a space).
pub fn parse_query(query: Option<&str>) -> HashMap<String, String> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(&s.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned()
    };
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

/// Encodes a query value.
pub fn encode(value: &str) -> String {
    percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// A column of the episodes table.
#[derive(Debug, Clone, PartialEq)]
pub enum Column {
    /// Position in the file.
    Row,
    /// Episode id.
    Episode,
    /// Task id.
    Task,
    /// Reward.
    Reward,
    /// One of the env's metrics.
    Metric(String),
    /// Turns.
    Turns,
    /// Tool calls.
    ToolCalls,
    /// Failed tool calls.
    ToolErrors,
    /// Generated tokens.
    Tokens,
    /// End status and reason.
    End,
    /// Newest policy version.
    Version,
    /// Wall seconds.
    Seconds,
}

impl Column {
    /// The fixed columns' names as URLs carry them.
    pub const FIXED: [&'static str; 11] = [
        "row",
        "episode",
        "task",
        "reward",
        "turns",
        "tool_calls",
        "tool_errors",
        "tokens",
        "end",
        "version",
        "seconds",
    ];

    fn parse(name: &str) -> Result<Self, ViewError> {
        Ok(match name {
            "row" => Column::Row,
            "episode" => Column::Episode,
            "task" => Column::Task,
            "reward" => Column::Reward,
            "turns" => Column::Turns,
            "tool_calls" => Column::ToolCalls,
            "tool_errors" => Column::ToolErrors,
            "tokens" => Column::Tokens,
            "end" => Column::End,
            "version" => Column::Version,
            "seconds" => Column::Seconds,
            other => match other.strip_prefix("metric:") {
                Some(m) if !m.is_empty() => Column::Metric(m.to_string()),
                _ => {
                    return Err(ViewError::BadParam(format!(
                        "`sort`: got {other:?}; allowed: {}, or metric:NAME",
                        Self::FIXED.join(", ")
                    )))
                }
            },
        })
    }

    /// Its name in URLs.
    pub fn name(&self) -> String {
        match self {
            Column::Metric(m) => format!("metric:{m}"),
            other => Self::FIXED[other.fixed_position()].to_string(),
        }
    }

    fn fixed_position(&self) -> usize {
        match self {
            Column::Row => 0,
            Column::Episode => 1,
            Column::Task => 2,
            Column::Reward => 3,
            Column::Turns => 4,
            Column::ToolCalls => 5,
            Column::ToolErrors => 6,
            Column::Tokens => 7,
            Column::End => 8,
            Column::Version => 9,
            Column::Seconds => 10,
            Column::Metric(_) => usize::MAX,
        }
    }

    fn compare(&self, a: (usize, &EpisodeSummary), b: (usize, &EpisodeSummary)) -> Ordering {
        let (ra, rb) = (a.1, b.1);
        let metric = |r: &EpisodeSummary, m: &str| r.metrics.get(m).copied().unwrap_or(f64::NAN);
        match self {
            Column::Row => a.0.cmp(&b.0),
            Column::Episode => ra.episode_id.cmp(&rb.episode_id),
            Column::Task => ra.task_id.cmp(&rb.task_id),
            Column::Reward => ra.reward.total_cmp(&rb.reward),
            Column::Metric(m) => metric(ra, m).total_cmp(&metric(rb, m)),
            Column::Turns => ra.turns.cmp(&rb.turns),
            Column::ToolCalls => ra.tool_calls.cmp(&rb.tool_calls),
            Column::ToolErrors => ra.tool_errors.cmp(&rb.tool_errors),
            Column::Tokens => ra.tokens.cmp(&rb.tokens),
            Column::End => (&ra.end, &ra.end_reason).cmp(&(&rb.end, &rb.end_reason)),
            Column::Version => ra.versions.last().cmp(&rb.versions.last()),
            Column::Seconds => ra.wall_seconds.total_cmp(&rb.wall_seconds),
        }
    }
}

/// The episodes table's filter, order and page.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeQuery {
    /// Lowest reward shown.
    pub reward_min: Option<f64>,
    /// Highest reward shown.
    pub reward_max: Option<f64>,
    /// Text the task id or question contains (case-insensitive).
    pub text: String,
    /// `completed`, `failed` or empty for both.
    pub end: String,
    /// Only episodes with at least one failed tool call.
    pub tool_errors_only: bool,
    /// Sort column.
    pub sort: Column,
    /// Descending.
    pub desc: bool,
    /// Page, from 0.
    pub page: usize,
    /// Rows per page.
    pub per_page: usize,
}

impl Default for EpisodeQuery {
    fn default() -> Self {
        Self {
            reward_min: None,
            reward_max: None,
            text: String::new(),
            end: String::new(),
            tool_errors_only: false,
            sort: Column::Row,
            desc: false,
            page: 0,
            per_page: PER_PAGE,
        }
    }
}

fn number(q: &HashMap<String, String>, key: &str) -> Result<Option<f64>, ViewError> {
    match q.get(key).map(|s| s.trim()).filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(s) => match s.parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(Some(v)),
            _ => Err(ViewError::BadParam(format!(
                "`{key}`: got {s:?}; allowed: a finite number"
            ))),
        },
    }
}

fn count(
    q: &HashMap<String, String>,
    key: &str,
    min: usize,
    max: usize,
) -> Result<Option<usize>, ViewError> {
    match q.get(key).map(|s| s.trim()).filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(s) => match s.parse::<usize>() {
            Ok(v) if (min..=max).contains(&v) => Ok(Some(v)),
            _ => Err(ViewError::BadParam(format!(
                "`{key}`: got {s:?}; allowed: a whole number in [{min}, {max}]"
            ))),
        },
    }
}

impl EpisodeQuery {
    /// Validates the URL's parameters.
    pub fn from_params(q: &HashMap<String, String>) -> Result<Self, ViewError> {
        let end = q.get("end").cloned().unwrap_or_default();
        if !["", "completed", "failed"].contains(&end.as_str()) {
            return Err(ViewError::BadParam(format!(
                "`end`: got {end:?}; allowed: completed, failed, or empty"
            )));
        }
        Ok(Self {
            reward_min: number(q, "reward_min")?,
            reward_max: number(q, "reward_max")?,
            text: q.get("q").map(|s| s.trim().to_string()).unwrap_or_default(),
            end,
            tool_errors_only: q.get("tool_errors").is_some_and(|v| v == "1" || v == "on"),
            sort: match q.get("sort").filter(|s| !s.is_empty()) {
                Some(s) => Column::parse(s)?,
                None => Column::Row,
            },
            desc: q.get("desc").is_some_and(|v| v == "1"),
            page: count(q, "page", 0, usize::MAX >> 1)?.unwrap_or(0),
            per_page: count(q, "per_page", 1, MAX_PER_PAGE)?.unwrap_or(PER_PAGE),
        })
    }

    /// The URL parameters that give this query (`page` and `sort` replaced as asked).
    pub fn params(&self, sort: &Column, desc: bool, page: usize) -> String {
        let mut p = vec![
            format!("sort={}", encode(&sort.name())),
            format!("desc={}", u8::from(desc)),
            format!("page={page}"),
        ];
        if let Some(v) = self.reward_min {
            p.push(format!("reward_min={v}"));
        }
        if let Some(v) = self.reward_max {
            p.push(format!("reward_max={v}"));
        }
        if !self.text.is_empty() {
            p.push(format!("q={}", encode(&self.text)));
        }
        if !self.end.is_empty() {
            p.push(format!("end={}", self.end));
        }
        if self.tool_errors_only {
            p.push("tool_errors=1".into());
        }
        if self.per_page != PER_PAGE {
            p.push(format!("per_page={}", self.per_page));
        }
        p.join("&")
    }

    fn keeps(&self, r: &EpisodeSummary, needle: &str) -> bool {
        self.reward_min.is_none_or(|m| r.reward >= m)
            && self.reward_max.is_none_or(|m| r.reward <= m)
            && (self.end.is_empty() || r.end == self.end)
            && (!self.tool_errors_only || r.tool_errors > 0)
            && (needle.is_empty()
                || r.task_id.to_lowercase().contains(needle)
                || r.question.to_lowercase().contains(needle))
    }

    /// The positions (in file order) of the rows that pass the filter, sorted; and how many
    /// passed.
    pub fn select(&self, rows: &[EpisodeSummary]) -> Vec<usize> {
        let needle = self.text.to_lowercase();
        let mut kept: Vec<usize> = (0..rows.len())
            .filter(|&i| self.keeps(&rows[i], &needle))
            .collect();
        kept.sort_by(|&a, &b| {
            let o = self
                .sort
                .compare((a, &rows[a]), (b, &rows[b]))
                .then(a.cmp(&b));
            if self.desc {
                o.reverse()
            } else {
                o
            }
        });
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(reward: f64, task: &str, errors: usize) -> EpisodeSummary {
        EpisodeSummary {
            offset: 0,
            bytes: 0,
            episode_id: 0,
            group_id: 0,
            task_id: task.into(),
            question: format!("question of {task}"),
            reward,
            metrics: [("em".to_string(), reward)].into(),
            turns: 1,
            tool_calls: errors,
            tool_errors: errors,
            tokens: 3,
            end: "completed".into(),
            end_reason: "done".into(),
            versions: vec![0],
            wall_seconds: 0.1,
        }
    }

    #[test]
    fn filters_sort_and_pages_come_from_the_url() {
        let rows = vec![
            row(0.2, "a", 0),
            row(1.0, "b", 1),
            row(0.7, "c", 0),
            row(0.0, "ab", 2),
        ];
        let q =
            EpisodeQuery::from_params(&parse_query(Some("reward_min=0.5&sort=metric%3Aem&desc=1")))
                .unwrap();
        assert_eq!(q.select(&rows), vec![1, 2]);
        let q = EpisodeQuery::from_params(&parse_query(Some("q=A&sort=reward"))).unwrap();
        assert_eq!(q.select(&rows), vec![3, 0]);
        let q = EpisodeQuery::from_params(&parse_query(Some("tool_errors=1"))).unwrap();
        assert_eq!(q.select(&rows), vec![1, 3]);
        let again = EpisodeQuery::from_params(&parse_query(Some(&q.params(&q.sort, q.desc, 0))));
        assert_eq!(again.unwrap(), q);
    }

    #[test]
    fn bad_parameters_name_the_key_and_what_is_allowed() {
        for (query, key) in [
            ("reward_min=abc", "`reward_min`"),
            ("reward_max=inf", "`reward_max`"),
            ("sort=nope", "`sort`"),
            ("page=-1", "`page`"),
            ("per_page=0", "`per_page`"),
            ("end=maybe", "`end`"),
        ] {
            let e = EpisodeQuery::from_params(&parse_query(Some(query))).unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains(key) && text.contains("allowed"),
                "{query}: {text}"
            );
        }
    }
}
