//! The session file: a generating session's whole state on disk (docs/architecture.md §7.1),
//! so a conversation survives a restart and continues bit for bit.
//!
//! ```text
//! offset      size  what
//! 0           8     magic "V4FLSESS"
//! 8           4     format version, u32 (1)
//! 12          4     header length N, u32 (at most 256 MiB)
//! 16          N     header: UTF-8 JSON object (what the file belongs to, token count,
//!                   pending token, whether logits follow, the caller's metadata)
//! 16+N        8     XXH64 (seed 0) of bytes 0 .. 16+N
//! 24+N        4·T   tokens, u32 × T (T = header "tokens")
//!             4·V   logits after the last fed token, f32 × V (only if header "logits")
//!             ...   per layer, in order, 11 arrays, each a u64 count then count × f32:
//!                   window; compressor pending kv, pending gate, overlap kv, overlap gate,
//!                   entries; the same five of the indexer's compressor
//! end-8       8     XXH64 (seed 0) of every byte before it
//! ```
//!
//! All integers and floats are little-endian. Every count is determined by the model's
//! geometry and T (see `layer_counts`), so loading checks the file size before it allocates
//! anything and each count against that expectation; the two checksums refuse a truncated or
//! corrupted file (the header's first, so a damaged header is never read as a different
//! model). Files are written to a temporary file beside the target and renamed over it.

use crate::checkpoint::expected::is_drafter;
use crate::config::{LayerKind, ModelConfig};
use crate::error::{Error, Result};
use crate::model::attention::AttnState;
use crate::model::session::{State, StateView};
use crate::model::Model;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// The first bytes of every session file.
pub const MAGIC: [u8; 8] = *b"V4FLSESS";
/// The format version this code writes and reads.
pub const VERSION: u32 = 1;
/// Largest header accepted (the caller's metadata lives there).
pub const MAX_HEADER: u32 = 256 << 20;
/// Bytes before the header: magic, version, header length.
const PREFIX: u64 = 16;
/// Names of a layer's arrays in file order, for messages.
const ARRAYS: [&str; 11] = [
    "window",
    "compressor pending kv",
    "compressor pending gate",
    "compressor overlap kv",
    "compressor overlap gate",
    "compressor entries",
    "indexer pending kv",
    "indexer pending gate",
    "indexer overlap kv",
    "indexer overlap gate",
    "indexer entries",
];

/// What a file holds besides the identity of its model.
pub struct Parts<'a> {
    pub state: &'a StateView<'a>,
    /// A sampled token not yet fed.
    pub pending: Option<u32>,
    /// Logits after the last fed token ([vocab]).
    pub last: Option<&'a [f32]>,
    /// The caller's JSON value, stored in the header as is.
    pub metadata: Option<&'a Value>,
}

/// A session read back.
pub struct Loaded {
    pub state: State,
    pub pending: Option<u32>,
    pub last: Option<Vec<f32>>,
    pub metadata: Option<Value>,
}

// --- XXH64 ----------------------------------------------------------------------------------

/// Streaming XXH64 with seed 0 (the `xxhash-rust` crate: the published algorithm, so
/// `xxhsum -H1` of the file's bytes before a checksum gives the stored value).
#[derive(Clone)]
pub struct Xxh64(xxhash_rust::xxh64::Xxh64);

impl Default for Xxh64 {
    fn default() -> Self {
        Xxh64::new()
    }
}

impl Xxh64 {
    pub fn new() -> Xxh64 {
        Xxh64(xxhash_rust::xxh64::Xxh64::new(0))
    }

    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    pub fn digest(&self) -> u64 {
        self.0.digest()
    }
}

/// XXH64 (seed 0) of `b`.
pub fn xxh64(b: &[u8]) -> u64 {
    xxhash_rust::xxh64::xxh64(b, 0)
}

// --- what a file belongs to ---------------------------------------------------------------

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

fn hex(h: u64) -> String {
    format!("{h:016x}")
}

/// Element counts of one layer's eleven arrays (file order) after `pos` tokens: the window
/// keeps the last W-1 keys; a compressor keeps the raw rows of its incomplete window
/// (2·d wide with overlap), the overlap half of the last complete window (CSA, once there is
/// one) and one d-wide entry per complete window.
pub fn layer_counts(c: &ModelConfig, kind: LayerKind, pos: usize) -> [usize; 11] {
    let window = pos.min(c.sliding_window.saturating_sub(1)) * c.head_dim;
    let comp = |m: usize, d: usize, overlap: bool| -> [usize; 5] {
        let width = if overlap { 2 * d } else { d };
        let pend = (pos % m) * width;
        let over = if overlap && pos >= m { m * d } else { 0 };
        [pend, pend, over, over, (pos / m) * d]
    };
    let (a, b) = match kind {
        LayerKind::Sliding => ([0; 5], [0; 5]),
        LayerKind::Hca { ratio } => (comp(ratio.max(1), c.head_dim, false), [0; 5]),
        LayerKind::Csa { ratio } => (
            comp(ratio.max(1), c.head_dim, true),
            comp(ratio.max(1), c.index_head_dim, true),
        ),
    };
    [
        window, a[0], a[1], a[2], a[3], a[4], b[0], b[1], b[2], b[3], b[4],
    ]
}

