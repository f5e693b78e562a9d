//! The kernel tiers and the choice between them.
//!
//! A tier is the set of loops compiled for one CPU feature level (AVX-512, AVX2+FMA on
//! x86_64; NEON+dotprod, NEON on aarch64; portable everywhere). The best tier the CPU
//! supports is chosen once at run time (`active_tier`); `V4FLASH_KERNELS=portable|neon|
//! neon-dotprod|avx2|avx512` (`Tuning::kernels`) forces one, and asking for one the CPU lacks
//! (or an unknown name) prints a one-time warning on stderr and uses the best available tier
//! instead. A tier's kernel exists only once detected (`detect`), and `with_kernel!` is the
//! only place that picks one.

#[cfg(target_arch = "aarch64")]
use super::aarch64;
use super::portable::Portable;
#[cfg(target_arch = "x86_64")]
use super::x86;
use crate::tuning::Tuning;
use std::sync::OnceLock;

/// A kernel tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    Portable,
    /// x86_64: avx2 + fma + f16c.
    Avx2,
    /// x86_64: avx512f/bw/vl + avx2 + fma + f16c.
    Avx512,
    /// aarch64: NEON (every aarch64 CPU).
    Neon,
    /// aarch64: NEON + dotprod (`sdot` for the int8 path).
    NeonDot,
}

impl Tier {
    /// All tiers of every architecture, best first within each.
    pub const ALL: [Tier; 5] = [
        Tier::Avx512,
        Tier::Avx2,
        Tier::NeonDot,
        Tier::Neon,
        Tier::Portable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Tier::Portable => "portable",
            Tier::Avx2 => "avx2",
            Tier::Avx512 => "avx512",
            Tier::Neon => "neon",
            Tier::NeonDot => "neon-dotprod",
        }
    }

    /// The names, for messages ("portable|neon|...|avx512").
    pub fn names() -> String {
        let mut v: Vec<&str> = Tier::ALL.iter().map(|t| t.name()).collect();
        v.reverse();
        v.join("|")
    }

    pub fn from_name(s: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|t| t.name() == s)
    }

    /// Whether this CPU can run the tier.
    pub fn available(self) -> bool {
        self == Tier::Portable || !matches!(detect(self), Detected::Portable(_))
    }

    /// The best tier this CPU supports.
    pub fn best() -> Tier {
        Tier::ALL
            .into_iter()
            .find(|t| t.available())
            .unwrap_or(Tier::Portable)
    }
}

/// The tier `matmul` uses: `Tuning::kernels` (`V4FLASH_KERNELS`) if set and available, else
/// the best one.
pub fn active_tier() -> Tier {
    static ACTIVE: OnceLock<Tier> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        let best = Tier::best();
        match Tuning::process().kernels.as_deref() {
            None => best,
            Some(s) => match Tier::from_name(s) {
                Some(t) if t.available() => t,
                Some(t) => {
                    eprintln!(
                        "v4flash: V4FLASH_KERNELS={s}: this CPU lacks the {} tier, using {}",
                        t.name(),
                        best.name()
                    );
                    best
                }
                None => {
                    eprintln!(
                        "v4flash: V4FLASH_KERNELS={s} is not one of {}, using {}",
                        Tier::names(),
                        best.name()
                    );
                    best
                }
            },
        }
    })
}

/// The kernel of a tier, detected: a value exists only where the CPU runs the tier.
#[derive(Clone, Copy)]
pub(crate) enum Detected {
    #[cfg(target_arch = "x86_64")]
    Avx512(x86::Avx512),
    #[cfg(target_arch = "x86_64")]
    Avx2(x86::Avx2),
    #[cfg(target_arch = "aarch64")]
    NeonDot(aarch64::NeonDot),
    #[cfg(target_arch = "aarch64")]
    Neon(aarch64::Neon),
    Portable(Portable),
}

/// `tier`'s kernel where the CPU runs it, else the portable one (callers check
/// `Tier::available` first where that matters).
#[inline(always)]
pub(crate) fn detect(tier: Tier) -> Detected {
    let k = match tier {
        #[cfg(target_arch = "x86_64")]
        Tier::Avx512 => x86::Avx512::detect().map(Detected::Avx512),
        #[cfg(target_arch = "x86_64")]
        Tier::Avx2 => x86::Avx2::detect().map(Detected::Avx2),
        #[cfg(target_arch = "aarch64")]
        Tier::NeonDot => aarch64::NeonDot::detect().map(Detected::NeonDot),
        #[cfg(target_arch = "aarch64")]
        Tier::Neon => aarch64::Neon::detect().map(Detected::Neon),
        // the portable tier, and a tier of another architecture
        _ => None,
    };
    k.unwrap_or(Detected::Portable(Portable))
}

/// Binds `$k` to the kernel of `$tier` (`detect`) and evaluates `$body` with it: every tier
/// is a different type, so `$body` is compiled once per tier.
macro_rules! with_kernel {
    ($tier:expr, $k:ident => $body:expr) => {
        match $crate::kernels::tier::detect($tier) {
            #[cfg(target_arch = "x86_64")]
            $crate::kernels::tier::Detected::Avx512($k) => $body,
            #[cfg(target_arch = "x86_64")]
            $crate::kernels::tier::Detected::Avx2($k) => $body,
            #[cfg(target_arch = "aarch64")]
            $crate::kernels::tier::Detected::NeonDot($k) => $body,
            #[cfg(target_arch = "aarch64")]
            $crate::kernels::tier::Detected::Neon($k) => $body,
            $crate::kernels::tier::Detected::Portable($k) => $body,
        }
    };
}
pub(crate) use with_kernel;
