//! Owned resident weights and their loading from the checkpoint, with every tensor checked
//! for presence, dtype and shape (and scale bytes for the NaN encoding) before any compute.

use crate::checkpoint::expected::ExpectedTensor;
use crate::checkpoint::{Checkpoint, TensorInfo};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::{self, MatRef, Numerics, Weights};
use crate::scratch::{self, Buf};
use std::collections::HashMap;
use std::ops::Range;

/// A resident weight matrix [rows, cols] in its checkpoint format.
pub struct Linear {
    pub rows: usize,
    pub cols: usize,
    data: LinData,
}

enum LinData {
    F32(Vec<f32>),
    Bf16(Vec<u8>),
    Fp8 { q: Vec<u8>, scale: Vec<u8> },
}

impl Linear {
    pub fn mat(&self) -> MatRef<'_> {
        let w = match &self.data {
            LinData::F32(d) => Weights::F32(d),
            LinData::Bf16(d) => Weights::Bf16(d),
            LinData::Fp8 { q, scale } => Weights::Fp8 { q, scale },
        };
        MatRef {
            rows: self.rows,
            cols: self.cols,
            w,
        }
    }

    /// y[n, rows] = x[n, cols] · Wᵀ.
    pub fn forward(&self, x: &[f32], n: usize) -> Buf {
        let mut y = scratch::zeroed(n * self.rows);
        kernels::matmul(&self.mat(), 0..self.rows, x, n, &mut y);
        y
    }

    /// `forward` into a `Vec`, for an output that leaves the forward pass (the logits).
    pub fn forward_vec(&self, x: &[f32], n: usize) -> Vec<f32> {
        let mut y = vec![0f32; n * self.rows];
        kernels::matmul(&self.mat(), 0..self.rows, x, n, &mut y);
        y
    }

    /// `forward` in the given numerics (`kernels::matmul_in`).
    pub fn forward_in(&self, numerics: Numerics, x: &[f32], n: usize) -> Buf {
        let mut y = scratch::zeroed(n * self.rows);
        kernels::matmul_in(numerics, &self.mat(), 0..self.rows, x, n, &mut y);
        y
    }

    /// y[n, rows.len()] for a row sub-range, in the given numerics (`kernels::matmul_in`).
    pub fn forward_rows_in(
        &self,
        numerics: Numerics,
        rows: Range<usize>,
        x: &[f32],
        n: usize,
    ) -> Buf {
        let mut y = scratch::zeroed(n * rows.len());
        kernels::matmul_in(numerics, &self.mat(), rows, x, n, &mut y);
        y
    }

    pub fn bytes(&self) -> usize {
        self.mat().bytes()
    }
}

/// Loads the resident tensors by name, each exactly as the expected table
/// (`checkpoint::expected::dense_tensors`) describes it: `new` checks every entry (presence,
/// dtype, exact shape) before anything is read, each read takes the tensor's shape from its
/// entry, and `finish` fails if an entry was never read, so the table and the loader cannot
/// disagree. Errors name the file, the tensor, expected and found.
pub struct Loader<'a> {
    pub ck: &'a Checkpoint,
    /// Bytes of resident weights loaded so far.
    pub loaded: usize,
    /// The entries not read yet, by name.
    table: HashMap<String, ExpectedTensor>,
}

/// A loader or table mistake (a tensor read twice, or not in the table): never a property of
/// the checkpoint, so the message says so.
fn internal(msg: String) -> Error {
    Error::System(format!("internal error in the model loader: {msg}"))
}

impl<'a> Loader<'a> {
    /// Checks every entry of `table` against the checkpoint, in order.
    pub fn new(ck: &'a Checkpoint, table: Vec<ExpectedTensor>) -> Result<Self> {
        for t in &table {
            ck.expect(&t.name, t.dtypes, &t.shape)?;
        }
        let n = table.len();
        let table: HashMap<String, ExpectedTensor> =
            table.into_iter().map(|t| (t.name.clone(), t)).collect();
        if table.len() != n {
            return Err(internal("the expected table names a tensor twice".into()));
        }
        Ok(Loader {
            ck,
            loaded: 0,
            table,
        })
    }

    /// The tensor `name` (checked by `new`) and its shape, taken out of the table.
    fn take(&mut self, name: &str) -> Result<(TensorInfo, Vec<usize>)> {
        let e = self.table.remove(name).ok_or_else(|| {
            internal(format!(
                "{name} is not in the expected tensor table, or was read twice"
            ))
        })?;
        let t = self.ck.expect(name, e.dtypes, &e.shape)?.clone();
        Ok((t, e.shape))
    }

