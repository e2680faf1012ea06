//! The shipped example configs parse and validate, and `agent-r1 check-config` reports a
//! bad key with its path and exit code 2.

use std::path::Path;
use std::process::Command;

use agent_r1::config::{FileCheck, TrainConfig};
use agent_r1::registries::Registries;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn every_example_config_parses_and_validates() {
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(Path::new(ROOT).join("examples")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        // Model directories and datasets are not part of the repository.
        let config = TrainConfig::load(&path, FileCheck::Skip, &Registries::builtins())
            .unwrap_or_else(|e| panic!("{e}"));
        // The resolved form is itself a valid config.
        let resolved = TrainConfig::from_toml_str(&config.to_toml_string()).unwrap();
        assert_eq!(resolved, config, "{}", path.display());
        config.learner_config().validate().unwrap();
        seen.push(path.file_name().unwrap().to_string_lossy().into_owned());
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            "demo.toml",
            "demo_async.toml",
            "demo_lora.toml",
            "demo_python_agent.toml",
            "external_agent.toml",
            "grpo.toml",
            "hotpotqa_llama3.1_8b_lora.toml",
            "hotpotqa_qwen2.5.toml",
            "long_horizon.toml",
            "long_horizon_full.toml",
            "math.toml",
            "my_data.toml",
            "openenv.toml",
            "ppo_critic.toml",
            "verifiers.toml"
        ]
    );
    // The demos need no files at all.
    for demo in ["examples/demo.toml", "examples/math.toml"] {
        TrainConfig::load(
            &Path::new(ROOT).join(demo),
            FileCheck::Require,
            &Registries::builtins(),
        )
        .unwrap();
    }
}

#[test]
fn check_config_prints_the_resolved_config_or_one_precise_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_agent-r1"))
        .args(["check-config", "examples/demo.toml"])
        .current_dir(ROOT)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    // Defaults are filled in, and the output is a config again.
    assert!(stdout.contains("clip_ratio_c = 3.0"), "{stdout}");
    TrainConfig::from_toml_str(&stdout).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[model]\npreset = \"tiny\"\n[env]\nname = \"synthetic_multihop\"\n[algorithm]\nppo_epochs = 0\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_agent-r1"))
        .args(["check-config", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("bad.toml: `algorithm.ppo_epochs`: got 0; allowed: an integer >= 1"),
        "{stderr}"
    );
}

#[test]
fn a_separate_critic_needs_an_estimator_with_a_critic() {
    let base = "[model]\npreset = \"tiny\"\n[env]\nname = \"synthetic_multihop\"\n";
    let grpo = format!("{base}[algorithm]\nestimator = \"grpo\"\n[critic]\nseparate = true\n");
    let e = TrainConfig::from_toml_str(&grpo)
        .unwrap()
        .validate(FileCheck::Skip, &Registries::builtins())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("critic") && e.contains("grpo") && e.contains("gae, step_gae"),
        "{e}"
    );
    let stray = format!("{base}[algorithm]\nestimator = \"gae\"\n[critic]\nmodel = \"x\"\n");
    let e = TrainConfig::from_toml_str(&stray)
        .unwrap()
        .validate(FileCheck::Skip, &Registries::builtins())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("critic.model") && e.contains("separate = true"),
        "{e}"
    );
    let ok = format!("{base}[algorithm]\nestimator = \"gae\"\n[critic]\nseparate = true\n");
    TrainConfig::from_toml_str(&ok)
        .unwrap()
        .validate(FileCheck::Skip, &Registries::builtins())
        .unwrap();
}

