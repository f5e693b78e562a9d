//! The expert cache's memory: one anonymous mapping of fixed-size slots, allocated once from
//! the budget. On Linux it asks for transparent huge pages; a background thread pre-faults
//! the slots (touching each page) at idle priority so that first-touch page faults do not
//! land on the decode path.
//!
//! Who may touch which slot's bytes is decided per slot by a small atomic claim, so the
//! pre-fault can never write into a slot that holds data and the store never waits for the
//! pre-fault:
//!
//! ```text
//! UNTOUCHED --pre-fault thread CAS--> FAULTING --(zeroes every page)--> DONE
//! UNTOUCHED --store CAS (claim)--------------------------------------> DONE
//! ```
//!
//! Only the pre-fault thread writes a FAULTING slot; once a slot is DONE the pre-fault never
//! touches it again and the store owns it (which of its jobs may write it is the store's
//! slot state machine). A slot the store claims before the pre-fault reached it is faulted
//! by the read that fills it: slower once, never wrong, never a wait.
//!
//! While the pre-fault runs (`cold`), the store prefers DONE ("warm") slots: it evicts a warm
//! slot rather than claim an untouched one, and keeps its waves within the warm slots
//! (`ExpertStore::max_batch`), claiming only what the warm slots can never provide. First
//! touch can cost far more than the read that fills the slot: on a VM whose host backs guest
//! memory lazily it ran at 0.1 GB/s (126 ms for one 12.6 MB slot, against 8 ms to read the
//! expert from disk), and a prefill started right after `load` paid that for every slot.

use memmap2::{MmapMut, MmapOptions};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

pub const ALIGN: usize = 4096;

const UNTOUCHED: u8 = 0;
const FAULTING: u8 = 1;
const DONE: u8 = 2;

pub struct Region {
    map: MmapMut,
    ptr: *mut u8,
    pub slot_size: usize,
    pub n_slots: usize,
    /// Per slot: UNTOUCHED, FAULTING or DONE (see the module comment).
    touch: Vec<AtomicU8>,
    /// Slots the pre-fault thread has finished.
    prefaulted: AtomicUsize,
    /// Set when the store goes away: the pre-fault thread stops at its next page batch.
    stop: AtomicBool,
    /// Slots that are DONE (pre-faulted, or claimed by the store).
    warm: AtomicUsize,
    /// Whether the pre-fault thread is running.
    prefaulting: AtomicBool,
}

// SAFETY: the region is plain memory. Which thread may touch which slot's bytes is decided
// by the per-slot claim above (the pre-fault thread only writes FAULTING slots, which nobody
// else can obtain) and, for claimed slots, by the store's state machine under its mutex (a
// byte range is written only by the one I/O job that owns the slot while it is Loading, and
// read only while the slot is Ready and pinned).
unsafe impl Sync for Region {}
// SAFETY: as above; the pointer stays valid for the lifetime of `map`, which moves with it.
unsafe impl Send for Region {}

impl Region {
    pub fn new(slot_size: usize, n_slots: usize) -> std::io::Result<Region> {
        debug_assert!(slot_size % ALIGN == 0);
        let len = slot_size
            .checked_mul(n_slots)
            .ok_or_else(|| std::io::Error::other("expert cache size overflows"))?
            .max(ALIGN);
        let mut map = MmapOptions::new().len(len).map_anon()?;
        #[cfg(target_os = "linux")]
        {
            // Best effort: transparent huge pages cut TLB misses and fault counts.
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        let ptr = map.as_mut_ptr();
        Ok(Region {
            map,
            ptr,
            slot_size,
            n_slots,
            touch: (0..n_slots).map(|_| AtomicU8::new(UNTOUCHED)).collect(),
            prefaulted: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            warm: AtomicUsize::new(0),
            prefaulting: AtomicBool::new(false),
        })
    }

    pub fn bytes(&self) -> usize {
        self.map.len()
    }

    /// Slots the background pre-fault has finished.
    pub fn prefaulted(&self) -> usize {
        self.prefaulted.load(Ordering::Acquire)
    }

    /// Whether the store can use slot `i` now: true once it is DONE; an UNTOUCHED slot is
    /// claimed (made DONE) on the spot. False only while the pre-fault thread is zeroing it.
    pub fn claim(&self, i: usize) -> bool {
        match self.touch[i].compare_exchange(UNTOUCHED, DONE, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                self.warm.fetch_add(1, Ordering::AcqRel);
                true
            }
            Err(s) => s == DONE,
        }
    }

