//! The checkpoint as DeepSeek publishes it: `model.safetensors.index.json` plus shards (or a
//! single `model.safetensors`). Opening parses every shard header once and builds one
//! name → (shard, dtype, shape, byte range) table; nothing else is read until asked.
//! Files are opened read-only and never written.

pub mod expected;
pub mod inspect;
mod io;
pub mod safetensors;
pub mod sizes;

use crate::dtype::DType;
use crate::error::{Error, Result};
use serde_json::Value;
use std::collections::HashMap;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

pub use io::read_exact_at;

#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// Index into `Checkpoint::shards`.
    pub shard: usize,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Absolute byte offset in the shard file.
    pub offset: u64,
    pub len: u64,
}

impl TensorInfo {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

pub struct Shard {
    pub path: PathBuf,
    pub file_name: String,
    /// The open (read-only) file; replaced by a fresh handle when a read fails and the file at
    /// `path` is again the shard that was opened (restored after a fault).
    file: RwLock<Arc<File>>,
    pub len: u64,
    /// Hash of the length prefix and header bytes, to recognise the same shard on reopen.
    header_hash: u64,
    header_len: u64,
}

impl Shard {
    /// Opens shard `fname` of `dir` read-only and parses its header (every check that needs
    /// no tensor data: safetensors::parse_header). `what` says where the name came from.
    pub fn open(
        dir: &Path,
        fname: &str,
        what: &str,
    ) -> Result<(Shard, Vec<safetensors::RawEntry>)> {
        let path = dir.join(fname);
        let file = open_shard(&path, fname, what)?;
        let len = file
            .metadata()
            .map_err(|e| Error::io(&path, "stat", e))?
            .len();
        if len < 8 {
            return Err(Error::checkpoint(
                fname,
                format!("file is {len} bytes, too short for a safetensors header (truncated?)"),
            ));
        }
        let mut prefix = [0u8; 8];
        read_exact_at(&file, &path, &mut prefix, 0)?;
        let hl = safetensors::header_len(fname, &prefix, len)?;
        let mut header = vec![0u8; 8 + hl as usize];
        read_exact_at(&file, &path, &mut header, 0)?;
        let header_hash = hash_bytes(&header);
        let entries = safetensors::parse_header(fname, &header[8..], len)?;
        let shard = Shard {
            path,
            file_name: fname.to_string(),
            file: RwLock::new(Arc::new(file)),
            len,
            header_hash,
            header_len: hl,
        };
        Ok((shard, entries))
    }

    /// The current file handle.
    pub fn file(&self) -> Arc<File> {
        self.file.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Reopens `path` (read-only) and swaps it in if it is still the same shard (same
    /// length, same header). Returns whether a new handle is in place.
    fn reopen(&self) -> bool {
        let Ok(f) = open_shard(&self.path, &self.file_name, "reopen") else {
            return false;
        };
        match f.metadata() {
            Ok(m) if m.len() == self.len => {}
            _ => return false,
        }
        let mut hdr = vec![0u8; 8 + self.header_len as usize];
        if read_exact_at(&f, &self.path, &mut hdr, 0).is_err()
            || hash_bytes(&hdr) != self.header_hash
        {
            return false;
        }
        *self.file.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(f);
        true
    }
}

fn hash_bytes(b: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    b.hash(&mut h);
    h.finish()
}

/// Opens a shard read-only after checking that it is a regular file (a directory fails
/// late, and opening a FIFO or a device could block forever).
fn open_shard(path: &Path, fname: &str, what: &str) -> Result<File> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, what.to_string(), e))?;
    if !meta.is_file() {
        return Err(Error::checkpoint(
            fname,
            format!(
                "{} is not a regular file (expected a safetensors shard)",
                path.display()
            ),
        ));
    }
    // std's File::open is O_RDONLY (plus O_CLOEXEC): the checkpoint is never written.
    File::open(path).map_err(|e| Error::io(path, what.to_string(), e))
}

pub struct Checkpoint {
    pub dir: PathBuf,
    pub shards: Vec<Shard>,
    tensors: HashMap<String, TensorInfo>,
    /// Drafter-only shards left out: (file name, the error).
    skipped: Vec<(String, String)>,
}

