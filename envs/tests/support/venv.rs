//! The project venv's python (made by `make venv`) for the tests that run real python
//! programs: `None` (the test skips loudly) when it is missing, a failure under `CI`.

use std::path::PathBuf;

/// `.venv/bin/python`, or `None` after saying which test (`what`) skips.
pub fn python(what: &str) -> Option<PathBuf> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    if path.exists() {
        return Some(path);
    }
    let msg = format!("{} not found (run `make venv`)", path.display());
    if std::env::var_os("CI").is_some() {
        panic!("{msg}");
    }
    eprintln!("\n*** SKIPPING {what}: {msg} ***\n");
    None
}
