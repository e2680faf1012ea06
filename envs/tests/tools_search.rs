//! The search tool over the fixture corpora: ranking, the model-facing format, the on-disk
//! index cache and its invalidation, and the registry/config path.

use std::path::{Path, PathBuf};

use agent_r1_envs::tool::Tool;
use agent_r1_envs::tools::search::{CorpusSource, SearchConfig, SearchTool};
use agent_r1_envs::tools::{ToolRegistry, ToolsConfig};
use serde_json::json;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/tools")
        .join(name)
}

#[tokio::test]
async fn jsonl_corpus_answers_in_the_agent_r1_format() {
    let tmp = tempfile::tempdir().unwrap();
    let tool = SearchTool::open(SearchConfig {
        corpus: CorpusSource::Jsonl(fixture("corpus.jsonl")),
        index_dir: Some(tmp.path().join("idx")),
        top_k: 2,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(tool.num_documents(), 4);
    let hits = tool.search("capital of Veloria", 3).unwrap();
    assert_eq!(hits[0].id, "d4");
    assert!(hits[0].score > hits[1].score);
    let out = tool
        .call(json!({"query": "Mira Quell founded Zorvex Labs"}))
        .await
        .unwrap();
    let lines: Vec<&str> = out.text.lines().collect();
    assert_eq!(lines.len(), 2, "top_k = 2: {}", out.text);
    assert_eq!(
        lines[0],
        "Doc 1 (Title: Zorvex Labs) Zorvex Labs is a robotics company founded by Mira Quell in 1998."
    );
    assert_eq!(out.metadata["ids"][0], "d1");
}

#[test]
fn hotpotqa_context_is_a_corpus() {
    let tmp = tempfile::tempdir().unwrap();
    let tool = SearchTool::open(SearchConfig {
        corpus: CorpusSource::HotpotQa(vec![fixture("hotpot_mini.json")]),
        index_dir: Some(tmp.path().join("idx")),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        tool.num_documents(),
        3,
        "Tarnow appears twice, indexed once"
    );
    let hits = tool.search("river Senn", 1).unwrap();
    assert_eq!(hits[0].title, "Tarnow");
    assert_eq!(hits[0].text, "Tarnow is a city on the river Senn.");
}

#[test]
fn index_is_cached_and_rebuilt_when_the_corpus_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = tmp.path().join("c.jsonl");
    std::fs::copy(fixture("corpus.jsonl"), &corpus).unwrap();
    let open = || SearchTool::open(SearchConfig::new(CorpusSource::Jsonl(corpus.clone()))).unwrap();
    let first = open();
    assert!(first.rebuilt());
    assert_eq!(
        first.index_dir(),
        tmp.path().join("c.jsonl.index"),
        "beside the corpus"
    );
    drop(first);
    let second = open();
    assert!(!second.rebuilt(), "unchanged corpus: cached index reused");
    drop(second);
    // Same content rewritten (new mtime): still reused.
    std::fs::write(&corpus, std::fs::read(fixture("corpus.jsonl")).unwrap()).unwrap();
    assert!(!open().rebuilt());
    // Same size, different content: rebuilt.
    let text = std::fs::read_to_string(&corpus)
        .unwrap()
        .replace("Ostrel", "Xstrel");
    std::fs::write(&corpus, text).unwrap();
    let changed = open();
    assert!(changed.rebuilt());
    assert_eq!(changed.search("Xstrel", 1).unwrap()[0].id, "d4");
    // A damaged index is rebuilt, not trusted.
    drop(changed);
    for entry in std::fs::read_dir(tmp.path().join("c.jsonl.index")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json")
            && path.file_name().unwrap() != "agent-r1-fingerprint.json"
        {
            std::fs::write(&path, "garbage").unwrap();
        }
    }
    assert!(open().rebuilt());
}

#[test]
fn bad_corpus_rows_name_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = tmp.path().join("bad.jsonl");
    std::fs::write(&corpus, "{\"id\": 1, \"text\": \"ok\"}\nnot json\n").unwrap();
    let e = SearchTool::open(SearchConfig::new(CorpusSource::Jsonl(corpus))).unwrap_err();
    assert!(
        matches!(e, agent_r1_envs::Error::BadRow { line: 2, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("bad.jsonl:2: not JSON"), "{e}");
}

#[test]
fn configured_from_toml() {
    let tmp = tempfile::tempdir().unwrap();
    let toml = format!(
        "[tools.search]\ncorpus = {{ hotpotqa = [{:?}] }}\nindex_dir = {:?}\ntop_k = 1\n",
        fixture("hotpot_mini.json").display().to_string(),
        tmp.path().join("idx").display().to_string()
    );
    let cfg = ToolsConfig::from_toml_str(&toml).unwrap();
    let tool = cfg
        .build_one(&ToolRegistry::with_builtins(), "search")
        .unwrap();
    assert_eq!(
        tool.spec()["function"]["parameters"]["required"],
        json!(["query"])
    );
}
