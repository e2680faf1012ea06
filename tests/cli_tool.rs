//! `agent-r1 tool call`: a tool runs once from the command line, and bad input (unknown tool,
//! arguments failing the schema, arguments that are not JSON) gives the observation the
//! model would see plus one error line, with exit code 2.

use std::process::{Command, Output};

fn agent_r1(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agent-r1"))
        .args(args)
        .output()
        .expect("run agent-r1")
}

#[test]
fn calculator_call_prints_the_exact_result() {
    let out = agent_r1(&[
        "tool",
        "call",
        "calculator",
        "--args",
        r#"{"expression": "(2+3)*7/4"}"#,
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "8.75");
}

#[test]
fn bad_calls_explain_themselves_and_exit_2() {
    let out = agent_r1(&["tool", "call", "calculator", "--args", r#"{"expr": 1}"#]);
    assert_eq!(out.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("\"expression\" is a required property"),
        "{stdout}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid_arguments"));

    let out = agent_r1(&["tool", "call", "nosuch"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown tool `nosuch`") && stderr.contains("calculator"),
        "{stderr}"
    );

    let out = agent_r1(&["tool", "call", "calculator", "--args", "{not json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--args is not JSON"));
}
