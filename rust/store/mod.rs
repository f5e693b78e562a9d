//! The routed-expert store: every expert of every layer located in the checkpoint at open
//! time (headers only), fixed-size slots allocated once from the memory budget, reads issued
//! for all of a layer's selected experts as soon as routing is known and completed by a pool
//! of I/O threads, so computation starts on the first expert that arrives.
//!
//! Results never depend on the cache: a freshly read expert and a cached one are the same
//! bytes in the same layout, run through the same kernels.

pub mod io;
pub mod policy;
pub mod region;
#[cfg(target_os = "linux")]
mod uring;

use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::{MatRef, Weights};
use io::{IoMode, ShardFile};
use policy::{Policy, Usage};
use region::{Region, ALIGN};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

const SUFFIX: [&str; 6] = [
    "w1.weight",
    "w1.scale",
    "w3.weight",
    "w3.scale",
    "w2.weight",
    "w2.scale",
];

/// Where one of an expert's six tensors lives.
#[derive(Clone, Copy, Debug)]
struct Part {
    shard: u32,
    offset: u64,
    len: u64,
}

/// A read of one file range into a slot at `dst` (ALIGN-aligned) + offset % ALIGN.
#[derive(Clone, Copy, Debug)]
struct ReadOp {
    shard: u32,
    offset: u64,
    len: u64,
    dst: usize,
}

/// An expert's layout in its slot: six (start, len) pairs and the reads that fill them.
#[derive(Clone, Debug)]
struct Layout {
    parts: [(usize, usize); 6],
    reads: Vec<ReadOp>,
}

/// Plans the reads of one expert: parts sorted by file position, adjacent ones coalesced into
/// one read, each read landing at an ALIGN-aligned place in the slot.
fn layout(parts: &[Part; 6]) -> (Layout, usize) {
    let a = ALIGN as u64;
    let mut order: Vec<usize> = (0..6).collect();
    order.sort_by_key(|&k| (parts[k].shard, parts[k].offset));
    let mut reads: Vec<ReadOp> = Vec::new();
    let mut out = [(0usize, 0usize); 6];
    let mut cursor = 0usize; // next free aligned position in the slot
    for &k in &order {
        let p = parts[k];
        let extend = reads.last().is_some_and(|r| {
            r.shard == p.shard && p.offset >= r.offset && p.offset <= r.offset + r.len + a
        });
        if extend {
            let r = reads.last_mut().expect("checked above");
            let end = (p.offset + p.len).max(r.offset + r.len);
            r.len = end - r.offset;
        } else {
            if let Some(r) = reads.last() {
                cursor = r.dst + envelope(r.offset, r.len);
            }
            reads.push(ReadOp {
                shard: p.shard,
                offset: p.offset,
                len: p.len,
                dst: cursor,
            });
        }
        let r = reads.last().expect("pushed above");
        let base = r.dst + (r.offset % a) as usize;
        out[k] = (base + (p.offset - r.offset) as usize, p.len as usize);
    }
    let total = reads
        .last()
        .map_or(0, |r| r.dst + envelope(r.offset, r.len));
    (Layout { parts: out, reads }, total)
}

/// Bytes of the ALIGN-aligned file envelope of [off, off+len).
fn envelope(off: u64, len: u64) -> usize {
    let a = ALIGN as u64;
    let start = off - off % a;
    ((off + len).div_ceil(a) * a - start) as usize
}

/// Why an expert could not be loaded: a read error (OSError in Python) or bad data in the
/// checkpoint (V4FlashError).
#[derive(Clone, Debug, PartialEq)]
enum Failure {
    Read(String),
    Checkpoint { file: String, msg: String },
}

impl Failure {
    fn from_error(e: Error) -> Failure {
        match e {
            Error::Checkpoint { file, msg } => Failure::Checkpoint { file, msg },
            e => Failure::Read(e.to_string()),
        }
    }

