//! agent-r1's learner update against the same GRPO update written independently in plain
//! PyTorch + transformers (`scripts/torch_learner_bench.py`), through the GPU comparison's
//! own script (`scripts/bench_gpu_learner.sh`) run on the CPU: same model directory, same
//! synthetic batch, gradient accumulation over two micro-batches. The first update's policy
//! loss and gradient norm agree to float32 rounding, so the script compares the same work
//! on a GPU. Its speed and memory verdict is a benchmark figure and is not asserted here.

use std::path::Path;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn last_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap();
    let line = text.lines().rev().find(|l| l.starts_with('{')).unwrap();
    serde_json::from_str(line).unwrap()
}

#[test]
fn the_learner_update_equals_plain_pytorch() {
    let out = tempfile::tempdir().unwrap();
    let run = Command::new("bash")
        .arg("scripts/bench_gpu_learner.sh")
        .current_dir(ROOT)
        .env("DEVICE", "cpu")
        .env("SHAPE", "tiny")
        .env("BIN", env!("CARGO_BIN_EXE_agent-r1"))
        .env("PY", Path::new(ROOT).join(".venv/bin/python"))
        .env("OUT", out.path())
        .env("OMP_NUM_THREADS", "1")
        .env("TRAJECTORIES", "8")
        .env("GROUP_SIZE", "4")
        .env("PROMPT_TOKENS", "40")
        .env("STEPS", "2")
        .env("ACTION_TOKENS", "24")
        .env("OBSERVATION_TOKENS", "8")
        .env("MICRO_BATCH_SIZE", "4")
        .env("LOGITS_CHUNK_TOKENS", "50")
        .env("UPDATES", "2")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("speed  agent-r1 / pytorch"), "{stdout}");
    let ours = last_json(&out.path().join("agent-r1.json"));
    let theirs = last_json(&out.path().join("pytorch.json"));
    let ours = &ours["results"][0]["updates"];
    let relative = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-12);
    // Both timed updates: the second starts from weights the first (and the warm-up) moved.
    for (u, theirs) in theirs["results"][0]["updates"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        let (a, b) = (
            ours[u]["policy_loss"].as_f64().unwrap(),
            theirs["policy_loss"].as_f64().unwrap(),
        );
        assert!(relative(a, b) < 1e-5, "update {u}: policy loss {a} vs {b}");
        assert!(a.abs() > 1e-6, "a loss of zero would prove nothing");
        let (a, b) = (
            ours[u]["grad_norm"].as_f64().unwrap(),
            theirs["grad_norm"].as_f64().unwrap(),
        );
        assert!(
            relative(a, b) < 1e-4,
            "update {u}: gradient norm {a} vs {b}"
        );
    }
}
