//! The config's parsing and validation rules, key by key.

use agent_r1_actors::algo::{KlKind, LossAgg};
use agent_r1_actors::learner::{Estimator, KlPlacement};
use agent_r1_envs::tools::ToolsConfig;
use serde_json::json;

use super::*;

const MINIMAL: &str = r#"
[model]
preset = "tiny"
device = "cpu"

[env]
name = "synthetic_multihop"
"#;

fn parse(extra: &str) -> Result<TrainConfig, ConfigError> {
    TrainConfig::from_toml_str(&format!("{MINIMAL}{extra}"))
}

fn invalid(extra: &str) -> ConfigError {
    match parse(extra) {
        Ok(c) => c
            .validate(FileCheck::Skip, &Registries::builtins())
            .expect_err("expected a validation error"),
        Err(e) => e,
    }
}

#[test]
fn minimal_config_takes_agent_r1_defaults() {
    let c = parse("").unwrap();
    c.validate(FileCheck::Require, &Registries::builtins())
        .unwrap();
    let l = c.learner_config();
    let a = &l.algorithm;
    assert_eq!(a.estimator, Estimator::Grpo);
    assert_eq!((a.gamma, a.lambda), (1.0, 1.0));
    assert_eq!((a.actor_lr, a.critic_lr), (1e-6, 1e-5));
    assert_eq!(a.clip_ratio_c, 3.0);
    let kl = a.kl.active().unwrap();
    assert_eq!((kl.kind, kl.coef), (KlKind::K3, 0.001));
    assert_eq!(l.max_staleness, None);
    assert_eq!(a.critic_warmup(), 0, "GRPO has no critic");
    assert_eq!(c.rollout.group_size, 5);
    assert_eq!(c.rollout.max_turns, 10);
    assert_eq!(c.metrics.address, "127.0.0.1:9464");
    assert_eq!(
        c.metrics.socket_addr().unwrap(),
        "127.0.0.1:9464".parse().unwrap()
    );
    // The resolved TOML reads back to the same config.
    let back = TrainConfig::from_toml_str(&c.to_toml_string()).unwrap();
    assert_eq!(back, c);
}

#[test]
fn sections_map_onto_the_learner_config() {
    let c = parse(
        r#"
[algorithm]
estimator = "gae"
ppo_epochs = 2
betas = [0.8, 0.95]
loss_agg = "seq-mean-token-sum"
[algorithm.kl]
placement = "in_reward"
kind = "k1"
coef = 0.01
[rollout]
temperature = 0.7
max_context_length = 2048
group_size = 1
[training]
mode = "async"
max_staleness = 2
decoupled_ppo = true
behavior_weight_cap = 3.0
seed = 7
"#,
    )
    .unwrap();
    c.validate(FileCheck::Skip, &Registries::builtins())
        .unwrap();
    let l = c.learner_config();
    let a = &l.algorithm;
    assert_eq!(a.estimator, Estimator::Gae);
    assert_eq!(a.ppo_epochs, 2);
    assert_eq!(a.betas, [0.8, 0.95]);
    assert_eq!(a.loss_agg, LossAgg::SeqMeanTokenSum);
    let kl = a.kl.active().unwrap();
    assert_eq!(
        (kl.placement, kl.kind, kl.coef),
        (KlPlacement::InReward, KlKind::K1, 0.01)
    );
    assert_eq!((l.temperature, l.max_len), (0.7, 2048));
    assert_eq!((l.max_staleness, l.seed), (Some(2), 7));
    assert_eq!(l.behavior_weight_cap, Some(3.0));
    assert_eq!(a.critic_warmup(), 5, "a critic warms up as in Agent-R1");
}

#[test]
fn unknown_key_names_its_path_line_and_the_allowed_keys() {
    let e = invalid("[algorithm]\nppo_epoch = 2\n");
    assert_eq!(e.key, "algorithm.ppo_epoch", "{e}");
    assert_eq!(e.position.map(|p| p.0), Some(9), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("unknown field `ppo_epoch`"), "{msg}");
    assert!(msg.contains("ppo_epochs"), "allowed keys listed: {msg}");
    // A whole unknown section too.
    let e = invalid("[trainer]\nx = 1\n");
    assert!(
        e.key == "trainer" && e.message.contains("unknown field `trainer`"),
        "{e}"
    );
}

