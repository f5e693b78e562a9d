//! A run of consecutive rows of one matrix, as the kernels take it (`view`): what the
//! driver hands to a tier's loops.

use super::matrix::{MatRef, Weights};
use std::ops::Range;

/// A run of consecutive rows of one matrix, in the checkpoint layout.
#[derive(Clone, Copy)]
pub(crate) enum Rows<'a> {
    /// [nrows, cols]
    F32(&'a [f32]),
    /// [nrows, cols * 2] little-endian bf16
    Bf16(&'a [u8]),
    /// q: [nrows, cols] e4m3; scale: [ceil(cols / 128)], the scale row of the one 128-row
    /// block all these rows belong to.
    Fp8 { q: &'a [u8], scale: &'a [u8] },
    /// q: [nrows, cols / 2]; scale: [nrows, cols / 32]
    Fp4 { q: &'a [u8], scale: &'a [u8] },
}

/// `nrows` rows of `cols` columns: what one call of a tier's loops takes.
#[derive(Clone, Copy)]
pub(crate) struct RowsView<'a> {
    pub rows: Rows<'a>,
    pub nrows: usize,
    pub cols: usize,
    /// FP8 in the fused path only: x holds the block scales times 2^112 (`driver::scale_x`), so the
    /// weights enter as `Simd::fp8_bits` (e4m3 * 2^-120) instead of `Simd::fp8` (e4m3 *
    /// 2^-8): the same products, hence the same bits.
    pub fp8_bits: bool,
}

/// Rows `r` of `m` (an FP8 range must lie inside one 128-row block).
pub(crate) fn view<'a>(m: &MatRef<'a>, r: Range<usize>) -> RowsView<'a> {
    let c = m.cols;
    let rows = match m.w {
        Weights::F32(d) => Rows::F32(&d[r.start * c..r.end * c]),
        Weights::Bf16(d) => Rows::Bf16(&d[r.start * c * 2..r.end * c * 2]),
        Weights::Fp8 { q, scale } => {
            let (sc, rb) = (c.div_ceil(128), r.start / 128);
            assert!(
                r.is_empty() || (r.end - 1) / 128 == rb,
                "fp8 rows span a block"
            );
            Rows::Fp8 {
                q: &q[r.start * c..r.end * c],
                scale: &scale[rb * sc..(rb + 1) * sc],
            }
        }
        Weights::Fp4 { q, scale } => Rows::Fp4 {
            q: &q[r.start * c / 2..r.end * c / 2],
            scale: &scale[r.start * c / 32..r.end * c / 32],
        },
    };
    RowsView {
        rows,
        nrows: r.len(),
        cols: c,
        fp8_bits: false,
    }
}
