//! A weight matrix in one of the checkpoint's formats, borrowed: what every product reads.

/// A weight matrix [rows, cols] in one of the checkpoint's formats, borrowed.
#[derive(Clone, Copy)]
pub enum Weights<'a> {
    /// [rows, cols] f32.
    F32(&'a [f32]),
    /// [rows, cols] little-endian bf16 (2 bytes per element, any alignment).
    Bf16(&'a [u8]),
    /// q: [rows, cols] e4m3; scale: [ceil(rows/128), ceil(cols/128)] ue8m0.
    Fp8 { q: &'a [u8], scale: &'a [u8] },
    /// q: [rows, cols/2] packed e2m1, low nibble = even column; scale: [rows, cols/32] ue8m0.
    Fp4 { q: &'a [u8], scale: &'a [u8] },
}

#[derive(Clone, Copy)]
pub struct MatRef<'a> {
    pub rows: usize,
    pub cols: usize,
    pub w: Weights<'a>,
}

impl<'a> MatRef<'a> {
    /// Checks the buffer lengths against the geometry (the loader validates shapes before,
    /// so a failure here is a programming error reported as a message, never a panic).
    pub fn new(rows: usize, cols: usize, w: Weights<'a>) -> Result<Self, String> {
        let (need, got, what) = match w {
            Weights::F32(d) => (rows * cols, d.len(), "f32 elements"),
            Weights::Bf16(d) => (rows * cols * 2, d.len(), "bf16 bytes"),
            Weights::Fp8 { q, scale } => {
                let s = rows.div_ceil(128) * cols.div_ceil(128);
                if scale.len() != s {
                    return Err(format!("fp8 scale has {} bytes, expected {s}", scale.len()));
                }
                (rows * cols, q.len(), "fp8 bytes")
            }
            Weights::Fp4 { q, scale } => {
                if !cols.is_multiple_of(32) {
                    return Err(format!("fp4 matrix needs cols % 32 == 0, got {cols}"));
                }
                if scale.len() != rows * cols / 32 {
                    return Err(format!(
                        "fp4 scale has {} bytes, expected {}",
                        scale.len(),
                        rows * cols / 32
                    ));
                }
                (rows * cols / 2, q.len(), "fp4 bytes")
            }
        };
        if need != got {
            return Err(format!(
                "matrix [{rows}, {cols}] needs {need} {what}, got {got}"
            ));
        }
        Ok(MatRef { rows, cols, w })
    }

    /// Bytes of weight data (and scales) a full pass over the matrix reads.
    pub fn bytes(&self) -> usize {
        match self.w {
            Weights::F32(d) => d.len() * 4,
            Weights::Bf16(d) => d.len(),
            Weights::Fp8 { q, scale } | Weights::Fp4 { q, scale } => q.len() + scale.len(),
        }
    }
}
