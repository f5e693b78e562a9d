//! What a session file belongs to: the config values its state depends on
//! (`ModelConfig::identity_values`), the tensor table, the small resident weights and the
//! numerics mode, as its header records them (`of`), and the refusal of a file of another
//! model (`check`), naming what differs.

use super::format::{hex, Xxh64};
use crate::checkpoint::expected::is_drafter;
use crate::error::{Error, Result};
use crate::model::Model;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

/// The identity part of a file's header for `m`: `model` (the config values), the tensor
/// table's and the weights' hashes, the numerics mode and (informational) the kernel tier.
pub(super) fn of(m: &Model) -> Map<String, Value> {
    let model: Map<String, Value> = m
        .cfg
        .identity_values()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let (tt, wt) = identity_hashes(m);
    let v = json!({
        "model": model,
        "tensor_table_xxh64": hex(tt),
        "weights_xxh64": hex(wt),
        "numerics": m.numerics.name(),
        "kernel_tier": crate::kernels::tier_name(),
    });
    match v {
        Value::Object(o) => o,
        _ => Map::new(),
    }
}

/// XXH64 of the tensor table: for every tensor but `mtp.*`, sorted by name, the name, a 0
/// byte, the dtype name, a 0 byte, the rank and each dimension as u64 (shards and offsets do
/// not count: a re-sharded copy of the same tensors is the same checkpoint).
fn tensor_table_hash(m: &Model) -> u64 {
    let mut names: Vec<&str> = m.ck.names().filter(|n| !is_drafter(n)).collect();
    names.sort_unstable();
    let mut h = Xxh64::new();
    for n in names {
        if let Some(t) = m.ck.get(n) {
            h.update(n.as_bytes());
            h.update(&[0]);
            h.update(t.dtype.name().as_bytes());
            h.update(&[0]);
            h.update(&(t.shape.len() as u64).to_le_bytes());
            for &d in &t.shape {
                h.update(&(d as u64).to_le_bytes());
            }
        }
    }
    h.digest()
}

/// XXH64 of the small resident weights, layer by layer (norms, hyper-connection mixes, sinks,
/// compressor norms and position biases, routing biases, hash-routing tables): two
/// checkpoints with one layout but other weights (a fine-tune) differ here.
fn weights_hash(m: &Model) -> u64 {
    let mut h = Xxh64::new();
    let mut f = |v: &[f32]| {
        h.update(&(v.len() as u64).to_le_bytes());
        for c in v.chunks(4096) {
            let mut b = Vec::with_capacity(c.len() * 4);
            for x in c {
                b.extend_from_slice(&x.to_bits().to_le_bytes());
            }
            h.update(&b);
        }
    };
    for l in &m.layers {
        f(&l.attn_norm);
        f(&l.ffn_norm);
        for hc in [&l.hc_attn, &l.hc_ffn] {
            f(&hc.fn_w);
            f(&hc.base);
            f(&hc.scale);
        }
        f(&l.attn.q_norm);
        f(&l.attn.kv_norm);
        f(&l.attn.sinks);
        let ix = l.attn.indexer.as_ref().map(|i| &i.comp);
        for cw in l.attn.comp.iter().chain(ix) {
            f(&cw.norm);
            f(&cw.ape);
        }
        if let Some(b) = &l.moe.bias {
            f(b);
        }
        if let Some(t) = &l.moe.tid2eid {
            let v: Vec<f32> = t.iter().map(|&e| f32::from(e)).collect();
            f(&v);
        }
    }
    h.digest()
}

/// (tensor table, weights) hashes of `m`, computed once per loaded model (the weights hash
/// reads ~135 MB of resident floats for V4 Flash; model ids are never reused).
fn identity_hashes(m: &Model) -> (u64, u64) {
    static CACHE: OnceLock<Mutex<HashMap<u64, (u64, u64)>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(&h) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&m.id) {
        return h;
    }
    let h = (tensor_table_hash(m), weights_hash(m));
    cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(m.id, h);
    h
}

/// Whether two JSON values from a header are the same (numbers within rounding of one
/// another: a number printed and parsed back may be one unit in the last place off).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_u64(), y.as_u64()) {
            (Some(p), Some(q)) => p == q,
            _ => match (x.as_f64(), y.as_f64()) {
                (Some(p), Some(q)) => {
                    p == q || (p - q).abs() <= 4.0 * f64::EPSILON * p.abs().max(q.abs())
                }
                _ => false,
            },
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, p)| y.get(k).is_some_and(|q| same(p, q)))
        }
        _ => a == b,
    }
}

/// A header value as a message shows it (numbers in plain decimals, as config.json has them).
fn show(v: &Value) -> String {
    match v {
        Value::Null => "none".to_string(),
        Value::Number(n) => match (n.as_u64(), n.as_f64()) {
            (Some(u), _) => u.to_string(),
            (None, Some(f)) => f.to_string(),
            _ => n.to_string(),
        },
        Value::Array(a) => format!("[{}]", a.iter().map(show).collect::<Vec<_>>().join(", ")),
        v => v.to_string(),
    }
}

/// Refuses a header written for another model: names every config value that differs, or
/// the tensor table, the weights or the numerics mode.
pub(super) fn check(path: &Path, m: &Model, h: &Map<String, Value>) -> Result<()> {
    let bad = |msg: String| Err(Error::arg(format!("{}: {msg}", path.display())));
    let Some(saved) = h.get("model").and_then(Value::as_object) else {
        return bad("the header has no \"model\" object (not a v4flash session file?)".into());
    };
    let mut diffs = Vec::new();
    for (k, mine) in m.cfg.identity_values() {
        match saved.get(k) {
            Some(v) if same(v, &mine) => {}
            Some(v) => diffs.push(format!("{k} {}, this one has {}", show(v), show(&mine))),
            None => diffs.push(format!("no {k}, this one has {}", show(&mine))),
        }
    }
    if !diffs.is_empty() {
        let more = diffs.len().saturating_sub(4);
        diffs.truncate(4);
        return bad(format!(
            "the session was saved for another model: saved for a model with {}{}",
            diffs.join("; with "),
            if more > 0 {
                format!(" (and {more} more config values differ)")
            } else {
                String::new()
            }
        ));
    }
    let text = |k: &str| h.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
    let (tt, wt) = identity_hashes(m);
    let (tt, wt) = (hex(tt), hex(wt));
    if text("tensor_table_xxh64") != tt {
        return bad(format!(
            "the session was saved for a checkpoint with another tensor table (names, dtypes \
             or shapes differ; xxh64 {} there, {tt} here) although the config matches",
            text("tensor_table_xxh64")
        ));
    }
    if text("weights_xxh64") != wt {
        return bad(format!(
            "the session was saved for a checkpoint with the same layout but other weights \
             (another release or a fine-tune; xxh64 {} there, {wt} here)",
            text("weights_xxh64")
        ));
    }
    let num = text("numerics");
    if num != m.numerics.name() {
        return bad(format!(
            "the session was saved with numerics {num}, this model runs {} (load the model \
             with numerics=\"{num}\" / --numerics {num} to continue it)",
            m.numerics.name()
        ));
    }
    Ok(())
}
