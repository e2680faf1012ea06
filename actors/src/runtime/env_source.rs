//! Where episodes get their env: each episode's env actor holds an env taken from an
//! [`EnvSource`] when the episode starts, so a slow env call holds up only its own episode,
//! and an episode retried after its env failed starts on a freshly built env.

use std::sync::Arc;

use agent_r1_envs::env::Env;

use super::workflow::Workflow;

/// Builds an env for one episode.
pub type EnvBuilder = Arc<dyn Fn() -> agent_r1_envs::Result<Arc<dyn Env>> + Send + Sync>;

/// How episodes get their env.
#[derive(Clone)]
pub enum EnvSource {
    /// One env object shared by every episode: for envs that keep no per-episode state
    /// (scorers, the QA envs). Each episode still gets its own env actor, so its calls never
    /// queue behind another episode's.
    Shared(Arc<dyn Env>),
    /// A new env built for every episode (and every retry): for stateful envs such as a
    /// sandbox or a browser session.
    PerEpisode {
        /// Builds one env.
        build: EnvBuilder,
        /// The tools its envs use (checked against the configured tools at start).
        tool_names: Vec<String>,
    },
    /// No env: a [`Workflow`] drives each episode itself.
    Workflow {
        /// The workflow.
        workflow: Arc<dyn Workflow>,
        /// The tools it calls (checked against the configured tools at start).
        tool_names: Vec<String>,
    },
}

impl EnvSource {
    /// A source that builds a new env per episode; builds one now to learn its tools.
    pub fn per_episode(build: EnvBuilder) -> agent_r1_envs::Result<Self> {
        let tool_names = build()?.tool_names();
        Ok(EnvSource::PerEpisode { build, tool_names })
    }

    /// An env for one episode.
    pub fn build(&self) -> agent_r1_envs::Result<Arc<dyn Env>> {
        match self {
            EnvSource::Shared(env) => Ok(env.clone()),
            EnvSource::PerEpisode { build, .. } => build(),
            EnvSource::Workflow { workflow, .. } => Err(agent_r1_envs::Error::Config {
                key: "env".into(),
                message: format!(
                    "workflow `{}` drives its episodes without an env",
                    workflow.name()
                ),
            }),
        }
    }

    /// The tools the env uses.
    pub fn tool_names(&self) -> Vec<String> {
        match self {
            EnvSource::Shared(env) => env.tool_names(),
            EnvSource::PerEpisode { tool_names, .. } | EnvSource::Workflow { tool_names, .. } => {
                tool_names.clone()
            }
        }
    }
}

impl From<Arc<dyn Env>> for EnvSource {
    fn from(env: Arc<dyn Env>) -> Self {
        EnvSource::Shared(env)
    }
}

impl std::fmt::Debug for EnvSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvSource::Shared(env) => write!(f, "EnvSource::Shared({})", env.name()),
            EnvSource::PerEpisode { tool_names, .. } => {
                write!(f, "EnvSource::PerEpisode(tools: {tool_names:?})")
            }
            EnvSource::Workflow { workflow, .. } => {
                write!(f, "EnvSource::Workflow({})", workflow.name())
            }
        }
    }
}
