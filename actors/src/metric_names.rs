//! The series agent-r1-actors records (episodes, tools, engine, learner, stall detector);
//! see [`agent_r1_envs::metric`].

agent_r1_envs::declare_metrics! {
    /// Episodes finished, by status (completed, requeued, failed).
    EPISODES_TOTAL: Counter("agent_r1_episodes_total") labels ["status"];

    /// Episodes running in the actor runtime now.
    EPISODES_IN_FLIGHT: Gauge("agent_r1_episodes_in_flight") labels [];

    /// Episodes waiting for a concurrency slot.
    EPISODES_QUEUED: Gauge("agent_r1_episodes_queued") labels [];

    /// Episodes whose task prompt was over rollout.max_prompt_length (or left no room for a
    /// turn); failed, not retried, not trained on.
    PROMPTS_TOO_LONG_TOTAL: Counter("agent_r1_prompts_too_long_total") labels [];

    /// Requests to the OpenAI-compatible endpoint, by route and HTTP status.
    ENDPOINT_REQUESTS_TOTAL: Counter("agent_r1_endpoint_requests_total") labels ["route", "status"];

    /// Endpoint chat requests whose earlier assistant messages were not all reused as sampled
    /// (edited or never returned by the endpoint): rendered whole, recorded as rebuilt
    /// contexts.
    ENDPOINT_CONTEXTS_REBUILT_TOTAL: Counter("agent_r1_endpoint_contexts_rebuilt_total") labels [];

    /// Context tokens of endpoint chat requests taken from earlier steps as sampled instead of
    /// rendered anew.
    ENDPOINT_REUSED_TOKENS_TOTAL: Counter("agent_r1_endpoint_reused_tokens_total") labels [];

    /// Outside agent programs (external_agent) finished, by outcome (completed, failed,
    /// timed_out).
    AGENT_PROCESSES_TOTAL: Counter("agent_r1_agent_processes_total") labels ["outcome"];

    /// Turn contexts the [env.context] policy rebuilt instead of extending the history, by
    /// policy.
    CONTEXT_REBUILDS_TOTAL: Counter("agent_r1_context_rebuilds_total") labels ["policy"];

    /// Tokens of the full history left out of rebuilt contexts, by policy.
    CONTEXT_DROPPED_TOKENS_TOTAL: Counter("agent_r1_context_dropped_tokens_total") labels ["policy"];

    /// Env actors restarted by the supervisor after a crash.
    ENV_RESTARTS_TOTAL: Counter("agent_r1_env_restarts_total") labels [];

    /// Failed tool calls, by tool and error kind (tool unparsed: the call did not parse;
    /// unknown: no tool has its name).
    TOOL_ERRORS_TOTAL: Counter("agent_r1_tool_errors_total") labels ["tool", "kind"];

    /// Queued tool calls dropped unrun because their episode had stopped waiting, by tool.
    TOOL_CALLS_ABANDONED_TOTAL: Counter("agent_r1_tool_calls_abandoned_total") labels ["tool"];

    /// Tool calls answered from the run's call journal instead of being made again (an
    /// episode sampled again after a resume), by tool.
    TOOL_CALLS_REPLAYED_TOTAL: Counter("agent_r1_tool_calls_replayed_total") labels ["tool"];

    /// Episodes a resume gave back from a checkpoint's in-flight records, by outcome:
    /// `continued` from their last finished step, or `restarted` from their first turn
    /// (an env built per episode, or a workflow: neither can be captured between turns).
    EPISODES_RESUMED_TOTAL: Counter("agent_r1_episodes_resumed_total") labels ["outcome"];

    /// Tool workers restarted, by tool.
    TOOL_RESTARTS_TOTAL: Counter("agent_r1_tool_restarts_total") labels ["tool"];

    /// Calls waiting for a tool worker, by tool.
    TOOL_QUEUE_DEPTH: Gauge("agent_r1_tool_queue_depth") labels ["tool"];

    /// Tool call latency, by tool.
    TOOL_CALL_DURATION_SECONDS: Histogram("agent_r1_tool_call_duration_seconds", Seconds) labels ["tool"];

    /// Time a call waited for a tool worker, by tool.
    TOOL_QUEUE_WAIT_SECONDS: Histogram("agent_r1_tool_queue_wait_seconds", Seconds) labels ["tool"];

    /// Share of the engine thread's time over the last ~2 s, by phase: forward (passes and
    /// sampling), admit, finish (KV parking, replies), stop_check, idle, other.
    ENGINE_TIME_RATIO: Gauge("agent_r1_engine_time_ratio") labels ["engine", "phase"];

    /// Policy version of the weights the engine samples with.
    ENGINE_POLICY_VERSION: Gauge("agent_r1_engine_policy_version") labels ["engine"];

    /// Tokens sampled by the inference engine.
    ENGINE_TOKENS_GENERATED_TOTAL: Counter("agent_r1_engine_tokens_generated_total") labels ["engine"];

    /// Context tokens run through prefill.
    ENGINE_PREFILL_TOKENS_TOTAL: Counter("agent_r1_engine_prefill_tokens_total") labels ["engine"];

    /// Context tokens served from a parked KV cache instead of prefill.
    ENGINE_REUSED_TOKENS_TOTAL: Counter("agent_r1_engine_reused_tokens_total") labels ["engine"];

    /// Sequences per engine decode step.
    ENGINE_BATCH_SIZE: Histogram("agent_r1_engine_batch_size") labels ["engine"];

    /// Duration of one engine step.
    ENGINE_STEP_SECONDS: Histogram("agent_r1_engine_step_seconds", Seconds) labels ["engine"];

    /// Bytes of KV cache parked between an episode's turns.
    ENGINE_KV_PARKED_BYTES: Gauge("agent_r1_engine_kv_parked_bytes") labels ["engine"];

    /// Sequences in the engine's running batch.
    ENGINE_RUNNING_SEQUENCES: Gauge("agent_r1_engine_running_sequences") labels ["engine"];

    /// Generation requests waiting for a batch slot.
    ENGINE_WAITING_REQUESTS: Gauge("agent_r1_engine_waiting_requests") labels ["engine"];

    /// Learner updates done.
    LEARNER_UPDATES_TOTAL: Counter("agent_r1_learner_updates_total") labels [];

    /// Optimizer steps skipped (non-finite loss or gradient).
    LEARNER_SKIPPED_UPDATES_TOTAL: Counter("agent_r1_learner_skipped_updates_total") labels [];

    /// Trajectories trained on.
    LEARNER_TRAJECTORIES_TOTAL: Counter("agent_r1_learner_trajectories_total") labels [];

    /// Tokens masked out for exceeding max_staleness (async mode).
    LEARNER_STALE_TOKENS_DROPPED_TOTAL: Counter("agent_r1_learner_stale_tokens_dropped_total") labels [];

    /// Action tokens whose sampler/trainer gap was measured (those sampled by the weights an
    /// update started from).
    LEARNER_MISMATCH_TOKENS_TOTAL: Counter("agent_r1_learner_mismatch_tokens_total") labels [];

    /// Action tokens rollout correction's rejection removed from the loss.
    LEARNER_REJECTED_TOKENS_TOTAL: Counter("agent_r1_learner_rejected_tokens_total") labels [];

    /// Policy version the learner has produced.
    LEARNER_POLICY_VERSION: Gauge("agent_r1_learner_policy_version") labels [];

    /// Mean episode reward of the last batch.
    LEARNER_REWARD_MEAN: Gauge("agent_r1_learner_reward_mean") labels [];

    /// PPO policy loss of the last update.
    LEARNER_POLICY_LOSS: Gauge("agent_r1_learner_policy_loss") labels [];

    /// Critic loss of the last update.
    LEARNER_VALUE_LOSS: Gauge("agent_r1_learner_value_loss") labels [];

    /// KL to the reference policy in the last update.
    LEARNER_KL: Gauge("agent_r1_learner_kl") labels [];

    /// Mean policy entropy over action tokens.
    LEARNER_ENTROPY: Gauge("agent_r1_learner_entropy") labels [];

    /// Mean policy-version lag of the tokens trained on.
    LEARNER_STALENESS_MEAN: Gauge("agent_r1_learner_staleness_mean") labels [];

    /// Largest policy-version lag of the tokens trained on.
    LEARNER_STALENESS_MAX: Gauge("agent_r1_learner_staleness_max") labels [];

    /// Duration of one learner update.
    LEARNER_UPDATE_DURATION_SECONDS: Histogram("agent_r1_learner_update_duration_seconds", Seconds) labels [];

    /// Optimizer steps applied by the learner.
    LEARNER_OPTIMIZER_STEPS_TOTAL: Counter("agent_r1_learner_optimizer_steps_total") labels [];

    /// Groups dropped by the zero-variance filter.
    LEARNER_FILTERED_GROUPS_TOTAL: Counter("agent_r1_learner_filtered_groups_total") labels [];

    /// Trajectories cut at the learner's maximum length.
    LEARNER_TRUNCATED_TRAJECTORIES_TOTAL: Counter("agent_r1_learner_truncated_trajectories_total") labels [];

    /// Tokens (prompt, actions, observations) in trained batches.
    LEARNER_TOKENS_TOTAL: Counter("agent_r1_learner_tokens_total") labels [];

    /// Action tokens trained on.
    LEARNER_ACTION_TOKENS_TOTAL: Counter("agent_r1_learner_action_tokens_total") labels [];

    /// Mean advantage over the trained action tokens of the last update.
    LEARNER_ADVANTAGE_MEAN: Gauge("agent_r1_learner_advantage_mean") labels [];

    /// Mean old minus new log-probability of action tokens in the last update.
    LEARNER_APPROX_KL: Gauge("agent_r1_learner_approx_kl") labels [];

    /// Mean |log π_learner - log π_engine| of the last update's measured tokens.
    LEARNER_MISMATCH_ABS_MEAN: Gauge("agent_r1_learner_mismatch_abs_mean") labels [];

    /// Largest |log π_learner - log π_engine| of the last update's measured tokens.
    LEARNER_MISMATCH_ABS_MAX: Gauge("agent_r1_learner_mismatch_abs_max") labels [];

    /// k3 estimate of KL(engine || learner) over the last update's measured tokens.
    LEARNER_MISMATCH_KL: Gauge("agent_r1_learner_mismatch_kl") labels [];

    /// Fraction of the last update's measured tokens whose |Δ log-prob| exceeds
    /// rollout_correction.report_threshold.
    LEARNER_MISMATCH_OVER_THRESHOLD_FRACTION: Gauge("agent_r1_learner_mismatch_over_threshold_fraction") labels [];

    /// The last update's worst sequence: largest |Σ Δ log-prob| over its measured tokens.
    LEARNER_MISMATCH_SEQUENCE_ABS_MAX: Gauge("agent_r1_learner_mismatch_sequence_abs_max") labels [];

    /// Mean per-token reverse KL (student minus teacher log-probability) over the last
    /// update's trained tokens, with on-policy distillation.
    LEARNER_DISTILL_REVERSE_KL: Gauge("agent_r1_learner_distill_reverse_kl") labels [];

    /// Tokens per second of the teacher's forward passes in the last update.
    LEARNER_TEACHER_TOKENS_PER_SECOND: Gauge("agent_r1_learner_teacher_tokens_per_second") labels [];

    /// Mean rollout-correction importance weight of the last update's corrected tokens.
    LEARNER_CORRECTION_WEIGHT_MEAN: Gauge("agent_r1_learner_correction_weight_mean") labels [];

    /// Fraction of action tokens where the PPO clip was binding.
    LEARNER_CLIP_FRACTION: Gauge("agent_r1_learner_clip_fraction") labels [];

    /// Fraction of action tokens where the dual clip was binding.
    LEARNER_CLIP_FRACTION_LOWER: Gauge("agent_r1_learner_clip_fraction_lower") labels [];

    /// Fraction of values where the value clip was binding.
    LEARNER_VALUE_CLIP_FRACTION: Gauge("agent_r1_learner_value_clip_fraction") labels [];

    /// Mean pre-clip gradient norm of the policy in the last update.
    LEARNER_GRAD_NORM: Gauge("agent_r1_learner_grad_norm") labels [];

    /// Mean pre-clip gradient norm of the critic in the last update.
    LEARNER_CRITIC_GRAD_NORM: Gauge("agent_r1_learner_critic_grad_norm") labels [];

    /// Policy learning rate of the last optimizer step.
    LEARNER_LEARNING_RATE: Gauge("agent_r1_learner_learning_rate") labels [];

    /// Critic learning rate of the last optimizer step.
    LEARNER_CRITIC_LEARNING_RATE: Gauge("agent_r1_learner_critic_learning_rate") labels [];

    /// Learner throughput of the last update (tokens times epochs per second).
    LEARNER_TOKENS_PER_SECOND: Gauge("agent_r1_learner_tokens_per_second") labels [];

    /// Turns whose tokens were sampled across a weight update.
    ENGINE_TURNS_SPANNING_WEIGHT_UPDATE_TOTAL: Counter("agent_r1_engine_turns_spanning_weight_update_total") labels ["engine"];

    /// Turns dropped because their caller stopped waiting (deadline passed, episode gone):
    /// never admitted, or taken out of the batch mid-decode.
    ENGINE_ABANDONED_TURNS_TOTAL: Counter("agent_r1_engine_abandoned_turns_total") labels ["engine"];

    /// Engine threads restarted by their engine actor after a crash (a panic or an error out of
    /// a step); the turns they held are run again.
    ENGINE_RESTARTS_TOTAL: Counter("agent_r1_engine_restarts_total") labels ["engine"];

    /// Stalls reported by the stall detector: a stage (env, tool NAME, engine, learner,
    /// publication, checkpoint) whose work made no progress within its [stall] deadline.
    STALLS_TOTAL: Counter("agent_r1_stalls_total") labels ["stage"];

    /// 1 while the stall detector finds the stage stalled, 0 once it makes progress again.
    STALLED: Gauge("agent_r1_stalled") labels ["stage"];

    /// Learner failures reported by its supervisor (a panic inside an update); the run stops
    /// with the reason.
    LEARNER_FAILURES_TOTAL: Counter("agent_r1_learner_failures_total") labels [];

    /// Tool calls received by a tool pool, by tool.
    TOOL_CALLS_TOTAL: Counter("agent_r1_tool_calls_total") labels ["tool"];
}
