//! The `v4flash._core` extension module: converts arguments into owned Rust values, runs the
//! work with the GIL released (on a worker thread, while the calling thread watches for
//! Ctrl-C), and maps `Error` to Python exceptions in one place. By concern: `model` (the
//! loaded model), `session` (sessions, snapshots, streams), `batch` (sequences fed together
//! in one pass), `machine` (the plan without loading, the switches in force, the machine's
//! probes), `checkpoint` (configs, tensor tables, inspection), `args` (arguments for the
//! core's rules), `json` (JSON and reports).

use crate::error::Error;
use crate::kernels::Numerics;
use pyo3::create_exception;
use pyo3::exceptions::{
    PyException, PyFileNotFoundError, PyKeyboardInterrupt, PyMemoryError, PyOSError,
    PyPermissionError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Mutex;
use std::time::Duration;

/// Adds each `#[pyfunction]` named to module `m`.
macro_rules! add_functions {
    ($m:expr, $($f:ident),+ $(,)?) => {
        $($m.add_function(wrap_pyfunction!($f, $m)?)?;)+
    };
}

mod args;
mod batch;
mod checkpoint;
mod grammar;
mod json;
mod machine;
mod model;
mod session;

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
        Error::UnknownOption(_) => PyTypeError::new_err(msg),
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

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("V4FlashError", m.py().get_type::<V4FlashError>())?;
    // the numerics modes `Model.load` accepts, in the core's order (exact first)
    let numerics: Vec<&str> = Numerics::ALL.iter().map(|n| n.name()).collect();
    m.add("NUMERICS", pyo3::types::PyTuple::new(m.py(), numerics)?)?;
    // the speculate modes (`speculate::MODES`), auto the default
    m.add(
        "SPECULATE",
        pyo3::types::PyTuple::new(m.py(), crate::speculate::MODES)?,
    )?;
    checkpoint::register(m)?;
    args::register(m)?;
    machine::register(m)?;
    m.add_class::<model::PyModel>()?;
    session::register(m)?;
    grammar::register(m)?;
    batch::register(m)?;
    Ok(())
}
