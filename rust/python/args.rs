//! Python arguments converted for the core's rules: a number that is not a bool, an integer
//! with a lower bound. The rules themselves live in the core (`SampleParams::new`); these only
//! say what Python passed when it is not even the right kind of value.

use super::to_py;
use crate::model::sample::SampleParams;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt};

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sample_params, m)?)?;
    Ok(())
}

/// A real number (int or float, never a bool), named `name` in the error.
pub fn number(v: &Bound<'_, PyAny>, name: &str) -> PyResult<f64> {
    if v.is_instance_of::<PyBool>()
        || !(v.is_instance_of::<PyInt>() || v.is_instance_of::<PyFloat>())
    {
        let shown = v.repr().map(|r| r.to_string()).unwrap_or_default();
        return Err(PyValueError::new_err(format!(
            "{name} must be a number, got {shown}"
        )));
    }
    v.extract::<f64>()
}

/// An integer >= `minimum` (never a bool), named `name` in the error; numpy integers count.
pub fn integer(v: &Bound<'_, PyAny>, name: &str, minimum: u64) -> PyResult<u64> {
    let shown = || v.repr().map(|r| r.to_string()).unwrap_or_default();
    let not_int = || PyValueError::new_err(format!("{name} must be an integer, got {}", shown()));
    if v.is_instance_of::<PyBool>() || v.is_instance_of::<PyFloat>() {
        return Err(not_int());
    }
    let i: i128 = v
        .call_method0("__index__")
        .and_then(|x| x.extract())
        .map_err(|_| not_int())?;
    if i < minimum as i128 {
        return Err(PyValueError::new_err(format!(
            "{name} must be >= {minimum}, got {}",
            shown()
        )));
    }
    // seeds beyond 64 bits keep their low 64 bits
    Ok(i as u64)
}

/// The sampling parameters checked by the core (`SampleParams::new`, the one place their rules
/// live), as (temperature, top_p, top_k, seed): seed None draws a random one. ValueError names
/// the parameter first.
#[pyfunction]
#[pyo3(signature = (temperature=None, top_p=None, top_k=None, seed=None))]
fn sample_params(
    temperature: Option<&Bound<'_, PyAny>>,
    top_p: Option<&Bound<'_, PyAny>>,
    top_k: Option<&Bound<'_, PyAny>>,
    seed: Option<&Bound<'_, PyAny>>,
) -> PyResult<(f64, f64, u64, u64)> {
    let t = temperature.map_or(Ok(1.0), |v| number(v, "temperature"))?;
    let p = top_p.map_or(Ok(1.0), |v| number(v, "top_p"))?;
    let k = top_k.map_or(Ok(0), |v| integer(v, "top_k", 0))?;
    let seed = match seed {
        Some(v) if !v.is_none() => Some(integer(v, "seed", 0)?),
        _ => None,
    };
    let s = SampleParams::new(t, p, k as usize, seed).map_err(to_py)?;
    Ok((t, p, k, s.seed))
}
