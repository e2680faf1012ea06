//! The synthetic multi-hop world: determinism, split disjointness, hidden bridge entities,
//! answerable hops, corpus export and demonstrations that score full marks.

use std::collections::BTreeSet;

use agent_r1_envs::message::Message;
use agent_r1_envs::reward::{score_qa, RewardKind};
use agent_r1_envs::synthetic::{
    demos, gold_demo, DemoConfig, Split, SyntheticConfig, SyntheticWorld,
};
use agent_r1_envs::tool_call::ToolCallFormat;

fn world(seed: u64) -> SyntheticWorld {
    SyntheticWorld::generate(&SyntheticConfig {
        seed,
        ..SyntheticConfig::default()
    })
    .expect("world")
}

#[test]
fn same_seed_same_world_and_different_seed_different_world() {
    let a = world(11);
    let b = world(11);
    assert_eq!(a, b);
    assert_eq!(a.corpus_text(), b.corpus_text());
    let c = world(12);
    assert_ne!(a.questions[0].text, c.questions[0].text);
}

#[test]
fn seed_7_snapshot_is_stable_across_platforms_and_versions() {
    // ChaCha8 and u32-only draws make this identical everywhere; a change here means the
    // generator changed and every saved corpus and checkpoint trained on it is stale.
    let w = world(7);
    let first: Vec<(&str, &str)> = w
        .questions
        .iter()
        .take(3)
        .map(|q| (q.text.as_str(), q.answer.as_str()))
        .collect();
    assert_eq!(first, SNAPSHOT.to_vec());
    assert_eq!(w.world.documents[0].title, SNAPSHOT_FIRST_COUNTRY);
}

const SNAPSHOT: [(&str, &str); 3] = [
    (
        "Where was the founder of Naitedro Systems born?",
        "Drutaburg",
    ),
    ("In which country was Gaidra Dailu born?", "Rouland"),
    ("Where was the founder of Tridrasu Works born?", "Stadoburg"),
];
const SNAPSHOT_FIRST_COUNTRY: &str = "Geland";

#[test]
fn sizes_and_hop_mix_follow_the_config() {
    let cfg = SyntheticConfig {
        seed: 3,
        n_questions: 200,
        three_hop_fraction: 0.25,
        test_fraction: 0.1,
        ..SyntheticConfig::default()
    };
    let w = SyntheticWorld::generate(&cfg).expect("world");
    assert_eq!(
        w.world.entities.len(),
        cfg.n_countries + cfg.n_cities + cfg.n_people + cfg.n_companies
    );
    assert_eq!(w.world.documents.len(), w.world.entities.len());
    assert_eq!(w.questions.len(), 200);
    assert_eq!(w.questions.iter().filter(|q| q.hops.len() == 3).count(), 50);
    assert!(w.questions.iter().all(|q| (2..=3).contains(&q.hops.len())));
    assert_eq!(w.questions(Split::Test).len(), 20);
    let bad = SyntheticConfig {
        n_cities: 1,
        ..SyntheticConfig::default()
    };
    assert!(SyntheticWorld::generate(&bad).is_err());
}

#[test]
fn train_and_test_questions_are_disjoint() {
    for seed in 0..5 {
        let w = world(seed);
        let train: BTreeSet<&str> = w
            .questions(Split::Train)
            .iter()
            .map(|q| q.text.as_str())
            .collect();
        let test: BTreeSet<&str> = w
            .questions(Split::Test)
            .iter()
            .map(|q| q.text.as_str())
            .collect();
        assert!(!test.is_empty() && !train.is_empty());
        assert!(train.is_disjoint(&test), "seed {seed}");
        // No duplicate question text at all, and unique ids.
        assert_eq!(train.len() + test.len(), w.questions.len());
        let ids: BTreeSet<&str> = w.questions.iter().map(|q| q.id.as_str()).collect();
        assert_eq!(ids.len(), w.questions.len());
        let tasks = w.tasks(Split::Test);
        assert_eq!(tasks.len(), test.len());
        assert!(tasks
            .iter()
            .all(|t| t.extra["split"] == "test" && t.data_source == "synthetic_multihop"));
    }
}

