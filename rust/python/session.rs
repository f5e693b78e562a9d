//! `_core.Session`, `_core.Snapshot` and `_core.Stream`: a generating session of the core
//! (`model::generate::Session`), its snapshots and one generation's tokens, converted for
//! Python. One call at a time per session: a second concurrent call raises "busy" at once
//! instead of waiting.

use super::args::arg;
use super::grammar::PyGrammar;
use super::json::to_python;
use super::{run_cancellable, run_reporting, to_py};
use crate::grammar::Constraint;
use crate::model::generate::{drafter_for, Generation, Session as CoreSession};
use crate::model::sample::SampleParams;
use crate::model::session::Snapshot as CoreSnapshot;
use crate::model::Model;
use crate::schedule::Registration;
use crate::speculate::oracle::Oracle;
use crate::speculate::{Drafter, Mode};
use numpy::PyArray1;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

/// A session of the core (`model::generate::Session`: the state, the pending token, the last
/// logits and the generation rules).
#[pyclass(frozen, name = "Session", module = "v4flash._core")]
pub struct PySession {
    s: Arc<Mutex<CoreSession>>,
    /// The session's model (its vocabulary checks a generation without taking the session).
    model: Arc<Model>,
}

impl PySession {
    pub fn new(s: CoreSession) -> PySession {
        PySession {
            model: s.model().clone(),
            s: Arc::new(Mutex::new(s)),
        }
    }
}

#[pyclass(frozen, name = "Snapshot", module = "v4flash._core")]
struct PySnapshot {
    snap: CoreSnapshot,
}

#[pymethods]
impl PySnapshot {
    #[getter]
    fn position(&self) -> usize {
        self.snap.pos()
    }
}

/// One generation's tokens, one core step per `__next__` (the core feeds, samples with the
/// step's seed and stops), or all of them in one call (`collect`); it shares the session,
/// and each step is one call on it.
#[pyclass(frozen, name = "Stream", module = "v4flash._core")]
struct PyStream {
    s: Arc<Mutex<CoreSession>>,
    g: Arc<Mutex<Generation>>,
    model: Arc<Model>,
    /// Held by a call on the stream (one at a time; the generation itself is handed to the
    /// scheduler's thread while a step runs there).
    call: Mutex<()>,
    /// While the stream is between steps of a model with a scheduler: rounds wait for it.
    reg: Mutex<Option<Registration>>,
}

impl PyStream {
    /// One step: through the model's scheduler when it has one (stepped with the other
    /// sessions' steps), else on this thread.
    fn next_token(&self, py: Python<'_>) -> PyResult<Option<u32>> {
        let Some(sched) = self.model.scheduler() else {
            let mut g = lock(&self.g)?;
            let g: &mut Generation = &mut g;
            if g.finished() {
                return Ok(None);
            }
            let mut guard = lock(&self.s)?;
            let s: &mut CoreSession = &mut guard;
            return run_cancellable(py, |c| s.step(g, &|| c.load(Ordering::Relaxed)));
        };
        if lock(&self.g)?.finished() {
            *lock(&self.reg)? = None;
            return Ok(None);
        }
        {
            let mut reg = lock(&self.reg)?;
            if reg.is_none() {
                *reg = Some(sched.register());
            }
        }
        let r = run_cancellable(py, |c| sched.step(&self.s, &self.g, c, true, &|_| {}));
        if r.is_err() || lock(&self.g)?.finished() {
            *lock(&self.reg)? = None;
        }
        r
    }
}

const BUSY: &str = "this session is busy with another call (one call at a time per session; use separate sessions for concurrency)";

/// A session's (or stream's) lock, refused rather than waited for: one call at a time.
pub(super) fn lock<T>(m: &Mutex<T>) -> PyResult<MutexGuard<'_, T>> {
    m.try_lock().map_err(|_| PyRuntimeError::new_err(BUSY))
}

#[pymethods]
impl PySession {
    /// Number of tokens in the sequence (including a sampled token not yet fed).
    #[getter]
    fn position(&self) -> PyResult<usize> {
        Ok(lock(&self.s)?.position())
    }

    /// Token ids of the whole sequence so far.
    #[getter]
    fn tokens(&self) -> PyResult<Vec<u32>> {
        Ok(lock(&self.s)?.tokens())
    }

