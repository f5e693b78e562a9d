//! The engine's switches: every `V4FLASH_*` environment variable, read here and nowhere else.
//!
//! Two kinds. The **kernel** switches (`kernels`, `bf16`, `fast_products`, `fp8_bits`,
//! `gemm_x_ahead`) pick compiled code paths for the whole process: the kernels decide them
//! once, the first time they run, from `Tuning::process()` (the environment at that moment),
//! and every model of the process shares them. The **per-model** switches (`lookahead`,
//! `prefault`, `io_uring`) are fields of `LoadOptions`: `Tuning::from_env()` fills them for
//! a load, and a caller may set them per model. None of them changes a result, only the speed
//! (or which kernels run, which give the same bits in exact mode); `stats()` and `plan()`
//! report what is in force.
//!
//! | variable | values | default |
//! |---|---|---|
//! | `V4FLASH_KERNELS` | `avx512`, `avx2`, `neon-dotprod`, `neon`, `portable` | the best the CPU has |
//! | `V4FLASH_BF16` | `on`, `off` | on where avx512_bf16 runs at full rate |
//! | `V4FLASH_FAST_PRODUCTS` | `int8`, `f32` | f32 on x86, int8 elsewhere |
//! | `V4FLASH_FP8_BITS` | `on`, `off` | on for AMD CPUs |
//! | `V4FLASH_GEMM_X_AHEAD` | `on`, `off` | off for AMD CPUs |
//! | `V4FLASH_LOOKAHEAD` | `0` turns it off | on |
//! | `V4FLASH_PREFAULT` | `0` turns it off | on |
//! | `V4FLASH_IO_URING` | `0` turns it off | on (Linux) |

use std::sync::OnceLock;

/// An on/off override: `on`/`1` → Some(true), `off`/`0` → Some(false), unset → None (the
/// rule of the switch decides). Anything else is reported once and ignored.
pub type Switch = Option<bool>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tuning {
    /// `V4FLASH_KERNELS`: the kernel tier's name, None for the best one.
    pub kernels: Option<String>,
    /// `V4FLASH_BF16`: `vdpbf16ps` products for fast and official numerics.
    pub bf16: Switch,
    /// `V4FLASH_FAST_PRODUCTS`: `int8` or `f32` where bf16 products are off.
    pub fast_products: Option<String>,
    /// `V4FLASH_FP8_BITS`: FP8 decoded from its bits rather than through f16.
    pub fp8_bits: Switch,
    /// `V4FLASH_GEMM_X_AHEAD`: the prefill tile reads the next token tile's x ahead.
    pub gemm_x_ahead: Switch,
    /// `V4FLASH_LOOKAHEAD`: learned layers' experts guessed and read during the attention.
    pub lookahead: bool,
    /// `V4FLASH_PREFAULT`: a background thread touches the expert cache's pages at idle
    /// priority.
    pub prefault: bool,
    /// `V4FLASH_IO_URING`: io_uring for direct reads on Linux (else a pread pool).
    pub io_uring: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            kernels: None,
            bf16: None,
            fast_products: None,
            fp8_bits: None,
            gemm_x_ahead: None,
            lookahead: true,
            prefault: true,
            io_uring: true,
        }
    }
}

/// The variables, in the order of the table above.
pub const VARIABLES: [&str; 8] = [
    "V4FLASH_KERNELS",
    "V4FLASH_BF16",
    "V4FLASH_FAST_PRODUCTS",
    "V4FLASH_FP8_BITS",
    "V4FLASH_GEMM_X_AHEAD",
    "V4FLASH_LOOKAHEAD",
    "V4FLASH_PREFAULT",
    "V4FLASH_IO_URING",
];

impl Tuning {
    /// The switches as the environment sets them now.
    pub fn from_env() -> Tuning {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// The switches from `get` (a variable's value, None when unset).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Tuning {
        let text = |k: &str| get(k).filter(|s| !s.is_empty());
        let switch = |k: &str| match get(k).as_deref() {
            Some("on" | "1") => Some(true),
            Some("off" | "0") => Some(false),
            None | Some("") => None,
            Some(other) => {
                warn_once(k, other, "on or off");
                None
            }
        };
        let not_zero = |k: &str| get(k).as_deref() != Some("0");
        let fast = text("V4FLASH_FAST_PRODUCTS").filter(|s| {
            let ok = matches!(s.as_str(), "int8" | "f32");
            if !ok {
                warn_once("V4FLASH_FAST_PRODUCTS", s, "int8 or f32");
            }
            ok
        });
        Tuning {
            kernels: text("V4FLASH_KERNELS"),
            bf16: switch("V4FLASH_BF16"),
            fast_products: fast,
            fp8_bits: switch("V4FLASH_FP8_BITS"),
            gemm_x_ahead: switch("V4FLASH_GEMM_X_AHEAD"),
            lookahead: not_zero("V4FLASH_LOOKAHEAD"),
            prefault: not_zero("V4FLASH_PREFAULT"),
            io_uring: not_zero("V4FLASH_IO_URING"),
        }
    }

    /// The switches the kernels of this process use: the environment the first time any
    /// kernel asks (they decide their paths once).
    pub fn process() -> &'static Tuning {
        static T: OnceLock<Tuning> = OnceLock::new();
        T.get_or_init(Tuning::from_env)
    }
}

/// Reports a value a switch does not know, once per variable.
fn warn_once(var: &str, value: &str, expected: &str) {
    static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if !seen.iter().any(|v| v == var) {
        seen.push(var.to_string());
        eprintln!("v4flash: {var}={value} is not {expected}, ignored");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(pairs: &[(&str, &str)]) -> Tuning {
        Tuning::from_vars(|k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn unset_is_the_default() {
        assert_eq!(from(&[]), Tuning::default());
        assert_eq!(from(&[("V4FLASH_KERNELS", "")]), Tuning::default());
    }

    #[test]
    fn every_variable_sets_its_field() {
        let t = from(&[
            ("V4FLASH_KERNELS", "avx2"),
            ("V4FLASH_BF16", "off"),
            ("V4FLASH_FAST_PRODUCTS", "int8"),
            ("V4FLASH_FP8_BITS", "1"),
            ("V4FLASH_GEMM_X_AHEAD", "0"),
            ("V4FLASH_LOOKAHEAD", "0"),
            ("V4FLASH_PREFAULT", "0"),
            ("V4FLASH_IO_URING", "0"),
        ]);
        let want = Tuning {
            kernels: Some("avx2".into()),
            bf16: Some(false),
            fast_products: Some("int8".into()),
            fp8_bits: Some(true),
            gemm_x_ahead: Some(false),
            lookahead: false,
            prefault: false,
            io_uring: false,
        };
        assert_eq!(t, want);
        // unknown values are ignored (the rule decides)
        let t = from(&[("V4FLASH_BF16", "maybe"), ("V4FLASH_FAST_PRODUCTS", "fp16")]);
        assert_eq!((t.bf16, t.fast_products), (None, None));
        // only "0" turns a per-model switch off
        assert!(from(&[("V4FLASH_PREFAULT", "off")]).prefault);
    }

    #[test]
    fn the_table_names_every_variable_this_file_reads() {
        let src = include_str!("tuning.rs");
        for v in VARIABLES {
            assert!(src.matches(v).count() >= 3, "{v}");
        }
    }
}
