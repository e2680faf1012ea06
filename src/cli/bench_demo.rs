//! `agent-r1 bench demo`: a built-in preset (`make demo`'s by default) trained on several
//! seeds, one after the other, each a `train` subprocess of this binary: every seed's
//! held-out EM before and after RL, the lift, the warm start's and the run's wall time, and
//! the spread over the seeds.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use serde_json::Value;

use crate::config::preset_text;
use crate::train::lift_standard_error;
use crate::train::records::{read_rows, EvalRow};

/// Flags of `agent-r1 bench demo`.
#[derive(Debug, clap::Args)]
pub(crate) struct DemoBench {
    /// Runs, one per seed: `training.seed` = `--first-seed`, `--first-seed` + 1, ...
    /// (the generated world, and so the held-out questions, stay the preset's).
    #[arg(long, default_value_t = 3)]
    seeds: u64,
    /// The first run's `training.seed`.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// The built-in config to run (`demo`, `math`).
    #[arg(long, default_value = "demo")]
    preset: String,
    /// `training.updates` instead of the preset's.
    #[arg(long)]
    updates: Option<u64>,
    /// Where the runs go, one directory per seed, kept (default: a temporary directory,
    /// removed afterwards).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// What one seed's run measured.
#[derive(Debug, Clone, PartialEq)]
struct SeedFigures {
    seed: u64,
    em_before: f64,
    em_after: f64,
    /// Held-out questions of the first and the last evaluation.
    questions: usize,
    warm_start_s: f64,
    wall_s: f64,
}

impl SeedFigures {
    fn lift(&self) -> f64 {
        self.em_after - self.em_before
    }

    /// The standard error of the lift, as for two independent samples of `questions`
    /// (the two evaluations share their questions, so this errs on the wide side).
    fn lift_standard_error(&self) -> f64 {
        lift_standard_error(self.em_before, self.em_after, self.questions)
    }
}

pub(crate) fn run(args: DemoBench) -> anyhow::Result<()> {
    let preset = validate(&args)?;
    let (_tmp, out) = crate::cli::bench_support::runs_dir(args.out.as_deref())?;
    writable(&out)?;
    let this = std::env::current_exe().context("locating this binary")?;
    let mut figures = Vec::new();
    for seed in args.first_seed..args.first_seed + args.seeds {
        let dir = out.join(format!("seed-{seed}"));
        eprintln!(
            "seed {seed}: {} train --preset {} (training.seed = {seed}) ...",
            this.display(),
            args.preset
        );
        let f = run_seed(&this, preset, seed, args.updates, &dir)?;
        eprintln!(
            "seed {seed}: EM {:.3} -> {:.3} ({:+.3}), wall {:.0} s",
            f.em_before,
            f.em_after,
            f.lift(),
            f.wall_s
        );
        figures.push(f);
    }
    println!("{}", table(&args.preset, &figures));
    Ok(())
}

/// The preset's text, once the flags are known to be usable.
fn validate(args: &DemoBench) -> anyhow::Result<&'static str> {
    anyhow::ensure!(args.seeds >= 1, "--seeds must be at least 1 (got 0)");
    anyhow::ensure!(
        args.updates.is_none_or(|u| u >= 1),
        "--updates must be at least 1 (got 0)"
    );
    Ok(preset_text(&args.preset)?)
}

/// Refuses an `--out` this process cannot write into, before any run starts.
fn writable(out: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)
        .with_context(|| format!("--out {}: cannot create the directory", out.display()))?;
    let probe = out.join(".bench-demo-probe");
    std::fs::write(&probe, b"")
        .with_context(|| format!("--out {}: cannot write into it", out.display()))?;
    let _ = std::fs::remove_file(probe);
    Ok(())
}

/// The preset with `training.seed` (and `training.updates`) set, as TOML.
fn seeded_config(preset: &str, seed: u64, updates: Option<u64>) -> anyhow::Result<String> {
    let mut table: toml::Table = preset.parse().context("parsing the built-in preset")?;
    let training = table
        .entry("training")
        .or_insert_with(|| toml::Value::Table(Default::default()))
        .as_table_mut()
        .context("the preset's [training] is not a table")?;
    training.insert("seed".into(), toml::Value::Integer(seed as i64));
    if let Some(u) = updates {
        training.insert("updates".into(), toml::Value::Integer(u as i64));
    }
    toml::to_string(&table).context("writing the seeded config")
}

