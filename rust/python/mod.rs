//! The `v4flash._core` extension module: converts arguments into owned Rust values, runs the
//! work with the GIL released (on a worker thread, while the calling thread watches for
//! Ctrl-C), and maps `Error` to Python exceptions in one place.

use crate::error::Error;
use crate::kernels::Numerics;
use crate::model::generate::{Generation, Session as CoreSession};
use crate::model::sample::SampleParams;
use crate::model::session::Snapshot as CoreSnapshot;
use crate::model::{LoadOptions, Model as CoreModel, Want};
use crate::plan::Plan;
use crate::store::io::IoMode;
use crate::store::policy::Policy;
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray2};
use pyo3::create_exception;
use pyo3::exceptions::{
    PyException, PyFileNotFoundError, PyKeyboardInterrupt, PyMemoryError, PyOSError,
    PyPermissionError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

mod args;
mod checkpoint;

create_exception!(
    _core,
    V4FlashError,
    PyException,
    "A checkpoint or config that v4flash cannot use."
);

pub fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::NotFound { .. } => PyFileNotFoundError::new_err(msg),
        Error::Io { ref source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => {
            PyPermissionError::new_err(msg)
        }
        Error::Io { .. } | Error::Read(_) | Error::System(_) => PyOSError::new_err(msg),
        Error::Checkpoint { .. } | Error::Config(_) => V4FlashError::new_err(msg),
        Error::InvalidArgument(_) => PyValueError::new_err(msg),
        Error::Memory(_) => PyMemoryError::new_err(msg),
        Error::Cancelled => PyKeyboardInterrupt::new_err("generation cancelled"),
    }
}

/// Runs `f` on a worker thread with the GIL released; the calling thread waits for it to
/// finish and, every 20 ms while it waits, polls for signals (Ctrl-C): when one arrives it
/// raises the cancel flag that `f` checks between steps. A finished worker is noticed at
/// once (it drops its end of a channel), so a short call (one streamed token) costs no poll
/// interval.
fn run_cancellable<T: Send>(
    py: Python<'_>,
    f: impl FnOnce(&AtomicBool) -> crate::Result<T> + Send,
) -> PyResult<T> {
    let cancel = AtomicBool::new(false);
    let (result, interrupted) = std::thread::scope(|s| {
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let cancel = &cancel;
        let h = s.spawn(move || {
            // dropped when `f` returns or unwinds: the waiter wakes with `Disconnected`
            let _done = done_tx;
            f(cancel)
        });
        let interrupted = py.detach(move || {
            let mut interrupted: Option<PyErr> = None;
            while let Err(RecvTimeoutError::Timeout) =
                done_rx.recv_timeout(Duration::from_millis(20))
            {
                if interrupted.is_none() {
                    if let Err(e) = Python::attach(|py| py.check_signals()) {
                        interrupted = Some(e);
                        cancel.store(true, Ordering::SeqCst);
                    }
                }
            }
            interrupted
        });
        (h.join(), interrupted)
    });
    finish(py, result, interrupted)
}

