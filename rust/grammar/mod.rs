//! Grammar-constrained decoding: a generation may carry a `Constraint` whose token mask is
//! applied to the logits before sampling (`model::sample`), so what is generated always
//! belongs to a grammar: a JSON Schema, any JSON object, a Lark grammar or a regular
//! expression, compiled by llguidance (docs/architecture.md §7.2).
//!
//! The core has no tokenizer: the caller gives a model's vocabulary once (`Vocabulary::new`:
//! each token's bytes, an added or special token as a 0xFF byte then its text, as toktrie
//! expects; the EOS id). A `Vocabulary` holds llguidance's `ParserFactory` (the token trie and
//! its precomputed slices) and an LRU of compiled grammars keyed by their source, so a schema
//! is compiled once however many requests send it. A compiled `Grammar` is a matcher in its
//! start state; each generation takes a clone (`Constraint::new`), which shares the grammar's
//! lexer cache and advances on its own.

mod lru;
#[cfg(test)]
mod tests;

use crate::error::{Error, Result};
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use lru::Lru;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};

/// What a grammar is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A JSON Schema (JSON text); the JSON is generated compactly (no optional whitespace).
    JsonSchema,
    /// Any JSON object (the source is ignored).
    JsonObject,
    /// llguidance's Lark dialect (docs/syntax.md of llguidance), `%json` included.
    Lark,
    /// A regular expression the whole output must match.
    Regex,
}

