//! Bytes and parameters of a tensor table, by what the engine does with each tensor: the
//! resident (dense) part, the routed experts, the drafter's tensors (never read), and what a
//! decode step reads. The one accounting: the planner's dense bytes, `info`/`doctor`'s sizes
//! and `bench`'s figures (of a checkpoint, or of the published model from its expected table)
//! all come from `TableBytes`.

use super::expected::{is_drafter, is_routed_expert, ExpectedTensor};
use super::Checkpoint;
use crate::config::ModelConfig;
use crate::dtype::DType;
use serde::Serialize;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TableBytes {
    /// Resident: every tensor that is neither a routed expert's (`is_routed_expert`) nor the
    /// drafter's (`is_drafter`); what the planner counts as dense.
    pub dense_bytes: u64,
    /// Of which the embedding and the output head.
    pub embed_head_bytes: u64,
    /// Of which the embedding.
    pub embed_bytes: u64,
    /// What a decode step reads of the dense part: all of it but the embedding and the
    /// hash layers' `tid2eid` tables, of which it reads one row each.
    pub dense_bytes_per_token: u64,
    /// Every routed expert's tensors, and how many experts that is (their `w1.weight`s).
    pub experts_bytes: u64,
    pub n_experts: u64,
    /// The drafter's tensors (`mtp.*`).
    pub drafter_bytes: u64,
    /// Parameters of the matrices a token multiplies: the dense ones but the head, the head,
    /// and every routed expert's (an I8 byte holds two FP4 values).
    pub dense_params: u64,
    pub head_params: u64,
    pub expert_params: u64,
    /// Whether a sum went past 2^64 (it saturated).
    #[serde(skip)]
    pub overflow: bool,
}

impl TableBytes {
    /// Counts one tensor (`dtype` None when unknown: it only says how to count a row).
    pub fn add(&mut self, name: &str, dtype: Option<DType>, shape: &[usize], nbytes: u64) {
        let mut over = false;
        let numel = shape.iter().fold(1u64, |a, &d| a.saturating_mul(d as u64));
        if is_drafter(name) {
            over |= add(&mut self.drafter_bytes, nbytes);
        } else if is_routed_expert(name) {
            over |= add(&mut self.experts_bytes, nbytes);
            if name.ends_with(".weight") {
                let per_byte = if dtype == Some(DType::I8) { 2 } else { 1 };
                over |= add(&mut self.expert_params, numel.saturating_mul(per_byte));
            }
            if name.ends_with(".w1.weight") {
                self.n_experts += 1;
            }
        } else {
            over |= add(&mut self.dense_bytes, nbytes);
            let embed = name == "embed.weight";
            if embed {
                self.embed_bytes = self.embed_bytes.saturating_add(nbytes);
            }
            if embed || name == "head.weight" {
                self.embed_head_bytes = self.embed_head_bytes.saturating_add(nbytes);
            }
            if embed || name.ends_with(".gate.tid2eid") {
                over |= add(
                    &mut self.dense_bytes_per_token,
                    row_bytes(dtype, shape, nbytes),
                );
            } else {
                over |= add(&mut self.dense_bytes_per_token, nbytes);
                if !embed
                    && shape.len() == 2
                    && !name.ends_with(".scale")
                    && !name.ends_with(".ape")
                {
                    let to = if name == "head.weight" {
                        &mut self.head_params
                    } else {
                        &mut self.dense_params
                    };
                    over |= add(to, numel);
                }
            }
        }
        self.overflow |= over;
    }

    /// Every tensor of an open checkpoint.
    pub fn of_checkpoint(ck: &Checkpoint) -> TableBytes {
        let mut t = TableBytes::default();
        for name in ck.names() {
            if let Some(info) = ck.get(name) {
                t.add(name, Some(info.dtype), &info.shape, info.len);
            }
        }
        t
    }

    /// An expected table (`expected::expected_tensors`), each tensor in the dtype the
    /// release stores it in (its first).
    pub fn of_table(table: &[ExpectedTensor]) -> TableBytes {
        let mut t = TableBytes::default();
        for e in table {
            t.add(&e.name, Some(e.dtypes[0]), &e.shape, e.published_bytes());
        }
        t
    }

