//! Every dataset format read from its fixture in `fixtures/data/`, with detection, the
//! explicit `format` option and the skip/fail policy for malformed rows.

use std::path::PathBuf;

use agent_r1_envs::dataset::{load_tasks, DatasetFormat, LoadOptions, OnBadRow};
use agent_r1_envs::message::Role;
use agent_r1_envs::Error;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/data")
        .join(name)
}

fn auto() -> LoadOptions {
    LoadOptions::default()
}

fn skip() -> LoadOptions {
    LoadOptions {
        on_bad_row: OnBadRow::Skip,
        ..LoadOptions::default()
    }
}

#[test]
fn hotpotqa_official_json() {
    let loaded = load_tasks(fixture("hotpotqa.json"), &auto()).expect("load");
    assert_eq!(loaded.format, DatasetFormat::HotpotQa);
    assert_eq!(loaded.tasks.len(), 2);
    let t = &loaded.tasks[1];
    assert_eq!(t.id, "5a8c7595554299585d9e36b6");
    assert_eq!(t.data_source, "hotpotqa");
    assert_eq!(t.answers, vec!["Chief of Protocol"]);
    assert!(t.prompt.is_none());
    assert_eq!(t.extra["type"], "bridge");
    assert_eq!(t.extra["level"], "medium");
    assert_eq!(t.extra["supporting_facts"][2][1], 1);
    assert_eq!(t.extra["context"][1][0], "Shirley Temple");
}

#[test]
fn two_wiki_json_and_jsonl() {
    let loaded = load_tasks(fixture("2wikimultihopqa.json"), &auto()).expect("load");
    assert_eq!(loaded.format, DatasetFormat::TwoWiki);
    let t = &loaded.tasks[0];
    assert_eq!(t.answers, vec!["Małgorzata Braunek"]);
    assert_eq!(t.extra["evidences"][1][1], "mother");
    assert_eq!(t.data_source, "2wikimultihopqa");

    let loaded = load_tasks(fixture("2wikimultihopqa.jsonl"), &auto()).expect("load");
    assert_eq!(loaded.format, DatasetFormat::TwoWiki);
    assert_eq!(loaded.tasks[0].id, "w2");
}

#[test]
fn musique_keeps_answerable_rows_by_default() {
    let loaded = load_tasks(fixture("musique.jsonl"), &auto()).expect("load");
    assert_eq!(loaded.format, DatasetFormat::Musique);
    let ids: Vec<&str> = loaded.tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, vec!["2hop__1", "3hop__3"]);
    assert_eq!(loaded.filtered, 1);
    assert_eq!(
        loaded.tasks[0].answers,
        vec!["Miquette Giraudy", "Miquette"]
    );
    assert_eq!(
        loaded.tasks[0].extra["paragraphs"][1]["is_supporting"],
        true
    );

    let all = LoadOptions {
        include_unanswerable: true,
        ..auto()
    };
    assert_eq!(
        load_tasks(fixture("musique.jsonl"), &all)
            .expect("load")
            .tasks
            .len(),
        3
    );
}

#[test]
fn plain_jsonl() {
    let loaded = load_tasks(fixture("plain.jsonl"), &auto()).expect("load");
    assert_eq!(loaded.format, DatasetFormat::Jsonl);
    let t = &loaded.tasks;
    assert_eq!(t.len(), 3);
    assert_eq!(
        (t[0].id.as_str(), t[0].answers.clone()),
        ("1", vec!["Paris".to_string()])
    );
    assert_eq!(
        (t[1].id.as_str(), t[1].data_source.as_str()),
        ("q2", "trivia")
    );
    // Line numbers count the blank line.
    assert_eq!(t[2].id, "4");
    assert_eq!(t[2].extra["topic"], "art");
}

#[test]
fn agent_r1_parquet_string_ground_truth() {
    let loaded = load_tasks(fixture("agent_r1_string_gt.parquet"), &auto()).expect("load");
    assert_eq!(loaded.format, DatasetFormat::AgentR1Parquet);
    assert_eq!(loaded.tasks.len(), 2);
    let t = &loaded.tasks[0];
    assert_eq!(t.id, "0");
    assert_eq!(t.data_source, "hotpotqa/hotpot_qa");
    assert_eq!(
        t.question,
        "Which magazine was started first, Arthur's Magazine or First for Women?"
    );
    assert_eq!(t.answers, vec!["Arthur's Magazine"]);
    let prompt = t.prompt.as_ref().expect("prompt");
    assert_eq!(prompt.len(), 1);
    assert_eq!(prompt[0].role, Role::User);
    assert!(prompt[0].content.contains("<answer>"));
    assert_eq!(t.extra["ability"], "multihop_qa");
    assert_eq!(t.extra["agent_name"], "tool_agent");
    assert_eq!(t.extra["reward_style"], "rule");
    assert_eq!(t.extra["env_kwargs"]["tools"][0], "search");
    assert_eq!(t.extra["extra_info"]["split"], "train");
    let second = &loaded.tasks[1];
    assert_eq!(
        second.prompt.as_ref().map(|p| p[0].role),
        Some(Role::System)
    );
}

