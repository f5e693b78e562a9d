//! The routed-expert store: every expert of every layer located in the checkpoint at open
//! time (headers only), and two backends behind one interface:
//! - **slots** (`--io direct|buffered`, the default): fixed-size slots allocated once from
//!   the memory budget; reads for all of a layer's selected experts are issued as soon as
//!   routing is known and completed by the I/O engine (io_uring, or a pool of pread
//!   threads), so computation starts on the first expert that arrives;
//! - **mmap** (`--io mmap`): experts used in place from the mapped shards.
//!
//! Results never depend on the cache: a freshly read expert and a cached one are the same
//! bytes in the same layout, run through the same kernels.
//!
//! Module map: `layout` (where experts are, how they land in a slot), `region` (the slots'
//! memory and its pre-fault), `slots` (the slot state machine and the admission of callers,
//! with the argument why it cannot deadlock), `worker` (pread engine, scale check), `uring`
//! (io_uring engine), `mmap` (mmap backend), `io` (shard handles, direct I/O), `win`
//! (Windows unbuffered reads), `policy` (eviction).

pub mod io;
pub mod layout;
mod mmap;
pub mod policy;
pub mod region;
mod slots;
#[cfg(test)]
mod tests;
#[cfg(target_os = "linux")]
mod uring;
#[cfg(windows)]
mod win;
mod worker;

use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::kernels::{MatRef, Weights};
use io::{IoMode, ShardFile};
use mmap::MmapStore;
use policy::Policy;
use region::Region;
use slots::{Job, Shared};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

pub use layout::slot_size;

/// Whether `--io direct` reads experts with io_uring here, and why not: asks the kernel for a
/// ring as the engine does (`doctor`). None where it cannot be asked.
pub fn io_uring_probe(t: &crate::tuning::Tuning) -> (Option<bool>, String) {
    if !t.io_uring {
        return (Some(false), "turned off by V4FLASH_IO_URING=0".into());
    }
    #[cfg(target_os = "linux")]
    {
        let (ok, why) = uring::probe();
        (Some(ok), why)
    }
    #[cfg(not(target_os = "linux"))]
    {
        (
            Some(false),
            format!("Linux only (this is {})", std::env::consts::OS),
        )
    }
}

/// The smallest wave `max_batch` allows while the cache is cold: a decode step's experts for
/// one layer (6 for DeepSeek V4 Flash) and a prefill's waves fit without claiming untouched
/// slots once this many are warm.
const COLD_WAVE_MIN: usize = 16;

#[derive(Default)]
pub struct StoreCounters {
    pub requests: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    /// Experts read ahead of their request (hash layers).
    pub prefetches: AtomicU64,
    /// Requests served by a prefetched read (counted as misses too).
    pub prefetch_used: AtomicU64,
    pub bytes_read: AtomicU64,
    /// time the I/O threads spent reading
    pub read_ns: AtomicU64,
    /// time compute spent waiting for reads
    pub wait_ns: AtomicU64,
    /// io_uring waits interrupted by a signal (EINTR) or told to retry (EAGAIN/EBUSY),
    /// and retried.
    pub uring_interrupts: AtomicU64,
}

pub struct StoreOptions {
    pub slots: usize,
    pub io: IoMode,
    pub policy: Policy,
    pub io_threads: usize,
    /// Pre-fault the slots in the background (at idle priority).
    pub prefault: bool,
    /// Direct reads through io_uring where the kernel allows (Linux), else a pread pool.
    pub io_uring: bool,
}

/// The slot backend: the shared state, the job queue and the I/O threads.
struct SlotStore {
    sh: Arc<Shared>,
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

enum Backend {
    Slots(SlotStore),
    Mmap(MmapStore),
}

pub struct ExpertStore {
    backend: Backend,
    counters: Arc<StoreCounters>,
    pub n_experts: usize,
    pub n_layers: usize,
    inter: usize,
    hidden: usize,
    pub slot_size: usize,
    pub n_slots: usize,
    pub expert_bytes: usize,
    pub mode: IoMode,
    pub policy: Policy,
}

/// A pinned expert: its slot cannot be evicted until the pin is released or dropped. Its
/// weights can be viewed once `wait_ready` (or `take_ready`) has returned it, until then.
pub struct Pin<'a> {
    store: &'a ExpertStore,
    /// the slot (slot backend) or the expert key (mmap backend)
    slot: usize,
    key: u32,
    pub expert: usize,
    ready: bool,
    /// still pinned (cleared by `release`)
    held: bool,
}