/// Whether the index maps only drafter tensors (`mtp.*`) to `fname`.
pub fn drafter_only(map: &HashMap<String, String>, fname: &str) -> bool {
    let mut any = false;
    for (name, f) in map {
        if f == fname {
            if !expected::is_drafter(name) {
                return false;
            }
            any = true;
        }
    }
    any
}

impl Checkpoint {
    /// Opens and validates the file structure of a checkpoint directory.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        let meta = std::fs::metadata(dir).map_err(|e| Error::io(dir, "checkpoint directory", e))?;
        if !meta.is_dir() {
            return Err(Error::arg(format!(
                "{}: is a file, not a checkpoint directory (pass the folder holding config.json and the shards)",
                dir.display()
            )));
        }
        let index_path = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let (shard_names, weight_map) = if index_path.exists() {
            let (names, map) = parse_index(&index_path)?;
            (names, Some(map))
        } else if single.exists() {
            (vec!["model.safetensors".to_string()], None)
        } else {
            return Err(Error::NotFound {
                path: index_path,
                detail: "neither model.safetensors.index.json nor model.safetensors is in the checkpoint directory".into(),
            });
        };

        let mut shards: Vec<Shard> = Vec::with_capacity(shard_names.len());
        let mut tensors: HashMap<String, TensorInfo> = HashMap::new();
        let mut skipped = Vec::new();
        for fname in &shard_names {
            let what = if weight_map.is_some() {
                "shard named in model.safetensors.index.json"
            } else {
                "the checkpoint's single shard"
            };
            let (shard, entries) = match Shard::open(dir, fname, what) {
                Ok(x) => x,
                // A shard of the drafter only (the index maps nothing else to it) is not
                // needed to run the model: it is left out, and the drafter reports it.
                Err(e) if weight_map.as_ref().is_some_and(|m| drafter_only(m, fname)) => {
                    skipped.push((fname.clone(), e.to_string()));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let si = shards.len();
            for e in entries {
                if let Some(prev) = tensors.get(&e.name) {
                    return Err(Error::checkpoint(
                        fname.clone(),
                        format!(
                            "tensor {} is also in {} (duplicate name across shards)",
                            e.name, shards[prev.shard].file_name
                        ),
                    ));
                }
                tensors.insert(
                    e.name.clone(),
                    TensorInfo {
                        name: e.name,
                        shard: si,
                        dtype: e.dtype,
                        shape: e.shape,
                        offset: e.offset,
                        len: e.len,
                    },
                );
            }
            shards.push(shard);
        }

        if let Some(map) = weight_map {
            for (name, fname) in &map {
                if skipped.iter().any(|(f, _)| f == fname) {
                    continue;
                }
                match tensors.get(name) {
                    None => {
                        return Err(Error::checkpoint(
                            fname.clone(),
                            format!("model.safetensors.index.json maps tensor {name} to this shard, but no shard contains it"),
                        ))
                    }
                    Some(t) if &shards[t.shard].file_name != fname => {
                        return Err(Error::checkpoint(
                            "model.safetensors.index.json",
                            format!("tensor {name} is mapped to {fname} but is stored in {}", shards[t.shard].file_name),
                        ))
                    }
                    _ => {}
                }
            }
            for t in tensors.values() {
                if !map.contains_key(&t.name) {
                    return Err(Error::checkpoint(
                        shards[t.shard].file_name.clone(),
                        format!(
                            "tensor {} is not listed in model.safetensors.index.json",
                            t.name
                        ),
                    ));
                }
            }
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            shards,
            tensors,
            skipped,
        })
    }

    /// The drafter-only shards that could not be opened, with why: the model runs without
    /// them, the drafter does not (`inspect`).
    pub fn skipped_shards(&self) -> &[(String, String)] {
        &self.skipped
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    pub fn file_of(&self, t: &TensorInfo) -> &str {
        &self.shards[t.shard].file_name
    }

    /// The tensor, or an error naming it (with a hint when the names follow another layout).
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensors.get(name).ok_or_else(|| {
            let where_ = if self.dir.join("model.safetensors.index.json").is_file() {
                "neither model.safetensors.index.json nor any shard lists it"
            } else {
                "model.safetensors does not contain it"
            };
            Error::checkpoint(
                self.dir.display().to_string(),
                format!(
                    "missing tensor {name}: {where_} (required by config.json; is this a DeepSeek-V4-Flash checkpoint?){}",
                    self.layout_hint()
                ),
            )
        })
    }