/// `run_cancellable` for work that reports progress: `f` gets a `report(count)` it calls at
/// its own steps. Each report is handed to this (the calling) thread, which calls
/// `progress(count)` with the GIL while the worker waits for it, so the callback sees every
/// step in order and an exception it raises stops the work at that step (as Ctrl-C does:
/// the cancel flag is set before the worker goes on) and is raised instead of the result.
fn run_reporting<T: Send>(
    py: Python<'_>,
    progress: Option<&Bound<'_, PyAny>>,
    f: impl FnOnce(&AtomicBool, &(dyn Fn(u64) + Sync)) -> crate::Result<T> + Send,
) -> PyResult<T> {
    let Some(cb) = progress else {
        return run_cancellable(py, |c| f(c, &|_| {}));
    };
    let cb: Py<PyAny> = cb.clone().unbind();
    let cancel = AtomicBool::new(false);
    let (result, stopped) = std::thread::scope(|s| {
        // worker -> caller: Some(count) per report, and the channel closes when `f` ends;
        // caller -> worker: one reply per report (the worker waits for it)
        let (ev_tx, ev_rx) = mpsc::channel::<u64>();
        let (ack_tx, ack_rx) = mpsc::channel::<()>();
        let cancel = &cancel;
        let h = s.spawn(move || {
            let ev_tx = Mutex::new(ev_tx);
            let ack_rx = Mutex::new(ack_rx);
            let report = |n: u64| {
                let sent = ev_tx.lock().map(|t| t.send(n).is_ok()).unwrap_or(false);
                if sent {
                    // the caller answers every report; a closed channel means it is gone
                    let _ = ack_rx.lock().map(|r| r.recv());
                }
            };
            f(cancel, &report)
        });
        let stopped = py.detach(move || {
            let mut stopped: Option<PyErr> = None;
            loop {
                match ev_rx.recv_timeout(Duration::from_millis(20)) {
                    Ok(n) => {
                        if stopped.is_none() {
                            if let Err(e) = Python::attach(|py| cb.call1(py, (n,)).map(drop)) {
                                stopped = Some(e);
                                cancel.store(true, Ordering::SeqCst);
                            }
                        }
                        let _ = ack_tx.send(());
                    }
                    Err(RecvTimeoutError::Timeout) => {
                        if stopped.is_none() {
                            if let Err(e) = Python::attach(|py| py.check_signals()) {
                                stopped = Some(e);
                                cancel.store(true, Ordering::SeqCst);
                            }
                        }
                    }
                    Err(RecvTimeoutError::Disconnected) => return stopped,
                }
            }
        });
        (h.join(), stopped)
    });
    finish(py, result, stopped)
}

/// The Python result of worker `result` when the waiting thread saw `stopped` (a signal
/// handler's exception, Ctrl-C's KeyboardInterrupt, or a progress callback's exception).
fn finish<T>(
    py: Python<'_>,
    result: std::thread::Result<crate::Result<T>>,
    stopped: Option<PyErr>,
) -> PyResult<T> {
    match result {
        Ok(Ok(v)) => match stopped {
            // The work finished before it saw the flag, but check_signals consumed the
            // SIGINT: hand it back to Python so the KeyboardInterrupt is not lost.
            Some(e) if e.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py) => {
                // SAFETY: called with the GIL held (we are attached here), as the C API needs.
                unsafe { pyo3::ffi::PyErr_SetInterrupt() };
                Ok(v)
            }
            // another exception (a signal handler's or a callback's) is raised, not lost
            Some(e) => Err(e),
            None => Ok(v),
        },
        Ok(Err(Error::Cancelled)) => Err(stopped.unwrap_or_else(|| to_py(Error::Cancelled))),
        Ok(Err(e)) => Err(to_py(e)),
        Err(_) => Err(PyRuntimeError::new_err(
            "internal error: the v4flash worker thread panicked",
        )),
    }
}

#[allow(clippy::too_many_arguments)]
fn load_options(
    threads: Option<usize>,
    expert_cache_bytes: Option<u64>,
    ctx: Option<usize>,
    ram_bytes: Option<u64>,
    io: &str,
    policy: &str,
    io_threads: usize,
    numerics: &str,
) -> PyResult<LoadOptions> {
    let numerics = Numerics::from_name(numerics).ok_or_else(|| {
        PyValueError::new_err(format!(
            "numerics must be {}, got {numerics:?}",
            Numerics::names()
        ))
    })?;
    let io = IoMode::parse(io).ok_or_else(|| {
        PyValueError::new_err(format!("io must be direct, buffered or mmap, got {io:?}"))
    })?;
    let policy = Policy::parse(policy).ok_or_else(|| {
        PyValueError::new_err(format!("policy must be freq-decay or lru, got {policy:?}"))
    })?;
    if io_threads == 0 {
        return Err(PyValueError::new_err("io_threads must be at least 1"));
    }
    Ok(LoadOptions {
        threads,
        ram_bytes,
        io,
        policy,
        io_threads,
        expert_cache_bytes,
        ctx,
        numerics,
        tuning: crate::tuning::Tuning::from_env(),
    })
}