#[test]
fn wrong_type_names_key_given_and_expected() {
    let e = invalid("[algorithm]\nppo_epochs = \"two\"\n");
    assert_eq!(e.key, "algorithm.ppo_epochs", "{e}");
    assert!(
        e.message.contains("\"two\"") && e.message.contains("expected"),
        "{e}"
    );
    let e = invalid("[rollout]\nbatch_size = -3\n");
    assert_eq!(e.key, "rollout.batch_size", "{e}");
    let e = invalid("[algorithm]\nestimator = \"ppo\"\n");
    assert_eq!(e.key, "algorithm.estimator", "{e}");
    assert!(
        e.message.contains("`ppo`") && e.message.contains("`step_gae`"),
        "{e}"
    );
    let e = invalid("[training]\nmode = \"later\"\n");
    assert!(
        e.key == "training.mode" && e.message.contains("`async`"),
        "{e}"
    );
    let e = invalid("[training]\ndecoupled_ppo = true\n");
    assert!(
        e.key == "training.decoupled_ppo" && e.message.contains("mode = \"async\""),
        "{e}"
    );
    let e =
        invalid("[training]\nmode = \"async\"\ndecoupled_ppo = true\nbehavior_weight_cap = 0.5\n");
    assert!(
        e.key == "training.behavior_weight_cap" && e.message.contains(">= 1"),
        "{e}"
    );
}

#[test]
fn rollout_correction_reads_its_section_and_refuses_bounds_out_of_range() {
    let c = parse(
        "[algorithm.rollout_correction]\nweight = \"sequence\"\nweight_cap = 3.0\n\
         reject = \"geometric\"\nreject_lower = 0.9\nreject_upper = 1.1\n",
    )
    .unwrap();
    let rc = &c.algorithm.rollout_correction;
    assert_eq!(rc.weight, agent_r1_actors::algo::WeightLevel::Sequence);
    assert_eq!(rc.reject, agent_r1_actors::algo::RejectLevel::Geometric);
    assert_eq!(
        (rc.weight_cap, rc.reject_lower, rc.reject_upper),
        (3.0, 0.9, 1.1)
    );
    for (line, key, allowed) in [
        ("weight_cap = 0.5", "weight_cap", ">= 1"),
        ("reject_lower = 1.5", "reject_lower", "(0, 1]"),
        ("reject_lower = 0", "reject_lower", "(0, 1]"),
        ("reject_upper = 0.5", "reject_upper", ">= 1"),
        ("report_threshold = 0", "report_threshold", "> 0"),
        ("weight = \"tokens\"", "weight", "`token`"),
        ("reject = \"seq\"", "reject", "`geometric`"),
    ] {
        let e = invalid(&format!("[algorithm.rollout_correction]\n{line}\n"));
        assert!(
            e.key == format!("algorithm.rollout_correction.{key}")
                && e.to_string().contains(allowed),
            "{line}: {e}"
        );
    }
}

#[test]
fn syntax_error_has_a_position() {
    let e = TrainConfig::from_toml_str("[model\npreset = 1").unwrap_err();
    assert_eq!(e.position.map(|p| p.0), Some(1), "{e}");
    let e = TrainConfig::from_toml_str("").unwrap_err();
    assert!(e.message.contains("missing field `model`"), "{e}");
}

