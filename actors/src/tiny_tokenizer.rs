//! Trains a small byte-level BPE tokenizer in the style of a model family (its pre-tokenizer,
//! special tokens and chat template) and writes it as a Hugging Face model directory's
//! tokenizer files.
//!
//! Tests, CI and CPU-only runs need a policy small enough to train in seconds, but one that goes
//! through exactly the code a real Qwen2.5 checkpoint does: the same pre-tokenizer, the same
//! special and tool tokens, the same chat template with tools, loadable by both
//! [`crate::tokenizer::HfTokenizer`] and transformers' `AutoTokenizer`. A 150k-token vocabulary
//! would dominate a tiny model's parameters, so the vocabulary is trained instead of copied.
//! Real-shaped models (`init-model --shape`) need the real vocabulary size instead: the
//! trained vocabulary is then padded with byte-sequence entries that no merge produces, so
//! the tokenizer has exactly the model's vocabulary and still encodes like the trained one.

use std::path::Path;
use std::str::FromStr;

use serde_json::{json, Map, Value};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use crate::chat_template::{
    LLAMA3_1_CHAT_TEMPLATE, MISTRAL_V0_3_CHAT_TEMPLATE, QWEN2_5_CHAT_TEMPLATE, QWEN3_CHAT_TEMPLATE,
};
use crate::error::{Error, Result};

/// Qwen2's pre-tokenizer split (contractions, letters, single digits, punctuation runs,
/// newlines, spaces), so that text splits into the same kind of pieces as in Qwen2.5.
const QWEN2_PRETOKENIZE_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Llama 3's split: Qwen2's with digits in runs of up to three.
const LLAMA3_PRETOKENIZE_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Control tokens, marked special as in Qwen2.5 (dropped by `skip_special_tokens`).
pub const SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Tool and format tags, added as single non-special tokens: Qwen2.5 has `<tool_call>` and
/// `<tool_response>` this way, which lets generation stop on the `</tool_call>` id and keeps the
/// tags when decoding with `skip_special_tokens`.
pub const TAG_TOKENS: [&str; 8] = [
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<answer>",
    "</answer>",
];

/// Llama 3.1's control tokens, in its order.
const LLAMA3_SPECIAL_TOKENS: [&str; 8] = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|finetune_right_pad_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
];

/// Mistral v0.3's control tokens, in its order.
const MISTRAL_SPECIAL_TOKENS: [&str; 10] = [
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[TOOL_CALLS]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
];

/// The format tags an agent's prompts use, for families whose tokenizer has no tool tags.
const AGENT_TAG_TOKENS: [&str; 4] = ["<think>", "</think>", "<answer>", "</answer>"];

/// A model family's tokenizer layout: how text is split, its control tokens, its chat
/// template and which tokens end a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TokenizerStyle {
    /// Qwen2.5-Instruct: ChatML, hermes tool calls.
    #[default]
    Qwen2_5,
    /// Qwen3: Qwen2.5's tokens, its own template (`<think>` handling).
    Qwen3,
    /// Llama 3.1-3.3 Instruct: header tokens, JSON tool calls, the `ipython` role.
    Llama3_1,
    /// Mistral-7B-Instruct v0.3: `[INST]`, `[TOOL_CALLS]`, `[TOOL_RESULTS]`.
    Mistral,
}

/// What a style fixes about a tokenizer.
struct StyleSpec {
    regex: &'static str,
    nfc: bool,
    specials: &'static [&'static str],
    tags: &'static [&'static str],
    bos: Option<&'static str>,
    eos: &'static str,
    pad: &'static str,
    unk: Option<&'static str>,
    /// The ids `generation_config.json` lists as ending generation.
    generation_eos: &'static [&'static str],
    template: &'static str,
    model_max_length: usize,
}

