//! The python tool: output capture, limits, timeout with process-group kill, scratch dir,
//! network isolation (where the machine allows it).

use std::time::{Duration, Instant};

use agent_r1_envs::tool::Tool;
use agent_r1_envs::tools::python::{net_isolation, NetIsolation, PythonConfig, PythonTool};
use serde_json::json;

fn tool(f: impl FnOnce(&mut PythonConfig)) -> PythonTool {
    let mut cfg = PythonConfig::default();
    f(&mut cfg);
    PythonTool::new(cfg).unwrap()
}

async fn run(t: &PythonTool, code: &str) -> (String, serde_json::Map<String, serde_json::Value>) {
    let out = t.call(json!({ "code": code })).await.unwrap();
    (out.text, out.metadata)
}

#[tokio::test]
async fn captures_stdout_stderr_and_exit_code() {
    let t = tool(|_| {});
    let (text, meta) = run(&t, "print(6 * 7)").await;
    assert_eq!(text, "42\n");
    assert_eq!(meta["exit_code"], json!(0));
    let (text, meta) = run(&t, "import sys\nprint('a')\nraise ValueError('boom')").await;
    assert!(text.starts_with("a\n[stderr]\nTraceback"), "{text}");
    assert!(text.contains("ValueError: boom"), "{text}");
    assert!(text.ends_with("[exit code 1]"), "{text}");
    assert_eq!(meta["exit_code"], json!(1));
    let (text, _) = run(&t, "pass").await;
    assert_eq!(text, "[no output]");
}

#[tokio::test]
async fn output_is_truncated() {
    let t = tool(|c| c.max_output_bytes = 100);
    let (text, _) = run(&t, "print('x' * 10000)").await;
    assert!(text.starts_with(&"x".repeat(100)), "{text}");
    assert!(text.contains("[9901 more bytes truncated]"), "{text}");
}

#[tokio::test]
async fn wall_clock_timeout_kills_the_whole_group() {
    // The limit is long enough for the sandbox and two Python starts to print on a loaded
    // machine (the partial output is checked), and far shorter than the snippet's sleep.
    let t = tool(|c| c.timeout_secs = 10.0);
    let start = Instant::now();
    // A child process that would outlive its parent if only the parent were killed.
    let code = "import subprocess, time, sys\n\
                subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n\
                print('started', flush=True)\ntime.sleep(600)";
    let (text, meta) = run(&t, code).await;
    assert!(
        start.elapsed() < Duration::from_secs(300),
        "killed by the limit, not after the snippet's 600 s"
    );
    assert!(text.starts_with("started\n"), "partial output kept: {text}");
    assert!(
        text.contains("[killed: wall-clock limit of 10s exceeded]"),
        "{text}"
    );
    assert_eq!(meta["timed_out"], json!(true));
}

#[tokio::test]
async fn memory_and_cpu_limits_hold() {
    let t = tool(|c| {
        c.memory_mib = 256;
        c.cpu_secs = 1;
        // Far above the CPU limit's wall time even on a loaded machine: the CPU limit ends it.
        c.timeout_secs = 120.0;
    });
    let (text, _) = run(&t, "x = bytearray(1 << 30)\nprint('allocated')").await;
    assert!(text.contains("MemoryError"), "{text}");
    assert!(!text.contains("allocated"), "{text}");
    let (text, meta) = run(&t, "while True:\n    pass").await;
    // SIGXCPU, and not the wall clock.
    assert!(text.contains("CPU time limit exceeded"), "{text}");
    assert_eq!(meta["timed_out"], json!(false));
}

#[tokio::test]
async fn runs_in_a_fresh_scratch_directory_with_a_clean_environment() {
    let t = tool(|_| {});
    let code = "import os\nopen('f.txt', 'w').write('hi')\n\
                print(os.getcwd() == os.environ['HOME'], sorted(os.listdir('.')))\n\
                print('SECRET' in os.environ)";
    std::env::set_var("SECRET", "x");
    let (first, _) = run(&t, code).await;
    assert_eq!(first, "True ['f.txt', 'main.py']\nFalse\n");
    let (again, _) = run(&t, "import os\nprint(sorted(os.listdir('.')))").await;
    assert_eq!(again, "['main.py']\n", "no state carries over");
}

#[tokio::test]
async fn network_is_isolated_where_possible() {
    let t = tool(|_| {});
    let code =
        "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n    \
                print('connected')\nexcept OSError as e:\n    print('blocked', type(e).__name__)";
    let (text, meta) = run(&t, code).await;
    let isolation = net_isolation();
    assert_eq!(
        meta["isolation"],
        json!(agent_r1_envs::tools::python::isolation().label())
    );
    if isolation != NetIsolation::None {
        assert!(text.starts_with("blocked"), "{text}");
        let (text, _) = run(&t, "import socket\nprint(socket.if_nameindex())").await;
        assert_eq!(text, "[(1, 'lo')]\n", "only a loopback interface");
    } else {
        eprintln!("*** no network namespace on this machine: isolation not tested ***");
    }
}

#[tokio::test]
async fn a_keyed_call_finds_its_key_in_the_environment() {
    let t = tool(|_| {});
    let key = agent_r1_envs::call_key::CallKey {
        run: "r9".into(),
        episode: 5,
        step: 2,
        index: 1,
        branch: 1,
    };
    let code = "import os\nprint(os.environ.get('AGENT_R1_IDEMPOTENCY_KEY'))";
    let out = t.call_keyed(&key, json!({ "code": code })).await.unwrap();
    assert_eq!(out.text, "r9/e5/s2/c1/b1\n");
    let (plain, _) = run(&t, code).await;
    assert_eq!(plain, "None\n", "an unkeyed call has no key");
}

/// The same snippet gives the same output on every call, with the sandbox or without: the
/// scratch directory's random name never reaches the model (a traceback names the working
/// directory the sandbox shows).
#[tokio::test]
async fn a_traceback_reads_the_same_on_every_call() {
    for sandbox in [false, true] {
        let t = tool(|c| c.sandbox = sandbox);
        let (first, _) = run(&t, "import os\nprint(os.getcwd())\nraise ValueError('x')").await;
        let (again, _) = run(&t, "import os\nprint(os.getcwd())\nraise ValueError('x')").await;
        assert_eq!(first, again, "sandbox {sandbox}");
        assert!(first.starts_with("/work\n"), "sandbox {sandbox}: {first}");
        assert!(
            first.contains("File \"/work/main.py\", line 3"),
            "sandbox {sandbox}: {first}"
        );
    }
}
