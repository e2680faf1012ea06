//! The series the trainer, cluster and weight plane record, and [`all`]: every series of the
//! three crates, which the metrics server describes; see [`agent_r1_envs::metric`].

use agent_r1_envs::metric::Metric;

agent_r1_envs::declare_metrics! {
    /// Connections to this endpoint closed on arrival because metrics.max_connections were
    /// open.
    METRICS_CONNECTIONS_REFUSED_TOTAL: Counter("agent_r1_metrics_connections_refused_total") labels [];

    /// Updates skipped without training, by reason (empty_batch, non_finite_reward).
    TRAIN_SKIPPED_UPDATES_TOTAL: Counter("agent_r1_train_skipped_updates_total") labels ["reason"];

    /// Periodic checkpoints skipped because every write attempt failed (older ones are kept).
    TRAIN_CHECKPOINT_FAILURES_TOTAL: Counter("agent_r1_train_checkpoint_failures_total") labels [];

    /// Remote rollout workers that are members of the run (joined and not silent for a lease
    /// period).
    CLUSTER_WORKERS: Gauge("agent_r1_cluster_workers") labels [];

    /// Episodes leased to workers and not yet reported.
    CLUSTER_LEASES: Gauge("agent_r1_cluster_leases") labels [];

    /// Episodes queued for workers (re-queued ones first) with no lease yet.
    CLUSTER_TASKS_WAITING: Gauge("agent_r1_cluster_tasks_waiting") labels [];

    /// Leases granted to workers (a re-queued episode gets a new lease).
    CLUSTER_LEASES_GRANTED_TOTAL: Counter("agent_r1_cluster_leases_granted_total") labels [];

    /// Leases that ran out or were returned by a leaving worker, their episodes queued again.
    CLUSTER_REQUEUED_TOTAL: Counter("agent_r1_cluster_requeued_total") labels [];

    /// Tasks that waited while no worker was a member and went to the trainer's own rollout.
    CLUSTER_HANDED_BACK_TOTAL: Counter("agent_r1_cluster_handed_back_total") labels [];

    /// Accepted worker trajectories waiting for room in the run's batcher.
    CLUSTER_TRAJECTORIES_UNDELIVERED: Gauge("agent_r1_cluster_trajectories_undelivered") labels [];

    /// Workers joining, first time or again after being dropped.
    CLUSTER_JOINS_TOTAL: Counter("agent_r1_cluster_joins_total") labels [];

    /// Cluster connections closed before they passed the cookie check.
    CLUSTER_REFUSED_TOTAL: Counter("agent_r1_cluster_refused_total") labels [];

    /// Trajectories reported by workers, by outcome (accepted; duplicate: its episode was
    /// accepted before, dropped).
    CLUSTER_TRAJECTORIES_TOTAL: Counter("agent_r1_cluster_trajectories_total") labels ["outcome"];

    /// Cluster messages from a peer that did not decode (another build, or not agent-r1).
    CLUSTER_MALFORMED_MESSAGES_TOTAL: Counter("agent_r1_cluster_malformed_messages_total") labels [];

    /// Seconds to save and publish one weights version on the weight server.
    CLUSTER_WEIGHT_PUBLISH_SECONDS: Histogram("agent_r1_cluster_weight_publish_seconds", Seconds) labels [];

    /// Bytes of the newest weights version on the weight server (all its files).
    CLUSTER_WEIGHT_VERSION_BYTES: Gauge("agent_r1_cluster_weight_version_bytes", Bytes) labels [];

    /// Bytes of weights received from the trainer's weight server (re-downloads included).
    CLUSTER_WEIGHT_FETCH_BYTES_TOTAL: Counter("agent_r1_cluster_weight_fetch_bytes_total", Bytes) labels [];

    /// Connections to the weight server closed on arrival because 64 were open.
    CLUSTER_WEIGHT_CONNECTIONS_REFUSED_TOTAL: Counter("agent_r1_cluster_weight_connections_refused_total") labels [];

    /// Weight file downloads retried, by reason (transfer: resumed after it broke off; digest:
    /// SHA-256 did not match the manifest).
    CLUSTER_WEIGHT_FETCH_RETRIES_TOTAL: Counter("agent_r1_cluster_weight_fetch_retries_total") labels ["reason"];

    /// Seconds to fetch and verify one weights version.
    CLUSTER_WEIGHT_FETCH_SECONDS: Histogram("agent_r1_cluster_weight_fetch_seconds", Seconds) labels [];

    /// Updates done by the training run.
    TRAIN_UPDATE_STEP: Gauge("agent_r1_train_update_step") labels [];

    /// Training tasks consumed from the task stream.
    TRAIN_DATA_POSITION: Gauge("agent_r1_train_data_position") labels [];

    /// Training episodes sampled.
    TRAIN_EPISODES_TOTAL: Counter("agent_r1_train_episodes_total") labels [];

    /// Training episodes that ended before their first turn (not trained on).
    TRAIN_EMPTY_EPISODES_TOTAL: Counter("agent_r1_train_empty_episodes_total") labels [];

    /// Mean reward of the last training batch.
    TRAIN_REWARD_MEAN: Gauge("agent_r1_train_reward_mean") labels [];

    /// Mean tool calls per episode of the last training batch.
    TRAIN_TOOL_CALLS_PER_EPISODE: Gauge("agent_r1_train_tool_calls_per_episode") labels [];

    /// Mean of an env metric (em, f1, ...) over the last training batch, by metric.
    TRAIN_METRIC_MEAN: Gauge("agent_r1_train_metric_mean") labels ["metric"];

    /// Held-out evaluation score of the last evaluation, by metric.
    TRAIN_EVAL_SCORE: Gauge("agent_r1_train_eval_score") labels ["metric"];

    /// Wall time of one training update (learn, publish the weights, write its rollouts).
    TRAIN_UPDATE_SECONDS: Histogram("agent_r1_train_update_seconds", Seconds) labels [];

    /// Wall time spent waiting for a batch before its update (near zero when async sampling
    /// kept ahead).
    TRAIN_SAMPLE_SECONDS: Histogram("agent_r1_train_sample_seconds", Seconds) labels [];

    /// Seconds the inference engine had nothing to run while the learner trained one update.
    TRAIN_ENGINE_IDLE_DURING_UPDATE_SECONDS: Histogram("agent_r1_train_engine_idle_during_update_seconds", Seconds) labels [];

    /// Unix time of the last checkpoint written.
    TRAIN_LAST_CHECKPOINT_TIMESTAMP_SECONDS: Gauge("agent_r1_train_last_checkpoint_timestamp_seconds", Seconds) labels [];

    /// Resident memory of the process (VmRSS).
    PROCESS_RESIDENT_MEMORY_BYTES: Gauge("agent_r1_process_resident_memory_bytes", Bytes) labels [];

    /// Peak resident memory of the process (VmHWM).
    PROCESS_PEAK_RESIDENT_MEMORY_BYTES: Gauge("agent_r1_process_peak_resident_memory_bytes", Bytes) labels [];
}

/// Every declared series: agent-r1-envs', agent-r1-actors' and this crate's.
pub fn all() -> impl Iterator<Item = &'static Metric> {
    agent_r1_envs::metric_names::ALL
        .iter()
        .chain(agent_r1_actors::metric_names::ALL)
        .chain(ALL)
}