/// The whole file's size for a session of `tokens` tokens (with or without logits) and a
/// header of `header_len` bytes.
fn file_size(c: &ModelConfig, tokens: usize, logits: bool, header_len: u64) -> u64 {
    let mut n = PREFIX + header_len + 8 + 4 * tokens as u64 + 8;
    if logits {
        n += 4 * c.vocab_size as u64;
    }
    for &k in &c.layer_kinds {
        for a in layer_counts(c, k, tokens) {
            n = n.saturating_add(8 + 4 * a as u64);
        }
    }
    n
}

// --- saving ---------------------------------------------------------------------------------

/// A writer that hashes every byte it writes.
struct HashWriter<W: Write> {
    w: W,
    h: Xxh64,
}

impl<W: Write> HashWriter<W> {
    fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.h.update(b);
        self.w.write_all(b)
    }

    fn u32s(&mut self, v: &[u32]) -> std::io::Result<()> {
        self.words(v, |x| x.to_le_bytes())
    }

    fn f32s(&mut self, v: &[f32]) -> std::io::Result<()> {
        self.words(v, |x| x.to_le_bytes())
    }

    /// `v` as little-endian 4-byte values, written (and hashed) in pieces of at most 64 KiB.
    fn words<T: Copy>(&mut self, v: &[T], le: fn(T) -> [u8; 4]) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(v.len().min(16384) * 4);
        for c in v.chunks(16384) {
            buf.clear();
            for &x in c {
                buf.extend_from_slice(&le(x));
            }
            self.put(&buf)?;
        }
        Ok(())
    }
}

/// The header of a file for `m` (see the module comment).
fn header(m: &Model, parts: &Parts) -> Value {
    let model: Map<String, Value> = m
        .cfg
        .identity_values()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    json!({
        "format": "v4flash session",
        "writer": format!("v4flash {}", env!("CARGO_PKG_VERSION")),
        "model": model,
        "tensor_table_xxh64": hex(identity_hashes(m).0),
        "weights_xxh64": hex(identity_hashes(m).1),
        "numerics": m.numerics.name(),
        "kernel_tier": crate::kernels::tier_name(),
        "tokens": parts.state.tokens.len(),
        "pending": parts.pending,
        "logits": parts.last.is_some(),
        "metadata": parts.metadata,
    })
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// A temporary path beside `path` (same directory, so the rename is atomic).
fn temp_path(path: &Path) -> Result<PathBuf> {
    let name = path.file_name().ok_or_else(|| {
        Error::arg(format!(
            "{}: not a file path (give the session file's name)",
            path.display()
        ))
    })?;
    let tmp = format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        TMP_SEQ.fetch_add(1, Ordering::Relaxed)
    );
    Ok(path.with_file_name(tmp))
}

