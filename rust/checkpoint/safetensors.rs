//! Parsing one safetensors shard header, with every check that can be made before any data
//! is read: header length within the file, UTF-8 JSON, known dtypes, byte lengths equal to
//! dtype width × numel, ranges inside the data section and not overlapping.

use crate::dtype::DType;
use crate::error::{Error, Result};
use serde_json::Value;

/// Headers larger than this are refused (real shards have headers of a few hundred KB).
const MAX_HEADER: u64 = 100 << 20;

/// One tensor entry of a shard header, with its absolute byte range in the file.
#[derive(Debug, Clone)]
pub struct RawEntry {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Absolute offset of the first byte in the file.
    pub offset: u64,
    pub len: u64,
}

/// Reads the 8-byte length prefix; validates it against the file size.
pub fn header_len(file: &str, prefix: &[u8; 8], file_len: u64) -> Result<u64> {
    let n = u64::from_le_bytes(*prefix);
    if n > MAX_HEADER {
        return Err(Error::checkpoint(file, format!("header length {n} bytes is implausible (limit {MAX_HEADER}); not a safetensors file?")));
    }
    if 8 + n > file_len {
        return Err(Error::checkpoint(
            file,
            format!("header length {n} + 8 exceeds the file size {file_len} bytes (truncated or not a safetensors file)"),
        ));
    }
    Ok(n)
}

/// The header's top-level entries in file order, keeping duplicates (a JSON object parsed
/// into a map would silently keep only the last of two entries with the same name).
struct Entries(Vec<(String, Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Entries, A::Error> {
                let mut v = Vec::new();
                while let Some(e) = m.next_entry::<String, Value>()? {
                    v.push(e);
                }
                Ok(Entries(v))
            }
        }
        d.deserialize_map(V)
    }
}

