//! Session files: round trips bit for bit, damaged and foreign files refused.

use super::*;
use crate::kernels::Numerics;
use crate::model::generate::{Generation, Session};
use crate::model::sample::SampleParams;
use crate::model::session::format::{xxh64, Xxh64};
use crate::model::LoadOptions;
use serde_json::{json, Map};
use std::sync::{Arc, OnceLock};

const NO: fn() -> bool = || false;

fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

fn load_model(dir: &Path, numerics: Numerics, ctx: Option<usize>) -> Arc<Model> {
    let opts = LoadOptions {
        threads: std::num::NonZeroUsize::new(1),
        ctx: ctx.and_then(std::num::NonZeroUsize::new),
        numerics,
        ..LoadOptions::default()
    };
    Arc::new(Model::load(dir, &opts).expect("the fixture loads"))
}

fn tiny(name: &str) -> Arc<Model> {
    static A: OnceLock<Arc<Model>> = OnceLock::new();
    static B: OnceLock<Arc<Model>> = OnceLock::new();
    let cell = if name == "tiny-a" { &A } else { &B };
    cell.get_or_init(|| load_model(&dir(name), Numerics::Exact, None))
        .clone()
}

fn gen(prompt: &[u32], n: usize, seed: u64) -> Generation {
    let p = SampleParams {
        temperature: 1.0,
        top_p: 0.9,
        top_k: 50,
        seed,
    };
    Generation::new(prompt.to_vec(), n, p, vec![]).unwrap()
}

fn ids(m: &Model, n: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7 + salt * 13 + 3) % m.cfg.vocab_size) as u32)
        .collect()
}

fn bits(v: Option<&[f32]>) -> Option<Vec<u32>> {
    v.map(|v| v.iter().map(|x| x.to_bits()).collect())
}

/// `a` and `b` are the same sequence and continue identically, bit for bit: the logits
/// at hand, a sampled continuation, and the logits after more fed tokens.
fn same_future(a: &mut Session, b: &mut Session) {
    assert_eq!(a.tokens(), b.tokens());
    assert_eq!(a.position(), b.position());
    assert_eq!(bits(a.last_logits()), bits(b.last_logits()));
    if a.position() > 0 {
        let ga = a.generate(&mut gen(&[], 7, 5), &NO).unwrap();
        let gb = b.generate(&mut gen(&[], 7, 5), &NO).unwrap();
        assert_eq!(ga, gb);
    }
    let more = ids(a.model(), 11, 1);
    a.feed(&more, &NO).unwrap();
    b.feed(&more, &NO).unwrap();
    assert_eq!(bits(a.last_logits()), bits(b.last_logits()));
    assert!(a.last_logits().is_some());
}

fn round_trip(s: &mut Session, at: Option<&crate::model::session::Snapshot>) -> Session {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("s.v4session");
    let meta = json!({"note": "hi", "n": [1, 2]});
    let n = s.save(&p, at, Some(&meta), &NO).unwrap();
    assert_eq!(n, std::fs::metadata(&p).unwrap().len());
    let (t, got) = Session::load(s.model().clone(), &p, &NO).unwrap();
    assert_eq!(got, Some(meta));
    let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
    assert_eq!(names.len(), 1, "no temporary file is left behind");
    t
}

#[test]
fn a_restored_session_continues_bit_for_bit() {
    for name in ["tiny-a", "tiny-b"] {
        let m = tiny(name);
        // lengths around the windows (8 / 16) and compression ratios (4, 8, 16)
        for n in [1, 3, 4, 17, 33, 50] {
            let prompt = ids(&m, n, 0);
            // after a prefill
            let mut a = Session::new(m.clone());
            a.feed(&prompt, &NO).unwrap();
            let mut b = round_trip(&mut a, None);
            same_future(&mut a, &mut b);
            // after a generation: a sampled token waits to be fed
            let mut a = Session::new(m.clone());
            a.generate(&mut gen(&prompt, 4, 9), &NO).unwrap();
            assert!(a.last_logits().is_none());
            let mut b = round_trip(&mut a, None);
            same_future(&mut a, &mut b);
            // after a rollback
            let mut a = Session::new(m.clone());
            a.feed(&prompt, &NO).unwrap();
            let snap = a.snapshot(&NO).unwrap();
            a.generate(&mut gen(&[], 9, 2), &NO).unwrap();
            a.rollback(&snap).unwrap();
            let mut b = round_trip(&mut a, None);
            same_future(&mut a, &mut b);
        }
    }
}

