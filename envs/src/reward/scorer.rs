//! The `Scorer` extension point: a reward from outside the env (a judge model behind an
//! HTTP endpoint, or a user's own type), in place of the env's own.
//!
//! [`ScoredEnv`] wraps an env: everything is the env's, except that the finished episode's
//! reward comes from the scorer. The env's metrics are kept (EM, F1, ... stay reported), with
//! the env's own reward as `env_reward` and the scorer's under the scorer's name. A scorer
//! that fails (after its own retries) fails the scoring: the runtime records the episode as
//! failed with the reason, and it is never trained on with a made-up reward.
//!
//! Scores run on the runtime's blocking pool, one call per episode, so a slow scorer holds up
//! only the episodes it scores; [`ConcurrencyLimit`] bounds the calls in flight to one
//! endpoint.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::env::{Env, Score, TurnOutcome};
use crate::error::{Error, Result};
use crate::message::Message;
use crate::task::Task;
use crate::tool::{CallError, CallOutcome, ToolCall};

/// Scores a finished episode.
pub trait Scorer: Send + Sync + 'static {
    /// The name its reward is reported under (`judge`, ...).
    fn name(&self) -> &str;

    /// The reward of a finished episode; `env_score` is the env's own score of it.
    fn score(&self, task: &Task, transcript: &[Message], env_score: &Score) -> Result<f64>;
}

/// An env whose episodes are scored by a [`Scorer`].
pub struct ScoredEnv {
    inner: Arc<dyn Env>,
    scorer: Arc<dyn Scorer>,
}

impl ScoredEnv {
    /// `inner` with its reward from `scorer`.
    pub fn new(inner: Arc<dyn Env>, scorer: Arc<dyn Scorer>) -> Self {
        Self { inner, scorer }
    }
}

impl Env for ScoredEnv {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn tool_names(&self) -> Vec<String> {
        self.inner.tool_names()
    }
    fn reset(&self, task: &Task) -> Result<Vec<Message>> {
        self.inner.reset(task)
    }
    fn on_turn(
        &self,
        task: &Task,
        assistant_text: &str,
        calls: Vec<std::result::Result<ToolCall, CallError>>,
    ) -> TurnOutcome {
        self.inner.on_turn(task, assistant_text, calls)
    }
    fn max_observation_chars(&self) -> usize {
        self.inner.max_observation_chars()
    }
    fn observe(&self, task: &Task, outcomes: &[CallOutcome]) -> Vec<Message> {
        self.inner.observe(task, outcomes)
    }
    fn step_reward(&self, task: &Task, outcomes: &[CallOutcome]) -> f64 {
        self.inner.step_reward(task, outcomes)
    }
    /// The env's score alone (what [`Env::try_score`] starts from).
    fn score(&self, task: &Task, transcript: &[Message]) -> Score {
        self.inner.score(task, transcript)
    }
    fn try_score(&self, task: &Task, transcript: &[Message]) -> Result<Score> {
        let mut score = self.inner.try_score(task, transcript)?;
        let started = Instant::now();
        let name = self.scorer.name().to_string();
        let result = self.scorer.score(task, transcript, &score);
        metrics::histogram!(crate::metric_names::SCORER_SECONDS.name, "scorer" => name.clone())
            .record(started.elapsed().as_secs_f64());
        let reward = match result {
            Ok(r) if r.is_finite() => r,
            Ok(r) => {
                metrics::counter!(crate::metric_names::SCORER_ERRORS_TOTAL.name, "scorer" => name.clone())
                    .increment(1);
                return Err(Error::Other(format!(
                    "scorer `{name}`: a non-finite reward ({r})"
                )));
            }
            Err(e) => {
                metrics::counter!(crate::metric_names::SCORER_ERRORS_TOTAL.name, "scorer" => name.clone())
                    .increment(1);
                return Err(Error::Other(format!("scorer `{name}`: {e}")));
            }
        };
        score.metrics.insert("env_reward".into(), score.reward);
        score.metrics.insert(name, reward);
        score.reward = reward;
        Ok(score)
    }
}

/// The bounds every external scorer has, checked alike for each kind (keys `scorer.*`).
pub(crate) fn check_call_limits(
    timeout_secs: f64,
    retries: u32,
    max_concurrency: usize,
) -> Result<()> {
    let bad = |key: &str, message: String| Error::Config {
        key: format!("scorer.{key}"),
        message,
    };
    if !(timeout_secs > 0.0 && timeout_secs <= 3600.0) {
        return Err(bad(
            "timeout_secs",
            format!("must be a number of seconds in (0, 3600], got {timeout_secs}"),
        ));
    }
    if retries > 10 {
        return Err(bad("retries", format!("must be at most 10, got {retries}")));
    }
    if !(1..=1024).contains(&max_concurrency) {
        return Err(bad(
            "max_concurrency",
            format!("must be in 1..=1024, got {max_concurrency}"),
        ));
    }
    Ok(())
}

