//! The tensors a DeepSeek V4 Flash checkpoint holds for a config: every name the engine reads,
//! the dtypes it accepts and the exact shape. This is the one table. The loader checks every
//! dense entry before it reads any weight, takes each tensor's shape from here and fails when
//! it reads a tensor that is not in the table or leaves one unread (`model::weights::Loader`).
//! The expert store locates and checks the routed experts with `expert_part`. `doctor` and
//! `bench` get the table through `_core.expected_tensors`. `mtp.*` is not in it, because the
//! engine does not use the MTP block.
//!
//! The first accepted dtype of each entry is the one DeepSeek's release stores
//! (docs/checkpoint.md §3), so the table also gives the published checkpoint's sizes.

use crate::config::{LayerKind, ModelConfig};
use crate::dtype::DType;

/// FP8 E4M3 weights.
pub const FP8: &[DType] = &[DType::F8E4M3];
/// UE8M0 scales (of FP8 and FP4 weights).
pub const SCALE: &[DType] = &[DType::F8E8M0];
/// Packed FP4 E2M1 expert weights, two per byte.
pub const FP4: &[DType] = &[DType::I8];
/// Float tensors the release stores in BF16 (matrices, norm weights); F32 and F16 accepted.
pub const BF16_FLOAT: &[DType] = &[DType::BF16, DType::F32, DType::F16];
/// Float tensors the release stores in F32 (hyper-connections, sinks, `ape`, routing biases).
pub const F32_FLOAT: &[DType] = &[DType::F32, DType::BF16, DType::F16];
/// `tid2eid` token -> expert tables.
pub const TOKEN_IDS: &[DType] = &[DType::I64, DType::I32];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedTensor {
    pub name: String,
    /// The dtypes accepted; the first is the one the published checkpoint stores.
    pub dtypes: &'static [DType],
    pub shape: Vec<usize>,
}

impl ExpectedTensor {
    /// Bytes in the published dtype.
    pub fn published_bytes(&self) -> u64 {
        let n = self
            .shape
            .iter()
            .fold(1u64, |a, &d| a.saturating_mul(d as u64));
        n.saturating_mul(self.dtypes[0].size() as u64)
    }
}

/// The six tensors of a routed expert, in slot-part order: weight 2k and scale 2k+1 of
/// matrix k (w1, w3, w2).
pub const EXPERT_PARTS: [&str; 6] = [
    "w1.weight",
    "w1.scale",
    "w3.weight",
    "w3.scale",
    "w2.weight",
    "w2.scale",
];

/// The checkpoint name of part `k` (`EXPERT_PARTS`) of routed expert `e` of layer `l`.
pub fn expert_part_name(l: usize, e: usize, k: usize) -> String {
    format!("layers.{l}.ffn.experts.{e}.{}", EXPERT_PARTS[k])
}

/// The accepted dtypes and the shape of part `k` (`EXPERT_PARTS`) of every routed expert: FP4
/// weights [out, in/2] with one scale per 32 inputs [out, in/32]; w1 and w3 are
/// [moe_intermediate_size, hidden_size], w2 the transpose.
pub fn expert_part(c: &ModelConfig, k: usize) -> (&'static [DType], [usize; 2]) {
    let (h, i) = (c.hidden_size, c.moe_inter);
    let (out, inn) = if k < 4 { (i, h) } else { (h, i) };
    if k % 2 == 0 {
        (FP4, [out, inn / 2])
    } else {
        (SCALE, [out, inn / 32])
    }
}

/// (layer, expert) when `name` is a tensor of a routed expert of the main model,
/// `layers.L.ffn.experts.E.<part>` (not the MTP block's `mtp.*` experts). The one test for
/// "is this a routed expert": the planner, `doctor`, `info` and `bench` all use it.
pub fn routed_expert(name: &str) -> Option<(usize, usize)> {
    let rest = name.strip_prefix("layers.")?;
    let (l, rest) = rest.split_once('.')?;
    let (e, part) = rest.strip_prefix("ffn.experts.")?.split_once('.')?;
    if part.is_empty() {
        return None;
    }
    Some((index(l)?, index(e)?))
}

pub fn is_routed_expert(name: &str) -> bool {
    routed_expert(name).is_some()
}

fn index(s: &str) -> Option<usize> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Builds the table in the loader's order.
struct Table(Vec<ExpectedTensor>);

