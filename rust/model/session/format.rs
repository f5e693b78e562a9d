//! The session file's format (docs/architecture.md §7.1): the versioned, checksummed layout,
//! its header, and the encoding and decoding of its sections. What a file belongs to is
//! `identity`, reading and writing files is `file`.
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
//! model).

use crate::config::{LayerKind, ModelConfig};
use crate::error::{Error, Result};
use crate::model::attention::AttnState;
use crate::model::session::StateView;
use serde_json::{json, Map, Value};
use std::io::{ErrorKind, Read, Write};
use std::path::Path;

/// The first bytes of every session file.
pub const MAGIC: [u8; 8] = *b"V4FLSESS";
/// The format version this code writes and reads.
pub const VERSION: u32 = 1;
/// Largest header accepted (the caller's metadata lives there).
pub const MAX_HEADER: u32 = 256 << 20;
/// Bytes before the header: magic, version, header length.
pub(super) const PREFIX: u64 = 16;
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

/// What a header says the body holds (`Reader::shape`).
pub(super) struct Shape {
    /// T, the tokens fed.
    pub tokens: usize,
    /// A sampled token not yet fed.
    pub pending: Option<u32>,
    /// Whether the logits after the last fed token follow the tokens.
    pub logits: bool,
    /// The caller's JSON value (absent when null).
    pub metadata: Option<Value>,
}

/// A file's body, decoded (`Reader::body`).
pub(super) struct Body {
    pub tokens: Vec<u32>,
    pub logits: Option<Vec<f32>>,
    pub layers: Vec<AttnState>,
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

/// XXH64 (seed 0) of `b` (the tests forge files with it).
#[cfg(test)]
pub fn xxh64(b: &[u8]) -> u64 {
    xxhash_rust::xxh64::xxh64(b, 0)
}

pub(super) fn hex(h: u64) -> String {
    format!("{h:016x}")
}

// --- the layout -----------------------------------------------------------------------------

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
pub(super) fn file_size(c: &ModelConfig, tokens: usize, logits: bool, header_len: u64) -> u64 {
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

/// Refuses `parts` whose arrays or logits do not have the lengths the format gives for their
/// token count: saving checks this first, so it never writes a file loading would refuse.
pub(super) fn check_counts(c: &ModelConfig, parts: &Parts) -> Result<()> {
    let st = parts.state;
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
    Ok(())
}

/// The header of a file (see the module comment): `identity`, what the file belongs to
/// (`identity::of`), and what the body's shape depends on.
pub(super) fn header(identity: Map<String, Value>, parts: &Parts) -> Value {
    let mut h = identity;
    let rest = json!({
        "format": "v4flash session",
        "writer": format!("v4flash {}", env!("CARGO_PKG_VERSION")),
        "tokens": parts.state.tokens.len(),
        "pending": parts.pending,
        "logits": parts.last.is_some(),
        "metadata": parts.metadata,
    });
    if let Value::Object(rest) = rest {
        h.extend(rest);
    }
    Value::Object(h)
}

// --- encoding -------------------------------------------------------------------------------

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

/// Writes a whole file to `w`: the prefix, `head` (the header's JSON, `header`) and its
/// checksum, then the sections of `parts` and the final checksum. Returns the writer, or None
/// when `cancel` stopped it (checked between layers).
pub(super) fn encode<W: Write>(
    w: W,
    head: &[u8],
    parts: &Parts,
    cancel: &dyn Fn() -> bool,
) -> std::io::Result<Option<W>> {
    let mut w = HashWriter { w, h: Xxh64::new() };
    w.put(&MAGIC)?;
    w.put(&VERSION.to_le_bytes())?;
    w.put(&(head.len() as u32).to_le_bytes())?;
    w.put(head)?;
    let hh = w.h.digest();
    w.put(&hh.to_le_bytes())?;
    w.u32s(parts.state.tokens)?;
    if let Some(v) = parts.last {
        w.f32s(v)?;
    }
    for lv in &parts.state.layers {
        if cancel() {
            return Ok(None);
        }
        for a in lv.arrays() {
            w.put(&(a.len() as u64).to_le_bytes())?;
            w.f32s(a)?;
        }
    }
    let sum = w.h.digest();
    w.put(&sum.to_le_bytes())?;
    Ok(Some(w.w))
}

// --- decoding -------------------------------------------------------------------------------

/// A reader of a file's sections: it hashes every byte it reads and names the file in its
/// errors.
pub(super) struct Reader<'p, R: Read> {
    r: R,
    h: Xxh64,
    path: &'p Path,
}

impl<'p, R: Read> Reader<'p, R> {
    pub(super) fn new(r: R, path: &'p Path) -> Self {
        Reader {
            r,
            h: Xxh64::new(),
            path,
        }
    }

