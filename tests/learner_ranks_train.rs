//! `train` with `learner.ranks = 2` (two processes, the optimizer state sharded, and the
//! parameters too): a rank killed
//! with SIGKILL as rank 0 runs an update's collectives ends the run with the stall's exit code
//! and an error naming the rank and the collective; started again in the same directory, the
//! run resumes from its newest checkpoint and ends with the uninterrupted run's weights and
//! AdamW state bit for bit, each update on the same episodes. Bad `[learner]` input is one
//! line before any work.
//!
//! The config is deterministic as in `exact_resume.rs` (`rollout.deterministic`, sync mode).
//! `--inject-learner-rank-kill` is fault injection (a test double): the named rank's process
//! kills itself as it receives that update's order.

use std::path::{Path, PathBuf};

#[path = "support/resume_run.rs"]
mod resume_run;
#[path = "support/trainer.rs"]
mod trainer;

use resume_run::rows;
use trainer::{newest_checkpoint, Trainer};

const UPDATES: u64 = 4;
const STALL_EXIT_CODE: i32 = 3;

fn config(dir: &Path, learner: &str) -> PathBuf {
    resume_run::config(dir, UPDATES, &format!("\n[learner]\n{learner}\n"))
}

fn final_files(run: &Path) -> (Vec<u8>, Vec<u8>) {
    resume_run::final_files(run, UPDATES)
}

#[test]
fn a_killed_rank_fails_the_run_with_the_stall_code_and_a_resume_ends_where_the_uninterrupted_run_does(
) {
    killed_and_resumed("optimizer_state", "");
}

/// The same with each decoder layer's weights and gradients sharded: rank 0 publishes and
/// checkpoints whole weights (every engine verifies their digest), and a resume on two
/// ranks ends bit for bit where the uninterrupted run does.
#[test]
fn with_sharded_parameters_a_killed_rank_fails_the_run_and_a_resume_ends_where_the_uninterrupted_run_does(
) {
    killed_and_resumed("parameters", "recompute = true\n");
}

fn killed_and_resumed(shard: &str, extra: &str) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        &format!("ranks = 2\nshard = \"{shard}\"\nrank_timeout_s = 120\n{extra}"),
    );

    let reference = dir.path().join("reference");
    let (code, stdout, log) = Trainer::start_with(&cfg, &reference, &[]).finish();
    assert_eq!(code, Some(0), "{log}");
    assert!(
        log.contains(&format!("learner: 2 ranks ({shard})")),
        "{log}"
    );
    assert!(
        stdout.contains(&format!("\"updates\":{UPDATES}")),
        "{stdout}"
    );

    // Rank 1 dies as it receives update 3's order; rank 0 is in that update's collectives.
    let run = dir.path().join("killed");
    let (code, _, log) =
        Trainer::start_with(&cfg, &run, &["--inject-learner-rank-kill", "1:3"]).finish();
    assert_eq!(code, Some(STALL_EXIT_CODE), "{log}");
    assert!(
        log.contains("learner rank 1: signal 9 at update 3 (fault injection)"),
        "{log}"
    );
    assert!(log.contains("learner rank 0 of 2: "), "{log}");
    assert!(
        log.contains("the run fails: a learner rank failed"),
        "{log}"
    );
    let from = newest_checkpoint(&run);
    assert_eq!(from, 2, "the checkpoint of update 2 is the newest: {log}");
    // The killed update wrote nothing.
    assert_eq!(rows(&run).len(), 2);

    let (code, stdout, log) = Trainer::start(&cfg, &run, true).finish();
    assert_eq!(code, Some(0), "{log}");
    assert!(
        stdout.contains(&format!("\"updates\":{UPDATES}")),
        "{stdout}"
    );

    let (want, got) = (rows(&reference), rows(&run));
    let steps: Vec<u64> = got.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, (1..=UPDATES).collect::<Vec<_>>());
    for (w, g) in want.iter().zip(&got) {
        assert_eq!(g["episode_ids"], w["episode_ids"], "step {}", g["step"]);
        for key in ["policy_loss", "value_loss", "grad_norm", "reward_mean"] {
            assert_eq!(g[key], w[key], "step {}: {key}", g["step"]);
        }
    }
    let (want_policy, want_optimizer) = final_files(&reference);
    let (policy, optimizer) = final_files(&run);
    assert!(
        policy == want_policy,
        "the resumed run's final weights differ from the uninterrupted run's"
    );
    assert!(
        optimizer == want_optimizer,
        "the resumed run's final AdamW state differs from the uninterrupted run's"
    );
}

/// A rank that hangs (SIGSTOP) inside an update: rank 0's collective ends after
/// `learner.rank_timeout_s` with an error naming the rank and the collective, and the run
/// exits with the stall's code; the stopped process is killed as the run ends.
#[test]
fn a_hung_rank_ends_the_run_within_the_rank_timeout_with_the_stall_code() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "ranks = 2\nrank_timeout_s = 5");
    let run = dir.path().join("hung");
    let (code, _, log) =
        Trainer::start_with(&cfg, &run, &["--inject-learner-rank-kill", "1:2:STOP"]).finish();
    assert_eq!(code, Some(STALL_EXIT_CODE), "{log}");
    assert!(
        log.contains("learner rank 1: signal 19 at update 2 (fault injection)"),
        "{log}"
    );
    assert!(
        log.contains("error: learner update 2: learner rank 0 of 2: "),
        "{log}"
    );
    assert!(
        log.contains("the run fails: a learner rank failed"),
        "{log}"
    );
    assert_eq!(newest_checkpoint(&run), 1, "{log}");
}

#[test]
fn bad_learner_rank_settings_are_one_line_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("ranks = 2\ndevice_is_not_a_key = 1", "device_is_not_a_key"),
        ("ranks = 0", "learner.ranks"),
        ("ranks = 65", "learner.ranks"),
        ("shard = \"optimizer_state\"", "learner.shard"),
        (
            "ranks = 2\nshard = \"parameters\"",
            "set learner.recompute = true",
        ),
        ("ranks = 2\nrank_timeout_s = 1", "learner.rank_timeout_s"),
    ];
    for (learner, named) in cases {
        let cfg = config(dir.path(), learner);
        let out = dir.path().join("bad");
        let (code, _, log) = Trainer::start_with(&cfg, &out, &[]).finish();
        assert_eq!(code, Some(2), "{learner}: {log}");
        assert!(log.contains(named), "{learner}: {log}");
        assert!(
            !log.contains("learner: "),
            "{learner}: started ranks: {log}"
        );
    }
    // More ranks than this machine has cores: named with the count allowed.
    let cores = std::thread::available_parallelism().unwrap().get();
    if cores >= 64 {
        return;
    }
    let cfg = config(dir.path(), &format!("ranks = {}", cores + 1));
    let (code, _, log) = Trainer::start_with(&cfg, &dir.path().join("cores"), &[]).finish();
    assert_eq!(code, Some(2), "{log}");
    assert!(
        log.contains(&format!("more ranks than this machine's {cores} cores")),
        "{log}"
    );
}
