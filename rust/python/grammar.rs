//! `_core.Vocabulary` and `_core.Grammar`: a model's vocabulary as the grammar engine sees it
//! (`grammar::Vocabulary`, made once per model from the tokenizer's token bytes) and the
//! grammars compiled for it, which `Session.stream(constraint=...)` samples under.

use super::run_cancellable;
use crate::error::Error;
use crate::grammar::{Constraint, Grammar, Kind, Vocabulary};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::Arc;

/// A vocabulary: `tokens[i]` the bytes of token i (an added or special token: b"\xff" then
/// its text; unknown ids: b""), `eos_id` the token that ends an answer. Holds the parser
/// factory and the compiled grammars (an LRU keyed by kind and source).
#[pyclass(frozen, name = "Vocabulary", module = "v4flash._core")]
pub struct PyVocabulary {
    pub inner: Arc<Vocabulary>,
}

/// A compiled grammar of a vocabulary.
#[pyclass(frozen, name = "Grammar", module = "v4flash._core")]
pub struct PyGrammar {
    pub vocab: Arc<Vocabulary>,
    pub grammar: Arc<Grammar>,
}

#[pymethods]
impl PyVocabulary {
    #[new]
    fn new(py: Python<'_>, tokens: Vec<Bound<'_, PyBytes>>, eos_id: u32) -> PyResult<Self> {
        let words: Vec<Vec<u8>> = tokens.iter().map(|b| b.as_bytes().to_vec()).collect();
        let v = run_cancellable(py, |_| Vocabulary::new(words, eos_id))?;
        Ok(PyVocabulary { inner: Arc::new(v) })
    }

    #[getter]
    fn size(&self) -> usize {
        self.inner.size()
    }

    #[getter]
    fn eos_id(&self) -> u32 {
        self.inner.eos()
    }

    /// `source` of `kind` ("json_schema": the schema as JSON text; "json_object": any
    /// object, the source ignored; "lark"; "regex"), compiled once per kind and source.
    /// ValueError naming what is wrong with it.
    fn compile(&self, py: Python<'_>, kind: &str, source: &str) -> PyResult<PyGrammar> {
        let kind = Kind::parse(kind).map_err(super::to_py)?;
        let v = self.inner.clone();
        let source = source.to_string();
        let grammar = run_cancellable(py, |_| v.compile(kind, &source))?;
        Ok(PyGrammar {
            vocab: self.inner.clone(),
            grammar,
        })
    }

    /// A private hook for measurements (benches/structured.py), not part of the API: walks
    /// `tokens` under `grammar` from its start, computing the mask before each token, then
    /// advancing past it; the seconds each mask took. ValueError at a token it does not allow.
    fn _mask_times(
        &self,
        py: Python<'_>,
        grammar: &PyGrammar,
        tokens: Vec<u32>,
    ) -> PyResult<Vec<f32>> {
        let v = self.inner.clone();
        let g = grammar.grammar.clone();
        run_cancellable(py, |_| {
            let mut c = Constraint::new(&v, g, None)?;
            for (i, &t) in tokens.iter().enumerate() {
                let allowed = c
                    .mask()?
                    .is_none_or(|m| (t as usize) < m.len() && m.is_allowed(t));
                if !allowed {
                    return Err(Error::arg(format!("token {i} ({t}) is not allowed there")));
                }
                c.commit(t)?;
            }
            Ok(c.mask_times().to_vec())
        })
    }

    /// (grammars kept, cache hits, cache misses)
    fn cache_stats(&self) -> (usize, u64, u64) {
        self.inner.cache_stats()
    }
}

#[pymethods]
impl PyGrammar {
    #[getter]
    fn kind(&self) -> &'static str {
        self.grammar.kind().name()
    }

    /// Seconds its compilation took (once: later uses take it from the cache).
    #[getter]
    fn compile_seconds(&self) -> f64 {
        self.grammar.compile_time.as_secs_f64()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyVocabulary>()?;
    m.add_class::<PyGrammar>()?;
    Ok(())
}
