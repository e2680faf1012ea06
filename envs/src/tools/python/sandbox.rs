//! What the `python` tool can isolate on this machine, detected once at run time: the
//! bubblewrap sandbox ([`super::bubblewrap`]) where `bwrap` is installed and works, else
//! network isolation only.
//!
//! Network isolation uses a new, empty network namespace entered by the child just before
//! `exec` (`unshare(CLONE_NEWNET)`, which needs root or `CAP_SYS_ADMIN`; else
//! `unshare(CLONE_NEWUSER | CLONE_NEWNET)` where unprivileged user namespaces are enabled).
//! The probe runs `true` (or `python3 -c pass`) under each in turn; where none works the tool
//! runs without network isolation and says so in its metadata.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// How a snippet is isolated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Isolation {
    /// The bubblewrap sandbox (its own namespaces, no capabilities, seccomp, read-only system).
    Bubblewrap(PathBuf),
    /// A separate process with rlimits and, where possible, no network.
    Process(NetIsolation),
}

impl Isolation {
    /// A short label for metadata and docs (`bubblewrap`, `netns`, `userns+netns`, `none`).
    pub fn label(&self) -> &'static str {
        match self {
            Isolation::Bubblewrap(_) => "bubblewrap",
            Isolation::Process(net) => net.label(),
        }
    }

    /// Whether snippets are cut off from the network.
    pub fn no_network(&self) -> bool {
        !matches!(self, Isolation::Process(NetIsolation::None))
    }
}

/// The best isolation available, probed once per process: bubblewrap when a probe snippet
/// runs under it exactly as calls will, else [`net_isolation`].
pub fn isolation() -> &'static Isolation {
    static DETECTED: OnceLock<Isolation> = OnceLock::new();
    DETECTED.get_or_init(|| {
        if let Some(bwrap) = super::bubblewrap::find_bwrap() {
            match super::probe_bubblewrap(&bwrap) {
                Ok(()) => return Isolation::Bubblewrap(bwrap),
                Err(why) => tracing::warn!(
                    "python tool: {} does not work here ({why}); snippets run without the sandbox",
                    bwrap.display()
                ),
            }
        }
        Isolation::Process(net_isolation())
    })
}

/// How the child leaves the host's network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetIsolation {
    /// A new network namespace (only a down loopback interface).
    NetNamespace,
    /// A new user namespace holding a new network namespace (unprivileged).
    UserAndNetNamespace,
    /// Not isolated: the snippet can reach whatever the host can.
    None,
}

impl NetIsolation {
    /// The `unshare(2)` flags to enter, if any.
    pub fn flags(self) -> Option<libc::c_int> {
        match self {
            NetIsolation::NetNamespace => Some(libc::CLONE_NEWNET),
            NetIsolation::UserAndNetNamespace => Some(libc::CLONE_NEWUSER | libc::CLONE_NEWNET),
            NetIsolation::None => None,
        }
    }

    /// A short label for metadata and docs.
    pub fn label(self) -> &'static str {
        match self {
            NetIsolation::NetNamespace => "netns",
            NetIsolation::UserAndNetNamespace => "userns+netns",
            NetIsolation::None => "none",
        }
    }
}

/// The best network isolation available, probed once per process.
pub fn net_isolation() -> NetIsolation {
    static DETECTED: OnceLock<NetIsolation> = OnceLock::new();
    *DETECTED.get_or_init(|| {
        for candidate in [
            NetIsolation::NetNamespace,
            NetIsolation::UserAndNetNamespace,
        ] {
            if probe(candidate) {
                return candidate;
            }
        }
        tracing::warn!(
            "python tool: no network namespace available; snippets can reach the network"
        );
        NetIsolation::None
    })
}

fn probe(candidate: NetIsolation) -> bool {
    let Some(flags) = candidate.flags() else {
        return true;
    };
    let mut cmd = Command::new("/bin/sh");
    cmd.args(["-c", "exit 0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: only the async-signal-safe unshare(2) runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(flags) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.status().is_ok_and(|s| s.success())
}
