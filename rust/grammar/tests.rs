use super::*;
use crate::model::sample::{SampleParams, Sampler};

/// A byte-level vocabulary: ids 0..256 the single bytes, then a few multi-byte pieces, then
/// special tokens (0xFF + text), EOS last.
fn vocab() -> (Vocabulary, Vec<Vec<u8>>) {
    let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    for w in [
        "{\"",
        "\":",
        "\",\"",
        "\"}",
        "true",
        "false",
        "null",
        "name",
        "age",
        "abc",
        "  ",
        "12",
        "\"name\":\"",
        "},{",
    ] {
        words.push(w.as_bytes().to_vec());
    }
    words.push(b"\xFF<think_end>".to_vec());
    words.push(b"\xFF<eos>".to_vec());
    let eos = words.len() as u32 - 1;
    (Vocabulary::new(words.clone(), eos).unwrap(), words)
}

/// Samples under `c` from random logits until EOS (or `max` tokens); the bytes produced.
fn run(v: &Vocabulary, words: &[Vec<u8>], c: &mut Constraint, seed: u64, max: usize) -> Vec<u8> {
    let mut rng = Sampler::new(SampleParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
        seed,
    });
    let mut out = Vec::new();
    for step in 0..max {
        let mask = c.mask().unwrap();
        // logits: a pseudo-random preference per token, different at each step
        let logits: Vec<f32> = (0..v.size())
            .map(|i| ((i as u64 * 2654435761 + step as u64 * 97 + seed) % 1000) as f32 / 100.0)
            .collect();
        let tok = c.replace(rng.pick_allowed(&logits, mask.as_ref()));
        c.commit(tok).unwrap();
        if tok == v.eos() {
            break;
        }
        out.extend_from_slice(&words[tok as usize]);
    }
    out
}

#[test]
fn json_schema_answers_validate_and_are_compact() {
    let (v, words) = vocab();
    let schema = r#"{"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 5},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 2}
    }, "required": ["name", "age", "tags"], "additionalProperties": false}"#;
    let g = v.compile(Kind::JsonSchema, schema).unwrap();
    for seed in 0..20 {
        let mut c = Constraint::new(&v, g.clone(), None).unwrap();
        let out = run(&v, &words, &mut c, seed, 400);
        let text = String::from_utf8(out).unwrap();
        let j: serde_json::Value = serde_json::from_str(&text).expect(&text);
        let name = j["name"].as_str().unwrap();
        assert!(name.chars().count() <= 5, "{text}");
        let age = j["age"].as_i64().unwrap();
        assert!((0..=120).contains(&age), "{text}");
        let tags = j["tags"].as_array().unwrap();
        assert!((1..=2).contains(&tags.len()), "{text}");
        assert_eq!(j.as_object().unwrap().len(), 3, "{text}");
        // compact: exactly serde_json's rendering of the value (no optional whitespace)
        assert_eq!(text, serde_json::to_string(&j).unwrap());
        assert!(!c.mask_times().is_empty());
    }
}

#[test]
fn json_object_regex_and_lark() {
    let (v, words) = vocab();
    let g = v.compile(Kind::JsonObject, "").unwrap();
    for seed in 0..10 {
        let mut c = Constraint::new(&v, g.clone(), None).unwrap();
        let out = run(&v, &words, &mut c, seed, 300);
        let text = String::from_utf8_lossy(&out).to_string();
        // an unfinished object (300 tokens) is possible; a finished one is an object
        if let Ok(j) = serde_json::from_str::<serde_json::Value>(&text) {
            assert!(j.is_object(), "{text}");
        }
        assert!(text.starts_with('{'), "{text}");
    }
    let g = v.compile(Kind::Regex, "(ab|cd){2,3}x").unwrap();
    for seed in 0..10 {
        let mut c = Constraint::new(&v, g.clone(), None).unwrap();
        let text = String::from_utf8(run(&v, &words, &mut c, seed, 50)).unwrap();
        let body = text.strip_suffix('x').expect(&text);
        assert!(body.len() == 4 || body.len() == 6, "{text}");
        assert!(
            body.as_bytes().chunks(2).all(|p| p == b"ab" || p == b"cd"),
            "{text}"
        );
    }
    let g = v
        .compile(
            Kind::Lark,
            "start: \"yes\" | \"no\" | num\nnum: /[1-9][0-9]?/",
        )
        .unwrap();
    for seed in 0..10 {
        let mut c = Constraint::new(&v, g.clone(), None).unwrap();
        let text = String::from_utf8(run(&v, &words, &mut c, seed, 50)).unwrap();
        let n = text.parse::<u32>().ok();
        assert!(
            text == "yes" || text == "no" || n.is_some_and(|n| (1..100).contains(&n)),
            "{text}"
        );
    }
}