impl TokenizerStyle {
    fn spec(self) -> StyleSpec {
        match self {
            TokenizerStyle::Qwen2_5 | TokenizerStyle::Qwen3 => StyleSpec {
                regex: QWEN2_PRETOKENIZE_REGEX,
                nfc: true,
                specials: &SPECIAL_TOKENS,
                tags: &TAG_TOKENS,
                bos: None,
                eos: "<|im_end|>",
                pad: "<|endoftext|>",
                unk: None,
                generation_eos: &["<|im_end|>", "<|endoftext|>"],
                template: if self == TokenizerStyle::Qwen3 {
                    QWEN3_CHAT_TEMPLATE
                } else {
                    QWEN2_5_CHAT_TEMPLATE
                },
                model_max_length: if self == TokenizerStyle::Qwen3 {
                    40960
                } else {
                    32768
                },
            },
            TokenizerStyle::Llama3_1 => StyleSpec {
                regex: LLAMA3_PRETOKENIZE_REGEX,
                nfc: false,
                specials: &LLAMA3_SPECIAL_TOKENS,
                tags: &AGENT_TAG_TOKENS,
                bos: Some("<|begin_of_text|>"),
                eos: "<|eot_id|>",
                pad: "<|finetune_right_pad_id|>",
                unk: None,
                generation_eos: &["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
                template: LLAMA3_1_CHAT_TEMPLATE,
                model_max_length: 131072,
            },
            TokenizerStyle::Mistral => StyleSpec {
                regex: LLAMA3_PRETOKENIZE_REGEX,
                nfc: false,
                specials: &MISTRAL_SPECIAL_TOKENS,
                tags: &AGENT_TAG_TOKENS,
                bos: Some("<s>"),
                eos: "</s>",
                pad: "</s>",
                unk: Some("<unk>"),
                generation_eos: &["</s>"],
                template: MISTRAL_V0_3_CHAT_TEMPLATE,
                model_max_length: 32768,
            },
        }
    }
}

/// Ids a model config and `generation_config.json` need from a trained tokenizer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TinyTokenizerIds {
    /// Total ids, added tokens included: the model's `vocab_size` must be at least this.
    pub vocab_size: usize,
    /// The configured `eos_token` (`<|im_end|>` for Qwen, `<|eot_id|>` for Llama 3.1).
    pub eos_token_id: u32,
    /// The configured `pad_token`.
    pub pad_token_id: u32,
    /// The configured `bos_token`, for families that have one.
    pub bos_token_id: Option<u32>,
    /// Every end-of-turn id, as `generation_config.json`'s `eos_token_id` lists them for the
    /// family's instruct model (`<|im_end|>`, `<|endoftext|>` for Qwen).
    pub eos_token_ids: Vec<u32>,
}

impl TinyTokenizerIds {
    /// A `generation_config.json` body for these ids, laid out as the family's instruct
    /// model's: for Qwen, BOS and pad are `<|endoftext|>` (which the tokenizer never inserts),
    /// and every end token stops.
    pub fn generation_config(&self) -> Value {
        json!({
            "bos_token_id": self.bos_token_id.unwrap_or(self.pad_token_id),
            "eos_token_id": self.eos_token_ids,
            "pad_token_id": self.pad_token_id,
        })
    }
}

/// A trained tokenizer, ready to be written into a model directory.
#[derive(Debug, Clone)]
pub struct TinyTokenizer {
    tokenizer_json: String,
    tokenizer_config: Value,
    ids: TinyTokenizerIds,
}

impl TinyTokenizer {
    /// The `tokenizer.json` text (deterministic for a given corpus and vocabulary size).
    pub fn tokenizer_json(&self) -> &str {
        &self.tokenizer_json
    }

    /// The `tokenizer_config.json` body.
    pub fn tokenizer_config(&self) -> &Value {
        &self.tokenizer_config
    }

    /// The ids a model config needs.
    pub fn ids(&self) -> &TinyTokenizerIds {
        &self.ids
    }

    /// Writes `tokenizer.json` and `tokenizer_config.json` into `dir` (created if missing).
    /// `generation_config.json` is left to whoever writes the model's config, with
    /// [`TinyTokenizerIds::generation_config`].
    pub fn write_to(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let tokenizer_path = dir.join("tokenizer.json");
        std::fs::write(&tokenizer_path, &self.tokenizer_json)
            .map_err(|e| Error::io(&tokenizer_path, e))?;
        let config_path = dir.join("tokenizer_config.json");
        let config = serde_json::to_string_pretty(&self.tokenizer_config)
            .map_err(|e| Error::model(&config_path, format!("cannot serialize: {e}")))?;
        std::fs::write(&config_path, config + "\n").map_err(|e| Error::io(&config_path, e))
    }
}

