//! The f32 vector operations an x86 tier takes straight from one intrinsic each, written once
//! for both tiers (`lane_methods!`).

/// `splat`, `load`, `store`, `add`, `mul` and `fma` of `Simd` for an x86 tier whose vector
/// type is `$v`, each one intrinsic of the tier (`set1`, `loadu`, `storeu`, `add`, `mul`,
/// `fmadd`): inside the tier's `impl Simd`.
macro_rules! lane_methods {
    ($v:ty, $set1:path, $loadu:path, $storeu:path, $add:path, $mul:path, $fmadd:path) => {
        #[inline(always)]
        fn splat(self, x: f32) -> $v {
            // SAFETY: see the impl.
            unsafe { $set1(x) }
        }

        #[inline(always)]
        unsafe fn load(self, p: *const f32) -> $v {
            // SAFETY: see the impl; `p` is valid for L f32 (caller).
            unsafe { $loadu(p) }
        }

        #[inline(always)]
        unsafe fn store(self, p: *mut f32, v: $v) {
            // SAFETY: see the impl; `p` is valid for L f32 (caller).
            unsafe { $storeu(p, v) }
        }

        #[inline(always)]
        fn add(self, a: $v, b: $v) -> $v {
            // SAFETY: see the impl.
            unsafe { $add(a, b) }
        }

        #[inline(always)]
        fn mul(self, a: $v, b: $v) -> $v {
            // SAFETY: see the impl.
            unsafe { $mul(a, b) }
        }

        #[inline(always)]
        fn fma(self, a: $v, b: $v, c: $v) -> $v {
            // SAFETY: see the impl.
            unsafe { $fmadd(a, b, c) }
        }
    };
}
pub(crate) use lane_methods;