/// Parses the JSON header (the bytes after the length prefix) of a file of `file_len` bytes.
///
/// Besides each entry's own checks, the data section must be exactly covered by the tensors
/// in offset order (what the safetensors format requires): an overlap, a hole or trailing
/// bytes mean the offsets were edited or the file was cut or spliced.
pub fn parse_header(file: &str, header: &[u8], file_len: u64) -> Result<Vec<RawEntry>> {
    let text = std::str::from_utf8(header)
        .map_err(|e| Error::checkpoint(file, format!("header is not valid UTF-8 ({e})")))?;
    let text = text.trim_end_matches(' ');
    let v: Value = serde_json::from_str(text)
        .map_err(|e| Error::checkpoint(file, format!("header is not valid JSON ({e})")))?;
    if !v.is_object() {
        return Err(Error::checkpoint(file, "header is not a JSON object"));
    }
    let Entries(entries) = serde_json::from_str(text)
        .map_err(|e| Error::checkpoint(file, format!("header is not valid JSON ({e})")))?;
    let data_start = 8 + header.len() as u64;
    let data_len = file_len.checked_sub(data_start).ok_or_else(|| {
        Error::checkpoint(
            file,
            format!(
                "header of {} bytes + 8 exceeds the file size {file_len} bytes (truncated?)",
                header.len()
            ),
        )
    })?;
    let mut seen = std::collections::HashSet::with_capacity(entries.len());
    let mut out = Vec::with_capacity(entries.len());
    for (name, e) in &entries {
        if !seen.insert(name.as_str()) {
            return Err(Error::checkpoint(
                file,
                format!("tensor {name} appears twice in the header (expected unique names)"),
            ));
        }
        if name == "__metadata__" {
            continue;
        }
        let bad = |msg: String| Error::checkpoint(file, format!("tensor {name}: {msg}"));
        let eo = e
            .as_object()
            .ok_or_else(|| bad("entry is not an object".into()))?;
        let ds = eo
            .get("dtype")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("missing \"dtype\" string".into()))?;
        let dtype = DType::from_safetensors(ds).ok_or_else(|| {
            bad(format!("unknown dtype {ds:?} (expected one of F8_E4M3, F8_E8M0, I8, BF16, F16, F32, I64, I32)"))
        })?;
        let shape_v = eo
            .get("shape")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("missing \"shape\" array".into()))?;
        let mut shape = Vec::with_capacity(shape_v.len());
        for d in shape_v {
            let d = d.as_u64().ok_or_else(|| {
                bad(format!(
                    "shape {} has a non-integer or negative dimension",
                    Value::Array(shape_v.clone())
                ))
            })?;
            shape.push(usize::try_from(d).map_err(|_| bad(format!("dimension {d} too large")))?);
        }
        let offs = eo
            .get("data_offsets")
            .and_then(Value::as_array)
            .filter(|a| a.len() == 2)
            .ok_or_else(|| bad("missing \"data_offsets\" [begin, end]".into()))?;
        let (b, en) = match (offs[0].as_u64(), offs[1].as_u64()) {
            (Some(b), Some(en)) => (b, en),
            _ => return Err(bad("data_offsets must be two non-negative integers".into())),
        };
        if en < b {
            return Err(bad(format!("data_offsets [{b}, {en}] end before begin")));
        }
        if en > data_len {
            return Err(bad(format!(
                "data_offsets [{b}, {en}] run past the end of the data section ({data_len} bytes; file truncated?)"
            )));
        }
        let numel = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64));
        let want = numel.and_then(|n| n.checked_mul(dtype.size() as u64));
        if want != Some(en - b) {
            return Err(bad(format!(
                "{dtype} {shape:?} needs {} bytes but data_offsets give {}",
                want.map(|w| w.to_string())
                    .unwrap_or_else(|| "overflowing".into()),
                en - b
            )));
        }
        out.push(RawEntry {
            name: name.clone(),
            dtype,
            shape,
            offset: data_start + b,
            len: en - b,
        });
    }
    out.sort_by_key(|e| (e.offset, e.len));
    let mut at = data_start;
    let mut prev: Option<&RawEntry> = None;
    for e in &out {
        if let (Some(p), true) = (prev, e.offset < at) {
            return Err(Error::checkpoint(
                file,
                format!(
                    "tensors {} and {} overlap in the file (data_offsets [{}, {}] and [{}, {}])",
                    p.name,
                    e.name,
                    p.offset - data_start,
                    p.offset + p.len - data_start,
                    e.offset - data_start,
                    e.offset + e.len - data_start
                ),
            ));
        }
        if e.offset > at {
            return Err(Error::checkpoint(
                file,
                format!(
                    "{} unused bytes before tensor {} (data_offsets begin at {}, expected {}): the tensors must tile the data section",
                    e.offset - at,
                    e.name,
                    e.offset - data_start,
                    at - data_start
                ),
            ));
        }
        at = e.offset + e.len;
        prev = Some(e);
    }
    if at != file_len {
        return Err(Error::checkpoint(
            file,
            format!(
                "file is {file_len} bytes but its tensors end at byte {at}: {} trailing bytes (expected the last tensor to end the file)",
                file_len - at
            ),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(json: &str) -> Vec<u8> {
        json.as_bytes().to_vec()
    }

    #[test]
    fn parses_and_checks() {
        let h = hdr(
            r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[4],"data_offsets":[16,24]}}"#,
        );
        let fl = 8 + h.len() as u64 + 24;
        let e = parse_header("f", &h, fl).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].name, "a");
        assert_eq!(e[1].offset, 8 + h.len() as u64 + 16);
    }

    #[test]
    fn rejects_bad_entries() {
        let cases = [
            (
                r#"{"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}"#,
                "unknown dtype",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
                "needs 12 bytes",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,800]}}"#,
                "past the end",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
                "overlap",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}"#,
                "non-integer or negative",
            ),
            (r#"[1,2]"#, "not a JSON object"),
            (r#"{"a":"#, "not valid JSON"),
        ];
        for (j, want) in cases {
            let h = hdr(j);
            let err = parse_header("shard.safetensors", &h, 8 + h.len() as u64 + 16)
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{j}: {err}");
            assert!(err.starts_with("shard.safetensors"), "{err}");
        }
        let err = parse_header("f", &[0xff, 0xfe], 100)
            .unwrap_err()
            .to_string();
        assert!(err.contains("UTF-8"), "{err}");
    }

    #[test]
    fn header_len_bounds() {
        assert!(header_len("f", &100u64.to_le_bytes(), 50)
            .unwrap_err()
            .to_string()
            .contains("exceeds"));
        assert!(header_len("f", &u64::MAX.to_le_bytes(), 50)
            .unwrap_err()
            .to_string()
            .contains("implausible"));
        assert_eq!(header_len("f", &10u64.to_le_bytes(), 50).unwrap(), 10);
    }
}