#[test]
fn out_of_range_values_name_key_given_and_allowed() {
    for (extra, key, given, allowed) in [
        (
            "max_tool_calls_per_turn = 0",
            "env.max_tool_calls_per_turn",
            "got 0",
            "an integer in [1, 64]",
        ),
        (
            "[algorithm]\nppo_epochs = 0",
            "algorithm.ppo_epochs",
            "got 0",
            ">= 1",
        ),
        (
            "[algorithm]\ngamma = 1.5",
            "algorithm.gamma",
            "got 1.5",
            "[0, 1]",
        ),
        (
            "[algorithm]\nactor_lr = -1e-6",
            "algorithm.actor_lr",
            "got -1e-6",
            "> 0",
        ),
        (
            "[algorithm]\nbetas = [0.9, 1.0]",
            "algorithm.betas",
            "got [0.9, 1.0]",
            "each a finite number in [0, 1)",
        ),
        (
            "[algorithm]\nclip_ratio_low = 1.0",
            "algorithm.clip_ratio_low",
            "got 1.0",
            "[0, 1)",
        ),
        (
            "[rollout]\nenv_timeout_secs = inf",
            "rollout.env_timeout_secs",
            "got inf",
            "(0, 604800]",
        ),
        (
            "[stall]\ntool_secs = 1e30",
            "stall.tool_secs",
            "got 1e30",
            "(0, 604800]",
        ),
        (
            "[algorithm]\nentropy_coef = nan",
            "algorithm.entropy_coef",
            "got nan",
            "a finite number",
        ),
        (
            "[algorithm]\nclip_ratio_c = 1.0",
            "algorithm.clip_ratio_c",
            "got 1",
            "> 1",
        ),
        (
            "[algorithm.kl]\nkind = \"k9\"",
            "algorithm.kl.kind",
            "`k9`",
            "low_var_kl",
        ),
        (
            "[algorithm]\nloss_agg = \"mean\"",
            "algorithm.loss_agg",
            "`mean`",
            "token-mean",
        ),
        (
            "[rollout]\ngroup_size = 1",
            "rollout.group_size",
            "got 1",
            ">= 2",
        ),
        ("[rollout]\ntop_p = 0.0", "rollout.top_p", "got 0", "(0, 1]"),
        (
            "[rollout]\nmax_context_length = 100",
            "rollout.max_context_length",
            "got 100",
            "1536",
        ),
        (
            "[training]\nupdates = 0",
            "training.updates",
            "got 0",
            ">= 1",
        ),
        (
            "[training]\nmode = \"async\"\nmax_staleness = 0",
            "training.max_staleness",
            "got 0",
            ">= 1",
        ),
        (
            "[checkpoint]\nkeep_last = 0",
            "checkpoint.keep_last",
            "got 0",
            ">= 1",
        ),
        (
            "[metrics]\naddress = \"localhost\"",
            "metrics.address",
            "\"localhost\"",
            "HOST:PORT",
        ),
        (
            "[metrics]\naddress = \"1.2.3.4:99999\"",
            "metrics.address",
            "99999",
            "HOST:PORT",
        ),
    ] {
        let e = invalid(extra);
        let msg = e.to_string();
        assert_eq!(e.key, key, "{extra}: {msg}");
        assert!(msg.contains(given), "{extra}: given missing from {msg}");
        assert!(msg.contains(allowed), "{extra}: allowed missing from {msg}");
    }
}

#[test]
fn model_section_rules() {
    let both = "[model]\npreset = \"tiny\"\ndir = \"m\"\n[env]\nname = \"synthetic_multihop\"\n";
    let e = TrainConfig::from_toml_str(both)
        .unwrap()
        .validate(FileCheck::Skip, &Registries::builtins())
        .unwrap_err();
    assert!(e.key == "model" && e.message.contains("exactly one"), "{e}");
    let e = TrainConfig::from_toml_str(
        "[model]\npreset = \"huge\"\n[env]\nname = \"synthetic_multihop\"\n",
    )
    .unwrap()
    .validate(FileCheck::Skip, &Registries::builtins())
    .unwrap_err();
    assert!(e.key == "model.preset" && e.message.contains("tiny"), "{e}");
    let c = TrainConfig::from_toml_str(
        "[model]\npreset = \"tiny\"\ndevice = \"tpu\"\n[env]\nname = \"synthetic_multihop\"\n",
    )
    .unwrap();
    let e = c
        .validate(FileCheck::Skip, &Registries::builtins())
        .unwrap_err();
    assert!(
        e.key == "model.device" && e.message.contains("cuda:N"),
        "{e}"
    );
    let c = TrainConfig::from_toml_str(
        "[model]\npreset = \"tiny\"\ndevice = \"cpu\"\ndtype = \"bf16\"\n[env]\nname = \"synthetic_multihop\"\n",
    )
    .unwrap();
    let e = c
        .validate(FileCheck::Skip, &Registries::builtins())
        .unwrap_err();
    assert_eq!(e.key, "model.dtype", "{e}");
    // CPU float32 resolves on any machine.
    assert_eq!(
        parse("").unwrap().placement().unwrap().device,
        tch::Device::Cpu
    );
}

