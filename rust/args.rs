//! Arguments as a caller gives them, and the rules of their kinds. A front end (the Python
//! binding) converts each value it was given into an `Arg` (its kind and how the caller writes
//! it); the core's own checks (`LoadOptions::set`, `SampleParams::from_args`) then apply these
//! rules, so a message names the argument and shows the value as the caller wrote it:
//! "threads must be an integer, got 1.5", "ctx must be >= 1, got 0".

use crate::error::{Error, Result};

/// A value of one of the kinds callers have.
#[derive(Debug, Clone, PartialEq)]
pub enum Given {
    /// Not given, or given as nothing (Python's None): the default applies.
    Absent,
    Bool(bool),
    Int(i128),
    Float(f64),
    Text(String),
    /// Anything else (a list, an integer beyond 128 bits, ...).
    Other,
}

/// An argument: its value and how the caller writes it (Python's `repr`).
#[derive(Debug, Clone, PartialEq)]
pub struct Arg {
    pub given: Given,
    pub shown: String,
}

impl Arg {
    pub fn new(given: Given, shown: impl Into<String>) -> Arg {
        Arg {
            given,
            shown: shown.into(),
        }
    }

    /// The argument that was not given.
    pub fn absent() -> Arg {
        Arg::new(Given::Absent, "None")
    }

    /// "`name` must be `what`, got `shown`".
    pub fn refused(&self, name: &str, what: impl std::fmt::Display) -> Error {
        Error::arg(format!("{name} must be {what}, got {}", self.shown))
    }

    /// A real number: an integer or a float, never a bool; `what` says what is expected
    /// ("a number", "a number of gigabytes").
    pub fn number(&self, name: &str, what: &str) -> Result<Option<f64>> {
        match self.given {
            Given::Absent => Ok(None),
            Given::Int(i) => Ok(Some(i as f64)),
            Given::Float(x) => Ok(Some(x)),
            _ => Err(self.refused(name, what)),
        }
    }

    /// An integer >= `minimum` (never a bool or a float).
    pub fn integer(&self, name: &str, minimum: i128) -> Result<Option<i128>> {
        match self.given {
            Given::Absent => Ok(None),
            Given::Int(i) if i >= minimum => Ok(Some(i)),
            Given::Int(_) => Err(self.refused(name, format!(">= {minimum}"))),
            _ => Err(self.refused(name, "an integer")),
        }
    }

    /// A count: an integer >= `minimum` that fits in a `usize`.
    pub fn count(&self, name: &str, minimum: i128) -> Result<Option<usize>> {
        match self.integer(name, minimum)? {
            None => Ok(None),
            Some(i) => usize::try_from(i)
                .map(Some)
                .map_err(|_| Error::arg(format!("{name} = {} is too large", self.shown))),
        }
    }

    /// A switch: true or false (never an integer).
    pub fn switch(&self, name: &str) -> Result<Option<bool>> {
        match self.given {
            Given::Absent => Ok(None),
            Given::Bool(b) => Ok(Some(b)),
            _ => Err(self.refused(name, "True or False")),
        }
    }

    /// Text, parsed by `parse`; anything it does not take is refused as "`name` must be
    /// `expected`", showing text as Rust debug-prints it ("io must be direct, buffered or
    /// mmap, got \"fast\"").
    pub fn choice<T>(
        &self,
        name: &str,
        expected: &str,
        parse: impl Fn(&str) -> Option<T>,
    ) -> Result<Option<T>> {
        match &self.given {
            Given::Absent => Ok(None),
            Given::Text(t) => match parse(t) {
                Some(v) => Ok(Some(v)),
                None => Err(Error::arg(format!("{name} must be {expected}, got {t:?}"))),
            },
            _ => Err(self.refused(name, expected)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg<T: std::fmt::Debug>(r: Result<T>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn each_kind_names_the_argument_and_shows_the_value() {
        let int = |i: i128| Arg::new(Given::Int(i), i.to_string());
        let float = Arg::new(Given::Float(1.5), "1.5");
        let yes = Arg::new(Given::Bool(true), "True");
        let text = Arg::new(Given::Text("fast".into()), "'fast'");
        assert_eq!(int(3).count("threads", 1).unwrap(), Some(3));
        assert_eq!(Arg::absent().count("threads", 1).unwrap(), None);
        assert_eq!(msg(int(0).count("ctx", 1)), "ctx must be >= 1, got 0");
        assert_eq!(
            msg(float.count("threads", 1)),
            "threads must be an integer, got 1.5"
        );
        assert_eq!(
            msg(yes.count("threads", 1)),
            "threads must be an integer, got True"
        );
        assert_eq!(int(2).number("ram_gb", "a number").unwrap(), Some(2.0));
        assert_eq!(
            msg(text.number("ram_gb", "a number of gigabytes")),
            "ram_gb must be a number of gigabytes, got 'fast'"
        );
        assert_eq!(
            msg(yes.number("top_p", "a number")),
            "top_p must be a number, got True"
        );
        assert_eq!(yes.switch("prefault").unwrap(), Some(true));
        assert_eq!(
            msg(int(1).switch("prefault")),
            "prefault must be True or False, got 1"
        );
        let io = |a: &Arg| a.choice("io", "direct or mmap", |t| (t == "mmap").then_some(()));
        assert_eq!(
            io(&text).unwrap_err().to_string(),
            "io must be direct or mmap, got \"fast\""
        );
        assert_eq!(msg(io(&int(3))), "io must be direct or mmap, got 3");
        let big = Arg::new(Given::Int(1 << 100), "1267650600228229401496703205376");
        assert!(
            msg(big.count("ctx", 1)).contains("ctx = 1267650600228229401496703205376 is too large")
        );
    }
}