#[test]
fn a_snapshot_saves_the_state_it_had() {
    let m = tiny("tiny-a");
    let mut a = Session::new(m.clone());
    a.generate(&mut gen(&ids(&m, 13, 2), 3, 4), &NO).unwrap();
    let snap = a.snapshot(&NO).unwrap();
    a.generate(&mut gen(&ids(&m, 22, 3), 5, 4), &NO).unwrap();
    let mut b = round_trip(&mut a, Some(&snap));
    assert_eq!(b.position(), snap.pos());
    a.rollback(&snap).unwrap();
    same_future(&mut a, &mut b);
    // a snapshot of another session (not a prefix of this one) is refused, as rollback does
    let mut other = Session::new(m.clone());
    other.feed(&ids(&m, 5, 7), &NO).unwrap();
    let foreign = other.snapshot(&NO).unwrap();
    let d = tempfile::tempdir().unwrap();
    let e = a
        .save(&d.path().join("x"), Some(&foreign), None, &NO)
        .unwrap_err();
    assert!(e.to_string().contains("does not belong"), "{e}");
    assert!(!d.path().join("x").exists());
}

#[test]
fn an_empty_session_round_trips() {
    let m = tiny("tiny-b");
    let mut a = Session::new(m.clone());
    let mut b = round_trip(&mut a, None);
    assert_eq!((b.position(), b.last_logits()), (0, None));
    let mut fresh = Session::new(m.clone());
    same_future(&mut fresh, &mut b);
}

/// A saved session of `m` with `n` tokens: the file's bytes and its path (in `d`).
fn saved(m: &Arc<Model>, n: usize, d: &Path) -> (Vec<u8>, PathBuf) {
    let mut s = Session::new(m.clone());
    s.feed(&ids(m, n, 0), &NO).unwrap();
    let p = d.join("s.v4session");
    s.save(&p, None, Some(&json!({"a": 1})), &NO).unwrap();
    (std::fs::read(&p).unwrap(), p)
}

fn load_err(m: &Arc<Model>, p: &Path, bytes: &[u8]) -> String {
    std::fs::write(p, bytes).unwrap();
    match Session::load(m.clone(), p, &NO) {
        Ok(_) => panic!("a damaged file was accepted"),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(&p.display().to_string()), "{msg}");
            msg
        }
    }
}

/// The file with its header edited and both checksums recomputed (a file this code could
/// have written, but with other contents).
fn forge(
    bytes: &[u8],
    edit: impl Fn(&mut Map<String, Value>),
    body: impl Fn(&mut [u8]),
) -> Vec<u8> {
    let hl = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]) as usize;
    let mut h: Value = serde_json::from_slice(&bytes[16..16 + hl]).unwrap();
    edit(h.as_object_mut().unwrap());
    let head = serde_json::to_vec(&h).unwrap();
    let mut out = bytes[..12].to_vec();
    out.extend_from_slice(&(head.len() as u32).to_le_bytes());
    out.extend_from_slice(&head);
    let hh = xxh64(&out);
    out.extend_from_slice(&hh.to_le_bytes());
    let mut rest = bytes[16 + hl + 8..bytes.len() - 8].to_vec();
    body(&mut rest);
    out.extend_from_slice(&rest);
    let sum = xxh64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