/// The memory planner's verdicts: the shipped HotpotQA config fits one 80 GB GPU (the plan
/// is printed term by term); without its `[learner]` section it is refused in one line
/// naming the largest terms and what shrinks them; `train` refuses a config that cannot fit
/// this machine before it loads anything.
#[test]
fn the_memory_plan_accepts_the_example_and_refuses_what_cannot_fit() {
    let check = |path: &Path| {
        Command::new(env!("CARGO_BIN_EXE_agent-r1"))
            .args([
                "check-config",
                path.to_str().unwrap(),
                "--skip-machine-checks",
            ])
            .args(["--shape", "qwen2.5-1.5b", "--device-memory-gib", "80"])
            .current_dir(ROOT)
            .output()
            .unwrap()
    };
    let example = Path::new(ROOT).join("examples/hotpotqa_qwen2.5.toml");
    let out = check(&example);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stderr}");
    for term in [
        "AdamW moments (float32)",
        "float32 master weights",
        "activations",
        "logits chunk",
        "reference model",
        "engine slots (KV)",
        "parked-KV pool",
        "memory: fits",
    ] {
        assert!(stderr.contains(term), "{term}: {stderr}");
    }

    // Llama 3.1 8B with LoRA fits one 80 GB GPU beside its engine; the same config training
    // the full weights does not (gradients, masters and AdamW moments of 8B parameters).
    let lora = Path::new(ROOT).join("examples/hotpotqa_llama3.1_8b_lora.toml");
    let check_8b = |path: &Path| {
        Command::new(env!("CARGO_BIN_EXE_agent-r1"))
            .args([
                "check-config",
                path.to_str().unwrap(),
                "--skip-machine-checks",
            ])
            .args(["--shape", "llama3.1-8b", "--device-memory-gib", "80"])
            .current_dir(ROOT)
            .output()
            .unwrap()
    };
    let out = check_8b(&lora);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("LoRA state (adapters, grads, AdamW)")
            && !stderr.contains("AdamW moments (float32)")
            && stderr.contains("memory: fits"),
        "{stderr}"
    );
    let full_text = std::fs::read_to_string(&lora).unwrap();
    let full_text = full_text.split("\n[lora]").next().unwrap();
    let dir8 = tempfile::tempdir().unwrap();
    let full = dir8.path().join("full.toml");
    std::fs::write(&full, full_text).unwrap();
    let out = check_8b(&full);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("AdamW moments (float32)"), "{stderr}");

    // Spread over GPUs of 80 GB: two are too few in any mode; on eight, the optimizer state
    // must be sharded (the engines on other devices), and each mode holds less per rank
    // than the one before it.
    let spread = |ranks: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_agent-r1"))
            .args([
                "check-config",
                full.to_str().unwrap(),
                "--skip-machine-checks",
            ])
            .args(["--shape", "llama3.1-8b", "--device-memory-gib", "80"])
            .args(["--learner-ranks", ranks])
            .current_dir(ROOT)
            .output()
            .unwrap();
        String::from_utf8(out.stderr).unwrap()
    };
    let two = spread("2");
    assert!(two.contains("no sharding fits on 2 ranks"), "{two}");
    let eight = spread("8");
    assert!(
        eight.contains(
            "needs at least shard = \"optimizer_state\" on 8 ranks, with the engines on other \
             devices"
        ),
        "{eight}"
    );
    let others: Vec<f64> = eight
        .lines()
        .filter(|l| l.trim_start().starts_with("shard = "))
        .map(|l| {
            let after = l.split("ranks 1..7 ").nth(1).unwrap();
            after.split(" GiB").next().unwrap().parse().unwrap()
        })
        .collect();
    assert_eq!(others.len(), 3, "{eight}");
    assert!(others[0] > others[1] && others[1] > others[2], "{eight}");
    assert!(
        spread("0").contains("--learner-ranks: got 0; allowed: 1 to 64"),
        "bad input named"
    );

    let text = std::fs::read_to_string(&example).unwrap();
    let without = text.split("\n[learner]").next().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain.toml");
    std::fs::write(&plain, without).unwrap();
    let out = check(&plain);
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    let refusal = stderr.lines().last().unwrap();
    assert!(
        refusal.contains("predicted peak")
            && refusal.contains("80.0 GiB of cuda:0")
            && refusal.contains("activations")
            && refusal.contains("learner.recompute = true"),
        "{stderr}"
    );

    // 100 TiB of parked KV fits no machine: refused before the env, the model or anything
    // else is built, so the run directory stays empty of checkpoints and rollouts.
    let huge = dir.path().join("huge.toml");
    std::fs::write(
        &huge,
        "[model]\npreset = \"tiny\"\ndevice = \"cpu\"\n[env]\nname = \"synthetic_multihop\"\n\
         [rollout]\nparked_kv_mib = 104857600\n",
    )
    .unwrap();
    let run_dir = dir.path().join("run");
    let out = Command::new(env!("CARGO_BIN_EXE_agent-r1"))
        .args(["train", "--config", huge.to_str().unwrap()])
        .args(["--out", run_dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("predicted peak")
            && stderr.contains("parked-KV pool 102400.0 GiB")
            && stderr.contains("rollout.parked_kv_mib")
            && stderr.contains("learner.check_memory = false"),
        "{stderr}"
    );
    assert!(!run_dir.join("checkpoints").exists());
}