/// Trains a Qwen2.5-style byte-level BPE on `corpus_lines` so that the whole vocabulary, the 3
/// special and 8 tag tokens and `whole_words` included, has at most `vocab_size` ids (fewer
/// when the corpus runs out of merges).
///
/// `whole_words` (for example the entity names of a generated world) become single non-special
/// tokens matched only as whole words. Why: byte-level BPE splits a name differently after a
/// space than after a quote (`" Stunu"` vs `"St" "unu"`), so copying a name from a question
/// into a tool call is a learnt token-to-token mapping rather than a plain copy; a tiny model
/// learns the plain copy in a fraction of the steps. Duplicates and words that already are
/// tags are skipped.
///
/// The 256 byte symbols are always in the vocabulary, so any text encodes; `vocab_size` must
/// leave room for them and the added tokens (at least 267). Training is deterministic: the same
/// lines and size give the same `tokenizer.json` bytes.
pub fn train_tiny_tokenizer<I, S>(
    corpus_lines: I,
    vocab_size: usize,
    whole_words: &[String],
) -> Result<TinyTokenizer>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    train_tokenizer(
        TokenizerStyle::Qwen2_5,
        corpus_lines,
        vocab_size,
        whole_words,
        false,
    )
}

/// Trains a byte-level BPE in `style` (see [`train_tiny_tokenizer`] for the rest). With
/// `exact`, the vocabulary is padded to exactly `vocab_size` ids with byte sequences no merge
/// produces, the way a real-shaped model's tokenizer has its full vocabulary.
pub fn train_tokenizer<I, S>(
    style: TokenizerStyle,
    corpus_lines: I,
    vocab_size: usize,
    whole_words: &[String],
    exact: bool,
) -> Result<TinyTokenizer>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let spec = style.spec();
    let mut words: Vec<&str> = whole_words
        .iter()
        .map(|w| w.trim())
        .filter(|w| !w.is_empty() && !spec.tags.contains(w) && !spec.specials.contains(w))
        .collect();
    words.sort_unstable();
    words.dedup();
    let n_added = spec.specials.len() + spec.tags.len() + words.len();
    let alphabet: std::collections::HashSet<char> = ByteLevel::alphabet().into_iter().collect();
    let min_size = alphabet.len() + n_added;
    if vocab_size < min_size {
        return Err(Error::invalid(
            "vocab_size",
            format!(
                "{vocab_size} is too small: the byte alphabet and added tokens need {min_size}"
            ),
        ));
    }

    let mut tokenizer = Tokenizer::new(BPE::default());
    if spec.nfc {
        tokenizer
            .with_normalizer(Some(NFC))
            .map_err(|e| Error::Tokenizer(format!("normalizer: {e}")))?;
    }
    let split = Split::new(
        SplitPattern::Regex(spec.regex.into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| Error::Tokenizer(format!("pre-tokenizer regex: {e}")))?;
    tokenizer.with_pre_tokenizer(Some(Sequence::new(vec![
        PreTokenizerWrapper::Split(split),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)),
    ])));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));

    // The trained part stays small when padding: merges learnt from a few KB of text.
    let bpe_size = vocab_size - n_added;
    let trained_size = if exact { bpe_size.min(4096) } else { bpe_size };
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(trained_size)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(alphabet.clone())
        .build()
        .into();
    let lines: Vec<String> = corpus_lines
        .into_iter()
        .map(|l| l.as_ref().to_string())
        .filter(|l| !l.trim().is_empty())
        .collect();
    tokenizer
        .train(&mut trainer, lines.iter())
        .map_err(|e| Error::Tokenizer(format!("training: {e}")))?;
    if exact {
        tokenizer = pad_vocabulary(&tokenizer, bpe_size, &alphabet)?;
    }

    // Added after training so that they take the ids after the BPE vocabulary, as in Qwen2.5
    // and Llama 3.
    let specials: Vec<AddedToken> = spec
        .specials
        .iter()
        .map(|t| AddedToken::from(*t, true))
        .collect();
    tokenizer
        .add_special_tokens(specials)
        .map_err(|e| Error::Tokenizer(format!("{e}")))?;
    let tags: Vec<AddedToken> = spec
        .tags
        .iter()
        .map(|t| AddedToken::from(*t, false).normalized(false))
        .collect();
    tokenizer
        .add_tokens(tags)
        .map_err(|e| Error::Tokenizer(format!("{e}")))?;
    let whole: Vec<AddedToken> = words
        .iter()
        .map(|w| {
            AddedToken::from(*w, false)
                .normalized(false)
                .single_word(true)
        })
        .collect();
    tokenizer
        .add_tokens(whole)
        .map_err(|e| Error::Tokenizer(format!("{e}")))?;

    let id = |t: &str| {
        tokenizer
            .token_to_id(t)
            .ok_or_else(|| Error::Tokenizer(format!("{t} missing after training")))
    };
    let eos_token_ids = spec
        .generation_eos
        .iter()
        .map(|t| id(t))
        .collect::<Result<Vec<_>>>()?;
    let ids = TinyTokenizerIds {
        vocab_size: tokenizer.get_vocab_size(true),
        eos_token_id: id(spec.eos)?,
        pad_token_id: id(spec.pad)?,
        bos_token_id: spec.bos.map(id).transpose()?,
        eos_token_ids,
    };
    if exact && ids.vocab_size != vocab_size {
        return Err(Error::Tokenizer(format!(
            "padded vocabulary has {} ids, not {vocab_size}",
            ids.vocab_size
        )));
    }

    let mut added = Map::new();
    for (token, special, single_word) in spec
        .specials
        .iter()
        .map(|t| (*t, true, false))
        .chain(spec.tags.iter().map(|t| (*t, false, false)))
        .chain(words.iter().map(|w| (*w, false, true)))
    {
        added.insert(
            id(token)?.to_string(),
            json!({
                "content": token,
                "lstrip": false,
                "normalized": false,
                "rstrip": false,
                "single_word": single_word,
                "special": special,
            }),
        );
    }
    let tokenizer_config = json!({
        "add_bos_token": false,
        "add_eos_token": false,
        "add_prefix_space": false,
        "added_tokens_decoder": added,
        "bos_token": spec.bos,
        "chat_template": spec.template,
        "clean_up_tokenization_spaces": false,
        "eos_token": spec.eos,
        "errors": "replace",
        "model_max_length": spec.model_max_length,
        "pad_token": spec.pad,
        "split_special_tokens": false,
        // Loads tokenizer.json as written, whatever the model type, in transformers 4 and 5.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": spec.unk,
    });

    let tokenizer_json = tokenizer
        .to_string(true)
        .map_err(|e| Error::Tokenizer(format!("serialize: {e}")))?;
    Ok(TinyTokenizer {
        tokenizer_json,
        tokenizer_config,
        ids,
    })
}

