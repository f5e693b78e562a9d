//! The Sylvester-Hadamard rotation official numerics applies to the lightning indexer's
//! query and keys before their FP4 round trip: rotating spreads each vector's energy over
//! all dims, so one outlier does not set the scale of a whole FP4 block. DeepSeek's
//! reference inference calls `rotate_activation` (`fast_hadamard_transform` with scale
//! dim^-1/2) on the indexer query after its rope and on each indexer key after its norm and
//! rope (`Indexer.forward`, `Compressor.forward` with `rotate=True` in deepseek-ai's
//! `inference/model.py`, Hugging Face revision 60d8d70, mirrored in supermy/ds4rs
//! `third/ds4/model.py`).
//!
//! The matrix is Sylvester's: H_1 = [1], H_2k = [[H_k, H_k], [H_k, -H_k]], so
//! H[i][j] = (-1)^popcount(i & j). A row narrower than a power of two is padded with zeros
//! to the next one and the first `width` outputs kept, as `fast_hadamard_transform` does;
//! the scale is width^-1/2 of the unpadded width (orthonormal when no padding is needed).

/// Rotates each row of x [n, width] in place: y = width^-1/2 · H · x (f32 butterflies,
/// stride 1, 2, 4, …, then one multiply by the scale).
pub(crate) fn rotate(x: &mut [f32], width: usize) {
    debug_assert!(width > 0 && x.len() % width == 0);
    let p = width.next_power_of_two();
    // the scale as Python computes it (`x.size(-1) ** -0.5` in double), then f32
    let scale = (width as f64).powf(-0.5) as f32;
    let mut buf = vec![0f32; p]; // [p]
    for row in x.chunks_exact_mut(width) {
        buf[..width].copy_from_slice(row);
        buf[width..].fill(0.0);
        let mut h = 1;
        while h < p {
            for blk in buf.chunks_exact_mut(2 * h) {
                let (lo, hi) = blk.split_at_mut(h);
                for (a, b) in lo.iter_mut().zip(hi.iter_mut()) {
                    let (u, v) = (*a, *b);
                    *a = u + v;
                    *b = u - v;
                }
            }
            h *= 2;
        }
        for (o, &v) in row.iter_mut().zip(&buf) {
            *o = v * scale;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sylvester's matrix of order p by its recursive definition (an independent construction).
    fn sylvester(p: usize) -> Vec<Vec<f64>> {
        let mut h = vec![vec![1f64]];
        while h.len() < p {
            let k = h.len();
            let mut n = vec![vec![0f64; 2 * k]; 2 * k];
            for i in 0..k {
                for j in 0..k {
                    n[i][j] = h[i][j];
                    n[i][j + k] = h[i][j];
                    n[i + k][j] = h[i][j];
                    n[i + k][j + k] = -h[i][j];
                }
            }
            h = n;
        }
        h
    }

    #[test]
    fn basis_vectors_give_the_columns_of_sylvesters_matrix() {
        for width in [1usize, 2, 8, 64, 128] {
            let h = sylvester(width);
            let s = (width as f64).powf(-0.5) as f32;
            for j in 0..width {
                let mut x = vec![0f32; width];
                x[j] = 1.0;
                rotate(&mut x, width);
                for i in 0..width {
                    assert_eq!(x[i], h[i][j] as f32 * s, "width {width} H[{i}][{j}]");
                }
            }
        }
    }

    #[test]
    fn random_rows_match_a_direct_product_and_rotating_twice_is_the_identity() {
        let (n, width) = (3, 128);
        let x: Vec<f32> = (0..n * width)
            .map(|i| ((i * 7919 % 613) as f32 - 306.0) * 0.013)
            .collect();
        let h = sylvester(width);
        let mut y = x.clone();
        rotate(&mut y, width);
        for t in 0..n {
            for i in 0..width {
                let want: f64 = (0..width)
                    .map(|j| h[i][j] * x[t * width + j] as f64)
                    .sum::<f64>()
                    / (width as f64).sqrt();
                assert!(
                    (y[t * width + i] as f64 - want).abs() < 1e-5,
                    "row {t} out {i}"
                );
            }
        }
        rotate(&mut y, width);
        for (a, b) in y.iter().zip(&x) {
            assert!((a - b).abs() < 1e-5);
        }
    }

    #[test]
    fn a_width_that_is_not_a_power_of_two_is_zero_padded_and_truncated() {
        let width = 96; // padded to 128
        let h = sylvester(128);
        let x: Vec<f32> = (0..width).map(|i| (i as f32 - 40.0) * 0.25).collect();
        let mut y = x.clone();
        rotate(&mut y, width);
        for i in 0..width {
            let want: f64 =
                (0..width).map(|j| h[i][j] * x[j] as f64).sum::<f64>() / (width as f64).sqrt();
            assert!(
                (y[i] as f64 - want).abs() < 1e-4,
                "out {i}: {} vs {want}",
                y[i]
            );
        }
    }

    #[test]
    fn integer_inputs_are_rotated_exactly() {
        // small integers: every butterfly sum is exact, so the result is H·x times the scale
        let width = 64;
        let h = sylvester(width);
        let x: Vec<f32> = (0..width).map(|i| ((i * 13) % 17) as f32 - 8.0).collect();
        let mut y = x.clone();
        rotate(&mut y, width);
        let s = (width as f64).powf(-0.5) as f32;
        for i in 0..width {
            let hx: f64 = (0..width).map(|j| h[i][j] * x[j] as f64).sum();
            assert_eq!(y[i], hx as f32 * s);
        }
    }
}
