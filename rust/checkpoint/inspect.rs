//! What `info` and `doctor` report about a checkpoint directory, without reading any tensor
//! data: config.json, the index, every shard's header and size, every tensor of the model's
//! table (presence, dtype, shape), the drafter's table, and finally the reader's own verdict
//! (`Checkpoint::open`). Unlike `Checkpoint::open`, which stops at the first defect, this
//! collects every problem it can, as rows of (status, what, detail).
//!
//! The drafter (`mtp.*`) is optional: the engine reads none of it yet, so a missing,
//! mis-shaped or truncated drafter tensor or shard is a warning that disables the drafter,
//! never a reason to refuse the model. A drafter-only shard (the index maps nothing else to
//! it) that cannot be read is left out the same way by `Checkpoint::open`.

use super::expected::{drafter_tensors, expected_tensors, is_drafter};
use super::sizes::TableBytes;
use super::{drafter_only, parse_index_bytes, Checkpoint, Shard};
use crate::config::{self, Drafter, ModelConfig};
use crate::dtype::DType;
use crate::error::Error;
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Row {
    pub status: Status,
    pub what: String,
    pub detail: String,
}

/// One tensor as a shard header describes it.
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<usize>,
    pub nbytes: u64,
    pub shard: String,
}

#[derive(Debug, Clone)]
pub struct DrafterReport {
    /// `Drafter::name`: "none", "MTP block", "DSpark".
    pub kind: &'static str,
    /// Blocks (MTP) or stages (DSpark).
    pub blocks: usize,
    /// Bytes of the drafter's tensors the table lists, as published.
    pub bytes: u64,
    /// Why it could not be used (empty: complete and valid).
    pub problems: Vec<String>,
}

impl DrafterReport {
    pub fn usable(&self) -> bool {
        self.problems.is_empty() && self.blocks > 0
    }

    /// `DSpark, 3 stages, 10.9 GB (not used yet)`, `MTP block, 3.6 GB (not used)`.
    pub fn summary(&self) -> String {
        let size = gb(self.bytes);
        match self.kind {
            "DSpark" => format!(
                "DSpark, {} stage{}, {size} (not used yet)",
                self.blocks,
                if self.blocks == 1 { "" } else { "s" }
            ),
            "MTP block" if self.blocks > 1 => {
                format!("{} MTP blocks, {size} (not used)", self.blocks)
            }
            "MTP block" => format!("MTP block, {size} (not used)"),
            _ => "none".into(),
        }
    }
}

#[derive(Debug, Default)]
pub struct Inspection {
    pub rows: Vec<Row>,
    pub config: Option<ModelConfig>,
    /// The validated config's summary (`config::validate_json`), what Python's `Config` holds.
    pub config_summary: Option<Value>,
    /// The whole config.json as parsed, when it validated.
    pub config_raw: Option<Value>,
    /// The shards that exist, with their sizes, in the index's order.
    pub shards: Vec<(String, u64)>,
    pub tensors: Vec<Entry>,
    /// Bytes of the tensors found, by what they are.
    pub sizes: TableBytes,
    pub drafter: Option<DrafterReport>,
}

impl Inspection {
    fn add(&mut self, status: Status, what: &str, detail: impl Into<String>) {
        self.rows.push(Row {
            status,
            what: what.into(),
            detail: detail.into(),
        });
    }

    /// Several problems as one failing row (the first `limit`, and how many more).
    fn problems(&mut self, status: Status, what: &str, items: &[String]) {
        if !items.is_empty() {
            self.add(status, what, list(items, 8));
        }
    }

    pub fn ok(&self) -> bool {
        !self.rows.iter().any(|r| r.status == Status::Fail)
    }
}

fn list(items: &[String], limit: usize) -> String {
    let mut s = items[..items.len().min(limit)].join("; ");
    if items.len() > limit {
        s += &format!(" (and {} more)", items.len() - limit);
    }
    s
}

/// An error's message without the file name its `Display` starts with (the row names it).
fn bare(e: &Error) -> String {
    match e {
        Error::Checkpoint { msg, .. } => msg.clone(),
        Error::Config(m) => m.clone(),
        e => e.to_string(),
    }
}

pub fn gb(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.1} GB", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.1} MB", n / 1e6)
    } else {
        format!("{:.0} KB", n / 1e3)
    }
}

