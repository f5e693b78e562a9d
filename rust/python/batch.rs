//! `_core.step_batch` and `_core.BatchSession`: several sequences of one model fed in one
//! batched forward pass (`model::generate::Session::feed_batch`, `Model::forward_batch`),
//! converted for Python. Converting only: the core checks the ids, the context, the model.
//!
//! A `BatchSession` is a core session (`model::generate::Session`) that `step_batch` steps
//! with others; one call at a time per session, as for `Session` (a second concurrent call
//! raises "busy").

use super::model::PyModel;
use super::session::lock;
use super::{run_cancellable, to_py};
use crate::error::Error;
use crate::model::generate::{BatchFeed, Session as CoreSession};
use crate::model::{Model, Want};
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray1};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// A sequence that `step_batch` feeds together with others: its state, and the logits after
/// its last token.
#[pyclass(frozen, name = "BatchSession", module = "v4flash._core")]
pub struct PyBatchSession {
    s: Arc<Mutex<CoreSession>>,
    /// The session's model (its vocabulary checks the ids without taking the session).
    model: Arc<Model>,
}

#[pymethods]
impl PyBatchSession {
    /// An empty sequence of `model`.
    #[new]
    fn new(model: &PyModel) -> PyBatchSession {
        let model = model.core().clone();
        PyBatchSession {
            s: Arc::new(Mutex::new(CoreSession::new(model.clone()))),
            model,
        }
    }

    /// Number of tokens in the sequence.
    #[getter]
    fn position(&self) -> PyResult<usize> {
        Ok(lock(&self.s)?.position())
    }

    /// Token ids of the sequence so far.
    #[getter]
    fn tokens(&self) -> PyResult<Vec<u32>> {
        Ok(lock(&self.s)?.tokens())
    }

    /// float32 [vocab] logits after the last token fed (a copy), None before any.
    fn last_logits<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyArray1<f32>>>> {
        let s = lock(&self.s)?;
        Ok(s.last_logits().map(|v| PyArray1::from_slice(py, v)))
    }

    /// Empties the sequence.
    fn reset(&self) -> PyResult<()> {
        lock(&self.s)?.reset();
        Ok(())
    }
}

/// What a caller wants back for an item: "none", "last" or "all".
fn want(w: &str) -> PyResult<Want> {
    match w {
        "none" => Ok(Want::None),
        "last" => Ok(Want::Last),
        "all" => Ok(Want::All),
        _ => Err(PyValueError::new_err(format!(
            "want must be \"none\", \"last\" or \"all\", got {w:?}"
        ))),
    }
}

/// One item of `step_batch`: a session, the ids to feed, what to return.
type Item<'py> = (Bound<'py, PyBatchSession>, Vec<u64>, String);

/// Feeds each item's ids to its session, all in one forward pass: every dense product once
/// over all the items' tokens, each routed expert read once per layer, each sequence's
/// attention over its own state. Each session ends, and each result is, bit for bit what
/// feeding that session alone gives. Returns per item: "none" → None, "last" → float32
/// [vocab] (None if it fed nothing), "all" → float32 [len(ids), vocab]. A session may appear
/// once; all must be of one model. On any error (an id out of the vocabulary, a context
/// exceeded, Ctrl-C) no session changes.
#[pyfunction]
fn step_batch<'py>(py: Python<'py>, items: Vec<Item<'py>>) -> PyResult<Vec<Option<Py<PyAny>>>> {
    let mut wants = Vec::with_capacity(items.len());
    let mut ids = Vec::with_capacity(items.len());
    for (i, (s, v, w)) in items.iter().enumerate() {
        if let Some(j) = items[..i]
            .iter()
            .position(|(t, _, _)| Arc::ptr_eq(&t.get().s, &s.get().s))
        {
            return Err(PyValueError::new_err(format!(
                "the same session is item {j} and item {i} of the batch (a session may appear once)"
            )));
        }
        wants.push(want(w)?);
        let model = &s.get().model;
        ids.push(model.token_ids(v).map_err(|e| {
            to_py(match e {
                Error::InvalidArgument(m) => Error::InvalidArgument(format!("item {i}: {m}")),
                e => e,
            })
        })?);
    }
    let mut guards = Vec::with_capacity(items.len());
    for (s, _, _) in &items {
        guards.push(lock(&s.get().s)?);
    }
    let mut feeds: Vec<BatchFeed> = guards
        .iter_mut()
        .zip(&ids)
        .zip(&wants)
        .map(|((g, ids), &want)| BatchFeed {
            session: g,
            ids,
            want,
        })
        .collect();
    let outs = run_cancellable(py, |c| {
        CoreSession::feed_batch(&mut feeds, &|| c.load(Ordering::Relaxed))
    })?;
    drop(feeds);
    drop(guards);
    let vocab = items
        .first()
        .map_or(1, |(s, _, _)| s.get().model.cfg.vocab_size);
    let mut res = Vec::with_capacity(outs.len());
    for (out, w) in outs.into_iter().zip(wants) {
        res.push(match w {
            Want::None => None,
            Want::Last if out.is_empty() => None,
            Want::Last => Some(out.into_pyarray(py).into_any().unbind()),
            Want::All => {
                let a = Array2::from_shape_vec((out.len() / vocab, vocab), out)
                    .map_err(|e| PyRuntimeError::new_err(format!("internal: array shape: {e}")))?;
                Some(a.into_pyarray(py).into_any().unbind())
            }
        });
    }
    Ok(res)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyBatchSession>()?;
    add_functions!(m, step_batch);
    Ok(())
}
