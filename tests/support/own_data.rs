//! A first run on one's own data, written by the test: a fresh tiny model directory, a JSONL
//! of questions (train and test), a corpus of one document per answer, and a CPU config
//! over them for `multihop_qa` with the search tool.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

pub const BIN: &str = env!("CARGO_BIN_EXE_agent-r1");

/// People and where they were born: the facts of the corpus and the questions.
pub const FACTS: [(&str, &str); 12] = [
    ("Ada", "Oslo"),
    ("Bram", "Lima"),
    ("Cleo", "Pune"),
    ("Dov", "Kyiv"),
    ("Esme", "Nara"),
    ("Finn", "Bonn"),
    ("Gus", "Cork"),
    ("Hana", "Faro"),
    ("Ivo", "Graz"),
    ("Juno", "Ulm"),
    ("Kai", "Riga"),
    ("Lena", "Baku"),
];

/// Questions `..TRAIN` are the training split, the rest the test split.
pub const TRAIN: usize = 8;

/// A model directory, a JSONL of questions (train and test) and a corpus, all written here,
/// and a CPU config over them; `edit` changes the config text.
pub struct OwnData {
    pub dir: tempfile::TempDir,
}

impl OwnData {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(BIN)
            .args(["init-model", "--out"])
            .arg(dir.path().join("model"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let mut corpus = String::new();
        let mut questions = Vec::new();
        for (i, (p, c)) in FACTS.iter().enumerate() {
            corpus += &format!(
                "{{\"id\": \"d{i}\", \"title\": \"{p}\", \"text\": \"{p} was born in {c}.\"}}\n"
            );
            questions.push(format!(
                "{{\"question\": \"Where was {p} born?\", \"answers\": [\"{c}\"]}}\n"
            ));
        }
        std::fs::write(dir.path().join("corpus.jsonl"), corpus).unwrap();
        std::fs::write(dir.path().join("train.jsonl"), questions[..TRAIN].concat()).unwrap();
        std::fs::write(dir.path().join("test.jsonl"), questions[TRAIN..].concat()).unwrap();
        Self { dir }
    }

    /// Replaces the model directory with the same model as transformers writes it
    /// (`tests/py/resave_with_transformers.py`): its config.json, safetensors layout and
    /// tokenizer files, the chat template in `chat_template.jinja`.
    pub fn resave_model_with_transformers(&self, python: &std::path::Path) {
        let (model, init) = (self.path("model"), self.path("model-init"));
        std::fs::rename(&model, &init).unwrap();
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/py/resave_with_transformers.py");
        let out = Command::new(python)
            .arg(script)
            .args([&init, &model])
            .env("HF_HUB_OFFLINE", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn config(&self) -> String {
        let p = |name: &str| self.path(name).display().to_string();
        format!(
            r#"[model]
dir = "{model}"
device = "cpu"
dtype = "float32"

[env]
name = "multihop_qa"
train_files = ["{train}"]
test_files = ["{test}"]

[env.options]
reward = "agent_r1_qa"
corpus = {{ jsonl = "{corpus}" }}

[tools.search]
top_k = 2

[algorithm]
estimator = "grpo"

[algorithm.kl]
placement = "off"

[rollout]
batch_size = 2
group_size = 2
max_turns = 2
max_prompt_length = 640
max_response_length = 48
max_context_length = 1024

[training]
updates = 1
run_dir = "{run}"

[metrics]
address = "127.0.0.1:0"
"#,
            model = p("model"),
            train = p("train.jsonl"),
            test = p("test.jsonl"),
            corpus = p("corpus.jsonl"),
            run = p("run"),
        )
    }
}
