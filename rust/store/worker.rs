//! The portable read engine: a pool of I/O threads, each taking one expert's read job at a
//! time and filling its slot with positional reads (direct I/O where the file was opened
//! for it). Also the synchronous path the io_uring engine falls back to for anything unusual,
//! and the scale check every freshly read expert goes through.

use super::layout::{Blocks, ReadOp, SCALE_PARTS};
use super::slots::{Job, Shared};
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Instant;

pub(crate) fn io_worker(sh: &Shared, rx: &Mutex<mpsc::Receiver<Job>>) {
    loop {
        let job = {
            let r = rx.lock().unwrap_or_else(|p| p.into_inner());
            r.recv()
        };
        let Ok(job) = job else { return };
        let t0 = Instant::now();
        let res = read_expert(sh, &job).and_then(|n| check_scales(sh, &job).map(|_| n));
        record_time(sh, t0);
        sh.finish(&job, res);
    }
}

pub(crate) fn record_time(sh: &Shared, t0: Instant) {
    sh.counters
        .read_ns
        .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

/// Synchronous read of one planned range into the job's slot.
pub(crate) fn read_op(sh: &Shared, job: &Job, r: &ReadOp) -> Result<usize> {
    // SAFETY: the slot is Loading and belongs to this job, so nobody reads it and no other
    // job writes it; within the job, this read's envelope is disjoint from every other
    // read's (layout::ReadOp::envelope), so concurrent reads of the same job (io_uring)
    // never touch these bytes; the slot was claimed from the pre-fault before it was taken.
    let buf = unsafe { sh.region.range_mut(job.slot, r.dst, r.envelope()) };
    let f = &sh.files[r.shard as usize];
    let len = r.len as usize;
    if !f.is_degraded() {
        if f.read_into(buf, r.offset, len).is_ok() {
            return Ok(len);
        }
        f.set_degraded();
    }
    // the checkpoint's handle retries once on a reopened file (a shard restored after a fault)
    let d = r.delta();
    sh.ck
        .read_into(r.shard as usize, r.offset, &mut buf[d..d + len])
        .map_err(|e| Error::Read(format!("reading expert {}: {e}", sh.expert_name(job.key))))?;
    Ok(len)
}

fn read_expert(sh: &Shared, job: &Job) -> Result<usize> {
    let lay = &sh.layouts[job.key as usize];
    let mut n = 0;
    for r in &lay.reads {
        n += read_op(sh, job, r)?;
    }
    Ok(n)
}

/// Rejects the E8M0 NaN encoding in an expert's freshly read scale bytes.
pub(crate) fn check_scales(sh: &Shared, job: &Job) -> Result<()> {
    let lay = &sh.layouts[job.key as usize];
    for k in SCALE_PARTS {
        let (s, l) = lay.parts[k];
        // SAFETY: still Loading and owned by this job, and every read of the job has
        // completed (callers check scales last), so nothing writes these bytes now.
        let bytes = unsafe { sh.region.range(job.slot, s, l) };
        scan_scales(
            bytes,
            sh.files[lay.files[k].shard as usize].name.as_str(),
            &sh.blocks,
            job.key,
            k,
        )?;
    }
    Ok(())
}

/// The scale check shared by every read path: byte 255 is the F8_E8M0 NaN encoding.
pub(crate) fn scan_scales(
    bytes: &[u8],
    file: &str,
    blocks: &Blocks,
    key: u32,
    k: usize,
) -> Result<()> {
    if let Some(i) = crate::dtype::e8m0_nan(bytes) {
        return Err(Error::checkpoint(
            file,
            format!(
                "tensor {}: scale byte {i} is 255 (the F8_E8M0 NaN encoding)",
                blocks.part_name(key, k)
            ),
        ));
    }
    Ok(())
}
