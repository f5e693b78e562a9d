//! The session file: a generating session's whole state on disk (docs/architecture.md §7.1),
//! so a conversation survives a restart and continues bit for bit. This module reads and
//! writes files: `save` writes atomically (a temporary file beside the target, synced, then
//! renamed over it), `load` checks a file in the order the format allows (`format`: the
//! layout and its checksums) and refuses a file of another model (`identity`).

pub use super::format::Parts;
use super::format::{self, MAX_HEADER};
use super::identity;
use crate::error::{Error, Result};
use crate::model::session::State;
use crate::model::Model;
use serde_json::Value;
use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A session read back.
pub struct Loaded {
    pub state: State,
    pub pending: Option<u32>,
    pub last: Option<Vec<f32>>,
    pub metadata: Option<Value>,
}

// --- saving ---------------------------------------------------------------------------------

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// A temporary path beside `path` (same directory, so the rename is atomic).
fn temp_path(path: &Path) -> Result<PathBuf> {
    let name = path.file_name().ok_or_else(|| {
        Error::arg(format!(
            "{}: not a file path (give the session file's name)",
            path.display()
        ))
    })?;
    let tmp = format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        TMP_SEQ.fetch_add(1, Ordering::Relaxed)
    );
    Ok(path.with_file_name(tmp))
}

/// Writes `parts` as a session file of `m` at `path` (atomically: a temporary file beside
/// it, flushed to disk, then renamed over it). Returns the file's size.
pub fn save<C: Fn() -> bool + Sync>(
    path: &Path,
    m: &Model,
    parts: &Parts,
    cancel: &C,
) -> Result<u64> {
    // never write a file that loading would refuse
    format::check_counts(&m.cfg, parts)?;
    if path.is_dir() {
        return Err(Error::arg(format!(
            "{}: is a directory (give the session file's name)",
            path.display()
        )));
    }
    let head = serde_json::to_vec(&format::header(identity::of(m), parts))
        .map_err(|e| Error::arg(format!("session metadata cannot be written as JSON: {e}")))?;
    if head.len() as u64 > u64::from(MAX_HEADER) {
        return Err(Error::arg(format!(
            "session metadata too large: the header would be {} bytes (at most {MAX_HEADER})",
            head.len()
        )));
    }
    let tmp = temp_path(path)?;
    let r = write_file(path, &tmp, m, parts, &head, cancel).and_then(|n| {
        std::fs::rename(&tmp, path)
            .map_err(|e| Error::io(path, "renaming the finished session file into place", e))?;
        sync_dir(path);
        Ok(n)
    });
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// Writes the file to `tmp`; errors name `path`, the file the caller asked for.
fn write_file<C: Fn() -> bool + Sync>(
    path: &Path,
    tmp: &Path,
    m: &Model,
    parts: &Parts,
    head: &[u8],
    cancel: &C,
) -> Result<u64> {
    let err = |e: std::io::Error| Error::io(path, "writing the session file", e);
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(tmp)
        .map_err(|e| {
            Error::io(
                path,
                format!(
                    "creating the session file (as {} first)",
                    tmp.file_name()
                        .map_or(String::new(), |n| n.to_string_lossy().into())
                ),
                e,
            )
        })?;
    let w = BufWriter::with_capacity(1 << 20, f);
    let Some(w) = format::encode(w, head, parts, cancel).map_err(err)? else {
        return Err(Error::Cancelled);
    };
    let f = w.into_inner().map_err(|e| err(e.into_error()))?;
    f.sync_all().map_err(err)?;
    let n = f.metadata().map_err(err)?.len();
    let want = format::file_size(
        &m.cfg,
        parts.state.tokens.len(),
        parts.last.is_some(),
        head.len() as u64,
    );
    if n != want {
        return Err(Error::arg(format!(
            "internal: wrote {n} bytes, the format says {want}"
        )));
    }
    Ok(n)
}

/// Makes the rename durable (best effort: not every system can sync a directory).
fn sync_dir(path: &Path) {
    #[cfg(unix)]
    {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

// --- loading --------------------------------------------------------------------------------

/// Reads a session file of `m` (see the module comment for what is checked, in order).
pub fn load<C: Fn() -> bool + Sync>(path: &Path, m: &Model, cancel: &C) -> Result<Loaded> {
    let c = &m.cfg;
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, "session file", e))?;
    if !meta.is_file() {
        return Err(Error::arg(format!(
            "{shown}: not a regular file (expected a v4flash session file)"
        )));
    }
    let len = meta.len();
    let f = File::open(path).map_err(|e| Error::io(path, "opening the session file", e))?;
    let mut r = format::Reader::new(BufReader::with_capacity(1 << 20, f), path);
    let (h, hl) = r.header(len)?;
    identity::check(path, m, &h)?;
    let shape = r.shape(&h, hl, len, c, m.ctx)?;
    let body = r.body(c, &shape, cancel)?;
    Ok(Loaded {
        state: State::from_parts(body.layers, body.tokens, m.id),
        pending: shape.pending,
        last: body.logits,
        metadata: shape.metadata,
    })
}

#[cfg(test)]
mod tests;