#[test]
fn bad_grammars_are_argument_errors_naming_the_problem() {
    let (v, _) = vocab();
    for (kind, src, want) in [
        (Kind::JsonSchema, "{not json", "not valid JSON"),
        (
            Kind::JsonSchema,
            "[1, 2]",
            "a JSON object or a boolean, got an array",
        ),
        (Kind::JsonSchema, "false", "allows no value"),
        (Kind::JsonSchema, r#"{"type": "strin"}"#, "strin"),
        (Kind::JsonSchema, r##"{"$ref": "#/$defs/nope"}"##, "nope"),
        (
            Kind::JsonSchema,
            r#"{"type": "integer", "minimum": 5, "maximum": 1}"#,
            "JSON schema",
        ),
        (Kind::Lark, "start: foo", "foo"),
        (Kind::Lark, "start: \"a\" )", "Lark"),
        (Kind::Regex, "(ab", "regular expression"),
    ] {
        let e = v.compile(kind, src).err().expect(src);
        let msg = e.to_string();
        assert!(matches!(e, Error::InvalidArgument(_)), "{msg}");
        eprintln!("{msg}");
        assert!(msg.contains(want), "{src}: {msg}");
    }
    assert!(Kind::parse("gbnf").is_err());
    assert_eq!(Kind::parse("lark").unwrap().name(), "lark");
}

#[test]
fn grammars_compile_once_and_are_kept_by_content() {
    let (v, _) = vocab();
    let a = v.compile(Kind::Regex, "[ab]+").unwrap();
    let b = v.compile(Kind::Regex, "[ab]+").unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    let c = v.compile(Kind::Lark, "start: /[ab]+/").unwrap();
    assert!(!Arc::ptr_eq(&a, &c));
    assert_eq!(v.cache_stats(), (2, 1, 2));
    for i in 0..CACHED_GRAMMARS + 3 {
        v.compile(Kind::Regex, &format!("x{{{i}}}")).unwrap();
    }
    assert_eq!(v.cache_stats().0, CACHED_GRAMMARS);
}

#[test]
fn waiting_constraints_free_the_reasoning_and_turn_eos_into_its_end() {
    let (v, words) = vocab();
    let end = v.size() as u32 - 2;
    let g = v.compile(Kind::Regex, "ok").unwrap();
    let mut c = Constraint::new(&v, g, Some(end)).unwrap();
    assert_eq!(c.mask().unwrap(), None);
    c.commit(b'z' as u32).unwrap();
    // EOS during the reasoning ends the reasoning instead of the answer
    assert_eq!(c.replace(v.eos()), end);
    c.commit(end).unwrap();
    assert!(!c.waiting());
    assert_eq!(c.replace(v.eos()), v.eos());
    let text = run(&v, &words, &mut c, 1, 10);
    assert_eq!(text, b"ok");
}

#[test]
fn vocabularies_are_checked() {
    assert!(Vocabulary::new(vec![], 0).is_err());
    assert!(Vocabulary::new(vec![b"a".to_vec()], 1).is_err());
    // duplicates: the first id keeps the bytes
    let v = Vocabulary::new(vec![b"a".to_vec(), b"a".to_vec(), b"\xFFe".to_vec()], 2).unwrap();
    let g = v.compile(Kind::Regex, "a").unwrap();
    let mut c = Constraint::new(&v, g.clone(), None).unwrap();
    let m = c.mask().unwrap().unwrap();
    assert!(m.is_allowed(0) && !m.is_allowed(1));
    assert!(Constraint::new(&v, g, Some(7)).is_err());
}
