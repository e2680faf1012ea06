//! The python tool's sandbox against the probes of a hostile snippet, run as root in CI (the
//! sandbox then runs as `nobody`): re-entering the host's network namespace, writing outside
//! the scratch directory, reading /etc/passwd or the parent's environment, killing the
//! parent, leaving a process behind after the call, a fork bomb, and memory past the limit.
//! Each must be refused.
//!
//! The sandbox is Debian's `bubblewrap`, found on PATH or installed with apt-get where the
//! test runs as root (`AGENT_R1_INSTALL_BUBBLEWRAP=0` forbids that); where it cannot be had
//! or does not work here, the test prints `SKIPPED: ...` and returns
//! (`AGENT_R1_REQUIRE_BUBBLEWRAP=1` makes that a failure).

#[path = "../../tests/support/debian.rs"]
#[allow(dead_code)]
mod debian;
#[path = "support/hostile.rs"]
mod hostile;

use std::net::TcpListener;

use agent_r1_envs::tool::Tool;
use agent_r1_envs::tools::python::{isolation, Isolation, PythonConfig, PythonTool};
use serde_json::json;

const TEST: &str = "python_sandbox";

fn sandboxed() -> Option<PythonTool> {
    if let Err(why) = debian::debian_programs(TEST, "bubblewrap", &["bwrap"], "BUBBLEWRAP") {
        debian::skip(TEST, "BUBBLEWRAP", &why);
        return None;
    }
    // Detected once per process, after the install.
    if !matches!(isolation(), Isolation::Bubblewrap(_)) {
        debian::skip(
            TEST,
            "BUBBLEWRAP",
            &format!(
                "bwrap is installed but does not work here (isolation: {})",
                isolation().label()
            ),
        );
        return None;
    }
    Some(
        PythonTool::new(PythonConfig {
            require_sandbox: true,
            memory_mib: 512,
            max_processes: 32,
            timeout_secs: 20.0,
            ..PythonConfig::default()
        })
        .unwrap(),
    )
}

async fn run(t: &PythonTool, code: &str) -> String {
    let out = t.call(json!({ "code": code })).await.unwrap();
    assert_eq!(out.metadata["isolation"], json!("bubblewrap"));
    out.text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_snippet_is_refused_at_every_probe() {
    let Some(t) = sandboxed() else { return };
    assert!(t.description().contains("sandbox"), "{}", t.description());

    // The network: a listener on the host's loopback cannot be reached, and no namespace
    // can be entered (setns is refused by the filter; nothing of the host is visible).
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let text = run(
        &t,
        &format!(
            "import ctypes, os, socket\n\
             libc = ctypes.CDLL(None, use_errno=True)\n\
             for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n\
             \x20   try:\n\
             \x20       fd = os.open(f'/proc/{{pid}}/ns/net', os.O_RDONLY)\n\
             \x20   except OSError:\n\
             \x20       continue\n\
             \x20   r = libc.setns(fd, 0x40000000)\n\
             \x20   print('setns', pid, r, os.strerror(ctypes.get_errno()))\n\
             try:\n\
             \x20   socket.create_connection(('127.0.0.1', {port}), timeout=2)\n\
             \x20   print('connected')\n\
             except OSError as e:\n\
             \x20   print('connect refused', e.errno)\n\
             print(socket.if_nameindex())"
        ),
    )
    .await;
    assert!(!text.contains("connected"), "{text}");
    assert!(text.contains("connect refused"), "{text}");
    assert!(
        text.contains("setns") && !text.contains(" 0 Success"),
        "{text}"
    );
    assert!(text.contains("Operation not permitted"), "{text}");
    assert!(text.contains("[(1, 'lo')]"), "{text}");

    // Files: the system is read-only, /etc is not there, /tmp is private and bounded.
    let marker = format!("/tmp/agent-r1-evil-{}", std::process::id());
    let text = run(
        &t,
        &format!(
            "import os\n\
             for path in ['/usr/evil', '/evil', '{marker}', 'ok.txt']:\n\
             \x20   try:\n\
             \x20       open(path, 'w').write('x'); print('wrote', path)\n\
             \x20   except OSError as e:\n\
             \x20       print('refused', path, e.strerror)\n\
             for path in ['/etc/passwd', '/etc/shadow', '/root']:\n\
             \x20   print(path, os.path.exists(path))\n\
             try:\n\
             \x20   open('/tmp/big', 'wb').write(b'x' * (200 << 20)); print('big tmp file')\n\
             except OSError as e:\n\
             \x20   print('tmp full', e.strerror)"
        ),
    )
    .await;
    assert!(
        text.contains("refused /usr/evil Read-only file system"),
        "{text}"
    );
    assert!(text.contains("refused /evil"), "{text}");
    assert!(text.contains("wrote ok.txt"), "{text}");
    assert!(
        !std::path::Path::new(&marker).exists(),
        "a private /tmp: {text}"
    );
    assert!(
        text.contains("/etc/passwd False") && text.contains("/root False"),
        "{text}"
    );
    assert!(!text.contains("big tmp file"), "{text}");

    // Other processes: the parent's environment and pid are out of reach.
    std::env::set_var("AGENT_R1_TEST_SECRET", "hunter2");
    let host_pid = std::process::id();
    let text = run(
        &t,
        &format!(
            "import os\n\
             found = []\n\
             for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n\
             \x20   try:\n\
             \x20       if b'hunter2' in open(f'/proc/{{pid}}/environ', 'rb').read(): found.append(pid)\n\
             \x20   except OSError:\n\
             \x20       pass\n\
             print('secret found', found)\n\
             print('pids', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n\
             for pid in [{host_pid}, os.getppid()]:\n\
             \x20   try:\n\
             \x20       os.kill(pid, 9); print('killed', pid)\n\
             \x20   except OSError as e:\n\
             \x20       print('kill refused', pid, e.strerror)"
        ),
    )
    .await;
    assert!(text.contains("secret found []"), "{text}");
    assert!(!text.contains(&format!("killed {host_pid}")), "{text}");
    assert!(
        text.contains(&format!("kill refused {host_pid} No such process")),
        "{text}"
    );

    // Nothing survives the call, not even a new session's child.
    let tag = format!("{}.{}", std::process::id(), 424242);
    run(&t, &hostile::new_session_child(&tag)).await;
    hostile::assert_no_process_with(&tag);

    // A fork bomb stops at the process limit; memory at its limit.
    let text = run(&t, &hostile::fork_bomb(5)).await;
    hostile::assert_fork_refused_before(&text, 32);
    let text = run(&t, "x = bytearray(1 << 30)\nprint('allocated')").await;
    assert!(
        text.contains("MemoryError") && !text.contains("allocated"),
        "{text}"
    );
    drop(listener);
}

/// Inside the sandbox the snippet finds its call's idempotency key in its environment (and
/// nothing else of ours); an unkeyed call has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_call_finds_its_key_in_the_sandbox_environment() {
    let Some(t) = sandboxed() else { return };
    let key = agent_r1_envs::call_key::CallKey {
        run: "r9".into(),
        episode: 5,
        step: 2,
        index: 1,
        branch: 0,
    };
    let code = "import os\nprint(os.environ.get('AGENT_R1_IDEMPOTENCY_KEY'))";
    let out = t.call_keyed(&key, json!({ "code": code })).await.unwrap();
    assert_eq!(out.metadata["isolation"], json!("bubblewrap"));
    assert_eq!(out.text, "r9/e5/s2/c1\n");
    assert_eq!(run(&t, code).await, "None\n");
}