#[test]
fn rollout_devices_give_one_engine_each_and_a_bad_one_is_named() {
    let engines = |c: &TrainConfig| -> Vec<(String, tch::Device)> {
        c.engine_placements()
            .unwrap()
            .into_iter()
            .map(|(label, p)| (label, p.device))
            .collect()
    };
    // Empty: the one engine on model.device.
    assert_eq!(
        engines(&parse("").unwrap()),
        vec![("cpu".to_string(), tch::Device::Cpu)]
    );
    let two = parse("[rollout]\ndevices = [\"cpu\", \"cpu\"]\n").unwrap();
    two.validate(FileCheck::Skip, &Registries::builtins())
        .unwrap();
    assert_eq!(engines(&two).len(), 2);
    let e = invalid("[rollout]\ndevices = [\"cpu\", \"tpu\"]\n");
    assert_eq!(e.key, "rollout.devices[1]", "{e}");
    assert!(
        e.message.contains("cuda:N") && e.message.contains("tpu"),
        "{e}"
    );
    // Spelled right, but not on this machine (or not with this dtype): named at start.
    let bf16 = TrainConfig::from_toml_str(
        "[model]\npreset = \"tiny\"\ndevice = \"cuda\"\ndtype = \"bf16\"\n[env]\nname = \"synthetic_multihop\"\n[rollout]\ndevices = [\"cuda:0\", \"cpu\"]\n",
    )
    .unwrap();
    let e = bf16.engine_placements().unwrap_err();
    assert!(
        e.key.starts_with("rollout.devices[") || e.key == "model.dtype",
        "{e}"
    );
    if !tch::Cuda::is_available() {
        let e = parse("[rollout]\ndevices = [\"cpu\", \"cuda:3\"]\n")
            .unwrap()
            .engine_placements()
            .unwrap_err();
        assert_eq!(e.key, "rollout.devices[1]", "{e}");
    }
}

#[test]
fn warm_start_rules() {
    let c = parse("").unwrap();
    assert_eq!(c.warm_start.steps, 0, "no warm start unless asked");
    let c = parse("[warm_start]\nsteps = 50\n").unwrap();
    c.validate(FileCheck::Skip, &Registries::builtins())
        .unwrap();
    assert_eq!(c.warm_start.batch_size, 8);
    let e = invalid("[warm_start]\nsteps = 5\nbatch_size = 0\n");
    assert_eq!(e.key, "warm_start.batch_size", "{e}");
    let e = invalid("[warm_start]\nsteps = 5\nearly_wrong_answer_prob = 1.5\n");
    assert!(
        e.key == "warm_start.early_wrong_answer_prob" && e.message.contains("[0, 1]"),
        "{e}"
    );
    let e = invalid("[warm_start]\nstep = 5\n");
    assert!(e.key.contains("warm_start"), "{e}");
    let e = invalid("[warm_start]\nsteps = 5\nvariants_per_question = 0\n");
    assert!(
        e.key == "warm_start.variants_per_question" && e.message.contains("[1, 64]"),
        "{e}"
    );
    let habit = |body: &str| format!("[warm_start]\nsteps = 5\n[warm_start.bad_habit]\n{body}");
    let c = parse(&habit("steps = 30\n")).unwrap();
    assert_eq!(
        c.warm_start.bad_habit,
        Some(BadHabitSection {
            steps: 30,
            ..BadHabitSection::default()
        })
    );
    for (body, key, allowed) in [
        ("steps = 0\n", "warm_start.bad_habit.steps", ">= 1"),
        (
            "learning_rate = 0.0\n",
            "warm_start.bad_habit.learning_rate",
            "> 0",
        ),
        (
            "early_wrong_answer_prob = -0.1\n",
            "warm_start.bad_habit.early_wrong_answer_prob",
            "[0, 1]",
        ),
        (
            "variants_per_question = 65\n",
            "warm_start.bad_habit.variants_per_question",
            "[1, 64]",
        ),
    ] {
        let e = invalid(&habit(body));
        assert!(e.key == key && e.message.contains(allowed), "{body}: {e}");
    }
    let e = invalid(&habit("step = 3\n"));
    assert!(e.key.contains("bad_habit"), "an unknown key is named: {e}");
}

