//! Demonstrations of math problems: one `calculator` call with the problem's expression,
//! then the answer read from the result. The imperfect kind answers at once, without the
//! calculator, with a slip of a few units: a habit a policy can be warm-started into and RL can see
//! failing.

use serde_json::json;

use super::problems::Problem;
use crate::demo::{Demo, DemoCall, DemoConfig, DemoTurn};
use crate::synthetic::rng::WorldRng;

/// A `calculator` call.
pub fn calculator_call(expression: &str) -> DemoCall {
    DemoCall {
        tool: "calculator".into(),
        arguments: json!({ "expression": expression }),
    }
}

/// Calculate the expression, then answer with the result.
pub fn gold_demo(problem: &Problem) -> Demo {
    Demo {
        task_id: problem.id.clone(),
        turns: vec![
            DemoTurn::calling("Let me calculate it.", calculator_call(&problem.expression)),
            DemoTurn::answering(
                &format!("The result is {}.", problem.answer),
                &problem.answer.to_string(),
            ),
        ],
        correct: true,
    }
}

/// Answer at once with the answer off by 1 to 9 (never negative).
pub fn early_wrong_demo(problem: &Problem, rng: &mut WorldRng) -> Demo {
    let slip = 1 + rng.index(9) as i64;
    let wrong = if problem.answer >= slip && rng.chance(0.5) {
        problem.answer - slip
    } else {
        problem.answer + slip
    };
    Demo {
        task_id: problem.id.clone(),
        turns: vec![DemoTurn::answering(
            &format!("The result is {wrong}."),
            &wrong.to_string(),
        )],
        correct: false,
    }
}

/// Demos for `problems`, `config.variants()` each in problem order; of a problem's
/// variants, [`DemoConfig::early_variants`] answer at once with a slip.
pub fn math_demos(problems: &[&Problem], config: &DemoConfig) -> Vec<Demo> {
    let mut rng = config.rng();
    let v = config.variants();
    let mut out = Vec::with_capacity(problems.len() * v);
    for p in problems {
        let wrong = config.early_variants(&mut rng);
        for i in 0..v {
            out.push(if i < wrong {
                early_wrong_demo(p, &mut rng)
            } else {
                gold_demo(p)
            });
        }
    }
    out
}
