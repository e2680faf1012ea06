//! A Python server a test starts from `.venv-eco` (the ecosystem's packages: verifiers,
//! openenv-core), which prints its base URL as its first line of stdout; ended with its
//! process group when dropped.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A bound against a server that never starts (importing its packages on a loaded machine
/// takes seconds, not minutes).
const START_TIMEOUT: Duration = Duration::from_secs(600);

/// The ecosystem venv's Python (`make` builds it from requirements-eco.txt).
pub fn eco_python(root: &Path) -> PathBuf {
    let python = root.join(".venv-eco/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: run `make eco-venv` (or `make test`)",
        python.display()
    );
    python
}

/// The running server.
pub struct PyService {
    child: Child,
    /// Its base URL (`http://127.0.0.1:PORT`).
    pub url: String,
    /// Where its stderr goes.
    pub log: PathBuf,
}

impl PyService {
    /// Starts `script args` in `root` with the ecosystem venv's Python and waits for its URL.
    pub fn start(root: &Path, script: &str, args: &[&str], log: PathBuf) -> Self {
        let stderr = std::fs::File::create(&log).unwrap();
        let mut child = Command::new(eco_python(root))
            .arg(script)
            .args(args)
            .current_dir(root)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {script}: {e}"));
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = tx.send(lines.next());
            // Keep reading so the server never blocks on a full pipe.
            for _ in lines {}
        });
        let first = rx.recv_timeout(START_TIMEOUT);
        let mut service = Self {
            child,
            url: String::new(),
            log,
        };
        match first {
            Ok(Some(Ok(line))) if line.starts_with("http") => service.url = line.trim().into(),
            other => panic!(
                "{script} printed no URL ({other:?}); its stderr:\n{}",
                std::fs::read_to_string(&service.log).unwrap_or_default()
            ),
        }
        service
    }
}

impl Drop for PyService {
    fn drop(&mut self) {
        // SAFETY: killpg only sends a signal to the group this child leads.
        unsafe { libc::killpg(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}
