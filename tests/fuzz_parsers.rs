//! Property tests / bounded fuzzing of everything that parses untrusted bytes: safetensors
//! headers, the shard index, config.json and whole checkpoint directories; plus properties of
//! the FP8 / FP4 / UE8M0 / BF16 decoders. Each run is a fixed number of cases (CI-bounded);
//! the property that matters most is "no panic": every input is Ok or a clear `Error`.

use _core::checkpoint::{parse_index_bytes, safetensors, Checkpoint};
use _core::config::ModelConfig;
use _core::dtype::{bf16_to_f32, e4m3_to_f32, e8m0_to_f32, to_f32_vec, DType, E2M1_LUT};
use _core::Error;
use proptest::prelude::*;
use serde_json::{json, Value};
use std::path::Path;

const DTYPES: [&str; 8] = [
    "F8_E4M3", "F8_E8M0", "I8", "BF16", "F16", "F32", "I64", "I32",
];

fn dtype_size(s: &str) -> u64 {
    DType::from_safetensors(s).unwrap().size() as u64
}

/// A valid header (tensors tiling the data section in random order) and its data length.
fn valid_header() -> impl Strategy<Value = (Value, u64)> {
    prop::collection::vec(
        (0usize..DTYPES.len(), prop::collection::vec(0usize..6, 0..4)),
        0..8,
    )
    .prop_shuffle()
    .prop_map(|ts| {
        let mut h = serde_json::Map::new();
        h.insert("__metadata__".into(), json!({"format": "pt"}));
        let mut at = 0u64;
        for (i, (d, shape)) in ts.iter().enumerate() {
            let n: u64 = shape.iter().map(|&x| x as u64).product::<u64>() * dtype_size(DTYPES[*d]);
            h.insert(
                format!("t{i}.weight"),
                json!({"dtype": DTYPES[*d], "shape": shape, "data_offsets": [at, at + n]}),
            );
            at += n;
        }
        (Value::Object(h), at)
    })
}

/// A JSON value likely to break a parser expecting something else.
fn nasty_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e30f64..1e30).prop_map(Value::from),
        Just(json!(-1)),
        Just(json!(0)),
        Just(json!(1)),
        Just(json!(u64::MAX)),
        Just(json!(1u64 << 40)),
        "[a-zA-Z0-9_]{0,8}".prop_map(Value::from),
        prop::collection::vec(any::<i32>(), 0..4).prop_map(|v| json!(v)),
        Just(json!({})),
    ]
}

/// Checks what an accepted header promises downstream.
fn check_entries(entries: &[safetensors::RawEntry], data_start: u64, file_len: u64) {
    let mut at = data_start;
    for e in entries {
        assert_eq!(e.offset, at, "{}: not tiling", e.name);
        let numel: u64 = e.shape.iter().map(|&d| d as u64).product();
        assert_eq!(e.len, numel * e.dtype.size() as u64, "{}", e.name);
        at += e.len;
    }
    assert_eq!(at, file_len);
}

