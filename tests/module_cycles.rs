//! No import cycle between modules: within each crate, a module that names another (through
//! `crate::`, `super::` or `self::` paths, in `use` items or inline) depends on it, and the
//! modules must form no cycle. A module and its own ancestors or descendants do not count (a
//! parent declares its children and re-exports them; a child may use its parent's items).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

#[path = "support/rust_sources.rs"]
mod rust_sources;

use rust_sources::rust_files;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The crates of the workspace: (name, source directory).
const CRATES: [(&str, &str); 4] = [
    ("agent-r1-envs", "envs/src"),
    ("agent-r1-actors", "actors/src"),
    ("agent-r1", "src"),
    ("custom-agent", "examples/custom-tool/src"),
];

type ModPath = Vec<String>;

/// `a/b.rs` and `a/b/mod.rs` are `a::b`; `lib.rs` and `main.rs` are the crate root.
fn module_of(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: ModPath = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    }
    parts
}

/// The source without comments, string and char literals (so paths in docs do not count).
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'r'
            && (b[i + 1..].starts_with(b"\"") || b[i + 1..].starts_with(b"#"))
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while j < b.len() && b[j] == b'#' {
                hashes += 1;
                j += 1;
            }
            if j < b.len() && b[j] == b'"' {
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                j += 1;
                while j < b.len() && !b[j..].starts_with(&close) {
                    j += 1;
                }
                i = j + close.len();
                out.push_str("\"\"");
            } else {
                out.push('r');
                i += 1;
            }
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('a', '\n', '\''); lifetimes ('a) are left alone.
            let mut j = i + 1;
            if b[j] == b'\\' {
                j += 2;
            } else {
                j += 1;
            }
            while j < b.len() && b[j] != b'\'' {
                j += 1;
            }
            i = j + 1;
            out.push_str("' '");
        } else {
            let ch = text[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// Expands a use tree (`crate::{a::{b, c}, d as e}`) into its paths.
fn expand_use(tree: &str, prefix: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim().trim_end_matches("::");
        let inner = &tree[open + 1..tree.rfind('}').unwrap()];
        let base = join(prefix, head);
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand_use(&inner[start..i], &base, out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        expand_use(&inner[start..], &base, out);
    } else if !tree.is_empty() {
        let path = tree.split(" as ").next().unwrap().trim();
        out.push(join(prefix, path));
    }
}

fn join(prefix: &str, path: &str) -> String {
    match (prefix.is_empty(), path.is_empty()) {
        (true, _) => path.to_string(),
        (_, true) => prefix.to_string(),
        _ => format!("{prefix}::{path}"),
    }
}

/// Every `crate::`/`super::`/`self::` path the code names.
fn named_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    // `use` items, whose braces hide the paths' heads.
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let boundary = at == 0 || {
            let c = rest.as_bytes()[at - 1];
            !(c.is_ascii_alphanumeric() || c == b'_')
        };
        let after = &rest[at + 4..];
        let end = after.find(';').unwrap_or(after.len());
        if boundary {
            let tree: String = after[..end]
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            let mut paths = Vec::new();
            if tree.starts_with("crate") || tree.starts_with("super") || tree.starts_with("self") {
                expand_use(&tree, "", &mut paths);
            }
            out.extend(paths);
        }
        rest = &after[end.min(after.len())..];
    }
    // Inline paths (`crate::metric_names::X.name`).
    let bytes = code.as_bytes();
    for head in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(head) {
            if at > 0
                && (bytes[at - 1].is_ascii_alphanumeric()
                    || bytes[at - 1] == b'_'
                    || bytes[at - 1] == b':')
            {
                continue;
            }
            let end = code[at..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(code.len(), |e| at + e);
            out.push(code[at..end].trim_end_matches(':').to_string());
        }
    }
    out
}

/// The deepest known module a path names, seen from module `from`.
fn resolve(path: &str, from: &ModPath, modules: &BTreeSet<ModPath>) -> Option<ModPath> {
    let mut segments = path.split("::").filter(|s| !s.is_empty()).peekable();
    let mut at: ModPath = match segments.next()? {
        "crate" => Vec::new(),
        "self" => from.clone(),
        "super" => {
            let mut m = from.clone();
            m.pop()?;
            while segments.peek() == Some(&"super") {
                segments.next();
                m.pop()?;
            }
            m
        }
        _ => return None,
    };
    for s in segments {
        let mut next = at.clone();
        next.push(s.to_string());
        if modules.contains(&next) {
            at = next;
        } else {
            break;
        }
    }
    Some(at)
}

