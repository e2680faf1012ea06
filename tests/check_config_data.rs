//! `check-config` reads what `train` will read: each mistake a first run on one's own data
//! makes is refused with one line naming the file, the row or key, and what to do (exit
//! code 2), and `train` refuses it the same way before it creates its run directory.

use std::path::Path;
use std::process::{Command, Output};

#[path = "support/own_data.rs"]
mod own_data;

use own_data::{OwnData, BIN};

/// `check-config` and `train` on a config over [`OwnData`].
trait Checks {
    fn check(&self, text: &str) -> Output;
    fn train(&self, text: &str) -> Output;
    fn refused(&self, text: &str, needles: &[&str]) -> String;
}

impl Checks for OwnData {
    /// Writes `text` as the config and runs `check-config` on it.
    fn check(&self, text: &str) -> Output {
        let path = self.path("own.toml");
        std::fs::write(&path, text).unwrap();
        Command::new(BIN)
            .arg("check-config")
            .arg(&path)
            .output()
            .unwrap()
    }

    /// Writes `text` as the config and runs `train` on it.
    fn train(&self, text: &str) -> Output {
        let path = self.path("own.toml");
        std::fs::write(&path, text).unwrap();
        Command::new(BIN)
            .args(["train", "--config"])
            .arg(&path)
            .output()
            .unwrap()
    }

    /// `check-config` and `train` both refuse `text` with exit code 2 and one line that
    /// contains each of `needles`; no run directory is created. Returns the line.
    fn refused(&self, text: &str, needles: &[&str]) -> String {
        let out = self.check(text);
        let line = one_line_error(&out);
        for needle in needles {
            assert!(line.contains(needle), "{needle:?} not in {line}");
        }
        let train_line = one_line_error(&self.train(text));
        assert_eq!(train_line, line, "train and check-config disagree");
        assert!(
            !self.path("run").exists(),
            "train created its run directory for a config it refused"
        );
        line
    }
}

/// The single stderr line of a command that exited with code 2.
fn one_line_error(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    stderr.trim_end().to_string()
}

fn append(path: &Path, row: &str) {
    let mut text = std::fs::read_to_string(path).unwrap();
    text += row;
    std::fs::write(path, text).unwrap();
}

#[test]
fn a_good_config_reports_what_it_read() {
    let own = OwnData::new();
    let out = own.check(&own.config());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("train.jsonl: 8 tasks"), "{stderr}");
    assert!(stderr.contains("test.jsonl: 4 tasks"), "{stderr}");
    assert!(
        stderr.contains("corpus: env.options.corpus") && stderr.contains("12 documents"),
        "{stderr}"
    );
    assert!(
        stderr.contains("longest prompt: ")
            && stderr.contains("limit 640 (rollout.max_prompt_length)"),
        "{stderr}"
    );
    assert!(!stderr.contains("warning"), "{stderr}");
    assert!(!own.path("run").exists());
}

#[test]
fn no_test_files_is_a_warning() {
    let own = OwnData::new();
    let text = own
        .config()
        .lines()
        .filter(|l| !l.starts_with("test_files"))
        .collect::<Vec<_>>()
        .join("\n");
    let out = own.check(&text);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: no held-out tasks (env.test_files is empty)"),
        "{stderr}"
    );
}

#[test]
fn a_row_without_answers_is_named_by_file_and_line() {
    let own = OwnData::new();
    append(
        &own.path("train.jsonl"),
        "{\"question\": \"Where was Zed born?\"}\n",
    );
    own.refused(
        &own.config(),
        &[
            "own.toml: `env.train_files`: ",
            "train.jsonl:9: missing `answers`",
            "env.dataset.on_bad_row = \"skip\"",
        ],
    );
}

#[test]
fn a_misspelt_data_key_is_named_with_its_fix() {
    let own = OwnData::new();
    append(
        &own.path("test.jsonl"),
        "{\"question\": \"Where was Zed born?\", \"anwsers\": [\"Oslo\"]}\n",
    );
    own.refused(
        &own.config(),
        &[
            "`env.test_files`",
            "test.jsonl:5: missing `answers`",
            "the row has `anwsers`: rename it to `answers`",
        ],
    );
}

