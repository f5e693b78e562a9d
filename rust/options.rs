//! What loading a model (and planning one) takes: `LoadOptions`, the one list of the options,
//! their defaults and their rules. Python's `load(path, **options)` and `plan(path,
//! **options)` hand their keyword arguments to `LoadOptions::set` one by one, which checks
//! each (name, kind, range) and converts units (GB and MiB to bytes).

use crate::args::Arg;
use crate::error::{Error, Result};
use crate::kernels::Numerics;
use crate::store::io::IoMode;
use crate::store::policy::Policy;
use crate::tuning::Tuning;
use std::num::NonZeroUsize;

pub struct LoadOptions {
    /// Compute threads; the machine's parallelism when None.
    pub threads: Option<NonZeroUsize>,
    /// Budget for the whole process's resident memory, in bytes.
    pub ram_bytes: Option<u64>,
    pub io: IoMode,
    pub policy: Policy,
    pub io_threads: NonZeroUsize,
    /// Bytes of routed experts held in memory (at least one expert).
    pub expert_cache_bytes: Option<u64>,
    /// Context length (tokens per session); defaults to min(max_position_embeddings,
    /// `plan::DEFAULT_CTX`).
    pub ctx: Option<NonZeroUsize>,
    /// Sessions the memory plan holds state for at `ctx` (a server's sequences stepped
    /// together); 1 by default.
    pub sessions: NonZeroUsize,
    /// Prompt tokens the scheduler feeds per round when sessions are stepped together
    /// (`schedule::default_round_prefill` when None): smaller lets a new request in sooner
    /// behind a long prompt, larger feeds long prompts faster when experts stream.
    pub round_prefill: Option<NonZeroUsize>,
    /// How activations meet the weights (`kernels::Numerics`).
    pub numerics: Numerics,
    /// The per-model switches (`lookahead`, `prefault`, `io_uring`; `Tuning::from_env` by
    /// default). Its kernel switches are the process's (`Tuning::process`).
    pub tuning: Tuning,
    /// Load the checkpoint's DSpark drafter (`model::dspark`): its resident tensors and an
    /// expert cache of its own, counted in the plan. Off by default.
    pub drafter: bool,
    /// Speculative decoding by default (`speculate::Mode`; a generation may ask otherwise).
    pub speculate: crate::speculate::Mode,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            threads: None,
            ram_bytes: None,
            io: IoMode::Direct,
            policy: Policy::default(),
            io_threads: NonZeroUsize::new(8).unwrap_or(NonZeroUsize::MIN),
            expert_cache_bytes: None,
            ctx: None,
            sessions: NonZeroUsize::MIN,
            round_prefill: None,
            numerics: Numerics::Exact,
            tuning: Tuning::from_env(),
            drafter: false,
            speculate: crate::speculate::Mode::default(),
        }
    }
}

/// The largest RAM budget taken, in GB (a petabyte: anything larger is a unit mistake).
const MAX_RAM_GB: f64 = (1u64 << 20) as f64;

impl LoadOptions {
    /// The options `set` takes, in the order the docs list them.
    pub const NAMES: [&'static str; 15] = [
        "ram_gb",
        "threads",
        "expert_cache_mb",
        "ctx",
        "sessions",
        "round_prefill",
        "io",
        "cache_policy",
        "io_threads",
        "numerics",
        "lookahead",
        "prefault",
        "io_uring",
        "drafter",
        "speculate",
    ];