/// Runs `attempt` up to `1 + retries` times, inside one of `limit`'s slots (waited for at
/// most as long as all tries may take). An attempt's error says whether another try may help.
pub(crate) fn with_retries(
    limit: &ConcurrencyLimit,
    timeout_secs: f64,
    retries: u32,
    what: &str,
    mut attempt: impl FnMut() -> std::result::Result<f64, (bool, String)>,
) -> Result<f64> {
    let wait = Duration::from_secs_f64(timeout_secs * f64::from(retries + 1));
    let _slot = limit.acquire(wait)?;
    let mut last = String::new();
    for _ in 0..=retries {
        match attempt() {
            Ok(x) => return Ok(x),
            Err((retry, why)) => {
                last = why;
                if !retry {
                    break;
                }
            }
        }
    }
    Err(Error::Other(format!(
        "{what}: {last} (after {} tries)",
        retries + 1
    )))
}

/// At most `limit` calls at once; a call waits at most `wait` for its turn.
#[derive(Debug)]
pub struct ConcurrencyLimit {
    limit: usize,
    in_use: Mutex<usize>,
    freed: Condvar,
}

/// One call's turn; the slot frees when dropped.
#[derive(Debug)]
pub struct Slot<'a>(&'a ConcurrencyLimit);

impl ConcurrencyLimit {
    /// A limit of `limit` (at least 1) calls.
    pub fn new(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            in_use: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    /// Waits for a slot, at most `wait`.
    pub fn acquire(&self, wait: Duration) -> Result<Slot<'_>> {
        let deadline = Instant::now() + wait;
        let mut in_use = self.in_use.lock().unwrap_or_else(|p| p.into_inner());
        while *in_use >= self.limit {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Other(format!(
                    "all {} slots stayed busy for {wait:?}",
                    self.limit
                )));
            }
            in_use = self
                .freed
                .wait_timeout(in_use, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *in_use += 1;
        Ok(Slot(self))
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut in_use = self.0.in_use.lock().unwrap_or_else(|p| p.into_inner());
        *in_use -= 1;
        self.0.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An env whose own reward is always 0.25 with one metric.
    struct Quarter;

    impl Env for Quarter {
        fn name(&self) -> &str {
            "quarter"
        }
        fn tool_names(&self) -> Vec<String> {
            vec![]
        }
        fn reset(&self, task: &Task) -> Result<Vec<Message>> {
            Ok(vec![Message::user(task.question.clone())])
        }
        fn score(&self, _task: &Task, _transcript: &[Message]) -> Score {
            Score {
                reward: 0.25,
                metrics: [("em".to_string(), 0.0)].into(),
            }
        }
    }

    /// A user's scorer type: the length of the last message, or a failure on request.
    struct Length {
        fail: Option<f64>,
    }

    impl Scorer for Length {
        fn name(&self) -> &str {
            "length"
        }
        fn score(&self, _task: &Task, transcript: &[Message], env: &Score) -> Result<f64> {
            assert_eq!(env.reward, 0.25, "the env's score comes first");
            match self.fail {
                Some(x) if x.is_nan() => Ok(x),
                Some(_) => Err(Error::Other("out of service".into())),
                None => Ok(transcript.last().map_or(0, |m| m.content.len()) as f64),
            }
        }
    }

    fn scored(fail: Option<f64>) -> Result<Score> {
        let env = ScoredEnv::new(Arc::new(Quarter), Arc::new(Length { fail }));
        let task = Task {
            id: "t".into(),
            data_source: "test".into(),
            question: "q".into(),
            answers: vec![],
            prompt: None,
            extra: serde_json::Value::Null,
        };
        env.try_score(&task, &[Message::user("q"), Message::assistant("four")])
    }

    #[test]
    fn the_scorer_gives_the_reward_and_the_env_keeps_its_metrics() {
        let s = scored(None).unwrap();
        assert_eq!(s.reward, 4.0);
        assert_eq!(s.metrics["length"], 4.0);
        assert_eq!(s.metrics["env_reward"], 0.25);
        assert_eq!(s.metrics["em"], 0.0);
    }

    #[test]
    fn a_failing_or_non_finite_scorer_is_an_error_not_a_reward() {
        let e = scored(Some(1.0)).unwrap_err().to_string();
        assert!(e.contains("scorer `length`: out of service"), "{e}");
        let e = scored(Some(f64::NAN)).unwrap_err().to_string();
        assert!(e.contains("non-finite"), "{e}");
    }

    #[test]
    fn the_limit_bounds_calls_in_flight_and_waits_are_bounded() {
        let limit = ConcurrencyLimit::new(2);
        let a = limit.acquire(Duration::ZERO).unwrap();
        let _b = limit.acquire(Duration::ZERO).unwrap();
        assert!(limit.acquire(Duration::from_millis(1)).is_err());
        drop(a);
        assert!(limit.acquire(Duration::ZERO).is_ok());
    }
}
