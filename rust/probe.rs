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

/// The most threads a probe starts: 4 per core, and at least 1024.
pub fn max_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .saturating_mul(4)
        .max(1024)
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

/// GB/s of sequential direct-I/O reads of up to `bytes` from `path` (buffered where the file
/// system refuses direct I/O; the second value says which was used).
pub fn disk_read_gbs(path: &Path, bytes: usize) -> Result<(f64, bool)> {
    use crate::store::io::{IoMode, ShardFile};
    let name = path
        .file_name()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let f = ShardFile::open(path, &name, IoMode::Direct)?;
    let len = std::fs::metadata(path)
        .map_err(|e| Error::io(path, "stat", e))?
        .len();
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    let chunk = 8 << 20;
    // never more than the file holds, however large `bytes` is
    let total = bytes.min(len.saturating_sub(chunk)).max(chunk.min(len));
    let region = crate::store::region::Region::new(chunk + 8192, 1)
        .map_err(|e| Error::Memory(e.to_string()))?;
    region.claim(0);
    let t0 = Instant::now();
    let mut off = 0usize;
    let mut done = 0usize;
    while done < total {
        let n = chunk.min(len - off);
        if n == 0 {
            break;
        }
        // SAFETY: the one-slot region is private to this function (no pre-fault thread runs
        // on it), so this is the only reference to its bytes.
        let buf = unsafe { region.range_mut(0, 0, region.slot_size) };
        f.read_into(buf, off as u64, n)?;
        off += n;
        done += n;
    }
    let dt = t0.elapsed().as_secs_f64();
    let gbs = if done == 0 {
        0.0
    } else {
        done as f64 / dt / 1e9
    };
    Ok((gbs, f.is_direct()))
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