#[test]
fn missing_files_are_reported_unless_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    let text = format!(
        "[model]\ndir = {:?}\n[env]\nname = \"multihop_qa\"\ntrain_files = [{:?}]\n",
        model.display().to_string(),
        dir.path().join("train.json").display().to_string()
    );
    let c = TrainConfig::from_toml_str(&text).unwrap();
    c.validate(FileCheck::Skip, &Registries::builtins())
        .unwrap();
    let e = c
        .validate(FileCheck::Require, &Registries::builtins())
        .unwrap_err();
    assert!(
        e.key == "model.dir" && e.message.contains("config.json"),
        "{e}"
    );
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(model.join("config.json"), "{}").unwrap();
    let e = c
        .validate(FileCheck::Require, &Registries::builtins())
        .unwrap_err();
    assert!(
        e.key == "env.train_files" && e.message.contains("train.json: no such file"),
        "{e}"
    );
    // And through `load`, the file name leads the message.
    let path = dir.path().join("c.toml");
    std::fs::write(&path, &text).unwrap();
    let e = TrainConfig::load(&path, FileCheck::Require, &Registries::builtins()).unwrap_err();
    assert!(
        e.to_string().starts_with(&path.display().to_string()),
        "{e}"
    );
    let e = TrainConfig::load(
        &dir.path().join("nope.toml"),
        FileCheck::Skip,
        &Registries::builtins(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("cannot read the config"), "{e}");
}

#[test]
fn env_rules_and_env_option_errors() {
    let e = TrainConfig::from_toml_str("[model]\npreset = \"tiny\"\n[env]\nname = \"chess\"\n")
        .unwrap()
        .validate(FileCheck::Skip, &Registries::builtins())
        .unwrap_err();
    assert!(
        e.key == "env.name" && e.message.contains("synthetic_multihop"),
        "{e}"
    );
    let e = invalid("train_files = [\"x.json\"]\n");
    assert_eq!(e.key, "env.train_files", "{e}");
    let e = invalid("[env.world]\nn_countries = 1\n");
    assert_eq!(e.key, "env.world.n_countries", "{e}");
    let e = invalid("[env.world]\ncountries = 3\n");
    assert_eq!(e.key, "env.world.countries", "{e}");
    let e = invalid("[env.options]\nrewardd = \"hotpotqa_em\"\n");
    assert!(
        e.key == "env.options.rewardd" && e.message.contains("reward"),
        "{e}"
    );
    let e = invalid("[env.options]\nreward = \"bleu\"\n");
    assert_eq!(e.key, "env.options", "{e}");
    assert!(e.message.contains("bleu"), "{e}");
    let e = invalid("[env.dataset]\non_bad_row = \"ignore\"\n");
    assert_eq!(e.key, "env.dataset.on_bad_row", "{e}");
    // World options reach the env.
    let c = parse("[env.world]\nseed = 3\nn_questions = 50\n").unwrap();
    c.validate(FileCheck::Skip, &Registries::builtins())
        .unwrap();
    assert_eq!(c.env_options()["world"]["n_questions"], 50);
}

