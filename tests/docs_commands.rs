//! Every `agent-r1` command in the README and the guides under `docs/` matches the command
//! line: a concrete command (one a user can paste) parses as `agent-r1` would parse it and
//! the example configs it names exist; a synopsis (`[--flag]`, `a|b`, `...`) names a real
//! subcommand and only flags that subcommand has. Commands are read from fenced code blocks.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn documentation() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut files = vec![root().join("README.md")];
    walk(&root().join("docs"), &mut files);
    files
}

/// A command found in the documentation: where, and its text (continuation lines joined).
struct Found {
    at: String,
    text: String,
}

/// The `agent-r1 ...` lines of `text`'s fenced code blocks.
fn commands(path: &Path, text: &str) -> Vec<Found> {
    let mut found = Vec::new();
    let mut fenced = false;
    let mut lines = text.lines().enumerate();
    while let Some((i, line)) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            continue;
        }
        let mut command = trimmed.to_string();
        while command.ends_with('\\') {
            command.pop();
            match lines.next() {
                Some((_, next)) => command.push_str(next.trim()),
                None => break,
            }
        }
        if invocation(&command).is_some() {
            found.push(Found {
                at: format!("{}:{}", path.strip_prefix(root()).unwrap().display(), i + 1),
                text: command,
            });
        }
    }
    found
}

/// The arguments after `agent-r1` (or `./target/release/agent-r1`, or `cargo run --release
/// --`), with environment assignments before it, a trailing comment and anything after a
/// pipe, redirection or `&&` left out. `None` for a line that runs something else.
fn invocation(line: &str) -> Option<Vec<String>> {
    let code = strip_comment(line);
    let words = shlex::split(&code)?;
    let mut words = words.into_iter().skip_while(|w| is_assignment(w));
    let first = words.next()?;
    let rest: Vec<String> = match first.as_str() {
        "agent-r1" | "./target/release/agent-r1" | "target/release/agent-r1" => words.collect(),
        "cargo" => {
            let all: Vec<String> = words.collect();
            let dashes = all.iter().position(|w| w == "--")?;
            if all.first().map(String::as_str) != Some("run") {
                return None;
            }
            all[dashes + 1..].to_vec()
        }
        _ => return None,
    };
    let end = rest
        .iter()
        .position(|w| {
            matches!(
                w.as_str(),
                "|" | "&&" | "||" | ";" | ">" | ">>" | "2>&1" | "&"
            )
        })
        .unwrap_or(rest.len());
    let args = rest[..end].to_vec();
    // Prose that starts with the name ("agent-r1 trains ...") is not a command.
    let subcommand = args.first()?;
    agent_r1::cli::definition().find_subcommand(subcommand)?;
    Some(args)
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    })
}

/// `line` up to a `#` that starts a shell comment (outside quotes, after a blank).
fn strip_comment(line: &str) -> String {
    let (mut single, mut double, mut previous) = (false, false, ' ');
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && previous.is_whitespace() => return line[..i].to_string(),
            _ => {}
        }
        previous = c;
    }
    line.to_string()
}

/// A synopsis shows the choices rather than one command.
fn is_synopsis(text: &str) -> bool {
    let code = strip_comment(text);
    code.contains('[') || code.contains("...") || code.contains('|')
}

/// The subcommand `args` name (nested ones such as `tool call` included) and the words
/// after it.
fn subcommand(args: &[String]) -> Result<(clap::Command, Vec<String>), String> {
    let mut command = agent_r1::cli::definition();
    let mut rest = args;
    while let Some(name) = rest.first() {
        match command.find_subcommand(name) {
            Some(sub) => {
                command = sub.clone();
                rest = &rest[1..];
            }
            // `bench ...`: any of the subcommands.
            None if name == "..." => break,
            None if command.has_subcommands() && !name.starts_with('-') => {
                return Err(format!(
                    "`{name}` is not a subcommand of `{}`",
                    command.get_name()
                ))
            }
            None => break,
        }
    }
    Ok((command, rest.to_vec()))
}

/// The `--flags` of a synopsis that its subcommand does not have.
fn unknown_flags(args: &[String]) -> Result<Vec<String>, String> {
    let (command, rest) = subcommand(args)?;
    let known: Vec<String> = command
        .get_arguments()
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .chain(["--help".to_string(), "--version".to_string()])
        .collect();
    Ok(rest
        .iter()
        .flat_map(|w| w.split('|'))
        .map(|w| w.trim_matches(|c| c == '[' || c == ']'))
        .filter(|w| w.starts_with("--"))
        .map(|w| w.split('=').next().unwrap().to_string())
        .filter(|w| !known.contains(w))
        .collect())
}

