//! Python arguments as the core's (`args::Arg`: the value's kind and its repr). The rules live
//! in the core (`LoadOptions::set`, `SampleParams::from_args`); this only says what kind of
//! value Python passed.

use super::to_py;
use crate::args::{Arg, Given};
use crate::model::sample::SampleParams;
use crate::options::LoadOptions;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyString};

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sample_params, m)?)?;
    // the options `Model.load` and `plan` take (`LoadOptions::NAMES`)
    m.add(
        "LOAD_OPTIONS",
        pyo3::types::PyTuple::new(m.py(), LoadOptions::NAMES)?,
    )?;
    Ok(())
}

/// A Python value as an argument: None (or nothing) is absent; a bool, a float, a str, or an
/// integer (anything with `__index__`: int, numpy integers); anything else is `Other`.
pub fn arg(v: Option<&Bound<'_, PyAny>>) -> Arg {
    let Some(v) = v.filter(|v| !v.is_none()) else {
        return Arg::absent();
    };
    let shown = v.repr().map(|r| r.to_string()).unwrap_or_default();
    let given = if let Ok(b) = v.cast::<PyBool>() {
        Given::Bool(b.is_true())
    } else if let Ok(f) = v.cast::<PyFloat>() {
        Given::Float(f.value())
    } else if let Ok(t) = v.cast::<PyString>() {
        t.to_cow()
            .map_or(Given::Other, |t| Given::Text(t.into_owned()))
    } else {
        match v
            .call_method0("__index__")
            .and_then(|i| i.extract::<i128>())
        {
            Ok(i) => Given::Int(i),
            Err(_) => Given::Other,
        }
    };
    Arg::new(given, shown)
}

/// Keyword arguments as `LoadOptions`, each set by the core (`LoadOptions::set`: its name,
/// kind and range; an unknown name is a TypeError).
pub fn load_options(options: Option<&Bound<'_, PyDict>>) -> PyResult<LoadOptions> {
    let mut given = Vec::new();
    for (k, v) in options.into_iter().flat_map(|d| d.iter()) {
        given.push((k.extract::<String>()?, arg(Some(&v))));
    }
    LoadOptions::from_args(given.iter().map(|(k, v)| (k.as_str(), v.clone()))).map_err(to_py)
}

/// The sampling parameters checked by the core (`SampleParams::from_args`, the one place their
/// rules live), as (temperature, top_p, top_k, seed): seed None draws a random one. ValueError
/// names the parameter first.
#[pyfunction]
#[pyo3(signature = (temperature=None, top_p=None, top_k=None, seed=None))]
fn sample_params(
    temperature: Option<&Bound<'_, PyAny>>,
    top_p: Option<&Bound<'_, PyAny>>,
    top_k: Option<&Bound<'_, PyAny>>,
    seed: Option<&Bound<'_, PyAny>>,
) -> PyResult<(f64, f64, usize, u64)> {
    let (t, p, s) =
        SampleParams::from_args(&arg(temperature), &arg(top_p), &arg(top_k), &arg(seed))
            .map_err(to_py)?;
    Ok((t, p, s.top_k, s.seed))
}
