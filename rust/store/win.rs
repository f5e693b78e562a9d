//! Windows unbuffered expert reads: a second handle on each shard opened with
//! `FILE_FLAG_NO_BUFFERING | FILE_FLAG_OVERLAPPED`, read by the pool of I/O threads
//! (`worker`), each thread issuing one overlapped `ReadFile` at a time and waiting for it on
//! an event of its own.
//!
//! Why overlapped reads from the existing pool, and not synchronous reads or an IOCP engine:
//! - on a handle opened *without* `FILE_FLAG_OVERLAPPED` the I/O manager serialises every
//!   request on the file object, so eight pool threads reading one shard through one
//!   synchronous handle would keep one read in flight, not eight; overlapped requests on
//!   one handle are independent, so the pool keeps `io_threads` reads in flight per shard
//!   with no per-thread handles;
//! - an I/O completion port engine (the io_uring analogue: one thread, 32 reads in flight)
//!   would add a second engine with its own cancellation and slot-quarantine rules, for
//!   queue depth the pool already reaches with its eight threads; it is not written.
//!
//! `FILE_FLAG_NO_BUFFERING` requires file offsets, lengths and buffer addresses that are
//! multiples of the volume's sector size. Reads here are `ALIGN` (4 KiB) aligned in all
//! three (checked before each request, so a bug is an error and not a corrupt read); a
//! volume whose sector size does not divide 4 KiB gets no unbuffered handle, and a file
//! system that refuses the request anyway (`ERROR_INVALID_PARAMETER`) falls back to
//! buffered reads once, with a note (`io::ShardFile::read_into`).
//!
//! Both handles share reading, writing and deletion with other openers (Rust's default share
//! mode, spelled out here for the unbuffered one), so another process can still read a shard
//! v4flash has open, and a shard can be replaced while it is open. Long paths (over
//! `MAX_PATH`) and non-ASCII paths need nothing here: every path goes through `std::fs`,
//! which converts it to UTF-16 and adds the `\\?\` prefix itself when the path is too long
//! for the plain form.

use super::region::ALIGN;
use std::cell::OnceCell;
use std::fs::File;
use std::io;
use std::os::windows::fs::OpenOptionsExt;
use std::os::windows::io::{AsRawHandle, FromRawHandle, OwnedHandle};
use std::path::Path;
use windows_sys::Win32::Foundation::{
    ERROR_HANDLE_EOF, ERROR_INVALID_PARAMETER, ERROR_IO_PENDING, HANDLE,
};
use windows_sys::Win32::Storage::FileSystem::{
    FileStorageInfo, GetFileInformationByHandleEx, ReadFile, FILE_FLAG_NO_BUFFERING,
    FILE_FLAG_OVERLAPPED, FILE_SHARE_DELETE, FILE_SHARE_READ, FILE_SHARE_WRITE, FILE_STORAGE_INFO,
};
use windows_sys::Win32::System::Threading::CreateEventW;
use windows_sys::Win32::System::IO::{GetOverlappedResult, OVERLAPPED};

/// The most bytes one request asks for (`ReadFile` takes a u32 length); a multiple of ALIGN.
const MAX_REQUEST: usize = 1 << 30;

/// The OS error a file system answers an unbuffered request it will not do with.
pub(crate) const REFUSED: i32 = ERROR_INVALID_PARAMETER as i32;

/// Opens `path` for unbuffered overlapped reads; None when it cannot be opened so, or when
/// the volume's sector size does not divide ALIGN (the reads could not be aligned to it).
pub(crate) fn open_unbuffered(path: &Path) -> Option<File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .share_mode(FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE)
        .custom_flags(FILE_FLAG_NO_BUFFERING | FILE_FLAG_OVERLAPPED)
        .open(path)
        .ok()?;
    match sector_size(&f) {
        Some(s) if s != 0 && ALIGN % s as usize != 0 => {
            eprintln!(
                "v4flash: sector size {s} of {} does not divide {ALIGN}; using buffered reads",
                path.display()
            );
            None
        }
        // fits, or unknown (the query is not supported everywhere): try, fall back if refused
        _ => Some(f),
    }
}

/// The alignment unbuffered requests on `f` need (the volume's logical sector size), when the
/// system reports it.
fn sector_size(f: &File) -> Option<u32> {
    let mut info = std::mem::MaybeUninit::<FILE_STORAGE_INFO>::zeroed();
    // SAFETY: the handle is valid for the life of `f`; `info` is a writable buffer of exactly
    // the size passed, of the structure FileStorageInfo fills; it is read only on success.
    let ok = unsafe {
        GetFileInformationByHandleEx(
            f.as_raw_handle() as HANDLE,
            FileStorageInfo,
            info.as_mut_ptr().cast(),
            std::mem::size_of::<FILE_STORAGE_INFO>() as u32,
        )
    };
    if ok == 0 {
        return None;
    }
    // SAFETY: the call succeeded, so it filled the structure (and it was zeroed before).
    let info = unsafe { info.assume_init() };
    Some(info.LogicalBytesPerSector)
}

