//! Measurements of the machine the benchmark runs on, taken in the same run as the engine's
//! own numbers: streaming memory-read bandwidth, direct-I/O disk read bandwidth, FMA peak.

use crate::error::{Error, Result};
use rayon::prelude::*;
use std::path::Path;
use std::time::Instant;

/// GB/s of a streaming sum over `bytes` of memory (best of `reps`), on `threads` threads.
pub fn mem_read_gbs(bytes: usize, threads: usize, reps: usize) -> Result<f64> {
    let n = (bytes / 4).max(1 << 16);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
        .map_err(|e| Error::arg(format!("cannot start {threads} threads: {e}")))?;
    let buf: Vec<f32> = pool.install(|| (0..n).into_par_iter().map(|i| (i % 7) as f32).collect());
    let mut best = 0f64;
    for _ in 0..reps.max(1) {
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
        .len() as usize;
    let chunk = 8 << 20;
    let total = bytes.min(len.saturating_sub(chunk)).max(chunk.min(len));
    let region = crate::store::region::Region::new(chunk + 8192, 1)
        .map_err(|e| Error::Memory(e.to_string()))?;
    region.fault_next();
    let t0 = Instant::now();
    let mut off = 0usize;
    let mut done = 0usize;
    while done < total {
        let n = chunk.min(len - off);
        if n == 0 {
            break;
        }
        // SAFETY: the one-slot region is private to this function and faulted above.
        let buf = unsafe { region.slot_mut(0) };
        f.read_into(buf, off as u64, n)?;
        off += n;
        done += n;
    }
    let dt = t0.elapsed().as_secs_f64();
    Ok((done as f64 / dt / 1e9, f.is_direct()))
}

/// GFLOP/s of independent FMA chains on `threads` threads (register-only), on the active
/// kernel tier.
pub fn fma_peak_gflops(threads: usize) -> Result<f64> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
        .map_err(|e| Error::arg(format!("cannot start {threads} threads: {e}")))?;
    const ITERS: usize = 20_000_000;
    let tier = crate::kernels::active_tier();
    let t0 = Instant::now();
    let flops: u64 = pool.install(|| {
        (0..threads.max(1))
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