    /// Sets option `name` from `v` (an absent value keeps the default):
    /// - `ram_gb`: the budget for the whole process, in GB of 10^9 bytes (> 0, at most a
    ///   petabyte);
    /// - `threads`, `io_threads`, `ctx`, `sessions`, `round_prefill`: integers >= 1;
    /// - `expert_cache_mb`: the expert cache in MiB (> 0; at least one expert);
    /// - `io`: `direct`, `buffered` or `mmap`; `cache_policy`: `freq-decay` or `lru`;
    ///   `numerics`: one of `Numerics::ALL`;
    /// - `lookahead`, `prefault`, `io_uring`: the per-model switches of `Tuning`, true or false;
    /// - `drafter`: load the DSpark drafter (`model::dspark`), true or false;
    /// - `speculate`: `off`, `lookup`, `dspark` or `auto` (`speculate::Mode`).
    ///
    /// Errors name the option; an unknown name is `Error::UnknownOption`.
    pub fn set(&mut self, name: &str, v: &Arg) -> Result<()> {
        match name {
            "ram_gb" => {
                if let Some(gb) = v.number(name, "a number of gigabytes")? {
                    if !(gb.is_finite() && gb > 0.0) {
                        return Err(v.refused(name, "a positive number of gigabytes"));
                    }
                    if gb > MAX_RAM_GB {
                        return Err(Error::arg(format!(
                            "{name} = {} is absurd (more than a petabyte)",
                            v.shown
                        )));
                    }
                    self.ram_bytes = Some((gb * 1e9) as u64);
                }
            }
            "expert_cache_mb" => {
                if let Some(mb) = v.number(name, "a number")? {
                    if !(mb.is_finite() && mb > 0.0) {
                        return Err(v.refused(name, "a positive number"));
                    }
                    self.expert_cache_bytes = Some(((mb * (1u64 << 20) as f64) as u64).max(1));
                }
            }
            "threads" => self.threads = nonzero(v, name)?.or(self.threads),
            "ctx" => self.ctx = nonzero(v, name)?.or(self.ctx),
            "sessions" => self.sessions = nonzero(v, name)?.unwrap_or(self.sessions),
            "round_prefill" => self.round_prefill = nonzero(v, name)?.or(self.round_prefill),
            "io_threads" => self.io_threads = nonzero(v, name)?.unwrap_or(self.io_threads),
            "io" => {
                let expected = "direct, buffered or mmap";
                self.io = v.choice(name, expected, IoMode::parse)?.unwrap_or(self.io);
            }
            "cache_policy" => {
                // named "policy" in its message, as the store calls it
                let p = v.choice("policy", "freq-decay or lru", Policy::parse)?;
                self.policy = p.unwrap_or(self.policy);
            }
            "numerics" => {
                let expected = Numerics::names();
                let n = v.choice(name, &expected, Numerics::from_name)?;
                self.numerics = n.unwrap_or(self.numerics);
            }
            "lookahead" => self.tuning.lookahead = v.switch(name)?.unwrap_or(self.tuning.lookahead),
            "prefault" => self.tuning.prefault = v.switch(name)?.unwrap_or(self.tuning.prefault),
            "io_uring" => self.tuning.io_uring = v.switch(name)?.unwrap_or(self.tuning.io_uring),
            "drafter" => self.drafter = v.switch(name)?.unwrap_or(self.drafter),
            "speculate" => {
                let expected = crate::speculate::MODES.join(", ");
                let m = v.choice(name, &expected, crate::speculate::Mode::from_name)?;
                self.speculate = m.unwrap_or(self.speculate);
            }
            _ => {
                return Err(Error::UnknownOption(format!(
                    "unknown option {name:?} (the options are {})",
                    Self::NAMES.join(", ")
                )))
            }
        }
        Ok(())
    }

    /// `LoadOptions::default()` with each (name, value) of `options` set in turn.
    pub fn from_args<'a>(options: impl IntoIterator<Item = (&'a str, Arg)>) -> Result<Self> {
        let mut o = LoadOptions::default();
        for (name, v) in options {
            o.set(name, &v)?;
        }
        Ok(o)
    }
}