    fn to_error(&self) -> Error {
        match self {
            Failure::Read(m) => Error::Read(m.clone()),
            Failure::Checkpoint { file, msg } => Error::Checkpoint {
                file: file.clone(),
                msg: msg.clone(),
            },
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum SlotState {
    Empty,
    Loading,
    Ready,
    /// The read failed: the error to hand to every waiter (kept cloneable).
    Failed(Failure),
}

struct Slot {
    key: Option<u32>,
    state: SlotState,
    pins: u32,
    usage: Usage,
    /// Loaded by a prefetch and not requested since: its first request counts as a miss
    /// whose read was issued early, not as a hit.
    prefetched: bool,
}

struct Inner {
    map: HashMap<u32, usize>,
    slots: Vec<Slot>,
    tick: u64,
    token: u64,
}

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
}

struct Job {
    slot: usize,
    key: u32,
}

pub struct StoreOptions {
    pub slots: usize,
    pub io: IoMode,
    pub policy: Policy,
    pub io_threads: usize,
}

struct Shared {
    ck: Arc<Checkpoint>,
    files: Vec<ShardFile>,
    layouts: Vec<Layout>,
    region: Option<Arc<Region>>,
    fault_lock: Arc<Mutex<()>>,
    inner: Mutex<Inner>,
    cv: Condvar,
    counters: StoreCounters,
    maps: Vec<memmap2::Mmap>,
    n_experts: usize,
}

pub struct ExpertStore {
    sh: Arc<Shared>,
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    workers: Vec<std::thread::JoinHandle<()>>,
    pub n_experts: usize,
    pub n_layers: usize,
    inter: usize,
    hidden: usize,
    pub slot_size: usize,
    pub n_slots: usize,
    pub expert_bytes: usize,
    pub mode: IoMode,
    pub policy: Policy,
    /// Which read engine runs: "io_uring", "pread-pool" or "mmap".
    pub engine: &'static str,
}

/// A pinned expert: its slot cannot be evicted until the pin is dropped.
pub struct Pin<'a> {
    store: &'a ExpertStore,
    slot: usize,
    key: u32,
    pub expert: usize,
    ready: bool,
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

/// Bytes of one slot (the largest expert's aligned layout), from the tensor table only.
pub fn slot_size(ck: &Checkpoint, c: &ModelConfig) -> Result<usize> {
    let mut size = 0usize;
    for l in 0..c.num_layers {
        for e in 0..c.n_routed_experts {
            let mut parts = [Part {
                shard: 0,
                offset: 0,
                len: 0,
            }; 6];
            for (k, suffix) in SUFFIX.iter().enumerate() {
                let t = ck.tensor(&format!("layers.{l}.ffn.experts.{e}.{suffix}"))?;
                parts[k] = Part {
                    shard: t.shard as u32,
                    offset: t.offset,
                    len: t.len,
                };
            }
            size = size.max(layout(&parts).1);
        }
    }
    Ok(size.div_ceil(ALIGN) * ALIGN)
}

impl ExpertStore {
    /// Locates and checks (dtype, shape) every routed expert tensor without reading data.
    pub fn open(ck: Arc<Checkpoint>, c: &ModelConfig, opts: &StoreOptions) -> Result<ExpertStore> {
        let (h, i) = (c.hidden_size, c.moe_inter);
        let shapes: [(DType, [usize; 2]); 6] = [
            (DType::I8, [i, h / 2]),
            (DType::F8E8M0, [i, h / 32]),
            (DType::I8, [i, h / 2]),
            (DType::F8E8M0, [i, h / 32]),
            (DType::I8, [h, i / 2]),
            (DType::F8E8M0, [h, i / 32]),
        ];
        let n_total = c.num_layers * c.n_routed_experts;
        let mut layouts = Vec::with_capacity(n_total);
        let mut slot_size = 0usize;
        let mut expert_bytes = 0usize;
        for l in 0..c.num_layers {
            for e in 0..c.n_routed_experts {
                let mut parts = [Part {
                    shard: 0,
                    offset: 0,
                    len: 0,
                }; 6];
                for (k, (dt, shape)) in shapes.iter().enumerate() {
                    let name = format!("layers.{l}.ffn.experts.{e}.{}", SUFFIX[k]);
                    let t = ck.expect(&name, &[*dt], shape)?;
                    parts[k] = Part {
                        shard: t.shard as u32,
                        offset: t.offset,
                        len: t.len,
                    };
                }
                expert_bytes = parts.iter().map(|p| p.len as usize).sum();
                let (lay, size) = layout(&parts);
                slot_size = slot_size.max(size);
                layouts.push(lay);
            }
        }
        slot_size = slot_size.div_ceil(ALIGN) * ALIGN;
        let mode = opts.io;
        let mut files = Vec::with_capacity(ck.shards.len());
        for s in &ck.shards {
            files.push(ShardFile::open(&s.path, &s.file_name, mode)?);
        }
        let (region, maps, n_slots) = if mode == IoMode::Mmap {
            let mut maps = Vec::new();
            for s in &ck.shards {
                // SAFETY: the shard is opened read-only and never written by v4flash; a file
                // truncated by another process while mapped is the documented mmap hazard of
                // this opt-in mode (the default modes use positional reads).
                let m = unsafe { memmap2::Mmap::map(&*s.file()) }
                    .map_err(|e| Error::io(&s.path, "mmap shard", e))?;
                maps.push(m);
            }
            (None, maps, 0)
        } else {
            let n = opts.slots.clamp(1, n_total.max(1));
            let r = Region::new(slot_size, n).map_err(|e| {
                Error::Memory(format!(
                    "cannot allocate the expert cache ({n} slots of {:.1} MB): {e}",
                    slot_size as f64 / 1e6
                ))
            })?;
            (Some(Arc::new(r)), Vec::new(), n)
        };
        let fault_lock = Arc::new(Mutex::new(()));
        if let Some(r) = &region {
            region::spawn_prefault(r.clone(), fault_lock.clone());
        }
        let slots = (0..n_slots)
            .map(|_| Slot {
                key: None,
                state: SlotState::Empty,
                pins: 0,
                usage: Usage::default(),
                prefetched: false,
            })
            .collect();
        let sh = Arc::new(Shared {
            ck: ck.clone(),
            files,
            layouts,
            region,
            fault_lock,
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                slots,
                tick: 0,
                token: 0,
            }),
            cv: Condvar::new(),
            counters: StoreCounters::default(),
            maps,
            n_experts: c.n_routed_experts,
        });
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut workers = Vec::new();
        let mut engine = "none";
        if mode != IoMode::Mmap {
            #[cfg(target_os = "linux")]
            if mode == IoMode::Direct {
                if let Some(ring) = uring::try_ring() {
                    let (sh, rx) = (sh.clone(), rx.clone());
                    let h = std::thread::Builder::new()
                        .name("v4flash-uring".into())
                        .spawn(move || uring::uring_worker(&sh, &rx, ring))
                        .map_err(|e| Error::Memory(format!("cannot start the I/O thread: {e}")))?;
                    workers.push(h);
                    engine = "io_uring";
                }
            }
            if workers.is_empty() {
                for w in 0..opts.io_threads.max(1) {
                    let (sh, rx) = (sh.clone(), rx.clone());
                    let h = std::thread::Builder::new()
                        .name(format!("v4flash-io-{w}"))
                        .spawn(move || io_worker(&sh, &rx))
                        .map_err(|e| Error::Memory(format!("cannot start I/O threads: {e}")))?;
                    workers.push(h);
                }
                engine = "pread-pool";
            }
        } else {
            engine = "mmap";
        }
        Ok(ExpertStore {
            sh,
            tx: Mutex::new(Some(tx)),
            workers,
            n_experts: c.n_routed_experts,
            n_layers: c.num_layers,
            inter: i,
            hidden: h,
            slot_size,
            n_slots,
            expert_bytes,
            mode,
            policy: opts.policy,
            engine,
        })
    }