/// The BPE of `tokenizer` with its vocabulary padded to `size` entries: byte pairs, then
/// triples, of the byte-level alphabet, in a fixed order, skipping entries it has. No merge
/// makes them, so encoding is unchanged; they decode to their bytes like any entry.
fn pad_vocabulary(
    tokenizer: &Tokenizer,
    size: usize,
    alphabet: &std::collections::HashSet<char>,
) -> Result<Tokenizer> {
    let mut json: Value = serde_json::from_str(
        &tokenizer
            .to_string(false)
            .map_err(|e| Error::Tokenizer(format!("serialize: {e}")))?,
    )
    .map_err(|e| Error::Tokenizer(format!("re-read: {e}")))?;
    let vocab = json["model"]["vocab"]
        .as_object_mut()
        .ok_or_else(|| Error::Tokenizer("BPE model without a vocab".into()))?;
    let mut sorted: Vec<char> = alphabet.iter().copied().collect();
    sorted.sort_unstable();
    let symbols = &sorted;
    let pairs = symbols.iter().flat_map(|a| {
        symbols
            .iter()
            .map(move |b| [*a, *b].iter().collect::<String>())
    });
    let triples = symbols.iter().flat_map(|a| {
        symbols.iter().flat_map(move |b| {
            symbols
                .iter()
                .map(move |c| [*a, *b, *c].iter().collect::<String>())
        })
    });
    let mut next = vocab.len();
    for entry in pairs.chain(triples) {
        if next >= size {
            break;
        }
        if !vocab.contains_key(&entry) {
            vocab.insert(entry, next.into());
            next += 1;
        }
    }
    Tokenizer::from_str(&json.to_string())
        .map_err(|e| Error::Tokenizer(format!("padded vocabulary: {e}")))
}

/// Trains on `corpus` (or [`BUILTIN_CORPUS`] when `None`) and writes the tokenizer files into
/// `dir`, returning the ids the model config needs; see [`train_tiny_tokenizer`] for
/// `whole_words`.
pub fn write_tiny_tokenizer(
    dir: impl AsRef<Path>,
    corpus: Option<&str>,
    vocab_size: usize,
    whole_words: &[String],
) -> Result<TinyTokenizerIds> {
    let trained = train_tiny_tokenizer(
        corpus.unwrap_or(BUILTIN_CORPUS).lines(),
        vocab_size,
        whole_words,
    )?;
    trained.write_to(dir)?;
    Ok(trained.ids)
}