#[test]
fn bridges_are_hidden_and_every_hop_is_findable() {
    let w = world(5);
    for q in &w.questions {
        // Only the first entity is named: no bridge, no answer.
        for hop in &q.hops[1..] {
            assert!(
                !q.text.contains(&hop.subject),
                "{} names bridge {}",
                q.text,
                hop.subject
            );
        }
        assert!(!q.text.contains(&q.answer), "{} names its answer", q.text);
        assert!(q.text.contains(&q.hops[0].subject));
        assert_eq!(
            q.hops.last().map(|h| h.object.as_str()),
            Some(q.answer.as_str())
        );
        for hop in &q.hops {
            let doc = w.world.document_by_title(&hop.subject).expect("doc");
            assert!(
                doc.text.contains(&hop.object),
                "{}: {:?} lacks {}",
                q.text,
                doc.text,
                hop.object
            );
            let sentences = doc.text.matches(". ").count() + 1;
            assert!(sentences <= 3, "{:?}", doc.text);
            // Searching the name puts its document first.
            let top = w.observe(&hop.subject, 1);
            assert!(
                top.starts_with(&format!("Doc 1 (Title: {})", hop.subject)),
                "{top}"
            );
        }
    }
}

#[test]
fn corpus_jsonl_and_tokenizer_text() {
    let w = world(2);
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("corpus/synthetic.jsonl");
    w.write_corpus(&path).expect("write");
    let text = std::fs::read_to_string(&path).expect("read");
    let rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(rows.len(), w.world.documents.len());
    assert_eq!(rows[3]["title"], w.world.documents[3].title.as_str());
    assert!(rows
        .iter()
        .all(|r| r["id"].is_string() && r["text"].is_string()));

    let corpus = w.corpus_text();
    for tag in [
        "<think>",
        "</tool_call>",
        "<tool_response>",
        "<answer>",
        "\"arguments\"",
    ] {
        assert!(corpus.contains(tag), "{tag}");
    }
    assert!(w.questions.iter().all(|q| corpus.contains(&q.text)));
}

#[test]
fn gold_demos_are_hermes_and_score_full_marks() {
    let w = world(9);
    for q in w.questions.iter().take(40) {
        let demo = gold_demo(q);
        assert_eq!(demo.turns.len(), q.hops.len() + 1);
        let first = &demo.turns[0].assistant;
        assert!(first.starts_with("<think>"));
        assert!(first.ends_with(&format!(
            "</think>\n<tool_call>\n{{\"name\": \"search\", \"arguments\": {{\"query\": \"{}\"}}}}\n</tool_call>",
            q.hops[0].subject
        )), "{first}");
        let prefix = vec![Message::system("sys"), Message::user(q.text.clone())];
        let transcript = demo.messages(prefix, |c| w.observe(c.str_arg("query"), 3));
        assert_eq!(transcript.len(), 2 + 2 * q.hops.len() + 1);
        let s = score_qa(
            RewardKind::AgentR1Qa,
            ToolCallFormat::Hermes,
            std::slice::from_ref(&q.answer),
            &transcript,
        );
        assert_eq!(s.reward, 1.0, "{transcript:#?}");
        assert_eq!(s.metrics["em"], 1.0);
        assert_eq!(s.metrics["format"], 0.5 * (q.hops.len() + 1) as f64);
        assert_eq!(s.metrics["tool_calls_written"], q.hops.len() as f64);
    }
}

#[test]
fn imperfect_demos_answer_with_the_first_search_s_entity() {
    let w = world(4);
    let train: Vec<_> = w.questions(Split::Train).into_iter().cloned().collect();
    let all_wrong = demos(
        &w.world,
        &train,
        &DemoConfig {
            early_wrong_answer_prob: 1.0,
            seed: 1,
            ..DemoConfig::default()
        },
    );
    for (demo, q) in all_wrong.iter().zip(&train) {
        assert!(!demo.correct);
        assert_eq!(demo.turns.len(), 2);
        let transcript = demo.messages(vec![], |c| w.observe(c.str_arg("query"), 3));
        let s = score_qa(
            RewardKind::HotpotqaEm,
            ToolCallFormat::Hermes,
            std::slice::from_ref(&q.answer),
            &transcript,
        );
        assert_eq!(s.reward, 0.0);
        assert_eq!(s.metrics["format"], 1.0);
        // The early answer is the first hop's entity, copied from what the one search found:
        // the mistake is stopping early, not a name the context does not hold.
        let bridge = &q.hops[0].object;
        assert_ne!(bridge, &q.answer);
        assert!(
            demo.turns[1]
                .assistant
                .ends_with(&format!("<answer>{bridge}</answer>")),
            "{}: {}",
            q.id,
            demo.turns[1].assistant
        );
        let found = w.observe(&q.hops[0].subject, 3);
        assert!(found.contains(bridge.as_str()), "{}: {found}", q.id);
    }
    let mixed = demos(
        &w.world,
        &train,
        &DemoConfig {
            early_wrong_answer_prob: 0.3,
            seed: 1,
            ..DemoConfig::default()
        },
    );
    let wrong = mixed.iter().filter(|d| !d.correct).count();
    assert!(
        wrong > train.len() / 10 && wrong < train.len() / 2,
        "{wrong} of {}",
        train.len()
    );
    assert_eq!(
        mixed,
        demos(
            &w.world,
            &train,
            &DemoConfig {
                early_wrong_answer_prob: 0.3,
                seed: 1,
                ..DemoConfig::default()
            }
        )
    );
    assert!(demos(&w.world, &train, &DemoConfig::default())
        .iter()
        .all(|d| d.correct));
}

