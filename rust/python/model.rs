//! `_core.Model`: a loaded model, converted for Python (the core's `model::Model`).

use super::args::load_options;
use super::json::to_python;
use super::session::PySession;
use super::{run_cancellable, to_py};
use crate::model::generate::Session as CoreSession;
use crate::model::session::model_identity;
use crate::model::{Model as CoreModel, Want};
use crate::report::{PlanReport, Stats};
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray2, PyReadonlyArray2};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// `_layer_probe`'s result: output streams, and the indexer's picks of a CSA layer.
type ProbeOut<'py> = (Bound<'py, PyArray2<f32>>, Option<Vec<Vec<usize>>>);

#[pyclass(frozen, name = "Model", module = "v4flash._core")]
pub struct PyModel {
    inner: Arc<CoreModel>,
}

/// `v` as a float32 array [rows, width] (the array owns the buffer: no copy).
fn array(
    py: Python<'_>,
    v: Vec<f32>,
    rows: usize,
    width: usize,
) -> PyResult<Bound<'_, PyArray2<f32>>> {
    let a = Array2::from_shape_vec((rows, width), v)
        .map_err(|e| PyRuntimeError::new_err(format!("internal: array shape: {e}")))?;
    Ok(a.into_pyarray(py))
}

/// A float32 array as a C-contiguous slice, copied.
fn floats(x: &PyReadonlyArray2<'_, f32>, what: &str) -> PyResult<Vec<f32>> {
    match x.as_slice() {
        Ok(s) => Ok(s.to_vec()),
        Err(_) => Err(PyValueError::new_err(format!(
            "x must be a C-contiguous float32 array{what}"
        ))),
    }
}

impl PyModel {
    /// The core's model (for the other classes of the binding).
    pub(super) fn core(&self) -> &Arc<CoreModel> {
        &self.inner
    }
}

#[pymethods]
impl PyModel {
    /// Loads the checkpoint at `path` with `options`, checked and converted by the core
    /// (`LoadOptions::set`: `ram_gb`, `threads`, `expert_cache_mb`, `ctx`, `io`,
    /// `cache_policy`, `io_threads`, `numerics`, `lookahead`, `prefault`, `io_uring`).
    #[staticmethod]
    #[pyo3(signature = (path, **options))]
    fn load(
        py: Python<'_>,
        path: PathBuf,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyModel> {
        let opts = load_options(options)?;
        let m = run_cancellable(py, |c| {
            CoreModel::load_cancellable(&path, &opts, &|| c.load(Ordering::Relaxed))
        })?;
        Ok(PyModel { inner: Arc::new(m) })
    }

    /// The memory plan the model was loaded with, and its switches (`report::PlanReport`).
    fn plan<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &PlanReport::new(&self.inner.plan, &self.inner.tuning))
    }

    /// Counters, the expert cache's figures and what the model runs with (`report::Stats`).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &Stats::of(&self.inner))
    }

    #[getter]
    fn io_mode(&self) -> &'static str {
        self.inner.experts.mode_name()
    }

    /// The numerics mode (one of `NUMERICS`).
    #[getter]
    fn numerics(&self) -> &'static str {
        self.inner.numerics.name()
    }

    #[getter]
    fn policy(&self) -> &'static str {
        self.inner.experts.policy.name()
    }

    #[getter]
    fn ctx(&self) -> usize {
        self.inner.ctx
    }

    #[getter]
    fn threads(&self) -> usize {
        self.inner.threads
    }

    /// Bytes of one routed expert as the store reads it.
    #[getter]
    fn expert_bytes(&self) -> usize {
        self.inner.experts.expert_bytes
    }

    /// Teacher-forced logits for every position, from a fresh state: float32 [len(ids), vocab].
    fn logits<'py>(&self, py: Python<'py>, ids: Vec<u64>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let ids = self.inner.token_ids(&ids).map_err(to_py)?;
        let m = self.inner.clone();
        let v = run_cancellable(py, |c| {
            let mut st = m.new_state();
            m.forward(&mut st, &ids, Want::All, &|| c.load(Ordering::Relaxed))
        })?;
        array(py, v, ids.len(), self.inner.cfg.vocab_size)
    }

    /// A private hook for tests and measurements, not part of the API: layer `layer` alone
    /// over `ids` from position 0 (`model::layer_probe`), on input streams x float32
    /// [len(ids), hc·H] (None: the embedded ids). Returns the output streams [len(ids), hc·H]
    /// and, for a CSA layer, each token's indexer selection (else None). Used by
    /// tests/test_official.py (each layer against the torch reference) and
    /// benches/official.py (the indexer's picks per numerics mode).
    #[pyo3(signature = (layer, ids, x=None))]
    fn _layer_probe<'py>(
        &self,
        py: Python<'py>,
        layer: usize,
        ids: Vec<u32>,
        x: Option<PyReadonlyArray2<'py, f32>>,
    ) -> PyResult<ProbeOut<'py>> {
        let xin = match &x {
            Some(a) => Some(floats(a, " [len(ids), hc*H]")?),
            None => None,
        };
        let m = self.inner.clone();
        let p = run_cancellable(py, |c| {
            m.layer_probe(layer, &ids, xin.as_deref(), &|| c.load(Ordering::Relaxed))
        })?;
        let width = self.inner.cfg.hc_mult * self.inner.cfg.hidden_size;
        Ok((array(py, p.out, ids.len(), width)?, p.selections))
    }

    /// A private hook for tests and measurements, not part of the API: the logits float32
    /// [len(rows), vocab] of final streams x [n, hc·H] (from `_layer_probe` of the last layer)
    /// at the given rows. Used with `_layer_probe` by tests/test_official.py and
    /// benches/official.py.
    fn _probe_logits<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArray2<'py, f32>,
        rows: Vec<usize>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let xv = floats(&x, "")?;
        let m = self.inner.clone();
        let v = run_cancellable(py, |_| m.probe_logits(&xv, &rows))?;
        array(py, v, rows.len(), self.inner.cfg.vocab_size)
    }

    /// Reads (without computing) the given experts of a layer into the cache and returns the
    /// wall seconds (`Model::read_experts`): the store's cold-read throughput.
    fn read_experts(&self, py: Python<'_>, layer: usize, experts: Vec<usize>) -> PyResult<f64> {
        let m = self.inner.clone();
        run_cancellable(py, |_| m.read_experts(layer, &experts))
    }

    fn session(&self) -> PySession {
        PySession::new(CoreSession::new(self.inner.clone()))
    }

    /// A session read from a file `Session.save` wrote, and the metadata saved with it (JSON
    /// text, or None). Refuses (ValueError naming the file and what differs) a file of
    /// another model, config or numerics mode, and a truncated or corrupted one.
    /// What a session file records of this model, as JSON text (`model_identity`): the
    /// prompt cache on disk keys its files by it, so another model's files are never read.
    fn identity(&self, py: Python<'_>) -> String {
        let m = self.inner.clone();
        py.detach(|| serde_json::Value::Object(model_identity(&m)).to_string())
    }

    fn load_session(&self, py: Python<'_>, path: PathBuf) -> PyResult<(PySession, Option<String>)> {
        let m = self.inner.clone();
        let (s, meta) = run_cancellable(py, |c| {
            CoreSession::load(m, &path, &|| c.load(Ordering::Relaxed))
        })?;
        Ok((PySession::new(s), meta.map(|v| v.to_string())))
    }
}
