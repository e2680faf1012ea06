//! `agent-r1 train` with `[lora]` through the binary, on the tiny config: the run trains
//! adapters beside the frozen base, its checkpoints hold the adapter in PEFT's format (no
//! full weights), a restart resumes from it, and `eval` runs the checkpoint on its base.
//! Bad LoRA settings are refused by `check-config` and `train` alike, in one line.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

#[path = "support/tiny_run.rs"]
mod tiny_run;

const BIN: &str = env!("CARGO_BIN_EXE_agent-r1");

fn config(dir: &Path, updates: u64, lora: &str) -> PathBuf {
    let text = format!(
        "{}\n[checkpoint]\nevery = 1\nkeep_last = 3\n\n[lora]\n{lora}\n",
        tiny_run::tiny_config(dir, updates, 2, 4)
    );
    let path = dir.join(format!("train-{updates}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn agent_r1(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env("AGENT_R1_LOG", "warn")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn last_json(stdout: &str) -> Value {
    serde_json::from_str(stdout.lines().last().expect("a summary line")).unwrap()
}

#[test]
fn a_lora_run_checkpoints_the_adapter_resumes_from_it_and_evaluates_it() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let lora = "rank = 8\nalpha = 16\ntarget_modules = [\"q_proj\", \"v_proj\", \"up_proj\"]";
    let cfg = config(tmp.path(), 2, lora);
    let (code, out, err) = agent_r1(&[
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("lora: rank 8, alpha 16, targets q_proj,v_proj,up_proj, from fresh adapters"),
        "{err}"
    );
    assert_eq!(last_json(&out)["updates"], 2);
    let policy = run.join("checkpoints/step-2/policy");
    let files: Vec<String> = std::fs::read_dir(&policy)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        files.contains(&"adapter_config.json".to_string())
            && files.contains(&"adapter_model.safetensors".to_string())
            && !files.iter().any(|f| f.starts_with("model")),
        "{files:?}"
    );
    let adapter: Value =
        serde_json::from_str(&std::fs::read_to_string(policy.join("adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(adapter["r"], 8);
    assert_eq!(adapter["peft_type"], "LORA");
    // The adapter is small beside the base it adapts.
    let adapter_bytes = std::fs::metadata(policy.join("adapter_model.safetensors"))
        .unwrap()
        .len();
    let base = PathBuf::from(adapter["base_model_name_or_path"].as_str().unwrap());
    let base_bytes = std::fs::metadata(base.join("model.safetensors"))
        .unwrap()
        .len();
    assert!(
        adapter_bytes * 10 < base_bytes,
        "{adapter_bytes} vs {base_bytes}"
    );

    // A restart continues from the checkpoint's adapter.
    let cfg3 = config(tmp.path(), 3, lora);
    let (code, out, err) = agent_r1(&[
        "train",
        "--config",
        cfg3.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
        "--resume",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("resumed from step 2"), "{err}");
    assert!(err.contains("/checkpoints/step-2/policy"), "{err}");
    assert_eq!(last_json(&out)["updates"], 3, "{out}");
    assert!(run
        .join("checkpoints/step-3/policy/adapter_model.safetensors")
        .is_file());

    // eval runs the newest checkpoint: its adapter on its base.
    let (code, out, err) = agent_r1(&[
        "eval",
        "--model",
        run.to_str().unwrap(),
        "--device",
        "cpu",
        "--questions",
        "2",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("\"em\""), "{out}");
}

#[test]
fn bad_lora_settings_are_refused_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    for (lora, needles) in [
        ("rank = 0", &["lora.rank", "got 0"][..]),
        (
            "target_modules = [\"c_attn\"]",
            &["lora.target_modules", "c_attn", "q_proj"][..],
        ),
        ("dropout = 1.5", &["lora.dropout"][..]),
    ] {
        let cfg = config(tmp.path(), 1, lora);
        let (code, _, err) = agent_r1(&["check-config", cfg.to_str().unwrap()]);
        assert_eq!(code, Some(2), "{lora}: {err}");
        let line = err.trim();
        assert!(!line.contains('\n'), "{line}");
        for needle in needles {
            assert!(line.contains(needle), "{lora}: {needle:?} not in {line:?}");
        }
    }
    // An adapter directory without PEFT's config.
    let cfg = config(tmp.path(), 1, "rank = 4");
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        "preset = \"tiny\"",
        &format!("preset = \"tiny\"\nadapter = \"{}\"", tmp.path().display()),
    );
    std::fs::write(&cfg, text).unwrap();
    let (code, _, err) = agent_r1(&["check-config", cfg.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("model.adapter") && err.contains("adapter_config.json"),
        "{err}"
    );
}
