//! The documentation a user reads: the README stays a short front page with a table of
//! contents, every relative link in the Markdown files leads to a file (and heading) that
//! exists, and no page narrates how the project was developed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Markdown files of the repository: the top level, `docs/` and `examples/`.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let root = Path::new(ROOT);
    let mut files: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "md"))
        .collect();
    walk(&root.join("docs"), &mut files);
    walk(&root.join("examples"), &mut files);
    files.sort();
    files
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The lines outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

fn anchors(path: &Path) -> HashSet<String> {
    let text = std::fs::read_to_string(path).unwrap();
    prose(&text)
        .into_iter()
        .filter_map(|l| {
            let hashes = l.chars().take_while(|&c| c == '#').count();
            (1..=6)
                .contains(&hashes)
                .then(|| l[hashes..].strip_prefix(' '))
                .flatten()
                .map(slug)
        })
        .collect()
}

/// The targets of `[text](target)` links in the prose of `text`.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            out.push(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    out
}

#[test]
fn the_readme_is_a_short_front_page_with_contents() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    assert!(
        readme.len() <= 12 * 1024,
        "README.md is {} bytes; keep it at most 12 KiB and move details to docs/",
        readme.len()
    );
    assert!(
        readme.contains("\n## Contents\n"),
        "README.md has no contents"
    );
    for guide in ["docs/own-data.md", "docs/training.md", "docs/operations.md"] {
        assert!(readme.contains(guide), "README.md does not link {guide}");
    }
}

#[test]
fn every_relative_link_leads_to_a_file_and_heading_that_exist() {
    let mut broken = Vec::new();
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let dir = file.parent().unwrap();
        for target in links(&text) {
            if target.starts_with("http://")
                || target.starts_with("https://")
                || target.starts_with("mailto:")
            {
                continue;
            }
            let (path, fragment) = match target.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                dir.join(path)
            };
            if !resolved.exists() {
                broken.push(format!("{}: {target} (no such file)", file.display()));
                continue;
            }
            if let (Some(fragment), true) =
                (fragment, resolved.extension().is_some_and(|e| e == "md"))
            {
                if !anchors(&resolved).contains(fragment) {
                    broken.push(format!("{}: {target} (no such heading)", file.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn no_page_narrates_the_development_history() {
    let mut found = Vec::new();
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            let numbered = |word: &str| {
                lower.match_indices(word).any(|(at, _)| {
                    let before = lower[..at].chars().next_back();
                    let after = &lower[at + word.len()..];
                    !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                        && after.starts_with(|c: char| c.is_ascii_digit())
                })
            };
            if numbered("session ")
                || numbered("sessions ")
                || numbered("issue ")
                || lower.contains("this session")
            {
                found.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "development history in the docs (state figures with their command, machine and \
         commit instead):\n{}",
        found.join("\n")
    );
}