#[test]
fn context_policy_rules() {
    let ok = |extra: &str| {
        parse(extra)
            .unwrap()
            .validate(FileCheck::Skip, &Registries::builtins())
            .unwrap()
    };
    ok("");
    ok("[env.context]\npolicy = \"window\"\nturns = 3\n");
    ok("[env.context]\npolicy = \"elide\"\nkeep_turns = 2\nplaceholder = \"(cut)\"\n");
    ok("[env.context]\npolicy = \"summary\"\nbudget_tokens = 1024\n");
    let e = invalid("[env.context]\npolicy = \"sliding\"\n");
    assert!(
        e.key == "env.context.policy" && e.message.contains("window"),
        "{e}"
    );
    let e = invalid("[env.context]\npolicy = 3\n");
    assert_eq!(e.key, "env.context.policy", "{e}");
    let e = invalid("[env.context]\npolicy = \"window\"\nturns = 0\n");
    assert!(
        e.key == "env.context.turns" && e.message.contains("at least 1"),
        "{e}"
    );
    let e = invalid("[env.context]\npolicy = \"window\"\n");
    assert!(e.message.contains("turns"), "{e}");
    let e = invalid("[env.context]\npolicy = \"window\"\nturns = 2\nkeep = 1\n");
    assert_eq!(e.key, "env.context.keep", "{e}");
    // The summary budget must leave room in the context (4096 by default).
    let e = invalid("[env.context]\npolicy = \"summary\"\nbudget_tokens = 5000\n");
    assert!(
        e.key == "env.context"
            && e.message.contains("budget_tokens 5000")
            && e.message.contains("4096"),
        "{e}"
    );
}

#[test]
fn math_envs_follow_the_same_rules() {
    let math = |body: &str| {
        TrainConfig::from_toml_str(&format!(
            "[model]\npreset = \"tiny\"\n[env]\nname = \"synthetic_math\"\n{body}"
        ))
        .and_then(|c| c.validate(FileCheck::Skip, &Registries::builtins()))
    };
    math("[env.options.problems]\nn_problems = 50\n[warm_start]\nsteps = 5\n").unwrap();
    let e = math("[env.options.problems]\nn_problems = 0\n").unwrap_err();
    assert!(
        e.key == "env.options.problems.n_problems" && e.message.contains("[1, 100000]"),
        "{e}"
    );
    let e = math("[env.options]\ntolerance = 1.0\n").unwrap_err();
    assert!(
        e.key == "env.options.tolerance" && e.message.contains("[0, 0.1]"),
        "{e}"
    );
    let e = math("train_files = [\"gsm8k.jsonl\"]\n").unwrap_err();
    assert!(
        e.key == "env.train_files" && e.message.contains("generates"),
        "{e}"
    );
    let e = math("[env.world]\nseed = 1\n").unwrap_err();
    assert_eq!(e.key, "env.world", "{e}");
    // `math` reads dataset files, so it makes no demonstrations to warm start on.
    let e = TrainConfig::from_toml_str(
        "[model]\npreset = \"tiny\"\n[env]\nname = \"math\"\ntrain_files = [\"g.jsonl\"]\n[warm_start]\nsteps = 5\n",
    )
    .unwrap()
    .validate(FileCheck::Skip, &Registries::builtins())
    .unwrap_err();
    assert!(
        e.key == "warm_start.steps" && e.message.contains("synthetic_math"),
        "{e}"
    );
}

#[test]
fn tool_tables_reuse_the_envs_reading() {
    let c = parse("[tools.search]\ntop_k = 3\n[tools.py]\ntype = \"python\"\ntimeout_secs = 2.5\n")
        .unwrap();
    c.validate(FileCheck::Skip, &Registries::builtins())
        .unwrap();
    let tools = c.tools_config(None);
    assert_eq!(tools.tables.len(), 2);
    assert_eq!(tools.tables["py"]["timeout_secs"], 2.5);
    // Same result as the envs crate reading the same text.
    let text = format!(
        "{MINIMAL}[tools.search]\ntop_k = 3\n[tools.py]\ntype = \"python\"\ntimeout_secs = 2.5\n"
    );
    assert_eq!(ToolsConfig::from_toml_str(&text).unwrap(), tools);
    let e = invalid("[tools.web]\nurl = \"x\"\n");
    assert!(
        e.key == "tools.web" && e.message.contains("calculator"),
        "{e}"
    );
    let e = invalid("[tools.x]\ntype = 3\n");
    assert_eq!(e.key, "tools.x.type", "{e}");
    let e = invalid("[tools]\nsearch = 1\n");
    assert_eq!(e.key, "tools.search", "{e}");
}

