//! The python tool's control group per call: memory of all the snippet's processes together,
//! their number, and their CPU are bounded, and nothing it starts outlives the call, even a
//! process that left the process group with `setsid()`.
//!
//! Run on the plain-process path (`sandbox = false`, as root in CI), where the control group
//! is the only thing that can do each of these: no `RLIMIT_NPROC` is set there (and root is
//! exempt from it), and `RLIMIT_AS` is per process. The sandbox test checks the memory bound
//! under bubblewrap too. Where no control group can be made here (not root on a cgroup v1
//! host, or no delegated cgroup v2 subtree), the test prints `SKIPPED: ...`
//! (`AGENT_R1_REQUIRE_CGROUP=1` makes that a failure).

#[path = "../../tests/support/debian.rs"]
#[allow(dead_code)]
mod debian;
#[path = "support/hostile.rs"]
mod hostile;

use agent_r1_envs::tool::Tool;
use agent_r1_envs::tools::python::{cgroup, isolation, Isolation, PythonConfig, PythonTool};
use serde_json::{json, Value};

const TEST: &str = "python_cgroup";

fn plain(f: impl FnOnce(&mut PythonConfig)) -> Option<PythonTool> {
    if let Err(why) = cgroup::hierarchy() {
        debian::skip(TEST, "CGROUP", why);
        return None;
    }
    let mut cfg = PythonConfig {
        sandbox: false,
        require_cgroup: true,
        timeout_secs: 60.0,
        cpu_secs: 60,
        ..PythonConfig::default()
    };
    f(&mut cfg);
    Some(PythonTool::new(cfg).unwrap())
}

async fn call(t: &PythonTool, code: &str) -> (String, serde_json::Map<String, Value>) {
    let out = t.call(json!({ "code": code })).await.unwrap();
    assert_eq!(
        out.metadata["cgroup"],
        json!(cgroup::hierarchy().unwrap().label())
    );
    (out.text, out.metadata)
}

/// Children started one after another, each holding 100 MiB (written, so resident) until it
/// is killed, the next started only once the previous one holds its memory or died: the
/// total only grows, so past the limit the kernel must kill, and at most 2 can hold at the
/// end under a 256 MiB limit (each process is well under its 256 MiB address-space limit).
/// Then the parent asks each child whether it is alive: a live one answers on its pipe, one
/// the kernel killed (or is still killing) closes the pipe by dying and the parent reads
/// end-of-file, so the count does not depend on how fast a killed child exits.
const HOLDERS: &str = "import os, signal\n\
held = []\n\
for i in range(4):\n\
\x20   r, w = os.pipe()\n\
\x20   ping_r, ping_w = os.pipe()\n\
\x20   pid = os.fork()\n\
\x20   if pid == 0:\n\
\x20       os.close(r)\n\
\x20       os.close(ping_w)\n\
\x20       b = bytearray(b'x') * (100 << 20)\n\
\x20       os.write(w, b'held')\n\
\x20       os.read(ping_r, 1)\n\
\x20       os.write(w, b'pong')\n\
\x20       signal.pause()\n\
\x20   os.close(w)\n\
\x20   os.close(ping_r)\n\
\x20   said = os.read(r, 4)\n\
\x20   held.append((pid, r, ping_w))\n\
\x20   print('child', i, said.decode() or 'killed', flush=True)\n\
alive = []\n\
for pid, r, ping_w in held:\n\
\x20   try:\n\
\x20       os.write(ping_w, b'?')\n\
\x20   except BrokenPipeError:\n\
\x20       pass\n\
\x20   if os.read(r, 4) == b'pong':\n\
\x20       alive.append(pid)\n\
print('alive at the end', len(alive), flush=True)\n\
for p in alive:\n\
\x20   os.kill(p, 9)";