    /// Prefills `ids` without sampling. `progress(n)`, if given, is called from this thread
    /// after each layer of the prefill, with n = tokens x layers done so far (of (len(ids) +
    /// a pending token) x layers); an exception it raises stops the prefill there (the
    /// session stays as it was) and propagates.
    #[pyo3(signature = (ids, progress=None))]
    fn feed(
        &self,
        py: Python<'_>,
        ids: Vec<u64>,
        progress: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let ids = self.model.token_ids(&ids).map_err(to_py)?;
        if let Some(sched) = self.model.scheduler().filter(|_| !ids.is_empty()) {
            // a generation of no token: its prompt fed with the other sessions' steps, in
            // parts when it is long (progress after each part)
            let greedy = SampleParams::new(0.0, 1.0, 0, Some(0)).map_err(to_py)?;
            let g = Generation::new(ids, 0, greedy, Vec::new()).map_err(to_py)?;
            let g = Arc::new(Mutex::new(g));
            let layers = self.model.cfg.num_layers as u64;
            return run_reporting(py, progress, |c, report| {
                let on_fed = |n: usize| report(n as u64 * layers);
                sched.step(&self.s, &g, c, false, &on_fed).map(|_| ())
            });
        }
        let mut guard = lock(&self.s)?;
        let s: &mut CoreSession = &mut guard;
        run_reporting(py, progress, |c, report| {
            s.feed_reporting(&ids, &|| c.load(Ordering::Relaxed), report)
        })
    }

    /// A generation that feeds `ids` then samples up to `max_new` tokens, stopping after a
    /// stop id or when the context is full: nothing runs until the first `next()` (or
    /// `collect()`).
    /// `max_new` is an integer >= 1; `ids` and `stop_ids` are checked against the vocabulary.
    /// `logprobs`: also record each token's log-probability and this many alternatives
    /// (`Stream.logprobs()` after each step). `constraint`: a grammar compiled for this
    /// model's vocabulary; only what it allows is sampled (from the first token, or once
    /// `wait_for` is sampled: until then a sampled EOS becomes `wait_for`).
    /// `speculate`: `off`, `lookup`, `dspark` or `auto` (default: the model's `speculate`
    /// load option); the tokens are the same either way. `_oracle` (benchmarks only): a
    /// drafter that knows the continuation `(ids after the prompt, probability of a right
    /// draft, seed)`. `_force_drafts` (tests only): verify this many drafts at every step
    /// (or all there are), whatever the cost model predicts.
    #[pyo3(signature = (ids, max_new, temperature, top_p, top_k, seed, stop_ids, logprobs=None, constraint=None, wait_for=None, speculate=None, _oracle=None, _force_drafts=None))]
    #[allow(clippy::too_many_arguments)]
    fn stream(
        &self,
        ids: Vec<u64>,
        max_new: &Bound<'_, PyAny>,
        temperature: f32,
        top_p: f32,
        top_k: usize,
        seed: u64,
        stop_ids: Vec<u64>,
        logprobs: Option<usize>,
        constraint: Option<&PyGrammar>,
        wait_for: Option<u64>,
        speculate: Option<&str>,
        _oracle: Option<(Vec<u64>, f64, u64)>,
        _force_drafts: Option<usize>,
    ) -> PyResult<PyStream> {
        let max_new = arg(Some(max_new));
        let name = "max_new_tokens";
        let n = max_new.count(name, 1).map_err(to_py)?;
        let n = n.ok_or_else(|| to_py(max_new.refused(name, "an integer")))?;
        let params = SampleParams {
            temperature,
            top_p,
            top_k,
            seed,
        };
        let ids = self.model.token_ids(&ids).map_err(to_py)?;
        let stop_ids = self.model.token_ids(&stop_ids).map_err(to_py)?;
        let mode = match speculate {
            Some(m) => Mode::parse(m).map_err(to_py)?,
            None => self.model.speculate,
        };
        let drafter = match _oracle {
            Some((truth, p, oseed)) => {
                let truth = self.model.token_ids(&truth).map_err(to_py)?;
                let start = lock(&self.s)?.position() + ids.len();
                let vocab = u32::try_from(self.model.cfg.vocab_size).unwrap_or(u32::MAX);
                Some(Drafter::Oracle(Oracle::new(start, truth, p, oseed, vocab)))
            }
            None => drafter_for(&self.model, mode).map_err(to_py)?,
        };
        let mut g = Generation::new(ids, n, params, stop_ids).map_err(to_py)?;
        if let Some(d) = drafter {
            g = g.with_speculation(d);
            if let Some(k) = _force_drafts {
                g = g.forcing_drafts(k);
            }
        }
        if let Some(top) = logprobs {
            g = g.with_logprobs(top);
        }
        if let Some(c) = constraint {
            let n = self.model.cfg.vocab_size;
            if c.vocab.size() != n {
                return Err(PyValueError::new_err(format!(
                    "the constraint was compiled for a vocabulary of {} tokens, this model has {n}",
                    c.vocab.size()
                )));
            }
            let wait = match wait_for {
                Some(w) => Some(self.model.token_ids(&[w]).map_err(to_py)?[0]),
                None => None,
            };
            let c = Constraint::new(&c.vocab, c.grammar.clone(), wait).map_err(to_py)?;
            g = g.with_constraint(c);
        }
        Ok(PyStream {
            s: self.s.clone(),
            g: Arc::new(Mutex::new(g)),
            model: self.model.clone(),
            call: Mutex::new(()),
            reg: Mutex::new(None),
        })
    }