/// Inspects the checkpoint in `dir` (see the module comment).
pub fn inspect(dir: &Path) -> Inspection {
    let mut ins = Inspection::default();
    let cfg_path = dir.join("config.json");
    let config = if !dir.exists() {
        Err(Error::NotFound {
            path: dir.to_path_buf(),
            detail: "no such checkpoint directory".into(),
        })
    } else if !dir.is_dir() {
        Err(Error::arg(format!(
            "{}: is a file, not a checkpoint directory (pass the folder holding config.json and the shards)",
            dir.display()
        )))
    } else {
        config::read_json(&cfg_path)
            .and_then(|v| config::validate_json(&v).map(|(c, summary)| (c, summary, v)))
    };
    let c = match config {
        Ok((c, summary, raw)) => {
            ins.add(Status::Ok, "config.json", config_line(&c));
            ins.config_summary = Some(summary);
            ins.config_raw = Some(raw);
            c
        }
        Err(e) => {
            ins.add(Status::Fail, "config.json", bare(&e));
            return ins;
        }
    };

    // --- the index and the shards ----------------------------------------------------------
    let index_path = dir.join("model.safetensors.index.json");
    let (shard_names, weight_map, total_size) = if index_path.is_file() {
        let parsed = std::fs::read(&index_path)
            .map_err(|e| Error::io(&index_path, "read", e))
            .and_then(|b| {
                let total = serde_json::from_slice::<Value>(&b)
                    .ok()
                    .and_then(|v| v.pointer("/metadata/total_size").and_then(Value::as_u64));
                parse_index_bytes(&b).map(|(n, m)| (n, m, total))
            });
        match parsed {
            Ok((names, map, total)) => {
                ins.add(
                    Status::Ok,
                    "model.safetensors.index.json",
                    format!("{} tensors in {} shards", map.len(), names.len()),
                );
                (names, Some(map), total)
            }
            Err(e) => {
                let what = "model.safetensors.index.json";
                ins.add(
                    Status::Fail,
                    what,
                    format!("not a valid index: {}", bare(&e)),
                );
                return ins;
            }
        }
    } else if dir.join("model.safetensors").is_file() {
        (vec!["model.safetensors".to_string()], None, None)
    } else {
        ins.add(
            Status::Fail,
            "index",
            format!(
                "neither model.safetensors.index.json nor model.safetensors in {}",
                dir.display()
            ),
        );
        return ins;
    };

    let mut shard_problems = Vec::new();
    let mut drafter_problems = Vec::new();
    // drafter-only shards that could not be read: their index entries are not checked
    let mut unread: Vec<String> = Vec::new();
    let mut found: HashMap<String, usize> = HashMap::new();
    for fname in &shard_names {
        let for_drafter = weight_map.as_ref().is_some_and(|m| drafter_only(m, fname));
        let problem = |e: &Error| match e {
            Error::NotFound { .. } => format!("{fname}: missing (named in the index)"),
            e => format!("{fname}: {}", bare(e)),
        };
        match Shard::open(dir, fname, "shard named in model.safetensors.index.json") {
            Ok((shard, entries)) => {
                ins.shards.push((fname.clone(), shard.len));
                for e in entries {
                    if let Some(&i) = found.get(&e.name) {
                        let other = &ins.tensors[i].shard;
                        shard_problems.push(format!("{fname}: tensor {} also in {other}", e.name));
                        continue;
                    }
                    found.insert(e.name.clone(), ins.tensors.len());
                    ins.tensors.push(Entry {
                        name: e.name,
                        dtype: e.dtype.name(),
                        shape: e.shape,
                        nbytes: e.len,
                        shard: fname.clone(),
                    });
                }
            }
            Err(e) => {
                if let Ok(m) = std::fs::metadata(dir.join(fname)) {
                    if m.is_file() {
                        ins.shards.push((fname.clone(), m.len()));
                    }
                }
                if for_drafter {
                    drafter_problems.push(problem(&e));
                    unread.push(fname.clone());
                } else {
                    shard_problems.push(problem(&e));
                }
            }
        }
    }
    ins.problems(Status::Fail, "shards", &shard_problems);
    if shard_problems.is_empty() {
        let total: u64 = ins.shards.iter().map(|s| s.1).sum();
        ins.add(
            Status::Ok,
            "shards",
            format!(
                "{} files, {}, headers and sizes ok{}",
                shard_names.len(),
                gb(total),
                if drafter_problems.is_empty() {
                    ""
                } else {
                    " (but the drafter's, below)"
                }
            ),
        );
    }

    if let (Some(map), true) = (&weight_map, shard_problems.is_empty()) {
        let mut names: Vec<&String> = map.keys().collect();
        names.sort();
        let mut bad = Vec::new();
        for t in names {
            let f = &map[t];
            if unread.contains(f) {
                continue;
            }
            match found.get(t) {
                None => bad.push(format!("{t} mapped to {f} but no shard contains it")),
                Some(&i) if &ins.tensors[i].shard != f => bad.push(format!(
                    "{t} mapped to {f} but stored in {}",
                    ins.tensors[i].shard
                )),
                _ => {}
            }
        }
        for e in &ins.tensors {
            if !map.contains_key(&e.name) {
                bad.push(format!("{} is in {} but not in the index", e.name, e.shard));
            }
        }
        ins.problems(Status::Fail, "index vs shards", &bad);
        let data: u64 = ins.tensors.iter().map(|e| e.nbytes).sum();
        match total_size {
            Some(t) if t != data && unread.is_empty() => ins.add(
                Status::Warn,
                "index total_size",
                format!("metadata says {t} bytes, the shards hold {data} bytes of tensors"),
            ),
            _ if bad.is_empty() => ins.add(
                Status::Ok,
                "index vs shards",
                "every tensor where the index says",
            ),
            _ => {}
        }
    }

    for e in &ins.tensors {
        let dtype = DType::from_safetensors(e.dtype);
        ins.sizes.add(&e.name, dtype, &e.shape, e.nbytes);
    }

    // --- the tensor table the engine needs --------------------------------------------------
    if !ins.tensors.is_empty() {
        let want = expected_tensors(&c);
        let (missing, wrong) = compare(&ins, &found, &want);
        ins.problems(Status::Fail, "missing tensors", &missing);
        ins.problems(Status::Fail, "wrong dtype/shape", &wrong);
        let listed: std::collections::HashSet<&str> =
            want.iter().map(|t| t.name.as_str()).collect();
        let extra: Vec<&str> = ins
            .tensors
            .iter()
            .map(|e| e.name.as_str())
            .filter(|n| !listed.contains(n) && !is_drafter(n))
            .collect();
        if let Some(first) = extra.first() {
            ins.add(
                Status::Warn,
                "unused tensors",
                format!("{} (e.g. {first})", extra.len()),
            );
        }
        if missing.is_empty() && wrong.is_empty() {
            let n_exp = c.num_layers * c.n_routed_experts;
            ins.add(
                Status::Ok,
                "tensors",
                format!(
                    "all {} present with the right dtype and shape ({n_exp} routed experts)",
                    want.len()
                ),
            );
        }
        drafter_row(&mut ins, &c, &found, drafter_problems);
    }

    // --- the reader's own structure check (authoritative) ---------------------------------
    if ins.ok() {
        if let Err(e) = Checkpoint::open(dir) {
            ins.add(Status::Fail, "engine check", e.to_string());
        }
    }
    ins.config = Some(c);
    ins
}

