//! A control group per python call: total memory, processes (and threads) and CPU of
//! everything the snippet starts, killed as a group when the call ends.
//!
//! cgroup v2 is used where this process's own cgroup can enable the `memory` and `pids`
//! controllers for children (a delegated group holding no process, as a group with processes
//! cannot; this process does not move itself into a leaf); else cgroup v1 where the `memory` and `pids` hierarchies are mounted
//! and this process may create groups in them (root on a v1 host). Detected once, by making
//! and removing a probe group.
//!
//! The child joins its groups itself, between `fork` and `exec`, by writing `0` to the
//! groups' `cgroup.procs` files, which the parent opened beforehand (so a process forked by
//! the snippet can never start outside them, and the join is permitted by the opener's
//! credentials after the child has dropped its own). Crates that manage cgroups place a
//! process by pid from the parent after it started, which races with its first fork.

use std::fs::{self, File, OpenOptions};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::control_groups::OwnGroups;

/// Where call groups are made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// Unified (cgroup v2): children of this process's own group.
    V2 {
        /// This process's group, whose `cgroup.subtree_control` has `memory` and `pids`.
        parent: PathBuf,
        /// Whether the `cpu` controller is enabled for children too.
        cpu: bool,
    },
    /// Legacy (cgroup v1): children of this process's group in each controller's hierarchy.
    V1 {
        /// In the memory hierarchy.
        memory: PathBuf,
        /// In the pids hierarchy.
        pids: PathBuf,
        /// In the cpu hierarchy, where it is mounted and writable.
        cpu: Option<PathBuf>,
    },
}

impl Hierarchy {
    /// `v2` or `v1`, for metadata and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Hierarchy::V2 { .. } => "v2",
            Hierarchy::V1 { .. } => "v1",
        }
    }
}

/// The limits of one call's group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Memory of every process together (anonymous memory, page cache, tmpfs), bytes.
    pub memory_bytes: u64,
    /// Processes and threads at once.
    pub pids: u64,
    /// CPU time per wall-clock second, in cores.
    pub cpu_cores: f64,
}

/// The hierarchy where call groups can be made here, detected once; `Err` says why none.
pub fn hierarchy() -> Result<&'static Hierarchy, &'static str> {
    static DETECTED: OnceLock<Result<Hierarchy, String>> = OnceLock::new();
    DETECTED
        .get_or_init(|| {
            let found = detect();
            if let Err(why) = &found {
                tracing::info!("python tool: no control group per call ({why})");
            }
            found
        })
        .as_ref()
        .map_err(String::as_str)
}

const CFS_PERIOD_US: u64 = 100_000;

