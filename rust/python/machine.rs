//! The plan and the machine: `plan` without loading, the switches in force, the kernels'
//! choices, memory, io_uring, and the bandwidth probes, converted for Python.

use super::args::load_options;
use super::json::to_python;
use super::to_py;
use crate::report::{PlanReport, TuningReport};
use crate::tuning::Tuning;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    add_functions!(
        m,
        plan,
        tuning,
        kernel_tier,
        bf16_products,
        fast_products,
        memory_info,
        io_uring_probe,
        mem_read_gbs,
        disk_read_gbs,
        fma_peak_gflops
    );
    Ok(())
}

/// The memory plan for a checkpoint without loading it (config + tensor table only), for the
/// options `Model.load` takes (`plan::plan_checkpoint`, `report::PlanReport`).
#[pyfunction]
#[pyo3(signature = (path, **options))]
fn plan<'py>(
    py: Python<'py>,
    path: PathBuf,
    options: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let opts = load_options(options)?;
    let p = py
        .detach(|| crate::plan::plan_checkpoint(&path, &opts))
        .map_err(to_py)?;
    to_python(py, &PlanReport::new(&p, &opts.tuning))
}

/// The switches a model loaded now would run with (`report::TuningReport`: the kernels'
/// choices for this process, the per-model switches from the environment).
#[pyfunction]
fn tuning(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    to_python(py, &TuningReport::of(&Tuning::from_env()))
}

#[pyfunction]
fn kernel_tier() -> &'static str {
    crate::kernels::tier_name()
}

/// Whether fast and official numerics multiply FP8/FP4 matrices with `vdpbf16ps` (AVX-512
/// tier on a CPU with full-rate avx512_bf16; `Tuning::bf16` overrides).
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

/// (total, available) memory in bytes as the OS reports it, each None where it does not
/// (`plan::memory_info`: what the planner sizes from without a budget).
#[pyfunction]
fn memory_info() -> (Option<u64>, Option<u64>) {
    crate::plan::memory_info()
}

/// (io_uring usable by `--io direct`?, why): the engine's own ring asked for and let go
/// (`store::io_uring_probe`), with the switches from the environment.
#[pyfunction]
fn io_uring_probe() -> (Option<bool>, String) {
    crate::store::io_uring_probe(&Tuning::from_env())
}

/// Streaming memory-read bandwidth in GB/s (best of `reps`; threads: all cores).
#[pyfunction]
#[pyo3(signature = (nbytes=1 << 30, threads=None, reps=3))]
fn mem_read_gbs(
    py: Python<'_>,
    nbytes: usize,
    threads: Option<usize>,
    reps: usize,
) -> PyResult<f64> {
    let t = threads.unwrap_or_else(crate::probe::cores);
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

/// Register-only FMA throughput in GFLOP/s (threads: all cores).
#[pyfunction]
#[pyo3(signature = (threads=None))]
fn fma_peak_gflops(py: Python<'_>, threads: Option<usize>) -> PyResult<f64> {
    let t = threads.unwrap_or_else(crate::probe::cores);
    py.detach(|| crate::probe::fma_peak_gflops(t))
        .map_err(to_py)
}