    /// Whether slot `i` is being zeroed by the pre-fault thread right now (unusable for a
    /// moment; at most one slot at a time).
    pub fn is_faulting(&self, i: usize) -> bool {
        self.touch[i].load(Ordering::Acquire) == FAULTING
    }

    /// Whether slot `i` has been touched already (DONE), so using it costs no page faults.
    pub fn is_warm(&self, i: usize) -> bool {
        self.touch[i].load(Ordering::Acquire) == DONE
    }

    /// Asks the pre-fault thread to stop (the store is going away).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Pre-faults slot `i` if nobody has claimed it yet; returns whether it did. Stops early
    /// (leaving the slot DONE but partly untouched) when `stop()` was called.
    fn prefault_slot(&self, i: usize) -> bool {
        if self.touch[i]
            .compare_exchange(UNTOUCHED, FAULTING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        let mut off = 0;
        while off < self.slot_size {
            if off % (64 * ALIGN) == 0 && self.stop.load(Ordering::Relaxed) {
                break;
            }
            // SAFETY: slot i is FAULTING, which only this thread could make it (the CAS
            // above), so no other thread reads or writes its bytes until it becomes DONE
            // below; off < slot_size keeps the write inside slot i of the mapping.
            unsafe { std::ptr::write_volatile(self.ptr.add(i * self.slot_size + off), 0u8) };
            off += ALIGN;
        }
        self.touch[i].store(DONE, Ordering::Release);
        self.warm.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Whether the background pre-fault is running (false once it has ended, and when it was
    /// never started: `V4FLASH_PREFAULT=0`).
    pub fn prefaulting(&self) -> bool {
        self.prefaulting.load(Ordering::Acquire)
    }

    /// Slots that are DONE (pre-faulted, or claimed by the store).
    pub fn warm_slots(&self) -> usize {
        self.warm.load(Ordering::Acquire)
    }

    /// Whether the pre-fault is still running with slots left to touch: the store then
    /// keeps to the warm slots where it can (see the module comment).
    pub fn cold(&self) -> bool {
        self.prefaulting.load(Ordering::Acquire) && self.warm_slots() < self.n_slots
    }

    /// Test hook: behave as if a pre-fault were running (or not) without a thread, so
    /// the store's cold-cache rules can be checked deterministically.
    #[cfg(test)]
    pub fn pretend_prefaulting(&self, on: bool) {
        self.prefaulting.store(on, Ordering::Release);
    }

    /// The bytes [start, start+len) of slot `i`, for writing.
    ///
    /// # Safety
    /// The caller must own that byte range exclusively for the lifetime of the slice: slot
    /// `i` is claimed and Loading for the caller's job, and no other read of the job targets
    /// an overlapping range (the envelopes of one expert's reads are disjoint).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn range_mut(&self, i: usize, start: usize, len: usize) -> &mut [u8] {
        assert!(
            i < self.n_slots && start + len <= self.slot_size,
            "slot range out of bounds"
        );
        // SAFETY: in bounds (checked above); exclusivity is guaranteed by the caller.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i * self.slot_size + start), len) }
    }

    /// A raw pointer to byte `start` of slot `i`, for the kernel to write into (io_uring).
    pub fn ptr_at(&self, i: usize, start: usize) -> *mut u8 {
        assert!(
            i < self.n_slots && start <= self.slot_size,
            "slot offset out of bounds"
        );
        // SAFETY: in bounds of the mapping (checked above); no reference is created.
        unsafe { self.ptr.add(i * self.slot_size + start) }
    }

    /// The bytes [start, start+len) of slot `i`, for reading.
    ///
    /// # Safety
    /// No writer of that range may exist for the lifetime of the slice: slot `i` is Ready
    /// and pinned, or Loading with every read of its job completed.
    pub unsafe fn range(&self, i: usize, start: usize, len: usize) -> &[u8] {
        assert!(
            i < self.n_slots && start + len <= self.slot_size,
            "slot range out of bounds"
        );
        // SAFETY: in bounds (checked above); no writer, guaranteed by the caller.
        unsafe { std::slice::from_raw_parts(self.ptr.add(i * self.slot_size + start), len) }
    }
}

/// Starts the background pre-fault of all slots (in order, skipping slots the store has
/// claimed already). `on_slot` runs after each slot it finishes and once more when it ends
/// (the store wakes callers waiting for a slot). The thread holds the region until it is
/// done or `stop()` is called.
pub fn spawn_prefault(
    region: Arc<Region>,
    on_slot: impl Fn() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    region.prefaulting.store(true, Ordering::Release);
    let r = region.clone();
    let h = std::thread::Builder::new()
        .name("v4flash-prefault".into())
        .spawn(move || {
            lower_priority();
            for i in 0..region.n_slots {
                if region.stop.load(Ordering::Acquire) {
                    break;
                }
                if region.prefault_slot(i) {
                    region.prefaulted.fetch_add(1, Ordering::AcqRel);
                    on_slot();
                }
            }
            region.prefaulting.store(false, Ordering::Release);
            // waiters keeping to the warm slots look again now that the cache is not cold
            on_slot();
        });
    if h.is_err() {
        r.prefaulting.store(false, Ordering::Release);
    }
    h
}

/// Runs the pre-fault at idle priority: first-touch zeroing of a large cache costs seconds of
/// CPU (tens of seconds in some VMs), and on a machine with few cores it must only use cycles
/// that compute leaves idle (waits on disk, the user typing), never slow a prefill or decode.
/// Nothing ever waits for it (see the module comment), so starving it is harmless.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sets the calling thread's (pid 0 = self) scheduling policy with a valid,
        // initialised parameter struct; failure is harmless (the thread keeps its policy).
        let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
        if r != 0 {
            // SAFETY: on Linux nice(2) changes only the calling thread; failure is harmless.
            unsafe {
                libc::nice(19);
            }
        }
    }
    // elsewhere the pre-fault keeps the default priority (macOS nice is per process)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claimed_slots_are_never_touched_by_the_prefault() {
        let r = Arc::new(Region::new(4 * ALIGN, 8).unwrap());
        // the store claims and fills slots 5 and 6 before the pre-fault starts
        for i in [5, 6] {
            assert!(r.claim(i));
            // SAFETY: claimed above, single-threaded here.
            unsafe { r.range_mut(i, 0, 4 * ALIGN) }.fill(0xAB);
        }
        assert_eq!(r.warm_slots(), 2);
        assert!(!r.cold(), "no pre-fault running yet");
        let h = spawn_prefault(r.clone(), || {}).unwrap();
        h.join().unwrap();
        assert_eq!(r.prefaulted(), 6);
        assert_eq!(r.warm_slots(), 8);
        assert!(!r.cold(), "the pre-fault has ended");
        for i in 0..8 {
            assert!(r.claim(i));
            // SAFETY: the pre-fault thread has ended.
            let b = unsafe { r.range(i, 0, 4 * ALIGN) };
            let want = if i == 5 || i == 6 { 0xAB } else { 0 };
            assert!(b.iter().all(|&x| x == want), "slot {i}");
        }
    }

    #[test]
    fn prefault_stops_when_asked_and_releases_the_region() {
        // 1 GiB of slots: far more than can be touched before stop() below
        let r = Arc::new(Region::new(256 * ALIGN, 1024).unwrap());
        let h = spawn_prefault(r.clone(), || {}).unwrap();
        assert!(r.cold(), "running, with slots left");
        r.stop();
        h.join().unwrap();
        assert!(r.prefaulted() < r.n_slots);
        assert!(
            !r.cold(),
            "stopped: the store may claim untouched slots again"
        );
        assert_eq!(Arc::strong_count(&r), 1, "the thread dropped its handle");
    }

    #[test]
    fn a_faulting_slot_is_not_claimable_until_done() {
        let r = Region::new(ALIGN, 2).unwrap();
        r.touch[1].store(FAULTING, Ordering::Release);
        assert!(!r.claim(1));
        assert!(r.is_faulting(1));
        r.touch[1].store(DONE, Ordering::Release);
        assert!(r.claim(1) && r.is_warm(1));
        assert!(r.claim(0));
    }
}
