//! The readers of config.json values: each takes the config object and a key and returns the
//! value or an error naming the key, what was expected and what was found. `ModelConfig`'s
//! key table names a reader per key.

use super::Yarn;
use crate::error::{Error, Result};
use serde_json::{Map, Value};

/// A JSON value as it appears in a message: its text, cut after 60 characters.
pub(super) fn short(v: &Value) -> String {
    let t = v.to_string();
    match t.char_indices().nth(60) {
        Some((i, _)) => format!("{}...", &t[..i]),
        None => t,
    }
}

pub(super) fn get<'a>(o: &'a Map<String, Value>, k: &str) -> Result<&'a Value> {
    o.get(k)
        .ok_or_else(|| Error::config(format!("missing key \"{k}\"")))
}

pub(super) fn uint(o: &Map<String, Value>, k: &str) -> Result<usize> {
    let v = get(o, k)?;
    let n = v.as_u64().ok_or_else(|| {
        Error::config(format!(
            "\"{k}\" must be a non-negative integer, found {}",
            short(v)
        ))
    })?;
    usize::try_from(n).map_err(|_| Error::config(format!("\"{k}\" = {n} is too large")))
}

pub(super) fn pos(o: &Map<String, Value>, k: &str) -> Result<usize> {
    let n = uint(o, k)?;
    if n == 0 {
        return Err(Error::config(format!("\"{k}\" must be positive, found 0")));
    }
    Ok(n)
}

pub(super) fn num(o: &Map<String, Value>, k: &str) -> Result<f64> {
    let v = get(o, k)?;
    let x = v
        .as_f64()
        .ok_or_else(|| Error::config(format!("\"{k}\" must be a number, found {}", short(v))))?;
    if !x.is_finite() {
        return Err(Error::config(format!("\"{k}\" must be finite, found {x}")));
    }
    Ok(x)
}

pub(super) fn pos_num(o: &Map<String, Value>, k: &str) -> Result<f64> {
    let x = num(o, k)?;
    if x <= 0.0 {
        return Err(Error::config(format!(
            "\"{k}\" must be positive, found {x}"
        )));
    }
    Ok(x)
}

/// `read(o, k)` when the key is present, else `default`.
pub(super) fn or<T>(
    o: &Map<String, Value>,
    k: &str,
    read: fn(&Map<String, Value>, &str) -> Result<T>,
    default: T,
) -> Result<T> {
    match o.get(k) {
        None => Ok(default),
        Some(_) => read(o, k),
    }
}

pub(super) fn pos_f32(o: &Map<String, Value>, k: &str) -> Result<f32> {
    Ok(pos_num(o, k)? as f32)
}

/// `compress_ratios`: a list of integers, each a plausible ratio (its length is checked
/// against the layers once both are read).
pub(super) fn ratios(o: &Map<String, Value>, k: &str) -> Result<Vec<usize>> {
    let ratios = match o.get(k) {
        None => {
            return Err(Error::config(format!(
                "missing key \"{k}\" (the per-layer attention kinds; v4flash never guesses them)",
            )))
        }
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(Error::config(format!(
                "\"{k}\" must be a list of integers, found {}",
                short(other)
            )))
        }
    };
    let mut out = Vec::with_capacity(ratios.len());
    for (i, r) in ratios.iter().enumerate() {
        let m = r.as_u64().ok_or_else(|| {
            Error::config(format!(
                "{k}[{i}] must be a non-negative integer, found {}",
                short(r)
            ))
        })?;
        if m > 1 << 20 {
            return Err(Error::config(format!(
                "{k}[{i}] = {m} is implausibly large"
            )));
        }
        out.push(m as usize);
    }
    Ok(out)
}

/// `rope_scaling`: absent or null, or a YaRN object (`type` or `rope_type` "yarn"; the betas
/// default to 32 and 1).
pub(super) fn rope_scaling(o: &Map<String, Value>, k: &str) -> Result<Option<Yarn>> {
    let rs = match o.get(k) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(rs)) => rs,
        Some(other) => {
            return Err(Error::config(format!(
                "\"{k}\" must be an object, found {}",
                short(other)
            )))
        }
    };
    match rs.get("type").or_else(|| rs.get("rope_type")) {
        Some(Value::String(t)) if t == "yarn" => {}
        Some(t) => {
            return Err(Error::config(format!(
                "\"{k}.type\" is {}, only \"yarn\" is supported",
                short(t)
            )))
        }
        None => {
            return Err(Error::config(format!(
                "\"{k}.type\" is missing, only \"yarn\" is supported"
            )))
        }
    }
    let p = |e| prefix(e, &format!("{k}."));
    let opt = |name: &str, default: f64| match rs.get(name) {
        None => Ok(default),
        Some(_) => num(rs, name).map_err(p),
    };
    Ok(Some(Yarn {
        factor: pos_num(rs, "factor").map_err(p)?,
        original_max_position_embeddings: pos_num(rs, "original_max_position_embeddings")
            .map_err(p)?,
        beta_fast: opt("beta_fast", 32.0)?,
        beta_slow: opt("beta_slow", 1.0)?,
    }))
}

/// An optional token id (`default` when absent); must fit in u32 (checked against the
/// vocabulary later).
pub(super) fn token_id(o: &Map<String, Value>, k: &str, default: u32) -> Result<u32> {
    if o.get(k).is_none() {
        return Ok(default);
    }
    let n = uint(o, k)?;
    u32::try_from(n).map_err(|_| Error::config(format!("\"{k}\" = {n} is too large")))
}

fn prefix(e: Error, p: &str) -> Error {
    match e {
        Error::Config(m) => Error::Config(m.replacen('"', &format!("\"{p}"), 1)),
        e => e,
    }
}
