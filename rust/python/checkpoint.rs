//! Checkpoints and configs: the reader's verdict, the config validator, the tensor tables
//! and `inspect` (what `info` and `doctor` print), converted for Python.

use super::to_py;
use crate::checkpoint::inspect::{self, Inspection};
use crate::error::Error;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::Value;
use std::path::PathBuf;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(open_checkpoint, m)?)?;
    m.add_function(wrap_pyfunction!(inspect_checkpoint, m)?)?;
    m.add_function(wrap_pyfunction!(validate_config, m)?)?;
    m.add_function(wrap_pyfunction!(config_json, m)?)?;
    // every key of validate_config's summary (Python's `Config` has one field per key)
    m.add(
        "CONFIG_KEYS",
        PyTuple::new(m.py(), crate::config::summary_keys())?,
    )?;
    m.add_function(wrap_pyfunction!(expected_tensors, m)?)?;
    m.add_function(wrap_pyfunction!(drafter_tensors, m)?)?;
    m.add_function(wrap_pyfunction!(is_routed_expert, m)?)?;
    m.add_function(wrap_pyfunction!(is_drafter, m)?)?;
    m.add_function(wrap_pyfunction!(published_config, m)?)?;
    // the published config.json of DeepSeek V4 Flash, first release (JSON text)
    m.add("PUBLISHED_CONFIG", crate::config::PUBLISHED_CONFIG)?;
    Ok(())
}

/// Opens a checkpoint directory and validates its file structure; returns the tensor count.
#[pyfunction]
fn open_checkpoint(py: Python<'_>, path: PathBuf) -> PyResult<usize> {
    py.detach(|| crate::checkpoint::Checkpoint::open(&path).map(|c| c.len()))
        .map_err(to_py)
}

/// A config given as a path to a config.json (str or os.PathLike), read as the engine reads
/// it, or as a parsed JSON value (a dict, as `json.load` returns).
fn source_json(py: Python<'_>, source: &Bound<'_, PyAny>) -> PyResult<Value> {
    if source.is_instance_of::<PyString>() || source.hasattr("__fspath__")? {
        let path: PathBuf = source.extract()?;
        return py.detach(|| crate::config::read_json(&path)).map_err(to_py);
    }
    py_to_json(source, 0)
}

/// A Python value as JSON (what `json.dumps` would write), for configs given as dicts.
fn py_to_json(v: &Bound<'_, PyAny>, depth: usize) -> PyResult<Value> {
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
fn json_to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
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

/// Validates a config (`rust/config.rs`, the engine's own validator) and returns its summary
/// (`config::validate_json`: every key of the Python `Config`, the layer kinds) plus `raw`,
/// the whole config as parsed. Raises V4FlashError naming the key, what was expected and
/// found; FileNotFoundError / PermissionError / OSError for a config.json that cannot be read.
#[pyfunction]
fn validate_config<'py>(
    py: Python<'py>,
    source: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let v = source_json(py, source)?;
    let (_, summary) = crate::config::validate_json(&v).map_err(to_py)?;
    let d = json_to_py(py, &summary)?;
    d.set_item("raw", json_to_py(py, &v)?)?;
    Ok(d)
}

/// A summary (`validate_config`'s keys) as a config.json the core accepts as it is
/// (`config::config_json`).
#[pyfunction]
fn config_json<'py>(py: Python<'py>, summary: &Bound<'py, PyDict>) -> PyResult<Bound<'py, PyAny>> {
    match py_to_json(summary.as_any(), 0)? {
        Value::Object(o) => json_to_py(py, &crate::config::config_json(&o)),
        _ => Err(to_py(Error::config("the top level must be a JSON object"))),
    }
}

/// Every tensor the engine reads for a config (given as `validate_config` takes it), as
/// (name, accepted dtypes with the published one first, shape) in the loader's order, the
/// routed experts last (`checkpoint::expected`, the table the loader itself checks).
#[pyfunction]
fn expected_tensors<'py>(
    py: Python<'py>,
    source: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyList>> {
    let v = source_json(py, source)?;
    let c = crate::config::ModelConfig::from_json(&v).map_err(to_py)?;
    table_rows(py, &crate::checkpoint::expected::expected_tensors(&c))
}

