//! Linux io_uring engine: one thread keeps up to `QUEUE_DEPTH` expert reads in flight on a
//! ring, direct I/O into the slots. Anything unusual about one read (a short read, a refused
//! direct read, an error) is redone synchronously by the portable path, which knows how to
//! fall back and how to word the error, so the fast path stays simple.
//!
//! The kernel writes into a slot from the moment a read is submitted until its completion
//! is reaped, so a slot's job is finished (and the slot can become Ready, be evicted and
//! reused) only after every one of its completions has been reaped:
//! - a wait interrupted by a signal (EINTR) or told to retry (EAGAIN, EBUSY) is retried;
//!   nothing is submitted twice (the kernel consumes queued entries exactly once);
//! - on a real failure of the ring, every read still in flight is cancelled and reaped
//!   before anything else happens; the reaped reads are redone synchronously; reads that
//!   cannot be reaped leave their slots quarantined (never reused, the memory never
//!   unmapped); then this thread becomes a pread worker and more are started, and the
//!   store reports the engine that actually runs.

use super::layout::ReadOp;
use super::slots::{Job, Shared};
use super::worker::{check_scales, io_worker, read_op, record_time};
use crate::error::Error;
use io_uring::{opcode, types, IoUring};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Reads in flight at once.
pub const QUEUE_DEPTH: usize = 32;

/// user_data of the cancel request (never an op index).
const CANCEL_TAG: u64 = u64::MAX;

/// Tries to create a ring; None where the kernel or a sandbox refuses io_uring.
pub fn try_ring() -> Option<IoUring> {
    ring().ok()
}

/// The engine's ring: twice `QUEUE_DEPTH` entries.
fn ring() -> std::io::Result<IoUring> {
    IoUring::new((QUEUE_DEPTH * 2) as u32)
}

/// Whether the engine can have its ring here (it asks for one as the engine does and lets it
/// go), and if not, why.
pub fn probe() -> (bool, String) {
    match ring() {
        Ok(_) => (true, "available".into()),
        Err(e) => (false, refusal(&e, sysctl_disabled().as_deref())),
    }
}

/// `kernel.io_uring_disabled`, where the kernel has it.
fn sysctl_disabled() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .ok()
        .map(|s| s.trim().to_string())
}

/// Why the kernel refused a ring (`e`), for `doctor`; `sysctl` is `kernel.io_uring_disabled`.
fn refusal(e: &std::io::Error, sysctl: Option<&str>) -> String {
    match e.raw_os_error() {
        Some(libc::ENOSYS) => {
            "this kernel has no io_uring (Linux before 5.1, or built without it)".into()
        }
        Some(libc::EPERM) => {
            let why = match sysctl {
                Some(v) if !v.is_empty() && v != "0" => format!("kernel.io_uring_disabled = {v}"),
                _ => "a container's seccomp profile, most likely".into(),
            };
            format!("refused by the system ({why})")
        }
        _ => format!("io_uring_setup failed: {e}"),
    }
}

struct Pending {
    job: Job,
    /// reads of the job not completed yet
    left: usize,
    bytes: usize,
    err: Option<Error>,
    t0: Instant,
}

struct Op {
    job: usize,
    read: ReadOp,
    /// bytes of the envelope that must arrive for the read to be complete
    need: usize,
}

struct Engine<'a> {
    sh: &'a Shared,
    ring: IoUring,
    jobs: Vec<Option<Pending>>,
    ops: Vec<Option<Op>>,
    inflight: usize,
}

pub(crate) fn uring_worker(
    sh: Arc<Shared>,
    rx: Arc<Mutex<mpsc::Receiver<Job>>>,
    ring: IoUring,
    io_threads: usize,
) {
    let mut en = Engine {
        sh: &sh,
        ring,
        jobs: Vec::new(),
        ops: Vec::new(),
        inflight: 0,
    };
    let mut closed = false;
    loop {
        // take new jobs while there is room in the queue
        while en.inflight < QUEUE_DEPTH && !closed {
            let next = {
                let r = rx.lock().unwrap_or_else(|p| p.into_inner());
                if en.inflight == 0 {
                    r.recv().map_err(|_| TryRecvError::Disconnected)
                } else {
                    r.try_recv()
                }
            };
            match next {
                Ok(job) => en.start(job),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => closed = true,
            }
        }
        if en.inflight == 0 {
            if closed {
                return;
            }
            continue;
        }
        match en.wait() {
            Ok(()) => en.reap(),
            Err(e) => {
                // the engine the store reports is the one that runs from now on: named before
                // `abandon` finishes the reaped jobs, so a caller woken by them sees it
                sh.set_engine(format!("pread-pool (io_uring failed: {e})"));
                en.abandon(&e);
                // become a pread worker, with company
                for w in 1..io_threads.max(1) {
                    let (sh2, rx2) = (sh.clone(), rx.clone());
                    let _ = std::thread::Builder::new()
                        .name(format!("v4flash-io-{w}"))
                        .spawn(move || io_worker(&sh2, &rx2));
                }
                drop(en);
                return io_worker(&sh, &rx);
            }
        }
    }
}

fn transient(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::Interrupted
        || matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EBUSY))
}