#[test]
fn damaged_files_are_refused_with_what_is_wrong() {
    let m = tiny("tiny-a");
    let d = tempfile::tempdir().unwrap();
    let (good, p) = saved(&m, 21, d.path());
    let hl = u32::from_le_bytes([good[12], good[13], good[14], good[15]]) as usize;
    // truncated anywhere
    for cut in [
        0,
        5,
        8,
        15,
        16,
        30,
        16 + hl,
        16 + hl + 9,
        good.len() / 2,
        good.len() - 1,
    ] {
        let e = load_err(&m, &p, &good[..cut]);
        assert!(e.contains("truncated"), "cut at {cut}: {e}");
    }
    // longer than the format says
    let mut long = good.clone();
    long.extend_from_slice(&[0; 3]);
    assert!(load_err(&m, &p, &long).contains("3 bytes too many"));
    // magic and version
    let mut b = good.clone();
    b[..8].copy_from_slice(b"GGUF\0\0\0\0");
    assert!(load_err(&m, &p, &b).contains("not a v4flash session file"));
    let e = load_err(&m, &p, b"{\"messages\": []}");
    assert!(e.contains("not a v4flash session file"), "{e}");
    let mut b = good.clone();
    b[8..12].copy_from_slice(&2u32.to_le_bytes());
    let e = load_err(&m, &p, &b);
    assert!(
        e.contains("format version 2") && e.contains("reads version 1"),
        "{e}"
    );
    // a flipped byte in the header, in the tokens, in a float, in the checksum
    for (at, want) in [
        (16 + 3, "header checksum mismatch"),
        (16 + hl + 8 + 1, "checksum mismatch"),
        (good.len() - 100, "checksum mismatch"),
        (good.len() - 3, "checksum mismatch"),
    ] {
        let mut b = good.clone();
        b[at] ^= 0x10;
        let e = load_err(&m, &p, &b);
        assert!(
            e.contains(want) && e.contains("corrupted"),
            "byte {at}: {e}"
        );
    }
    // the good file still loads
    std::fs::write(&p, &good).unwrap();
    assert!(Session::load(m.clone(), &p, &NO).is_ok());
}

#[test]
fn every_flipped_bit_is_refused() {
    let m = tiny("tiny-a");
    let d = tempfile::tempdir().unwrap();
    let (good, p) = saved(&m, 2, d.path());
    for at in 0..good.len() {
        let mut b = good.clone();
        b[at] ^= 1 << (at % 8);
        load_err(&m, &p, &b);
    }
}

#[test]
fn forged_headers_are_checked_against_the_geometry() {
    let m = tiny("tiny-a");
    let d = tempfile::tempdir().unwrap();
    let (good, p) = saved(&m, 21, d.path());
    let keep = |_: &mut [u8]| {};
    // a token count the data does not hold: refused by size, before anything is allocated
    let b = forge(
        &good,
        |h| drop(h.insert("tokens".into(), json!(m.ctx))),
        keep,
    );
    assert!(load_err(&m, &p, &b).contains("truncated"));
    let b = forge(
        &good,
        |h| drop(h.insert("tokens".into(), json!(m.ctx + 1))),
        keep,
    );
    assert!(load_err(&m, &p, &b).contains("more than this model's context"));
    let b = forge(
        &good,
        |h| drop(h.insert("pending".into(), json!(512))),
        keep,
    );
    assert!(load_err(&m, &p, &b).contains("pending token 512"));
    let b = forge(&good, |h| drop(h.insert("pending".into(), json!(5))), keep);
    assert!(load_err(&m, &p, &b).contains("inconsistent header"));
    let b = forge(
        &good,
        |_| {},
        |body| body[..4].copy_from_slice(&600u32.to_le_bytes()),
    );
    assert!(load_err(&m, &p, &b).contains("token id 600 is outside"));
    // the forger itself is faithful
    assert_eq!(forge(&good, |_| {}, keep), good);
}