    pub fn counters(&self) -> &StoreCounters {
        &self.sh.counters
    }

    /// Slots pre-faulted so far (the background pre-fault runs at idle priority).
    pub fn prefaulted(&self) -> usize {
        self.sh.region.as_ref().map_or(0, |r| r.faulted())
    }

    pub fn region_bytes(&self) -> usize {
        self.sh.region.as_ref().map_or(0, |r| r.bytes())
    }

    /// Whether reads currently use direct I/O (on every shard).
    pub fn direct_io(&self) -> bool {
        self.mode == IoMode::Direct && self.sh.files.iter().all(|f| f.is_direct())
    }

    /// Marks the start of a new token (ages the frequency counts).
    pub fn next_token(&self, n: u64) {
        let mut g = self.sh.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.token += n;
    }

    /// The most experts one call may pin at once.
    pub fn max_batch(&self) -> usize {
        if self.mode == IoMode::Mmap {
            usize::MAX
        } else {
            self.n_slots
        }
    }

    fn key(&self, layer: usize, e: usize) -> u32 {
        (layer * self.n_experts + e) as u32
    }

    /// Pins the experts (distinct, at most `max_batch()`), issuing reads for the missing ones
    /// right away. Waits (without holding pins) until enough slots are free.
    pub fn acquire(&self, layer: usize, experts: &[usize]) -> Result<Vec<Pin<'_>>> {
        let c = &self.sh.counters;
        c.requests
            .fetch_add(experts.len() as u64, Ordering::Relaxed);
        if self.mode == IoMode::Mmap {
            c.hits.fetch_add(experts.len() as u64, Ordering::Relaxed);
            return Ok(experts
                .iter()
                .map(|&e| {
                    let key = self.key(layer, e);
                    Pin {
                        store: self,
                        slot: key as usize,
                        key,
                        expert: e,
                        ready: false,
                    }
                })
                .collect());
        }
        if experts.len() > self.n_slots {
            return Err(Error::Memory(format!(
                "{} experts requested at once but the expert cache has {} slots",
                experts.len(),
                self.n_slots
            )));
        }
        let mut g = self.sh.inner.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let misses = experts
                .iter()
                .filter(|&&e| !g.map.contains_key(&self.key(layer, e)))
                .count();
            if misses <= self.free_slots(&mut g, layer, experts) {
                break;
            }
            g = self.sh.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        let mut pins = Vec::with_capacity(experts.len());
        let mut jobs = Vec::new();
        for &e in experts {
            let key = self.key(layer, e);
            g.tick += 1;
            let (tick, token) = (g.tick, g.token);
            let slot = match g.map.get(&key) {
                Some(&s) => {
                    if std::mem::take(&mut g.slots[s].prefetched) {
                        c.misses.fetch_add(1, Ordering::Relaxed);
                        c.prefetch_used.fetch_add(1, Ordering::Relaxed);
                    } else {
                        c.hits.fetch_add(1, Ordering::Relaxed);
                    }
                    s
                }
                None => {
                    c.misses.fetch_add(1, Ordering::Relaxed);
                    let s = self
                        .take_slot(&mut g, layer, experts)
                        .ok_or_else(|| Error::Memory("no free expert slot".into()))?;
                    g.map.insert(key, s);
                    g.slots[s].key = Some(key);
                    g.slots[s].state = SlotState::Loading;
                    g.slots[s].usage = Usage::default();
                    g.slots[s].prefetched = false;
                    jobs.push(Job { slot: s, key });
                    s
                }
            };
            let sl = &mut g.slots[slot];
            sl.pins += 1;
            self.policy.touch(&mut sl.usage, token, tick);
            pins.push(Pin {
                store: self,
                slot,
                key,
                expert: e,
                ready: false,
            });
        }
        drop(g);
        self.send(jobs);
        Ok(pins)
    }

    /// Starts reading experts that will be needed soon (hash layers: known from the token id)
    /// without pinning them; skipped when no slot is free without evicting a pinned one.
    pub fn prefetch(&self, layer: usize, experts: &[usize]) {
        if self.mode == IoMode::Mmap {
            return;
        }
        let mut g = self.sh.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut jobs = Vec::new();
        for &e in experts {
            let key = self.key(layer, e);
            if g.map.contains_key(&key) {
                continue;
            }
            let Some(s) = self.take_slot(&mut g, layer, experts) else {
                break;
            };
            g.tick += 1;
            let (tick, token) = (g.tick, g.token);
            g.map.insert(key, s);
            let sl = &mut g.slots[s];
            sl.key = Some(key);
            sl.state = SlotState::Loading;
            sl.usage = Usage::default();
            sl.prefetched = true;
            self.policy.touch(&mut sl.usage, token, tick);
            self.sh.counters.prefetches.fetch_add(1, Ordering::Relaxed);
            jobs.push(Job { slot: s, key });
        }
        drop(g);
        self.send(jobs);
    }

    fn send(&self, jobs: Vec<Job>) {
        if jobs.is_empty() {
            return;
        }
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = tx.as_ref() {
            for j in jobs {
                let _ = tx.send(j);
            }
        }
    }

    /// Slots that could be taken now: empty ones plus unpinned ready/failed ones not among
    /// the requested experts.
    fn free_slots(&self, g: &mut Inner, layer: usize, keep: &[usize]) -> usize {
        let keys: Vec<u32> = keep.iter().map(|&e| self.key(layer, e)).collect();
        self.ensure_faulted(g);
        let avail = self.sh.region.as_ref().map_or(0, |r| r.faulted());
        g.slots[..avail]
            .iter()
            .filter(|s| {
                s.pins == 0
                    && s.state != SlotState::Loading
                    && !s.key.is_some_and(|k| keys.contains(&k))
            })
            .count()
    }

    /// Makes sure at least one slot is usable even if the background pre-fault lags.
    fn ensure_faulted(&self, g: &Inner) {
        if let Some(r) = &self.sh.region {
            if r.faulted() < r.n_slots {
                let all_busy = g.slots[..r.faulted()]
                    .iter()
                    .all(|s| s.state != SlotState::Empty);
                if all_busy {
                    let _l = self.sh.fault_lock.lock().unwrap_or_else(|p| p.into_inner());
                    r.fault_next();
                }
            }
        }
    }

    /// Picks a slot for a new expert: an empty one, else the evictable one of lowest priority.
    fn take_slot(&self, g: &mut Inner, layer: usize, keep: &[usize]) -> Option<usize> {
        self.ensure_faulted(g);
        let avail = self.sh.region.as_ref().map_or(0, |r| r.faulted());
        if let Some(s) = g.slots[..avail]
            .iter()
            .position(|s| s.state == SlotState::Empty)
        {
            return Some(s);
        }
        let keys: Vec<u32> = keep.iter().map(|&e| self.key(layer, e)).collect();
        let token = g.token;
        let victim = g.slots[..avail]
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.pins == 0
                    && s.state != SlotState::Loading
                    && !s.key.is_some_and(|k| keys.contains(&k))
            })
            .min_by(|a, b| {
                self.policy
                    .priority(&a.1.usage, token)
                    .partial_cmp(&self.policy.priority(&b.1.usage, token))
                    .unwrap_or(std::cmp::Ordering::Equal)
            })
            .map(|(i, _)| i)?;
        if let Some(k) = g.slots[victim].key.take() {
            g.map.remove(&k);
        }
        g.slots[victim].state = SlotState::Empty;
        Some(victim)
    }

    /// Waits until one of `pins` not yet returned is ready; returns its index in `pins`.
    /// Experts arrive in any order; the caller computes each as soon as it is here.
    pub fn wait_any(&self, pins: &mut [Pin<'_>]) -> Result<Option<usize>> {
        if pins.iter().all(|p| p.ready) {
            return Ok(None);
        }
        if self.mode == IoMode::Mmap {
            let i = pins.iter().position(|p| !p.ready).expect("checked above");
            pins[i].ready = true;
            return Ok(Some(i));
        }
        let t0 = Instant::now();
        let mut g = self.sh.inner.lock().unwrap_or_else(|p| p.into_inner());
        let r = loop {
            let mut found = None;
            for (i, p) in pins.iter().enumerate() {
                if p.ready {
                    continue;
                }
                match &g.slots[p.slot].state {
                    SlotState::Ready => {
                        found = Some(Ok(i));
                        break;
                    }
                    SlotState::Failed(f) => {
                        found = Some(Err(f.clone()));
                        break;
                    }
                    _ => {}
                }
            }
            match found {
                Some(Ok(i)) => break Ok(i),
                Some(Err(msg)) => break Err(msg),
                None => g = self.sh.cv.wait(g).unwrap_or_else(|p| p.into_inner()),
            }
        };
        drop(g);
        self.sh
            .counters
            .wait_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        match r {
            Ok(i) => {
                pins[i].ready = true;
                Ok(Some(i))
            }
            Err(f) => Err(f.to_error()),
        }
    }

    /// The weights behind a ready pin.
    pub fn view<'p>(&'p self, pin: &'p Pin<'_>) -> ExpertView<'p> {
        debug_assert!(pin.ready);
        if self.mode == IoMode::Mmap {
            let lay = &self.sh.layouts[pin.slot];
            // In mmap mode `slot` is the expert key; its parts are read in place.
            let mut parts: [&[u8]; 6] = [&[]; 6];
            for (k, p) in parts.iter_mut().enumerate() {
                let r = self.part_in_file(k, lay);
                *p = r;
            }
            return ExpertView {
                parts,
                inter: self.inter,
                hidden: self.hidden,
            };
        }
        let lay = &self.sh.layouts[pin.key as usize];
        let region = self.sh.region.as_ref().expect("slot mode has a region");
        // SAFETY: the pin keeps the slot Ready and un-evicted (no writer) for 'p.
        let bytes: &'p [u8] = unsafe { region.slot(pin.slot) };
        let mut parts: [&[u8]; 6] = [&[]; 6];
        for (k, p) in parts.iter_mut().enumerate() {
            let (s, l) = lay.parts[k];
            *p = &bytes[s..s + l];
        }
        ExpertView {
            parts,
            inter: self.inter,
            hidden: self.hidden,
        }
    }

    fn part_in_file(&self, k: usize, lay: &Layout) -> &[u8] {
        // Recover the file range of part k from the layout: find its read.
        let (start, len) = lay.parts[k];
        for r in &lay.reads {
            let base = r.dst + (r.offset % ALIGN as u64) as usize;
            if start >= base && start + len <= base + r.len as usize {
                let off = r.offset as usize + (start - base);
                return &self.sh.maps[r.shard as usize][off..off + len];
            }
        }
        &[]
    }

    fn unpin(&self, slot: usize) {
        if self.mode == IoMode::Mmap {
            return;
        }
        let mut g = self.sh.inner.lock().unwrap_or_else(|p| p.into_inner());
        let s = &mut g.slots[slot];
        s.pins = s.pins.saturating_sub(1);
        if s.pins == 0 {
            if let SlotState::Failed(_) = s.state {
                // forget a failed read so a later request retries it
                if let Some(k) = s.key.take() {
                    g.map.remove(&k);
                }
                g.slots[slot].state = SlotState::Empty;
            }
            self.sh.cv.notify_all();
        }
    }
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        self.store.unpin(self.slot);
    }
}

