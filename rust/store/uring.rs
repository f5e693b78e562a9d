//! Linux io_uring engine: one thread keeps up to `QUEUE_DEPTH` expert reads in flight on a
//! ring, direct I/O into the slots. Anything unusual (a short read, a refused direct read, an
//! error) is completed synchronously by the portable path, which knows how to fall back and
//! how to word the error, so the fast path stays simple.

use super::{check_scales, envelope, finish_job, read_op, Job, ReadOp, Shared};
use io_uring::{opcode, types, IoUring};
use std::sync::mpsc::{self, TryRecvError};
use std::sync::Mutex;
use std::time::Instant;

/// Reads in flight at once.
pub const QUEUE_DEPTH: usize = 32;

/// Tries to create a ring; None where the kernel or a sandbox refuses io_uring.
pub fn try_ring() -> Option<IoUring> {
    if std::env::var("V4FLASH_IO_URING").is_ok_and(|v| v == "0") {
        return None;
    }
    IoUring::new((QUEUE_DEPTH * 2) as u32).ok()
}

struct Pending {
    job: Job,
    left: usize,
    bytes: usize,
    err: Option<crate::error::Error>,
    t0: Instant,
}

struct Op {
    job: usize,
    read: ReadOp,
    /// bytes of the envelope that must arrive for the read to be complete
    need: usize,
}

pub fn uring_worker(sh: &Shared, rx: &Mutex<mpsc::Receiver<Job>>, mut ring: IoUring) {
    let region = sh.region.as_ref().expect("slot mode has a region").clone();
    let mut jobs: Vec<Option<Pending>> = Vec::new();
    let mut ops: Vec<Option<Op>> = Vec::new();
    let mut inflight = 0usize;
    let mut closed = false;
    loop {
        // take new jobs while there is room in the queue
        while inflight < QUEUE_DEPTH && !closed {
            let next = {
                let r = rx.lock().unwrap_or_else(|p| p.into_inner());
                if inflight == 0 {
                    r.recv().map_err(|_| TryRecvError::Disconnected)
                } else {
                    r.try_recv()
                }
            };
            let job = match next {
                Ok(j) => j,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
            };
            let lay = &sh.layouts[job.key as usize];
            let ji = free_index(&mut jobs);
            jobs[ji] = Some(Pending {
                job: Job {
                    slot: job.slot,
                    key: job.key,
                },
                left: lay.reads.len(),
                bytes: 0,
                err: None,
                t0: Instant::now(),
            });
            for r in &lay.reads {
                if sh.files[r.shard as usize].is_degraded() || r.len > u32::MAX as u64 / 2 {
                    // after a fault (or for an implausibly large range) use the portable path
                    complete(sh, &mut jobs, ji, read_op(sh, &job, r));
                    continue;
                }
                let (fd, direct) = sh.files[r.shard as usize].raw_fd();
                let a = super::region::ALIGN as u64;
                let delta = (r.offset % a) as usize;
                let (off, len, dst, need) = if direct {
                    (
                        r.offset - delta as u64,
                        envelope(r.offset, r.len),
                        r.dst,
                        delta + r.len as usize,
                    )
                } else {
                    (r.offset, r.len as usize, r.dst + delta, r.len as usize)
                };
                let oi = free_index(&mut ops);
                ops[oi] = Some(Op {
                    job: ji,
                    read: *r,
                    need,
                });
                // SAFETY: the slot is Loading and owned by this job until it is finished
                // below, after every read of it completed; the region outlives the ring use.
                let ptr = unsafe { region.slot_mut(job.slot).as_mut_ptr().add(dst) };
                let e = opcode::Read::new(types::Fd(fd), ptr, len as u32)
                    .offset(off)
                    .build()
                    .user_data(oi as u64);
                // SAFETY: the buffer stays valid and untouched until the completion is reaped.
                let pushed = unsafe { ring.submission().push(&e) };
                if pushed.is_err() {
                    // queue full: do it synchronously
                    ops[oi] = None;
                    complete(sh, &mut jobs, ji, read_op(sh, &job, r));
                } else {
                    inflight += 1;
                }
            }
        }
        if inflight == 0 {
            if closed {
                return;
            }
            continue;
        }
        if ring.submit_and_wait(1).is_err() {
            // the ring broke: finish what is in flight synchronously, then stop using it
            for o in ops.iter_mut().filter_map(Option::take) {
                let job = jobs[o.job].as_ref().map(|p| Job {
                    slot: p.job.slot,
                    key: p.job.key,
                });
                if let Some(job) = job {
                    let r = read_op(sh, &job, &o.read);
                    complete(sh, &mut jobs, o.job, r);
                }
            }
            return super::io_worker(sh, rx);
        }
        let done: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (ud, res) in done {
            inflight -= 1;
            let Some(o) = ops.get_mut(ud as usize).and_then(Option::take) else {
                continue;
            };
            let job = match jobs[o.job].as_ref() {
                Some(p) => Job {
                    slot: p.job.slot,
                    key: p.job.key,
                },
                None => continue,
            };
            let r = if res >= 0 && res as usize >= o.need {
                Ok(o.read.len as usize)
            } else {
                // short read, refused direct I/O, or an error: the portable path decides
                read_op(sh, &job, &o.read)
            };
            complete(sh, &mut jobs, o.job, r);
        }
    }
}

fn complete(sh: &Shared, jobs: &mut [Option<Pending>], ji: usize, r: crate::error::Result<usize>) {
    let Some(p) = jobs[ji].as_mut() else { return };
    match r {
        Ok(n) => p.bytes += n,
        Err(e) => {
            if p.err.is_none() {
                p.err = Some(e);
            }
        }
    }
    p.left -= 1;
    if p.left == 0 {
        let p = jobs[ji].take().expect("checked above");
        let res = match p.err {
            Some(e) => Err(e),
            None => check_scales(sh, &p.job).map(|_| p.bytes),
        };
        finish_job(sh, &p.job, res, p.t0);
    }
}

fn free_index<T>(v: &mut Vec<Option<T>>) -> usize {
    match v.iter().position(Option::is_none) {
        Some(i) => i,
        None => {
            v.push(None);
            v.len() - 1
        }
    }
}
