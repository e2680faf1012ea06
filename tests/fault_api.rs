//! Fault injection stays out of what a build without the `fault-injection` feature offers:
//! read from the sources, since every test build turns the feature on.
//!
//! - a public item of the library crates (`agent-r1-actors`, `agent-r1`) named for a fault
//!   (`fault`, `faulty`, `hang`, `panic` as a word of its name) is compiled only with the
//!   feature, or lives in a module that is, unless it is one of the few that every build has
//!   on purpose (listed below with the reason);
//! - every struct of the command line named for a fault, and every struct with a hidden flag,
//!   is compiled only with the feature.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

#[path = "support/rust_sources.rs"]
mod rust_sources;

/// Public items named for faults that every build has, with why.
const EVERY_BUILD: &[(&str, &str, &str)] = &[
    (
        "actors/src/engine/faults.rs",
        "EngineFaults",
        "the plan handed to engines; only `new` exists without the feature",
    ),
    (
        "src/train.rs",
        "faults",
        "picks the real plan or the inert one by the feature",
    ),
    (
        "src/train/faults/inert.rs",
        "Faults",
        "the inert plan: every call does nothing",
    ),
    (
        "src/cluster.rs",
        "worker_faults",
        "picks the worker's real plan or the inert one by the feature",
    ),
    (
        "src/cluster/worker_faults.rs",
        "WorkerFaults",
        "the worker's plan; without the feature the inert one",
    ),
];

/// Whether an item name says it is about faults: one of the words, in snake or camel case.
fn names_a_fault(name: &str) -> bool {
    const WORDS: [&str; 5] = ["fault", "faults", "faulty", "hang", "panic"];
    let mut words = Vec::new();
    for part in name.split('_').filter(|p| !p.is_empty()) {
        let mut word = String::new();
        for c in part.chars() {
            if c.is_uppercase() && !word.is_empty() {
                words.push(std::mem::take(&mut word));
            }
            word.extend(c.to_lowercase());
        }
        words.push(word);
    }
    words.iter().any(|w| WORDS.contains(&w.as_str()))
}

/// An item declared on `line`: its visibility (`pub`, `pub(crate)`, ... or empty), its kind
/// and its name.
fn item(line: &str) -> Option<(String, &'static str, String)> {
    let mut rest = line.trim_start();
    let mut vis = String::new();
    if rest.starts_with("pub") {
        let end = if rest[3..].starts_with('(') {
            rest.find(')')? + 1
        } else {
            3
        };
        vis = rest[..end].to_string();
        rest = rest[end..].trim_start();
    }
    for prefix in ["async ", "const ", "unsafe "] {
        if let Some(r) = rest.strip_prefix(prefix) {
            if !r.starts_with("fn ") {
                continue;
            }
            rest = r;
        }
    }
    for kind in [
        "fn", "mod", "struct", "enum", "trait", "type", "static", "const",
    ] {
        if let Some(r) = rest.strip_prefix(kind).and_then(|r| r.strip_prefix(' ')) {
            let name: String = r
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            return (!name.is_empty()).then_some((vis, kind, name));
        }
    }
    None
}

/// Whether the attributes right above line `i` compile it only with the feature.
fn gated(lines: &[&str], i: usize) -> bool {
    lines[..i]
        .iter()
        .rev()
        .map(|l| l.trim())
        .take_while(|l| l.starts_with("#[") || l.starts_with("//") || l.ends_with(")]"))
        .any(|l| l.contains("feature = \"fault-injection\"") && !l.contains("not("))
}

/// A file's lines up to its unit tests (`#[cfg(test)]` then `mod tests`).
fn code_lines(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let end = (0..lines.len())
        .find(|&i| {
            lines[i].trim() == "#[cfg(test)]"
                && lines.get(i + 1).is_some_and(|l| l.trim() == "mod tests {")
        })
        .unwrap_or(lines.len());
    lines[..end].to_vec()
}

/// The directory of the modules a file declares (`foo.rs` -> `foo/`).
fn module_dir(file: &Path) -> PathBuf {
    let stem = file.file_stem().unwrap().to_str().unwrap();
    if ["lib", "main", "mod"].contains(&stem) {
        file.parent().unwrap().to_path_buf()
    } else {
        file.with_extension("")
    }
}

struct Finding {
    file: String,
    line: usize,
    vis: String,
    kind: &'static str,
    name: String,
    gated: bool,
}