#[test]
fn variants_give_every_question_the_same_share_of_early_answers() {
    let w = world(4);
    let train: Vec<_> = w.questions(Split::Train).into_iter().cloned().collect();
    let config = DemoConfig {
        early_wrong_answer_prob: 0.6,
        variants_per_question: 5,
        seed: 3,
    };
    let all = demos(&w.world, &train, &config);
    assert_eq!(all.len(), 5 * train.len());
    for (chunk, q) in all.chunks(5).zip(&train) {
        assert!(chunk.iter().all(|d| d.task_id == q.id));
        let wrong: Vec<_> = chunk.iter().filter(|d| !d.correct).collect();
        assert_eq!(wrong.len(), 3, "{}: 0.6 of 5 demos answer early", q.id);
        assert!(wrong.iter().all(|d| d.turns.len() == 2));
        assert!(chunk
            .iter()
            .filter(|d| d.correct)
            .all(|d| d.turns.len() == q.hops.len() + 1));
    }
    // A fractional share: 0.3 of 2 = 0.6 demos, so one per question is a coin flip at 0.6.
    let coin = demos(
        &w.world,
        &train,
        &DemoConfig {
            early_wrong_answer_prob: 0.3,
            variants_per_question: 2,
            seed: 3,
        },
    );
    let per_question: Vec<usize> = coin
        .chunks(2)
        .map(|c| c.iter().filter(|d| !d.correct).count())
        .collect();
    assert!(per_question.iter().all(|&n| n <= 1));
    let ones = per_question.iter().filter(|&&n| n == 1).count() as f64 / train.len() as f64;
    assert!((0.4..0.8).contains(&ones), "{ones}");
}

#[test]
fn document_filler_lengthens_documents_and_changes_nothing_else() {
    let plain = world(5);
    let long = SyntheticWorld::generate(&SyntheticConfig {
        seed: 5,
        document_filler: 6,
        ..SyntheticConfig::default()
    })
    .expect("world");
    assert_eq!(plain.questions, long.questions);
    assert_eq!(plain.world.facts, long.world.facts);
    assert_eq!(plain.world.entities, long.world.entities);
    let names: Vec<&str> = long
        .world
        .entities
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    for (p, l) in plain.world.documents.iter().zip(&long.world.documents) {
        assert_eq!(p.title, l.title);
        let filler = l
            .text
            .strip_prefix(&format!("{} ", p.text))
            .unwrap_or_else(|| panic!("{:?} does not extend {:?}", l.text, p.text));
        assert_eq!(filler.matches('.').count(), 6, "{filler:?}");
        assert!(
            !names.iter().any(|n| filler.contains(n)),
            "filler names an entity: {filler:?}"
        );
    }
    // Every hop is still found first by its name.
    for q in &long.questions {
        for hop in &q.hops {
            let top = long.observe(&hop.subject, 1);
            assert!(top.starts_with(&format!("Doc 1 (Title: {})", hop.subject)));
        }
    }
    assert!(long.world.documents[0].text.len() > 4 * plain.world.documents[0].text.len());
}

#[test]
fn document_filler_past_its_range_is_refused() {
    let err = SyntheticWorld::generate(&SyntheticConfig {
        document_filler: 65,
        ..SyntheticConfig::default()
    })
    .expect_err("65 filler sentences");
    assert!(err.to_string().contains("document_filler"), "{err}");
}
