//! The core's error type. Every failure that can come from disk, from a config or from a
//! caller is one of these variants; the Python binding maps them to exceptions in one place
//! (`python.rs`), so no panic ever has to cross the boundary.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A path the user gave (checkpoint dir, shard, config) does not exist.
    #[error("{}: no such file or directory{}", path.display(), if detail.is_empty() { String::new() } else { format!(" ({detail})") })]
    NotFound { path: PathBuf, detail: String },

    /// An OS-level read error on a file, with where it happened.
    #[error("{}: {what}: {source}", path.display())]
    Io {
        path: PathBuf,
        what: String,
        #[source]
        source: std::io::Error,
    },

    /// A read that failed after load (a shard became unreadable or shorter); the message
    /// names the shard and the offset. The state is unchanged, so the call can be retried.
    #[error("{0}")]
    Read(String),

    /// A checkpoint file or tensor is malformed: names the file, the tensor and what was
    /// expected versus found.
    #[error("{file}: {msg}")]
    Checkpoint { file: String, msg: String },

    /// config.json is missing a key, has a wrong type or an inconsistent value.
    #[error("config.json: {0}")]
    Config(String),

    /// A caller passed a bad argument (token out of vocabulary, prompt too long, ...).
    #[error("{0}")]
    InvalidArgument(String),

    /// A caller named an option that does not exist (Python: TypeError, as for an unexpected
    /// keyword argument).
    #[error("{0}")]
    UnknownOption(String),

    /// The memory budget cannot hold what the model needs.
    #[error("{0}")]
    Memory(String),

    /// The running call was cancelled (Ctrl-C); state is unchanged.
    #[error("cancelled")]
    Cancelled,

    /// The operating system refused a resource that is not memory (a thread, a ring).
    #[error("{0}")]
    System(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn checkpoint(file: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Checkpoint {
            file: file.into(),
            msg: msg.into(),
        }
    }
    pub fn config(msg: impl Into<String>) -> Self {
        Error::Config(msg.into())
    }
    pub fn arg(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
    pub fn io(path: impl Into<PathBuf>, what: impl Into<String>, source: std::io::Error) -> Self {
        let path = path.into();
        if source.kind() == std::io::ErrorKind::NotFound {
            return Error::NotFound {
                path,
                detail: what.into(),
            };
        }
        Error::Io {
            path,
            what: what.into(),
            source,
        }
    }

    /// The same error again (for each caller of a batched pass that failed): every variant
    /// kept, an OS error as its kind and message.
    pub fn duplicate(&self) -> Error {
        match self {
            Error::NotFound { path, detail } => Error::NotFound {
                path: path.clone(),
                detail: detail.clone(),
            },
            Error::Io { path, what, source } => Error::Io {
                path: path.clone(),
                what: what.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            Error::Read(m) => Error::Read(m.clone()),
            Error::Checkpoint { file, msg } => Error::checkpoint(file.clone(), msg.clone()),
            Error::Config(m) => Error::Config(m.clone()),
            Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
            Error::UnknownOption(m) => Error::UnknownOption(m.clone()),
            Error::Memory(m) => Error::Memory(m.clone()),
            Error::Cancelled => Error::Cancelled,
            Error::System(m) => Error::System(m.clone()),
        }
    }
}
