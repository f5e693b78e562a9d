//! The config validator: the published configs, every refusal naming its key, the summary.

use super::*;

fn real() -> Value {
    serde_json::from_str(PUBLISHED_CONFIG).unwrap()
}

#[test]
fn real_config_layer_kinds() {
    let c = ModelConfig::from_json(&real()).unwrap();
    assert_eq!(c.layer_kinds.len(), 43);
    assert_eq!(c.layer_kinds[0], LayerKind::Sliding);
    assert_eq!(c.layer_kinds[1], LayerKind::Sliding);
    for i in 2..43 {
        let want = if i % 2 == 0 {
            LayerKind::Csa { ratio: 4 }
        } else {
            LayerKind::Hca { ratio: 128 }
        };
        assert_eq!(c.layer_kinds[i], want, "layer {i}");
    }
    assert!(c.is_hash_layer(2) && !c.is_hash_layer(3));
    assert_eq!(c.yarn.unwrap().factor, 16.0);
}

type Edit = Box<dyn Fn(&mut Value)>;

/// Each edit of `base()` is refused with a one-line config.json error holding its words.
fn refused(base: fn() -> Value, cases: Vec<(Edit, &str)>) {
    for (edit, want) in cases {
        let mut v = base();
        edit(&mut v);
        let e = ModelConfig::from_json(&v).unwrap_err().to_string();
        assert!(e.contains(want), "want {want:?} in {e:?}");
        assert!(e.starts_with("config.json"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}

#[test]
fn bad_configs_name_the_key() {
    let cases: Vec<(Edit, &str)> = vec![
        (
            Box::new(|v| drop(v.as_object_mut().unwrap().remove("hidden_size"))),
            "missing key \"hidden_size\"",
        ),
        (
            Box::new(|v| v["hidden_size"] = serde_json::json!(-4)),
            "\"hidden_size\" must be a non-negative integer",
        ),
        (
            Box::new(|v| v["head_dim"] = serde_json::json!(0)),
            "\"head_dim\" must be positive",
        ),
        (
            Box::new(|v| v["compress_ratios"] = serde_json::json!([0, 4])),
            "\"compress_ratios\" has 2 entries, expected at least num_hidden_layers (43)",
        ),
        (
            Box::new(|v| v["model_type"] = serde_json::json!("llama")),
            "expected \"deepseek_v4\"",
        ),
        (
            Box::new(|v| v["o_groups"] = serde_json::json!(7)),
            "\"num_attention_heads\" = 64 must be divisible by \"o_groups\" = 7",
        ),
        (
            Box::new(|v| v["num_experts_per_tok"] = serde_json::json!(300)),
            "exceeds \"n_routed_experts\"",
        ),
        (
            Box::new(|v| v["rope_scaling"]["factor"] = serde_json::json!("x")),
            "\"rope_scaling.factor\" must be a number",
        ),
        (
            Box::new(|v| v["eos_token_id"] = serde_json::json!(129280)),
            "\"eos_token_id\" = 129280 is outside the vocabulary",
        ),
        (
            Box::new(|v| v["bos_token_id"] = serde_json::json!([0])),
            "\"bos_token_id\" must be a non-negative integer",
        ),
        (
            Box::new(|v| v["hidden_size"] = serde_json::json!(4100)),
            "\"hidden_size\" = 4100 must be a multiple of 32",
        ),
        (
            Box::new(|v| v["moe_intermediate_size"] = serde_json::json!(2050)),
            "\"moe_intermediate_size\" = 2050 must be a multiple of 32",
        ),
        // a value of the wrong JSON type is refused, never skipped or defaulted
        (
            Box::new(|v| v["scoring_func"] = serde_json::json!(5)),
            "\"scoring_func\" is 5, expected \"sqrtsoftplus\"",
        ),
        (
            Box::new(|v| v["scoring_func"] = Value::Null),
            "\"scoring_func\" is null, expected \"sqrtsoftplus\"",
        ),
        (
            Box::new(|v| v["scoring_func"] = serde_json::json!("softmax")),
            "\"scoring_func\" is \"softmax\", expected \"sqrtsoftplus\"",
        ),
        (
            Box::new(|v| v["model_type"] = serde_json::json!(4)),
            "\"model_type\" is 4, expected \"deepseek_v4\"",
        ),
        (
            Box::new(|v| v["rope_scaling"]["beta_fast"] = serde_json::json!("32")),
            "\"rope_scaling.beta_fast\" must be a number, found \"32\"",
        ),
        (
            Box::new(|v| v["rope_scaling"]["type"] = serde_json::json!(["yarn"])),
            "\"rope_scaling.type\" is [\"yarn\"], only \"yarn\" is supported",
        ),
        (
            Box::new(|v| drop(v["rope_scaling"].as_object_mut().unwrap().remove("type"))),
            "\"rope_scaling.type\" is missing",
        ),
        (
            Box::new(|v| v["compress_ratios"] = serde_json::json!({"0": 4})),
            "\"compress_ratios\" must be a list of integers, found {\"0\":4}",
        ),
        (
            Box::new(|v| drop(v.as_object_mut().unwrap().remove("compress_ratios"))),
            "missing key \"compress_ratios\" (the per-layer attention kinds",
        ),
        (
            Box::new(|v| v["hc_mult"] = serde_json::json!(65)),
            "\"hc_mult\" = 65 is implausibly large (at most 64)",
        ),
        (
            Box::new(|v| v["vocab_size"] = serde_json::json!("x".repeat(200))),
            "\"vocab_size\" must be a non-negative integer, found \"xxxxxxxxxx",
        ),
        (
            Box::new(|v| v["num_hash_layers"] = serde_json::json!(44)),
            "\"num_hash_layers\" = 44 exceeds",
        ),
        (
            Box::new(|v| drop(v.as_object_mut().unwrap().remove("model_type"))),
            "missing key \"model_type\"",
        ),
    ];
    refused(real, cases);
}

fn release_0731() -> Value {
    published_config("0731").unwrap()
}

#[test]
fn the_0731_release_is_the_same_model_with_a_dspark_drafter() {
    let first = ModelConfig::from_json(&real()).unwrap();
    assert_eq!(first.drafter, Drafter::Mtp { blocks: 1 });
    let c = ModelConfig::from_json(&release_0731()).unwrap();
    assert_eq!(c.layer_kinds, first.layer_kinds);
    assert_eq!(c.compress_ratios.len(), 46);
    assert_eq!(c.nextn_layers, 1);
    assert_eq!(
        c.drafter,
        Drafter::DSpark(DSpark {
            stages: 3,
            block_size: 5,
            noise_token_id: 128799,
            target_layer_ids: vec![40, 41, 42],
            markov_rank: 256,
        })
    );
    assert_eq!(c.drafter.blocks(), 3);
    // every other key keeps its value
    let (a, b) = (real(), release_0731());
    for (k, v) in a.as_object().unwrap() {
        if k != "compress_ratios" {
            assert_eq!(&b[k], v, "{k}");
        }
    }
    assert!(published_config("v5").is_err());
    // no drafter: no num_nextn_predict_layers, one ratio per layer
    let mut v = real();
    v.as_object_mut()
        .unwrap()
        .remove("num_nextn_predict_layers");
    v["compress_ratios"] = serde_json::json!(v["compress_ratios"].as_array().unwrap()[..43]);
    assert_eq!(ModelConfig::from_json(&v).unwrap().drafter, Drafter::None);
    // more entries than layers + drafter are the drafter's (DeepSeek reads them by layer)
    let mut v = real();
    v["compress_ratios"].as_array_mut().unwrap().push(0.into());
    assert_eq!(
        ModelConfig::from_json(&v).unwrap().layer_kinds,
        first.layer_kinds
    );
}

#[test]
fn bad_drafter_keys_and_other_releases_name_the_key() {
    let cases: Vec<(Edit, &str)> = vec![
        (
            Box::new(|v| v["dspark_block_size"] = serde_json::json!(1)),
            "\"dspark_block_size\" = 1 must be between 2",
        ),
        (
            Box::new(|v| v["dspark_block_size"] = serde_json::json!("5")),
            "\"dspark_block_size\" must be a non-negative integer, found \"5\"",
        ),
        (
            Box::new(|v| v["dspark_noise_token_id"] = serde_json::json!(129280)),
            "\"dspark_noise_token_id\" = 129280 is outside the vocabulary (vocab_size 129280)",
        ),
        (
            Box::new(|v| v["dspark_markov_rank"] = serde_json::json!(0)),
            "\"dspark_markov_rank\" must be positive",
        ),
        (
            Box::new(|v| v["dspark_target_layer_ids"] = serde_json::json!([40, 41, 43])),
            "dspark_target_layer_ids[2] = 43 is not a layer of the model (num_hidden_layers 43)",
        ),
        (
            Box::new(|v| v["dspark_target_layer_ids"] = serde_json::json!([40, 40])),
            "dspark_target_layer_ids[1] = 40 is listed twice",
        ),
        (
            Box::new(|v| v["dspark_target_layer_ids"] = serde_json::json!([40, "41"])),
            "dspark_target_layer_ids[1] must be a layer number, found \"41\"",
        ),
        (
            Box::new(|v| v["dspark_target_layer_ids"] = serde_json::json!([])),
            "\"dspark_target_layer_ids\" must be a non-empty list of layer numbers, found []",
        ),
        (
            Box::new(|v| drop(v.as_object_mut().unwrap().remove("dspark_markov_rank"))),
            "missing key \"dspark_markov_rank\" (a DSpark drafter's four dspark_* keys come together",
        ),
        (
            Box::new(|v| {
                v["compress_ratios"] =
                    serde_json::json!(v["compress_ratios"].as_array().unwrap()[..43])
            }),
            "none for the DSpark drafter's stages",
        ),
        (
            Box::new(|v| {
                v["compress_ratios"] =
                    serde_json::json!(v["compress_ratios"].as_array().unwrap()[..42])
            }),
            "\"compress_ratios\" has 42 entries, expected at least num_hidden_layers (43)",
        ),
        (
            Box::new(|v| v["compress_ratios"][44] = serde_json::json!(-1)),
            "compress_ratios[44] must be a non-negative integer, found -1",
        ),
        (
            Box::new(|v| {
                v["model_type"] = serde_json::json!("deepseek_v41");
                v["text_config"] = serde_json::json!({"hidden_size": 5120});
            }),
            "\"model_type\" is \"deepseek_v41\": this is DeepSeek V4.1",
        ),
    ];
    refused(release_0731, cases);
}

#[test]
fn the_summary_is_a_config_of_the_same_model() {
    let (c, sum) = validate_json(&real()).unwrap();
    assert_eq!(sum["compress_ratios"].as_array().unwrap().len(), 44);
    assert_eq!(
        sum["drafter"],
        serde_json::json!({"kind": "mtp", "blocks": 1})
    );
    let (c7, sum7) = validate_json(&release_0731()).unwrap();
    assert_eq!(
        sum7["drafter"],
        serde_json::json!({"kind": "dspark", "blocks": 3})
    );
    assert_eq!(
        sum7["dspark_target_layer_ids"],
        serde_json::json!([40, 41, 42])
    );
    let mut again = sum7.clone();
    again["model_type"] = "deepseek_v4".into();
    let (c7b, sum7b) = validate_json(&again).unwrap();
    assert_eq!((sum7b, c7b.drafter), (sum7, c7.drafter));
    assert_eq!(sum["layer_types"][2], "compressed_sparse_attention");
    assert_eq!(sum["layer_types"][3], "heavily_compressed_attention");
    assert_eq!(sum["layer_types"][42], "compressed_sparse_attention");
    // numbers as written, not rounded to f32
    assert_eq!(sum["rms_norm_eps"].as_f64(), Some(1e-6));
    assert_eq!(sum["rope_scaling"]["beta_fast"].as_f64(), Some(32.0));
    let mut again = sum.clone();
    again["model_type"] = "deepseek_v4".into();
    let (c2, sum2) = validate_json(&again).unwrap();
    assert_eq!(sum2, sum);
    assert_eq!(c2.layer_kinds, c.layer_kinds);
    assert_eq!(c2.max_position_embeddings, c.max_position_embeddings);
    // absent optional keys: defaults
    let mut v = real();
    let o = v.as_object_mut().unwrap();
    for k in [
        "rope_scaling",
        "bos_token_id",
        "max_position_embeddings",
        "scoring_func",
    ] {
        o.remove(k);
    }
    let (_, sum) = validate_json(&v).unwrap();
    assert_eq!(sum["rope_scaling"], Value::Null);
    assert_eq!(sum["bos_token_id"], 0);
    assert_eq!(sum["max_position_embeddings"], 1 << 20);
}

#[test]
fn the_summary_has_every_key_once_and_only_those() {
    let keys = summary_keys();
    let mut unique = keys.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), keys.len(), "{keys:?}");
    for v in [real(), release_0731()] {
        let (_, sum) = validate_json(&v).unwrap();
        let mut got: Vec<&str> = sum
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        got.sort_unstable();
        assert_eq!(got, unique);
        // the summary as a config: the same summary again
        let again = config_json(sum.as_object().unwrap());
        assert_eq!(again["model_type"], "deepseek_v4");
        assert!(again.get("layer_types").is_none() && again.get("drafter").is_none());
        assert_eq!(validate_json(&again).unwrap().1, sum);
    }
}

#[test]
fn a_session_files_identity_is_the_documented_list() {
    // docs/architecture.md §7.1: the header's "model" object, in this order
    let want = [
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "compress_ratios",
        "num_attention_heads",
        "head_dim",
        "qk_rope_head_dim",
        "q_lora_rank",
        "o_groups",
        "o_lora_rank",
        "sliding_window",
        "index_n_heads",
        "index_head_dim",
        "index_topk",
        "n_routed_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "num_hash_layers",
        "routed_scaling_factor",
        "swiglu_limit",
        "rope_theta",
        "compress_rope_theta",
        "rope_scaling",
        "hc_mult",
        "hc_sinkhorn_iters",
        "hc_eps",
        "rms_norm_eps",
    ];
    let c = ModelConfig::from_json(&release_0731()).unwrap();
    let ids = c.identity_values();
    let names: Vec<&str> = ids.iter().map(|(k, _)| *k).collect();
    assert_eq!(names, want);
    let get = |k: &str| &ids.iter().find(|(n, _)| *n == k).unwrap().1;
    // the layers' ratios only (not the drafter's), f32 values as their shortest decimal
    assert_eq!(get("compress_ratios").as_array().unwrap().len(), 43);
    assert_eq!(get("rms_norm_eps").as_f64(), Some(1e-6));
    assert_eq!(get("routed_scaling_factor").as_f64(), Some(1.5));
    assert_eq!(
        get("rope_scaling"),
        &serde_json::json!({"factor": 16.0, "original_max_position_embeddings": 65536.0,
                            "beta_fast": 32.0, "beta_slow": 1.0})
    );
}