    /// A hint for checkpoints in another naming scheme (e.g. a transformers conversion).
    fn layout_hint(&self) -> String {
        let n = self.tensors.len().max(1);
        let hf = self
            .tensors
            .keys()
            .filter(|k| k.starts_with("model."))
            .count();
        if hf * 2 > n {
            let example = self
                .tensors
                .keys()
                .filter(|k| k.starts_with("model."))
                .min();
            return format!(
                "; its tensor names look like a Hugging Face transformers conversion (e.g. {}), \
                 v4flash reads the checkpoint as DeepSeek publishes it (embed.weight, layers.N.attn.wq_a.weight, ...)",
                example.map(String::as_str).unwrap_or("model.*")
            );
        }
        String::new()
    }

    /// The tensor, checked against the allowed dtypes and the exact shape.
    pub fn expect(&self, name: &str, dtypes: &[DType], shape: &[usize]) -> Result<&TensorInfo> {
        let t = self.tensor(name)?;
        if !dtypes.contains(&t.dtype) {
            let want: Vec<&str> = dtypes.iter().map(|d| d.name()).collect();
            return Err(Error::checkpoint(
                self.file_of(t),
                format!(
                    "tensor {name}: expected dtype {}, found {}",
                    want.join(" or "),
                    t.dtype
                ),
            ));
        }
        if t.shape != shape {
            return Err(Error::checkpoint(
                self.file_of(t),
                format!(
                    "tensor {name}: expected shape {shape:?}, found {:?}",
                    t.shape
                ),
            ));
        }
        Ok(t)
    }

    /// Reads a whole tensor's bytes.
    pub fn read(&self, t: &TensorInfo) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; t.len as usize];
        self.read_into(t.shard, t.offset, &mut buf)?;
        Ok(buf)
    }

    /// Positional read of `buf.len()` bytes at `offset` of shard `shard`.
    ///
    /// A failed read (the file shrank, or an I/O error) is retried once on a freshly opened
    /// handle when the file at the shard's path is again the shard that was loaded (so a
    /// shard restored by copying it back, even as a new file, works again); otherwise the
    /// original error, naming the file and offset, is returned.
    pub fn read_into(&self, shard: usize, offset: u64, buf: &mut [u8]) -> Result<()> {
        let s = &self.shards[shard];
        match read_exact_at(&s.file(), &s.path, buf, offset) {
            Ok(()) => Ok(()),
            Err(e) => {
                if s.reopen() {
                    read_exact_at(&s.file(), &s.path, buf, offset)
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Reads an F32/BF16/F16 tensor as f32.
    pub fn read_f32(&self, t: &TensorInfo) -> Result<Vec<f32>> {
        let b = self.read(t)?;
        let v = crate::dtype::to_f32_vec(t.dtype, &b).ok_or_else(|| {
            Error::checkpoint(
                self.file_of(t),
                format!(
                    "tensor {}: expected a float dtype, found {}",
                    t.name, t.dtype
                ),
            )
        })?;
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(Error::checkpoint(
                self.file_of(t),
                format!(
                    "tensor {}: element {i} is {} (expected finite values)",
                    t.name, v[i]
                ),
            ));
        }
        Ok(v)
    }
}

/// Parses `model.safetensors.index.json`: the shard names (sorted, deduplicated) and the map.
fn parse_index(path: &Path) -> Result<(Vec<String>, HashMap<String, String>)> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, "stat", e))?;
    if !meta.is_file() {
        return Err(Error::checkpoint(
            "model.safetensors.index.json",
            "is not a regular file",
        ));
    }
    // the published index is ~5 MB; a multi-GB file here is something else
    if meta.len() > 512 << 20 {
        return Err(Error::checkpoint(
            "model.safetensors.index.json",
            format!(
                "{} bytes is implausibly large for an index (limit {})",
                meta.len(),
                512u64 << 20
            ),
        ));
    }
    let text = std::fs::read(path).map_err(|e| Error::io(path, "read", e))?;
    parse_index_bytes(&text)
}