/// One `train` run of the preset at `seed` into `dir` (removed first): its output goes to
/// `dir/train.log`, its figures come from its summary line and `eval.jsonl`.
fn run_seed(
    this: &Path,
    preset: &str,
    seed: u64,
    updates: Option<u64>,
    dir: &Path,
) -> anyhow::Result<SeedFigures> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    let config = dir.join("bench.toml");
    std::fs::write(&config, seeded_config(preset, seed, updates)?)
        .with_context(|| format!("{}: cannot write", config.display()))?;
    let log_path = dir.join("train.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("{}: cannot create", log_path.display()))?;
    let output = Command::new(this)
        .arg("train")
        .arg("--config")
        .arg(&config)
        .arg("--out")
        .arg(dir)
        .stderr(log)
        .output()
        .with_context(|| format!("running {} train", this.display()))?;
    anyhow::ensure!(
        output.status.success(),
        "seed {seed}: train failed ({}); see {}",
        output.status,
        log_path.display()
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary: Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .with_context(|| format!("seed {seed}: train printed no JSON summary"))?;
    let evals: Vec<EvalRow> = read_rows(&dir.join("eval.jsonl"))?;
    let (Some(first), Some(last)) = (evals.first(), evals.last()) else {
        anyhow::bail!(
            "seed {seed}: no held-out evaluation in {} (the preset needs [eval])",
            dir.join("eval.jsonl").display()
        );
    };
    Ok(SeedFigures {
        seed,
        em_before: first.em,
        em_after: last.em,
        questions: first.episodes.min(last.episodes),
        warm_start_s: summary["warm_start"]["seconds"].as_f64().unwrap_or(0.0),
        wall_s: summary["wall_s"].as_f64().unwrap_or(0.0),
    })
}

/// Each seed's row, then the mean, the lowest lift and the spread.
fn table(preset: &str, figures: &[SeedFigures]) -> String {
    let mut out = format!(
        "bench demo --preset {preset}: held-out EM (greedy) after the warm start and after RL\n\
         {:>6} {:>10} {:>10} {:>16} {:>14} {:>10} {:>10}\n",
        "seed", "EM before", "EM after", "lift (+- s.e.)", "warm start s", "RL s", "train s"
    );
    for f in figures {
        out.push_str(&format!(
            "{:>6} {:>10.3} {:>10.3} {:>+9.3} +-{:.3} {:>14.0} {:>10.0} {:>10.0}\n",
            f.seed,
            f.em_before,
            f.em_after,
            f.lift(),
            f.lift_standard_error(),
            f.warm_start_s,
            f.wall_s - f.warm_start_s,
            f.wall_s
        ));
    }
    let n = figures.len() as f64;
    let lifts: Vec<f64> = figures.iter().map(SeedFigures::lift).collect();
    let mean = lifts.iter().sum::<f64>() / n;
    let sd = if figures.len() > 1 {
        (lifts.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    let lowest = lifts.iter().copied().fold(f64::INFINITY, f64::min);
    let longest = figures.iter().map(|f| f.wall_s).fold(0.0, f64::max);
    let questions = figures.iter().map(|f| f.questions).min().unwrap_or(0);
    out.push_str(&format!(
        "lift over {} seeds: mean {mean:+.3}, standard deviation {sd:.3}, lowest {lowest:+.3}; \
         longest train {longest:.0} s; {questions} held-out questions per evaluation",
        figures.len()
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(seeds: u64, preset: &str) -> DemoBench {
        DemoBench {
            seeds,
            first_seed: 0,
            preset: preset.into(),
            updates: None,
            out: None,
        }
    }

    #[test]
    fn zero_seeds_and_unknown_presets_are_refused_naming_the_flag() {
        let e = validate(&args(0, "demo")).unwrap_err().to_string();
        assert!(e.contains("--seeds") && e.contains("at least 1"), "{e}");
        let e = validate(&args(3, "dmeo")).unwrap_err().to_string();
        assert!(e.contains("`dmeo`") && e.contains("demo, math"), "{e}");
        assert!(validate(&args(1, "math")).is_ok());
    }

    #[test]
    fn the_seeded_config_sets_the_seed_and_updates_and_keeps_the_rest() {
        let demo = preset_text("demo").unwrap();
        let text = seeded_config(demo, 7, Some(3)).unwrap();
        let parsed = crate::config::TrainConfig::from_toml_str(&text).unwrap();
        let original = crate::config::TrainConfig::from_toml_str(demo).unwrap();
        assert_eq!(parsed.training.seed, 7);
        assert_eq!(parsed.training.updates, 3);
        assert_eq!(parsed.warm_start, original.warm_start);
        assert_eq!(parsed.rollout, original.rollout);
    }

    #[test]
    fn the_table_has_each_seed_and_the_spread() {
        let f = |seed, before, after| SeedFigures {
            seed,
            em_before: before,
            em_after: after,
            questions: 64,
            warm_start_s: 100.0,
            wall_s: 250.0,
        };
        let t = table("demo", &[f(0, 0.1, 0.7), f(1, 0.2, 0.6)]);
        assert!(t.contains("+0.600") && t.contains("+0.400"), "{t}");
        assert!(
            t.contains("mean +0.500") && t.contains("lowest +0.400"),
            "{t}"
        );
        assert!(t.contains("standard deviation 0.141"), "{t}");
        // sqrt(0.1*0.9/64 + 0.7*0.3/64) = 0.068
        assert!(t.contains("+-0.068"), "{t}");
    }
}