#[test]
fn a_file_of_another_model_or_mode_is_refused_naming_what_differs() {
    let d = tempfile::tempdir().unwrap();
    let a = tiny("tiny-a");
    let (good, p) = saved(&a, 21, d.path());
    let e = load_err(&tiny("tiny-b"), &p, &good);
    assert!(
        e.contains("saved for a model with") && e.contains("hidden_size 192, this one has 128"),
        "{e}"
    );
    assert!(e.contains("more config values differ"), "{e}");
    // the same checkpoint in another numerics mode
    let fast = load_model(&dir("tiny-a"), Numerics::Fast, None);
    let e = load_err(&fast, &p, &good);
    assert!(e.contains("numerics exact, this model runs fast"), "{e}");
    // a context too short for it
    let short = load_model(&dir("tiny-a"), Numerics::Exact, Some(16));
    let e = load_err(&short, &p, &good);
    assert!(
        e.contains("21 tokens, more than this model's context of 16"),
        "{e}"
    );
    // a copy of the checkpoint with one config value changed
    let copy = d.path().join("ck");
    std::fs::create_dir(&copy).unwrap();
    for f in std::fs::read_dir(dir("tiny-a")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, copy.join(f.file_name().unwrap())).unwrap();
    }
    let cfg = std::fs::read_to_string(copy.join("config.json")).unwrap();
    let cfg = cfg.replace("\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": 1e-05");
    std::fs::write(copy.join("config.json"), cfg).unwrap();
    let other = load_model(&copy, Numerics::Exact, None);
    let e = load_err(&other, &p, &good);
    assert!(
        e.contains("rms_norm_eps 0.000001, this one has 0.00001"),
        "{e}"
    );
    // ... and an unchanged copy (another path) is the same model
    let same = load_model(&dir("tiny-a"), Numerics::Exact, None);
    std::fs::write(&p, &good).unwrap();
    assert!(Session::load(same, &p, &NO).is_ok());
    // a forged identity
    let b = forge(
        &good,
        |h| drop(h.insert("weights_xxh64".into(), json!("0"))),
        |_| {},
    );
    assert!(load_err(&a, &p, &b).contains("same layout but other weights"));
    let b = forge(
        &good,
        |h| drop(h.insert("tensor_table_xxh64".into(), json!("0"))),
        |_| {},
    );
    assert!(load_err(&a, &p, &b).contains("another tensor table"));
}

#[test]
fn save_refuses_paths_it_cannot_write() {
    let m = tiny("tiny-a");
    let mut s = Session::new(m);
    let d = tempfile::tempdir().unwrap();
    let e = s.save(d.path(), None, None, &NO).unwrap_err().to_string();
    assert!(e.contains("is a directory"), "{e}");
    let e = s
        .save(&d.path().join("no/such/dir/s"), None, None, &NO)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no/such/dir/s"), "{e}");
    // an existing file is replaced whole
    let p = d.path().join("s");
    std::fs::write(&p, vec![7u8; 1 << 16]).unwrap();
    let n = s.save(&p, None, None, &NO).unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().len(), n);
    // a cancelled save leaves the old file and no temporary file
    let yes = || true;
    let mut t = Session::new(s.model().clone());
    t.feed(&[1, 2, 3], &NO).unwrap();
    assert!(matches!(
        t.save(&p, None, None, &yes),
        Err(Error::Cancelled)
    ));
    assert_eq!(std::fs::metadata(&p).unwrap().len(), n);
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
}

#[test]
fn the_checksum_is_xxh64() {
    // reference values of the published algorithm (seed 0; the python-xxhash package)
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 31 % 251) as u8).collect();
    for (n, want) in [
        (0, 0xef46db3751d8e999u64),
        (1, 0xe934a84adb052768),
        (3, 0xe5d2be4ae4b3469a),
        (4, 0x3b4d7f7c6bd1ae90),
        (7, 0xf952f1901a5afc9b),
        (8, 0x506834122cb7b4d0),
        (9, 0xba2f457c2914d838),
        (31, 0x5836f08607dbda19),
        (32, 0xb3f0ec9d8d216dea),
        (33, 0xc480db428c35ab3e),
        (63, 0x9522a419d60828f2),
        (64, 0x28bf42bb281af2ee),
        (100, 0xcd8c24467b8382ad),
        (1000, 0xd1bee8e4f0603bbf),
    ] {
        assert_eq!(xxh64(&data[..n]), want, "{n} bytes");
    }
    // streaming in any split gives the one-shot value
    let whole = xxh64(&data);
    for split in [1, 3, 8, 31, 32, 33, 64, 999] {
        let mut h = Xxh64::new();
        for c in data.chunks(split) {
            h.update(c);
        }
        assert_eq!(h.digest(), whole, "split {split}");
    }
}

#[test]
fn counts_follow_the_state_the_forward_pass_keeps() {
    // layer_counts is what the model's own state holds at every position
    for name in ["tiny-a", "tiny-b"] {
        let m = tiny(name);
        let mut s = Session::new(m.clone());
        for t in 0..40u32 {
            s.feed(&[t % 97], &NO).unwrap();
            let d = tempfile::tempdir().unwrap();
            // save checks every array against layer_counts before writing
            s.save(&d.path().join("s"), None, None, &NO).unwrap();
        }
    }
}