impl Table {
    fn add(&mut self, name: String, dtypes: &'static [DType], shape: &[usize]) {
        self.0.push(ExpectedTensor {
            name,
            dtypes,
            shape: shape.to_vec(),
        });
    }
    /// An FP8 matrix `{name}.weight` [rows, cols] and its 128×128-block `{name}.scale`.
    fn fp8(&mut self, name: &str, rows: usize, cols: usize) {
        self.add(format!("{name}.weight"), FP8, &[rows, cols]);
        let blocks = [rows.div_ceil(128), cols.div_ceil(128)];
        self.add(format!("{name}.scale"), SCALE, &blocks);
    }
    /// A BF16 matrix `{name}.weight` [rows, cols].
    fn matrix(&mut self, name: &str, rows: usize, cols: usize) {
        self.add(format!("{name}.weight"), BF16_FLOAT, &[rows, cols]);
    }
    /// A compressor: `ape` [ratio, w], `norm.weight` [dim], `wkv` and `wgate` [w, H], with
    /// w = 2·dim when its windows overlap (CSA), else dim.
    fn compressor(&mut self, c: &ModelConfig, pre: &str, ratio: usize, dim: usize, overlap: bool) {
        let w = if overlap { 2 * dim } else { dim };
        self.add(format!("{pre}.ape"), F32_FLOAT, &[ratio, w]);
        self.add(format!("{pre}.norm.weight"), BF16_FLOAT, &[dim]);
        self.matrix(&format!("{pre}.wkv"), w, c.hidden_size);
        self.matrix(&format!("{pre}.wgate"), w, c.hidden_size);
    }
}

/// Every tensor the engine reads but the routed experts, in the order the loader reads them:
/// the embedding first (a config of another model is reported by its shape), then the head,
/// the final norm, the hyper-head and each layer's tensors.
pub fn dense_tensors(c: &ModelConfig) -> Vec<ExpectedTensor> {
    let (h, hcm, v, d, nh) = (
        c.hidden_size,
        c.hc_mult,
        c.vocab_size,
        c.head_dim,
        c.num_heads,
    );
    let mut t = Table(Vec::new());
    t.matrix("embed", v, h);
    t.matrix("head", v, h);
    t.add("norm.weight".into(), BF16_FLOAT, &[h]);
    t.add("hc_head_fn".into(), F32_FLOAT, &[hcm, hcm * h]);
    t.add("hc_head_base".into(), F32_FLOAT, &[hcm]);
    t.add("hc_head_scale".into(), F32_FLOAT, &[1]);
    let mix = (2 + hcm) * hcm;
    for l in 0..c.num_layers {
        let p = format!("layers.{l}");
        for which in ["attn", "ffn"] {
            t.add(format!("{p}.hc_{which}_fn"), F32_FLOAT, &[mix, hcm * h]);
            t.add(format!("{p}.hc_{which}_base"), F32_FLOAT, &[mix]);
            t.add(format!("{p}.hc_{which}_scale"), F32_FLOAT, &[3]);
        }
        let a = format!("{p}.attn");
        match c.layer_kinds[l] {
            LayerKind::Sliding => {}
            LayerKind::Hca { ratio } => {
                t.compressor(c, &format!("{a}.compressor"), ratio, d, false)
            }
            LayerKind::Csa { ratio } => {
                t.compressor(c, &format!("{a}.compressor"), ratio, d, true);
                let ix = format!("{a}.indexer");
                t.compressor(
                    c,
                    &format!("{ix}.compressor"),
                    ratio,
                    c.index_head_dim,
                    true,
                );
                t.fp8(
                    &format!("{ix}.wq_b"),
                    c.index_n_heads * c.index_head_dim,
                    c.q_lora_rank,
                );
                t.matrix(&format!("{ix}.weights_proj"), c.index_n_heads, h);
            }
        }
        t.fp8(&format!("{a}.wq_a"), c.q_lora_rank, h);
        t.add(format!("{a}.q_norm.weight"), BF16_FLOAT, &[c.q_lora_rank]);
        t.fp8(&format!("{a}.wq_b"), nh * d, c.q_lora_rank);
        t.fp8(&format!("{a}.wkv"), d, h);
        t.add(format!("{a}.kv_norm.weight"), BF16_FLOAT, &[d]);
        let (g, r) = (c.o_groups, c.o_lora_rank);
        t.fp8(&format!("{a}.wo_a"), g * r, nh * d / g);
        t.fp8(&format!("{a}.wo_b"), h, g * r);
        t.add(format!("{a}.attn_sink"), F32_FLOAT, &[nh]);
        let f = format!("{p}.ffn");
        t.matrix(&format!("{f}.gate"), c.n_routed_experts, h);
        if c.is_hash_layer(l) {
            let shape = [v, c.experts_per_tok];
            t.add(format!("{f}.gate.tid2eid"), TOKEN_IDS, &shape);
        } else {
            t.add(format!("{f}.gate.bias"), F32_FLOAT, &[c.n_routed_experts]);
        }
        t.fp8(&format!("{f}.shared_experts.w1"), c.moe_inter, h);
        t.fp8(&format!("{f}.shared_experts.w3"), c.moe_inter, h);
        t.fp8(&format!("{f}.shared_experts.w2"), h, c.moe_inter);
        t.add(format!("{p}.attn_norm.weight"), BF16_FLOAT, &[h]);
        t.add(format!("{p}.ffn_norm.weight"), BF16_FLOAT, &[h]);
    }
    t.0
}