#[test]
fn tool_options_are_checked_by_their_kind_as_train_builds_them() {
    // An MCP table passes only with what `train` needs to start the server.
    let e = invalid("[tools.clock]\ntype = \"mcp\"\n");
    assert!(
        e.key == "tools.clock.command" && e.message.contains("url"),
        "{e}"
    );
    let e = invalid("[tools.clock]\ntype = \"mcp\"\ncommand = \"x\"\ntimeout_secs = 1e30\n");
    assert_eq!(e.key, "tools.clock.timeout_secs", "{e}");
    let e = invalid("[tools.python]\ntimeout = 3\n");
    assert_eq!(e.key, "tools.python.timeout", "{e}");
    let e = invalid("[tools.py]\ntype = \"python\"\nmemory_mib = 0\n");
    assert_eq!(e.key, "tools.py.memory_mib", "{e}");
    let e = invalid("[tools.search]\ntop_k = 0\n");
    assert_eq!(e.key, "tools.search.top_k", "{e}");
    let e = invalid("[tools.calc]\ntype = \"calculator\"\nprecision = 3\n");
    assert_eq!(e.key, "tools.calc.precision", "{e}");
    // Nothing is started to check: a server that does not exist passes.
    parse("[tools.clock]\ntype = \"mcp\"\ncommand = \"/nonexistent/server\"\n")
        .unwrap()
        .validate(FileCheck::Skip, &Registries::builtins())
        .unwrap();
}

#[test]
fn a_scorer_table_is_checked_by_its_kind() {
    let judge =
        "[scorer]\ntype = \"http_judge\"\nurl = \"http://127.0.0.1:8000/v1/chat/completions\"\n";
    let c = parse(judge).unwrap();
    c.validate(FileCheck::Skip, &Registries::builtins())
        .unwrap();
    assert_eq!(c.scorer_options().unwrap().unwrap().0, "http_judge");
    let e = invalid("[scorer]\nurl = \"http://x\"\n");
    assert_eq!(e.key, "scorer.type", "{e}");
    let e = invalid("[scorer]\ntype = \"gpt_judge\"\n");
    assert!(
        e.key == "scorer.type" && e.message.contains("http_judge"),
        "{e}"
    );
    let e = invalid("[scorer]\ntype = \"http_judge\"\nurl = \"ftp://x\"\n");
    assert_eq!(e.key, "scorer.url", "{e}");
    let e = invalid(&format!("{judge}timeout_secs = 1e30\n"));
    assert_eq!(e.key, "scorer.timeout_secs", "{e}");
    let e = invalid(&format!("{judge}retry = 3\n"));
    assert_eq!(e.key, "scorer.retry", "{e}");
    let e = invalid(&format!("{judge}max_concurrency = 0\n"));
    assert_eq!(e.key, "scorer.max_concurrency", "{e}");
}

#[test]
fn a_search_table_gets_the_envs_corpus() {
    let c = parse("[tools.search]\ntop_k = 3\n").unwrap();
    let world = Path::new("/run/world");
    let tools = c.tools_config(Some(world));
    assert_eq!(
        tools.tables["search"]["corpus"],
        json!(world.join("corpus.jsonl"))
    );
    assert_eq!(
        tools.tables["search"]["index_dir"],
        json!(world.join("search-index"))
    );
    // Another kind under the name `search` gets the corpus, not the built-in's index.
    let c = parse("[tools.search]\ntype = \"mine\"\n").unwrap();
    let tools = c.tools_config(Some(world));
    assert!(tools.tables["search"].get("index_dir").is_none());
    assert_eq!(
        tools.tables["search"]["corpus"],
        json!(world.join("corpus.jsonl"))
    );
}