fn header_bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn header_len_never_panics(prefix in any::<[u8; 8]>(), file_len in any::<u64>()) {
        if let Ok(n) = safetensors::header_len("f", &prefix, file_len) {
            prop_assert!(8 + n <= file_len);
        }
    }

    #[test]
    fn parse_header_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512), extra in 0u64..1 << 20) {
        let file_len = 8 + bytes.len() as u64 + extra;
        if let Ok(es) = safetensors::parse_header("f", &bytes, file_len) {
            check_entries(&es, 8 + bytes.len() as u64, file_len);
        }
        // a file length shorter than the header must be an error, not an underflow
        let r = safetensors::parse_header("f", &bytes, bytes.len() as u64);
        prop_assert!(r.is_err() || bytes.is_empty());
    }

    #[test]
    fn parse_header_accepts_valid_headers((h, data_len) in valid_header()) {
        let b = header_bytes(&h);
        let file_len = 8 + b.len() as u64 + data_len;
        let es = safetensors::parse_header("f", &b, file_len).unwrap();
        prop_assert_eq!(es.len(), h.as_object().unwrap().len() - 1);
        check_entries(&es, 8 + b.len() as u64, file_len);
        // any other file length is a truncated or padded file
        prop_assert!(safetensors::parse_header("f", &b, file_len - 1).is_err() || data_len == 0);
        prop_assert!(safetensors::parse_header("f", &b, file_len + 1).is_err());
    }

    #[test]
    fn parse_header_mutated_fields(
        (h, data_len) in valid_header(),
        which in 0usize..8,
        field in 0usize..4,
        val in nasty_value(),
    ) {
        let mut h = h;
        let o = h.as_object_mut().unwrap();
        let names: Vec<String> = o.keys().filter(|k| *k != "__metadata__").cloned().collect();
        if !names.is_empty() {
            let e = o.get_mut(&names[which % names.len()]).unwrap().as_object_mut().unwrap();
            match field {
                0 => { e.insert("dtype".into(), val); }
                1 => { e.insert("shape".into(), val); }
                2 => { e.insert("data_offsets".into(), val); }
                _ => { e.remove(["dtype", "shape", "data_offsets"][which % 3]); }
            }
        }
        let b = header_bytes(&h);
        let file_len = 8 + b.len() as u64 + data_len;
        match safetensors::parse_header("shard.safetensors", &b, file_len) {
            Ok(es) => check_entries(&es, 8 + b.len() as u64, file_len),
            Err(e) => prop_assert!(e.to_string().starts_with("shard.safetensors: "), "{e}"),
        }
    }

    #[test]
    fn parse_index_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = parse_index_bytes(&bytes);
    }

    #[test]
    fn parse_index_structured(
        entries in prop::collection::vec(("[a-z.0-9]{1,12}", prop_oneof![
            "[a-z0-9-]{1,12}\\.safetensors".prop_map(Value::from),
            Just(json!("../x.safetensors")),
            Just(json!("/etc/passwd")),
            Just(json!("")),
            nasty_value(),
        ]), 0..6),
        wrap in 0usize..3,
    ) {
        let wm: serde_json::Map<String, Value> = entries.into_iter().collect();
        let v = match wrap {
            0 => json!({"metadata": {"total_size": 1}, "weight_map": wm}),
            1 => json!({"weight_map": Value::Array(wm.values().cloned().collect())}),
            _ => Value::Object(wm.clone()),
        };
        match parse_index_bytes(&serde_json::to_vec(&v).unwrap()) {
            Ok((names, map)) => {
                prop_assert!(!names.is_empty());
                for n in &names {
                    prop_assert!(!n.is_empty() && !n.contains('/') && !n.contains(".."), "{n}");
                }
                prop_assert_eq!(map.len(), wm.len());
            }
            Err(e) => prop_assert!(matches!(e, Error::Checkpoint { .. }), "{e}"),
        }
    }

    #[test]
    fn config_mutations_never_panic(
        edits in prop::collection::vec((0usize..CONFIG_KEYS.len(), nasty_value(), any::<bool>()), 1..4),
    ) {
        let mut v = real_config();
        for (k, val, remove) in edits {
            let o = v.as_object_mut().unwrap();
            if remove { o.remove(CONFIG_KEYS[k]); } else { o.insert(CONFIG_KEYS[k].into(), val); }
        }
        match ModelConfig::from_json(&v) {
            Ok(c) => {
                prop_assert_eq!(c.layer_kinds.len(), c.num_layers);
                prop_assert!(c.experts_per_tok <= c.n_routed_experts);
                prop_assert!(c.num_hash_layers <= c.num_layers);
                prop_assert!(c.num_heads % c.o_groups == 0);
                prop_assert!(c.rope_dim <= c.head_dim && c.rope_dim % 2 == 0);
                prop_assert!((c.eos_token_id as usize) < c.vocab_size);
                prop_assert!(c.hidden_size % 32 == 0 && c.moe_inter % 32 == 0);
            }
            Err(e) => {
                let s = e.to_string();
                prop_assert!(s.starts_with("config.json: "), "{s}");
            }
        }
    }

    // ------------------------------------------------------------------- decoders

    #[test]
    fn e4m3_matches_reference_formula(b in any::<u8>()) {
        let got = e4m3_to_f32(b);
        if b & 0x7f == 0x7f {
            prop_assert!(got.is_nan());
        } else {
            let s = if b & 0x80 != 0 { -1.0f64 } else { 1.0 };
            let e = ((b >> 3) & 15) as i32;
            let m = (b & 7) as f64;
            let want = if e == 0 { s * m / 8.0 * 2f64.powi(-6) } else { s * (1.0 + m / 8.0) * 2f64.powi(e - 7) };
            prop_assert_eq!(got as f64, want);
            prop_assert!(got.abs() <= 448.0);
            // sign symmetry and monotonic magnitude
            prop_assert_eq!(e4m3_to_f32(b ^ 0x80).to_bits(), (-got).to_bits());
            if b & 0x7f < 0x7e {
                prop_assert!(e4m3_to_f32((b & 0x7f) + 1) > got.abs());
            }
        }
    }

    #[test]
    fn e8m0_is_an_exact_power_of_two(b in any::<u8>()) {
        let got = e8m0_to_f32(b);
        if b == 255 {
            prop_assert!(got.is_nan());
        } else {
            prop_assert_eq!(got as f64, 2f64.powi(b as i32 - 127));
        }
    }

    #[test]
    fn dequantized_products_are_exact(q in any::<u8>(), nib in 0usize..16, s in 1u8..240) {
        // FP8 × UE8M0 and FP4 × UE8M0 are exact in f32 (no rounding) away from overflow
        let sc = e8m0_to_f32(s);
        let x = e4m3_to_f32(q);
        if x.is_finite() {
            let p = x * sc;
            prop_assert_eq!(p as f64, x as f64 * sc as f64);
        }
        let y = E2M1_LUT[nib];
        prop_assert_eq!((y * sc) as f64, y as f64 * sc as f64);
        prop_assert_eq!(E2M1_LUT[nib ^ 8].to_bits(), (-y).to_bits());
    }

    #[test]
    fn bf16_and_f16_decoding(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        let even = &bytes[..bytes.len() / 2 * 2];
        let v = to_f32_vec(DType::BF16, even).unwrap();
        prop_assert_eq!(v.len(), even.len() / 2);
        for (i, c) in even.chunks_exact(2).enumerate() {
            let want = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
            prop_assert!(v[i].to_bits() == want.to_bits() || (v[i].is_nan() && want.is_nan()));
            prop_assert_eq!(v[i].to_bits(), bf16_to_f32(c[0], c[1]).to_bits());
        }
        prop_assert!(to_f32_vec(DType::I8, even).is_none());
        prop_assert!(to_f32_vec(DType::F8E4M3, even).is_none());
    }
}

