//! Positional reads that work on every platform (pread on Unix, seek_read on Windows).

use crate::error::{Error, Result};
use std::fs::File;
use std::path::Path;

/// Reads exactly `buf.len()` bytes at `offset`; a short read is an error naming the file
/// and the offset (a shard that shrank after it was opened).
pub fn read_exact_at(file: &File, path: &Path, buf: &mut [u8], offset: u64) -> Result<()> {
    let mut done = 0usize;
    while done < buf.len() {
        let n = read_at(file, &mut buf[done..], offset + done as u64).map_err(|e| {
            Error::io(
                path,
                format!("read of {} bytes at offset {}", buf.len(), offset),
                e,
            )
        })?;
        if n == 0 {
            return Err(Error::io(
                path,
                format!("read of {} bytes at offset {}", buf.len(), offset),
                std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "file ended after {} bytes (truncated shard?)",
                        offset + done as u64
                    ),
                ),
            ));
        }
        done += n;
    }
    Ok(())
}

#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    loop {
        match file.read_at(buf, offset) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

#[cfg(windows)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    use std::os::windows::fs::FileExt;
    file.seek_read(buf, offset)
}

#[cfg(not(any(unix, windows)))]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = file.try_clone()?;
    f.seek(SeekFrom::Start(offset))?;
    f.read(buf)
}
