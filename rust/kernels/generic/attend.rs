//! The f32 dot products, and the attention of query heads against their shared keys.

use super::decode::ld;
use super::simd::Simd;

// ---- the dot products ----
//
// Two, for two contracts. `dot16` gives the same bits on every tier and CPU (the norms and
// the hyper-connection mixes: `ops::dot`). `dot` runs in the tier's own lanes with FMA, the
// chain `attend` computes for each (head, key) too (the indexer's scores: `kernels::dot`);
// tiers differ in it at rounding level.

/// a · b over min(len) columns with the same bits on every tier and CPU: 16 lanes, lane l a
/// chain over the columns c = l (mod 16) of separate multiplies and adds (two roundings,
/// never fused: without a hardware FMA `mul_add` is a libm call per element), the last
/// len % 16 products into their lanes, then lane i += lane i + h for h = 8, 4, 2, 1. A tier
/// only holds the lanes in its registers (16 / L vectors, whose `Simd::hsum` is that tree), so
/// it runs the definition faster, never differently (the RMSNorms and the hyper-connection
/// mixes: a 196-token run on Zen 4 spent 1.6 % of its samples here as compiled for SSE2, 0.6 %
/// in AVX-512 registers).
#[inline(always)]
pub(crate) fn dot16<S: Simd>(s: S, a: &[f32], b: &[f32]) -> f32 {
    const W: usize = 16;
    // the 16 lanes as one vector or two (lanes 0..L, then L..16)
    const { assert!(S::LANES == W || 2 * S::LANES == W) };
    let (l, nv) = (S::LANES, W / S::LANES);
    let d = a.len().min(b.len());
    let (a, b) = (&a[..d], &b[..d]);
    let full = d / W * W;
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    let mut acc = [s.splat(0.0); 2];
    let mut c = 0;
    while c < full {
        for j in 0..nv {
            // SAFETY: c + 16 <= full <= d, the length of both slices.
            let (x, y) = unsafe { (s.load(ap.add(c + j * l)), s.load(bp.add(c + j * l))) };
            acc[j] = s.add(acc[j], s.mul(x, y));
        }
        c += W;
    }
    if full < d {
        // the tail into its lanes, zero padded: the other lanes gain 0 * 0 = +0, which leaves
        // them as they were (a lane is never -0: it starts at +0, and a sum rounds to -0 only
        // when both its terms are -0)
        let (mut ta, mut tb) = ([0f32; W], [0f32; W]);
        for (i, (x, y)) in a[full..].iter().zip(&b[full..]).enumerate() {
            (ta[i], tb[i]) = (*x, *y);
        }
        for j in 0..nv {
            acc[j] = s.add(acc[j], s.mul(ld(s, &ta, j * l), ld(s, &tb, j * l)));
        }
    }
    // lane i += lane i + 8 (the second vector), then the rest of the tree
    s.hsum(if nv == 2 {
        s.add(acc[0], acc[1])
    } else {
        acc[0]
    })
}

// ---- attention: query heads against their shared keys ----
//
// `dot` is one FMA chain over L-lane chunks in order, then the fixed-tree `hsum`, then the
// tail columns added in order: the same value for a pair of vectors wherever it is computed.
// `attend` takes, per head, the dots of its query with each key (that same chain), a softmax
// over them and the sink, and the probability-weighted sum of the keys, each output column
// summed over the keys in order. How heads and keys are grouped around those chains (four
// heads sharing each key load, or one head alone) never changes a head's result.

/// a · b over min(len) columns in the tier's lanes (section comment above).
#[inline(always)]
pub(crate) fn dot<S: Simd>(s: S, a: &[f32], b: &[f32]) -> f32 {
    let d = a.len().min(b.len());
    let (a, b) = (&a[..d], &b[..d]);
    let full = d / S::LANES * S::LANES;
    let mut acc = s.splat(0.0);
    let mut c = 0;
    while c < full {
        acc = s.fma(ld(s, a, c), ld(s, b, c), acc);
        c += S::LANES;
    }
    dot_finish(s, acc, a, b, full)
}

/// Attention of h heads of one query against the same keys (one KV head, as in V4):
/// q [h, d], sinks [h], out [h, d]; each head's out = Σ_j p_j · keys[j] with
/// p = softmax([q_h · keys[j] · scale]_j ++ [sink_h]) (the sink only takes part in the
/// normaliser). Every key holds at least d values. Heads go four at a time (each key chunk
/// loaded once for the four), the rest one by one (`attend_heads` with H = 4, then 1); a
/// head's result is the same either way, bit for bit (section comment above).
#[inline(always)]
pub(crate) fn attend<S: Simd>(
    s: S,
    q: &[f32],
    keys: &[&[f32]],
    (scale, sinks): (f32, &[f32]),
    out: &mut [f32],
) {
    let h = sinks.len();
    assert!(h > 0 && q.len() == out.len() && q.len().is_multiple_of(h));
    let d = q.len() / h;
    let mut hb = 0;
    while hb + 4 <= h {
        let qs = [0, 1, 2, 3].map(|i| &q[(hb + i) * d..(hb + i + 1) * d]);
        let sk = [0, 1, 2, 3].map(|i| sinks[hb + i]);
        attend_heads::<S, 4>(s, qs, keys, scale, sk, &mut out[hb * d..(hb + 4) * d]);
        hb += 4;
    }
    for i in hb..h {
        let o = &mut out[i * d..(i + 1) * d];
        attend_heads::<S, 1>(s, [&q[i * d..(i + 1) * d]], keys, scale, [sinks[i]], o);
    }
}

