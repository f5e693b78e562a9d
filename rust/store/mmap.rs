//! The mmap backend (`--io mmap`): experts are used in place from memory-mapped shards, with
//! no slots and no copies; the page cache is the cache.
//!
//! Touching a mapped page beyond the end of a file that shrank kills the process with
//! SIGBUS, so before a wave of experts is used this backend checks (one `fstat` per shard
//! involved) that each shard still covers every byte of those experts, and answers a
//! shorter file with an `OSError`-class error naming the shard and the expert. Restoring the
//! file in place (same inode) makes the model usable again; a replaced file (new inode) is
//! not picked up by the mapping: use the default direct I/O mode for that.
//!
//! **The race that remains:** a file truncated after the check and before (or while) the
//! expert's pages are read still raises SIGBUS. It cannot be closed without a signal
//! handler that longjmps out of the kernels, which this engine does not do; the default I/O
//! modes (positional reads) have no such window.
//!
//! Scales are checked for the F8_E8M0 NaN byte the first time each expert is used, as the
//! reading modes check them after every read, so every I/O mode rejects the same bytes.

use super::layout::{Blocks, Layout, SCALE_PARTS};
use super::worker::scan_scales;
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use memmap2::Mmap;
use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub(crate) struct MmapStore {
    /// [shard] the mappings and the handles that were mapped (for their current size)
    maps: Vec<Mmap>,
    files: Vec<Arc<File>>,
    names: Vec<String>,
    layouts: Arc<Vec<Layout>>,
    /// [key] the expert's scales were checked
    checked: Vec<AtomicBool>,
    blocks: Blocks,
}

impl MmapStore {
    pub fn open(ck: &Checkpoint, layouts: Arc<Vec<Layout>>, blocks: Blocks) -> Result<MmapStore> {
        let mut maps = Vec::new();
        let mut files = Vec::new();
        let mut names = Vec::new();
        for s in &ck.shards {
            let f = s.file();
            // SAFETY: the shard is opened read-only and never written by v4flash. Another
            // process shrinking it while mapped is checked for before each use (`acquire`);
            // the window that remains is documented in the module comment.
            let m = unsafe { Mmap::map(&*f) }.map_err(|e| Error::io(&s.path, "mmap shard", e))?;
            maps.push(m);
            files.push(f);
            names.push(s.file_name.clone());
        }
        let checked = (0..layouts.len()).map(|_| AtomicBool::new(false)).collect();
        Ok(MmapStore {
            maps,
            files,
            names,
            layouts,
            checked,
            blocks,
        })
    }

    fn name(&self, key: u32) -> String {
        self.blocks.expert_name(key)
    }

    /// Checks that the experts' bytes are still in their files (and inside the mappings),
    /// and their scales on first use.
    pub fn acquire(&self, keys: &[u32]) -> Result<()> {
        let mut sizes: Vec<Option<u64>> = vec![None; self.files.len()];
        for &key in keys {
            let lay = &self.layouts[key as usize];
            for p in &lay.files {
                let sh = p.shard as usize;
                let size = match sizes[sh] {
                    Some(s) => s,
                    None => {
                        let s = self.files[sh]
                            .metadata()
                            .map_err(|e| Error::Read(format!("{}: stat: {e}", self.names[sh])))?
                            .len();
                        sizes[sh] = Some(s);
                        s
                    }
                };
                let end = p.end();
                if end > size || end > self.maps[sh].len() as u64 {
                    return Err(Error::Read(format!(
                        "{}: expert {} lies at bytes {}..{end} but the file is now {size} bytes long \
                         (truncated shard?); restore the file in place and retry",
                        self.names[sh],
                        self.name(key),
                        p.offset
                    )));
                }
            }
            if !self.checked[key as usize].load(Ordering::Acquire) {
                for k in SCALE_PARTS {
                    scan_scales(
                        self.part(key, k),
                        &self.names[lay.files[k].shard as usize],
                        &self.blocks,
                        key,
                        k,
                    )?;
                }
                self.checked[key as usize].store(true, Ordering::Release);
            }
        }
        Ok(())
    }

    /// Part k of an expert, in place in its mapping (bounds checked in `acquire`).
    pub fn part(&self, key: u32, k: usize) -> &[u8] {
        let p = self.layouts[key as usize].files[k];
        let (s, l) = (p.offset as usize, p.len as usize);
        &self.maps[p.shard as usize][s..s + l]
    }
}