#[test]
fn agent_r1_parquet_list_ground_truth_and_map_extra_info() {
    let loaded = load_tasks(fixture("agent_r1_list_gt.parquet"), &auto()).expect("load");
    let t = &loaded.tasks[0];
    assert_eq!(t.answers, vec!["William Shakespeare", "Shakespeare"]);
    // No `extra_info.question`: the last user message is the question.
    assert_eq!(t.question, "Who wrote Hamlet?");
    assert_eq!(t.id, "nq-17");
    assert_eq!(t.extra["extra_info"]["split"], "test");
}

#[test]
fn agent_r1_parquet_dict_ground_truth_with_a_bad_row() {
    let path = fixture("agent_r1_dict_gt_bad_row.parquet");
    let err = load_tasks(&path, &auto()).unwrap_err();
    match &err {
        Error::BadRow {
            path: p,
            line,
            message,
        } => {
            assert_eq!(p, &path);
            assert_eq!(*line, 2);
            assert!(message.contains("no question"), "{message}");
        }
        other => panic!("expected BadRow, got {other:?}"),
    }
    let loaded = load_tasks(&path, &skip()).expect("load");
    assert_eq!(loaded.tasks.len(), 2);
    assert_eq!(loaded.skipped.len(), 1);
    assert_eq!(loaded.tasks[0].answers, vec!["Miquette Giraudy"]);
    assert_eq!(loaded.tasks[1].id, "7");
}

#[test]
fn bad_rows_fail_by_default_with_file_and_line() {
    let cases = [
        ("hotpotqa_bad.json", 11, "answer"),
        ("musique_bad.jsonl", 2, "JSON"),
        ("plain_bad.jsonl", 2, "object"),
    ];
    for (name, line, word) in cases {
        let err = load_tasks(fixture(name), &auto()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(name) && text.contains(&format!(":{line}:")) && text.contains(word),
            "{name}: {text}"
        );
    }
}

#[test]
fn bad_rows_are_skipped_and_counted_when_asked() {
    let loaded = load_tasks(fixture("hotpotqa_bad.json"), &skip()).expect("load");
    let ids: Vec<&str> = loaded.tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, vec!["good-1", "good-2"]);
    let lines: Vec<usize> = loaded
        .skipped
        .iter()
        .map(|e| match e {
            Error::BadRow { line, .. } => *line,
            _ => 0,
        })
        .collect();
    assert_eq!(lines, vec![11, 19]);

    let loaded = load_tasks(fixture("musique_bad.jsonl"), &skip()).expect("load");
    assert_eq!(loaded.tasks.len(), 2);
    assert_eq!(loaded.skipped.len(), 2);

    let loaded = load_tasks(fixture("plain_bad.jsonl"), &skip()).expect("load");
    assert_eq!(
        loaded
            .tasks
            .iter()
            .map(|t| t.id.as_str())
            .collect::<Vec<_>>(),
        vec!["1", "5"]
    );
    assert_eq!(loaded.skipped.len(), 3);
}

#[test]
fn a_broken_file_is_an_error_even_when_skipping() {
    let err = load_tasks(fixture("hotpotqa_broken.json"), &skip()).unwrap_err();
    assert!(matches!(err, Error::BadFile { .. }), "{err:?}");
    assert!(err.to_string().contains("line"), "{err}");
}

#[test]
fn explicit_format_overrides_detection() {
    // A HotpotQA file read as plain JSONL rows: `answer` is accepted there too.
    let opts = LoadOptions {
        format: Some(DatasetFormat::Jsonl),
        ..auto()
    };
    let loaded = load_tasks(fixture("hotpotqa.json"), &opts).expect("load");
    assert_eq!(loaded.format, DatasetFormat::Jsonl);
    assert_eq!(loaded.tasks[0].data_source, "jsonl");
    // MuSiQue rows read as HotpotQA lack `_id`: a bad row.
    let opts = LoadOptions {
        format: Some(DatasetFormat::HotpotQa),
        ..auto()
    };
    assert!(matches!(
        load_tasks(fixture("musique.jsonl"), &opts),
        Err(Error::BadRow { line: 1, .. })
    ));
    // Options parse from config JSON.
    let opts: LoadOptions = serde_json::from_value(
        serde_json::json!({"format": "2wiki", "on_bad_row": "skip", "limit": 1}),
    )
    .expect("options");
    assert_eq!(opts.format, Some(DatasetFormat::TwoWiki));
    assert_eq!(
        load_tasks(fixture("2wikimultihopqa.json"), &opts)
            .expect("load")
            .tasks
            .len(),
        1
    );
}

#[test]
fn undetectable_files_and_missing_files_are_errors() {
    let err = load_tasks(fixture("unknown_format.jsonl"), &auto())
        .unwrap_err()
        .to_string();
    assert!(err.contains("set `format`"), "{err}");
    let err = load_tasks(fixture("does_not_exist.json"), &auto()).unwrap_err();
    assert!(matches!(err, Error::Io { .. }));
    let opts = LoadOptions {
        format: Some(DatasetFormat::AgentR1Parquet),
        ..auto()
    };
    let err = load_tasks(fixture("plain.jsonl"), &opts).unwrap_err();
    assert!(matches!(err, Error::BadFile { .. }), "{err:?}");
}

#[test]
fn limit_caps_the_number_of_tasks() {
    let opts = LoadOptions {
        limit: Some(1),
        ..auto()
    };
    assert_eq!(
        load_tasks(fixture("plain.jsonl"), &opts)
            .expect("load")
            .tasks
            .len(),
        1
    );
}
