//! Reading experts into their slots: positional reads of each expert's byte ranges straight
//! into the slot, by a pool of I/O threads (many reads in flight). Where the OS allows it the
//! shards are opened for direct I/O (Linux O_DIRECT with 4 KiB-aligned offsets, lengths and
//! buffers; macOS F_NOCACHE), so streaming experts does not churn the page cache; a file
//! system that refuses direct I/O (tmpfs, some network file systems) falls back to buffered
//! reads, once, with a visible note. On Windows the direct handle is opened with
//! `FILE_FLAG_NO_BUFFERING` and read with overlapped requests (`win`, which says why).
//! `IoMode::Buffered` forces the portable path everywhere.

use crate::checkpoint::read_exact_at;
use crate::error::{Error, Result};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoMode {
    /// Direct I/O where available, buffered otherwise.
    Direct,
    /// Plain positional reads through the page cache (the portable path).
    Buffered,
    /// Experts are used in place from memory-mapped shards (no slots, no copies).
    Mmap,
}

impl IoMode {
    pub fn parse(s: &str) -> Option<IoMode> {
        match s {
            "direct" | "auto" => Some(IoMode::Direct),
            "buffered" | "pread" | "portable" => Some(IoMode::Buffered),
            "mmap" => Some(IoMode::Mmap),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            IoMode::Direct => "direct",
            IoMode::Buffered => "buffered",
            IoMode::Mmap => "mmap",
        }
    }
}

/// One shard's read handles.
pub struct ShardFile {
    pub path: PathBuf,
    pub name: String,
    buffered: File,
    direct: Option<File>,
    direct_ok: AtomicBool,
    /// Set after a failed read: from then on reads go through the checkpoint's own handle,
    /// which reopens a shard that was restored after a fault.
    degraded: AtomicBool,
}

impl ShardFile {
    pub fn open(path: &Path, name: &str, mode: IoMode) -> Result<ShardFile> {
        let buffered = File::open(path).map_err(|e| Error::io(path, "open shard", e))?;
        let direct = if mode == IoMode::Direct {
            open_direct(path)
        } else {
            None
        };
        let ok = direct.is_some();
        Ok(ShardFile {
            path: path.to_path_buf(),
            name: name.to_string(),
            buffered,
            direct,
            direct_ok: AtomicBool::new(ok),
            degraded: AtomicBool::new(false),
        })
    }

    /// The descriptor to read from asynchronously, and whether it is the direct one.
    #[cfg(target_os = "linux")]
    pub fn raw_fd(&self) -> (std::os::unix::io::RawFd, bool) {
        use std::os::unix::io::AsRawFd;
        match (&self.direct, self.is_direct()) {
            (Some(f), true) => (f.as_raw_fd(), true),
            _ => (self.buffered.as_raw_fd(), false),
        }
    }

    pub fn is_degraded(&self) -> bool {
        self.degraded.load(Ordering::Relaxed)
    }

    pub fn set_degraded(&self) {
        self.degraded.store(true, Ordering::Relaxed);
    }

    pub fn is_direct(&self) -> bool {
        self.direct_ok.load(Ordering::Relaxed)
    }

    /// Reads `len` bytes at file offset `off` so that they land at `buf[delta..delta+len]`
    /// where `delta = off % ALIGN`; `buf` is ALIGN-aligned and large enough for the aligned
    /// envelope. With direct I/O the whole envelope is read.
    pub fn read_into(&self, buf: &mut [u8], off: u64, len: usize) -> Result<()> {
        let a = super::region::ALIGN as u64;
        let start = off - off % a;
        let delta = (off - start) as usize;
        if self.is_direct() {
            if let Some(f) = &self.direct {
                let env = (delta + len).div_ceil(a as usize) * a as usize;
                match read_direct(f, &mut buf[..env], start, delta + len) {
                    Ok(()) => return Ok(()),
                    Err(e) if e.raw_os_error() == Some(REFUSED) => {
                        // this file system refuses direct I/O after all
                        if self.direct_ok.swap(false, Ordering::Relaxed) {
                            eprintln!(
                                "v4flash: direct I/O refused on {} ({e}); using buffered reads",
                                self.path.display()
                            );
                        }
                    }
                    Err(e) => {
                        return Err(Error::io(
                            &self.path,
                            format!("read of {len} bytes at offset {off} (direct I/O)"),
                            e,
                        ))
                    }
                }
            }
        }
        read_exact_at(
            &self.buffered,
            &self.path,
            &mut buf[delta..delta + len],
            off,
        )
    }
}

/// Reads at least `need` bytes of the aligned envelope (the file may end inside it).
fn read_direct(f: &File, buf: &mut [u8], start: u64, need: usize) -> std::io::Result<()> {
    let mut done = 0usize;
    while done < need {
        match read_direct_once(f, &mut buf[done..], start + done as u64) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "file ended after {} bytes (truncated shard?)",
                        start + done as u64
                    ),
                ))
            }
            Ok(n) => {
                done += n;
                // a short direct read must stay aligned to continue
                if done < need && done % super::region::ALIGN != 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!(
                            "short read: file ended after {} bytes (truncated shard?)",
                            start + done as u64
                        ),
                    ));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The OS error a file system refuses a direct read with (EINVAL, ERROR_INVALID_PARAMETER).
#[cfg(unix)]
const REFUSED: i32 = libc::EINVAL;
#[cfg(windows)]
use super::win::REFUSED;
#[cfg(not(any(unix, windows)))]
const REFUSED: i32 = 22;

/// One positional read on the direct handle (the caller retries EINTR and continues short
/// reads).
#[cfg(unix)]
fn read_direct_once(f: &File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    f.read_at(buf, off)
}

#[cfg(windows)]
fn read_direct_once(f: &File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    super::win::read_unbuffered(f, buf, off)
}

#[cfg(not(any(unix, windows)))]
fn read_direct_once(_f: &File, _buf: &mut [u8], _off: u64) -> std::io::Result<usize> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "positional reads",
    ))
}

#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()
}

#[cfg(target_os = "macos")]
fn open_direct(path: &Path) -> Option<File> {
    use std::os::unix::io::AsRawFd;
    let f = File::open(path).ok()?;
    // SAFETY: fcntl on a valid, owned descriptor with an integer argument.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_NOCACHE, 1) };
    if r == -1 {
        return None;
    }
    Some(f)
}

#[cfg(windows)]
fn open_direct(path: &Path) -> Option<File> {
    super::win::open_unbuffered(path)
}

#[cfg(not(any(target_os = "linux", target_os = "macos", windows)))]
fn open_direct(_path: &Path) -> Option<File> {
    None
}
