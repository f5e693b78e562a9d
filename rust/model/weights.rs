//! Owned resident weights and their loading from the checkpoint, with every tensor checked
//! for presence, dtype and shape (and scale bytes for the NaN encoding) before any compute.

use crate::checkpoint::{Checkpoint, TensorInfo};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::{self, MatRef, Numerics, Weights};
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
    pub fn forward(&self, x: &[f32], n: usize) -> Vec<f32> {
        let mut y = vec![0f32; n * self.rows];
        kernels::matmul(&self.mat(), 0..self.rows, x, n, &mut y);
        y
    }

    /// `forward` in the given numerics (`kernels::matmul_in`).
    pub fn forward_in(&self, numerics: Numerics, x: &[f32], n: usize) -> Vec<f32> {
        let mut y = vec![0f32; n * self.rows];
        kernels::matmul_in(numerics, &self.mat(), 0..self.rows, x, n, &mut y);
        y
    }

    /// y[n, rows.len()] for a row sub-range.
    pub fn forward_rows(&self, rows: Range<usize>, x: &[f32], n: usize) -> Vec<f32> {
        let mut y = vec![0f32; n * rows.len()];
        kernels::matmul(&self.mat(), rows, x, n, &mut y);
        y
    }

    pub fn bytes(&self) -> usize {
        self.mat().bytes()
    }
}

/// Loads tensors by name with checks; errors name the file, the tensor, expected and found.
pub struct Loader<'a> {
    pub ck: &'a Checkpoint,
    /// Bytes of resident weights loaded so far.
    pub loaded: usize,
}

impl<'a> Loader<'a> {
    pub fn new(ck: &'a Checkpoint) -> Self {
        Loader { ck, loaded: 0 }
    }

    /// An FP8 E4M3 weight `{name}.weight` [rows, cols] with its `{name}.scale` 128×128 blocks.
    pub fn fp8(&mut self, name: &str, rows: usize, cols: usize) -> Result<Linear> {
        let wt = self
            .ck
            .expect(&format!("{name}.weight"), &[DType::F8E4M3], &[rows, cols])?
            .clone();
        let st = self
            .ck
            .expect(
                &format!("{name}.scale"),
                &[DType::F8E8M0],
                &[rows.div_ceil(128), cols.div_ceil(128)],
            )?
            .clone();
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
    pub fn dense(&mut self, name: &str, rows: usize, cols: usize) -> Result<Linear> {
        let t = self
            .ck
            .expect(
                &format!("{name}.weight"),
                &[DType::BF16, DType::F32, DType::F16],
                &[rows, cols],
            )?
            .clone();
        self.dense_tensor(&t, rows, cols)
    }

    pub fn dense_tensor(&mut self, t: &TensorInfo, rows: usize, cols: usize) -> Result<Linear> {
        let data = match t.dtype {
            DType::BF16 => {
                let b = self.ck.read(t)?;
                check_bf16(self.ck.file_of(t), &t.name, &b)?;
                LinData::Bf16(b)
            }
            _ => LinData::F32(self.ck.read_f32(t)?),
        };
        let l = Linear { rows, cols, data };
        self.loaded += l.bytes();
        Ok(l)
    }

    /// A float vector or matrix (BF16/F16/F32) as f32, with an exact shape.
    pub fn floats(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let t = self
            .ck
            .expect(name, &[DType::F32, DType::BF16, DType::F16], shape)?
            .clone();
        let v = self.ck.read_f32(&t)?;
        self.loaded += v.len() * 4;
        Ok(v)
    }

    /// `tid2eid` [vocab, k] as I64 or I32, each id checked < n_experts and distinct per row.
    pub fn tid2eid(
        &mut self,
        name: &str,
        vocab: usize,
        k: usize,
        n_experts: usize,
    ) -> Result<Vec<u16>> {
        let t = self
            .ck
            .expect(name, &[DType::I64, DType::I32], &[vocab, k])?
            .clone();
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

/// Rejects the UE8M0 NaN encoding (255).
pub fn check_scale(file: &str, name: &str, s: &[u8]) -> Result<()> {
    if let Some(i) = s.iter().position(|&b| b == 255) {
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