impl Engine<'_> {
    /// Queues every read of a job (or does it synchronously when it cannot be queued).
    fn start(&mut self, job: Job) {
        let sh = self.sh;
        let lay = &sh.layouts[job.key as usize];
        let ji = free_index(&mut self.jobs);
        self.jobs[ji] = Some(Pending {
            job,
            left: lay.reads.len(),
            bytes: 0,
            err: None,
            t0: Instant::now(),
        });
        for r in &lay.reads {
            let f = &sh.files[r.shard as usize];
            if f.is_degraded() || r.len > u32::MAX as u64 / 2 {
                // after a fault (or for an implausibly large range) use the portable path
                let res = read_op(sh, &job, r);
                self.complete(ji, res);
                continue;
            }
            let (fd, direct) = f.raw_fd();
            let (off, len, dst, need) = if direct {
                let d = r.delta();
                (r.offset - d as u64, r.envelope(), r.dst, d + r.len as usize)
            } else {
                (r.offset, r.len as usize, r.dst + r.delta(), r.len as usize)
            };
            let oi = free_index(&mut self.ops);
            self.ops[oi] = Some(Op {
                job: ji,
                read: *r,
                need,
            });
            let ptr = sh.region.ptr_at(job.slot, dst);
            let e = opcode::Read::new(types::Fd(fd), ptr, len as u32)
                .offset(off)
                .build()
                .user_data(oi as u64);
            // SAFETY: the kernel writes [ptr, ptr+len) until this op's completion is reaped:
            // the range is this read's envelope in a slot that is Loading for this job and
            // stays so until every completion of the job is reaped (`complete`); envelopes
            // of one job are disjoint; the region is never unmapped while a read may be in
            // flight (the worker holds the store's `Shared`, and `abandon` leaks the region
            // when it cannot reap); the fd stays open as long as `Shared.files`.
            let pushed = unsafe { self.ring.submission().push(&e) };
            if pushed.is_err() {
                // queue full: do it synchronously
                self.ops[oi] = None;
                let res = read_op(sh, &job, r);
                self.complete(ji, res);
            } else {
                self.inflight += 1;
            }
        }
    }

    /// Submits what is queued and waits for at least one completion, retrying waits that
    /// a signal interrupted or the kernel asked to retry.
    fn wait(&mut self) -> std::io::Result<()> {
        loop {
            #[cfg(test)]
            if self
                .sh
                .fail_submits
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(std::io::Error::from_raw_os_error(libc::EIO));
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => return Ok(()),
                Err(e) if transient(&e) => {
                    self.sh
                        .counters
                        .uring_interrupts
                        .fetch_add(1, Ordering::Relaxed);
                    if !self.ring.completion().is_empty() {
                        return Ok(());
                    }
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        // out of resources for a moment: let in-flight reads progress
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Handles every available completion.
    fn reap(&mut self) {
        let done: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (ud, res) in done {
            if ud == CANCEL_TAG {
                continue;
            }
            let Some(o) = self.ops.get_mut(ud as usize).and_then(Option::take) else {
                continue;
            };
            self.inflight -= 1;
            let Some(job) = self.jobs[o.job].as_ref().map(|p| p.job) else {
                continue;
            };
            let r = if res >= 0 && res as usize >= o.need {
                Ok(o.read.len as usize)
            } else {
                // short read, refused direct I/O, cancelled, or an error: the portable path
                // decides (the kernel is done with this range: its completion is reaped)
                read_op(self.sh, &job, &o.read)
            };
            self.complete(o.job, r);
        }
    }

    /// After a real ring failure: cancel and reap everything in flight, then (only then)
    /// finish the affected jobs; quarantine what cannot be reaped.
    fn abandon(&mut self, why: &std::io::Error) {
        let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any())
            .build()
            .user_data(CANCEL_TAG);
        // SAFETY: a cancel request references no user memory.
        let _ = unsafe { self.ring.submission().push(&cancel) };
        for _ in 0..100 {
            if self.inflight == 0 {
                break;
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => self.reap(),
                Err(e) if transient(&e) => self.reap(),
                Err(_) => {
                    self.reap();
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        if self.inflight == 0 {
            return;
        }
        // The kernel may still write into these slots: take them out of service for good
        // and never unmap the region (it is leaked below), whatever happens to the store.
        let mut lost: Vec<usize> = self.ops.iter().flatten().map(|o| o.job).collect();
        lost.sort_unstable();
        lost.dedup();
        for ji in lost {
            if let Some(p) = self.jobs[ji].take() {
                self.sh.quarantine(&p.job, &why.to_string());
            }
        }
        std::mem::forget(self.sh.region.clone());
        self.ops.clear();
        self.inflight = 0;
    }

    fn complete(&mut self, ji: usize, r: crate::error::Result<usize>) {
        let Some(p) = self.jobs[ji].as_mut() else {
            return;
        };
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
            let Some(p) = self.jobs[ji].take() else {
                return;
            };
            let res = match p.err {
                Some(e) => Err(e),
                None => check_scales(self.sh, &p.job).map(|_| p.bytes),
            };
            record_time(self.sh, p.t0);
            self.sh.finish(&p.job, res);
        }
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

#[cfg(test)]
mod probe_tests {
    use super::*;

    #[test]
    fn refusals_say_why() {
        let err = |n| std::io::Error::from_raw_os_error(n);
        assert!(refusal(&err(libc::ENOSYS), None).contains("this kernel has no io_uring"));
        assert_eq!(
            refusal(&err(libc::EPERM), Some("2")),
            "refused by the system (kernel.io_uring_disabled = 2)"
        );
        assert!(refusal(&err(libc::EPERM), Some("0")).contains("seccomp"));
        assert!(refusal(&err(libc::ENOMEM), None).starts_with("io_uring_setup failed: "));
        let (ok, why) = probe();
        assert!(!why.is_empty() && (ok == (why == "available")));
    }
}
