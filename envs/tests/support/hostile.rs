//! Hostile snippets the python tool's isolation tests share, and how their outcome is read.
#![allow(dead_code)]

/// Forks up to 200 children that sleep `sleep_secs`; prints how many it got
/// (`forked N`) and, when refused, `fork refused after N ...`.
pub fn fork_bomb(sleep_secs: u32) -> String {
    format!(
        "import os, time\n\
         n = 0\n\
         try:\n\
         \x20   for _ in range(200):\n\
         \x20       if os.fork() == 0:\n\
         \x20           time.sleep({sleep_secs}); os._exit(0)\n\
         \x20       n += 1\n\
         except OSError as e:\n\
         \x20   print('fork refused after', n, e.strerror)\n\
         print('forked', n)"
    )
}

/// Asserts the fork bomb's output says it was refused before `limit` children.
pub fn assert_fork_refused_before(text: &str, limit: usize) {
    let forked: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("forked "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(usize::MAX);
    assert!(
        text.contains("fork refused after") && forked < limit,
        "{text}"
    );
}

/// A child that leaves the process group with `setsid()` and becomes `sleep TAG`.
pub fn new_session_child(tag: &str) -> String {
    format!(
        "import os\n\
         if os.fork() == 0:\n\
         \x20   os.setsid()\n\
         \x20   os.execv('/bin/sleep', ['/bin/sleep', '{tag}'])\n\
         print('forked')"
    )
}

/// Asserts no process on the host has `tag` in its command line.
pub fn assert_no_process_with(tag: &str) {
    let survivors: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let cmd = std::fs::read(e.ok()?.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).into_owned();
            cmd.contains(tag).then_some(cmd)
        })
        .collect();
    assert!(survivors.is_empty(), "left behind: {survivors:?}");
}
