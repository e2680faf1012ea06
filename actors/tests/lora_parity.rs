//! LoRA adapters against PEFT on tiny random float32 checkpoints of every family (Qwen2,
//! Qwen3, Llama, Llama 3.1, Mistral): an adapter PEFT wrote (random non-zero `A` and `B`)
//! loads in agent-r1 with PEFT's logits within 1e-4 and the same 16 greedy tokens; an adapter
//! agent-r1 writes loads in `peft` with agent-r1's logits within 1e-4; the merged export loads
//! in `transformers` with the same logits. Adapters made for another base, and settings this
//! implementation does not compute, are refused in one line naming the file and the key.
//!
//! Needs the project venv with `peft` (`make test` creates it). Without it the test fails
//! under CI and is skipped with a message elsewhere.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use agent_r1_actors::model::lora::{TargetModules, ADAPTER_CONFIG_FILE};
use agent_r1_actors::model::{LoraConfig, Placement, PolicyModel, SamplingParams};
use serde_json::Value;
use tch::Tensor;

#[path = "support/venv.rs"]
mod venv;

fn py_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py")
}

fn run_json(python: &Path, args: &[&str], stdin: Option<Value>) -> Value {
    let mut child = Command::new(python)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(v) = stdin {
        input.write_all(v.to_string().as_bytes()).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{args:?} failed");
    serde_json::from_slice(&out.stdout).expect("JSON")
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn max_abs_diff(logits: &Tensor, reference: &Value) -> f64 {
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
    let expected = Tensor::from_slice(&flat).view([rows.len() as i64, -1]);
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

fn check_family(arch: &str, targets: &str) {
    let Some(python) = venv::python_or_skip(&["peft", "transformers", "torch"]) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let script = py_dir().join("lora_reference.py");
    let r = run_json(
        &python,
        &[
            script.to_str().unwrap(),
            "make",
            dir.to_str().unwrap(),
            arch,
            targets,
        ],
        None,
    );
    let base = dir.join("base");
    let ids = ids_of(&r["ids"]);

    // PEFT's adapter in agent-r1 (which moves the base's logits: the comparison is the
    // adapter's).
    let mut model = PolicyModel::load(&base, Placement::default(), false).unwrap();
    let plain = max_abs_diff(&model.sequence_logits(&ids).unwrap(), &r["logits"]);
    assert!(
        plain > 0.1,
        "{arch}: PEFT's adapter changes little ({plain})"
    );
    model.load_adapter(&dir.join("adapter")).unwrap();
    let logits = model.sequence_logits(&ids).unwrap();
    let diff = max_abs_diff(&logits, &r["logits"]);
    println!("{arch}: PEFT's adapter, max |logit diff| = {diff:.3e}");
    assert!(diff < 1e-4, "{arch}: logits differ by {diff}");
    let gen = model
        .generate(std::slice::from_ref(&ids), &greedy(16))
        .unwrap();
    assert_eq!(
        gen[0].token_ids,
        ids_of(&r["greedy"]),
        "{arch}: greedy tokens"
    );

    // agent-r1's adapter in PEFT: fresh adapters with B moved off zero, as training moves it.
    let mut ours = PolicyModel::load(&base, Placement::default(), false).unwrap();
    let config = LoraConfig {
        rank: 3,
        alpha: 7.0,
        target_modules: if targets == "all-linear" {
            TargetModules::default()
        } else {
            TargetModules::List(targets.split(',').map(String::from).collect())
        },
        ..LoraConfig::default()
    };
    ours.add_lora(&config).unwrap();
    tch::manual_seed(5);
    tch::no_grad(|| {
        for (name, mut t) in ours.adapter_variables() {
            if name.contains("lora_B") {
                let _ = t.normal_(0.0, 0.3);
            }
        }
    });
    let saved = dir.join("ours");
    ours.save_adapter(&saved).unwrap();
    let theirs = run_json(
        &python,
        &[
            script.to_str().unwrap(),
            "score",
            base.to_str().unwrap(),
            saved.to_str().unwrap(),
        ],
        Some(serde_json::json!({ "ids": ids })),
    );
    let our_logits = ours.sequence_logits(&ids).unwrap();
    let moved = (&our_logits
        - PolicyModel::load(&base, Placement::default(), false)
            .unwrap()
            .sequence_logits(&ids)
            .unwrap())
    .abs()
    .max()
    .double_value(&[]);
    assert!(moved > 0.1, "{arch}: the adapter changes little ({moved})");
    let diff = max_abs_diff(&our_logits, &theirs["logits"]);
    println!("{arch}: agent-r1's adapter in PEFT, max |logit diff| = {diff:.3e}");
    assert!(diff < 1e-4, "{arch}: PEFT's logits differ by {diff}");

    // And it reads back into agent-r1 exactly.
    let mut again = PolicyModel::load(&base, Placement::default(), false).unwrap();
    again.load_adapter(&saved).unwrap();
    let same = (again.sequence_logits(&ids).unwrap() - &our_logits)
        .abs()
        .max()
        .double_value(&[]);
    assert_eq!(same, 0.0, "{arch}: reloaded adapter");

    // The merged export in transformers.
    let merged = dir.join("merged");
    ours.save_as(&merged, None, tch::Kind::Float).unwrap();
    let reference = py_dir().join("model_reference.py");
    let theirs = run_json(
        &python,
        &[
            reference.to_str().unwrap(),
            "score",
            merged.to_str().unwrap(),
        ],
        Some(serde_json::json!({ "ids": ids })),
    );
    let diff = max_abs_diff(&our_logits, &theirs["logits"]);
    println!("{arch}: merged export in transformers, max |logit diff| = {diff:.3e}");
    assert!(diff < 1e-4, "{arch}: merged logits differ by {diff}");
}

#[test]
fn qwen2_adapters_match_peft() {
    check_family("qwen2", "all-linear");
}

#[test]
fn qwen3_adapters_match_peft() {
    check_family("qwen3", "q_proj,v_proj,down_proj");
}

#[test]
fn llama_adapters_match_peft() {
    check_family("llama", "all-linear");
}

#[test]
fn llama31_adapters_match_peft() {
    check_family("llama31", "k_proj,o_proj,gate_proj,up_proj");
}

#[test]
fn mistral_adapters_match_peft() {
    check_family("mistral", "all-linear");
}

fn one_line_naming(e: &str, needles: &[&str]) {
    for needle in needles {
        assert!(e.contains(needle), "{needle:?} not in {e:?}");
    }
    assert!(!e.contains('\n'), "{e}");
}

#[test]
fn adapters_for_another_base_and_unsupported_settings_are_refused() {
    let Some(python) = venv::python_or_skip(&["peft", "transformers", "torch"]) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let script = py_dir().join("lora_reference.py");
    for arch in ["llama", "qwen3"] {
        run_json(
            &python,
            &[
                script.to_str().unwrap(),
                "make",
                tmp.path().join(arch).to_str().unwrap(),
                arch,
                "all-linear",
            ],
            None,
        );
    }
    let llama_base = tmp.path().join("llama/base");
    let load = || PolicyModel::load(&llama_base, Placement::default(), false).unwrap();

    // Qwen3's adapter (head_dim 24) on the Llama base: the first tensor whose shape differs.
    let e = load()
        .load_adapter(&tmp.path().join("qwen3/adapter"))
        .unwrap_err()
        .to_string();
    one_line_naming(&e, &["adapter_model.safetensors", "shape", "another base"]);

    // An adapter that names another base.
    let adapter = tmp.path().join("llama/adapter");
    let config_path = adapter.join(ADAPTER_CONFIG_FILE);
    let original = std::fs::read_to_string(&config_path).unwrap();
    let edit = |f: &dyn Fn(&mut Value)| {
        let mut json: Value = serde_json::from_str(&original).unwrap();
        f(&mut json);
        std::fs::write(&config_path, json.to_string()).unwrap();
        load().load_adapter(&adapter).unwrap_err().to_string()
    };
    let e = edit(&|j| j["base_model_name_or_path"] = "Qwen/Qwen2.5-7B-Instruct".into());
    one_line_naming(
        &e,
        &[ADAPTER_CONFIG_FILE, "base_model_name_or_path", "Qwen2.5-7B"],
    );
    let e = edit(&|j| j["use_dora"] = true.into());
    one_line_naming(&e, &[ADAPTER_CONFIG_FILE, "use_dora"]);
    let e = edit(&|j| j["r"] = 0.into());
    one_line_naming(&e, &[ADAPTER_CONFIG_FILE, "rank"]);
    let e = edit(&|j| j["target_modules"] = serde_json::json!(["q_proj", "c_attn"]));
    one_line_naming(&e, &[ADAPTER_CONFIG_FILE, "target_modules", "c_attn"]);
    let e = edit(&|j| j["target_modules"] = ".*proj".into());
    one_line_naming(&e, &[ADAPTER_CONFIG_FILE, "target_modules", "patterns"]);
    std::fs::write(&config_path, &original).unwrap();
    load().load_adapter(&adapter).unwrap();
}

#[test]
fn rank_and_targets_are_checked_against_the_model() {
    let config = agent_r1_actors::model::ModelConfig::from_json(&serde_json::json!({
        "model_type": "qwen2", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 40,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 1
    }))
    .unwrap();
    let model = || PolicyModel::new(config.clone(), Placement::default(), false).unwrap();
    // k_proj is 16 -> 4: a rank of 5 cannot fit it.
    let e = model()
        .add_lora(&LoraConfig {
            rank: 5,
            ..LoraConfig::default()
        })
        .unwrap_err()
        .to_string();
    one_line_naming(&e, &["lora.rank", "got 5", "1..=4", "k_proj"]);
    let e = model()
        .add_lora(&LoraConfig {
            rank: 0,
            ..LoraConfig::default()
        })
        .unwrap_err()
        .to_string();
    one_line_naming(&e, &["lora.rank", "got 0"]);
    let e = model()
        .add_lora(&LoraConfig {
            rank: 2,
            target_modules: TargetModules::List(vec!["query".into()]),
            ..LoraConfig::default()
        })
        .unwrap_err()
        .to_string();
    one_line_naming(&e, &["target_modules", "`query`", "q_proj"]);

    // A fresh adapter changes nothing, and only the adapters train.
    let mut m = model();
    let ids: Vec<u32> = (0..12).map(|i| (i * 7 % 64) as u32).collect();
    let before = m.sequence_logits(&ids).unwrap();
    m.add_lora(&LoraConfig {
        rank: 4,
        ..LoraConfig::default()
    })
    .unwrap();
    assert_eq!(
        (m.sequence_logits(&ids).unwrap() - before)
            .abs()
            .max()
            .double_value(&[]),
        0.0
    );
    let trainable: Vec<String> = m
        .var_store()
        .variables()
        .into_iter()
        .filter(|(_, t)| t.requires_grad())
        .map(|(n, _)| n)
        .collect();
    assert_eq!(trainable.len(), 14, "{trainable:?}");
    assert!(
        trainable.iter().all(|n| n.contains(".lora_")),
        "{trainable:?}"
    );
}
