//! JSON values and Python objects, both ways (what `json.dumps` / `json.loads` would give), and
//! the core's reports (serde structs) as Python dicts: their field names are the keys.

use super::to_py;
use crate::error::Error;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde::Serialize;
use serde_json::Value;

/// A core struct as Python values, through its serde form (a report: `report::Stats`, ...).
pub fn to_python<'py, T: Serialize>(py: Python<'py>, v: &T) -> PyResult<Bound<'py, PyAny>> {
    let v = serde_json::to_value(v)
        .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(format!("internal: {e}")))?;
    json_to_py(py, &v)
}

/// A Python value as JSON (what `json.dumps` would write), for configs given as dicts.
pub fn py_to_json(v: &Bound<'_, PyAny>, depth: usize) -> PyResult<Value> {
    let bad = |m: String| to_py(Error::config(format!("not valid JSON ({m})")));
    if depth > 128 {
        return Err(bad("nested too deeply".into()));
    }
    if v.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = v.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if v.is_instance_of::<PyInt>() {
        if let Ok(u) = v.extract::<u64>() {
            return Ok(u.into());
        }
        if let Ok(i) = v.extract::<i64>() {
            return Ok(i.into());
        }
        // as serde_json reads an integer literal beyond 64 bits: the nearest double
        let too_big = || {
            let digits = v.str().map_or(0, |t| t.len().unwrap_or(0));
            bad(format!(
                "an integer of {digits} digits is beyond any JSON number"
            ))
        };
        let x: f64 = v.extract().map_err(|_| too_big())?;
        return serde_json::Number::from_f64(x)
            .map(Value::Number)
            .ok_or_else(too_big);
    }
    if let Ok(f) = v.cast::<PyFloat>() {
        let x = f.value();
        return serde_json::Number::from_f64(x)
            .map(Value::Number)
            .ok_or_else(|| bad(format!("{x} is not a JSON number")));
    }
    if let Ok(t) = v.cast::<PyString>() {
        return Ok(Value::String(t.to_cow()?.into_owned()));
    }
    if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        let mut a = Vec::new();
        for x in v.try_iter()? {
            a.push(py_to_json(&x?, depth + 1)?);
        }
        return Ok(Value::Array(a));
    }
    if let Ok(d) = v.cast::<PyDict>() {
        let mut o = serde_json::Map::new();
        for (k, x) in d.iter() {
            let k = k
                .cast::<PyString>()
                .map_err(|_| bad(format!("the key {k} is not a string")))?
                .to_cow()?
                .into_owned();
            o.insert(k, py_to_json(&x, depth + 1)?);
        }
        return Ok(Value::Object(o));
    }
    Err(bad(format!(
        "a value of type {} is not a JSON value",
        v.get_type().name()?
    )))
}

/// JSON as Python values (what `json.loads` returns).
pub fn json_to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => u.into_pyobject(py)?.into_any(),
            (None, Some(i), _) => i.into_pyobject(py)?.into_any(),
            (None, None, x) => x.unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(t) => PyString::new(py, t).into_any(),
        Value::Array(a) => {
            let items = a
                .iter()
                .map(|x| json_to_py(py, x))
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any()
        }
        Value::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, json_to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}
