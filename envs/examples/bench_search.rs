//! BM25 search benchmark: 100k seeded synthetic documents, index build time, then query
//! latency (p50/p99) and throughput on one thread.
//!
//! `cargo run --release -p agent-r1-envs --example bench_search [-- DOCS QUERIES]`
//! Prints human lines, then one JSON line with the figures.

use std::io::Write;
use std::time::{Duration, Instant};

use agent_r1_envs::tools::search::{CorpusSource, SearchConfig, SearchTool};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A pronounceable word from syllables; a Zipf-like choice over a fixed vocabulary.
fn vocabulary(rng: &mut ChaCha8Rng, n: usize) -> Vec<String> {
    const SYL: [&str; 24] = [
        "ka", "lo", "mi", "ren", "tu", "sa", "vor", "el", "qui", "dan", "ob", "ria", "zen", "pa",
        "gor", "li", "ne", "thu", "as", "mor", "fi", "ul", "ben", "cy",
    ];
    (0..n)
        .map(|_| {
            let len = rng.random_range(2..=4);
            (0..len)
                .map(|_| SYL[rng.random_range(0..SYL.len())])
                .collect()
        })
        .collect()
}

fn zipf_word<'a>(rng: &mut ChaCha8Rng, vocab: &'a [String]) -> &'a str {
    // Inverse-CDF of a 1/x density: frequent words are frequent, tails are long.
    let u: f64 = rng.random_range(0.0..1.0);
    let i = ((vocab.len() as f64).powf(u) - 1.0) as usize;
    &vocab[i.min(vocab.len() - 1)]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let docs: usize = args
        .get(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(100_000);
    let queries: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(2_000);
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let vocab = vocabulary(&mut rng, 50_000);

    let tmp = tempfile::tempdir()?;
    let corpus = tmp.path().join("corpus.jsonl");
    let gen_start = Instant::now();
    let mut out = std::io::BufWriter::new(std::fs::File::create(&corpus)?);
    let mut titles = Vec::with_capacity(docs);
    for i in 0..docs {
        let title = format!(
            "{} {}",
            zipf_word(&mut rng, &vocab),
            zipf_word(&mut rng, &vocab)
        );
        let words = rng.random_range(40..120);
        let text: Vec<&str> = (0..words).map(|_| zipf_word(&mut rng, &vocab)).collect();
        let line =
            serde_json::json!({"id": format!("d{i}"), "title": title, "text": text.join(" ")});
        writeln!(out, "{line}")?;
        titles.push(title);
    }
    out.flush()?;
    drop(out);
    let corpus_bytes = std::fs::metadata(&corpus)?.len();
    let gen_time = gen_start.elapsed();

    let build_start = Instant::now();
    let tool = SearchTool::open(SearchConfig {
        corpus: CorpusSource::Jsonl(corpus.clone()),
        index_dir: Some(tmp.path().join("index")),
        ..Default::default()
    })?;
    let build = build_start.elapsed();
    let reopen_start = Instant::now();
    let reopened = SearchTool::open(SearchConfig {
        corpus: CorpusSource::Jsonl(corpus),
        index_dir: Some(tmp.path().join("index")),
        ..Default::default()
    })?;
    let reopen = reopen_start.elapsed();
    assert!(!reopened.rebuilt(), "second open reuses the index");
    drop(reopened);

    // Queries: a document's title plus two common words, like a model's search.
    let query_texts: Vec<String> = (0..queries)
        .map(|_| {
            let t = &titles[rng.random_range(0..titles.len())];
            format!(
                "{t} {} {}",
                zipf_word(&mut rng, &vocab),
                zipf_word(&mut rng, &vocab)
            )
        })
        .collect();
    for q in query_texts.iter().take(50) {
        tool.search(q, 5)?; // warm-up
    }
    let mut latencies: Vec<Duration> = Vec::with_capacity(queries);
    let mut hits = 0usize;
    let all = Instant::now();
    for q in &query_texts {
        let t = Instant::now();
        hits += tool.search(q, 5)?.len();
        latencies.push(t.elapsed());
    }
    let total = all.elapsed();
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p).round() as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let qps = queries as f64 / total.as_secs_f64();

    println!(
        "corpus: {docs} docs, {:.1} MB (generated in {:.2}s)",
        corpus_bytes as f64 / 1e6,
        gen_time.as_secs_f64()
    );
    println!(
        "index build: {:.2}s ({:.0} docs/s); reopen from cache: {:.1} ms",
        build.as_secs_f64(),
        docs as f64 / build.as_secs_f64(),
        ms(reopen)
    );
    println!(
        "queries: {queries} on one thread, top 5: p50 {:.3} ms, p99 {:.3} ms, {:.0} queries/s",
        ms(pct(0.5)),
        ms(pct(0.99)),
        qps
    );
    println!(
        "{}",
        serde_json::json!({
            "bench": "search",
            "docs": docs,
            "corpus_bytes": corpus_bytes,
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            "index_build_s": build.as_secs_f64(),
            "reopen_ms": ms(reopen),
            "queries": queries,
            "p50_ms": ms(pct(0.5)),
            "p99_ms": ms(pct(0.99)),
            "qps": qps,
            "mean_hits": hits as f64 / queries as f64,
        })
    );
    Ok(())
}