impl Pin<'_> {
    /// Unpins now rather than at drop, once the caller is done with the expert's weights:
    /// its slot may then be given to another expert (a prefetch of what comes next) while
    /// the rest of the wave is still read or computed. A released pin can no longer be
    /// viewed, and `wait_ready` never returns it (it was returned already, or is abandoned).
    pub fn release(&mut self) {
        if std::mem::take(&mut self.held) {
            self.ready = true;
            self.store.unpin(self.slot);
        }
    }
}

/// An expert's weights, borrowed from its slot (or from the mapped shard).
pub struct ExpertView<'a> {
    parts: [&'a [u8]; 6],
    inter: usize,
    hidden: usize,
}

impl ExpertView<'_> {
    /// Part pair k (weight 2k, scale 2k+1) as an FP4 matrix [rows, cols].
    fn fp4(&self, k: usize, rows: usize, cols: usize) -> MatRef<'_> {
        MatRef {
            rows,
            cols,
            w: Weights::Fp4 {
                q: self.parts[2 * k],
                scale: self.parts[2 * k + 1],
            },
        }
    }
    /// w1 (gate) [I, H]
    pub fn w1(&self) -> MatRef<'_> {
        self.fp4(0, self.inter, self.hidden)
    }
    /// w3 (up) [I, H]
    pub fn w3(&self) -> MatRef<'_> {
        self.fp4(1, self.inter, self.hidden)
    }
    /// w2 (down) [H, I]
    pub fn w2(&self) -> MatRef<'_> {
        self.fp4(2, self.hidden, self.inter)
    }
}

fn thread_error(what: &str, e: std::io::Error) -> Error {
    Error::System(format!("cannot start {what}: {e}"))
}

impl ExpertStore {
    /// Locates and checks (dtype, shape) every routed expert tensor without reading data,
    /// and starts the backend.
    pub fn open(ck: Arc<Checkpoint>, c: &ModelConfig, opts: &StoreOptions) -> Result<ExpertStore> {
        Self::open_blocks(ck, c, layout::Blocks::of_model(c), opts)
    }

    /// `open` for the routed experts of `blocks` (a drafter's stages have a store of their
    /// own: its cache never evicts the model's experts): "layer" `l` of every call is block
    /// `l` of the list.
    pub fn open_blocks(
        ck: Arc<Checkpoint>,
        c: &ModelConfig,
        blocks: layout::Blocks,
        opts: &StoreOptions,
    ) -> Result<ExpertStore> {
        let (layouts, slot_size) = layout::plan_blocks(&ck, c, &blocks, true)?;
        let n_layers = blocks.len();
        let expert_bytes = layouts
            .first()
            .map_or(0, |l| l.files.iter().map(|p| p.len as usize).sum());
        let layouts = Arc::new(layouts);
        let n_total = layouts.len();
        let counters = Arc::new(StoreCounters::default());
        let mode = opts.io;
        let (backend, n_slots) = if mode == IoMode::Mmap {
            (Backend::Mmap(MmapStore::open(&ck, layouts, blocks)?), 0)
        } else {
            let n = opts.slots.clamp(1, n_total.max(1));
            let mut files = Vec::with_capacity(ck.shards.len());
            for s in &ck.shards {
                files.push(ShardFile::open(&s.path, &s.file_name, mode)?);
            }
            let region = Region::new(slot_size, n).map_err(|e| {
                Error::Memory(format!(
                    "cannot allocate the expert cache ({n} slots of {:.1} MB): {e}",
                    slot_size as f64 / 1e6
                ))
            })?;
            let sh = Arc::new(Shared::new(
                ck.clone(),
                files,
                layouts,
                Arc::new(region),
                counters.clone(),
                blocks,
                opts.policy,
            ));
            (Backend::Slots(SlotStore::start(sh, mode, opts)?), n)
        };
        Ok(ExpertStore {
            backend,
            counters,
            n_experts: c.n_routed_experts,
            n_layers,
            inter: c.moe_inter,
            hidden: c.hidden_size,
            slot_size,
            n_slots,
            expert_bytes,
            mode,
            policy: opts.policy,
        })
    }

