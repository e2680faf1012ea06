//! One module per subcommand.

pub(crate) mod bench;
pub(crate) mod bench_fuzz;
pub(crate) mod bench_learner;
pub(crate) mod bench_train;
pub(crate) mod check_config;
pub(crate) mod eval;
pub(crate) mod eval_answers;
pub(crate) mod generate;
pub(crate) mod init_model;
pub(crate) mod rollout;
pub(crate) mod tool;
pub(crate) mod train;
pub(crate) mod view;