#[test]
fn a_corpus_that_does_not_exist_is_named_once() {
    let own = OwnData::new();
    let text = own.config().replace("corpus.jsonl", "no-such-corpus.jsonl");
    let line = own.refused(
        &text,
        &["`env.options.corpus`", "no-such-corpus.jsonl: No such file"],
    );
    assert_eq!(line.matches("No such file").count(), 1, "{line}");
}

#[test]
fn a_truncated_corpus_row_is_named_by_line() {
    let own = OwnData::new();
    append(
        &own.path("corpus.jsonl"),
        "{\"id\": \"d9\", \"title\": \"Zed\", \"te",
    );
    own.refused(
        &own.config(),
        &[
            "`env.options.corpus`",
            "corpus.jsonl:13: ",
            "\"title\", \"text\"",
        ],
    );
}

#[test]
fn a_model_directory_without_its_tokenizer_is_refused() {
    let own = OwnData::new();
    std::fs::remove_file(own.path("model").join("tokenizer.json")).unwrap();
    own.refused(
        &own.config(),
        &["`model.dir`", "tokenizer.json: file not found"],
    );
}

#[test]
fn a_prompt_over_max_prompt_length_is_refused_with_the_length_needed() {
    let own = OwnData::new();
    let text = own
        .config()
        .replace("max_prompt_length = 640", "max_prompt_length = 100");
    let line = own.refused(
        &text,
        &[
            "`rollout.max_prompt_length`: the longest prompt (task ",
            "over 100",
            "raise rollout.max_prompt_length to at least ",
        ],
    );
    // The length it names is the one the run would see: that limit passes.
    let needed: usize = line
        .rsplit("at least ")
        .next()
        .and_then(|s| s.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    let text = own.config().replace(
        "max_prompt_length = 640",
        &format!("max_prompt_length = {needed}"),
    );
    let out = own.check(&text);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = own.config().replace(
        "max_prompt_length = 640",
        &format!("max_prompt_length = {}", needed - 1),
    );
    one_line_error(&own.check(&text));
}

/// The asymmetric critic's prefix: a field the tasks lack, and a rendering over its token
/// budget, are each one line naming the key and the task; a good one is reported with its
/// longest length.
#[test]
fn a_critic_prefix_naming_a_missing_field_or_over_its_budget_is_refused() {
    let own = OwnData::new();
    let with = |critic: &str| {
        own.config()
            .replace("estimator = \"grpo\"", "estimator = \"gae\"")
            + &format!("\n[critic]\nseparate = true\n{critic}\n")
    };
    own.refused(
        &with("prefix = \"Reference: {extra.reference}\""),
        &[
            "`critic.prefix`: task ",
            "`{extra.reference}`: the task's extra has no `reference`",
        ],
    );
    own.refused(
        &with("prefix = \"Gold: {answers} {question}\"\nprefix_max_tokens = 3"),
        &[
            "`critic.prefix_max_tokens`: task ",
            "over critic.prefix_max_tokens = 3",
        ],
    );
    own.refused(
        &with("prefix = \"Gold: {answr}\""),
        &["`critic.prefix`: unknown field `{answr}`"],
    );
    let out = own.check(&with("prefix = \"Gold answer: {answer}\\n\""));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("critic prefix: the longest is ") && stderr.contains("budget 256"),
        "{stderr}"
    );
}

/// Copies the model directory `from` to `to`, file by file.
fn copy_model(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// Rewrites the JSON file `path` with `edit`.
fn edit_json(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut value);
    std::fs::write(path, value.to_string()).unwrap();
}

