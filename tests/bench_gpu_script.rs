//! `scripts/bench_gpu.sh`, the engine's GPU benchmark, run as far as a CPU allows: the
//! tiny preset at small sizes. Every step of the GPU run happens (model directory, `bench
//! decode` against the bandwidth floor with its `--verify` re-scoring, transformers'
//! `generate` on the same shapes, `bench rollout`, the eager pass, the table), so the command
//! a GPU session runs is known to work. The speeds are
//! benchmark figures and are not asserted; what each step produced is.

use std::path::Path;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn the_gpu_benchmark_script_runs_on_the_cpu() {
    let out = tempfile::tempdir().unwrap();
    let run = Command::new("bash")
        .arg("scripts/bench_gpu.sh")
        .current_dir(ROOT)
        .env("DEVICE", "cpu")
        .env("SHAPES", "tiny")
        .env("BATCH_SIZES", "1,6")
        .env("PROMPT_LEN", "24")
        .env("NEW_TOKENS", "10")
        .env("REPEATS", "1")
        .env("EPISODES", "12")
        .env("VERIFY", "2")
        .env("EAGER", "1")
        .env("BIN", env!("CARGO_BIN_EXE_agent-r1"))
        .env("PY", Path::new(ROOT).join(".venv/bin/python"))
        .env("OUT", out.path())
        .env("OMP_NUM_THREADS", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        stdout.contains("| shape | batch | agent-r1 tokens/s | step ms | floor ms |"),
        "{stdout}"
    );
    let decode = lines(&out.path().join("decode.jsonl"));
    let hf = lines(&out.path().join("hf.jsonl"));
    assert_eq!(decode.len(), 2, "{decode:?}");
    assert_eq!(hf.len(), 2, "{hf:?}");
    for (ours, theirs) in decode.iter().zip(&hf) {
        let batch = ours["batch"].as_u64().unwrap();
        assert_eq!(theirs["batch"].as_u64(), Some(batch));
        // No early stop on either side: the same work.
        assert_eq!(
            ours["tokens_generated"].as_u64(),
            Some(batch * 10),
            "{ours}"
        );
        assert_eq!(
            theirs["tokens_generated"].as_u64(),
            Some(batch * 10),
            "{theirs}"
        );
        assert!(ours["decode_steps"].as_u64().unwrap() >= 9, "{ours}");
        // The engine's log-probabilities against a plain forward pass (float32 on the CPU).
        let verify = &ours["verify"];
        assert_eq!(verify["tokens"].as_u64(), Some(batch.min(2) * 10), "{ours}");
        assert!(
            verify["max_abs_logprob_diff"].as_f64().unwrap() < 1e-4,
            "{ours}"
        );
        // No CUDA graphs off a GPU, and nothing to say why.
        assert_eq!(ours["graph_decode_steps"].as_u64(), Some(0), "{ours}");
        assert!(ours["cuda_graphs_off"].is_null(), "{ours}");
        for key in [
            "floor_ms",
            "step_ms",
            "floor_fraction",
            "copy_bandwidth_gb_s",
        ] {
            let v = ours[key].as_f64().unwrap();
            assert!(v.is_finite() && v > 0.0, "{key}: {ours}");
        }
    }
    let eager = lines(&out.path().join("eager.jsonl"));
    assert_eq!(eager.len(), 2, "{eager:?}");
    assert!(stdout.contains("| eager step ms |"), "{stdout}");
    let rollout = lines(&out.path().join("rollout.jsonl"));
    assert_eq!(rollout.len(), 1);
    assert_eq!(rollout[0]["episodes_completed"].as_u64(), Some(12));
    assert_eq!(rollout[0]["episodes_lost"].as_u64(), Some(0));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["decode"].as_array().unwrap().len(), 2);
    assert!(summary["decode"][1]["speedup"].as_f64().unwrap() > 0.0);
}

/// `scripts/bench_gpu_mismatch.sh` (the sampler/trainer gap of short training runs in bf16
/// with and without CUDA graphs and in float32) as far as a CPU allows: the float32 variant
/// of the tiny preset. The gap in float32 is rounding.
#[test]
fn the_gpu_mismatch_script_runs_on_the_cpu() {
    let out = tempfile::tempdir().unwrap();
    let run = Command::new("bash")
        .arg("scripts/bench_gpu_mismatch.sh")
        .current_dir(ROOT)
        .env("DEVICE", "cpu")
        .env("SHAPE", "tiny")
        .env("VARIANTS", "float32")
        .env("UPDATES", "2")
        .env("BATCH", "4")
        .env("GROUP", "2")
        .env("RESPONSE", "16")
        .env("BIN", env!("CARGO_BIN_EXE_agent-r1"))
        .env("OUT", out.path())
        .env("OMP_NUM_THREADS", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        stdout.contains("| variant | updates | tokens |"),
        "{stdout}"
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("summary.json")).unwrap())
            .unwrap();
    let row = &summary["rows"][0];
    assert_eq!(row["variant"], "float32");
    assert_eq!(row["updates"], 2);
    assert!(row["tokens"].as_u64().unwrap() > 0, "{row}");
    let max = row["abs_max"].as_f64().unwrap();
    assert!((0.0..1e-4).contains(&max), "float32 gap is rounding: {row}");
}

/// `scripts/gpu_lora_8b.sh` (a short LoRA run at the Llama 3.1 8B shape, its plan beside its
/// measured peak) as far as a CPU allows: the tiny preset, one update.
#[test]
fn the_gpu_lora_run_script_runs_on_the_cpu() {
    let out = tempfile::tempdir().unwrap();
    let run = Command::new("bash")
        .arg("scripts/gpu_lora_8b.sh")
        .current_dir(ROOT)
        .env("DEVICE", "cpu")
        .env("SHAPE", "tiny")
        .env("UPDATES", "1")
        .env("BATCH", "2")
        .env("GROUP", "2")
        .env("TURNS", "2")
        .env("RESPONSE", "16")
        .env("CONCURRENCY", "4")
        .env("LORA_RANK", "4")
        .env("BIN", env!("CARGO_BIN_EXE_agent-r1"))
        .env("OUT", out.path())
        .env("OMP_NUM_THREADS", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    for needle in [
        "LoRA rank 4",
        "LoRA state (adapters, grads, AdamW)",
        "predicted peak",
        "measured peak:",
        "measured / planned:",
    ] {
        assert!(stdout.contains(needle), "{needle:?} not in {stdout}");
    }
    // The KL term's reference is the base with the adapters off: the plan holds no copy.
    assert!(!stdout.contains("reference model"), "{stdout}");
    let rows = std::fs::read_to_string(out.path().join("run/metrics.jsonl")).unwrap();
    assert_eq!(rows.lines().count(), 1, "{rows}");
}
