//! Checkpoints and configs: the reader's verdict, the config validator, the tensor tables
//! and `inspect` (what `info` and `doctor` print), converted for Python.

use super::json::{json_to_py, py_to_json, to_python};
use super::to_py;
use crate::checkpoint::expected::{self, ExpectedTensor};
use crate::checkpoint::inspect::{self, Inspection};
use crate::checkpoint::sizes::{ModelBytes, TableBytes};
use crate::config::ModelConfig;
use crate::dtype::DType;
use crate::error::Error;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use serde_json::Value;
use std::path::PathBuf;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    add_functions!(
        m,
        open_checkpoint,
        inspect_checkpoint,
        validate_config,
        config_json,
        expected_tensors,
        drafter_tensors,
        is_routed_expert,
        is_drafter,
        published_config,
        table_bytes
    );
    // every key of validate_config's summary (Python's `Config` has one field per key)
    m.add(
        "CONFIG_KEYS",
        PyTuple::new(m.py(), crate::config::summary_keys())?,
    )?;
    // bytes per element of each dtype a checkpoint may hold, by its safetensors name
    let sizes = PyDict::new(m.py());
    for d in DType::ALL {
        sizes.set_item(d.name(), d.size())?;
    }
    m.add("DTYPE_SIZES", sizes)?;
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
fn expected_tensors<'py>(py: Python<'py>, source: &Bound<'py, PyAny>) -> Rows<'py> {
    table_rows(py, source, expected::expected_tensors)
}

/// The drafter's tensors for a config (`checkpoint::expected::drafter_tensors`), as
/// `expected_tensors` gives the model's: none when the config describes no drafter.
#[pyfunction]
fn drafter_tensors<'py>(py: Python<'py>, source: &Bound<'py, PyAny>) -> Rows<'py> {
    table_rows(py, source, expected::drafter_tensors)
}

/// A config's validated `ModelConfig`.
fn model_config(py: Python<'_>, source: &Bound<'_, PyAny>) -> PyResult<ModelConfig> {
    ModelConfig::from_json(&source_json(py, source)?).map_err(to_py)
}

/// A tensor table as Python rows: [(name, dtypes, shape)].
type Rows<'py> = PyResult<Bound<'py, PyList>>;

/// The rows of `table` for a config.
fn table_rows<'py>(
    py: Python<'py>,
    source: &Bound<'py, PyAny>,
    table: fn(&ModelConfig) -> Vec<ExpectedTensor>,
) -> Rows<'py> {
    let rows = table(&model_config(py, source)?)
        .into_iter()
        .map(|t| {
            let dtypes: Vec<&str> = t.dtypes.iter().map(|d| d.name()).collect();
            (t.name, PyTuple::new(py, dtypes), PyTuple::new(py, t.shape))
        })
        .map(|(name, dtypes, shape)| Ok((name, dtypes?, shape?)))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, rows)
}

/// A tensor as `inspect_checkpoint` lists it, without its shard: (name, dtype, shape, bytes).
type TensorRow = (String, String, Vec<usize>, u64);

/// Bytes and parameters of a model by what the engine does with each tensor
/// (`checkpoint::sizes::ModelBytes`: dense, per token, experts, drafter, active parameters):
/// of `tensors` [(name, dtype, shape, bytes)] (a checkpoint's, as `inspect_checkpoint` lists
/// them), or, without them, of the config's expected table in the published dtypes.
#[pyfunction]
#[pyo3(signature = (config, tensors=None))]
fn table_bytes<'py>(
    py: Python<'py>,
    config: &Bound<'py, PyAny>,
    tensors: Option<Vec<TensorRow>>,
) -> PyResult<Bound<'py, PyAny>> {
    let c = model_config(py, config)?;
    let table = match tensors {
        None => TableBytes::of_table(&expected::expected_tensors(&c)),
        Some(ts) => {
            let mut t = TableBytes::default();
            for (name, dtype, shape, nbytes) in ts {
                t.add(&name, DType::from_safetensors(&dtype), &shape, nbytes);
            }
            t
        }
    };
    to_python(py, &ModelBytes::new(table, &c))
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
    match (&ins.config_summary, &ins.config_raw) {
        (Some(s), Some(raw)) => {
            let c = json_to_py(py, s)?;
            c.set_item("raw", json_to_py(py, raw)?)?;
            d.set_item("config", c)?;
        }
        _ => d.set_item("config", py.None())?,
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
    sizes.set_item("dense", ins.sizes.dense_bytes)?;
    sizes.set_item("experts", ins.sizes.experts_bytes)?;
    sizes.set_item("drafter", ins.sizes.drafter_bytes)?;
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
