//! The python tool's sandbox: bubblewrap (Debian's `bubblewrap`), found and probed once.
//!
//! A call runs as
//! `bwrap --unshare-user --unshare-pid --unshare-net --unshare-ipc --unshare-uts
//! --unshare-cgroup --disable-userns --die-with-parent --new-session --cap-drop ALL
//! --seccomp 3 ... python3 -I main.py`: its own user, PID, mount, IPC, UTS, cgroup and
//! network namespaces (it sees only its own processes, an empty network, no host /proc); an
//! unprivileged uid with no capabilities and no further user namespaces; a read-only view of
//! the system directories only (no /etc, no /home, no /root) on a read-only root, a private
//! /tmp of bounded size
//! and the call's scratch directory at `/work`; `no_new_privs`; a seccomp filter that refuses
//! namespace, mount, tracing, kernel-module, key and BPF calls; killed when agent-r1 dies.
//! When agent-r1 runs as root, bubblewrap itself is started as `sandbox_uid` (so the
//! snippet's processes are not root's on the host, and the process limit applies to them).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};

/// Where the scratch directory appears inside the sandbox.
pub const WORKDIR: &str = "/work";

/// Host directories shown read-only inside the sandbox (or re-created as the same symlink).
const SYSTEM_DIRS: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// `bwrap` on PATH or in /usr/bin.
pub fn find_bwrap() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")])
        .map(|d| d.join("bwrap"))
        .find(|p| p.is_file())
}

/// Whether this process runs as root (then bubblewrap is started as the sandbox uid).
pub fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The arguments of `bwrap` for one call: `scratch` is shown at [`WORKDIR`], `/tmp` is a
/// tmpfs of `tmp_bytes`, the seccomp programs are read from fds 3 and 4, and `program`
/// runs last with the environment variables `env` besides the sandbox's own.
pub fn arguments(
    scratch: &Path,
    tmp_bytes: u64,
    extra_ro: &[PathBuf],
    program: &[OsString],
    env: &[(&str, &str)],
) -> Vec<OsString> {
    let mut a: Vec<OsString> = [
        "--unshare-user",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--uid",
        "65534",
        "--gid",
        "65534",
        "--hostname",
        "sandbox",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    let mut push = |items: &[&std::ffi::OsStr]| a.extend(items.iter().map(|s| s.to_os_string()));
    for dir in SYSTEM_DIRS {
        let host = Path::new("/").join(dir);
        match std::fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(&host) {
                    push(&["--symlink".as_ref(), target.as_os_str(), host.as_os_str()]);
                }
            }
            Ok(m) if m.is_dir() => {
                push(&["--ro-bind".as_ref(), host.as_os_str(), host.as_os_str()])
            }
            _ => {}
        }
    }
    for dir in extra_ro {
        push(&["--ro-bind".as_ref(), dir.as_os_str(), dir.as_os_str()]);
    }
    let size = tmp_bytes.to_string();
    push(&[
        "--proc".as_ref(),
        "/proc".as_ref(),
        "--dev".as_ref(),
        "/dev".as_ref(),
        "--size".as_ref(),
        size.as_ref(),
        "--tmpfs".as_ref(),
        "/tmp".as_ref(),
        "--bind".as_ref(),
        scratch.as_os_str(),
        WORKDIR.as_ref(),
        "--chdir".as_ref(),
        WORKDIR.as_ref(),
        "--remount-ro".as_ref(),
        "/".as_ref(),
        "--clearenv".as_ref(),
    ]);
    for (k, v) in [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", WORKDIR),
        ("TMPDIR", "/tmp"),
        ("LANG", "C.UTF-8"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("PYTHONIOENCODING", "utf-8"),
    ]
    .into_iter()
    .chain(env.iter().copied())
    {
        push(&["--setenv".as_ref(), k.as_ref(), v.as_ref()]);
    }
    push(&[
        "--add-seccomp-fd".as_ref(),
        "3".as_ref(),
        "--add-seccomp-fd".as_ref(),
        "4".as_ref(),
        "--".as_ref(),
    ]);
    a.extend(program.iter().cloned());
    a
}

/// The seccomp programs (raw BPF, as `bwrap --add-seccomp-fd` reads them; the sandbox
/// reads them from fds 3 and 4): every syscall is allowed except those that reach outside
/// the sandbox or into the kernel's attack surface, which fail with `EPERM`; and `clone3`
/// fails with `ENOSYS`, so the C library falls back to `clone`, whose namespace flags are
/// checked.
pub fn seccomp_programs() -> Result<Vec<Vec<u8>>, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| format!("no seccomp support for {}: {e:?}", std::env::consts::ARCH))?;
    let mut denied: Vec<libc::c_long> = vec![
        libc::SYS_setns,
        libc::SYS_unshare,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_chroot,
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_kexec_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_userfaultfd,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_reboot,
        libc::SYS_syslog,
        libc::SYS_acct,
        libc::SYS_fsopen,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
    ];
    #[cfg(target_arch = "x86_64")]
    denied.extend([libc::SYS_iopl, libc::SYS_ioperm, libc::SYS_kexec_file_load]);
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        denied.into_iter().map(|s| (s, vec![])).collect();
    let namespace_flags = [
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWNS,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWCGROUP,
    ];
    let clone_rules = namespace_flags
        .iter()
        .map(|&flag| {
            let flag = flag as u64;
            SeccompRule::new(vec![SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )
            .map_err(|e| format!("seccomp condition: {e}"))?])
            .map_err(|e| format!("seccomp rule: {e}"))
        })
        .collect::<Result<Vec<_>, String>>()?;
    rules.insert(libc::SYS_clone, clone_rules);
    let deny = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| format!("seccomp filter: {e}"))?;
    let clone3 = SeccompFilter::new(
        [(libc::SYS_clone3, vec![])].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(|e| format!("seccomp filter: {e}"))?;
    [deny, clone3]
        .into_iter()
        .map(|filter| {
            let program: seccompiler::BpfProgram =
                filter.try_into().map_err(|e| format!("seccomp: {e:?}"))?;
            let mut bytes = Vec::with_capacity(program.len() * 8);
            for ins in program {
                bytes.extend_from_slice(&ins.code.to_ne_bytes());
                bytes.push(ins.jt);
                bytes.push(ins.jf);
                bytes.extend_from_slice(&ins.k.to_ne_bytes());
            }
            Ok(bytes)
        })
        .collect()
}
