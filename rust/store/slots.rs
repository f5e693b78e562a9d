//! The slot state machine of the expert cache: which expert each slot holds, who has it
//! pinned, which reads are in flight, what to evict, and the admission of callers.
//!
//! ```text
//! Empty --take (acquire/prefetch)--> Loading --job done--> Ready --evict--> Empty
//!                                       \--job failed--> Failed --last unpin--> Empty
//! any --ring abandoned with reads in flight--> Quarantined (never used again)
//! ```
//!
//! # Why no caller can deadlock on the cache
//! Callers (forward passes of any number of sessions, on their own threads) ask for a
//! whole wave of experts at once. Three rules make every wait finite:
//! 1. **All or nothing.** `acquire` pins nothing until it can pin the whole wave; while it
//!    waits it holds no pins, so it never keeps slots another waiter needs.
//! 2. **A holder never waits on the cache.** Pins are held only while computing and while
//!    waiting for the wave's own reads, which the I/O threads finish whatever the callers
//!    do. Pins are dropped (or released one by one, `Pin::release`, as each expert is
//!    computed) before the next `acquire`. Compute runs on the model's thread
//!    pool, whose workers never call into the store (the forward pass waits for experts on
//!    the caller's own thread, see `model::Model::forward`), so a pool worker that picks up
//!    another call's work while waiting can never end up blocked on this cache either.
//! 3. **First come, first served.** Waiting callers are admitted in arrival order (a ticket
//!    queue); a later caller cannot take the slots an earlier one waits for, and prefetch
//!    stands back while anyone waits. Since every holder releases its pins in finite time
//!    (rule 2), the head of the queue is admitted in finite time, and so is everyone.
//!
//! A slot the background pre-fault is zeroing is the only other thing a waiter can wait
//! for; the pre-fault wakes waiters after every slot, and is never waited for otherwise.
//! While the cache is cold (`Region::cold`) the head of the queue may also wait for warm
//! slots held by others rather than claim untouched ones (`reserve`), but only when the
//! warm slots not holding its own experts are enough for its wave; those are held by
//! pins (rule 2) or by reads the I/O threads finish, so that wait is finite too.

use super::layout::Layout;
use super::policy::{Policy, Usage};
use super::region::Region;
use super::StoreCounters;
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::io::ShardFile;

/// One expert to read into one slot (the slot is Loading and belongs to this job until the
/// job is finished).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Job {
    pub slot: usize,
    pub key: u32,
}

/// Why an expert could not be loaded: a read error (OSError in Python) or bad data in the
/// checkpoint (V4FlashError). Kept cloneable to hand to every waiter.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Failure {
    Read(String),
    Checkpoint { file: String, msg: String },
}

impl Failure {
    pub(crate) fn from_error(e: Error) -> Failure {
        match e {
            Error::Checkpoint { file, msg } => Failure::Checkpoint { file, msg },
            e => Failure::Read(e.to_string()),
        }
    }

