//! Working buffers of the forward pass, reused while a pass runs.
//!
//! A large allocation comes straight from the operating system: glibc maps every block
//! above its threshold (at most 32 MiB, and any block too large for a thread's 64 MiB heap)
//! on its own, and unmaps it when it is freed. Each of its pages is then faulted in and
//! zeroed by the kernel at first touch, every time. A prefill allocates the same shapes for
//! every layer and every chunk: the attention's queries and outputs ([chunk, heads ·
//! head_dim] f32, 64 MiB each at 512 tokens of V4-Flash), every product's output and its
//! parallel tasks' blocks, the experts' inputs and outputs. Measured on an Intel Xeon VM
//! (benches/README.md, "Reused buffers"): a 2,048-token prefill faulted in about 3 GB and
//! spent 8–10 % of its samples in the kernel's page clearing and fault handling.
//!
//! A [`Pool`] keeps the buffers freed while a [`Scope`] is open (`Model::forward` opens
//! one) and hands them out again, zeroed. It keeps at most the open scopes' largest limit,
//! counting both the buffers handed out and the ones kept, and lets every kept buffer go
//! when the last scope closes, so an idle model holds nothing. Buffers under `MIN_BYTES`
//! bypass it: the allocator already reuses those without going to the kernel.
//!
//! Every buffer is 64-byte aligned, so that the kernels' vector loads of x, decoded
//! weights and accumulators (rows padded to whole vectors) never straddle a cache line: a
//! split load costs two, and `Vec<f32>` promises only 4-byte alignment (measured: the
//! AVX-512 prefill tile at 62 % of the FMA peak on the allocator's 16-byte alignment, 71 %
//! aligned).

use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard};

/// Buffers smaller than this are not pooled.
pub const MIN_BYTES: usize = 256 << 10;

/// A best fit may be at most this many times the size asked for, so that a small request
/// does not take a buffer a large one will want again.
const FIT_RATIO: usize = 4;

/// One cache line of f32.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

const ZERO: Line = Line([0.0; 16]);

/// Bytes of `lines` cache lines.
fn line_bytes(lines: usize) -> usize {
    lines.saturating_mul(std::mem::size_of::<Line>())
}

/// A zeroed, 64-byte aligned f32 buffer; it goes back to its pool when dropped.
pub struct Buf {
    lines: Vec<Line>,
    len: usize,
    /// The pool it returns to, with whether its bytes count as handed out there.
    home: Option<&'static Pool>,
}

impl Buf {
    /// A buffer of `len` zeros that no pool keeps.
    pub fn unpooled(len: usize) -> Buf {
        Buf {
            lines: vec![ZERO; len.div_ceil(16)],
            len,
            home: None,
        }
    }
}

impl Deref for Buf {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: `Line` is repr(C) of [f32; 16] and 64 bytes (no padding), so the lines are
        // contiguous initialised f32, at least `len` of them (every constructor makes
        // `lines.len() * 16 >= len`, and `lines` never shrinks while the `Buf` lives).
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast(), self.len) }
    }
}

