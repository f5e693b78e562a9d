//! Routed experts: located in the checkpoint at load time (headers only), read on demand
//! with positional reads into one buffer per expert, kept in a bounded cache.
//!
//! The same kernel path runs on a freshly read expert as on a cached one, so results never
//! depend on the cache state.

use super::weights::check_scale;
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::dtype::DType;
use crate::error::Result;
use crate::kernels::{MatRef, Weights};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Where one of an expert's six tensors lives.
#[derive(Clone, Copy)]
struct Part {
    shard: u32,
    offset: u64,
    len: u32,
}

/// One expert's weights in one buffer: w1.q, w1.s, w3.q, w3.s, w2.q, w2.s.
pub struct Expert {
    buf: Vec<u8>,
    /// byte offsets of the six parts in `buf`, plus the end.
    offs: [usize; 7],
    inter: usize,
    hidden: usize,
}

impl Expert {
    fn part(&self, i: usize) -> &[u8] {
        &self.buf[self.offs[i]..self.offs[i + 1]]
    }
    /// w1 (gate) [I, H]
    pub fn w1(&self) -> MatRef<'_> {
        MatRef {
            rows: self.inter,
            cols: self.hidden,
            w: Weights::Fp4 {
                q: self.part(0),
                scale: self.part(1),
            },
        }
    }
    /// w3 (up) [I, H]
    pub fn w3(&self) -> MatRef<'_> {
        MatRef {
            rows: self.inter,
            cols: self.hidden,
            w: Weights::Fp4 {
                q: self.part(2),
                scale: self.part(3),
            },
        }
    }
    /// w2 (down) [H, I]
    pub fn w2(&self) -> MatRef<'_> {
        MatRef {
            rows: self.hidden,
            cols: self.inter,
            w: Weights::Fp4 {
                q: self.part(4),
                scale: self.part(5),
            },
        }
    }
}

#[derive(Default)]
pub struct ExpertCounters {
    pub requests: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub bytes_read: AtomicU64,
    pub read_ns: AtomicU64,
}

struct Cache {
    map: HashMap<(u16, u16), (Arc<Expert>, u64)>,
    tick: u64,
}

pub struct ExpertStore {
    ck: Arc<Checkpoint>,
    /// [layers · experts · 6]
    parts: Vec<Part>,
    names: Vec<String>,
    n_experts: usize,
    inter: usize,
    hidden: usize,
    /// Maximum number of cached experts.
    capacity: usize,
    cache: Mutex<Cache>,
    pub counters: ExpertCounters,
}

const SUFFIX: [&str; 6] = [
    "w1.weight",
    "w1.scale",
    "w3.weight",
    "w3.scale",
    "w2.weight",
    "w2.scale",
];

impl ExpertStore {
    /// Locates and checks (dtype, shape) every routed expert tensor without reading data.
    pub fn open(ck: Arc<Checkpoint>, c: &ModelConfig, capacity: usize) -> Result<ExpertStore> {
        let (h, i) = (c.hidden_size, c.moe_inter);
        let shapes: [(DType, [usize; 2]); 6] = [
            (DType::I8, [i, h / 2]),
            (DType::F8E8M0, [i, h / 32]),
            (DType::I8, [i, h / 2]),
            (DType::F8E8M0, [i, h / 32]),
            (DType::I8, [h, i / 2]),
            (DType::F8E8M0, [h, i / 32]),
        ];
        let mut parts = Vec::with_capacity(c.num_layers * c.n_routed_experts * 6);
        for l in 0..c.num_layers {
            for e in 0..c.n_routed_experts {
                for (k, (dt, shape)) in shapes.iter().enumerate() {
                    let name = format!("layers.{l}.ffn.experts.{e}.{}", SUFFIX[k]);
                    let t = ck.expect(&name, &[*dt], shape)?;
                    parts.push(Part {
                        shard: t.shard as u32,
                        offset: t.offset,
                        len: t.len as u32,
                    });
                }
            }
        }
        Ok(ExpertStore {
            ck,
            parts,
            names: Vec::new(),
            n_experts: c.n_routed_experts,
            inter: i,
            hidden: h,
            capacity: capacity.max(1),
            cache: Mutex::new(Cache {
                map: HashMap::new(),
                tick: 0,
            }),
            counters: ExpertCounters::default(),
        })
        .map(|mut s| {
            s.names = SUFFIX.iter().map(|x| x.to_string()).collect();
            s
        })
    }

    pub fn set_capacity(&mut self, experts: usize) {
        self.capacity = experts.max(1);
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes of one expert (all six parts).
    pub fn expert_bytes(&self) -> usize {
        self.parts[..6].iter().map(|p| p.len as usize).sum()
    }

    /// The expert's weights, from the cache or read from disk.
    pub fn get(&self, layer: usize, e: usize) -> Result<Arc<Expert>> {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        let key = (layer as u16, e as u16);
        {
            let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            c.tick += 1;
            let tick = c.tick;
            if let Some(v) = c.map.get_mut(&key) {
                v.1 = tick;
                self.counters.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(v.0.clone());
            }
        }
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        let ex = Arc::new(self.read(layer, e)?);
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        while c.map.len() >= self.capacity {
            let oldest = c.map.iter().min_by_key(|(_, v)| v.1).map(|(k, _)| *k);
            match oldest {
                Some(k) => {
                    c.map.remove(&k);
                }
                None => break,
            }
        }
        let tick = c.tick;
        c.map.insert(key, (ex.clone(), tick));
        Ok(ex)
    }

    fn read(&self, layer: usize, e: usize) -> Result<Expert> {
        let t0 = Instant::now();
        let base = (layer * self.n_experts + e) * 6;
        let ps = &self.parts[base..base + 6];
        let mut offs = [0usize; 7];
        for k in 0..6 {
            offs[k + 1] = offs[k] + ps[k].len as usize;
        }
        let mut buf = vec![0u8; offs[6]];
        for k in 0..6 {
            let p = ps[k];
            self.ck
                .read_into(p.shard as usize, p.offset, &mut buf[offs[k]..offs[k + 1]])?;
            if k % 2 == 1 {
                let name = format!("layers.{layer}.ffn.experts.{e}.{}", self.names[k]);
                check_scale(
                    &self.ck.shards[p.shard as usize].file_name,
                    &name,
                    &buf[offs[k]..offs[k + 1]],
                )?;
            }
        }
        self.counters
            .bytes_read
            .fetch_add(offs[6] as u64, Ordering::Relaxed);
        self.counters
            .read_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(Expert {
            buf,
            offs,
            inter: self.inter,
            hidden: self.hidden,
        })
    }
}