    fn snapshot(&self, py: Python<'_>) -> PyResult<PySnapshot> {
        let mut guard = lock(&self.s)?;
        let s: &mut CoreSession = &mut guard;
        let snap = run_cancellable(py, |c| s.snapshot(&|| c.load(Ordering::Relaxed)))?;
        Ok(PySnapshot { snap })
    }

    fn rollback(&self, snap: &PySnapshot) -> PyResult<()> {
        lock(&self.s)?.rollback(&snap.snap).map_err(to_py)
    }

    /// float32 [vocab] logits after the last fed token (a copy), if at hand.
    fn last_logits<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyArray1<f32>>>> {
        let s = lock(&self.s)?;
        Ok(s.last_logits().map(|v| PyArray1::from_slice(py, v)))
    }

    fn reset(&self) -> PyResult<()> {
        lock(&self.s)?.reset();
        Ok(())
    }

    /// Writes the session (or, with `snapshot`, the state it had there) to `path`
    /// atomically, with `metadata` (JSON text) in its header; returns the file's size.
    #[pyo3(signature = (path, snapshot=None, metadata=None))]
    fn save(
        &self,
        py: Python<'_>,
        path: PathBuf,
        snapshot: Option<&PySnapshot>,
        metadata: Option<&str>,
    ) -> PyResult<u64> {
        let meta =
            match metadata {
                None => None,
                Some(t) => Some(serde_json::from_str::<serde_json::Value>(t).map_err(|e| {
                    PyValueError::new_err(format!("metadata must be JSON text: {e}"))
                })?),
            };
        let mut guard = lock(&self.s)?;
        let s: &mut CoreSession = &mut guard;
        let at = snapshot.map(|p| &p.snap);
        run_cancellable(py, |c| {
            s.save(&path, at, meta.as_ref(), &|| c.load(Ordering::Relaxed))
        })
    }
}

/// (log-probability of the sampled token, [(id, log-probability)] of the most likely)
type Logprobs = (f32, Vec<(u32, f32)>);

#[pymethods]
impl PyStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<u32>> {
        let _call = lock(&self.call)?;
        self.next_token(py)
    }

    /// Ends the stream's part in the scheduler's rounds (they no longer wait for it); the
    /// generation stays where it is. Done by itself when the stream ends or is dropped.
    fn close(&self) -> PyResult<()> {
        let _call = lock(&self.call)?;
        *lock(&self.reg)? = None;
        Ok(())
    }

    /// What speculation did in this generation (None when it is off): verifies, drafted and
    /// accepted tokens, plain steps, seconds saved, and the running acceptance estimate.
    fn speculation<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let g = lock(&self.g)?;
        let Some(sp) = g.speculation() else {
            return Ok(None);
        };
        #[derive(serde::Serialize)]
        struct Report {
            #[serde(flatten)]
            stats: crate::speculate::SpecStats,
            acceptance: f64,
        }
        let r = Report {
            stats: sp.stats(),
            acceptance: sp.acceptance(),
        };
        to_python(py, &r).map(Some)
    }

    /// (log-probability, [(id, log-probability)] of the most likely) of the token the last
    /// step sampled, when the stream was asked for them (else None).
    fn logprobs(&self) -> PyResult<Option<Logprobs>> {
        let g = lock(&self.g)?;
        Ok(g.last_logprobs().map(|l| (l.logprob, l.top.clone())))
    }

    /// Seconds each constrained step's token mask took to compute, in order (empty without a
    /// constraint; steps waiting for the constraint's start compute none).
    fn mask_times(&self) -> PyResult<Vec<f32>> {
        let g = lock(&self.g)?;
        Ok(g.constraint()
            .map(|c| c.mask_times().to_vec())
            .unwrap_or_default())
    }

    /// The generation's remaining tokens, in one call (the same steps as iterating). On
    /// Ctrl-C the KeyboardInterrupt propagates; the tokens produced so far stay in the
    /// session (its state is consistent after every token).
    fn collect(&self, py: Python<'_>) -> PyResult<Vec<u32>> {
        let _call = lock(&self.call)?;
        if self.model.scheduler().is_some() {
            let mut out = Vec::new();
            while let Some(t) = self.next_token(py)? {
                out.push(t);
            }
            return Ok(out);
        }
        let mut g = lock(&self.g)?;
        let g: &mut Generation = &mut g;
        let mut guard = lock(&self.s)?;
        let s: &mut CoreSession = &mut guard;
        run_cancellable(py, |c| s.generate(g, &|| c.load(Ordering::Relaxed)))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySession>()?;
    m.add_class::<PySnapshot>()?;
    m.add_class::<PyStream>()?;
    Ok(())
}
