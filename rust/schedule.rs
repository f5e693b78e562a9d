//! Continuous batching (docs/architecture.md §7.4): the steps that callers on other threads
//! ask for at the same time run together, one batched forward pass per round
//! (`Session::step_together`), so that several conversations share each read of the
//! weights.
//!
//! A model loaded for several sessions (`LoadOptions::sessions` > 1) has a scheduler; every
//! step and feed of its sessions goes through it. Its thread runs rounds:
//! - a round takes every waiting request, after giving the streams that are between steps a
//!   moment (`GATHER`) to ask for their next one, so that decoding streams stay together;
//! - every decoding request steps (one token each); the prompts waiting to be fed share a
//!   budget of `prefill` tokens per round, in arrival order, each getting an equal share
//!   of what is left and the shorter ones' unused share going to the others: a long prompt
//!   never holds the running answers for more than one part, and a short prompt arriving
//!   behind it is fed at once;
//! - after a round that fed a part of a prompt not finished, the next round takes only the
//!   requests that finish their prompt in it (decoding ones, short prompts), when there are
//!   any: they get a quick round between two long parts;
//! - the round after one that finished a feed waits (up to `GATHER`) for that caller's
//!   first step, which usually follows at once;
//! - a prompt fed in parts is marked before its first part: when its caller gives up
//!   (cancel, Ctrl-C) or a part fails, the session goes back to the mark, as an unfinished
//!   one-pass feed leaves it unchanged;
//! - a request whose caller gave up is dropped between rounds; a round is interrupted only
//!   when every caller in it gave up.
//!
//! Every caller gets what its call alone gives, bit for bit: see `together.rs`.

use crate::error::{Error, Result};
use crate::model::generate::{Generation, Mark, Session, Stepped, Turn};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Prompt tokens fed per round, shared by the prompts waiting, when the expert cache holds
/// most experts (`round_prefill`'s default there): a part's experts are mostly in the cache,
/// so small parts cost little (benches/README.md, "Continuous batching").
pub const PREFILL_PER_ROUND: usize = 256;

/// The prompt tokens per round of a model with `plan` (`LoadOptions::round_prefill` unset):
/// `PREFILL_PER_ROUND` when the cache holds at least half of the routed experts; else the
/// plan's prefill span, so that a long prompt is fed as fast as alone (each part reads the
/// experts its tokens use that are not cached: smaller parts would read them again and
/// again) and a request arriving behind it waits up to one span. A rule of thumb: at
/// 679 of 1,024 experts cached, parts of 128–512 tokens fed a 4,306-token prompt as fast
/// as one pass (benches/README.md).
pub fn default_round_prefill(plan: &crate::plan::Plan) -> usize {
    if plan.slots.saturating_mul(2) >= plan.total_experts {
        PREFILL_PER_ROUND
    } else {
        plan.prefill_span.max(PREFILL_PER_ROUND)
    }
}

/// How long a round waits for the streams between two steps to ask for their next one.
const GATHER: Duration = Duration::from_millis(10);

/// How long the scheduler's thread stays without work before it ends (a new request starts
/// another).
const IDLE: Duration = Duration::from_secs(2);

/// How often a waiting caller looks at its cancel flag.
const POLL: Duration = Duration::from_millis(5);

/// A request whose session another call holds waits this long between rounds, and gives up
/// ("busy") after `BUSY_ROUNDS` of them (about a second alone).
const BUSY_WAIT: Duration = Duration::from_millis(5);
const BUSY_ROUNDS: usize = 200;

const BUSY: &str = "this session is busy with another call (one call at a time per session; use separate sessions for concurrency)";

/// The scheduler of one model's sessions.
pub struct Scheduler {
    shared: Arc<Shared>,
}

struct Shared {
    q: Mutex<Queue>,
    wake: Condvar,
    prefill: usize,
}

#[derive(Default)]
struct Queue {
    /// In arrival order.
    reqs: Vec<Req>,
    /// Streams between two steps (`Registration`), which a round waits for.
    streams: usize,
    running: bool,
    stop: bool,
    stats: Stats,
    /// Requests the last round put back, and the feeds it finished: the next round waits
    /// (up to `GATHER`) for that many more requests, their callers' first steps.
    kept: usize,
    expected: usize,
}

/// What the scheduler did (`Scheduler::stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Stats {
    /// Rounds run (batched forward passes, or single steps).
    pub rounds: u64,
    /// Requests stepped, over all rounds.
    pub stepped: u64,
    /// The most requests one round stepped.
    pub widest: u64,
    /// Prompt tokens fed in parts (a prompt longer than its share of a round).
    pub prefill_parts: u64,
}

