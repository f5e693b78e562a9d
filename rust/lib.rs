//! v4flash core: checkpoint reading, kernels, expert streaming and the DeepSeek V4 forward
//! pass. The Python binding (`python.rs`, cargo feature `python`, which maturin enables) is a
//! thin layer over these modules; without the feature nothing links libpython.

pub mod args;
pub mod checkpoint;
pub mod config;
pub mod dtype;
pub mod error;
pub mod grammar;
pub mod kernels;
pub mod model;
pub mod options;
pub mod plan;
pub mod probe;
#[cfg(feature = "python")]
mod python;
pub mod report;
pub mod schedule;
pub mod scratch;
pub mod speculate;
pub mod store;
pub mod tuning;

pub use error::{Error, Result};
