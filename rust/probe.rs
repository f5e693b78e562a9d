//! Measurements of the machine the benchmark runs on, taken in the same run as the engine's
//! own numbers: streaming memory-read bandwidth, direct-I/O disk read bandwidth, FMA peak.

use crate::error::{Error, Result};
use rayon::prelude::*;
use std::path::Path;
use std::time::Instant;

/// Most repetitions a probe takes (each one streams the whole buffer).
pub const MAX_REPS: usize = 1000;
/// Smallest buffer the memory probe measures (smaller sizes are rounded up to it).
pub const MIN_MEM_BYTES: usize = 256 << 10;

/// The threads this process can run at once (its affinity and CPU quota): the default of
/// the compute pool and of the probes.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The most threads a probe starts: 4 per core, and at least 1024.
pub fn max_threads() -> usize {
    cores().saturating_mul(4).max(1024)
}

/// A pool of `threads` threads, refusing 0 and absurd counts before starting any.
fn pool(threads: usize) -> Result<rayon::ThreadPool> {
    let cap = max_threads();
    if threads == 0 || threads > cap {
        return Err(Error::arg(format!(
            "threads must be between 1 and {cap} (4 per core, at least 1024), got {threads}"
        )));
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| Error::arg(format!("cannot start {threads} threads: {e}")))
}

/// GB/s of a streaming sum over `bytes` of memory (best of `reps`), on `threads` threads.
/// Sizes below `MIN_MEM_BYTES` are measured over `MIN_MEM_BYTES`; a size that cannot be
/// allocated (more than the memory the OS reports as available, or refused by the allocator)
/// is `Error::Memory`.
pub fn mem_read_gbs(bytes: usize, threads: usize, reps: usize) -> Result<f64> {
    if bytes == 0 {
        return Err(Error::arg("nbytes must be at least 1 byte"));
    }
    if reps == 0 || reps > MAX_REPS {
        return Err(Error::arg(format!(
            "reps must be between 1 and {MAX_REPS}, got {reps}"
        )));
    }
    let pool = pool(threads)?;
    let n = (bytes / 4).max(MIN_MEM_BYTES / 4);
    let size = n as u64 * 4;
    if let Some(avail) = crate::plan::available_memory() {
        if size > avail {
            return Err(Error::Memory(format!(
                "cannot measure memory bandwidth over {bytes} bytes: more than the {avail} bytes \
                 of memory available; use a smaller nbytes"
            )));
        }
    }
    let mut buf: Vec<f32> = Vec::new();
    buf.try_reserve_exact(n).map_err(|e| {
        Error::Memory(format!(
            "cannot allocate {size} bytes for the memory bandwidth probe ({e}); use a smaller nbytes"
        ))
    })?;
    // filled in parallel (first touch on the threads that read it); the capacity reserved
    // above is enough, so this does not allocate again
    pool.install(|| buf.par_extend((0..n).into_par_iter().map(|i| (i % 7) as f32)));
    let mut best = 0f64;
    for _ in 0..reps {
        let t0 = Instant::now();
        let s: f32 = pool.install(|| {
            buf.par_chunks(1 << 16)
                .map(|c| {
                    let mut acc = [0f32; 16];
                    for ch in c.chunks_exact(16) {
                        for l in 0..16 {
                            acc[l] += ch[l];
                        }
                    }
                    acc.iter().sum::<f32>()
                })
                .sum()
        });
        let dt = t0.elapsed().as_secs_f64();
        std::hint::black_box(s);
        best = best.max((n * 4) as f64 / dt / 1e9);
    }
    Ok(best)
}

/// The most readers the disk probe starts (the engine keeps at most 32 reads in flight).
pub const MAX_READERS: usize = 64;

/// Bytes of one probe read.
const DISK_CHUNK: usize = 8 << 20;

/// GB/s of direct-I/O reads of up to `bytes` from the start of `path`, in 8 MiB reads, with
/// `readers` of them in flight at once (buffered where the file system refuses direct I/O;
/// the second value says which was used). One reader measures the disk read after read;
/// several read the way the engine streams experts (many reads in flight), which is what
/// an SSD needs to reach its rated speed. Each reader takes the next unread 8 MiB of the
/// range, so the range is read once whatever `readers` is.
pub fn disk_read_gbs(path: &Path, bytes: usize, readers: usize) -> Result<(f64, bool)> {
    let r = disk_read(path, bytes, readers)?;
    let gbs = if r.bytes == 0 {
        0.0
    } else {
        r.bytes as f64 / r.secs / 1e9
    };
    Ok((gbs, r.direct))
}

/// What one disk probe read.
struct DiskRead {
    /// Bytes read.
    bytes: usize,
    /// Seconds from the first read's start to the last one's end.
    secs: f64,
    /// Whether direct I/O was used throughout.
    direct: bool,
}

