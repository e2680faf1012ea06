//! `search`: BM25 full-text retrieval (tantivy) over a local corpus.
//!
//! The corpus is a JSONL file of `{"id", "title", "text"}` or the `context` paragraphs of
//! HotpotQA-format JSON files ([`CorpusSource`]). The index is built once into a directory
//! (configured, else `<first corpus file>.index/`, else a per-user cache directory when the
//! corpus's directory is read-only) and reused. A [`Fingerprint`] of the corpus (size, mtime,
//! content hash) and of the index settings is stored with it; a corpus that changed is
//! re-indexed on the next open. A build goes to a temporary sibling directory that replaces
//! the old index only when complete, so an interrupted build never leaves a half index.
//!
//! Documents with equal scores come back in corpus order: the index is built by several
//! threads into segments whose split varies from build to build, so without that tie-break
//! the same query on the same corpus could return other documents (and a run that indexes
//! its corpus, such as the demo, would not repeat).

pub mod corpus;
pub mod fingerprint;

pub use corpus::CorpusSource;
pub use fingerprint::Fingerprint;

use std::cmp::Reverse;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use tantivy::collector::TopDocs;
use tantivy::query::QueryParser;
use tantivy::schema::{Field, Schema, Value as _, FAST, STORED, STRING, TEXT};
use tantivy::{
    doc, DocId, Index, IndexReader, ReloadPolicy, Score, SegmentReader, TantivyDocument,
};

use crate::error::{Error, Result};
use crate::tool::{Tool, ToolOutput};

/// Settings of the search tool.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchConfig {
    /// The documents.
    pub corpus: CorpusSource,
    /// Where the index lives (default: `<first corpus file>.index/`, or
    /// `$XDG_CACHE_HOME/agent-r1/search/<hash>` when that cannot be created).
    pub index_dir: Option<PathBuf>,
    /// Results per query (Agent-R1 uses 5).
    pub top_k: usize,
    /// Longest text shown per result, in characters.
    pub max_doc_chars: usize,
    /// Calls that may run at once.
    pub max_concurrency: usize,
    /// Wall-clock limit of one call.
    pub timeout: Duration,
    /// Indexing threads (0: tantivy's choice, at most 4).
    pub index_threads: usize,
    /// Indexing memory budget in bytes, shared by the threads.
    pub index_memory_bytes: usize,
    /// Weight of a title match relative to a text match.
    pub title_boost: f32,
}

impl Default for SearchConfig {
    /// Defaults around an empty corpus path (set `corpus` before opening).
    fn default() -> Self {
        Self::new(CorpusSource::default())
    }
}

impl SearchConfig {
    /// Defaults for a corpus.
    pub fn new(corpus: CorpusSource) -> Self {
        Self {
            corpus,
            index_dir: None,
            top_k: 5,
            max_doc_chars: 600,
            max_concurrency: 8,
            timeout: Duration::from_secs(10),
            index_threads: 0,
            index_memory_bytes: 128 << 20,
            title_boost: 2.0,
        }
    }
}

/// One retrieved document.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    /// Document id.
    pub id: String,
    /// Title.
    pub title: String,
    /// Text.
    pub text: String,
    /// BM25 score.
    pub score: f32,
}

/// The BM25 search tool. Cheap to clone (the index is shared).
#[derive(Clone)]
pub struct SearchTool {
    inner: Arc<Inner>,
}

struct Inner {
    config: SearchConfig,
    dir: PathBuf,
    reader: IndexReader,
    parser: QueryParser,
    id: Field,
    title: Field,
    text: Field,
    rebuilt: bool,
    documents: u64,
}

impl std::fmt::Debug for SearchTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SearchTool")
            .field("config", &self.inner.config)
            .field("index_dir", &self.inner.dir)
            .field("documents", &self.inner.documents)
            .finish()
    }
}

const FINGERPRINT_FILE: &str = "agent-r1-fingerprint.json";
/// Bump when the schema or tokenisation changes: every index is rebuilt.
const INDEX_FORMAT: &str = "agent-r1-search-v3";
/// The fast field holding each document's place in the corpus, the tie-break between equal
/// scores.
const POSITION: &str = "position";

fn tantivy_err(dir: &Path, e: impl std::fmt::Display) -> Error {
    Error::Other(format!("{}: search index: {e}", dir.display()))
}

struct Fields {
    id: Field,
    title: Field,
    text: Field,
    position: Field,
}

fn schema() -> (Schema, Fields) {
    let mut schema = Schema::builder();
    let id = schema.add_text_field("id", STRING | STORED);
    let title = schema.add_text_field("title", TEXT | STORED);
    let text = schema.add_text_field("text", TEXT | STORED);
    let position = schema.add_u64_field(POSITION, FAST);
    let fields = Fields {
        id,
        title,
        text,
        position,
    };
    (schema.build(), fields)
}

