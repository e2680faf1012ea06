//! `agent-r1 bench fuzz`: random inputs against the parsers a run trusts, counting panics
//! (there must be none): the tool-call parser of every format, the chat template's rendering
//! of tool results into tokens, and the config parser and validator. Every case is a pure
//! function of (seed, target, case number), so a reported case can be reproduced.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::config::{FileCheck, TrainConfig};
use crate::registries::Registries;
use agent_r1_actors::runtime::TurnRenderer;
use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_envs::message::Message;
use agent_r1_envs::tool_call::ToolCallFormat;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Flags of `agent-r1 bench fuzz`.
#[derive(Debug, clap::Args)]
pub(crate) struct FuzzBench {
    /// Cases per target.
    #[arg(long, default_value_t = 10_000_000)]
    cases: u64,
    /// Targets: tool_calls, tool_results, config.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "tool_calls,tool_results,config"
    )]
    targets: Vec<String>,
    /// Seed of the case generator.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

/// Pieces the generators assemble: the syntax the parsers look for, and what breaks it.
const FRAGMENTS: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<|python_tag|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "{",
    "}",
    "[",
    "]",
    "\"",
    "\\",
    "\\u",
    "\\ud800",
    ":",
    ",",
    "\"name\"",
    "\"arguments\"",
    "\"parameters\"",
    "\"search\"",
    "search",
    "null",
    "true",
    "1e309",
    "-0",
    "123456789012345678901234567890",
    "\n",
    " ",
    "\t",
    "\u{0}",
    "é",
    "🙂",
    "\u{FFFD}",
    "\u{202E}",
    "{{",
    "}}",
    "{%",
    "%}",
    "{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}",
    "{\"name\": \"search\", \"parameters\": {\"query\": 1}}",
    "[[[[[[[[[[[[[[[[",
    "]]]]]]]]",
];

/// TOML values a mutated config may get: out of range, wrong type, huge, empty.
const VALUES: &[&str] = &[
    "-1",
    "0",
    "1",
    "1e30",
    "inf",
    "-inf",
    "nan",
    "\"\"",
    "\"x\"",
    "[]",
    "{}",
    "true",
    "18446744073709551616",
    "-9223372036854775809",
    "1.5",
    "\"cuda:99\"",
    "\"auto\"",
    "[1, \"a\"]",
    "{ a = 1 }",
    "0.0000001",
    "\"../../etc/passwd\"",
];

fn text(rng: &mut ChaCha8Rng, max_pieces: usize) -> String {
    let mut s = String::new();
    for _ in 0..rng.random_range(1..=max_pieces) {
        if rng.random_bool(0.2) {
            s.push(char::from_u32(rng.random_range(0..0x3000)).unwrap_or('?'));
        } else {
            s.push_str(FRAGMENTS[rng.random_range(0..FRAGMENTS.len())]);
        }
    }
    s
}

fn mutate_config(rng: &mut ChaCha8Rng, base: &str) -> String {
    let mut lines: Vec<String> = base.lines().map(str::to_string).collect();
    for _ in 0..rng.random_range(1..=4) {
        if lines.is_empty() {
            break;
        }
        let i = rng.random_range(0..lines.len());
        match rng.random_range(0..6) {
            0 => {
                lines.remove(i);
            }
            1 => {
                let dup = lines[i].clone();
                lines.insert(i, dup);
            }
            2 => {
                if let Some((key, _)) = lines[i].split_once('=') {
                    lines[i] = format!("{key}= {}", VALUES[rng.random_range(0..VALUES.len())]);
                }
            }
            3 => lines.insert(
                i,
                format!(
                    "{} = {}",
                    text(rng, 2).replace(['\n', '='], ""),
                    VALUES[rng.random_range(0..VALUES.len())]
                ),
            ),
            4 => {
                // A misspelt key: two characters swapped.
                let mut chars: Vec<char> = lines[i].chars().collect();
                if chars.len() > 2 {
                    let j = rng.random_range(0..chars.len() - 1);
                    chars.swap(j, j + 1);
                    lines[i] = chars.into_iter().collect();
                }
            }
            _ => {
                let cut = rng.random_range(0..=lines[i].len());
                let cut = (0..=cut)
                    .rev()
                    .find(|&c| lines[i].is_char_boundary(c))
                    .unwrap_or(0);
                lines[i].truncate(cut);
            }
        }
    }
    lines.join("\n")
}

/// A target: makes a case's input (one or more strings) from its generator, and runs it
/// (`false`: the target rejected the input with an error, which is fine).
struct Target {
    name: String,
    make: Box<MakeInput>,
    check: Box<CheckInput>,
}

