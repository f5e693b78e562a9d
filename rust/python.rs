//! The `v4flash._core` extension module: converts arguments into owned Rust values, runs the
//! work with the GIL released, and maps `Error` to Python exceptions in one place.

use crate::error::Error;
use pyo3::create_exception;
use pyo3::exceptions::{
    PyException, PyFileNotFoundError, PyKeyboardInterrupt, PyMemoryError, PyOSError,
    PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;

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
        Error::Io { .. } => PyOSError::new_err(msg),
        Error::Checkpoint { .. } | Error::Config(_) => V4FlashError::new_err(msg),
        Error::InvalidArgument(_) => PyValueError::new_err(msg),
        Error::Memory(_) => PyMemoryError::new_err(msg),
        Error::Cancelled => PyKeyboardInterrupt::new_err(msg),
        Error::Busy(_) => PyRuntimeError::new_err(msg),
    }
}

#[pyfunction]
fn kernel_tier() -> &'static str {
    crate::kernels::tier_name()
}

/// Opens a checkpoint directory and validates its file structure; returns the tensor count.
#[pyfunction]
fn open_checkpoint(py: Python<'_>, path: std::path::PathBuf) -> PyResult<usize> {
    py.detach(|| crate::checkpoint::Checkpoint::open(&path).map(|c| c.len()))
        .map_err(to_py)
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("V4FlashError", m.py().get_type::<V4FlashError>())?;
    m.add_function(wrap_pyfunction!(kernel_tier, m)?)?;
    m.add_function(wrap_pyfunction!(open_checkpoint, m)?)?;
    Ok(())
}