/// What one round did (`Stats`'s part), and what the next needs to know.
#[derive(Default)]
struct RoundStats {
    rounds: u64,
    stepped: u64,
    widest: u64,
    prefill_parts: u64,
    /// It fed a part of a prompt that is not finished.
    partial: bool,
    /// Feeds it finished (their callers usually step next).
    fed_whole: usize,
    /// It stepped nothing.
    idle: bool,
}

/// One caller's step, waiting or running.
struct Req {
    session: Arc<Mutex<Session>>,
    gen: Arc<Mutex<Generation>>,
    gave_up: Arc<AtomicBool>,
    reply: mpsc::Sender<Reply>,
    /// A stream's step (a round waits for those).
    stream: bool,
    /// Prompt tokens fed so far by this request.
    fed: usize,
    /// Where the session and the prompt stood before the prompt's first part.
    mark: Option<(Mark, Option<Vec<u32>>)>,
    /// Rounds its session or generation was taken by another call.
    busy_rounds: usize,
}

enum Reply {
    Fed(usize),
    Done(Result<Option<u32>>),
}

/// A stream that will ask for its next step soon: rounds wait for it (up to `GATHER`).
/// Dropping it ends that.
pub struct Registration {
    shared: Arc<Shared>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut q = lock(&self.shared.q);
        q.streams = q.streams.saturating_sub(1);
        self.shared.wake.notify_all();
    }
}

