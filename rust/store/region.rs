//! The expert cache's memory: one anonymous mapping of fixed-size slots, allocated once from
//! the budget. On Linux it asks for transparent huge pages; a background thread pre-faults
//! the slots (touching each page) so first-touch page faults never land on the decode path.
//! A slot is handed out only after it has been pre-faulted, so the toucher never writes into
//! a slot that holds data.

use memmap2::{MmapMut, MmapOptions};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub const ALIGN: usize = 4096;

pub struct Region {
    map: MmapMut,
    ptr: *mut u8,
    pub slot_size: usize,
    pub n_slots: usize,
    /// Slots [0, faulted) are pre-faulted and may be handed out.
    faulted: AtomicUsize,
}

// SAFETY: the region is plain memory; which thread may touch which slot is decided by the
// store's state machine under its mutex (a slot is written only while Loading by exactly one
// I/O thread, and read only while Ready and pinned), and by `faulted` for the pre-fault thread.
unsafe impl Sync for Region {}
// SAFETY: as above; the pointer stays valid for the lifetime of `map`, which moves with it.
unsafe impl Send for Region {}

impl Region {
    pub fn new(slot_size: usize, n_slots: usize) -> std::io::Result<Region> {
        debug_assert!(slot_size % ALIGN == 0);
        let len = (slot_size * n_slots).max(ALIGN);
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
            faulted: AtomicUsize::new(0),
        })
    }

    pub fn bytes(&self) -> usize {
        self.map.len()
    }

    /// Number of slots ready to be handed out.
    pub fn faulted(&self) -> usize {
        self.faulted.load(Ordering::Acquire)
    }

    /// Pre-faults one more slot (the next not yet faulted) on the calling thread; returns
    /// false when all are done. Only the owner of `faulted` progress may call this (the
    /// pre-fault thread, or the store under its lock when it needs a slot right now).
    pub fn fault_next(&self) -> bool {
        let i = self.faulted.load(Ordering::Acquire);
        if i >= self.n_slots {
            return false;
        }
        // SAFETY: slot i >= faulted has never been handed out, so nobody else touches it;
        // the pointer arithmetic stays inside the mapping (i < n_slots).
        unsafe {
            let base = self.ptr.add(i * self.slot_size);
            let mut off = 0;
            while off < self.slot_size {
                std::ptr::write_volatile(base.add(off), 0u8);
                off += ALIGN;
            }
        }
        self.faulted.store(i + 1, Ordering::Release);
        true
    }

    /// # Safety
    /// The caller must hold exclusive access to slot `i` (state Loading, owned by this
    /// I/O job) and `i < faulted()`.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slot_mut(&self, i: usize) -> &mut [u8] {
        debug_assert!(i < self.n_slots);
        // SAFETY: guaranteed by the caller (exclusive access, in bounds).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i * self.slot_size), self.slot_size) }
    }

    /// # Safety
    /// The caller must hold a pin on slot `i` in state Ready (no writer can exist).
    pub unsafe fn slot(&self, i: usize) -> &[u8] {
        debug_assert!(i < self.n_slots);
        // SAFETY: guaranteed by the caller (pinned and Ready, in bounds).
        unsafe { std::slice::from_raw_parts(self.ptr.add(i * self.slot_size), self.slot_size) }
    }
}

/// Starts the background pre-fault of all slots; the store may also fault on demand.
/// Both paths serialise on `lock` so `fault_next` never runs twice for the same slot.
pub fn spawn_prefault(region: Arc<Region>, lock: Arc<std::sync::Mutex<()>>) {
    std::thread::Builder::new()
        .name("v4flash-prefault".into())
        .spawn(move || loop {
            lower_priority_once();
            let g = lock.lock().unwrap_or_else(|p| p.into_inner());
            let more = region.fault_next();
            drop(g);
            if !more {
                break;
            }
        })
        .ok();
}

/// Runs the pre-fault at idle priority: first-touch zeroing of a large cache costs seconds of
/// CPU (tens of seconds in some VMs), and on a machine with few cores it must only use cycles
/// that compute leaves idle (waits on disk, the user typing), never slow a prefill or decode.
fn lower_priority_once() {
    thread_local! {
        static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if DONE.with(|d| d.replace(true)) {
        return;
    }
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