const CONFIG_KEYS: [&str; 20] = [
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "head_dim",
    "qk_rope_head_dim",
    "o_groups",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "compress_ratios",
    "num_hash_layers",
    "rope_scaling",
    "rms_norm_eps",
    "eos_token_id",
    "bos_token_id",
    "num_nextn_predict_layers",
    "max_position_embeddings",
    "hc_mult",
];

fn real_config() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiny-a/config.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

// ------------------------------------------------------- whole checkpoint directories

/// A small single-file checkpoint: the bytes of `model.safetensors`.
fn tiny_single_file() -> Vec<u8> {
    let h = json!({
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]},
        "c": {"dtype": "I64", "shape": [1, 2], "data_offsets": [32, 48]},
    });
    let mut hb = serde_json::to_vec(&h).unwrap();
    while hb.len() % 8 != 0 {
        hb.push(b' ');
    }
    let mut out = (hb.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&hb);
    out.extend((0..48u8).map(|i| i % 7));
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn checkpoint_open_with_byte_flips_never_panics(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in prop::option::of(any::<prop::sample::Index>()),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut b = tiny_single_file();
        for (i, v) in flips {
            let at = i.index(b.len());
            b[at] = v;
        }
        if let Some(c) = cut {
            b.truncate(c.index(b.len()));
        }
        std::fs::write(dir.path().join("model.safetensors"), &b).unwrap();
        if let Ok(ck) = Checkpoint::open(dir.path()) {
            for name in ck.names().map(str::to_string).collect::<Vec<_>>() {
                let t = ck.get(&name).unwrap().clone();
                prop_assert!(t.offset + t.len <= b.len() as u64);
                prop_assert_eq!(ck.read(&t).unwrap().len() as u64, t.len);
                let _ = ck.read_f32(&t);
            }
        }
    }
}

#[test]
fn tiny_single_file_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("model.safetensors"), tiny_single_file()).unwrap();
    let ck = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ck.len(), 3);
    let a = ck.get("a").unwrap().clone();
    assert_eq!(ck.read(&a).unwrap().len(), 24);
}

/// Byte flips anywhere in a real fixture shard (headers and data) end in Ok or an `Error`
/// from the full model load, never a panic; a bounded number of cases, fixed seeds.
#[test]
fn model_load_with_random_shard_corruption_never_panics() {
    use _core::model::{LoadOptions, Model};
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiny-a");
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut ok, mut err) = (0, 0);
    for case in 0..24 {
        let dir = tempfile::tempdir().unwrap();
        for f in std::fs::read_dir(&src).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), dir.path().join(f.file_name())).unwrap();
        }
        let shard = dir.path().join(if case % 2 == 0 {
            "model-00001-of-00002.safetensors"
        } else {
            "model-00002-of-00002.safetensors"
        });
        let mut b = std::fs::read(&shard).unwrap();
        let hl = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
        for _ in 0..1 + next() % 4 {
            // half the flips in the header, half in the data
            let at = if next() % 2 == 0 {
                (next() as usize) % (8 + hl)
            } else {
                8 + hl + (next() as usize) % (b.len() - 8 - hl)
            };
            b[at] = next() as u8;
        }
        std::fs::write(&shard, &b).unwrap();
        let opts = LoadOptions {
            threads: std::num::NonZeroUsize::new(1),
            expert_cache_bytes: Some(1),
            ctx: std::num::NonZeroUsize::new(64),
            ..LoadOptions::default()
        };
        match Model::load(dir.path(), &opts) {
            Ok(m) => {
                ok += 1;
                let mut st = m.new_state();
                // the forward pass reads (possibly corrupted) experts: Ok or Err, no panic
                let _ = m.forward(&mut st, &[0, 5, 9, 300], _core::model::Want::Last, &|| {
                    false
                });
            }
            Err(e) => {
                err += 1;
                let s = e.to_string();
                assert!(!s.is_empty());
            }
        }
    }
    assert_eq!(ok + err, 24);
}