fn plan_dict<'py>(py: Python<'py>, p: &Plan) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("budget_bytes", p.budget)?;
    d.set_item("available_bytes", p.available)?;
    d.set_item("dense_bytes", p.dense_bytes)?;
    d.set_item("drafter_bytes", p.drafter_bytes)?;
    d.set_item("embed_head_bytes", p.embed_head_bytes)?;
    d.set_item("state_bytes", p.state_bytes)?;
    d.set_item("scratch_bytes", p.scratch_bytes)?;
    d.set_item("prefill_chunk", p.prefill_chunk)?;
    d.set_item("prefill_span", p.prefill_span)?;
    d.set_item("span_bytes", p.span_bytes)?;
    d.set_item("overhead_bytes", p.overhead_bytes)?;
    d.set_item("slot_bytes", p.slot_bytes)?;
    d.set_item("slots", p.slots)?;
    d.set_item("cache_bytes", p.cache_bytes())?;
    d.set_item("total_bytes", p.total_bytes())?;
    d.set_item("total_experts", p.total_experts)?;
    d.set_item("ctx", p.ctx)?;
    Ok(d)
}

/// The memory plan for a checkpoint without loading it (config + tensor table only).
#[pyfunction]
#[pyo3(signature = (path, ram_bytes=None, ctx=None, expert_cache_bytes=None))]
fn plan<'py>(
    py: Python<'py>,
    path: PathBuf,
    ram_bytes: Option<u64>,
    ctx: Option<usize>,
    expert_cache_bytes: Option<u64>,
) -> PyResult<Bound<'py, PyDict>> {
    let p = py
        .detach(|| -> crate::Result<Plan> {
            let cfg = crate::config::ModelConfig::from_file(&path.join("config.json"))?;
            let ck = crate::checkpoint::Checkpoint::open(&path)?;
            let ctx = crate::plan::resolve_ctx(&cfg, ctx)?;
            let slot = crate::store::slot_size(&ck, &cfg)?;
            crate::plan::plan(&ck, &cfg, ctx, ram_bytes, expert_cache_bytes, slot as u64)
        })
        .map_err(to_py)?;
    plan_dict(py, &p)
}

/// Streaming memory-read bandwidth in GB/s (best of `reps`).
#[pyfunction]
#[pyo3(signature = (nbytes=1 << 30, threads=None, reps=3))]
fn mem_read_gbs(
    py: Python<'_>,
    nbytes: usize,
    threads: Option<usize>,
    reps: usize,
) -> PyResult<f64> {
    let t = threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    py.detach(|| crate::probe::mem_read_gbs(nbytes, t, reps))
        .map_err(to_py)
}

/// Read bandwidth of a file in GB/s with direct I/O, in 8 MiB reads with `readers` of them
/// in flight: (GB/s, direct_used).
#[pyfunction]
#[pyo3(signature = (path, nbytes=1 << 30, readers=1))]
fn disk_read_gbs(
    py: Python<'_>,
    path: PathBuf,
    nbytes: usize,
    readers: usize,
) -> PyResult<(f64, bool)> {
    py.detach(|| crate::probe::disk_read_gbs(&path, nbytes, readers))
        .map_err(to_py)
}

/// Register-only FMA throughput in GFLOP/s.
#[pyfunction]
#[pyo3(signature = (threads=None))]
fn fma_peak_gflops(py: Python<'_>, threads: Option<usize>) -> PyResult<f64> {
    let t = threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    py.detach(|| crate::probe::fma_peak_gflops(t))
        .map_err(to_py)
}

#[pyfunction]
fn kernel_tier() -> &'static str {
    crate::kernels::tier_name()
}