    pub(crate) fn to_error(&self) -> Error {
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
pub(crate) enum SlotState {
    Empty,
    Loading,
    Ready,
    Failed(Failure),
    /// The kernel may still write into this slot (an io_uring read that could not be
    /// cancelled and reaped): it is never handed out again. Only the io_uring engine
    /// (Linux) puts a slot in this state.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    Quarantined,
}

pub(crate) struct Slot {
    pub key: Option<u32>,
    pub state: SlotState,
    pub pins: u32,
    pub usage: Usage,
    /// Loaded by a prefetch and not requested since: its first request counts as a miss
    /// whose read was issued early, not as a hit.
    pub prefetched: bool,
}

pub(crate) struct Inner {
    pub map: HashMap<u32, usize>,
    pub slots: Vec<Slot>,
    tick: u64,
    pub token: u64,
    next_ticket: u64,
    /// Tickets of the callers waiting in `acquire`, in arrival order.
    queue: VecDeque<u64>,
    quarantined: usize,
}

/// What the I/O threads and the store share.
pub(crate) struct Shared {
    pub ck: Arc<Checkpoint>,
    pub files: Vec<ShardFile>,
    pub layouts: Arc<Vec<Layout>>,
    pub region: Arc<Region>,
    pub inner: Mutex<Inner>,
    pub cv: Condvar,
    pub counters: Arc<StoreCounters>,
    /// The blocks the keys name (`layout::Blocks`).
    pub blocks: super::layout::Blocks,
    pub policy: Policy,
    /// The read engine that runs now ("io_uring", "pread-pool", or "pread-pool (io_uring
    /// failed: …)" after a ring failure).
    pub engine: Mutex<String>,
    /// Test hook: make the next N io_uring waits fail as if the ring broke (Linux only).
    #[cfg(all(test, target_os = "linux"))]
    pub fail_submits: std::sync::atomic::AtomicU32,
}

impl Shared {
    pub fn new(
        ck: Arc<Checkpoint>,
        files: Vec<ShardFile>,
        layouts: Arc<Vec<Layout>>,
        region: Arc<Region>,
        counters: Arc<StoreCounters>,
        blocks: super::layout::Blocks,
        policy: Policy,
    ) -> Shared {
        let slots = (0..region.n_slots)
            .map(|_| Slot {
                key: None,
                state: SlotState::Empty,
                pins: 0,
                usage: Usage::default(),
                prefetched: false,
            })
            .collect();
        Shared {
            ck,
            files,
            layouts,
            region,
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                slots,
                tick: 0,
                token: 0,
                next_ticket: 0,
                queue: VecDeque::new(),
                quarantined: 0,
            }),
            cv: Condvar::new(),
            counters,
            blocks,
            policy,
            engine: Mutex::new(String::new()),
            #[cfg(all(test, target_os = "linux"))]
            fail_submits: std::sync::atomic::AtomicU32::new(0),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes every waiter; taking the lock first orders the wake-up after any state change
    /// made outside it (the pre-fault's), so a waiter cannot miss it.
    pub fn wake(&self) {
        drop(self.lock());
        self.cv.notify_all();
    }

    pub fn set_engine(&self, name: impl Into<String>) {
        *self.engine.lock().unwrap_or_else(|p| p.into_inner()) = name.into();
    }

    pub fn engine(&self) -> String {
        self.engine
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// "layers.L.ffn.experts.E" (or a drafter stage's "mtp.S.…") for a key.
    pub fn expert_name(&self, key: u32) -> String {
        self.blocks.expert_name(key)
    }

    /// Slots that can be used at all (not quarantined).
    fn usable(g: &Inner) -> usize {
        g.slots.len() - g.quarantined
    }

    /// Whether slot `i` could be given to a new expert now: not pinned, not being read, not
    /// holding one of `keep`, not quarantined, and not being zeroed by the pre-fault.
    fn takeable(&self, g: &Inner, i: usize, keep: &[u32]) -> bool {
        let s = &g.slots[i];
        s.pins == 0
            && matches!(
                s.state,
                SlotState::Empty | SlotState::Ready | SlotState::Failed(_)
            )
            && !s.key.is_some_and(|k| keep.contains(&k))
            && !self.region.is_faulting(i)
    }

    /// Whether `need` slots can be taken now. Empty slots the pre-fault has not reached yet
    /// are claimed here (as many as needed), so the pre-fault cannot start zeroing a slot
    /// between this count and `take_slot`. While the cache is cold (`Region::cold`) only
    /// what the warm slots could never provide is claimed: otherwise the caller waits for
    /// warm slots to come free (their reads finish, their pins are dropped, or the
    /// pre-fault warms more), which every holder does in finite time (module comment).
    fn reserve(&self, g: &Inner, keep: &[u32], need: usize) -> bool {
        let mut have = 0;
        let mut untouched = Vec::new();
        for i in 0..g.slots.len() {
            if !self.takeable(g, i, keep) {
                continue;
            }
            if g.slots[i].state == SlotState::Empty && !self.region.is_warm(i) {
                untouched.push(i);
            } else {
                have += 1;
            }
        }
        if have >= need {
            return true;
        }
        let claims = if self.region.cold() {
            // warm slots this wave could get once their holders are done with them
            let warm = (0..g.slots.len())
                .filter(|&i| {
                    let s = &g.slots[i];
                    self.region.is_warm(i)
                        && s.state != SlotState::Quarantined
                        && !s.key.is_some_and(|k| keep.contains(&k))
                })
                .count();
            need.saturating_sub(warm)
        } else {
            need - have
        };
        let mut claimed = 0;
        for i in untouched {
            if claimed >= claims {
                break;
            }
            if self.region.claim(i) {
                claimed += 1;
            }
        }
        have + claimed >= need
    }

    /// Picks a slot for a new expert: an empty warm one (pre-faulted, or claimed already),
    /// else an empty one not yet faulted (claimed from the pre-fault), else the evictable
    /// one of lowest priority. While the cache is cold the eviction comes before the claim,
    /// and the claim is made only `if_cold` (by `acquire`, whose `reserve` counted the
    /// slots; a prefetch then takes no slot rather than pay first-touch faults).
    fn take_slot(&self, g: &mut Inner, keep: &[u32], if_cold: bool) -> Option<usize> {
        let empty =
            |g: &Inner, i: usize| g.slots[i].state == SlotState::Empty && self.takeable(g, i, keep);
        let claim_empty =
            |g: &Inner| (0..g.slots.len()).find(|&i| empty(g, i) && self.region.claim(i));
        let cold = self.region.cold();
        let pick = (0..g.slots.len())
            .find(|&i| empty(g, i) && self.region.is_warm(i))
            .or_else(|| if cold { None } else { claim_empty(g) });
        if pick.is_some() {
            return pick;
        }
        let token = g.token;
        let victim = (0..g.slots.len())
            .filter(|&i| self.takeable(g, i, keep) && self.region.is_warm(i))
            .min_by(|&a, &b| {
                self.policy
                    .priority(&g.slots[a].usage, token)
                    .partial_cmp(&self.policy.priority(&g.slots[b].usage, token))
                    .unwrap_or(std::cmp::Ordering::Equal)
            });
        let Some(victim) = victim else {
            return if cold && if_cold {
                claim_empty(g)
            } else {
                None
            };
        };
        if let Some(k) = g.slots[victim].key.take() {
            g.map.remove(&k);
        }
        g.slots[victim].state = SlotState::Empty;
        Some(victim)
    }

    /// Gives slot `s` to expert `key` (state Loading) and returns the read job.
    fn assign(&self, g: &mut Inner, s: usize, key: u32, prefetched: bool) -> Job {
        g.map.insert(key, s);
        let sl = &mut g.slots[s];
        sl.key = Some(key);
        sl.state = SlotState::Loading;
        sl.usage = Usage::default();
        sl.prefetched = prefetched;
        Job { slot: s, key }
    }

    /// Pins the slots of `keys` (distinct), taking slots and creating read jobs for the
    /// missing ones; all or nothing, in arrival order (see the module comment). Returns the
    /// slot of each key and the jobs to send.
    pub fn acquire(&self, keys: &[u32]) -> Result<(Vec<usize>, Vec<Job>)> {
        let c = &self.counters;
        let mut g = self.lock();
        let ticket = g.next_ticket;
        g.next_ticket += 1;
        g.queue.push_back(ticket);
        loop {
            let usable = Self::usable(&g);
            if keys.len() > usable {
                leave(&mut g, ticket);
                drop(g);
                self.cv.notify_all();
                return Err(Error::Memory(format!(
                    "{} experts requested at once but the expert cache has {usable} usable slots",
                    keys.len()
                )));
            }
            if g.queue.front() == Some(&ticket) {
                let misses = keys.iter().filter(|k| !g.map.contains_key(k)).count();
                if self.reserve(&g, keys, misses) {
                    break;
                }
            }
            g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        c.requests.fetch_add(keys.len() as u64, Ordering::Relaxed);
        let mut slots = Vec::with_capacity(keys.len());
        let mut jobs = Vec::new();
        for &key in keys {
            g.tick += 1;
            let (tick, token) = (g.tick, g.token);
            let s = match g.map.get(&key) {
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
                    let Some(s) = self.take_slot(&mut g, keys, true) else {
                        // Cannot happen (enough takeable slots were counted under this same
                        // lock); undo the pins taken so far, without creating Pin guards.
                        for &p in &slots {
                            let sl: &mut Slot = &mut g.slots[p];
                            sl.pins -= 1;
                        }
                        leave(&mut g, ticket);
                        drop(g);
                        self.send_or_fail(jobs);
                        self.cv.notify_all();
                        return Err(Error::Memory("no free expert slot".into()));
                    };
                    jobs.push(self.assign(&mut g, s, key, false));
                    s
                }
            };
            let sl = &mut g.slots[s];
            sl.pins += 1;
            self.policy.touch(&mut sl.usage, token, tick);
            slots.push(s);
        }
        leave(&mut g, ticket);
        drop(g);
        self.cv.notify_all();
        Ok((slots, jobs))
    }

    /// Takes slots for experts that will be needed soon, without pinning them; skipped
    /// (returns no jobs) while a caller waits for slots, and stops at the first expert
    /// that would need a slot nobody can give up now. Also returns whether every key is
    /// now in the cache (ready or being read).
    pub fn prefetch(&self, keys: &[u32]) -> (Vec<Job>, bool) {
        let mut g = self.lock();
        let mut jobs = Vec::new();
        if !g.queue.is_empty() {
            return (jobs, false);
        }
        for &key in keys {
            if g.map.contains_key(&key) {
                continue;
            }
            let Some(s) = self.take_slot(&mut g, keys, false) else {
                return (jobs, false);
            };
            g.tick += 1;
            let (tick, token) = (g.tick, g.token);
            jobs.push(self.assign(&mut g, s, key, true));
            self.policy.touch(&mut g.slots[s].usage, token, tick);
            self.counters.prefetches.fetch_add(1, Ordering::Relaxed);
        }
        (jobs, true)
    }

    /// Jobs that could not be sent (the I/O threads are gone): fail them so no slot stays
    /// Loading for ever.
    pub fn send_or_fail(&self, jobs: Vec<Job>) {
        for j in jobs {
            self.finish(
                &j,
                Err(Error::Read("the expert store is shutting down".into())),
            );
        }
    }

    /// Marks a job's slot Ready (or Failed, forgetting it when nobody waits) and wakes
    /// waiters. Called once every read of the job has completed.
    pub fn finish(&self, job: &Job, res: Result<usize>) {
        let mut g = self.lock();
        let s = &mut g.slots[job.slot];
        match res {
            Ok(n) => {
                s.state = SlotState::Ready;
                self.counters
                    .bytes_read
                    .fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) => {
                s.state = SlotState::Failed(Failure::from_error(e));
                if s.pins == 0 {
                    forget(&mut g, job.slot);
                }
            }
        }
        drop(g);
        self.cv.notify_all();
    }

    /// Fails a job whose reads may still be written by the kernel: its slot is never used
    /// again (waiters get the error, then the slot stays out of service).
    #[cfg(target_os = "linux")]
    pub fn quarantine(&self, job: &Job, why: &str) {
        let mut g = self.lock();
        if let Some(k) = g.slots[job.slot].key.take() {
            g.map.remove(&k);
        }
        g.slots[job.slot].state = SlotState::Quarantined;
        g.quarantined += 1;
        drop(g);
        self.cv.notify_all();
        eprintln!(
            "v4flash: expert cache slot {} taken out of service ({} abandoned: {why})",
            job.slot,
            self.expert_name(job.key)
        );
    }

    /// State of slot `s` as seen by a pin holder: Ok(true) ready, Ok(false) not yet,
    /// Err on a failed (or abandoned) read.
    pub fn poll(&self, g: &Inner, s: usize, key: u32) -> Result<bool> {
        match &g.slots[s].state {
            SlotState::Ready => Ok(true),
            SlotState::Failed(f) => Err(f.to_error()),
            SlotState::Quarantined => Err(Error::Read(format!(
                "reading expert {}: the read was abandoned after an I/O engine failure; retry",
                self.expert_name(key)
            ))),
            SlotState::Empty | SlotState::Loading => Ok(false),
        }
    }

    pub fn unpin(&self, slot: usize) {
        let mut g = self.lock();
        let s = &mut g.slots[slot];
        s.pins = s.pins.saturating_sub(1);
        if s.pins == 0 {
            if let SlotState::Failed(_) = s.state {
                // forget a failed read so a later request retries it
                forget(&mut g, slot);
            }
            drop(g);
            self.cv.notify_all();
        }
    }

    pub fn next_token(&self, n: u64) {
        self.lock().token += n;
    }
}

/// Empties a slot and drops its key from the map.
fn forget(g: &mut Inner, slot: usize) {
    if let Some(k) = g.slots[slot].key.take() {
        g.map.remove(&k);
    }
    g.slots[slot].state = SlotState::Empty;
}

fn leave(g: &mut Inner, ticket: u64) {
    g.queue.retain(|&t| t != ticket);
}