fn alive_at_the_end(text: &str) -> usize {
    text.lines()
        .find_map(|l| l.strip_prefix("alive at the end "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no count in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_of_all_processes_together_is_bounded() {
    let Some(t) = plain(|c| c.memory_mib = 256) else {
        return;
    };
    assert!(t
        .description()
        .contains("memory, processes and CPU are limited"));
    let (text, meta) = call(&t, HOLDERS).await;
    assert!(alive_at_the_end(&text) <= 2, "{text}");
    assert_eq!(meta["memory_exceeded"], json!(true), "{text}");
    assert!(
        text.contains("[memory limit of 256 MiB exceeded: the kernel killed a process]"),
        "{text}"
    );

    // The same snippet with room for all: nothing killed, nothing reported.
    let roomy = plain(|c| c.memory_mib = 1024).unwrap();
    let (text, meta) = call(&roomy, HOLDERS).await;
    assert_eq!(alive_at_the_end(&text), 4, "{text}");
    assert_eq!(meta["memory_exceeded"], json!(false), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_stops_at_the_process_limit_and_nothing_outlives_the_call() {
    let Some(t) = plain(|c| c.max_processes = 16) else {
        return;
    };
    let (text, _) = call(&t, &hostile::fork_bomb(30)).await;
    hostile::assert_fork_refused_before(&text, 16);

    // A new session's child leaves the process group, not the control group.
    let tag = format!("{}.{}", std::process::id(), 434343);
    call(&t, &hostile::new_session_child(&tag)).await;
    hostile::assert_no_process_with(&tag);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_is_bounded_to_its_share_of_cores() {
    let Some(t) = plain(|c| c.cpu_cores = 0.5) else {
        return;
    };
    if let cgroup::Hierarchy::V1 { cpu: None, .. } | cgroup::Hierarchy::V2 { cpu: false, .. } =
        cgroup::hierarchy().unwrap()
    {
        debian::skip(TEST, "CGROUP", "no cpu controller for the call's group");
        return;
    }
    // Three processes spin for 1.5 s of wall time. CFS lets the group run at most 50 ms per
    // 100 ms period, so their CPU time is at most half the wall time plus one period
    // (without the bound, up to 3x the wall time on 3 free cores).
    let (text, _) = call(
        &t,
        "import os, time\n\
         t0 = time.monotonic()\n\
         kids = []\n\
         for _ in range(3):\n\
         \x20   pid = os.fork()\n\
         \x20   if pid == 0:\n\
         \x20       while time.monotonic() - t0 < 1.5: pass\n\
         \x20       os._exit(0)\n\
         \x20   kids.append(pid)\n\
         for pid in kids: os.waitpid(pid, 0)\n\
         wall = time.monotonic() - t0\n\
         t = os.times()\n\
         print('cpu', t.children_user + t.children_system, 'wall', wall)",
    )
    .await;
    let nums: Vec<f64> = text
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let [cpu, wall] = nums[..] else {
        panic!("{text}")
    };
    assert!(wall >= 1.5, "{text}");
    assert!(cpu <= 0.5 * wall + 0.15, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_bound_holds_in_the_sandbox_too() {
    if cgroup::hierarchy().is_err() {
        return; // said by the other tests
    }
    if let Err(why) = debian::debian_programs(TEST, "bubblewrap", &["bwrap"], "BUBBLEWRAP") {
        debian::skip(TEST, "BUBBLEWRAP", &why);
        return;
    }
    if !matches!(isolation(), Isolation::Bubblewrap(_)) {
        debian::skip(
            TEST,
            "BUBBLEWRAP",
            "bwrap is installed but does not work here",
        );
        return;
    }
    let t = plain(|c| {
        c.sandbox = true;
        c.require_sandbox = true;
        c.memory_mib = 256;
    })
    .unwrap();
    let (text, meta) = call(&t, HOLDERS).await;
    assert_eq!(meta["isolation"], json!("bubblewrap"));
    assert!(alive_at_the_end(&text) <= 2, "{text}");
    assert_eq!(meta["memory_exceeded"], json!(true), "{text}");
}
