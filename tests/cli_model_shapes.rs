//! `agent-r1 init-model --shape` writes real-shaped models that transformers loads: every
//! shape's architecture, sizes and parameter count as transformers reads them, a tokenizer of
//! exactly the model's vocabulary whose chat template (with tools) tokenizes as agent-r1's
//! does, and, for one shape of each architecture family's writer (Qwen2, Llama), the same
//! logits from both for a prompt.
//!
//! The other shapes are checked from the files `init-model` writes besides the weights
//! (`setup::write_shape_files`, which it calls first); transformers builds them from their
//! config on the meta device. Initialising and writing their weights (3 to 3.4 GB each) took
//! most of this test's time and checked nothing the two full shapes do not: the weights'
//! names and layouts per architecture are `model_parity`'s subject.
//!
//! Needs the project venv (`make test` creates it); skipped with a message without it, and a
//! failure under CI. Each shape is written, checked and deleted in turn, in /dev/shm where
//! there is one.

use std::path::Path;
use std::process::{Command, Stdio};

use agent_r1::setup::write_shape_files;
use agent_r1_actors::model::{Placement, PolicyModel};
use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_envs::message::Message;
use serde_json::{json, Value};

#[path = "../actors/tests/support/venv.rs"]
mod venv;

fn transformers_view(python: &Path, dir: &Path, ids: &[u32], logits: bool) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/check_shape.py");
    let mut child = Command::new(python)
        .arg(script)
        .arg(dir)
        .args((!logits).then_some("--config-only"))
        .env("HF_HUB_OFFLINE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(json!({ "ids": ids }).to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "transformers could not load {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A scratch directory in memory where there is one (/dev/shm): the shapes are gigabytes,
/// and on disk their write-back, not the check, would set the test's pace.
fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    match shm.is_dir() {
        true => tempfile::tempdir_in(shm).unwrap_or_else(|_| tempfile::tempdir().unwrap()),
        false => tempfile::tempdir().unwrap(),
    }
}

/// How much of a shape is written and compared.
#[derive(Clone, Copy, PartialEq)]
enum Check {
    /// `agent-r1 init-model`, then logits compared with transformers'.
    Logits,
    /// The files besides the weights; transformers builds the model from its config.
    ConfigOnly,
}

fn check_shape(python: &Path, shape: &str, architecture: &str, check: Check) {
    let tmp = scratch();
    let dir = tmp.path().join(shape);
    let summary = match check {
        Check::Logits => {
            let out = Command::new(env!("CARGO_BIN_EXE_agent-r1"))
                .args(["init-model", "--shape", shape, "--out"])
                .arg(&dir)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "init-model --shape {shape}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            serde_json::from_slice(&out.stdout).unwrap()
        }
        Check::ConfigOnly => {
            let (config, _) =
                write_shape_files(shape, &dir, None, tch::Kind::BFloat16, false).unwrap();
            json!({"parameters": config.num_parameters(), "vocab_size": config.vocab_size})
        }
    };
    let compare_logits = check == Check::Logits;

    let tokenizer = HfTokenizer::from_dir(&dir).unwrap();
    let messages = [
        Message::system("Answer briefly."),
        Message::user("Who wrote Hamlet?"),
    ];
    let tools = [
        json!({"type": "function", "function": {"name": "search", "description": "Search.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                       "required": ["query"]}}}),
    ];
    let prompt = tokenizer
        .encode_chat(&messages, Some(&tools), true)
        .unwrap();
    let ids = &prompt[prompt.len().saturating_sub(24)..];

    let theirs = transformers_view(python, &dir, ids, compare_logits);
    assert_eq!(theirs["architecture"], architecture, "{shape}");
    assert_eq!(theirs["parameters"], summary["parameters"], "{shape}");
    assert_eq!(
        theirs["tokenizer_len"], summary["vocab_size"],
        "{shape}: tokenizer of the model's vocabulary"
    );
    assert_eq!(
        theirs["config"]["vocab_size"], summary["vocab_size"],
        "{shape}"
    );
    let prompt_theirs: Vec<u32> = serde_json::from_value(theirs["prompt_ids"].clone()).unwrap();
    assert_eq!(prompt, prompt_theirs, "{shape}: chat template with tools");

    if compare_logits {
        let model = PolicyModel::load(&dir, Placement::default(), false).unwrap();
        let c = model.config();
        for (key, ours) in [
            ("hidden_size", c.hidden_size),
            ("num_hidden_layers", c.num_hidden_layers),
            ("num_key_value_heads", c.num_key_value_heads),
            ("head_dim", c.head_dim),
        ] {
            assert_eq!(theirs["config"][key], json!(ours), "{shape}: {key}");
        }
        let logits = model.sequence_logits(ids).unwrap();
        let flat: Vec<f32> = theirs["logits"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
            })
            .collect();
        let expected = tch::Tensor::from_slice(&flat).view([ids.len() as i64, -1]);
        let diff = (logits - expected).abs().max().double_value(&[]);
        assert!(diff < 1e-4, "{shape}: logits differ by {diff}");
    }
}

#[test]
fn every_shape_loads_in_transformers() {
    let Some(python) = venv::python_or_skip(&["transformers", "torch"]) else {
        return;
    };
    check_shape(&python, "qwen2.5-0.5b", "Qwen2ForCausalLM", Check::Logits);
    check_shape(&python, "llama3.2-1b", "LlamaForCausalLM", Check::Logits);
    check_shape(&python, "qwen3-1.7b", "Qwen3ForCausalLM", Check::ConfigOnly);
    check_shape(
        &python,
        "qwen2.5-1.5b",
        "Qwen2ForCausalLM",
        Check::ConfigOnly,
    );
    check_shape(&python, "qwen2.5-7b", "Qwen2ForCausalLM", Check::ConfigOnly);
    check_shape(
        &python,
        "llama3.1-8b",
        "LlamaForCausalLM",
        Check::ConfigOnly,
    );
}

#[test]
fn unknown_shapes_and_dtypes_are_refused_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    for (args, needle) in [
        (
            vec!["--shape", "qwen9-1t"],
            "--shape: unknown shape `qwen9-1t` (allowed: qwen2.5-0.5b",
        ),
        (
            vec!["--shape", "qwen2.5-0.5b", "--dtype", "int4"],
            "--dtype: unknown dtype `int4`",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_agent-r1"))
            .arg("init-model")
            .args(&args)
            .arg("--out")
            .arg(tmp.path().join("m"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
}
