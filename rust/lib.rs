//! v4flash core: checkpoint reading, kernels, expert streaming and the DeepSeek V4 forward
//! pass. The Python binding (`python.rs`) is a thin layer over these modules.

pub mod checkpoint;
pub mod config;
pub mod dtype;
pub mod error;
pub mod kernels;
pub mod model;
pub mod plan;
pub mod probe;
mod python;
pub mod store;

pub use error::{Error, Result};