thread_local! {
    /// This thread's event for waiting on its own requests (manual-reset: `ReadFile` resets
    /// it when a request starts, the system sets it when the request completes).
    static EVENT: OnceCell<io::Result<OwnedHandle>> = const { OnceCell::new() };
}

fn new_event() -> io::Result<OwnedHandle> {
    // SAFETY: no security attributes, no name; a manual-reset event, initially not signalled.
    let h = unsafe { CreateEventW(std::ptr::null(), 1, 0, std::ptr::null()) };
    if h.is_null() {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `h` is a new, valid event handle that nothing else owns.
    Ok(unsafe { OwnedHandle::from_raw_handle(h) })
}

/// One unbuffered read of up to `buf.len()` bytes at `off` on a handle from
/// `open_unbuffered`: returns the bytes read (fewer at the end of the file, 0 at or past
/// it). `off`, `buf.len()` and the address of `buf` must be multiples of ALIGN.
pub(crate) fn read_unbuffered(f: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    if off % ALIGN as u64 != 0 || buf.len() % ALIGN != 0 || buf.as_ptr() as usize % ALIGN != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "unaligned unbuffered read: offset {off}, {} bytes, buffer address % {ALIGN} = {}",
                buf.len(),
                buf.as_ptr() as usize % ALIGN
            ),
        ));
    }
    let len = buf.len().min(MAX_REQUEST);
    EVENT.with(|ev| {
        let ev = match ev.get_or_init(new_event) {
            Ok(h) => h.as_raw_handle() as HANDLE,
            Err(e) => return Err(io::Error::new(e.kind(), format!("CreateEventW: {e}"))),
        };
        let mut ov = OVERLAPPED::default();
        ov.Anonymous.Anonymous.Offset = off as u32;
        ov.Anonymous.Anonymous.OffsetHigh = (off >> 32) as u32;
        ov.hEvent = ev;
        let h = f.as_raw_handle() as HANDLE;
        // SAFETY: `h` is a valid handle opened for overlapped reads, `buf` is valid for
        // writes of `len` bytes, and `ov` carries this thread's own event (never shared with
        // a concurrent request, so a completion of another thread's request on the same
        // handle cannot wake this wait). The request may still be running when ReadFile
        // returns: `buf` and `ov` are borrowed/live until the wait below, which this
        // function always reaches when a request was queued (ERROR_IO_PENDING, or TRUE for a
        // request that completed at once) and which does not return before the request
        // has completed (bWait = TRUE, non-alertable: no early return on APCs, and there is
        // no EINTR on Windows). Only when ReadFile fails with another error was nothing
        // queued, and then nothing will write `buf` or `ov`.
        let started = unsafe {
            ReadFile(
                h,
                buf.as_mut_ptr(),
                len as u32,
                std::ptr::null_mut(),
                &mut ov,
            )
        };
        if started == 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error().map(|c| c as u32) {
                Some(ERROR_IO_PENDING) => {}
                Some(ERROR_HANDLE_EOF) => return Ok(0),
                _ => return Err(e),
            }
        }
        let mut got = 0u32;
        // SAFETY: waits for the request queued above on the same handle with the same
        // OVERLAPPED (still live and unmoved); returns once it has completed.
        let ok = unsafe { GetOverlappedResult(h, &ov, &mut got, 1) };
        if ok == 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error().map(|c| c as u32) == Some(ERROR_HANDLE_EOF) {
                return Ok(0);
            }
            return Err(e);
        }
        Ok(got as usize)
    })
}

#[cfg(test)]
mod tests {
    use super::super::io::{IoMode, ShardFile};
    use super::super::region::Region;
    use super::*;
    use std::io::Write;

    /// A file of `n` bytes that differ from their neighbours (a misplaced read shows).
    fn data_file(dir: &Path, n: usize) -> (std::path::PathBuf, Vec<u8>) {
        let bytes: Vec<u8> = (0..n).map(|i| (i * 7 + i / 251) as u8).collect();
        let p = dir.join("shard.bin");
        std::fs::File::create(&p)
            .unwrap()
            .write_all(&bytes)
            .unwrap();
        (p, bytes)
    }

