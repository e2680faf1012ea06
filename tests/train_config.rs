//! The shipped example configs parse and validate, and `agent-r1 check-config` reports a
//! bad key with its path and exit code 2.

use std::path::Path;
use std::process::Command;

use agent_r1::config::{FileCheck, TrainConfig};

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
        let config = TrainConfig::load(&path, FileCheck::Skip).unwrap_or_else(|e| panic!("{e}"));
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
            "grpo.toml",
            "hotpotqa_qwen2.5.toml",
            "ppo_critic.toml"
        ]
    );
    // The demo needs no files at all.
    TrainConfig::load(
        &Path::new(ROOT).join("examples/demo.toml"),
        FileCheck::Require,
    )
    .unwrap();
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
        stderr.contains("bad.toml: `algorithm.ppo_epochs`: got 0; allowed: >= 1"),
        "{stderr}"
    );
}

#[test]
fn a_separate_critic_needs_an_estimator_with_a_critic() {
    let base = "[model]\npreset = \"tiny\"\n[env]\nname = \"synthetic_multihop\"\n";
    let grpo = format!("{base}[algorithm]\nestimator = \"grpo\"\n[critic]\nseparate = true\n");
    let e = TrainConfig::from_toml_str(&grpo)
        .unwrap()
        .validate(FileCheck::Skip)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("critic") && e.contains("grpo") && e.contains("gae, step_gae"),
        "{e}"
    );
    let stray = format!("{base}[algorithm]\nestimator = \"gae\"\n[critic]\nmodel = \"x\"\n");
    let e = TrainConfig::from_toml_str(&stray)
        .unwrap()
        .validate(FileCheck::Skip)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("critic.model") && e.contains("separate = true"),
        "{e}"
    );
    let ok = format!("{base}[algorithm]\nestimator = \"gae\"\n[critic]\nseparate = true\n");
    TrainConfig::from_toml_str(&ok)
        .unwrap()
        .validate(FileCheck::Skip)
        .unwrap();
}