    /// Ends the load: every entry must have been read. Returns the bytes loaded.
    pub fn finish(self) -> Result<usize> {
        if let Some(name) = self.table.keys().min() {
            return Err(internal(format!(
                "{} tensors of the expected table were never read (e.g. {name})",
                self.table.len()
            )));
        }
        Ok(self.loaded)
    }

    /// An FP8 E4M3 weight `{name}.weight` [rows, cols] with its `{name}.scale` 128×128 blocks.
    pub fn fp8(&mut self, name: &str) -> Result<Linear> {
        let (wt, shape) = self.take(&format!("{name}.weight"))?;
        let (rows, cols) = matrix(&wt.name, &shape)?;
        let (st, _) = self.take(&format!("{name}.scale"))?;
        let q = self.ck.read(&wt)?;
        check_e4m3(self.ck.file_of(&wt), &wt.name, &q)?;
        let scale = self.read_scale(&st)?;
        self.loaded += q.len() + scale.len();
        Ok(Linear {
            rows,
            cols,
            data: LinData::Fp8 { q, scale },
        })
    }

    /// A BF16 (or F32/F16) weight `{name}.weight` [rows, cols], kept in BF16 when stored so.
    pub fn dense(&mut self, name: &str) -> Result<Linear> {
        let (t, shape) = self.take(&format!("{name}.weight"))?;
        let (rows, cols) = matrix(&t.name, &shape)?;
        let data = match t.dtype {
            DType::BF16 => {
                let b = self.ck.read(&t)?;
                check_bf16(self.ck.file_of(&t), &t.name, &b)?;
                LinData::Bf16(b)
            }
            _ => LinData::F32(self.ck.read_f32(&t)?),
        };
        let l = Linear { rows, cols, data };
        self.loaded += l.bytes();
        Ok(l)
    }

    /// A float vector or matrix (BF16/F16/F32) as f32.
    pub fn floats(&mut self, name: &str) -> Result<Vec<f32>> {
        let (t, _) = self.take(name)?;
        let v = self.ck.read_f32(&t)?;
        self.loaded += v.len() * 4;
        Ok(v)
    }

    /// A float tensor of one element (shape [1]).
    pub fn scalar(&mut self, name: &str) -> Result<f32> {
        match self.floats(name)?[..] {
            [x] => Ok(x),
            ref v => Err(internal(format!(
                "{name} has {} elements in the expected table, read as one",
                v.len()
            ))),
        }
    }

    /// `tid2eid` [vocab, k] as I64 or I32, each id checked < n_experts and distinct per row.
    pub fn tid2eid(&mut self, name: &str, n_experts: usize) -> Result<Vec<u16>> {
        let (t, shape) = self.take(name)?;
        let (vocab, k) = matrix(name, &shape)?;
        let b = self.ck.read(&t)?;
        let file = self.ck.file_of(&t).to_string();
        let w = t.dtype.size();
        let mut out = Vec::with_capacity(vocab * k);
        for (i, c) in b.chunks_exact(w).enumerate() {
            let v: i64 = if w == 8 {
                i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])
            } else {
                i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64
            };
            if v < 0 || v as usize >= n_experts {
                return Err(Error::checkpoint(
                    file,
                    format!(
                        "tensor {name}: row {} has expert id {v}, expected 0..{}",
                        i / k,
                        n_experts - 1
                    ),
                ));
            }
            out.push(v as u16);
        }
        for (r, row) in out.chunks_exact(k).enumerate() {
            for a in 0..k {
                if row[a + 1..].contains(&row[a]) {
                    return Err(Error::checkpoint(
                        file,
                        format!("tensor {name}: row {r} selects expert {} twice (expected distinct experts)", row[a]),
                    ));
                }
            }
        }
        self.loaded += out.len() * 2;
        Ok(out)
    }

    fn read_scale(&self, t: &TensorInfo) -> Result<Vec<u8>> {
        let s = self.ck.read(t)?;
        check_scale(self.ck.file_of(t), &t.name, &s)?;
        Ok(s)
    }
}

/// (rows, cols) of a two-dimensional table entry.
fn matrix(name: &str, shape: &[usize]) -> Result<(usize, usize)> {
    match *shape {
        [rows, cols] => Ok((rows, cols)),
        _ => Err(internal(format!(
            "{name} is {shape:?} in the expected table, read as a matrix"
        ))),
    }
}

/// Rejects the UE8M0 NaN encoding (255).
pub fn check_scale(file: &str, name: &str, s: &[u8]) -> Result<()> {
    if let Some(i) = crate::dtype::e8m0_nan(s) {
        return Err(Error::checkpoint(
            file,
            format!("tensor {name}: scale byte {i} is 255 (the F8_E8M0 NaN encoding); expected a finite power of two"),
        ));
    }
    Ok(())
}