/// Parses the bytes of `model.safetensors.index.json`: the shard names (sorted, deduplicated)
/// and the tensor → shard map.
pub fn parse_index_bytes(text: &[u8]) -> Result<(Vec<String>, HashMap<String, String>)> {
    let f = "model.safetensors.index.json";
    let v: Value = serde_json::from_slice(text)
        .map_err(|e| Error::checkpoint(f, format!("not valid JSON ({e})")))?;
    let wm = v
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| Error::checkpoint(f, "missing \"weight_map\" object"))?;
    let mut map = HashMap::with_capacity(wm.len());
    let mut names: Vec<String> = Vec::new();
    for (k, s) in wm {
        let s = s.as_str().ok_or_else(|| {
            Error::checkpoint(f, format!("weight_map[{k:?}] is not a file name string"))
        })?;
        if s.is_empty()
            || s.contains('/')
            || s.contains('\\')
            || s.contains("..")
            || s.contains('\0')
        {
            return Err(Error::checkpoint(
                f,
                format!("weight_map[{k:?}] = {s:?} is not a plain file name"),
            ));
        }
        names.push(s.to_string());
        map.insert(k.clone(), s.to_string());
    }
    names.sort();
    names.dedup();
    if names.is_empty() {
        return Err(Error::checkpoint(f, "weight_map is empty"));
    }
    Ok((names, map))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiny-a")
    }

    #[cfg(unix)]
    #[test]
    fn shards_are_opened_read_only() {
        use std::os::unix::io::AsRawFd;
        let ck = Checkpoint::open(&fixture()).unwrap();
        assert_eq!(ck.shards.len(), 2);
        for s in &ck.shards {
            let f = s.file();
            // SAFETY: F_GETFL on a valid, open descriptor owned by `f`.
            let flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
            assert!(flags >= 0);
            assert_eq!(flags & libc::O_ACCMODE, libc::O_RDONLY, "{}", s.file_name);
        }
    }

    #[test]
    fn a_restored_shard_is_reopened_and_a_different_file_is_not() {
        let dir = tempfile::tempdir().unwrap();
        for f in std::fs::read_dir(fixture()).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), dir.path().join(f.file_name())).unwrap();
        }
        let ck = Checkpoint::open(dir.path()).unwrap();
        let t = ck
            .tensor("layers.5.ffn.experts.7.w2.weight")
            .unwrap()
            .clone();
        let good = ck.read(&t).unwrap();
        let p = ck.shards[t.shard].path.clone();
        let orig = std::fs::read(&p).unwrap();
        // shrink in place: the read fails, naming the file and the offset
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(t.offset)
            .unwrap();
        let e = ck.read(&t).unwrap_err().to_string();
        assert!(e.contains(&ck.shards[t.shard].file_name), "{e}");
        assert!(e.contains(&format!("at offset {}", t.offset)), "{e}");
        // Replacing a file that is open is not tested on Windows: wine 8.0 (where these tests
        // run) neither renames over an open file (ERROR_ACCESS_DENIED) nor unlinks one
        // (the name stays until the last handle closes; a create then reopens that file).
        #[cfg(not(windows))]
        replace_while_open(&ck, &t, &p, &orig, &good);
        #[cfg(windows)]
        let _ = (orig, good);
    }

    #[cfg(not(windows))]
    fn replace_while_open(ck: &Checkpoint, t: &TensorInfo, p: &Path, orig: &[u8], good: &[u8]) {
        // a different file at the path is refused
        std::fs::remove_file(p).unwrap();
        let mut other = orig.to_vec();
        other[20] ^= 1;
        std::fs::write(p, &other).unwrap();
        assert!(ck.read(t).is_err());
        // the same shard, as a new file: reopened, reads work again
        std::fs::remove_file(p).unwrap();
        std::fs::write(p, orig).unwrap();
        assert_eq!(ck.read(t).unwrap(), good);
    }
}