    pub fn counters(&self) -> &StoreCounters {
        &self.counters
    }

    /// The read engine that runs now: "io_uring", "pread-pool", "mmap", or
    /// "pread-pool (io_uring failed: …)" after a ring failure.
    pub fn engine(&self) -> String {
        match &self.backend {
            Backend::Slots(s) => s.sh.engine(),
            Backend::Mmap(_) => "mmap".into(),
        }
    }

    /// Slots the background pre-fault has finished.
    pub fn prefaulted(&self) -> usize {
        match &self.backend {
            Backend::Slots(s) => s.sh.region.prefaulted(),
            Backend::Mmap(_) => 0,
        }
    }

    /// Whether the background pre-fault is still running.
    pub fn prefault_running(&self) -> bool {
        match &self.backend {
            Backend::Slots(s) => s.sh.region.prefaulting(),
            Backend::Mmap(_) => false,
        }
    }

    /// Slots touched already (pre-faulted, or claimed by a read).
    pub fn warm_slots(&self) -> usize {
        match &self.backend {
            Backend::Slots(s) => s.sh.region.warm_slots(),
            Backend::Mmap(_) => 0,
        }
    }

    pub fn region_bytes(&self) -> usize {
        match &self.backend {
            Backend::Slots(s) => s.sh.region.bytes(),
            Backend::Mmap(_) => 0,
        }
    }