/// Sorts by score, then by corpus position (earlier first). Read per segment from the
/// position fast field; an index without it (never built by this version) ties at the end.
fn score_then_position(segment: &SegmentReader) -> impl Fn(DocId, Score) -> (Score, Reverse<u64>) {
    let positions = segment
        .fast_fields()
        .u64(POSITION)
        .ok()
        .map(|column| column.first_or_default_col(u64::MAX));
    move |doc, score| {
        let position = positions.as_ref().map_or(u64::MAX, |p| p.get_val(doc));
        (score, Reverse(position))
    }
}

/// The default index directory: beside the corpus, else in the user's cache.
fn default_index_dir(first: &Path, fingerprint_key: &str) -> PathBuf {
    let mut name = first.as_os_str().to_owned();
    name.push(".index");
    let beside = PathBuf::from(name);
    let parent_writable = beside
        .parent()
        .map(|p| {
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            }
        })
        .and_then(|p| std::fs::metadata(p).ok())
        .is_some_and(|m| !m.permissions().readonly());
    if beside.exists() || parent_writable {
        return beside;
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    cache.join("agent-r1").join("search").join(fingerprint_key)
}

impl SearchTool {
    /// Opens the index for `config.corpus`, building it when missing, stale or damaged.
    pub fn open(config: SearchConfig) -> Result<Self> {
        if config.top_k == 0 {
            return Err(Error::Config {
                key: "tools.search.top_k".into(),
                message: "must be at least 1".into(),
            });
        }
        let files = config.corpus.files();
        match files.first() {
            Some(p) if !p.as_os_str().is_empty() => {}
            _ => {
                return Err(Error::Config {
                    key: "tools.search.corpus".into(),
                    message: "no corpus file given".into(),
                })
            }
        }
        let want = Fingerprint::compute(
            INDEX_FORMAT,
            &files,
            json!({"source": match config.corpus {
                CorpusSource::Jsonl(_) => "jsonl",
                CorpusSource::HotpotQa(_) => "hotpotqa",
            }}),
        )?;
        let key = {
            let hashes: Vec<&str> = want.files.iter().map(|f| f.hash.as_str()).collect();
            hashes.join("-")
        };
        let dir = match &config.index_dir {
            Some(d) => d.clone(),
            None => default_index_dir(files[0], &key),
        };
        let (schema, fields) = schema();
        let have = Fingerprint::load(&dir.join(FINGERPRINT_FILE));
        let reused = match have {
            Some(have) if have.matches(&want) => Index::open_in_dir(&dir).ok(),
            _ => None,
        };
        let rebuilt = reused.is_none();
        let index = match reused {
            Some(index) => index,
            None => {
                build_index(&config, &dir, schema, &fields)?;
                want.store(&dir.join(FINGERPRINT_FILE))?;
                Index::open_in_dir(&dir).map_err(|e| tantivy_err(&dir, e))?
            }
        };
        let reader: IndexReader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()
            .map_err(|e| tantivy_err(&dir, e))?;
        let documents = reader.searcher().num_docs();
        let mut parser = QueryParser::for_index(&index, vec![fields.title, fields.text]);
        parser.set_field_boost(fields.title, config.title_boost);
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                dir,
                reader,
                parser,
                id: fields.id,
                title: fields.title,
                text: fields.text,
                rebuilt,
                documents,
            }),
        })
    }

    /// Whether `open` built the index (rather than reusing the cached one).
    pub fn rebuilt(&self) -> bool {
        self.inner.rebuilt
    }

    /// Documents indexed.
    pub fn num_documents(&self) -> u64 {
        self.inner.documents
    }

    /// The directory the index lives in.
    pub fn index_dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The settings the tool was opened with.
    pub fn config(&self) -> &SearchConfig {
        &self.inner.config
    }

    /// The `k` best documents for `query`, best first. Query syntax errors are tolerated
    /// (the words are searched as plain terms); an error here means the index could not be
    /// read.
    pub fn search(&self, query: &str, k: usize) -> Result<Vec<Hit>> {
        let inner = &self.inner;
        let (q, _errors) = inner.parser.parse_query_lenient(query);
        let searcher = inner.reader.searcher();
        let top = searcher
            .search(
                &q,
                &TopDocs::with_limit(k.max(1)).tweak_score(score_then_position),
            )
            .map_err(|e| tantivy_err(&inner.dir, e))?;
        let field = |d: &TantivyDocument, f: Field| {
            d.get_first(f)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string()
        };
        top.into_iter()
            .map(|((score, _), addr)| {
                let d: TantivyDocument =
                    searcher.doc(addr).map_err(|e| tantivy_err(&inner.dir, e))?;
                Ok(Hit {
                    id: field(&d, inner.id),
                    title: field(&d, inner.title),
                    text: field(&d, inner.text),
                    score,
                })
            })
            .collect()
    }

    /// Results as the model sees them: `Doc i (Title: ...) text`, one per line.
    pub fn format_hits(&self, hits: &[Hit]) -> String {
        if hits.is_empty() {
            return "No results found.".into();
        }
        hits.iter()
            .enumerate()
            .map(|(i, h)| {
                let text = crate::tool::truncate_chars(&h.text, self.inner.config.max_doc_chars);
                format!("Doc {} (Title: {}) {}", i + 1, h.title, text)
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Builds the index into a temporary sibling of `dir`, then moves it into place.
fn build_index(config: &SearchConfig, dir: &Path, schema: Schema, fields: &Fields) -> Result<()> {
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    let mut tmp_name = dir.file_name().unwrap_or_default().to_owned();
    tmp_name.push(format!(".building-{}", std::process::id()));
    let tmp = parent.join(tmp_name);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let result = (|| {
        let index = Index::create_in_dir(&tmp, schema).map_err(|e| tantivy_err(&tmp, e))?;
        let memory = config.index_memory_bytes.max(16 << 20);
        let mut writer = if config.index_threads == 0 {
            index.writer::<TantivyDocument>(memory)
        } else {
            index.writer_with_num_threads::<TantivyDocument>(config.index_threads, memory)
        }
        .map_err(|e| tantivy_err(&tmp, e))?;
        let mut position = 0u64;
        config
            .corpus
            .for_each_document(|doc_id, doc_title, doc_text| {
                let document = doc!(
                    fields.id => doc_id,
                    fields.title => doc_title,
                    fields.text => doc_text,
                    fields.position => position,
                );
                position += 1;
                writer
                    .add_document(document)
                    .map(|_| ())
                    .map_err(|e| tantivy_err(&tmp, e))
            })?;
        writer.commit().map_err(|e| tantivy_err(&tmp, e))?;
        writer
            .wait_merging_threads()
            .map_err(|e| tantivy_err(&tmp, e))
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    std::fs::rename(&tmp, dir).map_err(|e| Error::io(dir, e))
}

const NAME: &str = "search";
const DESCRIPTION: &str =
    "Search the document collection. Returns the best matching documents with their titles.";

fn parameters() -> Value {
    json!({
        "type": "object",
        "properties": {"query": {"type": "string", "description": "What to search for."}},
        "required": ["query"]
    })
}

impl SearchTool {
    /// The tool's spec as [`Tool::spec`] gives it, without opening (or building) an index:
    /// for measuring prompts before a run.
    pub fn unopened_spec() -> Value {
        json!({
            "type": "function",
            "function": {"name": NAME, "description": DESCRIPTION, "parameters": parameters()}
        })
    }
}

#[async_trait]
impl Tool for SearchTool {
    fn name(&self) -> &str {
        NAME
    }
    fn description(&self) -> &str {
        DESCRIPTION
    }
    fn parameters(&self) -> Value {
        parameters()
    }
    fn timeout(&self) -> Duration {
        self.inner.config.timeout
    }
    fn max_concurrency(&self) -> usize {
        self.inner.config.max_concurrency
    }
    async fn call(&self, arguments: Value) -> Result<ToolOutput> {
        let query = arguments
            .get("query")
            .and_then(Value::as_str)
            .unwrap_or("")
            .trim()
            .to_string();
        if query.is_empty() {
            return Err(Error::Tool {
                tool: "search".into(),
                message: "the query is empty".into(),
            });
        }
        let this = self.clone();
        let hits = tokio::task::spawn_blocking(move || {
            let k = this.inner.config.top_k;
            this.search(&query, k)
                .map(|hits| (this.format_hits(&hits), hits))
        })
        .await
        .map_err(|e| Error::Tool {
            tool: "search".into(),
            message: format!("search task failed: {e}"),
        })?;
        let (text, hits) = hits?;
        let mut out = ToolOutput::text(text);
        out.metadata.insert(
            "ids".into(),
            hits.iter().map(|h| Value::from(h.id.clone())).collect(),
        );
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus(dir: &Path, docs: &[(&str, &str)]) -> PathBuf {
        let path = dir.join("corpus.jsonl");
        let lines: Vec<String> = docs
            .iter()
            .enumerate()
            .map(|(i, (t, x))| json!({"id": format!("d{i}"), "title": t, "text": x}).to_string())
            .collect();
        std::fs::write(&path, lines.join("\n")).unwrap();
        path
    }

    #[test]
    fn finds_by_title_and_text_and_caches_the_index() {
        let tmp = tempfile::tempdir().unwrap();
        let docs = [
            ("Zorvex Labs", "Zorvex Labs was founded by Mira Quell."),
            ("Mira Quell", "Mira Quell was born in Tarnow."),
            ("Tarnow", "Tarnow is a city in Veloria."),
        ];
        let path = corpus(tmp.path(), &docs);
        let tool = SearchTool::open(SearchConfig::new(CorpusSource::Jsonl(path.clone()))).unwrap();
        assert!(tool.rebuilt());
        assert_eq!(tool.num_documents(), 3);
        let hits = tool.search("Mira Quell", 2).unwrap();
        assert_eq!(hits[0].title, "Mira Quell");
        let out = futures_lite_block(tool.call(json!({"query": "founder of Zorvex Labs"})));
        assert!(
            out.text.starts_with("Doc 1 (Title: Zorvex Labs)"),
            "{}",
            out.text
        );
        drop(tool);

        let again = SearchTool::open(SearchConfig::new(CorpusSource::Jsonl(path.clone()))).unwrap();
        assert!(!again.rebuilt(), "unchanged corpus reuses the index");
        drop(again);
        let path = corpus(tmp.path(), &docs[..2]);
        let changed = SearchTool::open(SearchConfig::new(CorpusSource::Jsonl(path))).unwrap();
        assert!(changed.rebuilt() && changed.num_documents() == 2);
    }

    #[test]
    fn equal_scores_come_back_in_corpus_order_however_the_index_was_split() {
        let tmp = tempfile::tempdir().unwrap();
        let docs: Vec<(&str, &str)> = (0..400).map(|_| ("Same", "alpha beta")).collect();
        let path = corpus(tmp.path(), &docs);
        let want: Vec<String> = (0..docs.len()).map(|i| format!("d{i}")).collect();
        for (build, threads) in [1, 4, 4].into_iter().enumerate() {
            let mut config = SearchConfig::new(CorpusSource::Jsonl(path.clone()));
            config.index_threads = threads;
            config.index_dir = Some(tmp.path().join(format!("index-{build}")));
            let tool = SearchTool::open(config).unwrap();
            let hits = tool.search("alpha", docs.len()).unwrap();
            assert!(hits.windows(2).all(|w| w[0].score == w[1].score));
            let ids: Vec<String> = hits.into_iter().map(|h| h.id).collect();
            assert_eq!(ids, want, "build {build} with {threads} indexing threads");
            let first: Vec<String> = tool
                .search("alpha", 3)
                .unwrap()
                .into_iter()
                .map(|h| h.id)
                .collect();
            assert_eq!(first, want[..3], "top 3, build {build}");
        }
    }

    #[test]
    fn bad_rows_and_bad_queries() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("c.jsonl");
        std::fs::write(
            &path,
            "{\"title\": \"a\", \"text\": \"x\"}\n{\"title\": 3}\n",
        )
        .unwrap();
        let e = SearchTool::open(SearchConfig::new(CorpusSource::Jsonl(path.clone()))).unwrap_err();
        assert!(e.to_string().contains("c.jsonl:2"), "{e}");
        std::fs::write(&path, "{\"title\": \"a b\", \"text\": \"alpha beta\"}\n").unwrap();
        let tool = SearchTool::open(SearchConfig::new(CorpusSource::Jsonl(path))).unwrap();
        // Query syntax errors do not fail the call.
        assert_eq!(tool.search("alpha AND (", 3).unwrap().len(), 1);
        assert!(futures_lite_try(tool.call(json!({"query": "  "}))).is_err());
    }

    #[test]
    fn reads_hotpotqa_context_paragraphs() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("hotpot.json");
        let rows = json!([{"_id": "1", "question": "q", "answer": "a",
            "context": [["Alpha", ["Alpha is ", "a letter."]], ["Beta", ["Beta follows alpha."]]]},
            {"_id": "2", "question": "q", "answer": "a", "context": [["Alpha", ["Alpha is a letter."]]]}]);
        std::fs::write(&path, rows.to_string()).unwrap();
        let tool = SearchTool::open(SearchConfig::new(CorpusSource::HotpotQa(vec![path]))).unwrap();
        assert_eq!(
            tool.num_documents(),
            2,
            "paragraphs are de-duplicated by title"
        );
        assert_eq!(
            tool.search("letter", 1).unwrap()[0].text,
            "Alpha is a letter."
        );
    }

    fn futures_lite_try<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    fn futures_lite_block<F: std::future::Future<Output = Result<ToolOutput>>>(f: F) -> ToolOutput {
        futures_lite_try(f).unwrap()
    }
}