/// A group's control files and the values written to them, in order.
type Settings = Vec<(&'static str, String)>;

fn detect() -> Result<Hierarchy, String> {
    let own = OwnGroups::read()?;
    let mut why = vec![];
    match v2(&own) {
        Ok(h) => return Ok(h),
        Err(e) => why.push(format!("v2: {e}")),
    }
    match v1(&own) {
        Ok(h) => return Ok(h),
        Err(e) => why.push(format!("v1: {e}")),
    }
    Err(why.join("; "))
}

fn v2(own: &OwnGroups) -> Result<Hierarchy, String> {
    let dir = own
        .v2_dir()
        .ok_or("no cgroup2 mount holds this process's group")?;
    let available = fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    let available: Vec<&str> = available.split_whitespace().collect();
    for needed in ["memory", "pids"] {
        if !available.contains(&needed) {
            return Err(format!(
                "{} does not offer the {needed} controller (offered: {available:?})",
                dir.display()
            ));
        }
    }
    let enable = |controller: &str| -> Result<(), String> {
        let control = dir.join("cgroup.subtree_control");
        let on = fs::read_to_string(&control).unwrap_or_default();
        if on.split_whitespace().any(|c| c == controller) {
            return Ok(());
        }
        fs::write(&control, format!("+{controller}"))
            .map_err(|e| format!("enabling {controller} in {}: {e}", control.display()))
    };
    enable("memory")?;
    enable("pids")?;
    let cpu = available.contains(&"cpu") && enable("cpu").is_ok();
    let h = Hierarchy::V2 { parent: dir, cpu };
    probe(&h)?;
    Ok(h)
}

fn v1(own: &OwnGroups) -> Result<Hierarchy, String> {
    let dir_of = |controller: &str| own.v1_dir(controller);
    let memory = dir_of("memory").ok_or("the memory controller is not mounted")?;
    let pids = dir_of("pids").ok_or("the pids controller is not mounted")?;
    let cpu = dir_of("cpu");
    let mut h = Hierarchy::V1 { memory, pids, cpu };
    if let Err(e) = probe(&h) {
        let Hierarchy::V1 { cpu, .. } = &mut h else {
            unreachable!()
        };
        if cpu.take().is_none() {
            return Err(e);
        }
        // The cpu hierarchy alone may be read-only; memory and pids are what matter.
        probe(&h)?;
    }
    Ok(h)
}

/// Makes and removes a group with limits set, so a call never finds out first; removes the
/// empty groups of earlier processes that are gone.
fn probe(h: &Hierarchy) -> Result<(), String> {
    let limits = Limits {
        memory_bytes: 64 << 20,
        pids: 8,
        cpu_cores: 1.0,
    };
    let group = CallGroup::create(h, limits).map_err(|e| e.to_string())?;
    let parents: Vec<PathBuf> = group
        .dirs
        .iter()
        .filter_map(|d| d.parent().map(Path::to_path_buf))
        .collect();
    drop(group);
    remove_left_over();
    for parent in parents {
        remove_groups_of_dead_processes(&parent);
    }
    match LEFT_OVER.lock().unwrap_or_else(|p| p.into_inner()).first() {
        Some(dir) => Err(format!(
            "a probe group could not be removed: {}",
            dir.display()
        )),
        None => Ok(()),
    }
}

/// Removes `agent-r1-python-<pid>-<n>` groups of processes that no longer run (left when a
/// process ended while a killed snippet was still exiting); ones that still hold a process
/// stay.
fn remove_groups_of_dead_processes(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("agent-r1-python-"))
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            let _ = fs::remove_dir(entry.path());
        }
    }
}

/// One call's group (a directory per hierarchy), with its `cgroup.procs` files open for the
/// child to join. Dropping it kills whatever is still in it and removes it.
#[derive(Debug)]
pub struct CallGroup {
    version: &'static str,
    /// The group's directories; the first holds the memory controller.
    dirs: Vec<PathBuf>,
    procs: Vec<File>,
    memory_bytes: u64,
}

/// Groups that still had a process when their call ended (exiting, but not yet gone); the
/// next group made removes them.
static LEFT_OVER: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

impl CallGroup {
    /// Makes a new group with `limits` in `h`.
    pub fn create(h: &Hierarchy, limits: Limits) -> std::io::Result<Self> {
        remove_left_over();
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "agent-r1-python-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let quota = ((limits.cpu_cores * CFS_PERIOD_US as f64).round() as u64).max(1_000);
        let (version, plan): (_, Vec<(PathBuf, Settings)>) = match h {
            Hierarchy::V2 { parent, cpu } => {
                let mut files = vec![
                    ("memory.max", limits.memory_bytes.to_string()),
                    ("memory.swap.max", "0".to_string()),
                    ("pids.max", limits.pids.to_string()),
                ];
                if *cpu {
                    files.push(("cpu.max", format!("{quota} {CFS_PERIOD_US}")));
                }
                ("v2", vec![(parent.join(&name), files)])
            }
            Hierarchy::V1 { memory, pids, cpu } => {
                let mut plan = vec![
                    (
                        memory.join(&name),
                        vec![
                            ("memory.limit_in_bytes", limits.memory_bytes.to_string()),
                            (
                                "memory.memsw.limit_in_bytes",
                                limits.memory_bytes.to_string(),
                            ),
                        ],
                    ),
                    (
                        pids.join(&name),
                        vec![("pids.max", limits.pids.to_string())],
                    ),
                ];
                if let Some(cpu) = cpu {
                    plan.push((
                        cpu.join(&name),
                        vec![
                            ("cpu.cfs_period_us", CFS_PERIOD_US.to_string()),
                            ("cpu.cfs_quota_us", quota.to_string()),
                        ],
                    ));
                }
                ("v1", plan)
            }
        };
        let mut group = CallGroup {
            version,
            dirs: vec![],
            procs: vec![],
            memory_bytes: limits.memory_bytes,
        };
        for (dir, files) in plan {
            fs::create_dir(&dir).map_err(|e| with_path(&dir, e))?;
            group.dirs.push(dir.clone());
            for (file, value) in files {
                let path = dir.join(file);
                // Swap accounting is optional (absent without swap support).
                let optional = file.contains("swap") || file.contains("memsw");
                if let Err(e) = fs::write(&path, &value) {
                    if !(optional && e.kind() == std::io::ErrorKind::NotFound) {
                        return Err(with_path(&path, e));
                    }
                }
            }
            let procs = dir.join("cgroup.procs");
            group.procs.push(
                OpenOptions::new()
                    .write(true)
                    .open(&procs)
                    .map_err(|e| with_path(&procs, e))?,
            );
        }
        Ok(group)
    }