/// The example files a concrete command names that do not exist.
fn missing_examples(args: &[String]) -> Vec<String> {
    args.iter()
        .filter(|w| w.starts_with("examples/") && !w.contains('*'))
        .filter(|w| !root().join(w).exists())
        .cloned()
        .collect()
}

#[test]
fn every_documented_command_matches_the_command_line() {
    let mut problems = Vec::new();
    let (mut concrete, mut synopses) = (0, 0);
    for path in documentation() {
        let text = std::fs::read_to_string(&path).unwrap();
        for found in commands(&path, &text) {
            let args = invocation(&found.text).unwrap();
            if is_synopsis(&found.text) {
                synopses += 1;
                match unknown_flags(&args) {
                    Ok(unknown) if unknown.is_empty() => {}
                    Ok(unknown) => problems.push(format!(
                        "{}: `{}`: no such flag {}",
                        found.at,
                        found.text,
                        unknown.join(", ")
                    )),
                    Err(e) => problems.push(format!("{}: `{}`: {e}", found.at, found.text)),
                }
                continue;
            }
            concrete += 1;
            let argv = std::iter::once("agent-r1".to_string()).chain(args.iter().cloned());
            if let Err(e) = agent_r1::cli::definition().try_get_matches_from(argv) {
                let first = e.to_string().lines().next().unwrap_or_default().to_string();
                problems.push(format!("{}: `{}`: {first}", found.at, found.text));
            }
            for missing in missing_examples(&args) {
                problems.push(format!(
                    "{}: `{}`: {missing} does not exist",
                    found.at, found.text
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The reading found the documentation's commands (a broken reader finds none).
    assert!(
        concrete >= 20 && synopses >= 10,
        "{concrete} commands, {synopses} synopses"
    );
    eprintln!("{concrete} commands and {synopses} synopses match the command line");
}

#[test]
fn the_checks_catch_a_wrong_flag_a_wrong_subcommand_and_a_missing_example() {
    let args = |line: &str| invocation(line).expect(line);
    let argv = |line: &str| std::iter::once("agent-r1".to_string()).chain(args(line));
    let parses = |line: &str| {
        agent_r1::cli::definition()
            .try_get_matches_from(argv(line))
            .is_ok()
    };
    assert!(parses(
        "agent-r1 train --config examples/demo.toml --out runs/x"
    ));
    assert!(!parses("agent-r1 train --confg examples/demo.toml"));
    assert!(parses(
        "MKL_CBWR=AUTO cargo run --release -- eval --model runs/x --json | jq ."
    ));
    assert!(invocation("agent-r1 trains on environments written in Python").is_none());
    assert_eq!(
        unknown_flags(&args("agent-r1 eval --model DIR [--jsn]")).unwrap(),
        ["--jsn"]
    );
    assert!(
        unknown_flags(&args("agent-r1 tool call NAME [--args JSON] [--spec]"))
            .unwrap()
            .is_empty()
    );
    assert!(subcommand(&args("agent-r1 tool cal NAME")).is_err());
    assert_eq!(
        missing_examples(&args("agent-r1 train --config examples/no_such.toml")),
        ["examples/no_such.toml"]
    );
    assert!(missing_examples(&args("agent-r1 train --config examples/demo.toml")).is_empty());
}

#[test]
fn trains_usage_line_shows_the_users_flags_and_no_fault_injection() {
    let mut command = agent_r1::cli::definition();
    let train = command.find_subcommand_mut("train").unwrap();
    let usage = train.render_usage().to_string();
    assert!(
        usage.contains("--config") && usage.contains("--preset"),
        "{usage}"
    );
    assert!(
        !usage.contains("inject") && !usage.contains("delay"),
        "{usage}"
    );
    let parse = |args: &[&str]| {
        let argv = std::iter::once("agent-r1").chain(args.iter().copied());
        agent_r1::cli::definition().try_get_matches_from(argv)
    };
    assert!(parse(&["train", "--config", "examples/demo.toml"]).is_ok());
    assert!(parse(&["train", "--preset", "demo", "--out", "runs/x"]).is_ok());
    // One of --config and --preset, as before.
    assert!(parse(&["train", "--out", "runs/x"]).is_err());
    assert!(parse(&["train", "--config", "a.toml", "--preset", "demo"]).is_err());
}
