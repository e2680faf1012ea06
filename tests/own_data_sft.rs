//! The own-data path end to end, as docs/own-data.md walks it: a model directory as
//! transformers writes one (`save_pretrained`), questions and a corpus written here, `sft` on
//! a handful of chat-format demonstrations written here, then `train` from the supervised
//! model and `eval` of its checkpoint. A fresh tiny model never calls a tool; after `sft` it
//! does.

use std::process::{Command, Output};

use serde_json::{json, Value};

#[path = "support/own_data.rs"]
mod own_data;
#[path = "../actors/tests/support/venv.rs"]
mod venv;

use own_data::{OwnData, BIN, FACTS};

/// Demonstrations as a user has them: OpenAI chat messages, the call in `tool_calls`, the
/// search result in a `tool` message (as `agent-r1 tool call search` prints it).
fn write_demonstrations(own: &OwnData, how_many: usize) -> std::path::PathBuf {
    let rows: String = FACTS[..how_many]
        .iter()
        .map(|(person, city)| {
            let row = json!({"messages": [
                {"role": "user", "content": format!("Question: Where was {person} born?")},
                {"role": "assistant", "content": "<think>Search.</think>", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {
                        "name": "search",
                        "arguments": json!({"query": person}).to_string()}}]},
                {"role": "tool", "tool_call_id": "c1",
                 "content": format!("Doc 1 (Title: {person}) {person} was born in {city}.")},
                {"role": "assistant",
                 "content": format!("<think>Found.</think>\n<answer>{city}</answer>")}
            ]});
            format!("{row}\n")
        })
        .collect();
    let path = own.path("demos.jsonl");
    std::fs::write(&path, rows).unwrap();
    path
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn stdout_json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or("");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Greedy `eval` of `model` on the training questions.
fn eval(config: &str, model: &str) -> Value {
    stdout_json(&run(&[
        "eval", "--model", model, "--config", config, "--split", "train", "--json",
    ]))
}

#[test]
fn sft_on_own_demonstrations_teaches_the_tool_then_train_and_eval_run() {
    let own = OwnData::new();
    own.resave_model_with_transformers(&venv::python_required(&["transformers"]));
    let config = own.path("own.toml");
    std::fs::write(&config, own.config()).unwrap();
    let config = config.to_str().unwrap();
    let base = own.path("model");
    assert!(
        base.join("chat_template.jinja").is_file(),
        "transformers writes the chat template beside tokenizer_config.json"
    );
    let before = eval(config, base.to_str().unwrap());
    assert_eq!(before["tool_calls_per_episode"], 0.0, "{before}");

    let demos = write_demonstrations(&own, 6);
    let sft = own.path("sft");
    let report = stdout_json(&run(&[
        "sft",
        "--config",
        config,
        "--data",
        demos.to_str().unwrap(),
        "--out",
        sft.to_str().unwrap(),
        "--steps",
        "80",
    ]));
    assert_eq!(report["conversations"], 6, "{report}");
    assert!(
        report["last_loss"].as_f64().unwrap() < report["first_loss"].as_f64().unwrap() / 4.0,
        "{report}"
    );
    let after = eval(config, sft.to_str().unwrap());
    assert!(
        after["tool_calls_per_episode"].as_f64().unwrap() >= 0.75,
        "after sft the model calls the search tool: {after}"
    );

    // RL from the supervised model, then eval of the run's checkpoint.
    let rl = own
        .config()
        .replace(
            &format!("dir = \"{}\"", base.display()),
            &format!("dir = \"{}\"", sft.display()),
        )
        .replace("updates = 1", "updates = 2");
    let rl_config = own.path("rl.toml");
    std::fs::write(&rl_config, rl).unwrap();
    let out = run(&["train", "--config", rl_config.to_str().unwrap()]);
    let summary = stdout_json(&out);
    assert_eq!(summary["updates"], 2, "{summary}");
    let run_dir = own.path("run");
    let trained = eval(config, run_dir.to_str().unwrap());
    assert_eq!(trained["episodes"], 8, "{trained}");
    assert!(
        trained["tool_calls_per_episode"].as_f64().unwrap() > 0.0,
        "{trained}"
    );
}

/// The single stderr line of a command that exited with code 2.
fn refused(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
}