    /// `v2` or `v1`.
    pub fn version(&self) -> &'static str {
        self.version
    }

    /// The memory limit, bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }

    /// The `cgroup.procs` descriptors a child writes `0` to, between fork and exec, to join
    /// (see [`join`]). They stay open as long as the group.
    pub fn join_fds(&self) -> Vec<RawFd> {
        self.procs.iter().map(AsRawFd::as_raw_fd).collect()
    }

    /// Whether the kernel killed a process of the group for its memory limit.
    pub fn oom_killed(&self) -> bool {
        let Some(dir) = self.dirs.first() else {
            return false;
        };
        let file = match self.version {
            "v2" => "memory.events",
            _ => "memory.oom_control",
        };
        fs::read_to_string(dir.join(file))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("oom_kill "))
                    .and_then(|n| n.trim().parse::<u64>().ok())
            })
            .is_some_and(|n| n > 0)
    }

    /// Sends SIGKILL to every process in the group (v2's `cgroup.kill`, else each listed pid
    /// until none is listed; a killed process forks nothing more, so this ends).
    pub fn kill_all(&self) {
        let Some(dir) = self.dirs.first() else { return };
        if self.version == "v2" && fs::write(dir.join("cgroup.kill"), "1").is_ok() {
            return;
        }
        // Every process of the call is in each of its groups; the last one listed is read.
        let Some(dir) = self.dirs.last() else { return };
        for _ in 0..100 {
            let pids = pids_in(dir);
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                // SAFETY: plain syscall on a pid listed in the group.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }

    /// Kills what is left, waits (at most `wait`) until the killed processes have left,
    /// and removes the group's directories.
    pub async fn remove(mut self, wait: std::time::Duration) -> std::io::Result<()> {
        self.kill_all();
        let deadline = tokio::time::Instant::now() + wait;
        while self.dirs.iter().any(|d| !pids_in(d).is_empty())
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            self.kill_all();
        }
        self.remove_dirs()
    }

    /// Removes the group's directories; one that still holds an exiting process is left for
    /// the next group made to remove.
    fn remove_dirs(&mut self) -> std::io::Result<()> {
        let mut first_error = None;
        for dir in std::mem::take(&mut self.dirs) {
            if let Err(e) = fs::remove_dir(&dir) {
                first_error.get_or_insert(with_path(&dir, e));
                LEFT_OVER
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(dir);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for CallGroup {
    fn drop(&mut self) {
        if self.dirs.is_empty() {
            return;
        }
        self.kill_all();
        let _ = self.remove_dirs();
    }
}

/// Joins the groups whose `cgroup.procs` are `fds`, between fork and exec: only `write(2)`,
/// which is async-signal-safe.
///
/// # Safety
/// The descriptors must be open (the [`CallGroup`] that gave them is alive).
pub unsafe fn join(fds: &[RawFd]) -> std::io::Result<()> {
    for fd in fds {
        // SAFETY: a write of a static byte to an open descriptor.
        if unsafe { libc::write(*fd, b"0".as_ptr().cast(), 1) } != 1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn pids_in(dir: &Path) -> Vec<libc::pid_t> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn remove_left_over() {
    let mut left = LEFT_OVER.lock().unwrap_or_else(|p| p.into_inner());
    left.retain(|d| d.exists() && fs::remove_dir(d).is_err());
}

fn with_path(path: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}