    /// One routed expert's bytes (their mean: all experts have one layout).
    pub fn expert_bytes(&self) -> f64 {
        self.experts_bytes as f64 / self.n_experts.max(1) as f64
    }

    /// The parameters a token multiplies in a decode step: the dense matrices, the head, and
    /// k routed experts per layer.
    pub fn active_params_per_token(&self, c: &ModelConfig) -> f64 {
        let per_expert = self.expert_params as f64 / self.n_experts.max(1) as f64;
        let routed = (c.num_layers * c.experts_per_tok) as f64 * per_expert;
        self.dense_params as f64 + self.head_params as f64 + routed
    }
}

/// `*to += n`, saturating; whether it overflowed.
fn add(to: &mut u64, n: u64) -> bool {
    let (sum, over) = to.overflowing_add(n);
    *to = if over { u64::MAX } else { sum };
    over
}

/// One row of a [rows, ...] tensor.
fn row_bytes(dtype: Option<DType>, shape: &[usize], nbytes: u64) -> u64 {
    match (dtype, shape.split_first()) {
        (Some(d), Some((_, rest))) => rest
            .iter()
            .fold(d.size() as u64, |a, &x| a.saturating_mul(x as u64)),
        (None, Some((&rows, _))) if rows > 0 => nbytes / rows as u64,
        _ => nbytes,
    }
}

/// A model's bytes and parameters as `bench` reports them (`_core.table_bytes`).
#[derive(Debug, Clone, Serialize)]
pub struct ModelBytes {
    #[serde(flatten)]
    pub table: TableBytes,
    /// One routed expert (`TableBytes::expert_bytes`).
    pub expert_bytes: f64,
    /// `TableBytes::active_params_per_token`, and without the head (what a prefill token
    /// multiplies: the head runs for the last token only).
    pub active_params_per_token: f64,
    pub prefill_params_per_token: f64,
}

impl ModelBytes {
    pub fn new(table: TableBytes, c: &ModelConfig) -> ModelBytes {
        let active = table.active_params_per_token(c);
        ModelBytes {
            expert_bytes: table.expert_bytes(),
            active_params_per_token: active,
            prefill_params_per_token: active - table.head_params as f64,
            table,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::expected::expected_tensors;

    #[test]
    fn the_published_model_adds_up() {
        let v = crate::config::published_config("first").unwrap();
        let c = ModelConfig::from_json(&v).unwrap();
        let t = TableBytes::of_table(&expected_tensors(&c));
        assert_eq!(t.expert_bytes(), 13_369_344.0); // docs/checkpoint.md §5
        assert_eq!(t.n_experts, 43 * 256);
        assert_eq!(t.embed_bytes, 129280 * 4096 * 2);
        assert_eq!(t.embed_head_bytes, 2 * t.embed_bytes);
        assert!(
            (t.dense_bytes as f64 / 1e9 - 8.85).abs() < 0.005,
            "{}",
            t.dense_bytes
        );
        // a decode step reads one row of the embedding and of each tid2eid table
        let rows = 4096 * 2 + 3 * 6 * 8;
        let tid2eid = 3 * 129280 * 6 * 8;
        assert_eq!(
            t.dense_bytes_per_token,
            t.dense_bytes - t.embed_bytes - tid2eid + rows
        );
        assert_eq!(t.drafter_bytes, 0);
        let a = t.active_params_per_token(&c);
        assert!(11e9 < a && a < 15e9, "{a}"); // ~13B active parameters (the model card)
        assert!(!t.overflow);
    }

    #[test]
    fn a_checkpoints_table_is_the_planners_dense_part() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiny-a");
        let ck = Checkpoint::open(&dir).unwrap();
        let c = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let t = TableBytes::of_checkpoint(&ck);
        let table = TableBytes::of_table(&expected_tensors(&c));
        // the fixture holds the table in its published dtypes, plus the drafter
        assert_eq!(t.dense_bytes, table.dense_bytes);
        assert_eq!(t.dense_bytes_per_token, table.dense_bytes_per_token);
        assert_eq!(t.experts_bytes, table.experts_bytes);
        assert!(t.drafter_bytes > 0);
    }
}