#[test]
fn sft_refuses_what_it_cannot_train_on_with_one_line() {
    let own = OwnData::new();
    let config = own.path("own.toml");
    std::fs::write(&config, own.config()).unwrap();
    let config = config.to_str().unwrap();
    let out_dir = own.path("sft");
    let out = out_dir.to_str().unwrap();
    let sft = |data: &str, extra: &[&str]| {
        let path = own.path("demos.jsonl");
        std::fs::write(&path, data).unwrap();
        let mut args = vec!["sft", "--config", config, "--data", path.to_str().unwrap()];
        args.extend_from_slice(extra);
        run(&args)
    };
    let user_only = "{\"messages\": [{\"role\": \"user\", \"content\": \"Q\"}]}\n";
    refused(
        &sft(user_only, &["--out", out]),
        "demos.jsonl:1: no assistant message",
    );
    let unknown_tool = "{\"messages\": [{\"role\": \"user\", \"content\": \"Q\"}, \
        {\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"lookup\", \
        \"arguments\": \"{}\"}}]}]}\n";
    refused(
        &sft(unknown_tool, &["--out", out]),
        "messages[1].tool_calls[0]: calls `lookup`, which the run does not define (its tools: search)",
    );
    let two_calls = "{\"messages\": [{\"role\": \"user\", \"content\": \"Q\"}, \
        {\"role\": \"assistant\", \"tool_calls\": [\
        {\"function\": {\"name\": \"search\", \"arguments\": {\"query\": \"a\"}}}, \
        {\"function\": {\"name\": \"search\", \"arguments\": {\"query\": \"b\"}}}]}]}\n";
    refused(
        &sft(two_calls, &["--out", out]),
        "2 calls in one turn, but a turn may make 1 (env.max_tool_calls_per_turn)",
    );
    let good = "{\"messages\": [{\"role\": \"user\", \"content\": \"Q\"}, \
        {\"role\": \"assistant\", \"content\": \"<answer>A</answer>\"}]}\n";
    refused(
        &sft(good, &["--out", out, "--steps", "0"]),
        "--steps: got 0",
    );
    // A file where the output directory would go.
    let blocked = own.path("train.jsonl").join("sft");
    refused(
        &sft(good, &["--out", blocked.to_str().unwrap()]),
        "cannot create the directory",
    );
    assert!(!out_dir.join("model.safetensors").exists());
}

/// `examples/my_data.toml` with its files, as `docs/own-data.md` walks through it: it checks,
/// and its demonstrations train.
#[test]
fn the_my_data_example_checks_and_its_demonstrations_train() {
    let root = env!("CARGO_MANIFEST_DIR");
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("my-model");
    let out = run(&["init-model", "--out", model.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(format!("{root}/examples/my_data.toml"))
        .unwrap()
        .replace("runs/my-model", model.to_str().unwrap())
        .replace("runs/my-data", tmp.path().join("run").to_str().unwrap());
    let config = tmp.path().join("my_data.toml");
    std::fs::write(&config, text).unwrap();
    let in_root = |args: &[&str]| {
        Command::new(BIN)
            .args(args)
            .current_dir(root)
            .output()
            .unwrap()
    };
    let out = in_root(&["check-config", config.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for line in [
        "data: env.train_files examples/my_data/train.jsonl: 12 tasks",
        "data: env.test_files examples/my_data/test.jsonl: 4 tasks",
        "corpus: env.options.corpus examples/my_data/corpus.jsonl: 16 documents",
    ] {
        assert!(stderr.contains(line), "{line:?} not in {stderr}");
    }
    // The tool result the demonstrations show is what the run's search tool returns.
    let out = in_root(&[
        "tool",
        "call",
        "search",
        "--args",
        "{\"query\": \"Ada\"}",
        "--config",
        config.to_str().unwrap(),
    ]);
    let observation = String::from_utf8_lossy(&out.stdout);
    assert!(
        observation.starts_with("Doc 1 (Title: Ada) Ada was born in Oslo."),
        "{observation} {out:?}"
    );
    let demos = std::fs::read_to_string(format!("{root}/examples/my_data/demos.jsonl")).unwrap();
    assert!(demos.contains("Doc 1 (Title: Ada) Ada was born in Oslo."));
    let sft = tmp.path().join("sft");
    let report = stdout_json(&in_root(&[
        "sft",
        "--config",
        config.to_str().unwrap(),
        "--data",
        "examples/my_data/demos.jsonl",
        "--out",
        sft.to_str().unwrap(),
        "--steps",
        "4",
    ]));
    assert_eq!(report["conversations"], 6, "{report}");
    assert!(sft.join("tokenizer.json").is_file() && sft.join("config.json").is_file());
}

/// `[warm_start] data`: `train` itself runs the supervised steps on the user's
/// demonstrations before RL, for an env that makes none (here `multihop_qa`).
#[test]
fn train_warm_starts_on_the_configured_demonstrations() {
    let own = OwnData::new();
    let demos = write_demonstrations(&own, 6);
    let text = own.config().replace("updates = 1", "updates = 1\n")
        + &format!(
            "\n[warm_start]\nsteps = 80\nlearning_rate = 1e-3\nfinal_lr_fraction = 1.0\ndata = \"{}\"\n",
            demos.display()
        );
    let config = own.path("warm.toml");
    std::fs::write(&config, text).unwrap();
    let out = run(&["train", "--config", config.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let summary = stdout_json(&out);
    assert!(
        stderr.contains("warm start: 80 steps on 6 demonstrations of"),
        "{stderr}"
    );
    assert_eq!(summary["warm_start"]["demonstrations"], 6, "{summary}");
    let run_dir = own.path("run");
    assert!(run_dir.join("model-sft").join("config.json").is_file());
    // Held-out questions before any RL update: the warm-started policy calls the tool.
    assert!(
        summary["tool_calls_before"].as_f64().unwrap() >= 0.75,
        "{summary}"
    );

    // A data file with a conversation the run cannot train on is refused before the run.
    std::fs::write(
        &demos,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Q\"}]}\n",
    )
    .unwrap();
    std::fs::remove_dir_all(&run_dir).unwrap();
    let out = run(&["train", "--config", config.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("warm_start.data")
            && stderr.contains("demos.jsonl:1: no assistant message"),
        "{stderr}"
    );
}