    #[test]
    fn unbuffered_reads_at_unaligned_ranges_match_buffered_ones() {
        let dir = tempfile::tempdir().unwrap();
        let n = 5 * ALIGN + 1234;
        let (p, bytes) = data_file(dir.path(), n);
        let sf = ShardFile::open(&p, "shard.bin", IoMode::Direct).unwrap();
        assert!(sf.is_direct(), "no unbuffered handle on {}", p.display());
        let buffered = ShardFile::open(&p, "shard.bin", IoMode::Buffered).unwrap();
        assert!(!buffered.is_direct());
        let region = Region::new(8 * ALIGN, 2).unwrap();
        let cases: &[(u64, usize)] = &[
            (0, 1),
            (0, ALIGN),
            (1, ALIGN),
            (ALIGN as u64 - 1, 2),
            (3 * ALIGN as u64 + 17, ALIGN + 5),
            (100, 4 * ALIGN),
            // ends inside the file's last, partial sector
            (4 * ALIGN as u64 + 1, ALIGN + 1233),
            ((n - 1) as u64, 1),
        ];
        for &(off, len) in cases {
            let d = (off % ALIGN as u64) as usize;
            // SAFETY: slots 0 and 1 are used only by this test's thread.
            let a = unsafe { region.range_mut(0, 0, 8 * ALIGN) };
            sf.read_into(a, off, len).unwrap();
            let a = a[d..d + len].to_vec();
            // SAFETY: as above.
            let b = unsafe { region.range_mut(1, 0, 8 * ALIGN) };
            buffered.read_into(b, off, len).unwrap();
            let want = &bytes[off as usize..off as usize + len];
            assert_eq!(&a[..], want, "unbuffered read at {off}, {len} bytes");
            assert_eq!(&b[d..d + len], want, "buffered read at {off}, {len} bytes");
        }
        // every read above went through the unbuffered handle (no fallback happened)
        assert!(sf.is_direct() && !sf.is_degraded());
        // past the end: an error naming the file, not zeros
        // SAFETY: as above.
        let a = unsafe { region.range_mut(0, 0, 8 * ALIGN) };
        let e = sf.read_into(a, n as u64 - 10, 20).unwrap_err().to_string();
        assert!(e.contains("shard.bin"), "{e}");
    }

    #[test]
    fn unaligned_requests_are_refused_before_they_reach_the_system() {
        let dir = tempfile::tempdir().unwrap();
        let (p, bytes) = data_file(dir.path(), 4 * ALIGN);
        let f = open_unbuffered(&p).unwrap();
        let region = Region::new(4 * ALIGN, 1).unwrap();
        // SAFETY: the only slot, used only by this test's thread.
        let buf = unsafe { region.range_mut(0, 0, 4 * ALIGN) };
        for (off, range) in [
            (1u64, 0..ALIGN),
            (0, 0..ALIGN + 1),
            (0, 1..ALIGN + 1),
            (512, 0..ALIGN),
        ] {
            let e = read_unbuffered(&f, &mut buf[range.clone()], off).unwrap_err();
            assert_eq!(
                e.kind(),
                io::ErrorKind::InvalidInput,
                "{off} {range:?}: {e}"
            );
        }
        assert_eq!(
            read_unbuffered(&f, &mut buf[..2 * ALIGN], 0).unwrap(),
            2 * ALIGN
        );
        assert_eq!(&buf[..2 * ALIGN], &bytes[..2 * ALIGN]);
        // at and past the end of the file: 0 bytes
        assert_eq!(
            read_unbuffered(&f, &mut buf[..ALIGN], 4 * ALIGN as u64).unwrap(),
            0
        );
        assert_eq!(
            read_unbuffered(&f, &mut buf[..ALIGN], 9 * ALIGN as u64).unwrap(),
            0
        );
    }

    #[test]
    fn concurrent_unbuffered_reads_on_one_handle_each_get_their_own_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let n = 64 * ALIGN;
        let (p, bytes) = data_file(dir.path(), n);
        let sf = std::sync::Arc::new(ShardFile::open(&p, "shard.bin", IoMode::Direct).unwrap());
        assert!(sf.is_direct());
        let region = std::sync::Arc::new(Region::new(4 * ALIGN, 8).unwrap());
        let bytes = std::sync::Arc::new(bytes);
        let hs: Vec<_> = (0..8)
            .map(|t| {
                let (sf, region, bytes) = (sf.clone(), region.clone(), bytes.clone());
                std::thread::spawn(move || {
                    for i in 0..40usize {
                        let off = ((t * 13 + i * 29) % 60 * ALIGN + (t + i) % 3) as u64;
                        let len = 3 * ALIGN - 7 * i;
                        // SAFETY: slot t belongs to thread t alone.
                        let buf = unsafe { region.range_mut(t, 0, 4 * ALIGN) };
                        sf.read_into(buf, off, len).unwrap();
                        let d = (off % ALIGN as u64) as usize;
                        assert_eq!(&buf[d..d + len], &bytes[off as usize..off as usize + len]);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert!(sf.is_direct() && !sf.is_degraded());
    }

    #[test]
    fn a_shard_held_open_by_the_reader_can_be_opened_by_others() {
        let dir = tempfile::tempdir().unwrap();
        let (p, bytes) = data_file(dir.path(), 2 * ALIGN);
        let sf = ShardFile::open(&p, "shard.bin", IoMode::Direct).unwrap();
        assert!(sf.is_direct());
        // a plain reader
        assert_eq!(std::fs::read(&p).unwrap(), bytes);
        // a reader that denies writers: fails if any open handle could write
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .share_mode(FILE_SHARE_READ)
            .open(&p)
            .unwrap();
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut got).unwrap();
        assert_eq!(got, bytes);
        drop(f);
        // and one that writes (restoring a shard in place)
        std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        // a shard can be renamed away while open (replacing it with a fresh copy)
        std::fs::rename(&p, dir.path().join("old.bin")).unwrap();
    }
}
