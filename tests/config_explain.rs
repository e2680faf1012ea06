//! One definition per key: `check-config --explain` lists every key the shipped configs use,
//! its documented defaults are the defaults, and every probe of docs/training.md's table of bad
//! values is one line naming the key, the value and what is allowed, with exit code 2, from
//! `check-config` and from `train` before it creates anything.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use agent_r1::config::TrainConfig;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn agent_r1(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agent-r1"))
        .args(args)
        .current_dir(ROOT)
        .output()
        .unwrap()
}

fn explain() -> Vec<String> {
    let out = agent_r1(&["check-config", "--explain"]);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// `key = default  # type; allowed; meaning` -> (key, default).
fn split(line: &str) -> (&str, Option<&str>) {
    let (assignment, doc) = line
        .split_once("  # ")
        .unwrap_or_else(|| panic!("no `  # ` in {line:?}"));
    let parts: Vec<&str> = doc.splitn(3, "; ").collect();
    assert!(
        parts.len() == 3 && parts.iter().all(|p| !p.trim().is_empty()),
        "type, allowed and meaning in {line:?}"
    );
    match assignment.split_once(" = ") {
        Some((key, default)) => (key, Some(default)),
        None => (assignment, None),
    }
}

/// Leaf key paths of a TOML table; free-form tables (the scorer, template variables) count
/// as one key, as `--explain` lists them, and an empty tool table as `tools.NAME`.
fn leaves(table: &toml::Table, prefix: &str, keys: &BTreeSet<String>, out: &mut BTreeSet<String>) {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        let free_form = ["scorer", "model.chat_template_kwargs"].contains(&key.as_str());
        match v {
            toml::Value::Table(t) if prefix == "tools" && t.is_empty() => {
                out.insert("tools.NAME".into());
            }
            // A listed key that takes a table (`env.options.corpus`) is one key.
            toml::Value::Table(t) if !free_form && !keys.contains(&key) => {
                leaves(t, &key, keys, out)
            }
            _ => {
                out.insert(key);
            }
        }
    }
}

#[test]
fn explain_covers_every_key_of_the_examples_and_its_defaults_are_the_defaults() {
    let lines = explain();
    let keys: BTreeSet<String> = lines.iter().map(|l| split(l).0.to_string()).collect();
    assert!(keys.len() > 100, "{} keys", keys.len());
    for described in [
        "tools.python.timeout_secs",
        "tools.search.top_k",
        "env.options.tolerance",
        "env.options.problems.n_problems",
        "env.options.process_reward.success",
    ] {
        assert!(keys.contains(described), "{described} not in --explain");
    }

    let mut examples = 0;
    for entry in std::fs::read_dir(Path::new(ROOT).join("examples")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        examples += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        let mut used = BTreeSet::new();
        leaves(&text.parse::<toml::Table>().unwrap(), "", &keys, &mut used);
        // A tool kind that describes its options has each of them listed as
        // `tools.KIND.KEY`; one that does not is `tools.NAME`, a table of the kind's options.
        let described = |tool: &str| {
            keys.iter()
                .any(|k| k.starts_with(&format!("tools.{tool}.")))
        };
        let missing: Vec<&String> = used
            .iter()
            .filter(|k| !keys.contains(*k))
            .filter(
                |k| match k.strip_prefix("tools.").and_then(|t| t.split_once('.')) {
                    Some((tool, _)) => described(tool),
                    None => true,
                },
            )
            .collect();
        assert!(
            missing.is_empty(),
            "{}: not in --explain: {missing:?}",
            path.display()
        );
        // And the file reads back from its resolved form unchanged.
        let config = TrainConfig::from_toml_str(&text).unwrap();
        let again = TrainConfig::from_toml_str(&config.to_toml_string()).unwrap();
        assert_eq!(again, config, "{}", path.display());
    }
    assert!(examples >= 6);

    // Every documented default, written back as a config, is the config of no settings (with
    // the optional sections present, since their keys are listed; `[distill]` with the
    // teacher it requires).
    let mut documented =
        String::from("model.preset = \"tiny\"\nenv.name = \"synthetic_multihop\"\n");
    for line in &lines {
        if let (key, Some(default)) = split(line) {
            // A tool's, an env's or a workflow's option defaults are its own (several share a key).
            if key.starts_with("tools.")
                || key.starts_with("env.options.")
                || key.starts_with("env.workflow.")
            {
                continue;
            }
            documented.push_str(&format!("{key} = {default}\n"));
        }
    }
    documented.push_str("distill.teacher = \"teacher\"\n");
    let from_docs =
        TrainConfig::from_toml_str(&documented).unwrap_or_else(|e| panic!("{e}\n{documented}"));
    let plain = TrainConfig::from_toml_str(
        "[model]\npreset = \"tiny\"\n[env]\nname = \"synthetic_multihop\"\n[env.world]\n[warm_start.bad_habit]\n\
         [distill]\nteacher = \"teacher\"\n[lora]\n[critic.lora]\n",
    )
    .unwrap();
    assert_eq!(from_docs, plain);
}

