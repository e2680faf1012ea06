//! The web UI over a run directory: the run page (config, curves, evaluations,
//! checkpoints), the episodes of an update or evaluation (filtered, sorted, paged, or two
//! side by side), one episode step by step, and the live page of a running `train`.
//!
//! `train` serves it at `/ui` on the metrics address; `agent-r1 view RUN_DIR` serves a run
//! directory read-only. Pages are rendered here from the run's files; URLs name rollouts by
//! source name only ([`run_dir::Source`]), never by path, so nothing outside the run
//! directory can be asked for.

pub mod episode_index;
pub mod html;
mod pages;
pub mod query;
pub mod run_dir;

use std::path::Path;

use agent_r1_actors::runtime::LiveBoard;

use episode_index::IndexCache;
use run_dir::RunDir;

/// Why a page cannot be shown.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    /// A URL parameter is malformed or out of range.
    #[error("bad request: {0}")]
    BadParam(String),
    /// No such page or rollouts file.
    #[error("not found: {0}")]
    NotFound(String),
    /// The run directory is missing, unreadable or damaged.
    #[error("{0}")]
    RunDir(String),
}

/// An HTTP answer: status code, content type, body.
#[derive(Debug)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Content type.
    pub content_type: &'static str,
    /// Body.
    pub body: String,
}

impl Reply {
    fn html(body: String) -> Self {
        Self {
            status: 200,
            content_type: "text/html; charset=utf-8",
            body,
        }
    }
}

/// A run directory served as web pages, with the live board when the run is in this process.
#[derive(Debug)]
pub struct Site {
    run: RunDir,
    indexes: IndexCache,
    live: Option<LiveBoard>,
    /// The run directory's path as the page header shows it (resolved once).
    name: String,
}

impl Site {
    /// Serves `root`; `live` is the running trainer's board (`None` for `agent-r1 view`).
    pub fn open(root: &Path, live: Option<LiveBoard>) -> Result<Self, ViewError> {
        let name = root
            .canonicalize()
            .unwrap_or_else(|_| root.to_path_buf())
            .display()
            .to_string();
        Ok(Self {
            run: RunDir::open(root)?,
            indexes: IndexCache::default(),
            live,
            name,
        })
    }

    /// Answers `GET path?query` (a path under `/ui`). Blocking: reads files.
    pub fn respond(&self, path: &str, query: Option<&str>) -> Reply {
        let params = query::parse_query(query);
        let result = self.run.check().and_then(|()| match path {
            "/ui" | "/ui/" => pages::run::page(self),
            "/ui/episodes" => pages::episodes::page(self, &params),
            "/ui/compare" => pages::compare::page(self, &params),
            "/ui/episode" => pages::episode::page(self, &params),
            "/ui/live" => Ok(pages::live::page(self)),
            "/ui/live.json" => Ok(pages::live::json(self)),
            _ => Err(ViewError::NotFound(format!(
                "no page {path:?}; the pages are /ui, /ui/episodes, /ui/compare, /ui/episode, /ui/live"
            ))),
        });
        match result {
            Ok(reply) => reply,
            Err(e) => self.error_page(&e),
        }
    }

    fn error_page(&self, e: &ViewError) -> Reply {
        let status = match e {
            ViewError::BadParam(_) => 400,
            ViewError::NotFound(_) => 404,
            ViewError::RunDir(_) => 500,
        };
        let body = format!(
            "<p class=\"err\" id=\"error\">{}</p><p><a href=\"/ui\">back to the run</a></p>",
            html::esc(&e.to_string())
        );
        Reply {
            status,
            ..Reply::html(html::frame("error", self.run_name(), &body))
        }
    }

    fn run_name(&self) -> &str {
        &self.name
    }
}