/// Whether fast and official numerics multiply FP8/FP4 matrices with `vdpbf16ps` (AVX-512
/// tier on a CPU with full-rate avx512_bf16; `V4FLASH_BF16=off` / `on` overrides).
#[pyfunction]
fn bf16_products() -> bool {
    crate::kernels::bf16_products()
}

/// How fast numerics multiplies FP8/FP4 matrices here: "bf16", "int8" (FP4 experts) or
/// "f32" (the exact kernels: nothing faster on this CPU).
#[pyfunction]
fn fast_products() -> &'static str {
    crate::kernels::fast_products().name()
}

/// `_layer_probe`'s result: output streams, and the indexer's picks of a CSA layer.
type ProbeOut<'py> = (Bound<'py, PyArray2<f32>>, Option<Vec<Vec<usize>>>);

#[pyclass(frozen, name = "Model", module = "v4flash._core")]
struct PyModel {
    inner: Arc<CoreModel>,
}

#[pymethods]
impl PyModel {
    #[staticmethod]
    #[pyo3(signature = (path, threads=None, expert_cache_bytes=None, ctx=None, ram_bytes=None, io="direct", policy="freq-decay", io_threads=8, numerics="exact"))]
    #[allow(clippy::too_many_arguments)]
    fn load(
        py: Python<'_>,
        path: PathBuf,
        threads: Option<usize>,
        expert_cache_bytes: Option<u64>,
        ctx: Option<usize>,
        ram_bytes: Option<u64>,
        io: &str,
        policy: &str,
        io_threads: usize,
        numerics: &str,
    ) -> PyResult<PyModel> {
        let opts = load_options(
            threads,
            expert_cache_bytes,
            ctx,
            ram_bytes,
            io,
            policy,
            io_threads,
            numerics,
        )?;
        let m = run_cancellable(py, |c| {
            CoreModel::load_cancellable(&path, &opts, &|| c.load(Ordering::Relaxed))
        })?;
        Ok(PyModel { inner: Arc::new(m) })
    }

