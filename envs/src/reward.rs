//! Rewards for QA and math episodes.
//!
//! Two families with different meanings of "EM", always reported under distinct names:
//! - [`hotpotqa`]: the official HotpotQA metrics (`em` = normalised exact match, `f1`,
//!   `precision`, `recall`), as `hotpot_evaluate_v1.py` computes them;
//! - [`agent_r1`]: Agent-R1's `qa_em_and_format` (`substring_em`, `format`, `answer_score`,
//!   `agent_r1_reward`).
//!
//! [`qa::score_qa`] computes all of them for a transcript; [`RewardKind`] picks the one
//! trained on; [`ProcessRewardConfig`] adds optional per-call rewards. Math answers are
//! compared as numbers ([`numeric::score_numeric`]).
//!
//! A reward from outside the env is a [`Scorer`] (an LLM judge behind an HTTP endpoint,
//! [`http_judge`], a program, [`command`], or a user's own type, registered in a
//! [`ScorerRegistry`]), applied by wrapping the env in a [`ScoredEnv`].

pub mod agent_r1;
pub mod command;
pub mod hotpotqa;
pub mod http_judge;
pub mod kind;
pub mod normalize;
pub mod numeric;
pub mod process;
pub mod qa;
pub mod scorer;
pub mod scorer_registry;

pub use hotpotqa::{evaluate_answer_files, evaluate_answers, AnswerEval, AnswerScore};
pub use kind::RewardKind;
pub use normalize::normalize_answer;
pub use process::ProcessRewardConfig;
pub use qa::score_qa;
pub use scorer::{ScoredEnv, Scorer};
pub use scorer_registry::ScorerRegistry;
