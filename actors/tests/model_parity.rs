//! Numerical parity with Hugging Face `transformers` on tiny random checkpoints of every
//! family (Qwen2, Qwen3, Llama, Llama 3.1 with rope scaling, Mistral) that transformers makes
//! inside the test, stored as float32, bfloat16 or float16 and in one file or sharded: float32
//! logits and log-probabilities within 1e-4, greedy generation of 32 tokens identical (alone
//! and in a left-padded batch), and the directory agent-r1 saves loading back in
//! `transformers` with the same logits.
//!
//! Needs the project venv (`make test` creates it). Without it the test fails under CI and is
//! skipped with a message elsewhere.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use agent_r1_actors::model::{ModelConfig, Placement, PolicyModel, SamplingParams};
use serde_json::Value;

#[path = "support/venv.rs"]
mod venv;

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

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn max_diff(ours: &[f64], theirs: &[f64]) -> f64 {
    assert_eq!(ours.len(), theirs.len(), "lengths");
    ours.iter()
        .zip(theirs)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max)
}

/// transformers' logits for `ids` from the directory `dir`.
fn transformers_logits(python: &Path, dir: &Path, ids: &[u32]) -> Value {
    let mut child = Command::new(python)
        .arg(script())
        .args(["score", dir.to_str().unwrap()])
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
        "transformers could not load {}",
        dir.display()
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    r["logits"].clone()
}

fn check_arch(arch: &str) -> Option<Value> {
    let python = venv::python_or_skip(&["transformers", "torch"])?;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(arch);
    let r = reference(&python, &dir, arch);
    let model = PolicyModel::load(&dir, Placement::default(), false).unwrap();

    let ids = ids_of(&r["ids"]);
    let logits = model.sequence_logits(&ids).unwrap();
    let diff = max_abs_diff(&logits, &r["logits"]);
    println!("{arch}: max |logit diff| = {diff:.3e}");
    assert!(diff < 1e-4, "{arch}: logits differ by {diff}");

    // Log-probabilities of the prompt's own next tokens.
    let lp = logits.log_softmax(-1, tch::Kind::Float);
    let next: Vec<i64> = ids[1..].iter().map(|&i| i as i64).collect();
    let prompt_lp = lp
        .narrow(0, 0, next.len() as i64)
        .gather(1, &tch::Tensor::from_slice(&next).unsqueeze(1), false)
        .squeeze_dim(1);
    let prompt_lp = Vec::<f64>::try_from(prompt_lp.to_kind(tch::Kind::Double)).unwrap();
    let lp_diff = max_diff(&prompt_lp, &floats(&r["prompt_logprobs"]));
    println!("{arch}: max |prompt log-prob diff| = {lp_diff:.3e}");
    assert!(
        lp_diff < 1e-4,
        "{arch}: prompt log-probs differ by {lp_diff}"
    );

    let gen = model
        .generate(std::slice::from_ref(&ids), &greedy(32))
        .unwrap();
    assert_eq!(
        gen[0].token_ids,
        ids_of(&r["greedy"]),
        "{arch}: greedy generation"
    );
    let ours: Vec<f64> = gen[0].logprobs.iter().map(|&x| f64::from(x)).collect();
    let gen_diff = max_diff(&ours, &floats(&r["greedy_logprobs"]));
    println!("{arch}: max |generated log-prob diff| = {gen_diff:.3e}");
    assert!(
        gen_diff < 1e-4,
        "{arch}: generated log-probs differ by {gen_diff}"
    );

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

    // What agent-r1 saves loads back in transformers with the same logits.
    let saved = tmp.path().join("saved");
    model.save(&saved, None).unwrap();
    let diff = max_abs_diff(&logits, &transformers_logits(&python, &saved, &ids));
    assert!(diff < 1e-4, "{arch}: saved model's logits differ by {diff}");
    Some(r)
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
fn qwen3_bf16_sharded_matches_transformers() {
    check_arch("qwen3");
}

#[test]
fn mistral_sharded_matches_transformers() {
    check_arch("mistral");
}

#[test]
fn llama31_rope_scaling_is_applied_past_the_original_context() {
    let Some(r) = check_arch("llama31") else {
        return;
    };
    // The 200-token prompt runs past original_max_position_embeddings (64); without the
    // scaling its logits would move by this much, so the parity above is the scaling's.
    let unscaled = r["unscaled_logit_diff"].as_f64().unwrap();
    assert_eq!(ids_of(&r["ids"]).len(), 200);
    assert!(unscaled > 1.0, "scaling changes little: {unscaled}");
}

#[test]
fn saved_checkpoint_loads_in_transformers_with_same_logits() {
    let Some(python) = venv::python_or_skip(&["transformers", "torch"]) else {
        return;
    };
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
    let theirs = transformers_logits(&python, tmp.path(), &ids);
    let diff = max_abs_diff(&model.sequence_logits(&ids).unwrap(), &theirs);
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

    // An unsupported rope type: one line naming the file, the field, the value and what is
    // supported, before any weight is read.
    json["intermediate_size"] = 32.into();
    // (the older top-level layout, as in many hub configs)
    json.as_object_mut().unwrap().remove("rope_parameters");
    json["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
    std::fs::write(&path, json.to_string()).unwrap();
    let e = PolicyModel::load(tmp.path(), Placement::default(), false)
        .unwrap_err()
        .to_string();
    for needle in [
        "config.json",
        "`rope_scaling.rope_type`",
        "yarn",
        "default, linear, llama3",
    ] {
        assert!(e.contains(needle), "{needle:?} not in {e:?}");
    }
    assert!(!e.contains('\n'), "{e}");
}