    /// The memory plan the model was loaded with.
    fn plan<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        plan_dict(py, &self.inner.plan)
    }

    #[getter]
    fn io_mode(&self) -> &'static str {
        if self.inner.experts.mode == IoMode::Direct && !self.inner.experts.direct_io() {
            "buffered (direct I/O refused)"
        } else {
            self.inner.experts.mode.name()
        }
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

    /// Teacher-forced logits for every position, from a fresh state: float32 [len(ids), vocab]
    /// (the array owns the core's buffer: no copy).
    fn logits<'py>(&self, py: Python<'py>, ids: Vec<u32>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let m = self.inner.clone();
        let v = run_cancellable(py, |c| {
            let mut st = m.new_state();
            m.forward(&mut st, &ids, Want::All, &|| c.load(Ordering::Relaxed))
        })?;
        let a = Array2::from_shape_vec((ids.len(), self.inner.cfg.vocab_size), v)
            .map_err(|e| PyRuntimeError::new_err(format!("internal: logits shape: {e}")))?;
        Ok(a.into_pyarray(py))
    }

    /// Test and measurement hook (`model::layer_probe`): layer `layer` alone over `ids` from
    /// position 0, on input streams x float32 [len(ids), hc·H] (None: the embedded ids).
    /// Returns the output streams [len(ids), hc·H] and, for a CSA layer, each token's
    /// indexer selection (else None).
    #[pyo3(signature = (layer, ids, x=None))]
    fn _layer_probe<'py>(
        &self,
        py: Python<'py>,
        layer: usize,
        ids: Vec<u32>,
        x: Option<PyReadonlyArray2<'py, f32>>,
    ) -> PyResult<ProbeOut<'py>> {
        let xin: Option<Vec<f32>> = match &x {
            Some(a) => Some(
                a.as_slice()
                    .map_err(|_| {
                        PyValueError::new_err(
                            "x must be a C-contiguous float32 array [len(ids), hc*H]",
                        )
                    })?
                    .to_vec(),
            ),
            None => None,
        };
        let m = self.inner.clone();
        let p = run_cancellable(py, |c| {
            m.layer_probe(layer, &ids, xin.as_deref(), &|| c.load(Ordering::Relaxed))
        })?;
        let w = self.inner.cfg.hc_mult * self.inner.cfg.hidden_size;
        let a = Array2::from_shape_vec((ids.len(), w), p.out)
            .map_err(|e| PyRuntimeError::new_err(format!("internal: probe shape: {e}")))?;
        Ok((a.into_pyarray(py), p.selections))
    }

    /// The logits float32 [len(rows), vocab] of final streams x [n, hc·H] (from
    /// `_layer_probe` of the last layer) at the given rows.
    fn _probe_logits<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArray2<'py, f32>,
        rows: Vec<usize>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let xv = x
            .as_slice()
            .map_err(|_| PyValueError::new_err("x must be a C-contiguous float32 array"))?
            .to_vec();
        let m = self.inner.clone();
        let n = rows.len();
        let v = run_cancellable(py, |_| m.probe_logits(&xv, &rows))?;
        let a = Array2::from_shape_vec((n, self.inner.cfg.vocab_size), v)
            .map_err(|e| PyRuntimeError::new_err(format!("internal: logits shape: {e}")))?;
        Ok(a.into_pyarray(py))
    }

    /// Reads (without computing) the given experts of a layer into the cache and returns the
    /// wall seconds; for measuring the store's cold-read throughput.
    fn read_experts(&self, py: Python<'_>, layer: usize, experts: Vec<usize>) -> PyResult<f64> {
        let m = self.inner.clone();
        if layer >= m.cfg.num_layers || experts.iter().any(|&e| e >= m.cfg.n_routed_experts) {
            return Err(PyValueError::new_err("layer or expert index out of range"));
        }
        run_cancellable(py, |_| {
            let t0 = std::time::Instant::now();
            for wave in experts.chunks(m.experts.max_batch().max(1)) {
                let mut pins = m.experts.acquire(layer, wave)?;
                while !m.experts.wait_ready(&mut pins)?.is_empty() {}
            }
            Ok(t0.elapsed().as_secs_f64())
        })
    }

    fn session(&self) -> PySession {
        PySession {
            s: Arc::new(Mutex::new(CoreSession::new(self.inner.clone()))),
        }
    }

    /// A session read from a file `Session.save` wrote, and the metadata saved with it (JSON
    /// text, or None). Refuses (ValueError naming the file and what differs) a file of
    /// another model, config or numerics mode, and a truncated or corrupted one.
    fn load_session(&self, py: Python<'_>, path: PathBuf) -> PyResult<(PySession, Option<String>)> {
        let m = self.inner.clone();
        let (s, meta) = run_cancellable(py, |c| {
            CoreSession::load(m, &path, &|| c.load(Ordering::Relaxed))
        })?;
        let meta = meta.map(|v| v.to_string());
        Ok((
            PySession {
                s: Arc::new(Mutex::new(s)),
            },
            meta,
        ))
    }

    #[getter]
    fn ctx(&self) -> usize {
        self.inner.ctx
    }

    #[getter]
    fn threads(&self) -> usize {
        self.inner.threads
    }

    #[getter]
    fn resident_bytes(&self) -> usize {
        self.inner.resident_bytes
    }

    #[getter]
    fn expert_bytes(&self) -> usize {
        self.inner.experts.expert_bytes
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let m = &self.inner;
        let ld = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        d.set_item("prefill_tokens", ld(&m.counters.prefill_tokens))?;
        d.set_item("decode_tokens", ld(&m.counters.decode_tokens))?;
        d.set_item("prefill_s", ld(&m.counters.prefill_ns) as f64 * 1e-9)?;
        d.set_item("decode_s", ld(&m.counters.decode_ns) as f64 * 1e-9)?;
        d.set_item("attn_s", ld(&m.counters.attn_ns) as f64 * 1e-9)?;
        d.set_item("moe_s", ld(&m.counters.moe_ns) as f64 * 1e-9)?;
        d.set_item("lookahead", m.lookahead)?;
        d.set_item("lookahead_guessed", ld(&m.counters.guessed))?;
        d.set_item("lookahead_guessed_used", ld(&m.counters.guessed_used))?;
        d.set_item("lookahead_needed", ld(&m.counters.guess_needed))?;
        d.set_item("head_s", ld(&m.counters.head_ns) as f64 * 1e-9)?;
        let e = m.experts.counters();
        d.set_item("expert_requests", ld(&e.requests))?;
        d.set_item("expert_hits", ld(&e.hits))?;
        d.set_item("expert_misses", ld(&e.misses))?;
        d.set_item("expert_prefetches", ld(&e.prefetches))?;
        d.set_item("expert_prefetch_used", ld(&e.prefetch_used))?;
        d.set_item("expert_bytes_read", ld(&e.bytes_read))?;
        d.set_item("expert_read_s", ld(&e.read_ns) as f64 * 1e-9)?;
        d.set_item("expert_wait_s", ld(&e.wait_ns) as f64 * 1e-9)?;
        d.set_item("expert_slots", m.experts.n_slots)?;
        d.set_item("io_engine", m.experts.engine())?;
        d.set_item("io_uring_interrupts", ld(&e.uring_interrupts))?;
        d.set_item("direct_io", m.experts.direct_io())?;
        d.set_item("kernel_tier", crate::kernels::tier_name())?;
        d.set_item("numerics", m.numerics.name())?;
        d.set_item(
            "bf16_products",
            matches!(m.numerics, Numerics::Fast | Numerics::Official)
                && crate::kernels::bf16_products(),
        )?;
        d.set_item(
            "fast_products",
            (m.numerics == Numerics::Fast).then(|| crate::kernels::fast_products().name()),
        )?;
        let (kns, kflops) = crate::kernels::kernel_counters();
        d.set_item("kernel_s", kns as f64 * 1e-9)?;
        d.set_item("kernel_gflop", kflops as f64 * 1e-9)?;
        d.set_item("prefaulted_slots", m.experts.prefaulted())?;
        d.set_item("prefault_running", m.experts.prefault_running())?;
        d.set_item("warm_slots", m.experts.warm_slots())?;
        d.set_item("threads", m.threads)?;
        Ok(d)
    }
}