impl Kind {
    pub const NAMES: [&'static str; 4] = ["json_schema", "json_object", "lark", "regex"];

    pub fn parse(name: &str) -> Result<Kind> {
        Ok(match name {
            "json_schema" => Kind::JsonSchema,
            "json_object" => Kind::JsonObject,
            "lark" => Kind::Lark,
            "regex" => Kind::Regex,
            _ => {
                return Err(Error::arg(format!(
                    "grammar kind must be one of {}, got {name:?}",
                    Kind::NAMES.join(", ")
                )))
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::JsonSchema => "json_schema",
            Kind::JsonObject => "json_object",
            Kind::Lark => "lark",
            Kind::Regex => "regex",
        }
    }
}

/// Compiled grammars a vocabulary keeps (least recently used dropped first).
pub const CACHED_GRAMMARS: usize = 32;

/// A model's vocabulary as llguidance sees it, its parser factory and its compiled grammars.
pub struct Vocabulary {
    factory: ParserFactory,
    size: usize,
    eos: u32,
    cache: Mutex<Lru<(Kind, String), Arc<Grammar>>>,
}

/// A compiled grammar: a matcher in its start state, cloned by each generation.
pub struct Grammar {
    kind: Kind,
    start: Matcher,
    /// How long compiling it took (the first compile; a cache hit costs nothing).
    pub compile_time: Duration,
}

impl Grammar {
    pub fn kind(&self) -> Kind {
        self.kind
    }
}

/// The JSON options every schema compiles with unless it sets its own `x-guidance`: compact
/// JSON (no whitespace between items, `,` and `:` alone), and `oneOf` taken as `anyOf`.
fn json_options() -> serde_json::Value {
    serde_json::json!({
        "whitespace_flexible": false,
        "item_separator": ",",
        "key_separator": ":",
        "coerce_one_of": true,
    })
}

fn llg_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::arg(format!("{what}: {}", e.to_string().trim_end()))
}

impl Vocabulary {
    /// A vocabulary of `tokens.len()` ids: `tokens[i]` is the bytes of id i (an added or
    /// special token: 0xFF then its text; an id the tokenizer does not know: empty, never
    /// allowed); `eos` ends a generation and is allowed where the grammar may end.
    pub fn new(tokens: Vec<Vec<u8>>, eos: u32) -> Result<Vocabulary> {
        let size = tokens.len();
        if size == 0 || size > u32::MAX as usize / 2 {
            return Err(Error::arg(format!(
                "a vocabulary needs between 1 and 2^31 tokens, got {size}"
            )));
        }
        if eos as usize >= size {
            return Err(Error::arg(format!(
                "the EOS id {eos} is outside the vocabulary of {size} tokens"
            )));
        }
        if let Some((i, _)) = tokens.iter().enumerate().find(|(_, t)| t.len() > 1 << 16) {
            return Err(Error::arg(format!("token {i} is longer than 65,536 bytes")));
        }
        let tokens = unique(tokens);
        let info = TokRxInfo::new(size as u32, eos);
        // TokTrie::from checks its own invariants with assertions; the input was checked above
        // (sizes, duplicates), so a panic here is a bug: report it, never unwind into Python
        let trie = std::panic::catch_unwind(|| TokTrie::from(&info, &tokens))
            .map_err(|_| Error::arg("internal: the token trie could not be built"))?;
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| llg_err("internal: the grammar engine could not start", e))?;
        factory.quiet();
        Ok(Vocabulary {
            factory,
            size,
            eos,
            cache: Mutex::new(Lru::new(CACHED_GRAMMARS)),
        })
    }

    pub fn size(&self) -> usize {
        self.size
    }

    pub fn eos(&self) -> u32 {
        self.eos
    }

    /// Grammars compiled and kept, and the cache's hits and misses.
    pub fn cache_stats(&self) -> (usize, u64, u64) {
        let c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        (c.len(), c.hits, c.misses)
    }

    /// The grammar `source` of `kind`, compiled (or taken from the cache: the same kind and
    /// source compile once). An error names what is wrong with it (`InvalidArgument`).
    pub fn compile(&self, kind: Kind, source: &str) -> Result<Arc<Grammar>> {
        let key = (kind, source.to_string());
        if let Some(g) = self.lock().get(&key) {
            return Ok(g);
        }
        let g = Arc::new(self.build(kind, source)?);
        self.lock().put(key, g.clone());
        Ok(g)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru<(Kind, String), Arc<Grammar>>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn build(&self, kind: Kind, source: &str) -> Result<Grammar> {
        let t0 = Instant::now();
        let top = match kind {
            Kind::JsonSchema => {
                let schema: serde_json::Value = serde_json::from_str(source)
                    .map_err(|e| llg_err("the JSON schema is not valid JSON", e))?;
                TopLevelGrammar::from_json_schema(schema_with_options(schema)?)
            }
            Kind::JsonObject => TopLevelGrammar::from_json_schema(schema_with_options(
                serde_json::json!({"type": "object"}),
            )?),
            Kind::Lark => TopLevelGrammar::from_lark(source.to_string()),
            Kind::Regex => TopLevelGrammar::from_regex(source),
        };
        let what = match kind {
            Kind::JsonSchema | Kind::JsonObject => "the JSON schema cannot be used",
            Kind::Lark => "the Lark grammar cannot be used",
            Kind::Regex => "the regular expression cannot be used",
        };
        let parser = self
            .factory
            .create_parser(top)
            .map_err(|e| llg_err(what, e))?;
        let start = Matcher::new(Ok(parser));
        // the first mask: a grammar that fails there fails now, as a compile error (and the
        // lexer cache its clones share is warm)
        let mut probe = start.clone();
        let mask = probe.compute_mask().map_err(|e| llg_err(what, e))?;
        if mask.is_zero() {
            return Err(Error::arg(format!("{what}: it allows no output at all")));
        }
        if let Some(e) = start.get_error() {
            return Err(llg_err(what, e));
        }
        Ok(Grammar {
            kind,
            start,
            compile_time: t0.elapsed(),
        })
    }
}

/// `schema` with the JSON options (`json_options`) under `x-guidance`, unless it has its own.
fn schema_with_options(schema: serde_json::Value) -> Result<serde_json::Value> {
    let mut schema = match schema {
        serde_json::Value::Bool(true) => serde_json::json!({}),
        serde_json::Value::Bool(false) => {
            return Err(Error::arg(
                "the JSON schema cannot be used: the schema false allows no value",
            ))
        }
        v @ serde_json::Value::Object(_) => v,
        other => {
            return Err(Error::arg(format!(
                "the JSON schema cannot be used: a schema is a JSON object or a boolean, got {}",
                json_type(&other)
            )))
        }
    };
    if let Some(obj) = schema.as_object_mut() {
        if !obj.contains_key("x-guidance") {
            obj.insert("x-guidance".to_string(), json_options());
        }
    }
    Ok(schema)
}

fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Tokens with the same bytes as an earlier one: the later become unreachable for the
/// grammar (empty), since a trie maps each byte string to one id.
fn unique(mut tokens: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let mut seen = std::collections::HashSet::with_capacity(tokens.len());
    for t in tokens.iter_mut() {
        if !t.is_empty() && !seen.insert(t.clone()) {
            t.clear();
        }
    }
    tokens
}

/// A generation's constraint: a grammar's matcher advanced token by token, optionally
/// waiting for a token (the end of the reasoning) before it applies.
pub struct Constraint {
    grammar: Arc<Grammar>,
    matcher: Matcher,
    size: usize,
    eos: u32,
    /// The grammar applies once this token is sampled (None: from the first token). While
    /// waiting every token is allowed, and a sampled EOS is replaced by it.
    wait: Option<u32>,
    /// Seconds each mask took, in order (for measurements).
    mask_times: Vec<f32>,
}

/// A step's mask: which tokens may be sampled (`None`: every token).
pub type Mask = Option<SimpleVob>;

impl Constraint {
    /// `grammar` from its start, for a model whose vocabulary is `vocab` (the ids the grammar
    /// was compiled for); `wait`: apply it only after this token.
    pub fn new(vocab: &Vocabulary, grammar: Arc<Grammar>, wait: Option<u32>) -> Result<Self> {
        if let Some(w) = wait {
            if w as usize >= vocab.size {
                return Err(Error::arg(format!(
                    "the token {w} a constraint waits for is outside the vocabulary"
                )));
            }
        }
        Ok(Constraint {
            matcher: grammar.start.clone(),
            grammar,
            size: vocab.size,
            eos: vocab.eos,
            wait,
            mask_times: Vec::new(),
        })
    }

    pub fn grammar(&self) -> &Arc<Grammar> {
        &self.grammar
    }

    /// Ids of the vocabulary the constraint was made for (a model whose vocabulary is larger
    /// cannot sample under it).
    pub fn vocab_size(&self) -> usize {
        self.size
    }

    /// Still waiting for its start token.
    pub fn waiting(&self) -> bool {
        self.wait.is_some()
    }

    pub fn mask_times(&self) -> &[f32] {
        &self.mask_times
    }

    /// The tokens allowed next. `None` while waiting. A grammar that allows nothing here (a
    /// dead end for this vocabulary) allows EOS alone, so the answer ends instead of failing.
    pub fn mask(&mut self) -> Result<Mask> {
        if self.wait.is_some() {
            return Ok(None);
        }
        let t0 = Instant::now();
        let mut m = if self.matcher.is_stopped() && !self.matcher.is_error() {
            let mut v = SimpleVob::alloc(self.size);
            v.allow_token(self.eos);
            v
        } else {
            self.matcher
                .compute_mask()
                .map_err(|e| Error::arg(format!("the grammar failed: {e}")))?
        };
        if m.is_zero() {
            m.allow_token(self.eos);
        }
        self.mask_times.push(t0.elapsed().as_secs_f32());
        Ok(Some(m))
    }

    /// The token to keep for a sampled `tok`: while waiting, EOS becomes the start token (a
    /// model that ends its reasoning with EOS still gives the constrained answer).
    pub fn replace(&self, tok: u32) -> u32 {
        match self.wait {
            Some(w) if tok == self.eos => w,
            _ => tok,
        }
    }

    /// Advances past a sampled token (after `replace`).
    pub fn commit(&mut self, tok: u32) -> Result<()> {
        if let Some(w) = self.wait {
            if tok == w {
                self.wait = None;
            }
            return Ok(());
        }
        if self.matcher.is_stopped() {
            return Ok(());
        }
        self.matcher
            .consume_token(tok)
            .map_err(|e| Error::arg(format!("the grammar failed: {e}")))
    }
}
