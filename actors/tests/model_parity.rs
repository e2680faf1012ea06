//! Numerical parity with Hugging Face `transformers` on tiny random Qwen2 and Llama
//! checkpoints made in Python: float32 logits within 1e-4, greedy generation of 32 tokens
//! identical (alone and in a left-padded batch), and checkpoints saved by agent-r1 loading in
//! `transformers` with the same logits.
//!
//! Needs the project venv (`make test` creates it). Without it the test fails under CI and is
//! skipped with a message elsewhere.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use agent_r1_actors::model::{ModelConfig, Placement, PolicyModel, SamplingParams};
use serde_json::Value;

fn venv_python() -> Option<PathBuf> {
    let venv = std::env::var_os("AGENT_R1_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv"));
    let python = venv.join("bin/python");
    let ok = Command::new(&python)
        .args(["-c", "import transformers, torch"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok {
        Some(python)
    } else if std::env::var_os("CI").is_some() {
        panic!(
            "{} with transformers is required under CI (run `make test`)",
            python.display()
        );
    } else {
        eprintln!(
            "SKIPPED: no transformers in {} (run `make venv`)",
            python.display()
        );
        None
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/model_reference.py")
}

fn reference(python: &Path, dir: &Path, arch: &str) -> Value {
    let out = Command::new(python)
        .arg(script())
        .args(["make", dir.to_str().unwrap(), arch])
        .stderr(Stdio::inherit())
        .output()
        .expect("run model_reference.py");
    assert!(out.status.success(), "model_reference.py make failed");
    serde_json::from_slice(&out.stdout).expect("reference JSON")
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn max_abs_diff(logits: &tch::Tensor, reference: &Value) -> f64 {
    let rows = reference.as_array().unwrap();
    let flat: Vec<f32> = rows
        .iter()
        .flat_map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
        })
        .collect();
    let expected = tch::Tensor::from_slice(&flat).view([rows.len() as i64, -1]);
    assert_eq!(logits.size(), expected.size(), "logits shape");
    (logits - expected).abs().max().double_value(&[])
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_new_tokens: n,
        ..Default::default()
    }
}

fn check_arch(arch: &str) {
    let Some(python) = venv_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(arch);
    let r = reference(&python, &dir, arch);
    let model = PolicyModel::load(&dir, Placement::default(), false).unwrap();

    let ids = ids_of(&r["ids"]);
    let logits = model.sequence_logits(&ids).unwrap();
    let diff = max_abs_diff(&logits, &r["logits"]);
    println!("{arch}: max |logit diff| = {diff:.3e}");
    assert!(diff < 1e-4, "{arch}: logits differ by {diff}");

    let gen = model
        .generate(std::slice::from_ref(&ids), &greedy(32))
        .unwrap();
    assert_eq!(
        gen[0].token_ids,
        ids_of(&r["greedy"]),
        "{arch}: greedy generation"
    );
    assert_eq!(gen[0].logprobs.len(), 32);

    // Left-padded batch: a short prompt beside the full one, as transformers pads it.
    let short = ids_of(&r["short_ids"]);
    let batch = model.generate(&[short, ids.clone()], &greedy(32)).unwrap();
    let expected = r["batch_greedy"].as_array().unwrap();
    assert_eq!(
        batch[0].token_ids,
        ids_of(&expected[0]),
        "{arch}: padded row"
    );
    assert_eq!(batch[1].token_ids, ids_of(&expected[1]), "{arch}: full row");
}

#[test]
fn qwen2_matches_transformers() {
    check_arch("qwen2");
}

#[test]
fn llama_matches_transformers() {
    check_arch("llama");
}

#[test]
fn saved_checkpoint_loads_in_transformers_with_same_logits() {
    let Some(python) = venv_python() else { return };
    tch::manual_seed(3);
    let config = ModelConfig::from_json(&serde_json::json!({
        "model_type": "qwen2", "vocab_size": 200, "hidden_size": 48, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
        "rope_theta": 10000.0, "tie_word_embeddings": false, "eos_token_id": 1
    }))
    .unwrap();
    let model = PolicyModel::new(config, Placement::default(), true).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    model.save(tmp.path(), None).unwrap();
    let ids: Vec<u32> = (0..30).map(|i| (i * 37 % 200) as u32).collect();
    let mut child = Command::new(&python)
        .arg(script())
        .args(["score", tmp.path().to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::json!({ "ids": ids }).to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "transformers could not load the saved checkpoint"
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let diff = max_abs_diff(&model.sequence_logits(&ids).unwrap(), &r["logits"]);
    assert!(diff < 1e-4, "saved model: logits differ by {diff}");

    // And it loads back into agent-r1 with its value head.
    let again = PolicyModel::load(tmp.path(), Placement::default(), true).unwrap();
    let diff2 = (again.sequence_logits(&ids).unwrap() - model.sequence_logits(&ids).unwrap())
        .abs()
        .max()
        .double_value(&[]);
    assert_eq!(diff2, 0.0);
}

#[test]
fn wrong_shape_and_missing_files_name_the_culprit() {
    let tmp = tempfile::tempdir().unwrap();
    let e = PolicyModel::load(tmp.path(), Placement::default(), false).unwrap_err();
    assert!(e.to_string().contains("config.json"), "{e}");

    let config = ModelConfig::from_json(&serde_json::json!({
        "model_type": "llama", "vocab_size": 50, "hidden_size": 16, "intermediate_size": 32,
        "num_hidden_layers": 1, "num_attention_heads": 2
    }))
    .unwrap();
    let model = PolicyModel::new(config, Placement::default(), false).unwrap();
    model.save(tmp.path(), None).unwrap();
    // Same weights, config now claims a wider MLP.
    let path = tmp.path().join("config.json");
    let mut json: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json["intermediate_size"] = 40.into();
    std::fs::write(&path, json.to_string()).unwrap();
    let e = PolicyModel::load(tmp.path(), Placement::default(), false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model.safetensors") && e.contains("mlp") && e.contains("shape"),
        "{e}"
    );
}