/// The disk probe's reads (see `disk_read_gbs`).
fn disk_read(path: &Path, bytes: usize, readers: usize) -> Result<DiskRead> {
    use crate::store::io::{IoMode, ShardFile};
    use std::sync::atomic::{AtomicUsize, Ordering};
    if readers == 0 || readers > MAX_READERS {
        return Err(Error::arg(format!(
            "readers must be between 1 and {MAX_READERS}, got {readers}"
        )));
    }
    let name = path
        .file_name()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let f = ShardFile::open(path, &name, IoMode::Direct)?;
    let len = std::fs::metadata(path)
        .map_err(|e| Error::io(path, "stat", e))?
        .len();
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    let chunk = DISK_CHUNK;
    // never more than the file holds, however large `bytes` is
    let total = bytes.min(len.saturating_sub(chunk)).max(chunk.min(len));
    // one slot per reader, with room for the direct-I/O envelope's alignment
    let region = crate::store::region::Region::new(chunk + 8192, readers)
        .map_err(|e| Error::Memory(e.to_string()))?;
    for r in 0..readers {
        region.claim(r);
        // first touch before the clock starts: faulting in 8 MiB per reader would be
        // counted as disk time (about 1 s per GB on some VMs)
        // SAFETY: the region is private to this function and no reader has started yet, so
        // this is the only reference to slot r's bytes.
        unsafe { region.range_mut(r, 0, region.slot_size) }.fill(0);
    }
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let t0 = Instant::now();
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let spawned: Vec<_> = (0..readers)
            .map(|r| {
                let (f, region, next, done) = (&f, &region, &next, &done);
                std::thread::Builder::new()
                    .name(format!("v4flash-probe-{r}"))
                    .spawn_scoped(s, move || -> Result<()> {
                        // SAFETY: slot r of the region (private to this function, with no
                        // pre-fault thread on it) is used by reader r alone, so this is the
                        // only reference to its bytes while the scope lasts.
                        let buf = unsafe { region.range_mut(r, 0, region.slot_size) };
                        loop {
                            let off = next.fetch_add(chunk, Ordering::Relaxed);
                            if off >= total {
                                return Ok(());
                            }
                            let n = chunk.min(total - off);
                            f.read_into(buf, off as u64, n)?;
                            done.fetch_add(n, Ordering::Relaxed);
                        }
                    })
            })
            .collect();
        spawned
            .into_iter()
            .map(|h| match h {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|_| Err(Error::System("a disk probe reader panicked".into()))),
                Err(e) => Err(Error::System(format!(
                    "cannot start a disk probe reader: {e}"
                ))),
            })
            .collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(DiskRead {
        bytes: done.load(Ordering::Relaxed),
        secs,
        direct: f.is_direct(),
    })
}

/// GFLOP/s of independent FMA chains on `threads` threads (register-only), on the active
/// kernel tier.
pub fn fma_peak_gflops(threads: usize) -> Result<f64> {
    let pool = pool(threads)?;
    const ITERS: usize = 20_000_000;
    let tier = crate::kernels::active_tier();
    let t0 = Instant::now();
    let flops: u64 = pool.install(|| {
        (0..threads)
            .into_par_iter()
            .map(|_| {
                crate::kernels::fma_probe(tier, ITERS).map_or(0, |(s, f)| {
                    std::hint::black_box(s);
                    f
                })
            })
            .sum()
    });
    let dt = t0.elapsed().as_secs_f64();
    Ok(flops as f64 / dt / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A file of `len` bytes in a fresh temporary directory.
    fn file_of(len: usize, tag: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("v4flash-probe-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("shard.bin");
        let mut f = std::fs::File::create(&path).expect("create");
        let block: Vec<u8> = (0..(1 << 20)).map(|i| (i % 251) as u8).collect();
        let mut left = len;
        while left > 0 {
            let n = left.min(block.len());
            f.write_all(&block[..n]).expect("write");
            left -= n;
        }
        (dir, path)
    }

    #[test]
    fn disk_probe_reads_the_range_once_whatever_the_readers() {
        // not a multiple of the 8 MiB read, so the last read is short
        let len = 3 * DISK_CHUNK + 12_345;
        let (dir, path) = file_of(len, "range");
        // the probe keeps one read's worth off the end of a large file
        let want = len - DISK_CHUNK;
        for readers in [1, 2, 3, 8] {
            let r = disk_read(&path, usize::MAX, readers).expect("probe");
            assert_eq!(r.bytes, want, "{readers} readers");
            assert!(r.secs > 0.0);
            // a smaller range is read exactly, in 8 MiB reads and a short one
            let r = disk_read(&path, DISK_CHUNK + 4096, readers).expect("probe");
            assert_eq!(r.bytes, DISK_CHUNK + 4096, "{readers} readers");
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn disk_probe_reads_a_small_file_whole() {
        let (dir, path) = file_of(100_000, "small");
        for readers in [1, 4] {
            assert_eq!(
                disk_read(&path, 1 << 30, readers).expect("probe").bytes,
                100_000
            );
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn disk_probe_refuses_no_readers_and_too_many() {
        let (dir, path) = file_of(4096, "readers");
        for readers in [0, MAX_READERS + 1] {
            let e = disk_read_gbs(&path, 4096, readers).expect_err("refused");
            assert!(
                e.to_string().contains("readers must be between 1 and"),
                "{e}"
            );
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
