//! `agent-r1 eval-answers`: the answer half of the official HotpotQA evaluator
//! (`hotpot_evaluate_v1.py`): exact match, F1, precision and recall, averaged over the gold
//! rows; a missing prediction counts 0 and is reported.

use std::path::PathBuf;

use agent_r1_envs::reward::evaluate_answer_files;

/// Arguments of `agent-r1 eval-answers`.
#[derive(Debug, clap::Args)]
pub(crate) struct EvalAnswersArgs {
    /// Gold file: a HotpotQA-format JSON list of rows with `_id` and `answer`.
    gold: PathBuf,
    /// Predictions: `{"answer": {id: text, ...}}` (other keys, like `sp`, are ignored).
    pred: PathBuf,
    /// Print exactly one JSON object `{"em", "f1", "precision", "recall"}` (fractions).
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: EvalAnswersArgs) -> anyhow::Result<()> {
    let eval = evaluate_answer_files(&args.gold, &args.pred)?;
    for id in &eval.missing {
        eprintln!("missing answer {id}");
    }
    if args.json {
        let out = serde_json::json!({
            "em": eval.em,
            "f1": eval.f1,
            "precision": eval.precision,
            "recall": eval.recall,
        });
        println!("{out}");
    } else {
        println!("em:        {:.4}", eval.em);
        println!("f1:        {:.4}", eval.f1);
        println!("precision: {:.4}", eval.precision);
        println!("recall:    {:.4}", eval.recall);
        println!(
            "rows: {}  missing predictions: {}",
            eval.n,
            eval.missing.len()
        );
    }
    Ok(())
}