fn is_prefix(a: &ModPath, b: &ModPath) -> bool {
    a.len() <= b.len() && b[..a.len()] == a[..]
}

/// Edges between modules that are not each other's ancestors, with the path that makes each.
fn dependencies(src: &Path) -> BTreeMap<ModPath, BTreeMap<ModPath, String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<ModPath> = files.iter().map(|f| module_of(src, f)).collect();
    let mut edges: BTreeMap<ModPath, BTreeMap<ModPath, String>> = BTreeMap::new();
    for f in &files {
        let from = module_of(src, f);
        let code = code_only(&std::fs::read_to_string(f).unwrap());
        for path in named_paths(&code) {
            let Some(to) = resolve(&path, &from, &modules) else {
                continue;
            };
            if is_prefix(&to, &from) || is_prefix(&from, &to) {
                continue;
            }
            edges
                .entry(from.clone())
                .or_default()
                .entry(to)
                .or_insert(path);
        }
    }
    edges
}

/// Strongly connected components with more than one module (Tarjan).
fn cycles(edges: &BTreeMap<ModPath, BTreeMap<ModPath, String>>) -> Vec<Vec<ModPath>> {
    struct State<'a> {
        edges: &'a BTreeMap<ModPath, BTreeMap<ModPath, String>>,
        index: BTreeMap<ModPath, usize>,
        low: BTreeMap<ModPath, usize>,
        stack: Vec<ModPath>,
        on_stack: BTreeSet<ModPath>,
        out: Vec<Vec<ModPath>>,
    }
    fn visit(s: &mut State<'_>, v: &ModPath) {
        let i = s.index.len();
        s.index.insert(v.clone(), i);
        s.low.insert(v.clone(), i);
        s.stack.push(v.clone());
        s.on_stack.insert(v.clone());
        let targets: Vec<ModPath> = s
            .edges
            .get(v)
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default();
        for w in targets {
            if !s.index.contains_key(&w) {
                visit(s, &w);
                let lw = s.low[&w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(&w) {
                let iw = s.index[&w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on_stack.remove(&w);
                let done = &w == v;
                component.push(w);
                if done {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn describe(
    krate: &str,
    component: &[ModPath],
    edges: &BTreeMap<ModPath, BTreeMap<ModPath, String>>,
) -> String {
    let name = |m: &ModPath| {
        if m.is_empty() {
            "crate".to_string()
        } else {
            m.join("::")
        }
    };
    let members: BTreeSet<&ModPath> = component.iter().collect();
    let mut lines = vec![format!(
        "{krate}: a cycle between {}",
        component.iter().map(name).collect::<Vec<_>>().join(", ")
    )];
    for from in component {
        for (to, via) in edges.get(from).into_iter().flatten() {
            if members.contains(to) {
                lines.push(format!("  {} -> {} (names `{via}`)", name(from), name(to)));
            }
        }
    }
    lines.join("\n")
}

#[test]
fn no_module_imports_form_a_cycle() {
    let mut problems = Vec::new();
    let mut edge_count = 0;
    for (krate, dir) in CRATES {
        let edges = dependencies(&Path::new(ROOT).join(dir));
        edge_count += edges.values().map(BTreeMap::len).sum::<usize>();
        for component in cycles(&edges) {
            problems.push(describe(krate, &component, &edges));
        }
    }
    assert!(
        edge_count > 100,
        "the scan found only {edge_count} dependencies"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_scan_finds_a_cycle_through_use_trees_and_inline_paths() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\n").unwrap();
    std::fs::write(src.join("a.rs"), "mod inner;\npub(crate) struct A;\n").unwrap();
    std::fs::write(
        src.join("a/inner.rs"),
        "// crate::b is only mentioned here\nuse super::A;\nuse crate::{b::{B, other}};\n",
    )
    .unwrap();
    std::fs::write(
        src.join("b.rs"),
        "pub(crate) struct B;\nfn f() { let _ = \"crate::a\"; crate::a::inner::g(); }\n",
    )
    .unwrap();
    let edges = dependencies(src);
    let found = cycles(&edges);
    assert_eq!(
        found,
        vec![vec![
            vec!["a".to_string(), "inner".to_string()],
            vec!["b".to_string()]
        ]],
        "{edges:?}"
    );
    // Without the inline call there is no cycle (the string and the comment do not count).
    std::fs::write(
        src.join("b.rs"),
        "pub(crate) struct B;\nfn f() { let _ = \"crate::a\"; }\n",
    )
    .unwrap();
    assert!(cycles(&dependencies(src)).is_empty());
}
