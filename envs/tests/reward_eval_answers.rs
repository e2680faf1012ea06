//! Whole-file answer evaluation, as `agent-r1 eval-answers` runs it.

use std::path::PathBuf;

use agent_r1_envs::reward::evaluate_answer_files;
use agent_r1_envs::Error;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/data")
        .join(name)
}

#[test]
fn averages_over_gold_rows_and_reports_missing() {
    let eval = evaluate_answer_files(&fixture("hotpotqa.json"), &fixture("hotpotqa_pred.json"))
        .expect("eval");
    assert_eq!(eval.n, 2);
    assert_eq!(eval.em, 0.5);
    assert_eq!(eval.f1, 0.5);
    assert_eq!(eval.precision, 0.5);
    assert_eq!(eval.recall, 0.5);
    assert_eq!(eval.missing, vec!["5a8c7595554299585d9e36b6".to_string()]);
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    // Predictions without an `answer` object.
    let err =
        evaluate_answer_files(&fixture("hotpotqa.json"), &fixture("hotpotqa.json")).unwrap_err();
    assert!(err.to_string().contains("`answer` object"), "{err}");
    // Gold with a row lacking `answer`.
    let err = evaluate_answer_files(
        &fixture("hotpotqa_bad.json"),
        &fixture("hotpotqa_pred.json"),
    )
    .unwrap_err();
    assert!(matches!(err, Error::BadRow { line: 2, .. }), "{err:?}");
    // Not JSON at all.
    let err = evaluate_answer_files(
        &fixture("hotpotqa_broken.json"),
        &fixture("hotpotqa_pred.json"),
    )
    .unwrap_err();
    assert!(matches!(err, Error::BadRow { .. }), "{err:?}");
    assert!(evaluate_answer_files(&fixture("nope.json"), &fixture("hotpotqa_pred.json")).is_err());
}