/// An integer >= 1.
fn nonzero(v: &Arg, name: &str) -> Result<Option<NonZeroUsize>> {
    Ok(v.count(name, 1)?.and_then(NonZeroUsize::new))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::Given;

    /// An argument as Python gives it, from its repr: True, False, None, an integer, a float,
    /// 'text'.
    fn py(shown: &str) -> Arg {
        let given = match shown {
            "True" => Given::Bool(true),
            "False" => Given::Bool(false),
            "None" => Given::Absent,
            t if t.starts_with('\'') => Given::Text(t.trim_matches('\'').into()),
            t => t
                .parse::<i128>()
                .map(Given::Int)
                .or_else(|_| t.parse::<f64>().map(Given::Float))
                .unwrap_or(Given::Other),
        };
        Arg::new(given, shown)
    }

    fn options(args: &[(&str, &str)]) -> Result<LoadOptions> {
        LoadOptions::from_args(args.iter().map(|&(name, shown)| (name, py(shown))))
    }

    #[test]
    fn every_option_is_checked_and_converted() {
        let given = [
            ("ram_gb", "2.5"),
            ("threads", "3"),
            ("expert_cache_mb", "1e-06"),
            ("ctx", "64"),
            ("sessions", "4"),
            ("round_prefill", "128"),
            ("io", "'mmap'"),
            ("cache_policy", "'lru'"),
            ("io_threads", "2"),
            ("numerics", "'fast'"),
            ("lookahead", "False"),
            ("prefault", "False"),
            ("io_uring", "False"),
            ("drafter", "True"),
            ("speculate", "'lookup'"),
        ];
        let names: Vec<&str> = given.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            LoadOptions::NAMES,
            "every option, in the documented order"
        );
        let o = options(&given).unwrap();
        assert_eq!(o.ram_bytes, Some(2_500_000_000));
        assert_eq!(o.threads.map(|t| t.get()), Some(3));
        assert_eq!(
            o.expert_cache_bytes,
            Some(1),
            "at least one byte (one expert)"
        );
        assert_eq!(o.ctx.map(|t| t.get()), Some(64));
        assert_eq!(o.sessions.get(), 4);
        assert_eq!(o.round_prefill.map(|n| n.get()), Some(128));
        assert_eq!((o.io, o.policy), (IoMode::Mmap, Policy::Lru));
        assert_eq!((o.io_threads.get(), o.numerics), (2, Numerics::Fast));
        assert!(!o.tuning.lookahead && !o.tuning.prefault && !o.tuning.io_uring);
        assert!(o.drafter);
        assert_eq!(o.speculate, crate::speculate::Mode::Lookup);
        // absent values keep the defaults
        let d = options(&[("threads", "None"), ("io", "None")]).unwrap();
        assert_eq!(
            (d.threads, d.io, d.io_threads.get(), d.drafter),
            (None, IoMode::Direct, 8, false)
        );
    }

    #[test]
    fn bad_values_are_refused_naming_the_option() {
        let cases = [
            ("threads", "0", "threads must be >= 1, got 0"),
            ("threads", "1.5", "threads must be an integer, got 1.5"),
            ("ctx", "0", "ctx must be >= 1, got 0"),
            ("sessions", "0", "sessions must be >= 1, got 0"),
            ("round_prefill", "0", "round_prefill must be >= 1, got 0"),
            ("io_threads", "0", "io_threads must be >= 1, got 0"),
            (
                "ram_gb",
                "0",
                "ram_gb must be a positive number of gigabytes, got 0",
            ),
            ("ram_gb", "nan", "ram_gb must be a positive number"),
            (
                "ram_gb",
                "'24'",
                "ram_gb must be a number of gigabytes, got '24'",
            ),
            ("ram_gb", "1000000000.0", "ram_gb = 1000000000.0 is absurd"),
            (
                "ram_gb",
                "True",
                "ram_gb must be a number of gigabytes, got True",
            ),
            (
                "expert_cache_mb",
                "-1",
                "expert_cache_mb must be a positive number",
            ),
            (
                "io",
                "'fast'",
                "io must be direct, buffered or mmap, got \"fast\"",
            ),
            ("cache_policy", "'x'", "policy must be freq-decay or lru"),
            ("numerics", "'fp4'", "numerics must be exact"),
            ("prefault", "0", "prefault must be True or False, got 0"),
            (
                "speculate",
                "'always'",
                "speculate must be off, lookup, dspark, auto",
            ),
        ];
        for (name, shown, want) in cases {
            match options(&[(name, shown)]) {
                Ok(_) => panic!("{name}={shown} was accepted"),
                Err(e) => assert!(e.to_string().contains(want), "{name}={shown}: {e}"),
            }
        }
        match options(&[("thread", "1")]) {
            Err(Error::UnknownOption(m)) => assert!(m.contains("\"thread\""), "{m}"),
            _ => panic!("an unknown option was accepted"),
        }
    }
}