    pub(super) fn bad(&self, msg: impl std::fmt::Display) -> Error {
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

    /// Reads a stored XXH64 and refuses the file ("`what` mismatch") unless it is the hash of
    /// every byte read so far; `hashed`: whether the stored value counts in later checksums
    /// (the header's does, the final one ends the file).
    fn checksum(&mut self, what: &str, hashed: bool) -> Result<()> {
        let want = self.h.digest();
        let mut b = [0u8; 8];
        if hashed {
            self.take(&mut b)?;
        } else {
            self.raw(&mut b)?;
        }
        let got = u64::from_le_bytes(b);
        if got != want {
            return Err(self.bad(format!(
                "{what} mismatch (stored {}, computed {}): the file is corrupted",
                hex(got),
                hex(want)
            )));
        }
        Ok(())
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

    /// The fixed prefix and the header of a file of `len` bytes: the magic, the version,
    /// the header's length against the file, and the header's own checksum, before the
    /// header is believed (a damaged header is never read as another model). Returns the
    /// header and its length.
    pub(super) fn header(&mut self, len: u64) -> Result<(Map<String, Value>, u32)> {
        let r = self;
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
        r.checksum("header checksum", true)?;
        let h: Value = serde_json::from_slice(&head).map_err(|e| {
            r.bad(format!(
                "the header is not valid JSON ({e}): the file is corrupted"
            ))
        })?;
        let Value::Object(h) = h else {
            return Err(r.bad("the header is not a JSON object"));
        };
        Ok((h, hl))
    }

    /// What the body holds, from the header `h` (`hl` bytes) of a file of `len` bytes, for
    /// a model of config `c` and context `ctx`: the token count against the context, the
    /// pending token against the vocabulary, logits exactly when no token is pending and at
    /// least one was fed, and the file's size against the size the geometry gives, before
    /// anything is allocated.
    pub(super) fn shape(
        &self,
        h: &Map<String, Value>,
        hl: u32,
        len: u64,
        c: &ModelConfig,
        ctx: usize,
    ) -> Result<Shape> {
        let r = self;
        let n = match h.get("tokens").and_then(Value::as_u64) {
            Some(n) => n,
            None => return Err(r.bad("the header has no token count")),
        };
        if n > ctx as u64 {
            return Err(r.bad(format!(
                "the session holds {n} tokens, more than this model's context of {} (load the \
                 model with ctx >= {n} / --ctx {n})",
                ctx
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
        Ok(Shape {
            tokens: n,
            pending,
            logits,
            metadata,
        })
    }

    /// The body after the header: the tokens, the logits, each layer's arrays (every count
    /// checked), the final checksum, then the token ids against the vocabulary.
    pub(super) fn body(
        &mut self,
        c: &ModelConfig,
        s: &Shape,
        cancel: &dyn Fn() -> bool,
    ) -> Result<Body> {
        let r = self;
        let (n, logits) = (s.tokens, s.logits);
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
        r.checksum("checksum", false)?;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(r.bad(format!(
                "token id {bad} is outside this model's vocabulary (0..{})",
                c.vocab_size - 1
            )));
        }
        Ok(Body {
            tokens,
            logits: last,
            layers,
        })
    }
}