    /// The I/O mode as it runs: the mode asked for, or "buffered (direct I/O refused)" when
    /// the file system refused direct reads.
    pub fn mode_name(&self) -> &'static str {
        if self.mode == IoMode::Direct && !self.direct_io() {
            "buffered (direct I/O refused)"
        } else {
            self.mode.name()
        }
    }

    /// Whether reads currently use direct I/O (on every shard).
    pub fn direct_io(&self) -> bool {
        match &self.backend {
            Backend::Slots(s) => {
                self.mode == IoMode::Direct && s.sh.files.iter().all(|f| f.is_direct())
            }
            Backend::Mmap(_) => false,
        }
    }

    /// Marks the start of new tokens (ages the frequency counts).
    pub fn next_token(&self, n: u64) {
        if let Backend::Slots(s) = &self.backend {
            s.sh.next_token(n);
        }
    }

    /// The most experts one call should pin at once: every slot, except while the cache is
    /// cold (the pre-fault still running), when it is the warm slots (at least
    /// `COLD_WAVE_MIN`), so a wave's reads land in slots whose first-touch faults are paid
    /// already (`region` module comment). Read it once per wave plan: it grows as the
    /// pre-fault goes on. How experts are grouped into waves never changes a result.
    pub fn max_batch(&self) -> usize {
        match &self.backend {
            Backend::Slots(s) if s.sh.region.cold() => {
                s.sh.region
                    .warm_slots()
                    .max(COLD_WAVE_MIN)
                    .min(self.n_slots)
            }
            Backend::Slots(_) => self.n_slots,
            Backend::Mmap(_) => usize::MAX,
        }
    }

    fn key(&self, layer: usize, e: usize) -> u32 {
        (layer * self.n_experts + e) as u32
    }

    fn keys(&self, layer: usize, experts: &[usize]) -> Result<Vec<u32>> {
        if layer >= self.n_layers || experts.iter().any(|&e| e >= self.n_experts) {
            return Err(Error::arg(format!(
                "expert request out of range: layer {layer} (of {}), experts {experts:?} (of {})",
                self.n_layers, self.n_experts
            )));
        }
        let keys: Vec<u32> = experts.iter().map(|&e| self.key(layer, e)).collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != keys.len() {
            return Err(Error::arg(format!(
                "expert request with repeats: {experts:?}"
            )));
        }
        Ok(keys)
    }

    /// Pins the experts (distinct, at most `max_batch()`), issuing reads for the missing ones
    /// right away. Waits, holding no pins, until the whole set can be pinned; callers are
    /// served in arrival order. The caller must hold no other pins of this store (see
    /// `slots` for why this makes waiting finite).
    pub fn acquire(&self, layer: usize, experts: &[usize]) -> Result<Vec<Pin<'_>>> {
        let keys = self.keys(layer, experts)?;
        let slots = match &self.backend {
            Backend::Mmap(m) => {
                m.acquire(&keys)?;
                self.counters
                    .requests
                    .fetch_add(keys.len() as u64, Ordering::Relaxed);
                self.counters
                    .hits
                    .fetch_add(keys.len() as u64, Ordering::Relaxed);
                keys.iter().map(|&k| k as usize).collect()
            }
            Backend::Slots(s) => {
                let (slots, jobs) = s.sh.acquire(&keys)?;
                s.send(jobs);
                slots
            }
        };
        // Pin guards are made only now, with no lock held (a guard's drop takes the lock).
        Ok(slots
            .into_iter()
            .zip(keys.iter().zip(experts))
            .map(|(slot, (&key, &expert))| Pin {
                store: self,
                slot,
                key,
                expert,
                ready: false,
                held: true,
            })
            .collect())
    }

    /// Whether `prefetch` can do anything (a slot cache; mmap has none).
    pub fn can_prefetch(&self) -> bool {
        matches!(self.backend, Backend::Slots(_))
    }

    /// Starts reading experts that will be needed soon (hash layers: known from the token id)
    /// without pinning them; skipped when no slot can be given up now or a caller waits.
    /// Returns whether every one of them is now cached or being read (always for mmap),
    /// so a caller can call again, as slots come free, only while that is not so.
    pub fn prefetch(&self, layer: usize, experts: &[usize]) -> bool {
        match &self.backend {
            Backend::Slots(s) => {
                let Ok(keys) = self.keys(layer, experts) else {
                    return true;
                };
                let (jobs, all) = s.sh.prefetch(&keys);
                s.send(jobs);
                all
            }
            Backend::Mmap(_) => true,
        }
    }

    /// Waits until at least one of `pins` not yet returned is ready, then returns (and marks
    /// returned) every one of them that is ready by then, ascending; empty once all have been
    /// returned. Experts arrive in any order; the caller computes each batch as soon as it is
    /// here, so experts that are cached already are computed together.
    pub fn wait_ready(&self, pins: &mut [Pin<'_>]) -> Result<Vec<usize>> {
        self.collect_ready(pins, true)
    }

    /// Like `wait_ready`, without waiting: the pins not yet returned that are ready now
    /// (empty if none is).
    pub fn take_ready(&self, pins: &mut [Pin<'_>]) -> Result<Vec<usize>> {
        self.collect_ready(pins, false)
    }

    fn collect_ready(&self, pins: &mut [Pin<'_>], block: bool) -> Result<Vec<usize>> {
        if pins.iter().all(|p| p.ready) {
            return Ok(Vec::new());
        }
        let s = match &self.backend {
            Backend::Mmap(_) => {
                // mapped experts are always here
                let got: Vec<usize> = (0..pins.len()).filter(|&i| !pins[i].ready).collect();
                for &i in &got {
                    pins[i].ready = true;
                }
                return Ok(got);
            }
            Backend::Slots(s) => s,
        };
        let t0 = Instant::now();
        let mut g = s.sh.lock();
        let r = loop {
            let mut got = Ok(Vec::new());
            for (i, p) in pins.iter().enumerate().filter(|(_, p)| !p.ready) {
                match s.sh.poll(&g, p.slot, p.key) {
                    Ok(true) => {
                        if let Ok(v) = &mut got {
                            v.push(i);
                        }
                    }
                    Ok(false) => {}
                    Err(e) => {
                        got = Err(e);
                        break;
                    }
                }
            }
            match got {
                Ok(v) if v.is_empty() && block => {
                    g = s.sh.cv.wait(g).unwrap_or_else(|p| p.into_inner())
                }
                r => break r,
            }
        };
        drop(g);
        if block {
            self.counters
                .wait_ns
                .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        let got = r?;
        for &i in &got {
            pins[i].ready = true;
        }
        Ok(got)
    }

    /// The weights behind a pin that `wait_ready` or `take_ready` has returned.
    pub fn view<'p>(&'p self, pin: &'p Pin<'_>) -> Result<ExpertView<'p>> {
        if !pin.ready || !pin.held || !std::ptr::eq(pin.store, self) {
            return Err(Error::arg(
                "internal: an expert was viewed before wait_ready returned it, or after its release",
            ));
        }
        let mut parts: [&[u8]; 6] = [&[]; 6];
        match &self.backend {
            Backend::Mmap(m) => {
                for (k, p) in parts.iter_mut().enumerate() {
                    *p = m.part(pin.key, k);
                }
            }
            Backend::Slots(s) => {
                let lay = &s.sh.layouts[pin.key as usize];
                for (k, p) in parts.iter_mut().enumerate() {
                    let (start, len) = lay.parts[k];
                    // SAFETY: `pin.ready` is set only by `collect_ready` after it saw the slot
                    // Ready, which `finish` sets once every read of the job has completed
                    // (for io_uring: been reaped); the pin keeps the slot from being taken
                    // again (so no new job writes it) until this borrow of the pin ends.
                    *p = unsafe { s.sh.region.range(pin.slot, start, len) };
                }
            }
        }
        Ok(ExpertView {
            parts,
            inter: self.inter,
            hidden: self.hidden,
        })
    }

    fn unpin(&self, slot: usize) {
        if let Backend::Slots(s) = &self.backend {
            s.sh.unpin(slot);
        }
    }
}

impl SlotStore {
    /// Starts the pre-fault and the I/O engine.
    fn start(sh: Arc<Shared>, mode: IoMode, opts: &StoreOptions) -> Result<SlotStore> {
        let io_threads = opts.io_threads;
        if opts.prefault {
            let weak = Arc::downgrade(&sh);
            region::spawn_prefault(sh.region.clone(), move || {
                if let Some(sh) = weak.upgrade() {
                    sh.wake();
                }
            })
            .map_err(|e| thread_error("the pre-fault thread", e))?;
        }
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut st = SlotStore {
            sh: sh.clone(),
            tx: Mutex::new(Some(tx)),
            workers: Vec::new(),
        };
        #[cfg(target_os = "linux")]
        if mode == IoMode::Direct {
            if let Some(ring) = opts.io_uring.then(uring::try_ring).flatten() {
                st.sh.set_engine("io_uring");
                let (sh, rx) = (sh.clone(), rx.clone());
                let h = std::thread::Builder::new()
                    .name("v4flash-uring".into())
                    .spawn(move || uring::uring_worker(sh, rx, ring, io_threads))
                    .map_err(|e| thread_error("the io_uring thread", e))?;
                st.workers.push(h);
                return Ok(st);
            }
        }
        let _ = mode;
        st.sh.set_engine("pread-pool");
        for w in 0..io_threads.max(1) {
            let (sh, rx) = (sh.clone(), rx.clone());
            let h = std::thread::Builder::new()
                .name(format!("v4flash-io-{w}"))
                .spawn(move || worker::io_worker(&sh, &rx))
                .map_err(|e| thread_error("the I/O threads", e))?;
            st.workers.push(h);
        }
        Ok(st)
    }

    fn send(&self, jobs: Vec<Job>) {
        if jobs.is_empty() {
            return;
        }
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let mut failed = Vec::new();
        match tx.as_ref() {
            Some(tx) => {
                for j in jobs {
                    if let Err(mpsc::SendError(j)) = tx.send(j) {
                        failed.push(j);
                    }
                }
            }
            None => failed = jobs,
        }
        drop(tx);
        // no I/O thread will ever take these: fail them rather than leave slots Loading
        self.sh.send_or_fail(failed);
    }
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

impl Drop for SlotStore {
    fn drop(&mut self) {
        // the pre-fault stops at its next page batch and drops its handle on the region
        self.sh.region.stop();
        // closing the channel ends the I/O threads once their reads are done
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