/// [`write_tiny_tokenizer`] in any style; `exact` as in [`train_tokenizer`].
pub fn write_tokenizer(
    style: TokenizerStyle,
    dir: impl AsRef<Path>,
    corpus: Option<&str>,
    vocab_size: usize,
    whole_words: &[String],
    exact: bool,
) -> Result<TinyTokenizerIds> {
    let trained = train_tokenizer(
        style,
        corpus.unwrap_or(BUILTIN_CORPUS).lines(),
        vocab_size,
        whole_words,
        exact,
    )?;
    trained.write_to(dir)?;
    Ok(trained.ids)
}

/// A few KB of English in the shape of agent episodes (questions, reasoning, tool calls, tool
/// results, answers), so a tokenizer trained on it splits rollout text into sensible pieces
/// when no corpus is given.
pub const BUILTIN_CORPUS: &str = r#"You are a helpful assistant. Answer the question, using the tools when you need facts.
You may call one or more functions to assist with the user query.
For each function call, return a json object with function name and arguments within tags.
{"type": "function", "function": {"name": "search", "description": "Search Wikipedia for a query and return the top passages.", "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "The search query."}}, "required": ["query"]}}}
{"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic expression.", "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
{"type": "function", "function": {"name": "python", "description": "Run Python code and return what it prints.", "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}
Question: Which city is the capital of France?
<think>I should search for the capital of France.</think>
<tool_call>{"name": "search", "arguments": {"query": "capital of France"}}</tool_call>
<tool_response>Paris is the capital and most populous city of France.</tool_response>
<think>The search result says Paris is the capital.</think>
<answer>Paris</answer>
Question: What is 17 times 23?
<think>I will use the calculator to multiply the two numbers.</think>
<tool_call>{"name": "calculator", "arguments": {"expression": "17 * 23"}}</tool_call>
<tool_response>391</tool_response>
<answer>391</answer>
Question: Who wrote the novel Pride and Prejudice, and in which year was it published?
<think>This is a two-hop question: first the author, then the year of publication.</think>
<tool_call>{"name": "search", "arguments": {"query": "Pride and Prejudice author"}}</tool_call>
<tool_response>Pride and Prejudice is an 1813 novel of manners by Jane Austen.</tool_response>
<answer>Jane Austen, 1813</answer>
Question: Were Scott Derrickson and Ed Wood of the same nationality?
<think>I need the nationality of each director, then compare them.</think>
<tool_call>{"name": "search", "arguments": {"query": "Scott Derrickson nationality"}}</tool_call>
<tool_response>Scott Derrickson is an American director, screenwriter and producer.</tool_response>
<tool_call>{"name": "search", "arguments": {"query": "Ed Wood nationality"}}</tool_call>
<tool_response>Edward Davis Wood Jr. was an American filmmaker, actor and author.</tool_response>
<answer>yes</answer>
Question: How many days are there in a leap year?
<answer>366</answer>
Question: What is the sum of the first ten positive integers?
<tool_call>{"name": "python", "arguments": {"code": "print(sum(range(1, 11)))"}}</tool_call>
<tool_response>55</tool_response>
<answer>55</answer>
Question: Which river flows through the city of London?
<tool_call>{"name": "search", "arguments": {"query": "river London"}}</tool_call>
<tool_response>The River Thames flows through southern England, including London.</tool_response>
<answer>The Thames</answer>
Error: JSONDecodeError. Error: No tool name. Error: ToolNotFoundError. Error: Invalid tool arguments.
The user asks a question. The assistant thinks step by step, calls a tool, reads the result and answers.
If the search result does not contain the answer, search again with a different query.
The answer should be short: a name, a number, a date, or yes or no.
Natalie spent 12 dollars on books and 8 dollars on pens. How much did she spend in total?
<think>12 + 8 = 20</think>
<answer>20</answer>
A train travels 60 kilometres per hour for 3 hours. How far does it travel?
<think>Distance is speed times time, so 60 * 3 = 180.</think>
<answer>180 kilometres</answer>
The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore.
The weather today is sunny with a high of 25 degrees and a low of 14 degrees.
Please summarise the following passage in one sentence.
Thank you! Is there anything else I can help you with?
I'm not sure, but I think the answer is in the second paragraph. Let's check it again.
It's important to verify each fact before giving the final answer; don't guess.
The first document says the film was released in 1994, and the second says it won three awards.
Albert Einstein was a German-born theoretical physicist who developed the theory of relativity.
Marie Curie was a physicist and chemist who conducted pioneering research on radioactivity.
The Great Wall of China is a series of fortifications built across the northern borders of China.
Mount Everest is the highest mountain above sea level, located in the Himalayas.
The Pacific Ocean is the largest and deepest of the world's five oceanic divisions.
Python is a programming language. print("hello, world") prints a greeting.
def add(a, b):
    return a + b
for i in range(10):
    total += i * i
{"query": "population of Tokyo", "top_k": 5}
{"result": "Tokyo has a population of about 14 million people.", "score": 0.87}
Answer: yes. Answer: no. Answer: 42. Answer: 1999. Answer: January 1, 2000.
system user assistant tool function arguments name description parameters properties required type string integer number boolean object array
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn training_is_deterministic() {
        let a = train_tiny_tokenizer(BUILTIN_CORPUS.lines(), 600, &[]).unwrap();
        let b = train_tiny_tokenizer(BUILTIN_CORPUS.lines(), 600, &[]).unwrap();
        assert_eq!(a.tokenizer_json(), b.tokenizer_json());
        assert_eq!(a.tokenizer_config(), b.tokenizer_config());
        assert_eq!(a.ids(), b.ids());
    }

    #[test]
    fn vocabulary_layout_follows_qwen() {
        let t = train_tiny_tokenizer(BUILTIN_CORPUS.lines(), 600, &[]).unwrap();
        let ids = t.ids();
        assert!(
            ids.vocab_size <= 600 && ids.vocab_size > 256 + 11,
            "{}",
            ids.vocab_size
        );
        let tok = Tokenizer::from_bytes(t.tokenizer_json().as_bytes()).unwrap();
        // Added tokens come last, specials first, in Qwen's order.
        let all: Vec<&str> = SPECIAL_TOKENS
            .iter()
            .chain(TAG_TOKENS.iter())
            .copied()
            .collect();
        for (i, token) in all.iter().enumerate() {
            let want = u32::try_from(ids.vocab_size - all.len() + i).unwrap();
            assert_eq!(tok.token_to_id(token), Some(want), "{token}");
        }
        assert_eq!(ids.eos_token_id, tok.token_to_id("<|im_end|>").unwrap());
        assert_eq!(ids.pad_token_id, tok.token_to_id("<|endoftext|>").unwrap());
        let decoder = &t.tokenizer_config()["added_tokens_decoder"];
        assert_eq!(decoder[ids.eos_token_id.to_string()]["special"], true);
        let tool_call = tok.token_to_id("<tool_call>").unwrap();
        assert_eq!(decoder[tool_call.to_string()]["special"], false);
    }

    #[test]
    fn any_text_round_trips() {
        let t = train_tiny_tokenizer(BUILTIN_CORPUS.lines(), 400, &[]).unwrap();
        let tok = Tokenizer::from_bytes(t.tokenizer_json().as_bytes()).unwrap();
        let text = "Zürich 東京 🦀 <tool_call>{\"a\": 1}</tool_call>\n\n  tabs\tand\r\nlines";
        let enc = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(enc.get_ids(), false).unwrap(), text);
    }

    #[test]
    fn a_different_corpus_gives_a_different_tokenizer() {
        let a = train_tiny_tokenizer(BUILTIN_CORPUS.lines(), 500, &[]).unwrap();
        let b = train_tiny_tokenizer(["zzz qqq zzz qqq zzzqqq"; 10], 500, &[]).unwrap();
        assert_ne!(a.tokenizer_json(), b.tokenizer_json());
        assert!(b.ids().vocab_size < 500, "a tiny corpus runs out of merges");
    }

    #[test]
    fn too_small_a_vocabulary_is_rejected() {
        let err = train_tiny_tokenizer(BUILTIN_CORPUS.lines(), 100, &[]).unwrap_err();
        assert!(matches!(err, Error::Invalid { .. }), "{err:?}");
    }

    #[test]
    fn writes_a_directory_with_generation_ids() {
        let dir = tempfile::tempdir().unwrap();
        let ids = write_tiny_tokenizer(dir.path().join("m"), None, 400, &[]).unwrap();
        assert!(dir.path().join("m/tokenizer.json").is_file());
        assert!(dir.path().join("m/tokenizer_config.json").is_file());
        let gen = ids.generation_config();
        assert_eq!(
            gen["eos_token_id"],
            json!([ids.eos_token_id, ids.pad_token_id])
        );
    }
}