/// H heads of `attend` (q: their queries, [d] each; out [H, d]). The dots go two keys at a
/// time for the H heads, the weighted sums two chunks at a time for the H heads; each
/// (head, key) dot is `dot`'s chain and each (head, chunk) sum runs over the keys in order,
/// whatever H.
#[inline(always)]
fn attend_heads<S: Simd, const H: usize>(
    s: S,
    q: [&[f32]; H],
    keys: &[&[f32]],
    scale: f32,
    sinks: [f32; H],
    out: &mut [f32],
) {
    let (l, d, nk) = (S::LANES, q[0].len(), keys.len());
    assert!(q.iter().all(|v| v.len() == d) && out.len() == H * d);
    assert!(keys.iter().all(|k| k.len() >= d));
    let full = d / l * l;
    let qp = q.map(|v| v.as_ptr());
    let zero = s.splat(0.0);
    let mut p: [Vec<f32>; H] = std::array::from_fn(|_| Vec::with_capacity(nk + 1));
    let mut pairs = keys.chunks_exact(2);
    for kk in &mut pairs {
        let (kp0, kp1) = (kk[0].as_ptr(), kk[1].as_ptr());
        let (mut a0, mut a1) = ([zero; H], [zero; H]);
        let mut c = 0;
        while c < full {
            // SAFETY: c + L <= full <= d, and every query and key holds at least d values
            // (asserted above).
            unsafe {
                let (k0, k1) = (s.load(kp0.add(c)), s.load(kp1.add(c)));
                for h in 0..H {
                    let qv = s.load(qp[h].add(c));
                    a0[h] = s.fma(qv, k0, a0[h]);
                    a1[h] = s.fma(qv, k1, a1[h]);
                }
            }
            c += l;
        }
        for h in 0..H {
            p[h].push(dot_finish(s, a0[h], q[h], kk[0], full) * scale);
            p[h].push(dot_finish(s, a1[h], q[h], kk[1], full) * scale);
        }
    }
    if let [k] = pairs.remainder() {
        let kp = k.as_ptr();
        let mut a = [zero; H];
        let mut c = 0;
        while c < full {
            // SAFETY: as above.
            unsafe {
                let kv = s.load(kp.add(c));
                for h in 0..H {
                    a[h] = s.fma(s.load(qp[h].add(c)), kv, a[h]);
                }
            }
            c += l;
        }
        for h in 0..H {
            p[h].push(dot_finish(s, a[h], q[h], k, full) * scale);
        }
    }
    for h in 0..H {
        p[h].push(sinks[h]);
        softmax(&mut p[h]);
    }
    // p[h] holds nk + 1 values (the keys', then the sink's)
    let pp: [*const f32; H] = std::array::from_fn(|h| p[h].as_ptr());
    let op = out.as_mut_ptr();
    let mut c = 0;
    while c + 2 * l <= full {
        let (mut a0, mut a1) = ([zero; H], [zero; H]);
        for (j, k) in keys.iter().enumerate() {
            let kp = k.as_ptr();
            // SAFETY: c + 2L <= full <= d <= k.len() (asserted above); j < nk < p[h].len().
            unsafe {
                let (k0, k1) = (s.load(kp.add(c)), s.load(kp.add(c + l)));
                for h in 0..H {
                    let pv = s.splat(*pp[h].add(j));
                    a0[h] = s.fma(pv, k0, a0[h]);
                    a1[h] = s.fma(pv, k1, a1[h]);
                }
            }
        }
        for h in 0..H {
            // SAFETY: out holds [H, d] (asserted) and c + 2L <= d.
            unsafe {
                s.store(op.add(h * d + c), a0[h]);
                s.store(op.add(h * d + c + l), a1[h]);
            }
        }
        c += 2 * l;
    }
    if c < full {
        let mut a = [zero; H];
        for (j, k) in keys.iter().enumerate() {
            let kp = k.as_ptr();
            // SAFETY: as above, with c + L <= full.
            unsafe {
                let kv = s.load(kp.add(c));
                for h in 0..H {
                    a[h] = s.fma(s.splat(*pp[h].add(j)), kv, a[h]);
                }
            }
        }
        for h in 0..H {
            // SAFETY: out holds [H, d] and c + L <= d.
            unsafe { s.store(op.add(h * d + c), a[h]) };
        }
    }
    for h in 0..H {
        for i in full..d {
            let mut v = 0f32;
            for (k, &pj) in keys.iter().zip(&p[h]) {
                v += pj * k[i];
            }
            out[h * d + i] = v;
        }
    }
}

/// The dot of q and k from its chain over the first `full` columns: hsum, then the tail
/// columns in order (as `dot`).
#[inline(always)]
fn dot_finish<S: Simd>(s: S, acc: S::V, q: &[f32], k: &[f32], full: usize) -> f32 {
    let mut r = s.hsum(acc);
    for i in full..q.len() {
        r += q[i] * k[i];
    }
    r
}

/// Numerically stable softmax in place (`attend`'s, and the model's: `ops::softmax`).
pub fn softmax(x: &mut [f32]) {
    let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut s = 0f32;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        s += *v;
    }
    for v in x.iter_mut() {
        *v /= s;
    }
}

/// Register-only FMA loop for the benchmark's peak: C independent chains.
#[inline(always)]
pub(crate) fn fma_probe<S: Simd, const C: usize>(s: S, iters: usize) -> f32 {
    let mut acc = [s.splat(1.0); C];
    let (a, b) = (s.splat(0.999_999), s.splat(1e-7));
    for _ in 0..iters {
        for v in acc.iter_mut() {
            *v = s.fma(*v, a, b);
        }
    }
    let mut t = s.splat(0.0);
    for v in acc {
        t = s.add(t, v);
    }
    s.hsum(t)
}
