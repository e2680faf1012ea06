//! The project venv's Python (`make venv` builds it), found the same way by every test of the
//! workspace that runs it: `AGENT_R1_VENV` when set, else `.venv` at the workspace root.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The venv's directory.
pub fn venv_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("AGENT_R1_VENV") {
        return PathBuf::from(dir);
    }
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = crate_dir
        .ancestors()
        .find(|d| d.join("Cargo.lock").is_file())
        .unwrap_or(crate_dir);
    root.join(".venv")
}

/// The venv's `python` when it imports every one of `modules`, or why not.
pub fn python_with(modules: &[&str]) -> Result<PathBuf, String> {
    let python = venv_dir().join("bin/python");
    if !python.is_file() {
        return Err(format!("{} does not exist", python.display()));
    }
    if modules.is_empty() {
        return Ok(python);
    }
    let probe = Command::new(&python)
        .args(["-c", &format!("import {}", modules.join(", "))])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if !probe.status.success() {
        return Err(format!(
            "{} cannot import {}: {}",
            python.display(),
            modules.join(", "),
            String::from_utf8_lossy(&probe.stderr).trim()
        ));
    }
    Ok(python)
}

/// [`python_with`], or `None` after a SKIPPED line. Under CI (`CI` set) a venv without the
/// modules fails the test instead.
pub fn python_or_skip(modules: &[&str]) -> Option<PathBuf> {
    match python_with(modules) {
        Ok(python) => Some(python),
        Err(why) if std::env::var_os("CI").is_some() => {
            panic!("{why}: the project venv is required under CI (run `make test`)")
        }
        Err(why) => {
            eprintln!("SKIPPED: {why} (run `make venv`)");
            None
        }
    }
}

/// [`python_with`], or a failed test naming what is missing: for tests that have nothing to
/// check without it.
pub fn python_required(modules: &[&str]) -> PathBuf {
    python_with(modules).unwrap_or_else(|why| panic!("{why}: run `make venv` (or `make test`)"))
}
