//! The checkpoint's element types and the exact decoders for the quantized ones.
//!
//! Every dequantized value of FP8 E4M3 × UE8M0 and FP4 E2M1 × UE8M0 is exactly representable
//! in f32, so the decoders here are exact and the kernels may fold scales in any order that
//! stays exact (a power of two times a short mantissa).

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// FP8 E4M3 (the "fn" variant: no infinities, 0x7F/0xFF are NaN).
    F8E4M3,
    /// Unsigned power-of-two scale: byte b means 2^(b-127); 255 is NaN.
    F8E8M0,
    /// Signed bytes; for routed experts, two packed FP4 E2M1 values per byte.
    I8,
    BF16,
    F16,
    F32,
    I64,
    I32,
}

impl DType {
    /// Every dtype a checkpoint may hold.
    pub const ALL: [DType; 8] = [
        DType::F8E4M3,
        DType::F8E8M0,
        DType::I8,
        DType::BF16,
        DType::F16,
        DType::F32,
        DType::I64,
        DType::I32,
    ];

    /// Parses a safetensors dtype string. Unknown strings return None.
    pub fn from_safetensors(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F8E4M3 => "F8_E4M3",
            DType::F8E8M0 => "F8_E8M0",
            DType::I8 => "I8",
            DType::BF16 => "BF16",
            DType::F16 => "F16",
            DType::F32 => "F32",
            DType::I64 => "I64",
            DType::I32 => "I32",
        }
    }

    /// Bytes per stored element (an I8 byte holding two FP4 values counts as one element,
    /// exactly as the safetensors header describes it).
    pub fn size(self) -> usize {
        match self {
            DType::F8E4M3 | DType::F8E8M0 | DType::I8 => 1,
            DType::BF16 | DType::F16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I64 => 8,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// FP8 E4M3 (fn) → f32, exact. NaN encodings (0x7F, 0xFF) decode to NaN.
#[inline]
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((b >> 3) & 0x0F) as i32;
    let man = (b & 0x07) as f32;
    if exp == 0x0F && (b & 0x07) == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        // subnormal: man/8 * 2^-6
        sign * man * (1.0 / 512.0)
    } else {
        sign * (1.0 + man / 8.0) * pow2(exp - 7)
    }
}

/// The 16 FP4 E2M1 values, indexed by nibble.
pub const E2M1_LUT: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// The UE8M0 (F8_E8M0) encoding of NaN: no scale byte may hold it.
pub const E8M0_NAN: u8 = 255;

/// Where the first UE8M0 NaN lies in scale bytes, if anywhere. `memchr` scans with the CPU's
/// vector instructions: a routed expert's scales are about 0.8 MB (one byte per 32 FP4
/// weights), checked on the reading thread for every expert read, beside the compute.
pub fn e8m0_nan(scales: &[u8]) -> Option<usize> {
    memchr::memchr(E8M0_NAN, scales)
}

/// UE8M0 → f32: 2^(b-127). Byte 255 is NaN (the reader rejects it before any compute).
#[inline]
pub const fn e8m0_to_f32(b: u8) -> f32 {
    if b == E8M0_NAN {
        return f32::NAN;
    }
    if b == 0 {
        // 2^-127 is an f32 subnormal: build it from bits.
        return f32::from_bits(1 << 22);
    }
    f32::from_bits((b as u32) << 23)
}

#[inline]
pub fn bf16_to_f32(lo: u8, hi: u8) -> f32 {
    f32::from_bits(((hi as u32) << 24) | ((lo as u32) << 16))
}

#[inline]
fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// Decodes a little-endian tensor of `dtype` into f32 (BF16, F16, F32 only).
pub fn to_f32_vec(dtype: DType, bytes: &[u8]) -> Option<Vec<f32>> {
    match dtype {
        DType::F32 => Some(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        DType::BF16 => Some(
            bytes
                .chunks_exact(2)
                .map(|c| bf16_to_f32(c[0], c[1]))
                .collect(),
        ),
        DType::F16 => Some(
            bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_nan_finds_the_first_255_anywhere_in_a_long_run() {
        // every other byte value is a finite scale; positions inside and across vector widths
        let clean: Vec<u8> = (0..100_003).map(|i| (i % 255) as u8).collect();
        assert_eq!(e8m0_nan(&clean), None);
        assert_eq!(e8m0_nan(&[]), None);
        for at in [0, 1, 15, 31, 32, 63, 64, 4_097, 99_999, 100_002] {
            let mut s = clean.clone();
            s[at] = 255;
            if at + 7 < s.len() {
                s[at + 7] = 255;
            }
            assert_eq!(e8m0_nan(&s), Some(at), "first NaN at {at}");
        }
    }

    #[test]
    fn e4m3_all_256_values_match_definition() {
        for b in 0u16..256 {
            let b = b as u8;
            let v = e4m3_to_f32(b);
            let s = if b & 0x80 != 0 { -1.0f64 } else { 1.0 };
            let e = ((b >> 3) & 15) as i32;
            let m = (b & 7) as f64;
            if b & 0x7F == 0x7F {
                assert!(v.is_nan(), "byte {b:#x}");
                continue;
            }
            let want = if e == 0 {
                s * m / 8.0 * 2f64.powi(-6)
            } else {
                s * (1.0 + m / 8.0) * 2f64.powi(e - 7)
            };
            assert_eq!(v as f64, want, "byte {b:#x}");
        }
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0xFE), -448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
    }

    #[test]
    fn e8m0_exponents() {
        for b in 0u16..255 {
            assert_eq!(
                e8m0_to_f32(b as u8) as f64,
                2f64.powi(b as i32 - 127),
                "byte {b}"
            );
        }
        assert!(e8m0_to_f32(255).is_nan());
    }

    #[test]
    fn e2m1_table() {
        let mags = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for n in 0..16usize {
            let e = (n >> 1) & 3;
            let m = n & 1;
            let mag = if e == 0 {
                m as f32 * 0.5
            } else {
                (1.0 + m as f32 * 0.5) * 2f32.powi(e as i32 - 1)
            };
            assert_eq!(mag, mags[n & 7]);
            let want = if n & 8 != 0 { -mag } else { mag };
            assert_eq!(E2M1_LUT[n].to_bits(), want.to_bits(), "nibble {n}");
        }
    }

    #[test]
    fn dtype_names_roundtrip() {
        let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
        let want = [
            "F8_E4M3", "F8_E8M0", "I8", "BF16", "F16", "F32", "I64", "I32",
        ];
        assert_eq!(names, want);
        for d in DType::ALL {
            assert_eq!(DType::from_safetensors(d.name()), Some(d));
        }
        assert_eq!(DType::from_safetensors("F8_E5M2"), None);
    }
}