impl Drop for ExpertStore {
    fn drop(&mut self) {
        // closing the channel ends the I/O threads
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn io_worker(sh: &Shared, rx: &Mutex<mpsc::Receiver<Job>>) {
    loop {
        let job = {
            let r = rx.lock().unwrap_or_else(|p| p.into_inner());
            r.recv()
        };
        let Ok(job) = job else { return };
        let t0 = Instant::now();
        let res = read_expert(sh, &job).and_then(|n| check_scales(sh, &job).map(|_| n));
        finish_job(sh, &job, res, t0);
    }
}

/// Marks a job's slot Ready (or Failed, forgetting it when nobody waits) and wakes waiters.
fn finish_job(sh: &Shared, job: &Job, res: Result<usize>, t0: Instant) {
    let mut g = sh.inner.lock().unwrap_or_else(|p| p.into_inner());
    let s = &mut g.slots[job.slot];
    match res {
        Ok(n) => {
            s.state = SlotState::Ready;
            sh.counters
                .bytes_read
                .fetch_add(n as u64, Ordering::Relaxed);
        }
        Err(e) => {
            s.state = SlotState::Failed(Failure::from_error(e));
            if s.pins == 0 {
                if let Some(k) = s.key.take() {
                    g.map.remove(&k);
                }
                g.slots[job.slot].state = SlotState::Empty;
            }
        }
    }
    sh.counters
        .read_ns
        .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    drop(g);
    sh.cv.notify_all();
}

/// Synchronous read of one planned range into the job's slot (also the fallback of the
/// asynchronous engine for short or refused reads).
fn read_op(sh: &Shared, job: &Job, r: &ReadOp) -> Result<usize> {
    let region = sh.region.as_ref().expect("slot mode has a region");
    // SAFETY: the slot is Loading and owned by this job: no reader (not Ready) and no other
    // writer (a slot is handed to one job at a time); it was pre-faulted before being taken.
    let buf = unsafe { region.slot_mut(job.slot) };
    let f = &sh.files[r.shard as usize];
    let len = r.len as usize;
    if !f.is_degraded() {
        if f.read_into(&mut buf[r.dst..], r.offset, len).is_ok() {
            return Ok(len);
        }
        f.set_degraded();
    }
    // the checkpoint's handle retries once on a reopened file (a shard restored after a fault)
    let delta = (r.offset % ALIGN as u64) as usize;
    sh.ck
        .read_into(
            r.shard as usize,
            r.offset,
            &mut buf[r.dst + delta..r.dst + delta + len],
        )
        .map_err(|e| {
            let (layer, ex) = (
                job.key as usize / sh.n_experts,
                job.key as usize % sh.n_experts,
            );
            Error::Read(format!(
                "reading expert layers.{layer}.ffn.experts.{ex}: {e}"
            ))
        })?;
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
fn check_scales(sh: &Shared, job: &Job) -> Result<()> {
    let lay = &sh.layouts[job.key as usize];
    let region = sh.region.as_ref().expect("slot mode has a region");
    // SAFETY: still Loading and owned by this job (see read_op); read-only access here.
    let buf = unsafe { region.slot(job.slot) };
    for k in [1, 3, 5] {
        let (s, l) = lay.parts[k];
        if let Some(i) = buf[s..s + l].iter().position(|&b| b == 255) {
            let (layer, e) = (
                job.key as usize / sh.n_experts,
                job.key as usize % sh.n_experts,
            );
            return Err(Error::checkpoint(
                sh.files[lay.reads[0].shard as usize].name.clone(),
                format!(
                    "tensor layers.{layer}.ffn.experts.{e}.{}: scale byte {i} is 255 (the F8_E8M0 NaN encoding)",
                    SUFFIX[k]
                ),
            ));
        }
    }
    Ok(())
}