/// A session of the core (`model::generate::Session`: the state, the pending token, the last
/// logits and the generation rules). One call at a time: a second concurrent call raises
/// "busy" at once instead of waiting.
#[pyclass(frozen, name = "Session", module = "v4flash._core")]
struct PySession {
    s: Arc<Mutex<CoreSession>>,
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
/// step's seed and stops); it shares the session, and each step is one call on it.
#[pyclass(frozen, name = "Stream", module = "v4flash._core")]
struct PyStream {
    s: Arc<Mutex<CoreSession>>,
    g: Mutex<Generation>,
}

const BUSY: &str = "this session is busy with another call (one call at a time per session; use separate sessions for concurrency)";

fn lock<T>(m: &Mutex<T>) -> PyResult<MutexGuard<'_, T>> {
    m.try_lock().map_err(|_| PyRuntimeError::new_err(BUSY))
}

fn generation(
    ids: Vec<u32>,
    max_new: usize,
    temperature: f32,
    top_p: f32,
    top_k: usize,
    seed: u64,
    stop_ids: Vec<u32>,
) -> PyResult<Generation> {
    let params = SampleParams {
        temperature,
        top_p,
        top_k,
        seed,
    };
    Generation::new(ids, max_new, params, stop_ids).map_err(to_py)
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

    /// Feeds tokens (prefill) without sampling.
    /// Prefills `ids`. `progress(n)`, if given, is called from this thread after each layer
    /// of the prefill, with n = tokens x layers done so far (of (len(ids) + a pending token)
    /// x layers); an exception it raises stops the prefill there (the session stays as it
    /// was) and propagates.
    #[pyo3(signature = (ids, progress=None))]
    fn feed(
        &self,
        py: Python<'_>,
        ids: Vec<u32>,
        progress: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let mut guard = lock(&self.s)?;
        let s: &mut CoreSession = &mut guard;
        run_reporting(py, progress, |c, report| {
            s.feed_reporting(&ids, &|| c.load(Ordering::Relaxed), report)
        })
    }

    /// Feeds `ids` then samples up to `max_new` tokens, stopping after a stop id or when the
    /// context is full. On Ctrl-C the KeyboardInterrupt propagates; the tokens produced so
    /// far stay in the session (its state is consistent after every token).
    #[pyo3(signature = (ids, max_new, temperature, top_p, top_k, seed, stop_ids))]
    fn generate(
        &self,
        py: Python<'_>,
        ids: Vec<u32>,
        max_new: usize,
        temperature: f32,
        top_p: f32,
        top_k: usize,
        seed: u64,
        stop_ids: Vec<u32>,
    ) -> PyResult<Vec<u32>> {
        let mut g = generation(ids, max_new, temperature, top_p, top_k, seed, stop_ids)?;
        let mut guard = lock(&self.s)?;
        let s: &mut CoreSession = &mut guard;
        run_cancellable(py, |c| s.generate(&mut g, &|| c.load(Ordering::Relaxed)))
    }

    /// Like `generate`, as an iterator: nothing runs until the first `next()`.
    #[pyo3(signature = (ids, max_new, temperature, top_p, top_k, seed, stop_ids))]
    fn stream(
        &self,
        ids: Vec<u32>,
        max_new: usize,
        temperature: f32,
        top_p: f32,
        top_k: usize,
        seed: u64,
        stop_ids: Vec<u32>,
    ) -> PyResult<PyStream> {
        let g = generation(ids, max_new, temperature, top_p, top_k, seed, stop_ids)?;
        Ok(PyStream {
            s: self.s.clone(),
            g: Mutex::new(g),
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
        let guard = lock(&self.s)?;
        let s: &CoreSession = &guard;
        let at = snapshot.map(|p| &p.snap);
        run_cancellable(py, |c| {
            s.save(&path, at, meta.as_ref(), &|| c.load(Ordering::Relaxed))
        })
    }
}

#[pymethods]
impl PyStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<u32>> {
        let mut g = lock(&self.g)?;
        let g: &mut Generation = &mut g;
        if g.finished() {
            return Ok(None);
        }
        let mut guard = lock(&self.s)?;
        let s: &mut CoreSession = &mut guard;
        run_cancellable(py, |c| s.step(g, &|| c.load(Ordering::Relaxed)))
    }
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("V4FlashError", m.py().get_type::<V4FlashError>())?;
    // the numerics modes `Model.load` accepts, in the core's order (exact first)
    let numerics: Vec<&str> = Numerics::ALL.iter().map(|n| n.name()).collect();
    m.add("NUMERICS", pyo3::types::PyTuple::new(m.py(), numerics)?)?;
    m.add_function(wrap_pyfunction!(kernel_tier, m)?)?;
    m.add_function(wrap_pyfunction!(bf16_products, m)?)?;
    m.add_function(wrap_pyfunction!(fast_products, m)?)?;
    checkpoint::register(m)?;
    args::register(m)?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(mem_read_gbs, m)?)?;
    m.add_function(wrap_pyfunction!(disk_read_gbs, m)?)?;
    m.add_function(wrap_pyfunction!(fma_peak_gflops, m)?)?;
    m.add_class::<PyModel>()?;
    m.add_class::<PySession>()?;
    m.add_class::<PySnapshot>()?;
    m.add_class::<PyStream>()?;
    Ok(())
}