/// Writes `parts` as a session file of `m` at `path` (atomically: a temporary file beside
/// it, flushed to disk, then renamed over it). Returns the file's size.
pub fn save<C: Fn() -> bool + Sync>(
    path: &Path,
    m: &Model,
    parts: &Parts,
    cancel: &C,
) -> Result<u64> {
    let c = &m.cfg;
    let st = parts.state;
    // never write a file that loading would refuse
    let pos = st.tokens.len();
    if st.layers.len() != c.num_layers {
        return Err(Error::arg(format!(
            "internal: the session has {} layers, the model {}",
            st.layers.len(),
            c.num_layers
        )));
    }
    for (l, lv) in st.layers.iter().enumerate() {
        let want = layer_counts(c, c.layer_kinds[l], pos);
        for (i, a) in lv.arrays().iter().enumerate() {
            if a.len() != want[i] {
                return Err(Error::arg(format!(
                    "internal: layer {l} {} holds {} values at position {pos}, expected {}",
                    ARRAYS[i],
                    a.len(),
                    want[i]
                )));
            }
        }
    }
    if let Some(v) = parts.last {
        if v.len() != c.vocab_size {
            return Err(Error::arg(format!(
                "internal: {} logits, the vocabulary has {}",
                v.len(),
                c.vocab_size
            )));
        }
    }
    if path.is_dir() {
        return Err(Error::arg(format!(
            "{}: is a directory (give the session file's name)",
            path.display()
        )));
    }
    let head = serde_json::to_vec(&header(m, parts))
        .map_err(|e| Error::arg(format!("session metadata cannot be written as JSON: {e}")))?;
    if head.len() as u64 > u64::from(MAX_HEADER) {
        return Err(Error::arg(format!(
            "session metadata too large: the header would be {} bytes (at most {MAX_HEADER})",
            head.len()
        )));
    }
    let tmp = temp_path(path)?;
    let r = write_file(path, &tmp, m, parts, &head, cancel).and_then(|n| {
        std::fs::rename(&tmp, path)
            .map_err(|e| Error::io(path, "renaming the finished session file into place", e))?;
        sync_dir(path);
        Ok(n)
    });
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// Writes the file to `tmp`; errors name `path`, the file the caller asked for.
fn write_file<C: Fn() -> bool + Sync>(
    path: &Path,
    tmp: &Path,
    m: &Model,
    parts: &Parts,
    head: &[u8],
    cancel: &C,
) -> Result<u64> {
    let err = |e: std::io::Error| Error::io(path, "writing the session file", e);
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(tmp)
        .map_err(|e| {
            Error::io(
                path,
                format!(
                    "creating the session file (as {} first)",
                    tmp.file_name()
                        .map_or(String::new(), |n| n.to_string_lossy().into())
                ),
                e,
            )
        })?;
    let mut w = HashWriter {
        w: BufWriter::with_capacity(1 << 20, f),
        h: Xxh64::new(),
    };
    w.put(&MAGIC).map_err(err)?;
    w.put(&VERSION.to_le_bytes()).map_err(err)?;
    w.put(&(head.len() as u32).to_le_bytes()).map_err(err)?;
    w.put(head).map_err(err)?;
    let hh = w.h.digest();
    w.put(&hh.to_le_bytes()).map_err(err)?;
    w.u32s(parts.state.tokens).map_err(err)?;
    if let Some(v) = parts.last {
        w.f32s(v).map_err(err)?;
    }
    for lv in &parts.state.layers {
        if cancel() {
            return Err(Error::Cancelled);
        }
        for a in lv.arrays() {
            w.put(&(a.len() as u64).to_le_bytes()).map_err(err)?;
            w.f32s(a).map_err(err)?;
        }
    }
    let sum = w.h.digest();
    w.put(&sum.to_le_bytes()).map_err(err)?;
    let f = w.w.into_inner().map_err(|e| err(e.into_error()))?;
    f.sync_all().map_err(err)?;
    let n = f.metadata().map_err(err)?.len();
    let want = file_size(
        &m.cfg,
        parts.state.tokens.len(),
        parts.last.is_some(),
        head.len() as u64,
    );
    if n != want {
        return Err(Error::arg(format!(
            "internal: wrote {n} bytes, the format says {want}"
        )));
    }
    Ok(n)
}

/// Makes the rename durable (best effort: not every system can sync a directory).
fn sync_dir(path: &Path) {
    #[cfg(unix)]
    {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

// --- loading --------------------------------------------------------------------------------

/// A reader that hashes every byte it reads and names the file in its errors.
struct HashReader<'p, R: Read> {
    r: R,
    h: Xxh64,
    path: &'p Path,
}

impl<R: Read> HashReader<'_, R> {
    fn bad(&self, msg: impl std::fmt::Display) -> Error {
        Error::arg(format!("{}: {msg}", self.path.display()))
    }

    /// Reads exactly `buf.len()` bytes without hashing them.
    fn raw(&mut self, buf: &mut [u8]) -> Result<()> {
        self.r.read_exact(buf).map_err(|e| {
            if e.kind() == ErrorKind::UnexpectedEof {
                self.bad("the file ends early (truncated session file)")
            } else {
                Error::io(self.path, "reading the session file", e)
            }
        })
    }

    fn take(&mut self, buf: &mut [u8]) -> Result<()> {
        self.raw(buf)?;
        self.h.update(buf);
        Ok(())
    }

    fn u64(&mut self) -> Result<u64> {
        let mut b = [0u8; 8];
        self.take(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn u32s(&mut self, n: usize) -> Result<Vec<u32>> {
        self.words(n, u32::from_le_bytes)
    }

    fn f32s(&mut self, n: usize) -> Result<Vec<f32>> {
        self.words(n, f32::from_le_bytes)
    }

    /// n little-endian 4-byte values, read (and hashed) in pieces of at most 64 KiB.
    fn words<T>(&mut self, n: usize, from: fn([u8; 4]) -> T) -> Result<Vec<T>> {
        let mut v = Vec::with_capacity(n);
        let mut buf = vec![0u8; n.min(16384) * 4];
        let mut left = n;
        while left > 0 {
            let k = left.min(16384);
            self.take(&mut buf[..k * 4])?;
            v.extend(
                buf[..k * 4]
                    .chunks_exact(4)
                    .map(|b| from([b[0], b[1], b[2], b[3]])),
            );
            left -= k;
        }
        Ok(v)
    }
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
fn check_identity(path: &Path, m: &Model, h: &Map<String, Value>) -> Result<()> {
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

/// Reads a session file of `m` (see the module comment for what is checked, in order).
pub fn load<C: Fn() -> bool + Sync>(path: &Path, m: &Model, cancel: &C) -> Result<Loaded> {
    let c = &m.cfg;
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, "session file", e))?;
    if !meta.is_file() {
        return Err(Error::arg(format!(
            "{shown}: not a regular file (expected a v4flash session file)"
        )));
    }
    let len = meta.len();
    let f = File::open(path).map_err(|e| Error::io(path, "opening the session file", e))?;
    let mut r = HashReader {
        r: BufReader::with_capacity(1 << 20, f),
        h: Xxh64::new(),
        path,
    };
    // the fixed prefix
    let mut magic = [0u8; 8];
    let got = (len as usize).min(8);
    r.take(&mut magic[..got])?;
    if magic[..got] != MAGIC[..got] || got < 8 {
        if magic[..got] == MAGIC[..got] {
            return Err(r.bad(format!(
                "the file is {len} bytes, too short for a session file (truncated)"
            )));
        }
        return Err(r.bad(format!(
            "not a v4flash session file (it starts with {:?}, expected {:?})",
            String::from_utf8_lossy(&magic[..got]),
            String::from_utf8_lossy(&MAGIC)
        )));
    }
    if len < PREFIX + 8 + 8 {
        return Err(r.bad(format!(
            "the file is {len} bytes, too short for a session file (truncated)"
        )));
    }
    let mut w = [0u8; 4];
    r.take(&mut w)?;
    let version = u32::from_le_bytes(w);
    if version != VERSION {
        return Err(r.bad(format!(
            "session file format version {version}, this v4flash ({}) reads version {VERSION}",
            env!("CARGO_PKG_VERSION")
        )));
    }
    r.take(&mut w)?;
    let hl = u32::from_le_bytes(w);
    if hl > MAX_HEADER {
        return Err(r.bad(format!(
            "header length {hl} is more than the format allows ({MAX_HEADER}): the file is corrupted"
        )));
    }
    if PREFIX + u64::from(hl) + 8 + 8 > len {
        return Err(r.bad(format!(
            "the file is {len} bytes, its header alone needs {} (truncated or corrupted \
             session file)",
            PREFIX + u64::from(hl) + 8
        )));
    }
    // the header, checked by its own checksum before it is believed
    let mut head = vec![0u8; hl as usize];
    r.take(&mut head)?;
    let want = r.h.digest();
    let got = r.u64()?;
    if got != want {
        return Err(r.bad(format!(
            "header checksum mismatch (stored {}, computed {}): the file is corrupted",
            hex(got),
            hex(want)
        )));
    }
    let h: Value = serde_json::from_slice(&head).map_err(|e| {
        r.bad(format!(
            "the header is not valid JSON ({e}): the file is corrupted"
        ))
    })?;
    let Some(h) = h.as_object() else {
        return Err(r.bad("the header is not a JSON object"));
    };
    check_identity(path, m, h)?;
    let n = match h.get("tokens").and_then(Value::as_u64) {
        Some(n) => n,
        None => return Err(r.bad("the header has no token count")),
    };
    if n > m.ctx as u64 {
        return Err(r.bad(format!(
            "the session holds {n} tokens, more than this model's context of {} (load the \
             model with ctx >= {n} / --ctx {n})",
            m.ctx
        )));
    }
    let n = n as usize;
    let pending = match h.get("pending") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(t) if t < c.vocab_size as u64 => Some(t as u32),
            _ => {
                return Err(r.bad(format!(
                    "pending token {v} is not a token id of this vocabulary (0..{})",
                    c.vocab_size - 1
                )))
            }
        },
    };
    let Some(logits) = h.get("logits").and_then(Value::as_bool) else {
        return Err(r.bad("the header does not say whether logits follow"));
    };
    // the generation's invariant (generate.rs): logits are at hand exactly when no token
    // waits to be fed and at least one was fed
    if logits != (pending.is_none() && n > 0) {
        return Err(r.bad(format!(
            "inconsistent header: {n} tokens, pending token {}, logits {}",
            pending.map_or("none".to_string(), |t| t.to_string()),
            if logits { "present" } else { "absent" }
        )));
    }
    let metadata = h.get("metadata").filter(|v| !v.is_null()).cloned();
    // the size, from the geometry, before anything is allocated
    let want = file_size(c, n, logits, u64::from(hl));
    if len != want {
        return Err(r.bad(if len < want {
            format!(
                "the file is {len} bytes, a session of {n} tokens of this model takes {want} \
                 (truncated session file)"
            )
        } else {
            format!(
                "the file is {len} bytes, a session of {n} tokens of this model takes {want} \
                 ({} bytes too many: the file is corrupted)",
                len - want
            )
        }));
    }
    let tokens = r.u32s(n)?;
    let last = if logits {
        Some(r.f32s(c.vocab_size)?)
    } else {
        None
    };
    let mut layers = Vec::with_capacity(c.num_layers);
    for (l, &kind) in c.layer_kinds.iter().enumerate() {
        if cancel() {
            return Err(Error::Cancelled);
        }
        let want = layer_counts(c, kind, n);
        let mut arrays: [Vec<f32>; 11] = Default::default();
        for (i, a) in arrays.iter_mut().enumerate() {
            let k = r.u64()?;
            if k != want[i] as u64 {
                return Err(r.bad(format!(
                    "layer {l} {} holds {k} values, a session of {n} tokens has {}: the file is \
                     corrupted",
                    ARRAYS[i], want[i]
                )));
            }
            *a = r.f32s(want[i])?;
        }
        layers.push(AttnState::from_arrays(arrays));
    }
    let want = r.h.digest();
    let mut b = [0u8; 8];
    r.raw(&mut b)?;
    let got = u64::from_le_bytes(b);
    if got != want {
        return Err(r.bad(format!(
            "checksum mismatch (stored {}, computed {}): the file is corrupted",
            hex(got),
            hex(want)
        )));
    }
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
        return Err(r.bad(format!(
            "token id {bad} is outside this model's vocabulary (0..{})",
            c.vocab_size - 1
        )));
    }
    Ok(Loaded {
        state: State::from_parts(layers, tokens, m.id),
        pending,
        last,
        metadata,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Numerics;
    use crate::model::generate::{Generation, Session};
    use crate::model::sample::SampleParams;
    use crate::model::LoadOptions;
    use std::sync::{Arc, OnceLock};

    const NO: fn() -> bool = || false;

    fn dir(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures")
            .join(name)
    }

    fn load_model(dir: &Path, numerics: Numerics, ctx: Option<usize>) -> Arc<Model> {
        let opts = LoadOptions {
            threads: Some(1),
            ctx,
            numerics,
            ..LoadOptions::default()
        };
        Arc::new(Model::load(dir, &opts).expect("the fixture loads"))
    }

    fn tiny(name: &str) -> Arc<Model> {
        static A: OnceLock<Arc<Model>> = OnceLock::new();
        static B: OnceLock<Arc<Model>> = OnceLock::new();
        let cell = if name == "tiny-a" { &A } else { &B };
        cell.get_or_init(|| load_model(&dir(name), Numerics::Exact, None))
            .clone()
    }

    fn gen(prompt: &[u32], n: usize, seed: u64) -> Generation {
        let p = SampleParams {
            temperature: 1.0,
            top_p: 0.9,
            top_k: 50,
            seed,
        };
        Generation::new(prompt.to_vec(), n, p, vec![]).unwrap()
    }

    fn ids(m: &Model, n: usize, salt: usize) -> Vec<u32> {
        (0..n)
            .map(|i| ((i * 7 + salt * 13 + 3) % m.cfg.vocab_size) as u32)
            .collect()
    }

    fn bits(v: Option<&[f32]>) -> Option<Vec<u32>> {
        v.map(|v| v.iter().map(|x| x.to_bits()).collect())
    }

    /// `a` and `b` are the same sequence and continue identically, bit for bit: the logits
    /// at hand, a sampled continuation, and the logits after more fed tokens.
    fn same_future(a: &mut Session, b: &mut Session) {
        assert_eq!(a.tokens(), b.tokens());
        assert_eq!(a.position(), b.position());
        assert_eq!(bits(a.last_logits()), bits(b.last_logits()));
        if a.position() > 0 {
            let ga = a.generate(&mut gen(&[], 7, 5), &NO).unwrap();
            let gb = b.generate(&mut gen(&[], 7, 5), &NO).unwrap();
            assert_eq!(ga, gb);
        }
        let more = ids(a.model(), 11, 1);
        a.feed(&more, &NO).unwrap();
        b.feed(&more, &NO).unwrap();
        assert_eq!(bits(a.last_logits()), bits(b.last_logits()));
        assert!(a.last_logits().is_some());
    }

    fn round_trip(s: &Session, at: Option<&crate::model::session::Snapshot>) -> Session {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.v4session");
        let meta = json!({"note": "hi", "n": [1, 2]});
        let n = s.save(&p, at, Some(&meta), &NO).unwrap();
        assert_eq!(n, std::fs::metadata(&p).unwrap().len());
        let (t, got) = Session::load(s.model().clone(), &p, &NO).unwrap();
        assert_eq!(got, Some(meta));
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file is left behind");
        t
    }

    #[test]
    fn a_restored_session_continues_bit_for_bit() {
        for name in ["tiny-a", "tiny-b"] {
            let m = tiny(name);
            // lengths around the windows (8 / 16) and compression ratios (4, 8, 16)
            for n in [1, 3, 4, 17, 33, 50] {
                let prompt = ids(&m, n, 0);
                // after a prefill
                let mut a = Session::new(m.clone());
                a.feed(&prompt, &NO).unwrap();
                let mut b = round_trip(&a, None);
                same_future(&mut a, &mut b);
                // after a generation: a sampled token waits to be fed
                let mut a = Session::new(m.clone());
                a.generate(&mut gen(&prompt, 4, 9), &NO).unwrap();
                assert!(a.last_logits().is_none());
                let mut b = round_trip(&a, None);
                same_future(&mut a, &mut b);
                // after a rollback
                let mut a = Session::new(m.clone());
                a.feed(&prompt, &NO).unwrap();
                let snap = a.snapshot(&NO).unwrap();
                a.generate(&mut gen(&[], 9, 2), &NO).unwrap();
                a.rollback(&snap).unwrap();
                let mut b = round_trip(&a, None);
                same_future(&mut a, &mut b);
            }
        }
    }

    #[test]
    fn a_snapshot_saves_the_state_it_had() {
        let m = tiny("tiny-a");
        let mut a = Session::new(m.clone());
        a.generate(&mut gen(&ids(&m, 13, 2), 3, 4), &NO).unwrap();
        let snap = a.snapshot(&NO).unwrap();
        a.generate(&mut gen(&ids(&m, 22, 3), 5, 4), &NO).unwrap();
        let mut b = round_trip(&a, Some(&snap));
        assert_eq!(b.position(), snap.pos());
        a.rollback(&snap).unwrap();
        same_future(&mut a, &mut b);
        // a snapshot of another session (not a prefix of this one) is refused, as rollback does
        let mut other = Session::new(m.clone());
        other.feed(&ids(&m, 5, 7), &NO).unwrap();
        let foreign = other.snapshot(&NO).unwrap();
        let d = tempfile::tempdir().unwrap();
        let e = a
            .save(&d.path().join("x"), Some(&foreign), None, &NO)
            .unwrap_err();
        assert!(e.to_string().contains("does not belong"), "{e}");
        assert!(!d.path().join("x").exists());
    }

    #[test]
    fn an_empty_session_round_trips() {
        let m = tiny("tiny-b");
        let a = Session::new(m.clone());
        let mut b = round_trip(&a, None);
        assert_eq!((b.position(), b.last_logits()), (0, None));
        let mut fresh = Session::new(m.clone());
        same_future(&mut fresh, &mut b);
    }

    /// A saved session of `m` with `n` tokens: the file's bytes and its path (in `d`).
    fn saved(m: &Arc<Model>, n: usize, d: &Path) -> (Vec<u8>, PathBuf) {
        let mut s = Session::new(m.clone());
        s.feed(&ids(m, n, 0), &NO).unwrap();
        let p = d.join("s.v4session");
        s.save(&p, None, Some(&json!({"a": 1})), &NO).unwrap();
        (std::fs::read(&p).unwrap(), p)
    }

    fn load_err(m: &Arc<Model>, p: &Path, bytes: &[u8]) -> String {
        std::fs::write(p, bytes).unwrap();
        match Session::load(m.clone(), p, &NO) {
            Ok(_) => panic!("a damaged file was accepted"),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains(&p.display().to_string()), "{msg}");
                msg
            }
        }
    }

    /// The file with its header edited and both checksums recomputed (a file this code could
    /// have written, but with other contents).
    fn forge(
        bytes: &[u8],
        edit: impl Fn(&mut Map<String, Value>),
        body: impl Fn(&mut [u8]),
    ) -> Vec<u8> {
        let hl = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]) as usize;
        let mut h: Value = serde_json::from_slice(&bytes[16..16 + hl]).unwrap();
        edit(h.as_object_mut().unwrap());
        let head = serde_json::to_vec(&h).unwrap();
        let mut out = bytes[..12].to_vec();
        out.extend_from_slice(&(head.len() as u32).to_le_bytes());
        out.extend_from_slice(&head);
        let hh = xxh64(&out);
        out.extend_from_slice(&hh.to_le_bytes());
        let mut rest = bytes[16 + hl + 8..bytes.len() - 8].to_vec();
        body(&mut rest);
        out.extend_from_slice(&rest);
        let sum = xxh64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    #[test]
    fn damaged_files_are_refused_with_what_is_wrong() {
        let m = tiny("tiny-a");
        let d = tempfile::tempdir().unwrap();
        let (good, p) = saved(&m, 21, d.path());
        let hl = u32::from_le_bytes([good[12], good[13], good[14], good[15]]) as usize;
        // truncated anywhere
        for cut in [
            0,
            5,
            8,
            15,
            16,
            30,
            16 + hl,
            16 + hl + 9,
            good.len() / 2,
            good.len() - 1,
        ] {
            let e = load_err(&m, &p, &good[..cut]);
            assert!(e.contains("truncated"), "cut at {cut}: {e}");
        }
        // longer than the format says
        let mut long = good.clone();
        long.extend_from_slice(&[0; 3]);
        assert!(load_err(&m, &p, &long).contains("3 bytes too many"));
        // magic and version
        let mut b = good.clone();
        b[..8].copy_from_slice(b"GGUF\0\0\0\0");
        assert!(load_err(&m, &p, &b).contains("not a v4flash session file"));
        let e = load_err(&m, &p, b"{\"messages\": []}");
        assert!(e.contains("not a v4flash session file"), "{e}");
        let mut b = good.clone();
        b[8..12].copy_from_slice(&2u32.to_le_bytes());
        let e = load_err(&m, &p, &b);
        assert!(
            e.contains("format version 2") && e.contains("reads version 1"),
            "{e}"
        );
        // a flipped byte in the header, in the tokens, in a float, in the checksum
        for (at, want) in [
            (16 + 3, "header checksum mismatch"),
            (16 + hl + 8 + 1, "checksum mismatch"),
            (good.len() - 100, "checksum mismatch"),
            (good.len() - 3, "checksum mismatch"),
        ] {
            let mut b = good.clone();
            b[at] ^= 0x10;
            let e = load_err(&m, &p, &b);
            assert!(
                e.contains(want) && e.contains("corrupted"),
                "byte {at}: {e}"
            );
        }
        // the good file still loads
        std::fs::write(&p, &good).unwrap();
        assert!(Session::load(m.clone(), &p, &NO).is_ok());
    }

    #[test]
    fn every_flipped_bit_is_refused() {
        let m = tiny("tiny-a");
        let d = tempfile::tempdir().unwrap();
        let (good, p) = saved(&m, 2, d.path());
        for at in 0..good.len() {
            let mut b = good.clone();
            b[at] ^= 1 << (at % 8);
            load_err(&m, &p, &b);
        }
    }

    #[test]
    fn forged_headers_are_checked_against_the_geometry() {
        let m = tiny("tiny-a");
        let d = tempfile::tempdir().unwrap();
        let (good, p) = saved(&m, 21, d.path());
        let keep = |_: &mut [u8]| {};
        // a token count the data does not hold: refused by size, before anything is allocated
        let b = forge(
            &good,
            |h| drop(h.insert("tokens".into(), json!(m.ctx))),
            keep,
        );
        assert!(load_err(&m, &p, &b).contains("truncated"));
        let b = forge(
            &good,
            |h| drop(h.insert("tokens".into(), json!(m.ctx + 1))),
            keep,
        );
        assert!(load_err(&m, &p, &b).contains("more than this model's context"));
        let b = forge(
            &good,
            |h| drop(h.insert("pending".into(), json!(512))),
            keep,
        );
        assert!(load_err(&m, &p, &b).contains("pending token 512"));
        let b = forge(&good, |h| drop(h.insert("pending".into(), json!(5))), keep);
        assert!(load_err(&m, &p, &b).contains("inconsistent header"));
        let b = forge(
            &good,
            |_| {},
            |body| body[..4].copy_from_slice(&600u32.to_le_bytes()),
        );
        assert!(load_err(&m, &p, &b).contains("token id 600 is outside"));
        // the forger itself is faithful
        assert_eq!(forge(&good, |_| {}, keep), good);
    }

    #[test]
    fn a_file_of_another_model_or_mode_is_refused_naming_what_differs() {
        let d = tempfile::tempdir().unwrap();
        let a = tiny("tiny-a");
        let (good, p) = saved(&a, 21, d.path());
        let e = load_err(&tiny("tiny-b"), &p, &good);
        assert!(
            e.contains("saved for a model with") && e.contains("hidden_size 192, this one has 128"),
            "{e}"
        );
        assert!(e.contains("more config values differ"), "{e}");
        // the same checkpoint in another numerics mode
        let fast = load_model(&dir("tiny-a"), Numerics::Fast, None);
        let e = load_err(&fast, &p, &good);
        assert!(e.contains("numerics exact, this model runs fast"), "{e}");
        // a context too short for it
        let short = load_model(&dir("tiny-a"), Numerics::Exact, Some(16));
        let e = load_err(&short, &p, &good);
        assert!(
            e.contains("21 tokens, more than this model's context of 16"),
            "{e}"
        );
        // a copy of the checkpoint with one config value changed
        let copy = d.path().join("ck");
        std::fs::create_dir(&copy).unwrap();
        for f in std::fs::read_dir(dir("tiny-a")).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, copy.join(f.file_name().unwrap())).unwrap();
        }
        let cfg = std::fs::read_to_string(copy.join("config.json")).unwrap();
        let cfg = cfg.replace("\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": 1e-05");
        std::fs::write(copy.join("config.json"), cfg).unwrap();
        let other = load_model(&copy, Numerics::Exact, None);
        let e = load_err(&other, &p, &good);
        assert!(
            e.contains("rms_norm_eps 0.000001, this one has 0.00001"),
            "{e}"
        );
        // ... and an unchanged copy (another path) is the same model
        let same = load_model(&dir("tiny-a"), Numerics::Exact, None);
        std::fs::write(&p, &good).unwrap();
        assert!(Session::load(same, &p, &NO).is_ok());
        // a forged identity
        let b = forge(
            &good,
            |h| drop(h.insert("weights_xxh64".into(), json!("0"))),
            |_| {},
        );
        assert!(load_err(&a, &p, &b).contains("same layout but other weights"));
        let b = forge(
            &good,
            |h| drop(h.insert("tensor_table_xxh64".into(), json!("0"))),
            |_| {},
        );
        assert!(load_err(&a, &p, &b).contains("another tensor table"));
    }

    #[test]
    fn save_refuses_paths_it_cannot_write() {
        let m = tiny("tiny-a");
        let s = Session::new(m);
        let d = tempfile::tempdir().unwrap();
        let e = s.save(d.path(), None, None, &NO).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        let e = s
            .save(&d.path().join("no/such/dir/s"), None, None, &NO)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no/such/dir/s"), "{e}");
        // an existing file is replaced whole
        let p = d.path().join("s");
        std::fs::write(&p, vec![7u8; 1 << 16]).unwrap();
        let n = s.save(&p, None, None, &NO).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), n);
        // a cancelled save leaves the old file and no temporary file
        let yes = || true;
        let mut t = Session::new(s.model().clone());
        t.feed(&[1, 2, 3], &NO).unwrap();
        assert!(matches!(
            t.save(&p, None, None, &yes),
            Err(Error::Cancelled)
        ));
        assert_eq!(std::fs::metadata(&p).unwrap().len(), n);
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn the_checksum_is_xxh64() {
        // reference values of the published algorithm (seed 0; the python-xxhash package)
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 31 % 251) as u8).collect();
        for (n, want) in [
            (0, 0xef46db3751d8e999u64),
            (1, 0xe934a84adb052768),
            (3, 0xe5d2be4ae4b3469a),
            (4, 0x3b4d7f7c6bd1ae90),
            (7, 0xf952f1901a5afc9b),
            (8, 0x506834122cb7b4d0),
            (9, 0xba2f457c2914d838),
            (31, 0x5836f08607dbda19),
            (32, 0xb3f0ec9d8d216dea),
            (33, 0xc480db428c35ab3e),
            (63, 0x9522a419d60828f2),
            (64, 0x28bf42bb281af2ee),
            (100, 0xcd8c24467b8382ad),
            (1000, 0xd1bee8e4f0603bbf),
        ] {
            assert_eq!(xxh64(&data[..n]), want, "{n} bytes");
        }
        // streaming in any split gives the one-shot value
        let whole = xxh64(&data);
        for split in [1, 3, 8, 31, 32, 33, 64, 999] {
            let mut h = Xxh64::new();
            for c in data.chunks(split) {
                h.update(c);
            }
            assert_eq!(h.digest(), whole, "split {split}");
        }
    }

    #[test]
    fn counts_follow_the_state_the_forward_pass_keeps() {
        // layer_counts is what the model's own state holds at every position
        for name in ["tiny-a", "tiny-b"] {
            let m = tiny(name);
            let mut s = Session::new(m.clone());
            for t in 0..40u32 {
                s.feed(&[t % 97], &NO).unwrap();
                let d = tempfile::tempdir().unwrap();
                // save checks every array against layer_counts before writing
                s.save(&d.path().join("s"), None, None, &NO).unwrap();
            }
        }
    }
}