/// (missing, wrong dtype or shape) of `want` among the tensors found.
fn compare(
    ins: &Inspection,
    found: &HashMap<String, usize>,
    want: &[super::expected::ExpectedTensor],
) -> (Vec<String>, Vec<String>) {
    let (mut missing, mut wrong) = (Vec::new(), Vec::new());
    for t in want {
        match found.get(&t.name) {
            None => missing.push(t.name.clone()),
            Some(&i) => {
                let e = &ins.tensors[i];
                if !t.dtypes.iter().any(|d| d.name() == e.dtype) || e.shape != t.shape {
                    let dts: Vec<&str> = t.dtypes.iter().map(|d| d.name()).collect();
                    wrong.push(format!(
                        "{}: {}{:?}, expected {}{:?}",
                        t.name,
                        e.dtype,
                        e.shape,
                        dts.join(" or "),
                        t.shape
                    ));
                }
            }
        }
    }
    (missing, wrong)
}

/// The drafter's row: what the config describes, checked against the tensors found.
fn drafter_row(
    ins: &mut Inspection,
    c: &ModelConfig,
    found: &HashMap<String, usize>,
    mut problems: Vec<String>,
) {
    let present = ins.tensors.iter().filter(|e| is_drafter(&e.name)).count();
    if c.drafter == Drafter::None {
        if present > 0 {
            ins.add(
                Status::Warn,
                "drafter",
                format!("{present} mtp.* tensors that config.json does not describe (not used)"),
            );
        }
        return;
    }
    let want = drafter_tensors(c);
    let bytes = want.iter().map(|t| t.published_bytes()).sum();
    let (missing, wrong) = compare(ins, found, &want);
    if present == 0 && problems.is_empty() {
        let r = DrafterReport {
            kind: c.drafter.name(),
            blocks: c.drafter.blocks(),
            bytes,
            problems: vec!["not in this checkpoint".into()],
        };
        ins.add(
            Status::Warn,
            "drafter",
            format!(
                "config.json describes a {} drafter, but this checkpoint has none of its {} tensors \
                 (the model runs without it)",
                r.kind,
                want.len()
            ),
        );
        ins.drafter = Some(r);
        return;
    }
    if !missing.is_empty() {
        problems.push(format!("missing {}", list(&missing, 4)));
    }
    problems.extend(wrong);
    let r = DrafterReport {
        kind: c.drafter.name(),
        blocks: c.drafter.blocks(),
        bytes,
        problems,
    };
    if r.problems.is_empty() {
        ins.add(Status::Ok, "drafter", r.summary());
    } else {
        ins.add(
            Status::Warn,
            "drafter",
            format!(
                "{}: disabled, the model runs without it: {}",
                r.summary(),
                list(&r.problems, 4)
            ),
        );
    }
    ins.drafter = Some(r);
}

fn config_line(c: &ModelConfig) -> String {
    use crate::config::LayerKind;
    let count = |f: fn(&LayerKind) -> bool| c.layer_kinds.iter().filter(|k| f(k)).count();
    format!(
        "{} layers (sliding {}, CSA {}, HCA {}), hidden {}, {} experts (top {}), vocab {}",
        c.num_layers,
        count(|k| matches!(k, LayerKind::Sliding)),
        count(|k| matches!(k, LayerKind::Csa { .. })),
        count(|k| matches!(k, LayerKind::Hca { .. })),
        c.hidden_size,
        c.n_routed_experts,
        c.experts_per_tok,
        c.vocab_size
    )
}