impl DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `deref`, and the borrow of `self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast(), self.len) }
    }
}

impl std::fmt::Debug for Buf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buf").field("len", &self.len).finish()
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        if let Some(pool) = self.home {
            pool.give(std::mem::take(&mut self.lines));
        }
    }
}

/// Freed buffers kept for reuse while a scope is open (see the module).
pub struct Pool {
    inner: Mutex<Inner>,
}

struct Inner {
    /// Kept buffers (each `Vec`'s length is its whole size in lines).
    free: Vec<Vec<Line>>,
    /// Bytes in `free`.
    kept: usize,
    /// Bytes of this pool's buffers handed out and not yet back.
    out: usize,
    /// The limits of the open scopes.
    scopes: Vec<usize>,
}

/// What a pool holds, for tests and measurements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes kept for reuse.
    pub kept: usize,
    /// Bytes handed out and not yet back.
    pub out: usize,
    /// Open scopes.
    pub scopes: usize,
}

impl Default for Pool {
    fn default() -> Self {
        Self::new()
    }
}

impl Pool {
    pub const fn new() -> Pool {
        Pool {
            inner: Mutex::new(Inner {
                free: Vec::new(),
                kept: 0,
                out: 0,
                scopes: Vec::new(),
            }),
        }
    }

    /// The lock; a panic elsewhere while it was held cannot leave the lists inconsistent
    /// (every update below is a push, a removal or an addition), so a poisoned lock is used
    /// as it is.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `len` zeros: a kept buffer when one fits (the smallest at least `len`, at most
    /// `FIT_RATIO` times it), else a new one, which this pool may keep once it is dropped
    /// (while a scope is open).
    pub fn zeroed(&'static self, len: usize) -> Buf {
        let lines = len.div_ceil(16);
        let bytes = line_bytes(lines);
        if bytes < MIN_BYTES {
            return Buf::unpooled(len);
        }
        let mut g = self.lock();
        if g.scopes.is_empty() {
            drop(g);
            return Buf::unpooled(len);
        }
        let pick = g
            .free
            .iter()
            .enumerate()
            .filter(|(_, v)| v.len() >= lines && v.len() / FIT_RATIO <= lines)
            .min_by_key(|(_, v)| v.len())
            .map(|(i, _)| i);
        match pick {
            Some(i) => {
                let mut v = g.free.swap_remove(i);
                let b = line_bytes(v.len());
                g.kept -= b;
                g.out += b;
                drop(g);
                v[..lines].fill(ZERO);
                Buf {
                    lines: v,
                    len,
                    home: Some(self),
                }
            }
            None => {
                g.out += bytes;
                drop(g);
                Buf {
                    lines: vec![ZERO; lines],
                    len,
                    home: Some(self),
                }
            }
        }
    }

    /// A buffer back from use: kept if a scope is open and the pool stays within its
    /// limit, else freed (outside the lock).
    fn give(&self, v: Vec<Line>) {
        let b = line_bytes(v.len());
        let mut g = self.lock();
        g.out -= b;
        let limit = g.scopes.iter().copied().max().unwrap_or(0);
        if g.kept + g.out + b <= limit {
            g.kept += b;
            g.free.push(v);
            return;
        }
        drop(g);
        drop(v);
    }

    /// Opens a scope: until it closes, freed buffers are kept, up to `limit` bytes in all
    /// (out and kept) or the largest limit of the scopes open with it.
    pub fn scope(&'static self, limit: usize) -> Scope {
        self.lock().scopes.push(limit);
        Scope { pool: self, limit }
    }

    pub fn stats(&self) -> PoolStats {
        let g = self.lock();
        PoolStats {
            kept: g.kept,
            out: g.out,
            scopes: g.scopes.len(),
        }
    }
}

/// While it lives, its pool keeps freed buffers; the last scope to close frees them all.
pub struct Scope {
    pool: &'static Pool,
    limit: usize,
}

impl Drop for Scope {
    fn drop(&mut self) {
        let mut g = self.pool.lock();
        if let Some(i) = g.scopes.iter().position(|&l| l == self.limit) {
            g.scopes.swap_remove(i);
        }
        // the limit may have fallen: keep what still fits (nothing once none is open)
        let limit = g.scopes.iter().copied().max().unwrap_or(0);
        let mut gone = Vec::new();
        while g.kept + g.out > limit {
            let Some(v) = g.free.pop() else { break };
            g.kept -= line_bytes(v.len());
            gone.push(v);
        }
        drop(g);
        drop(gone);
    }
}

/// The process's pool, which the forward pass and the kernels use.
pub fn global() -> &'static Pool {
    static POOL: Pool = Pool::new();
    &POOL
}

/// `len` zeros from the process's pool.
pub fn zeroed(len: usize) -> Buf {
    global().zeroed(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> &'static Pool {
        Box::leak(Box::new(Pool::new()))
    }

    const BIG: usize = MIN_BYTES; // f32: 4 × MIN_BYTES bytes

    fn held(kept: usize, out: usize, scopes: usize) -> PoolStats {
        PoolStats { kept, out, scopes }
    }

    #[test]
    fn a_reused_buffer_comes_back_zeroed_and_aligned() {
        let p = pool();
        let s = p.scope(64 * BIG);
        let mut a = p.zeroed(BIG);
        let at = a.as_ptr();
        a.iter_mut().for_each(|v| *v = 7.0);
        drop(a);
        assert_eq!(p.stats().kept, 4 * BIG);
        let b = p.zeroed(BIG - 5);
        assert_eq!(b.as_ptr(), at, "the kept buffer is handed out again");
        assert_eq!(b.len(), BIG - 5);
        assert!(b.iter().all(|&v| v == 0.0));
        assert_eq!(b.as_ptr() as usize % 64, 0);
        assert_eq!(p.stats(), held(0, 4 * BIG, 1));
        drop(b);
        drop(s);
        assert_eq!(p.stats(), held(0, 0, 0));
    }

    #[test]
    fn nothing_is_kept_without_a_scope_or_below_the_minimum() {
        let p = pool();
        drop(p.zeroed(BIG));
        assert_eq!(p.stats().kept, 0);
        let s = p.scope(64 * BIG);
        let small = p.zeroed(MIN_BYTES / 4 - 16);
        assert!(small.iter().all(|&v| v == 0.0));
        drop(small);
        assert_eq!(p.stats(), held(0, 0, 1));
        drop(s);
    }

    #[test]
    fn the_pool_stays_within_its_limit_counting_what_is_out() {
        let p = pool();
        let s = p.scope(3 * 4 * BIG); // three buffers of BIG f32
        let bufs: Vec<Buf> = (0..4).map(|_| p.zeroed(BIG)).collect();
        assert_eq!(p.stats().out, 16 * BIG);
        drop(bufs);
        // after each return, kept + out <= limit: 3 of the 4 are kept
        let st = p.stats();
        assert_eq!((st.kept, st.out), (12 * BIG, 0));
        drop(s);
        assert_eq!(p.stats(), held(0, 0, 0));
    }

    #[test]
    fn a_best_fit_takes_the_smallest_buffer_large_enough_and_never_one_far_too_large() {
        let p = pool();
        let s = p.scope(64 * BIG);
        let min = MIN_BYTES / 4; // the smallest pooled request, in f32
        let (a, b) = (p.zeroed(5 * min), p.zeroed(2 * min));
        let (at_a, at_b) = (a.as_ptr(), b.as_ptr());
        drop((a, b));
        let c = p.zeroed(min);
        assert_eq!(c.as_ptr(), at_b, "the smallest that fits");
        let d = p.zeroed(min);
        assert_ne!(
            d.as_ptr(),
            at_a,
            "5 times the request is more than FIT_RATIO"
        );
        assert_eq!(p.stats().kept, 5 * MIN_BYTES);
        drop((c, d, s));
    }

    #[test]
    fn kept_buffers_go_when_the_last_scope_closes() {
        let p = pool();
        let outer = p.scope(16 * BIG);
        let inner = p.scope(4 * BIG);
        let a = p.zeroed(BIG);
        let b = p.zeroed(BIG);
        drop((a, b));
        assert_eq!(p.stats().kept, 8 * BIG);
        drop(outer);
        // the inner scope's limit is now the only one: one buffer stays
        assert_eq!(p.stats(), held(4 * BIG, 0, 1));
        // one taken and returned after the last scope closed is freed
        let c = p.zeroed(BIG);
        drop(inner);
        assert_eq!(p.stats(), held(0, 4 * BIG, 0));
        drop(c);
        assert_eq!(p.stats(), held(0, 0, 0));
    }
}