#[test]
fn every_wait_is_configurable_and_bounded() {
    let base = "[model]\npreset = \"tiny\"\n[env]\nname = \"synthetic_multihop\"\n";
    let ok = TrainConfig::from_toml_str(&format!(
        "{base}[rollout]\ngenerate_timeout_secs = 30\ntool_queue_timeout_secs = 5\n\
         [stall]\nlearner_secs = 60\npublish_secs = 10\nenv_secs = 5\ntool_secs = 5\n\
         engine_secs = 5\ncheckpoint_secs = 30\nfail_run = false\n[checkpoint]\nretries = 0\n"
    ))
    .unwrap();
    ok.validate(FileCheck::Skip, &Registries::builtins())
        .unwrap();
    for (section, key, value) in [
        ("rollout", "generate_timeout_secs", "0"),
        ("rollout", "tool_queue_timeout_secs", "-1"),
        ("stall", "learner_secs", "1e30"),
        ("stall", "publish_secs", "nan"),
        ("stall", "env_secs", "0"),
        ("stall", "tool_secs", "-3"),
        ("stall", "engine_secs", "inf"),
        ("stall", "checkpoint_secs", "1e9"),
        ("checkpoint", "retries", "11"),
        ("rollout", "memory_fraction", "0"),
        ("rollout", "memory_fraction", "1.5"),
    ] {
        let cfg =
            TrainConfig::from_toml_str(&format!("{base}[{section}]\n{key} = {value}\n")).unwrap();
        let e = cfg
            .validate(FileCheck::Skip, &Registries::builtins())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("`{section}.{key}`")) && e.contains("allowed"),
            "{section}.{key} = {value}: {e}"
        );
    }
    // A key that moved says where to.
    let e = TrainConfig::from_toml_str(&format!("{base}[training]\nupdate_timeout_secs = 60\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("moved to `stall.learner_secs`"), "{e}");
}

#[test]
fn a_cluster_section_is_checked_key_by_key() {
    let base = "[model]\npreset = \"tiny\"\n[env]\nname = \"synthetic_multihop\"\n";
    let dir = tempfile::tempdir().unwrap();
    let cookie = dir.path().join("cookie");
    std::fs::write(&cookie, "secret\n").unwrap();
    let good = format!(
        "{base}[cluster]\nlisten = \"127.0.0.1:7700\"\ncookie_file = \"{}\"\nmin_workers = 2\nlocal_rollout = false\n",
        cookie.display()
    );
    TrainConfig::from_toml_str(&good)
        .unwrap()
        .validate(FileCheck::Require, &Registries::builtins())
        .unwrap();
    for (extra, key, says) in [
        ("listen = \"127.0.0.1:7700\"\n", "cluster.cookie_file", "required with `listen`"),
        ("listen = \"nowhere\"\ncookie_file = \"c\"\n", "cluster.listen", "IP:PORT"),
        ("weights_listen = \"x:y\"\n", "cluster.weights_listen", "IP:PORT"),
        ("local_rollout = false\n", "cluster.local_rollout", "unless `listen` is set"),
        (
            "listen = \"127.0.0.1:7700\"\ncookie_file = \"c\"\nlease_secs = 2\nheartbeat_secs = 1.5\n",
            "cluster.heartbeat_secs",
            "at most lease_secs / 2",
        ),
        (
            "listen = \"127.0.0.1:7700\"\ncookie_file = \"c\"\nlocal_rollout = false\n",
            "cluster.min_workers",
            ">= 1 with local_rollout = false",
        ),
        ("lease_secs = 0\n", "cluster.lease_secs", "allowed"),
    ] {
        let e = TrainConfig::from_toml_str(&format!("{base}[cluster]\n{extra}"))
            .unwrap()
            .validate(FileCheck::Skip, &Registries::builtins())
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("`{key}`")) && e.contains(says), "{extra}: {e}");
    }
    // A cookie file that is not there is named when files are checked.
    let missing = good.replace(&cookie.display().to_string(), "/nonexistent/cookie");
    let e = TrainConfig::from_toml_str(&missing)
        .unwrap()
        .validate(FileCheck::Require, &Registries::builtins())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cluster.cookie_file") && e.contains("no such file"),
        "{e}"
    );
}