/// Every item of the crates' sources, with whether it is compiled only with the feature
/// (itself, or a module above it).
fn items(root: &Path) -> Vec<Finding> {
    let mut files = Vec::new();
    for src in ["actors/src", "src"] {
        rust_sources::rust_files(&root.join(src), &mut files);
    }
    files.sort();
    let text: Vec<(PathBuf, String)> = files
        .iter()
        .map(|f| (f.clone(), std::fs::read_to_string(f).unwrap()))
        .collect();
    // Files of modules declared behind the feature, and everything under them.
    let mut gated_paths: BTreeSet<PathBuf> = BTreeSet::new();
    for (file, text) in &text {
        let lines = code_lines(text);
        for (i, l) in lines.iter().enumerate() {
            if let Some((_, "mod", name)) = item(l) {
                if l.trim_end().ends_with(';') && gated(&lines, i) {
                    let dir = module_dir(file);
                    gated_paths.insert(dir.join(format!("{name}.rs")));
                    gated_paths.insert(dir.join(&name));
                }
            }
        }
    }
    let under_gate = |f: &Path| gated_paths.iter().any(|g| f.starts_with(g));
    let mut out = Vec::new();
    for (file, text) in &text {
        let lines = code_lines(text);
        let file_gated = under_gate(file);
        for (i, l) in lines.iter().enumerate() {
            let Some((vis, kind, name)) = item(l) else {
                continue;
            };
            out.push(Finding {
                file: file
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
                line: i + 1,
                gated: file_gated || gated(&lines, i),
                vis,
                kind,
                name,
            });
        }
    }
    out
}

/// The structs of `src/cli` that declare a hidden flag.
fn structs_with_hidden_flags(root: &Path) -> Vec<(String, String, bool)> {
    let mut files = Vec::new();
    rust_sources::rust_files(&root.join("src/cli"), &mut files);
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let lines = code_lines(&text);
        let mut current: Option<(String, bool)> = None;
        for (i, l) in lines.iter().enumerate() {
            if let Some((_, "struct", name)) = item(l) {
                current = Some((name, gated(&lines, i)));
            }
            if l.contains("hide = true") {
                let (name, gated) = current.clone().expect("a hidden flag outside a struct");
                out.push((file.display().to_string(), name, gated));
            }
        }
    }
    out
}

#[test]
fn fault_injection_is_compiled_only_with_its_feature() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let all = items(root);
    let mut open = Vec::new();
    let mut allowed_seen = BTreeSet::new();
    for f in &all {
        if f.gated || !names_a_fault(&f.name) {
            continue;
        }
        let public = f.vis == "pub";
        let cli_type = f.file.starts_with("src/cli") && ["struct", "enum"].contains(&f.kind);
        if !(public || cli_type) {
            continue;
        }
        if let Some(a) = EVERY_BUILD
            .iter()
            .find(|(file, name, _)| *file == f.file && *name == f.name)
        {
            allowed_seen.insert(*a);
            continue;
        }
        open.push(format!(
            "{}:{}: {} {} {}",
            f.file, f.line, f.vis, f.kind, f.name
        ));
    }
    assert!(
        open.is_empty(),
        "fault-injection items in a build without the feature (put them behind \
         #[cfg(feature = \"fault-injection\")]):\n{}",
        open.join("\n")
    );
    let stale: Vec<_> = EVERY_BUILD
        .iter()
        .filter(|a| !allowed_seen.contains(*a))
        .collect();
    assert!(
        stale.is_empty(),
        "listed as in every build but not found: {stale:?}"
    );
    // The scan sees the arming methods, and sees them gated.
    for name in ["hang", "panic_after", "panic_on_next_update"] {
        assert!(
            all.iter().any(|f| f.file == "actors/src/engine/faults.rs"
                && f.name == name
                && f.vis == "pub"
                && f.gated),
            "EngineFaults::{name} not found behind the feature"
        );
    }
    let hidden = structs_with_hidden_flags(root);
    assert!(hidden.len() >= 3, "{hidden:?}");
    let open: Vec<_> = hidden.iter().filter(|(_, _, g)| !g).collect();
    assert!(
        open.is_empty(),
        "hidden flags in structs every build has: {open:?}"
    );
}

#[test]
fn names_are_split_into_words() {
    assert!(names_a_fault("FaultyTool") && names_a_fault("panic_after"));
    assert!(names_a_fault("WorkerFaultFlags") && names_a_fault("HangStage"));
    assert!(!names_a_fault("default") && !names_a_fault("defaults_follow"));
    assert!(!names_a_fault("changed") && !names_a_fault("Shanghai"));
    assert_eq!(
        item("    pub(crate) async fn arm_faults(&mut self) {"),
        Some(("pub(crate)".into(), "fn", "arm_faults".into()))
    );
    assert_eq!(
        item("pub mod fault;"),
        Some(("pub".into(), "mod", "fault".into()))
    );
}