/// The drafter's tensors for a config (`checkpoint::expected::drafter_tensors`), as
/// `expected_tensors` gives the model's: none when the config describes no drafter.
#[pyfunction]
fn drafter_tensors<'py>(
    py: Python<'py>,
    source: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyList>> {
    let v = source_json(py, source)?;
    let c = crate::config::ModelConfig::from_json(&v).map_err(to_py)?;
    table_rows(py, &crate::checkpoint::expected::drafter_tensors(&c))
}

fn table_rows<'py>(
    py: Python<'py>,
    table: &[crate::checkpoint::expected::ExpectedTensor],
) -> PyResult<Bound<'py, PyList>> {
    let rows = table
        .iter()
        .map(|t| {
            let dtypes = PyTuple::new(py, t.dtypes.iter().map(|d| d.name()))?;
            let shape = PyTuple::new(py, &t.shape)?;
            PyTuple::new(
                py,
                [
                    PyString::new(py, &t.name).into_any(),
                    dtypes.into_any(),
                    shape.into_any(),
                ],
            )
        })
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, rows)
}

/// Whether a tensor name is one of a routed expert's of the main model
/// (`layers.L.ffn.experts.E.<part>`; the MTP block's `mtp.*` experts are not).
#[pyfunction]
fn is_routed_expert(name: &str) -> bool {
    crate::checkpoint::expected::is_routed_expert(name)
}

/// Whether a tensor name is the drafter's (`mtp.*`), which the engine never reads.
#[pyfunction]
fn is_drafter(name: &str) -> bool {
    crate::checkpoint::expected::is_drafter(name)
}

/// The published config.json of a release (`"first"` or `"0731"`), as a dict.
#[pyfunction]
fn published_config<'py>(py: Python<'py>, release: &str) -> PyResult<Bound<'py, PyAny>> {
    let v = crate::config::published_config(release).map_err(to_py)?;
    json_to_py(py, &v)
}

/// What `info` and `doctor` report about a checkpoint directory, reading no tensor data
/// (`checkpoint::inspect`): `rows` [(status, what, detail)], `config` (the validated config's
/// summary plus `raw`, or None), `shards` {file: bytes}, `tensors` [(name, dtype, shape,
/// bytes, shard)], `sizes` {dense, experts, drafter} and `drafter` (None, or {kind, blocks,
/// bytes, usable, summary, problems}).
#[pyfunction]
fn inspect_checkpoint<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyDict>> {
    let ins: Inspection = py.detach(|| inspect::inspect(&path));
    let d = PyDict::new(py);
    let rows = ins
        .rows
        .iter()
        .map(|r| (r.status.name(), r.what.as_str(), r.detail.as_str()))
        .collect::<Vec<_>>();
    d.set_item("rows", rows)?;
    match &ins.config_summary {
        Some(s) => {
            let c = json_to_py(py, s)?;
            let raw = crate::config::read_json(&path.join("config.json")).map_err(to_py)?;
            c.set_item("raw", json_to_py(py, &raw)?)?;
            d.set_item("config", c)?;
        }
        None => d.set_item("config", py.None())?,
    }
    let shards = PyDict::new(py);
    for (f, n) in &ins.shards {
        shards.set_item(f, n)?;
    }
    d.set_item("shards", shards)?;
    let tensors = ins
        .tensors
        .iter()
        .map(|e| {
            (
                e.name.as_str(),
                e.dtype,
                e.shape.clone(),
                e.nbytes,
                e.shard.as_str(),
            )
        })
        .collect::<Vec<_>>();
    d.set_item("tensors", tensors)?;
    let sizes = PyDict::new(py);
    sizes.set_item("dense", ins.sizes.dense)?;
    sizes.set_item("experts", ins.sizes.experts)?;
    sizes.set_item("drafter", ins.sizes.drafter)?;
    d.set_item("sizes", sizes)?;
    match &ins.drafter {
        Some(r) => {
            let x = PyDict::new(py);
            x.set_item("kind", r.kind)?;
            x.set_item("blocks", r.blocks)?;
            x.set_item("bytes", r.bytes)?;
            x.set_item("usable", r.usable())?;
            x.set_item("summary", r.summary())?;
            x.set_item("problems", r.problems.clone())?;
            d.set_item("drafter", x)?;
        }
        None => d.set_item("drafter", py.None())?,
    }
    Ok(d)
}