/// Every listening surface a run serves is refused by `check-config` in one line when it is
/// bound off loopback without a bearer token, and accepted with one; a token file that is
/// too short is named the same way.
#[test]
fn a_surface_off_loopback_without_a_token_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "0123456789abcdef0123456789abcdef\n").unwrap();
    let short = dir.path().join("short");
    std::fs::write(&short, "abc\n").unwrap();
    std::fs::write(dir.path().join("cookie"), "secret\n").unwrap();
    let base = "[model]\npreset = \"tiny\"\n[env]\nname = \"synthetic_multihop\"\n";
    let cluster = format!(
        "[cluster]\nlisten = \"127.0.0.1:0\"\ncookie_file = \"{}\"\nweights_listen = \"0.0.0.0:0\"\n",
        dir.path().join("cookie").display()
    );
    let agent = std::fs::read_to_string(Path::new(ROOT).join("examples/external_agent.toml"))
        .unwrap()
        .replace("[env.options]\n", "[env.options]\nlisten = \"0.0.0.0:0\"\n");
    assert!(agent.contains("listen = \"0.0.0.0:0\""), "{agent}");
    let check = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_agent-r1"))
            .args(["check-config", path.to_str().unwrap()])
            .current_dir(ROOT)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    // `key = "file"` placed at the top of `section`.
    let with = |text: &str, section: &str, key: &str, file: &Path| {
        text.replace(
            section,
            &format!("{section}{key} = \"{}\"\n", file.display()),
        )
    };
    for (name, text, section, address, token_key) in [
        (
            "metrics",
            format!("{base}[metrics]\naddress = \"0.0.0.0:9464\"\n"),
            "[metrics]\n",
            "metrics.address",
            "token_file",
        ),
        (
            "cluster",
            format!("{base}{cluster}"),
            "[cluster]\n",
            "cluster.weights_listen",
            "weights_token_file",
        ),
        (
            "agent",
            agent.clone(),
            "[env.options]\n",
            "env.options.listen",
            "token_file",
        ),
    ] {
        let (code, stderr) = check(&format!("{name}.toml"), &text);
        assert_eq!(code, Some(2), "{name}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("`{address}`")) && stderr.contains(token_key),
            "{name}: {stderr}"
        );
        let (code, stderr) = check(
            &format!("{name}-ok.toml"),
            &with(&text, section, token_key, &token),
        );
        assert_eq!(code, Some(0), "{name} with a token: {stderr}");
        // The endpoint's token is read where the workflow is made, at the run's start (a
        // remote worker makes its own); the actors' endpoint test refuses a short one there.
        if name != "agent" {
            let (code, stderr) = check(
                &format!("{name}-short.toml"),
                &with(&text, section, token_key, &short),
            );
            assert_eq!(code, Some(2), "{name}: {stderr}");
            assert_eq!(stderr.trim().lines().count(), 1, "{name}: {stderr}");
            assert!(stderr.contains("at least 16"), "{name}: {stderr}");
        }
    }
}