/// The table of probes in docs/training.md ("Config errors").
const PROBES: &[(&str, &str, &str, &str)] = &[
    // (what, the config's bad lines, the key named, what else the line must say)
    (
        "misspelt key",
        "[algorithm]\nppo_epoch = 2",
        "`algorithm.ppo_epoch`",
        "`ppo_epochs`",
    ),
    (
        "out of range",
        "[algorithm]\ngamma = 1.5",
        "`algorithm.gamma`",
        "got 1.5; allowed: a finite number in [0, 1]",
    ),
    (
        "wrong type",
        "[rollout]\nbatch_size = \"64\"",
        "`rollout.batch_size`",
        "invalid type: string \"64\", expected usize",
    ),
    (
        "unknown enum value",
        "[algorithm]\nloss_agg = \"mean\"",
        "`algorithm.loss_agg`",
        "expected one of `token-mean`",
    ),
    (
        "unknown tool",
        "[tools.serach]",
        "`tools.serach`",
        "allowed: calculator, mcp, python, search",
    ),
    (
        "bad tool option",
        "[tools.python]\ntimeout_sec = 5",
        "`tools.python.timeout_sec`",
        "expected one of `python`, `timeout_secs`",
    ),
    (
        "infinite timeout",
        "[tools.python]\ntimeout_secs = inf",
        "`tools.python.timeout_secs`",
        "got inf; allowed: a finite number",
    ),
    (
        "huge timeout",
        "[rollout]\ngenerate_timeout_secs = 1e30",
        "`rollout.generate_timeout_secs`",
        "got 1e30; allowed: a finite number in (0, 604800]",
    ),
    (
        "zero memory",
        "[tools.python]\nmemory_mib = 0",
        "`tools.python.memory_mib`",
        "got 0; allowed: an integer >= 1",
    ),
    (
        "zero logits chunk",
        "[learner]\nlogits_chunk_tokens = 0",
        "`learner.logits_chunk_tokens`",
        "got 0; allowed: an integer >= 1",
    ),
];

#[test]
fn every_probe_is_one_line_with_key_value_and_allowed_and_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    for (what, lines, key, says) in PROBES {
        let run_dir = dir.path().join("run");
        let file = dir.path().join("probe.toml");
        std::fs::write(
            &file,
            format!(
                "[model]\npreset = \"tiny\"\ndevice = \"cpu\"\n[env]\nname = \"synthetic_multihop\"\n\
                 [training]\nrun_dir = {:?}\n[metrics]\nenabled = false\n{lines}\n",
                run_dir.to_str().unwrap()
            ),
        )
        .unwrap();
        let file = file.to_str().unwrap();
        for args in [
            &["check-config", file][..],
            &["train", "--config", file][..],
        ] {
            let out = agent_r1(args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{what}: {args:?}: {stderr}");
            assert_eq!(stderr.lines().count(), 1, "{what}: {args:?}: {stderr}");
            assert!(
                stderr.contains(key) && stderr.contains(says),
                "{what}: {args:?}: want {key} and {says:?} in {stderr}"
            );
            assert!(
                !run_dir.exists(),
                "{what}: {args:?} created the run directory"
            );
        }
    }
}