/// Rejects the E4M3 (fn) NaN encodings 0x7F / 0xFF in an FP8 weight.
pub fn check_e4m3(file: &str, name: &str, q: &[u8]) -> Result<()> {
    // branch-free scan per block (vectorises; gigabytes at load time), exact index after
    const BLOCK: usize = 4096;
    let nan = |b: u8| b & 0x7f == 0x7f;
    let blk = q
        .chunks(BLOCK)
        .position(|c| c.iter().fold(false, |a, &b| a | nan(b)));
    if let Some(i) = blk.and_then(|k| {
        q[k * BLOCK..]
            .iter()
            .position(|&b| nan(b))
            .map(|i| k * BLOCK + i)
    }) {
        return Err(Error::checkpoint(
            file,
            format!(
                "tensor {name}: element {i} is byte {:#04x} (the F8_E4M3 NaN encoding); expected finite values",
                q[i]
            ),
        ));
    }
    Ok(())
}

/// Rejects NaN and ±Inf (exponent bits all ones) in BF16 bytes kept as they are stored.
pub fn check_bf16(file: &str, name: &str, b: &[u8]) -> Result<()> {
    const BLOCK: usize = 4096;
    let bad = |c: &[u8]| (c[1] & 0x7f == 0x7f) & (c[0] & 0x80 != 0);
    let blk = b
        .chunks(BLOCK)
        .position(|c| c.chunks_exact(2).fold(false, |a, x| a | bad(x)));
    if let Some(i) = blk.and_then(|k| {
        b[k * BLOCK..]
            .chunks_exact(2)
            .position(bad)
            .map(|i| k * BLOCK / 2 + i)
    }) {
        let v = crate::dtype::bf16_to_f32(b[2 * i], b[2 * i + 1]);
        return Err(Error::checkpoint(
            file,
            format!("tensor {name}: element {i} is {v} (expected finite values)"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loader_reads_exactly_the_table() {
        use crate::checkpoint::expected::dense_tensors;
        use crate::config::ModelConfig;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiny-a");
        let ck = Checkpoint::open(&dir).unwrap();
        let c = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let table = dense_tensors(&c);
        let mut ld = Loader::new(&ck, table.clone()).unwrap();
        // a tensor the table does not list is never read
        let e = ld
            .floats("layers.0.ffn.experts.0.w1.scale")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not in the expected tensor table"), "{e}");
        // each entry once, with the table's shape
        assert_eq!(ld.floats("norm.weight").unwrap().len(), c.hidden_size);
        assert!(ld.floats("norm.weight").is_err());
        let l = ld.fp8("layers.0.attn.wq_a").unwrap();
        assert_eq!((l.rows, l.cols), (c.q_lora_rank, c.hidden_size));
        // an entry left unread fails the load
        let e = ld.finish().unwrap_err().to_string();
        assert!(e.contains("were never read"), "{e}");
        // every entry is checked before any is read: a shape the checkpoint does not have
        let mut wrong = table.clone();
        let k = wrong.len() - 1;
        wrong[k].shape = vec![7];
        let e = Loader::new(&ck, wrong).err().unwrap().to_string();
        assert!(
            e.contains(&format!("tensor {}: expected shape [7]", table[k].name)),
            "{e}"
        );
    }

    #[test]
    fn nan_encodings_are_rejected() {
        assert!(check_e4m3("f", "w", &[0, 0x7e, 0xfe, 0x80]).is_ok());
        let e = check_e4m3("f", "w", &[0, 1, 0xff]).unwrap_err().to_string();
        assert!(e.contains("tensor w: element 2 is byte 0xff"), "{e}");
        // BF16 1.0 = 0x3f80, +inf = 0x7f80, NaN = 0x7fc0, -inf = 0xff80
        assert!(check_bf16("f", "w", &[0x80, 0x3f, 0x7f, 0x7f]).is_ok());
        for (lo, hi, want) in [
            (0x80, 0x7f, "inf"),
            (0xc0, 0x7f, "NaN"),
            (0x80, 0xff, "-inf"),
        ] {
            let e = check_bf16("f", "w", &[0x80, 0x3f, lo, hi])
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("element 1 is {want}")), "{e}");
        }
        // past the first scan block
        let mut q = vec![0x3cu8; 10_000];
        q[9001] = 0x7f;
        let e = check_e4m3("f", "w", &q).unwrap_err().to_string();
        assert!(e.contains("element 9001 "), "{e}");
        q[9001] = 0x80;
        q[9002] = 0xc0;
        q[9003] = 0x7f;
        let e = check_bf16("f", "w", &q).unwrap_err().to_string();
        assert!(e.contains("element 4501 is NaN"), "{e}");
        let e = check_scale("f", "s", &[127, 255]).unwrap_err().to_string();
        assert!(e.contains("scale byte 1 is 255"), "{e}");
    }
}
