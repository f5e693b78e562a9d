//! The tensors a DeepSeek V4 Flash checkpoint holds for a config: every name the engine reads,
//! the dtypes it accepts and the exact shape. This is the one table. The loader checks every
//! dense entry before it reads any weight, takes each tensor's shape from here and fails when
//! it reads a tensor that is not in the table or leaves one unread (`model::weights::Loader`).
//! The expert store locates and checks the routed experts with `expert_part`. `doctor` and
//! `bench` get the table through `_core.expected_tensors`. The drafter a release carries
//! (`mtp.*`: the first release's MTP block, 0731's DSpark stages) has its own table,
//! `drafter_tensors`, which `info` and `doctor` check and a loaded DSpark drafter
//! (`model::dspark`) reads.
//!
//! The first accepted dtype of each entry is the one DeepSeek's release stores
//! (docs/checkpoint.md §3), so the table also gives the published checkpoint's sizes.

use crate::config::{Drafter, LayerKind, ModelConfig};
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
    block_expert_part_name(&format!("layers.{l}"), e, k)
}

/// The checkpoint name of part `k` (`EXPERT_PARTS`) of routed expert `e` of block `block`
/// (`layers.N`, or a drafter stage's `mtp.S`).
pub fn block_expert_part_name(block: &str, e: usize, k: usize) -> String {
    format!("{block}.ffn.experts.{e}.{}", EXPERT_PARTS[k])
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

/// The prefix of every drafter tensor (`mtp.0.…`, `mtp.1.…`).
pub const DRAFTER_PREFIX: &str = "mtp.";

/// Whether `name` is a tensor of the drafter (`mtp.*`): read only when the drafter is loaded
/// (`model::dspark`), never part of the model's dense set. The one test for it.
pub fn is_drafter(name: &str) -> bool {
    name.starts_with(DRAFTER_PREFIX)
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
    /// The hyper-head `{pre}hc_head_{fn,base,scale}` that mixes the hc streams into one.
    fn hc_head(&mut self, c: &ModelConfig, pre: &str) {
        let hcm = c.hc_mult;
        self.add(
            format!("{pre}hc_head_fn"),
            F32_FLOAT,
            &[hcm, hcm * c.hidden_size],
        );
        self.add(format!("{pre}hc_head_base"), F32_FLOAT, &[hcm]);
        self.add(format!("{pre}hc_head_scale"), F32_FLOAT, &[1]);
    }
    /// One block's dense tensors (`p` = `layers.N` or a drafter's `mtp.S`): hyper-connections,
    /// attention with the compressor and indexer of its kind, router, shared expert, norms.
    fn block(&mut self, c: &ModelConfig, p: &str, kind: LayerKind, hash: bool) {
        let (h, hcm, d, nh) = (c.hidden_size, c.hc_mult, c.head_dim, c.num_heads);
        let mix = (2 + hcm) * hcm;
        for which in ["attn", "ffn"] {
            self.add(format!("{p}.hc_{which}_fn"), F32_FLOAT, &[mix, hcm * h]);
            self.add(format!("{p}.hc_{which}_base"), F32_FLOAT, &[mix]);
            self.add(format!("{p}.hc_{which}_scale"), F32_FLOAT, &[3]);
        }
        let a = format!("{p}.attn");
        match kind {
            LayerKind::Sliding => {}
            LayerKind::Hca { ratio } => {
                self.compressor(c, &format!("{a}.compressor"), ratio, d, false)
            }
            LayerKind::Csa { ratio } => {
                self.compressor(c, &format!("{a}.compressor"), ratio, d, true);
                let ix = format!("{a}.indexer");
                let (ihd, ihn) = (c.index_head_dim, c.index_n_heads);
                self.compressor(c, &format!("{ix}.compressor"), ratio, ihd, true);
                self.fp8(&format!("{ix}.wq_b"), ihn * ihd, c.q_lora_rank);
                self.matrix(&format!("{ix}.weights_proj"), ihn, h);
            }
        }
        self.fp8(&format!("{a}.wq_a"), c.q_lora_rank, h);
        self.add(format!("{a}.q_norm.weight"), BF16_FLOAT, &[c.q_lora_rank]);
        self.fp8(&format!("{a}.wq_b"), nh * d, c.q_lora_rank);
        self.fp8(&format!("{a}.wkv"), d, h);
        self.add(format!("{a}.kv_norm.weight"), BF16_FLOAT, &[d]);
        let (g, r) = (c.o_groups, c.o_lora_rank);
        self.fp8(&format!("{a}.wo_a"), g * r, nh * d / g);
        self.fp8(&format!("{a}.wo_b"), h, g * r);
        self.add(format!("{a}.attn_sink"), F32_FLOAT, &[nh]);
        let f = format!("{p}.ffn");
        self.matrix(&format!("{f}.gate"), c.n_routed_experts, h);
        if hash {
            let shape = [c.vocab_size, c.experts_per_tok];
            self.add(format!("{f}.gate.tid2eid"), TOKEN_IDS, &shape);
        } else {
            self.add(format!("{f}.gate.bias"), F32_FLOAT, &[c.n_routed_experts]);
        }
        self.fp8(&format!("{f}.shared_experts.w1"), c.moe_inter, h);
        self.fp8(&format!("{f}.shared_experts.w3"), c.moe_inter, h);
        self.fp8(&format!("{f}.shared_experts.w2"), h, c.moe_inter);
        self.add(format!("{p}.attn_norm.weight"), BF16_FLOAT, &[h]);
        self.add(format!("{p}.ffn_norm.weight"), BF16_FLOAT, &[h]);
    }
    /// The six parts of every routed expert of block `p`, expert by expert.
    fn experts(&mut self, c: &ModelConfig, p: &str) {
        for e in 0..c.n_routed_experts {
            for (k, part) in EXPERT_PARTS.iter().enumerate() {
                let (dtypes, shape) = expert_part(c, k);
                self.add(format!("{p}.ffn.experts.{e}.{part}"), dtypes, &shape);
            }
        }
    }
}

/// Every tensor the engine reads but the routed experts, in the order the loader reads them:
/// the embedding first (a config of another model is reported by its shape), then the head,
/// the final norm, the hyper-head and each layer's tensors.
pub fn dense_tensors(c: &ModelConfig) -> Vec<ExpectedTensor> {
    let (h, v) = (c.hidden_size, c.vocab_size);
    let mut t = Table(Vec::new());
    t.matrix("embed", v, h);
    t.matrix("head", v, h);
    t.add("norm.weight".into(), BF16_FLOAT, &[h]);
    t.hc_head(c, "");
    for l in 0..c.num_layers {
        t.block(
            c,
            &format!("layers.{l}"),
            c.layer_kinds[l],
            c.is_hash_layer(l),
        );
    }
    t.0
}

/// The whole table: `dense_tensors`, then the six parts of every routed expert, layer by
/// layer and expert by expert.
pub fn expected_tensors(c: &ModelConfig) -> Vec<ExpectedTensor> {
    let mut t = Table(dense_tensors(c));
    t.0.reserve(c.num_layers * c.n_routed_experts * 6);
    for l in 0..c.num_layers {
        t.experts(c, &format!("layers.{l}"));
    }
    t.0
}

/// The drafter's tensors, block by block (`mtp.0`, `mtp.1`, …), each block's dense tensors
/// and then its routed experts. Every block is a V4 block with sliding-window attention (no
/// compressor, no indexer; DeepSeek's code gives its stages ratio 0) and learned routing.
/// The first release's MTP block adds `e_proj`, `h_proj` (FP8 [H, H]), `enorm`, `hnorm`, `norm`
/// and `hc_head_*`; 0731's DSpark adds `main_proj` (FP8 [H, targets·H]) and `main_norm` to the
/// first stage, and `norm`, `hc_head_*`, the Markov head (`markov_w1`, `markov_w2`, BF16
/// [vocab, rank]) and the confidence head (BF16 [1, H + rank]) to the last.
pub fn drafter_tensors(c: &ModelConfig) -> Vec<ExpectedTensor> {
    drafter_table(c, true)
}

/// `drafter_tensors` without the routed experts: what a drafter keeps resident (its loader's
/// table), block by block.
pub fn drafter_dense_tensors(c: &ModelConfig) -> Vec<ExpectedTensor> {
    drafter_table(c, false)
}

/// The checkpoint prefix of the drafter's block `b` (`mtp.0`, `mtp.1`, …).
pub fn drafter_block(b: usize) -> String {
    format!("{DRAFTER_PREFIX}{b}")
}

fn drafter_table(c: &ModelConfig, experts: bool) -> Vec<ExpectedTensor> {
    let h = c.hidden_size;
    let mut t = Table(Vec::new());
    let n = c.drafter.blocks();
    for b in 0..n {
        let p = drafter_block(b);
        t.block(c, &p, LayerKind::Sliding, false);
        match &c.drafter {
            Drafter::None => {}
            Drafter::Mtp { .. } => {
                t.fp8(&format!("{p}.e_proj"), h, h);
                t.fp8(&format!("{p}.h_proj"), h, h);
                for norm in ["enorm", "hnorm", "norm"] {
                    t.add(format!("{p}.{norm}.weight"), BF16_FLOAT, &[h]);
                }
                t.hc_head(c, &format!("{p}."));
            }
            Drafter::DSpark(d) => {
                if b == 0 {
                    t.fp8(&format!("{p}.main_proj"), h, d.target_layer_ids.len() * h);
                    t.add(format!("{p}.main_norm.weight"), BF16_FLOAT, &[h]);
                }
                if b + 1 == n {
                    t.add(format!("{p}.norm.weight"), BF16_FLOAT, &[h]);
                    t.hc_head(c, &format!("{p}."));
                    let markov = [c.vocab_size, d.markov_rank];
                    for w in ["markov_w1", "markov_w2"] {
                        t.add(format!("{p}.markov_head.{w}.weight"), BF16_FLOAT, &markov);
                    }
                    let conf = [1, h + d.markov_rank];
                    t.add(
                        format!("{p}.confidence_head.proj.weight"),
                        BF16_FLOAT,
                        &conf,
                    );
                }
            }
        }
        if experts {
            t.experts(c, &p);
        }
    }
    t.0
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
                .filter(|n| !is_drafter(n) && !names.contains(n))
                .collect();
            assert!(extra.is_empty(), "{name}: not in the table: {extra:?}");
            let n_exp = table.iter().filter(|t| is_routed_expert(&t.name)).count();
            assert_eq!(n_exp, c.num_layers * c.n_routed_experts * 6);
            assert_eq!(dense_tensors(&c).len() + n_exp, table.len());
        }
    }

    fn bytes(t: &[ExpectedTensor]) -> u64 {
        t.iter().map(ExpectedTensor::published_bytes).sum()
    }

    /// Both releases' tensor counts and `total_size` as published: the model's table plus the
    /// drafter's, each tensor in its published dtype.
    #[test]
    fn the_releases_hold_the_model_and_their_drafter() {
        let first = published();
        let c = ModelConfig::from_json(&crate::config::published_config("0731").unwrap()).unwrap();
        let model = expected_tensors(&first);
        assert_eq!(expected_tensors(&c), model);
        let (mtp, dspark) = (drafter_tensors(&first), drafter_tensors(&c));
        assert_eq!(model.len() + mtp.len(), 69_187);
        assert_eq!(bytes(&model) + bytes(&mtp), 159_609_485_896);
        assert_eq!(model.len() + dspark.len(), 72_317);
        assert_eq!(bytes(&model) + bytes(&dspark), 166_878_536_440);
        let stage = |s: usize| {
            let p = format!("mtp.{s}.");
            dspark.iter().filter(|t| t.name.starts_with(&p)).count()
        };
        assert_eq!((stage(0), stage(1), stage(2)), (1_568, 1_565, 1_572));
        // about 10.9 GB of drafter, none of it a routed expert of the model
        assert!((bytes(&dspark) as f64 / 1e9 - 10.9).abs() < 0.05);
        assert!(dspark.iter().chain(&mtp).all(|t| is_drafter(&t.name)));
        assert!(!dspark.iter().any(|t| is_routed_expert(&t.name)));
        let main_proj = dspark.iter().find(|t| t.name == "mtp.0.main_proj.scale");
        assert_eq!(main_proj.map(|t| t.shape.clone()), Some(vec![32, 96]));
        let conf = dspark
            .iter()
            .find(|t| t.name.ends_with("confidence_head.proj.weight"));
        assert_eq!(
            conf.map(|t| t.name.as_str()),
            Some("mtp.2.confidence_head.proj.weight")
        );
        assert_eq!(conf.map(|t| t.shape.clone()), Some(vec![1, 4352]));
        let names: HashSet<&str> = dspark.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names.len(), dspark.len());
        assert!(!names.contains("mtp.0.e_proj.weight"));
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
