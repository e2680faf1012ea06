//! The series agent-r1-envs records (tool guards, rewards, the env registry); see
//! [`crate::metric`].

crate::declare_metrics! {
    /// Episodes a [scorer] could not score (after its retries), by scorer; each fails its
    /// episode.
    SCORER_ERRORS_TOTAL: Counter("agent_r1_scorer_errors_total") labels ["scorer"];

    /// Time a [scorer] took for one episode, retries included, by scorer.
    SCORER_SECONDS: Histogram("agent_r1_scorer_seconds", Seconds) labels ["scorer"];

    /// Tool calls answered with a timeout whose code is still running on the tool runtime (a
    /// tool that blocks its thread cannot be aborted).
    TOOL_CALLS_OVERDUE: Gauge("agent_r1_tool_calls_overdue") labels [];
}
