//! `agent-r1 train` with `[lora]` through the binary, on the tiny config: the run trains
//! adapters beside the frozen base, its checkpoints hold the adapter in PEFT's format (no
//! full weights), a restart resumes from it, `eval` runs the checkpoint on its base, and
//! `export --merge` writes a plain model that generates what base and adapter generate.
//! Bad LoRA settings are refused by `check-config` and `train` alike, in one line.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

#[path = "support/tiny_run.rs"]
mod tiny_run;

const BIN: &str = env!("CARGO_BIN_EXE_agent-r1");

fn config(dir: &Path, updates: u64, lora: &str) -> PathBuf {
    let text = format!(
        "{}\n[checkpoint]\nevery = 1\nkeep_last = 3\n\n[metrics]\nenabled = false\n\n[lora]\n{lora}\n",
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
    // A KL term in the loss: its reference is the frozen base with the adapters off.
    let kl_on = |cfg: PathBuf| {
        let text = std::fs::read_to_string(&cfg).unwrap();
        assert!(text.contains("[algorithm.kl]\nplacement = \"off\""));
        std::fs::write(
            &cfg,
            text.replace(
                "[algorithm.kl]\nplacement = \"off\"",
                "[algorithm.kl]\nplacement = \"loss\"\ncoef = 0.01",
            ),
        )
        .unwrap();
        cfg
    };
    let cfg = kl_on(config(tmp.path(), 2, lora));
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
    assert!(
        err.contains("kl reference: the frozen base with the adapters off"),
        "{err}"
    );
    let kls: Vec<f64> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["kl"]
                .as_f64()
                .unwrap()
        })
        .collect();
    assert_eq!(kls.len(), 2, "{kls:?}");
    assert!(kls.iter().all(|k| k.is_finite() && *k >= 0.0), "{kls:?}");
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
    let cfg3 = kl_on(config(tmp.path(), 3, lora));
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

    // export --merge writes a plain model that generates what base + adapter generate. The
    // tiny run's rewards leave B at zero, so the checkpoint's adapter gets random B first
    // (a merge of a zero update would show nothing).
    let policy = tmp.path().join("adapter");
    std::fs::create_dir_all(&policy).unwrap();
    let trained = run.join("checkpoints/step-3/policy");
    std::fs::copy(
        trained.join("adapter_config.json"),
        policy.join("adapter_config.json"),
    )
    .unwrap();
    tch::manual_seed(7);
    let tensors: Vec<(String, tch::Tensor)> =
        tch::Tensor::read_safetensors(trained.join("adapter_model.safetensors"))
            .unwrap()
            .into_iter()
            .map(|(name, t)| {
                let t = if name.contains("lora_B") {
                    t.randn_like() * 0.1
                } else {
                    t
                };
                (name, t)
            })
            .collect();
    tch::Tensor::write_safetensors(&tensors, policy.join("adapter_model.safetensors")).unwrap();
    let merged = tmp.path().join("merged");
    let export = |extra: &[&str]| {
        let mut args = vec![
            "export",
            "--merge",
            "--adapter",
            policy.to_str().unwrap(),
            "--out",
            merged.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        agent_r1(&args)
    };
    let (code, out, err) = export(&[]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(last_json(&out)["rank"], 8, "{out}");
    assert!(merged.join("config.json").is_file() && merged.join("tokenizer.json").is_file());
    assert!(!merged.join("adapter_config.json").exists());
    let generate = |model: &Path, adapter: Option<&Path>| {
        let mut args = vec![
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--prompt",
            "the capital of",
            "--max-new-tokens",
            "12",
            "--temperature",
            "0",
            "--device",
            "cpu",
            "--json",
        ];
        if let Some(a) = adapter {
            args.extend(["--adapter", a.to_str().unwrap()]);
        }
        let (code, out, err) = agent_r1(&args);
        assert_eq!(code, Some(0), "{err}");
        last_json(&out)
    };
    let adapted = generate(&base, Some(&policy));
    let exported = generate(&merged, None);
    let plain = generate(&base, None);
    assert_eq!(adapted["token_ids"], exported["token_ids"]);
    let logprobs = |v: &Value| -> Vec<f64> {
        v["logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    let (a, e) = (logprobs(&adapted), logprobs(&exported));
    assert!(
        a.iter().zip(&e).all(|(x, y)| (x - y).abs() < 1e-4),
        "{a:?} vs {e:?}"
    );
    // The merge changed the weights: the base alone scores its tokens otherwise.
    assert_ne!(logprobs(&plain), a);
    // An existing model is not overwritten without --force.
    let (code, _, err) = export(&[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--force"), "{err}");
    let (code, _, err) = export(&["--force"]);
    assert_eq!(code, Some(0), "{err}");
}

/// A full-weights policy and a separate critic with LoRA: PPO with a critic of adapters and a
/// value head on its frozen base.
fn critic_lora_config(dir: &Path, updates: u64, critic: &str) -> PathBuf {
    let text = format!(
        "{}\n[checkpoint]\nevery = 1\nkeep_last = 3\n\n[metrics]\nenabled = false\n\n{critic}\n",
        tiny_run::tiny_config(dir, updates, 2, 4).replace(
            "estimator = \"grpo\"",
            "estimator = \"gae\"\ncritic_warmup_updates = 0\ncritic_lr = 1e-3",
        )
    );
    let path = dir.join(format!("critic-{updates}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_separate_critic_trains_lora_adapters_checkpoints_them_and_resumes_from_them() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let critic = "[critic]\nseparate = true\n\n[critic.lora]\nrank = 4\nalpha = 8";
    let run_to = |updates: u64, extra: &[&str]| {
        let cfg = critic_lora_config(tmp.path(), updates, critic);
        let mut args = vec!["train", "--config", cfg.to_str().unwrap()];
        args.extend(["--out", run.to_str().unwrap()]);
        args.extend(extra);
        agent_r1(&args)
    };
    let (code, out, err) = run_to(2, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("with LoRA rank 4 (fresh adapters)"), "{err}");
    assert_eq!(last_json(&out)["updates"], 2);
    let saved = run.join("checkpoints/step-2/policy/critic");
    for file in [
        "adapter_config.json",
        "adapter_model.safetensors",
        "value_head.safetensors",
    ] {
        assert!(
            saved.join(file).is_file(),
            "{file} missing in {}",
            saved.display()
        );
    }
    assert!(!saved.join("model.safetensors").exists());
    let losses: Vec<f64> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["value_loss"]
                .as_f64()
                .unwrap()
        })
        .collect();
    assert!(
        losses.len() == 2 && losses.iter().all(|l| l.is_finite()),
        "{losses:?}"
    );
    // The adapters trained: B started at zero.
    let adapters = tch::Tensor::read_safetensors(saved.join("adapter_model.safetensors")).unwrap();
    let moved = adapters
        .iter()
        .filter(|(name, _)| name.contains("lora_B"))
        .any(|(_, t)| t.abs().max().double_value(&[]) > 0.0);
    assert!(moved, "no lora_B moved");

    // A restart continues from the checkpoint's critic adapters, on the same frozen base.
    let (code, out, err) = run_to(3, &["--resume"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("resumed from step 2"), "{err}");
    assert!(err.contains("step-2/policy/critic)"), "{err}");
    assert_eq!(last_json(&out)["updates"], 3, "{out}");

    // Only a separate critic reads [critic.lora].
    let cfg = critic_lora_config(tmp.path(), 1, "[critic.lora]\nrank = 4");
    let (code, _, err) = agent_r1(&["check-config", cfg.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("critic.lora") && err.contains("separate = true"),
        "{err}"
    );
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