/// Makes a case's input from its generator.
type MakeInput = dyn Fn(&mut ChaCha8Rng) -> Vec<String> + Send + Sync;
/// Runs a case; `false` is an input rejected with an error.
type CheckInput = dyn Fn(&[String]) -> bool + Send + Sync;

fn targets(names: &[String]) -> anyhow::Result<(Vec<Target>, tempfile::TempDir)> {
    let tmp = tempfile::tempdir()?;
    let mut out = vec![];
    for name in names {
        let target = match name.as_str() {
            "tool_calls" => Target {
                name: name.clone(),
                make: Box::new(|rng| vec![text(rng, 24)]),
                check: Box::new(|input| {
                    ToolCallFormat::ALL
                        .iter()
                        .all(|f| f.parse(&input[0]).iter().all(|c| c.is_ok()))
                }),
            },
            "tool_results" => {
                let dir = tmp.path().join("tiny");
                crate::setup::init_model("tiny", &dir, None, 4096, 0, true)?;
                let tokenizer = Arc::new(HfTokenizer::from_dir(&dir)?);
                let action = tokenizer.encode(
                    "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}\n</tool_call>",
                    false,
                )?;
                let renderer = TurnRenderer::new(tokenizer, vec![], None)?;
                Target {
                    name: name.clone(),
                    make: Box::new(|rng| {
                        let n = rng.random_range(1..=3);
                        (0..n).map(|_| text(rng, 16)).collect()
                    }),
                    check: Box::new(move |input| {
                        let observations: Vec<Message> =
                            input.iter().map(|t| Message::tool(t.clone())).collect();
                        renderer.continuation(&action, &observations).is_ok()
                    }),
                }
            }
            "config" => {
                let base = include_str!("../../examples/demo.toml");
                let registries = Registries::builtins();
                Target {
                    name: name.clone(),
                    make: Box::new(move |rng| vec![mutate_config(rng, base)]),
                    check: Box::new(move |input| {
                        TrainConfig::from_toml_str(&input[0])
                            .and_then(|c| c.validate(FileCheck::Skip, &registries))
                            .is_ok()
                    }),
                }
            }
            other => anyhow::bail!(
                "--targets: unknown target `{other}` (allowed: tool_calls, tool_results, config)"
            ),
        };
        out.push(target);
    }
    Ok((out, tmp))
}

pub(crate) fn run(args: FuzzBench) -> anyhow::Result<()> {
    let (targets, _tmp) = targets(&args.targets)?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    // Panics are what is counted; their default report would flood stderr.
    std::panic::set_hook(Box::new(|_| {}));
    let mut rows = vec![];
    for target in &targets {
        let name = &target.name;
        let t0 = Instant::now();
        let next = AtomicU64::new(0);
        let (panics, rejected) = (AtomicU64::new(0), AtomicU64::new(0));
        let first_panic: Mutex<Option<(u64, Vec<String>)>> = Mutex::new(None);
        let target_seed = name.bytes().fold(args.seed, |h, b| {
            h.wrapping_mul(31).wrapping_add(u64::from(b))
        });
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= args.cases {
                        break;
                    }
                    let mut rng = ChaCha8Rng::seed_from_u64(
                        target_seed.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                    );
                    let input = (target.make)(&mut rng);
                    match catch_unwind(AssertUnwindSafe(|| (target.check)(&input))) {
                        Ok(true) => {}
                        Ok(false) => {
                            rejected.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            panics.fetch_add(1, Ordering::Relaxed);
                            let mut first = first_panic.lock().unwrap_or_else(|p| p.into_inner());
                            first.get_or_insert((i, input));
                        }
                    }
                });
            }
        });
        let secs = t0.elapsed().as_secs_f64();
        let panics = panics.load(Ordering::Relaxed);
        let rejected = rejected.load(Ordering::Relaxed);
        eprintln!(
            "{name}: {} cases in {secs:.0} s ({:.0}/s, {threads} threads): {panics} panics, \
             {rejected} inputs rejected with an error",
            args.cases,
            args.cases as f64 / secs,
        );
        if let Some((i, input)) = first_panic.into_inner().unwrap_or_else(|p| p.into_inner()) {
            eprintln!(
                "  first panic: case {i} (seed {}), input {input:?}",
                args.seed
            );
        }
        rows.push(serde_json::json!({
            "target": name, "cases": args.cases, "panics": panics,
            "rejected": rejected, "seconds": secs, "threads": threads,
        }));
    }
    let _ = std::panic::take_hook();
    println!("{}", serde_json::Value::Array(rows));
    Ok(())
}