#[test]
fn a_teacher_that_cannot_score_the_policys_tokens_is_refused() {
    let own = OwnData::new();
    let with = |distill: &str| own.config() + &format!("\n[distill]\n{distill}\n");
    let teacher = |name: &str| format!("teacher = {:?}", own.path(name).display().to_string());
    // A copy of the policy is a teacher that shares its tokenizer: accepted, and the plan
    // counts it.
    copy_model(&own.path("model"), &own.path("same"));
    let out = own.check(&with(&teacher("same")));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("teacher weights"), "{stderr}");

    // Another tokenizer: one vocabulary entry spelt differently.
    copy_model(&own.path("model"), &own.path("other"));
    edit_json(&own.path("other/tokenizer.json"), |t| {
        let vocab = t["model"]["vocab"].as_object_mut().unwrap();
        let (key, id) = vocab
            .iter()
            .next_back()
            .map(|(k, v)| (k.clone(), v.clone()))
            .unwrap();
        vocab.remove(&key);
        vocab.insert(format!("{key}_other"), id);
    });
    own.refused(
        &with(&teacher("other")),
        &[
            "`distill.teacher`",
            "the teacher's tokenizer is not the policy's",
        ],
    );
    // Fewer embedding rows than the tokenizer's ids.
    copy_model(&own.path("model"), &own.path("small"));
    edit_json(&own.path("small/config.json"), |c| {
        c["vocab_size"] = 8.into()
    });
    own.refused(
        &with(&teacher("small")),
        &["`distill.teacher`", "vocab_size is 8", "cannot score them"],
    );
    // No tokenizer to compare.
    copy_model(&own.path("model"), &own.path("bare"));
    std::fs::remove_file(own.path("bare/tokenizer.json")).unwrap();
    own.refused(
        &with(&teacher("bare")),
        &["`distill.teacher`", "no tokenizer.json"],
    );
    // Not a model directory, no teacher at all, a coefficient out of range.
    own.refused(
        &with(&teacher("missing")),
        &["`distill.teacher`", "no config.json there"],
    );
    own.refused(
        &with("coef = 0.5"),
        &["`distill`", "missing field `teacher`"],
    );
    own.refused(
        &with(&format!("{}\ncoef = 0", teacher("same"))),
        &["`distill.coef`", "got 0"],
    );
}

/// `bench demo` refuses flags it cannot run with one line (exit code 2) before any run
/// starts: no seeds, a preset that does not exist, an `--out` it cannot write into.
#[test]
fn bench_demo_refuses_bad_flags_before_it_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let bench = |args: &[&str]| {
        Command::new(BIN)
            .args(["bench", "demo"])
            .args(args)
            .output()
            .unwrap()
    };
    let line = one_line_error(&bench(&["--seeds", "0"]));
    assert!(line.contains("--seeds must be at least 1"), "{line}");
    let line = one_line_error(&bench(&["--preset", "dmeo"]));
    assert!(
        line.contains("`dmeo`") && line.contains("demo, math"),
        "{line}"
    );
    // A directory under a regular file can be neither created nor written, even as root.
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let out = file.join("runs");
    let line = one_line_error(&bench(&["--out", out.to_str().unwrap()]));
    assert!(
        line.contains("--out") && line.contains("cannot create"),
        "{line}"
    );
}

/// `rollout.tool_schemas_in_prompt = false` leaves the tools' JSON schemas out of the chat
/// template: `check-config`'s longest prompt is shorter by the schema block, and the prompts
/// a `train` run samples from carry the system prompt without it.
#[test]
fn tool_schemas_can_be_left_out_of_the_prompt() {
    let own = OwnData::new();
    let system = "Search with <tool_call>, answer in <answer>.";
    let without = own
        .config()
        .replace("[rollout]\n", "[rollout]\ntool_schemas_in_prompt = false\n");
    let without = without.replace(
        "reward = \"agent_r1_qa\"\n",
        &format!("reward = \"agent_r1_qa\"\nsystem_prompt = \"{system}\"\n"),
    );
    let with = without.replace("tool_schemas_in_prompt = false\n", "");
    let longest = |text: &str| -> usize {
        let out = own.check(text);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        let rest = stderr.split("longest prompt: ").nth(1).expect(&stderr);
        rest.split(' ').next().unwrap().parse().expect(&stderr)
    };
    let (shown, left_out) = (longest(&with), longest(&without));
    assert!(
        left_out + 100 < shown,
        "the schema block is over 100 tokens: {shown} with it, {left_out} without"
    );

    let out = own.train(&without);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rollouts =
        std::fs::read_to_string(own.path("run/rollouts/train-step-000001.jsonl")).unwrap();
    let mut episodes = 0;
    for line in rollouts.lines() {
        let episode: serde_json::Value = serde_json::from_str(line).unwrap();
        let prompt = episode["prompt_text"].as_str().unwrap();
        assert!(prompt.contains(system), "{prompt}");
        assert!(
            !prompt.contains("<tools>") && !prompt.contains("# Tools"),
            "{prompt}"
        );
        episodes += 1;
    }
    assert_eq!(episodes, 4, "batch_size 2 x group_size 2");
}