fn lock(m: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    // the queue is consistent at every unlock (nothing in it panics)
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Scheduler {
    /// A scheduler feeding at most `prefill` prompt tokens per round (at least 1).
    pub fn new(prefill: usize) -> Scheduler {
        Scheduler {
            shared: Arc::new(Shared {
                q: Mutex::new(Queue::default()),
                wake: Condvar::new(),
                prefill: prefill.max(1),
            }),
        }
    }

    /// What the scheduler did so far.
    pub fn stats(&self) -> Stats {
        lock(&self.shared.q).stats
    }

    /// A stream that steps again and again: rounds wait for its next step (briefly).
    pub fn register(&self) -> Registration {
        lock(&self.shared.q).streams += 1;
        Registration {
            shared: self.shared.clone(),
        }
    }

    /// One `step` of `gen` on `session`, run in a round with the other callers' (the same
    /// result as `Session::step`). Blocks until it is done; `on_fed(n)` is called with the
    /// prompt tokens fed so far after each part of a prompt fed in parts. Once `gave_up` is
    /// set the step is abandoned: `Error::Cancelled`, the session and the generation as they
    /// were. `stream`: a registered stream's step.
    pub fn step(
        &self,
        session: &Arc<Mutex<Session>>,
        gen: &Arc<Mutex<Generation>>,
        gave_up: &AtomicBool,
        stream: bool,
        on_fed: &dyn Fn(usize),
    ) -> Result<Option<u32>> {
        let (tx, rx) = mpsc::channel();
        let flag = Arc::new(AtomicBool::new(false));
        {
            let mut q = lock(&self.shared.q);
            if q.stop {
                return Err(Error::Cancelled);
            }
            if !q.running {
                let shared = self.shared.clone();
                std::thread::Builder::new()
                    .name("v4flash-scheduler".into())
                    .spawn(move || shared.run())
                    .map_err(|e| Error::System(format!("cannot start the scheduler: {e}")))?;
                q.running = true;
            }
            q.reqs.push(Req {
                session: session.clone(),
                gen: gen.clone(),
                gave_up: flag.clone(),
                reply: tx,
                stream,
                fed: 0,
                busy_rounds: 0,
                mark: None,
            });
            self.shared.wake.notify_all();
        }
        loop {
            match rx.recv_timeout(POLL) {
                Ok(Reply::Fed(n)) => on_fed(n),
                Ok(Reply::Done(r)) => return r,
                Err(RecvTimeoutError::Timeout) => {
                    if gave_up.load(Ordering::Relaxed) && !flag.swap(true, Ordering::Relaxed) {
                        self.shared.wake.notify_all();
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Error::System(
                        "internal: the scheduler dropped a request without an answer".into(),
                    ))
                }
            }
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        lock(&self.shared.q).stop = true;
        self.shared.wake.notify_all();
    }
}

impl Req {
    /// Ends the request with `r`, taking the session back to the mark on an error.
    fn answer(self, r: Result<Option<u32>>) {
        let r = match (r, self.mark) {
            (Err(e), Some((mark, prompt))) => {
                let back = match (self.session.try_lock(), self.gen.try_lock()) {
                    (Ok(mut s), Ok(mut g)) => s.restore(&mark).map(|()| g.set_prompt_rest(prompt)),
                    _ => Err(Error::arg(BUSY)),
                };
                Err(back.err().unwrap_or(e))
            }
            (r, _) => r,
        };
        let _ = self.reply.send(Reply::Done(r));
    }
}

impl Shared {
    /// The scheduler's thread: rounds while there are requests.
    fn run(self: Arc<Self>) {
        // the last round fed a part of a prompt that is not finished
        let mut partial = false;
        loop {
            let mut q = lock(&self.q);
            let idle = Instant::now();
            while q.reqs.is_empty() {
                if q.stop || idle.elapsed() >= IDLE {
                    q.running = false;
                    return;
                }
                q = self
                    .wake
                    .wait_timeout(q, IDLE)
                    .map_or_else(|e| e.into_inner().0, |r| r.0);
            }
            if q.stop {
                q.running = false;
                for r in std::mem::take(&mut q.reqs) {
                    r.answer(Err(Error::Cancelled));
                }
                return;
            }
            // the streams between two steps, and the callers whose prompt the last round
            // finished feeding (their first step comes next)
            let t0 = Instant::now();
            while q.reqs.iter().filter(|r| r.stream).count() < q.streams
                || q.reqs.len() < q.kept + q.expected
            {
                let Some(left) = GATHER.checked_sub(t0.elapsed()) else {
                    break;
                };
                q = self
                    .wake
                    .wait_timeout(q, left)
                    .map_or_else(|e| e.into_inner().0, |r| r.0);
            }
            let reqs = std::mem::take(&mut q.reqs);
            drop(q);
            let (kept, stats) = self.round(reqs, partial);
            if stats.idle && !kept.is_empty() {
                // only requests whose session is taken: give the other call a moment
                std::thread::sleep(BUSY_WAIT);
            }
            partial = stats.partial;
            let mut q = lock(&self.q);
            q.kept = kept.len();
            q.expected = stats.fed_whole;
            let mut all = kept;
            all.append(&mut q.reqs);
            q.reqs = all;
            q.stats.rounds += stats.rounds;
            q.stats.stepped += stats.stepped;
            q.stats.widest = q.stats.widest.max(stats.widest);
            q.stats.prefill_parts += stats.prefill_parts;
        }
    }

    /// Prompt tokens each request may feed this round: decoding ones step anyway (1), the
    /// prompts share `prefill` in arrival order (0: waits for a later round). After a round
    /// that fed a part of an unfinished prompt (`after_part`), only the requests that finish
    /// their prompt in this one take part, if there are any: the running answers and the
    /// short prompts get a quick round between two long parts.
    fn shares(&self, left: &[usize], after_part: bool) -> Vec<usize> {
        let got = self.water_fill(left);
        if after_part {
            let finishing: Vec<usize> = got
                .iter()
                .zip(left)
                .map(|(&g, &l)| if g >= l { g } else { 0 })
                .collect();
            if finishing.iter().any(|&g| g > 0) {
                return finishing;
            }
        }
        got
    }

    /// `shares` without the alternation.
    fn water_fill(&self, left: &[usize]) -> Vec<usize> {
        let mut got: Vec<usize> = left.iter().map(|&l| usize::from(l == 0)).collect();
        let mut rest: Vec<usize> = (0..left.len()).filter(|&i| left[i] > 0).collect();
        let mut budget = self.prefill;
        while !rest.is_empty() && budget > 0 {
            let share = (budget / rest.len()).max(1);
            rest.retain(|&i| {
                let give = (left[i] - got[i]).min(share).min(budget);
                got[i] += give;
                budget -= give;
                got[i] < left[i]
            });
        }
        got
    }

    /// One round over `reqs` (in arrival order): the requests that must come back (prompts
    /// fed in part, or waiting for their share) and what the round did.
    fn round(&self, reqs: Vec<Req>, after_part: bool) -> (Vec<Req>, RoundStats) {
        let mut stats = RoundStats::default();
        let mut live = Vec::with_capacity(reqs.len());
        for r in reqs {
            if r.gave_up.load(Ordering::Relaxed) {
                r.answer(Err(Error::Cancelled));
            } else {
                live.push(r);
            }
        }
        let mut marks: Vec<Option<(Mark, Option<Vec<u32>>)>> =
            live.iter_mut().map(|r| r.mark.take()).collect();
        // each request's session and generation; one taken by another call waits
        let mut locked = Vec::with_capacity(live.len());
        let mut busy = Vec::new();
        for (i, r) in live.iter().enumerate() {
            match (r.session.try_lock(), r.gen.try_lock()) {
                (Ok(s), Ok(g)) => locked.push((i, s, g)),
                _ => busy.push(i),
            }
        }
        let left: Vec<usize> = locked.iter().map(|(_, _, g)| g.prompt_left()).collect();
        let shares = self.shares(&left, after_part);
        stats.partial = shares.iter().zip(&left).any(|(&g, &l)| g > 0 && g < l);
        let mut left_of = vec![0; live.len()];
        for ((i, _, _), &l) in locked.iter().zip(&left) {
            left_of[*i] = l;
        }
        let mut turns = Vec::new();
        let mut stepped = Vec::new();
        let mut waiting = Vec::new();
        let mut failed: Vec<(usize, Error)> = Vec::new();
        for ((i, s, g), share) in locked.iter_mut().zip(shares) {
            if share == 0 {
                waiting.push(*i);
                continue;
            }
            if share < g.prompt_left() && marks[*i].is_none() {
                match s.mark() {
                    Ok(m) => marks[*i] = Some((m, g.prompt_rest())),
                    Err(e) => {
                        failed.push((*i, e));
                        continue;
                    }
                }
            }
            stepped.push(*i);
            turns.push(Turn {
                session: s,
                gen: g,
                prefill: share,
            });
        }
        let outs = if turns.is_empty() {
            Vec::new()
        } else {
            let flags: Vec<&AtomicBool> = stepped.iter().map(|&i| &*live[i].gave_up).collect();
            let all_gave_up = || flags.iter().all(|f| f.load(Ordering::Relaxed));
            Session::step_together(&mut turns, &all_gave_up)
        };
        drop(turns);
        drop(locked);
        stats.rounds = u64::from(!stepped.is_empty());
        stats.stepped = stepped.len() as u64;
        stats.widest = stats.stepped;
        let mut result: Vec<Option<Result<Stepped>>> = (0..live.len()).map(|_| None).collect();
        for (&i, o) in stepped.iter().zip(outs) {
            result[i] = Some(o);
        }
        for (i, e) in failed {
            result[i] = Some(Err(e));
        }
        for &i in &busy {
            // taken by another call (a second request on one session, a read of it): tried
            // again next round, for a while
            live[i].busy_rounds += 1;
            if live[i].busy_rounds > BUSY_ROUNDS {
                result[i] = Some(Err(Error::arg(BUSY)));
            }
        }
        stats.idle = stepped.is_empty();
        let mut kept = Vec::new();
        for (((mut r, res), mark), left) in live.into_iter().zip(result).zip(marks).zip(left_of) {
            r.mark = mark;
            match res {
                None => kept.push(r), // waits for its share
                Some(Ok(Stepped::Fed(n))) => {
                    r.fed += n;
                    stats.prefill_parts += n as u64;
                    let _ = r.reply.send(Reply::Fed(r.fed));
                    kept.push(r);
                }
                Some(Ok(Stepped::Token(t))) => r.answer(Ok(Some(t))),
                Some(Ok(Stepped::Done)) => {
                    stats.fed_whole += usize::from(!r.stream);
                    if left > 0 {
                        // the prompt's last part (a feed's)
                        r.fed += left;
                        let _ = r.reply.send(Reply::Fed(r.fed));
                    }
                    r.answer(Ok(None))
                }
                Some(Err(e)) => r.answer(Err(e)),
            }
        }
        (kept, stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_share_the_budget_in_arrival_order_and_decoders_always_step() {
        let s = Scheduler::new(512);
        // a long prompt first, a short one after it, two decoders
        assert_eq!(
            s.shared.shares(&[4096, 30, 0, 0], false),
            vec![482, 30, 1, 1]
        );
        // after a long part: only what finishes (the long prompt sits this round out)
        assert_eq!(s.shared.shares(&[4096, 30, 0, 0], true), vec![0, 30, 1, 1]);
        // nothing finishes: the long prompt goes on at once
        assert_eq!(s.shared.shares(&[4096, 3000], true), vec![256, 256]);
        // equal prompts split evenly; the odd token goes to the first
        assert_eq!(s.shared.shares(&[1000, 1000], false), vec![256, 256]);
        assert_eq!(
            s.shared.shares(&[1000, 1000, 1000], false),
            vec![171, 171, 170]
        );
        // what fits is fed whole
        assert_eq!(s.shared.shares(&[100, 200], false), vec![100, 200]);
        // more prompts than tokens: the first ones get one each, the last wait
        let t = Scheduler::new(2);
        assert_eq!(t.shared.shares(&[5, 5, 5, 0], false), vec![1, 1, 0, 1]);
    }
}
