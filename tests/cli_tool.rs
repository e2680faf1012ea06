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

#[path = "support/debian.rs"]
#[allow(dead_code)]
mod debian;

/// The python sandbox when agent-r1 itself runs as an unprivileged user (`nobody`, made by
/// dropping root's uid before exec): bubblewrap then runs without any privilege, and the
/// probes that matter from there are refused. Runs where the test is root (to become
/// `nobody`) and bubblewrap can be had; else it says SKIPPED.
#[test]
fn the_python_sandbox_holds_when_agent_r1_runs_unprivileged() {
    use std::os::unix::process::CommandExt;
    const TEST: &str = "the_python_sandbox_holds_when_agent_r1_runs_unprivileged";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        debian::skip(
            TEST,
            "BUBBLEWRAP",
            "not root, so it cannot become another user",
        );
        return;
    }
    if let Err(why) = debian::debian_programs(TEST, "bubblewrap", &["bwrap"], "BUBBLEWRAP") {
        debian::skip(TEST, "BUBBLEWRAP", &why);
        return;
    }
    let as_nobody = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_agent-r1"));
        cmd.args(args).env("HOME", "/tmp").current_dir("/tmp");
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(65534) != 0
                    || libc::setuid(65534) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.output().expect("run agent-r1 as nobody")
    };
    let spec = as_nobody(&["tool", "call", "python", "--spec"]);
    let spec_text = String::from_utf8_lossy(&spec.stdout);
    if !spec.status.success() || !spec_text.contains("in a sandbox") {
        debian::skip(
            TEST,
            "BUBBLEWRAP",
            &format!(
                "bubblewrap does not work for an unprivileged user here: {spec_text} {}",
                String::from_utf8_lossy(&spec.stderr)
            ),
        );
        return;
    }
    let host_pid = std::process::id();
    let code = format!(
        "import os\n\
         print('uid', os.getuid())\n\
         print('passwd', os.path.exists('/etc/passwd'))\n\
         try:\n\
         \x20   open('/usr/evil', 'w')\n\
         \x20   print('wrote /usr')\n\
         except OSError as e:\n\
         \x20   print('usr', e.strerror)\n\
         try:\n\
         \x20   os.kill({host_pid}, 9)\n\
         \x20   print('killed')\n\
         except OSError as e:\n\
         \x20   print('kill', e.strerror)\n\
         print('pids', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
    );
    let args = serde_json::json!({ "code": code }).to_string();
    let out = as_nobody(&["tool", "call", "python", "--args", &args]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("uid 65534"), "{text}");
    assert!(text.contains("passwd False"), "{text}");
    assert!(text.contains("usr Read-only file system"), "{text}");
    assert!(text.contains("kill No such process"), "{text}");
    assert!(
        text.contains("pids [1, 2]"),
        "only its own processes: {text}"
    );
}