/// The whole table: `dense_tensors`, then the six parts of every routed expert, layer by
/// layer and expert by expert.
pub fn expected_tensors(c: &ModelConfig) -> Vec<ExpectedTensor> {
    let mut t = dense_tensors(c);
    t.reserve(c.num_layers * c.n_routed_experts * 6);
    for l in 0..c.num_layers {
        for e in 0..c.n_routed_experts {
            for k in 0..EXPERT_PARTS.len() {
                let (dtypes, shape) = expert_part(c, k);
                t.push(ExpectedTensor {
                    name: expert_part_name(l, e, k),
                    dtypes,
                    shape: shape.to_vec(),
                });
            }
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Checkpoint;
    use crate::config::PUBLISHED_CONFIG;
    use std::collections::HashSet;
    use std::path::Path;

    fn published() -> ModelConfig {
        ModelConfig::from_json(&serde_json::from_str(PUBLISHED_CONFIG).unwrap()).unwrap()
    }

    #[test]
    fn routed_expert_names() {
        assert_eq!(
            routed_expert("layers.12.ffn.experts.255.w2.scale"),
            Some((12, 255))
        );
        for n in [
            "mtp.0.ffn.experts.3.w1.weight",
            "layers.1.ffn.shared_experts.w1.weight",
            "layers.1.ffn.gate.weight",
            "layers.x.ffn.experts.3.w1.weight",
            "layers.1.ffn.experts.3",
            "layers.1.ffn.experts.3.",
            "layers..ffn.experts.3.w1.weight",
            "model.layers.1.ffn.experts.3.w1.weight",
        ] {
            assert!(!is_routed_expert(n), "{n}");
        }
        for l in [0, 42] {
            for k in 0..6 {
                assert_eq!(routed_expert(&expert_part_name(l, 7, k)), Some((l, 7)));
            }
        }
    }

    /// Each fixture holds exactly the table plus `mtp.*`, with the table's first (published)
    /// dtype and its shape; the engine itself loads them (model tests), so this checks the
    /// table's form against checkpoints laid out as DeepSeek publishes.
    #[test]
    fn the_fixtures_hold_exactly_the_table() {
        for name in ["tiny-a", "tiny-b"] {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures")
                .join(name);
            let c = ModelConfig::from_file(&dir.join("config.json")).unwrap();
            let ck = Checkpoint::open(&dir).unwrap();
            let table = expected_tensors(&c);
            let names: HashSet<&str> = table.iter().map(|t| t.name.as_str()).collect();
            assert_eq!(names.len(), table.len(), "{name}: duplicate names");
            for t in &table {
                let got = ck.tensor(&t.name).unwrap();
                assert_eq!(got.dtype, t.dtypes[0], "{name}: {}", t.name);
                assert_eq!(got.shape, t.shape, "{name}: {}", t.name);
                assert_eq!(got.len, t.published_bytes(), "{name}: {}", t.name);
            }
            let extra: Vec<&str> = ck
                .names()
                .filter(|n| !n.starts_with("mtp.") && !names.contains(n))
                .collect();
            assert!(extra.is_empty(), "{name}: not in the table: {extra:?}");
            let n_exp = table.iter().filter(|t| is_routed_expert(&t.name)).count();
            assert_eq!(n_exp, c.num_layers * c.n_routed_experts * 6);
            assert_eq!(dense_tensors(&c).len() + n_exp, table.len());
        }
    }

    /// The published model's sizes, as docs/checkpoint.md §5 gives them.
    #[test]
    fn published_sizes() {
        let c = published();
        let table = expected_tensors(&c);
        let expert: u64 = (0..6)
            .map(|k| {
                let (dt, s) = expert_part(&c, k);
                (s[0] * s[1] * dt[0].size()) as u64
            })
            .sum();
        assert_eq!(expert, 13_369_344);
        let experts: u64 = table
            .iter()
            .filter(|t| is_routed_expert(&t.name))
            .map(ExpectedTensor::published_bytes)
            .sum();
        assert_eq!(experts, 11_008 * 13_369_344);
        let embed_head = 2 * 129_280 * 4096 * 2;
        let dense: u64 = dense_tensors(&c)
            .iter()
            .map(ExpectedTensor::published_bytes)
            .sum();
        // 6.73 GB without the embedding and the head
        let rest = (dense - embed_head) as f64 / 1e9;
        assert!((rest - 6.73).abs() < 0.005, "{rest}");
        // 156.0 GB in all
        let all = (dense + experts) as f64 / 1e9;
        assert!((all - 156.0).abs() < 0.05, "{all}");
        // one table entry per family member of docs/checkpoint.md §3
        let count = |suffix: &str| table.iter().filter(|t| t.name.ends_with(suffix)).count();
        assert_eq!(count(".attn.compressor.ape"), 41);
        assert_eq!(count(".attn.indexer.weights_proj.weight"), 21);
        assert_eq!(count(".ffn.gate.bias"), 40);
        assert_eq!(count(".ffn.gate.tid2eid"), 3);
    }
}
