"""The benchmark code path (python/v4flash/bench.py) and the synthetic-checkpoint generator
(benches/make_synthetic.py), on tiny inputs."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

import v4flash
from v4flash import _core, bench

ROOT = Path(__file__).resolve().parent.parent
TINY_A = ROOT / "fixtures" / "tiny-a"
JSON_KEYS = (
    "prefill_tok_s",
    "decode_tok_s",
    "hit_rate",
    "disk_bytes_per_token",
    "peak_rss_gb",
    "mem_read_gbs",
    "disk_read_gbs",
    "disk_read_gbs_one_reader",
    "disk_read_gbs_parallel",
    "limit_decode_tok_s",
    "fraction_of_limit",
)


@pytest.fixture(scope="module")
def ms():
    """benches/make_synthetic.py as a module."""
    spec = importlib.util.spec_from_file_location(
        "make_synthetic", ROOT / "benches" / "make_synthetic.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_synthetic"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny_synth(ms, tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "tiny"
    info = ms.build(
        out, n_layers=4, seed=7, d=ms.TINY, max_shard_bytes=1 << 20, log=lambda *a: None
    )
    return out, info


# --------------------------------------------------------------------------------------------
# bench.py
# --------------------------------------------------------------------------------------------
def test_bench_json_on_tiny_fixture(capsys):
    from v4flash.cli import main

    main(
        ["bench", "--model", str(TINY_A), "--prompt", "5", "--gen", "3", "--json"]
        + ["--mem-gb", "0.03", "--disk-gb", "0.002", "--no-fma"]
    )
    r = json.loads(capsys.readouterr().out)
    for k in JSON_KEYS:
        assert k in r, k
        assert isinstance(r[k], (int, float)) and math.isfinite(r[k]), (k, r[k])
    for k in ("prefill_tok_s", "decode_tok_s", "peak_rss_gb", "mem_read_gbs", "disk_read_gbs"):
        assert r[k] > 0, k
    assert r["disk_read_gbs"] == max(r["disk_read_gbs_one_reader"], r["disk_read_gbs_parallel"])
    assert 0 <= r["hit_rate"] <= 1
    assert r["disk_bytes_per_token"] >= 0
    assert r["limit_decode_tok_s"] > 0 and r["fraction_of_limit"] > 0
    assert r["decode_tokens"] == 3 and len(r["per_token"]) == 3 and len(r["output_ids"]) == 3
    for p in r["per_token"]:
        assert p["ms"] > 0 and p["wait_ms"] >= 0 and p["compute_ms"] >= 0
    assert 0 < r["dense_bytes_per_token"] < 6e6  # tiny-a is ~5.5 MB in all
    assert r["prefill_gflops"] > 0
    # the prefill's expert reads: their rate over the prefill, and the compute's wait for them
    assert r["prefill_read_gbs"] * r["prefill_s"] * 1e9 == pytest.approx(r["prefill_disk_bytes"])
    assert 0 <= r["prefill_wait_s"] <= r["prefill_s"]
    # tiny-a has a tokenizer: the prompt is text, and no note about random ids
    assert r["prompt_kind"] == "tokenizer text"
    assert not any("random token ids" in n for n in r["notes"]), r["notes"]


def _bench_cli(capsys, *args):
    from v4flash.cli import main

    code = main(["bench", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("how", ["missing", "foreign", "too-little-ram"])
def test_bench_errors_are_one_line(capsys, tmp_path, how):
    args = ["--no-machine", "-p", "2", "-n", "1"]
    if how == "missing":
        args += ["--model", tmp_path / "nope"]
        want = "no such checkpoint directory"
    elif how == "foreign":
        (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
        args += ["--model", tmp_path]
        want = '"model_type" is "llama", expected "deepseek_v4"'
    else:
        args += ["--model", TINY_A, "--ram", "0.01"]
        want = "cannot run this model: it needs at least"
    code, out, err = _bench_cli(capsys, *args)
    assert code == 1 and out == ""
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("v4flash: error: ") and want in err, err


def test_bench_without_model_uses_the_demo_and_the_engine_options(capsys):
    code, out, err = _bench_cli(
        capsys, "-p", 3, "-n", 2, "--no-machine", "--json", "--cache-policy", "lru", "-t", 1
    )
    assert code == 0, err
    assert "NOT DeepSeek" in err  # the demo notice, as the other commands print it
    r = json.loads(out)
    # the installed package's demo (fixtures/tiny-a is the same files in a checkout)
    from v4flash.demo import demo_path

    assert Path(r["model"]).resolve() == demo_path().resolve()
    assert r["cache_policy"] == "lru" and r["threads"] == 1
    assert r["prompt_tokens"] == 3 and r["decode_tokens"] == 2
    # benches/bench.py is the same command (and keeps its old --policy spelling)
    import runpy
    import sys

    argv = ["bench.py", "-p", "2", "-n", "1", "--no-machine", "--json", "--policy", "lru"]
    old, sys.argv = sys.argv, argv
    try:
        with pytest.raises(SystemExit) as e:
            runpy.run_path(str(ROOT / "benches" / "bench.py"), run_name="__main__")
    finally:
        sys.argv = old
    assert e.value.code == 0
    assert json.loads(capsys.readouterr().out)["cache_policy"] == "lru"


def test_bench_predict_needs_no_checkpoint(capsys):
    code, out, err = _bench_cli(capsys, "--predict", "--mem-gbs", 50, "--json")
    assert code == 0 and err == ""
    assert len(json.loads(out)) == 12


def test_bench_table_prints(capsys):
    r = bench.run_bench(str(TINY_A), prompt_len=3, gen_tokens=2, measure_machine=False, quiet=False)
    out = capsys.readouterr().out
    assert "decode" in out and "hit rate" in out and "peak RSS" in out
    assert "expert reads" in out and "waited on for" in out
    assert "time to first token" in out and "cold:" not in out
    assert r["fraction_of_limit"] is None  # no bandwidths measured: no limit claimed


def test_bench_rejects_bad_lengths():
    with pytest.raises(ValueError):
        bench.run_bench(str(TINY_A), prompt_len=0, gen_tokens=1, quiet=True)


def test_limit_formula():
    # (1 GB dense + 2 layers * 3 experts * 100 MB) at 10 GB/s = 0.16 s
    # + 2 layers * 3 experts * 50 % misses * 100 MB at 1 GB/s = 0.3 s
    assert bench.limit_tok_s(1e9, 10, 2, 3, 0.5, 1e8, 1) == pytest.approx(1 / 0.46)
    assert bench.limit_tok_s(1e9, 10, 2, 3, 1.0, 1e8, 1) == pytest.approx(1 / 0.16)
    # the narrower dense-only form, reported alongside
    assert bench._limit(1e9, 10, 2, 3, 0.5, 1e8, 1, False) == pytest.approx(1 / 0.4)


def test_real_model_sizes_and_prediction():
    m = bench.real_model_bytes()
    assert m["expert_bytes"] == 13_369_344
    # the engine keeps the embedding and the head resident, as its planner counts them
    assert m["embed_bytes"] == 129280 * 4096 * 2
    dense_no_embed_head = m["dense_resident_bytes"] - 2 * m["embed_bytes"]
    assert dense_no_embed_head / 1e9 == pytest.approx(6.73, abs=0.005)  # docs/checkpoint.md §5
    # a decode step reads one row of the embedding and of each of the 3 tid2eid tables
    rows = 4096 * 2 + 3 * 6 * 8
    assert m["dense_bytes_per_token"] == pytest.approx(
        m["dense_resident_bytes"] - m["embed_bytes"] - 3 * 129280 * 6 * 8 + rows
    )
    rows = bench.predict_table(mem_gbs=50)
    assert len(rows) == 12
    by = {(r["ram_gb"], r["disk_gbs"]): r for r in rows}
    for disk in (1.5, 3.5, 7.0):
        rates = [by[(ram, disk)]["limit_tok_s"] for ram in (16, 24, 32, 64)]
        assert rates == sorted(rates) and rates[0] > 0
    for ram in (16, 24, 32, 64):
        rates = [by[(ram, d)]["limit_tok_s"] for d in (1.5, 3.5, 7.0)]
        assert rates == sorted(rates)
        assert 0 < by[(ram, 1.5)]["hit_rate"] < 1
    # never faster than the dense part alone at memory bandwidth
    assert max(r["limit_tok_s"] for r in rows) < 50e9 / m["dense_bytes_per_token"]


def test_emulated_cache():
    full = bench.emulated_cache_mb(24, 43) * (1 << 20)
    assert full == pytest.approx(24e9 - bench.real_model_bytes()["dense_resident_bytes"] - 1.5e9)
    assert bench.emulated_cache_mb(24, 4) == pytest.approx(bench.emulated_cache_mb(24, 43) * 4 / 43)
    assert bench.emulated_cache_mb(4, 4) == 1.0  # budget below the dense part: minimum cache


def test_account_agrees_with_the_real_shapes(ms):
    """bench.account over the generator's full 43-layer tensor plan (nothing written) equals
    the analytic sizes of the published checkpoint."""
    cfg_d = ms.make_config(43)
    heads = {s.name: (s.dtype, list(s.shape), s.nbytes) for s in ms.plan(cfg_d, ms.REAL)}
    cfg = v4flash.config.validate(cfg_d)
    acc = bench.account(heads, cfg)
    real = bench.real_model_bytes()
    assert acc["expert_bytes"] == ms.EXPERT_BYTES_REAL == real["expert_bytes"]
    assert acc["n_experts"] == 43 * 256
    assert acc["dense_bytes_per_token"] == real["dense_bytes_per_token"]
    # ~13B active parameters per token (the model card's figure)
    assert 11e9 < acc["active_params_per_token"] < 15e9


# --------------------------------------------------------------------------------------------
# make_synthetic.py helpers
# --------------------------------------------------------------------------------------------
def test_real_config_and_plan(ms):
    c = ms.make_config(4)
    assert c["num_hidden_layers"] == 4 and c["num_hash_layers"] == 3
    assert c["compress_ratios"] == [0, 0, 4, 128, 0]
    assert ms.make_config(43)["compress_ratios"][:4] == [0, 0, 4, 128]
    assert len(ms.make_config(43)["compress_ratios"]) == 44
    cfg = v4flash.config.validate(c)
    assert cfg.hidden_size == 4096 and cfg.n_routed_experts == 256
    specs = {s.name: s for s in ms.plan(c, ms.REAL)}
    e = [s for n, s in specs.items() if n.startswith("layers.3.ffn.experts.0.")]
    assert sum(s.nbytes for s in e) == 13_369_344
    assert specs["layers.0.attn.wq_b.scale"].shape == (256, 8)
    assert specs["layers.2.attn.indexer.wq_b.weight"].shape == (8192, 1024)
    assert specs["layers.3.attn.compressor.ape"].shape == (128, 512)
    assert specs["layers.2.attn.compressor.wkv.weight"].shape == (1024, 4096)
    assert specs["layers.0.ffn.gate.tid2eid"].dtype == "I64"
    assert "layers.3.ffn.gate.tid2eid" not in specs and "layers.3.ffn.gate.bias" in specs
    assert not any(n.startswith("mtp.") for n in specs)


def test_header_layout(ms):
    specs = ms.plan(ms.make_config(1, ms.TINY), ms.TINY)[:40]
    (shard,) = ms.shard_plan(specs, 1 << 40)
    hb = ms.header_bytes(shard)
    (n,) = np.frombuffer(hb[:8], "<u8")
    assert n == len(hb) - 8 and n % 8 == 0
    h = json.loads(hb[8:])
    off = 0
    for s in shard:  # contiguous, in write order, sizes as planned
        assert h[s.name]["data_offsets"] == [off, off + s.nbytes]
        off += s.nbytes
    # shards respect the size cap
    shards = ms.shard_plan(ms.plan(ms.make_config(2, ms.TINY), ms.TINY), 200_000)
    assert len(shards) > 1
    assert all(sum(s.nbytes for s in sh) <= 200_000 or len(sh) == 1 for sh in shards)


def test_bit_patterns(ms):
    rng = np.random.default_rng(0)
    b = ms.fp8_bytes(rng, 1 << 16)
    assert not np.isin(b, [0x7F, 0xFF]).any()
    v = ms.e4m3_table()[b]
    assert np.isfinite(v).all()
    assert np.sqrt((v * v).mean()) == pytest.approx(ms.FP8_RMS, rel=0.05)
    assert abs(v.mean()) < 0.02
    p = ms.fp4_bytes(rng, 1 << 16)
    codes = np.concatenate([p & 0xF, p >> 4])
    vals = ms.E2M1[codes]
    assert np.sqrt((vals * vals).mean()) == pytest.approx(ms.FP4_RMS, rel=0.05)
    assert (np.abs(vals) >= 2).mean() == pytest.approx(0.25, abs=0.02)
    # packed FP4 with E8M0 scales dequantises to the intended RMS
    rms = 1.5 / 64
    e = ms.scale_exponent(rms, "fp4")
    w = ms.fp4_bytes(rng, 256 * 128).reshape(256, 128)
    s = ms.e8m0_bytes(rng, 256 * 8, e).reshape(256, 8)
    assert set(np.unique(s)) <= {127 + e, 126 + e}
    d = ms.dequant_fp4(w, s)
    assert d.shape == (256, 256)
    assert np.sqrt((d * d).mean()) == pytest.approx(rms, rel=0.35)
    # low nibble = even column
    row = np.zeros((1, 16), np.uint8)
    row[0, 0] = 0x72
    d = ms.dequant_fp4(row, np.array([[128]], np.uint8))  # scale 2
    np.testing.assert_array_equal(d[0, :3], [2.0, 12.0, 0.0])
    x = ms.from_bf16_bits(ms.bf16_bytes(rng, 1 << 16, 0.05))
    assert np.isfinite(x).all() and np.sqrt((x * x).mean()) == pytest.approx(0.05, rel=0.3)


def test_router_calibration_hits_zipf(ms):
    rng = np.random.default_rng(1)
    E, K, H = 64, 6, 256
    w = rng.standard_normal((E, H)).astype(np.float32) * (2 / 16)
    target = ms.zipf_target(E, rng, 1.0)
    y = ms.unit_rms_states(rng, 4096, H)
    b = ms.calibrate_bias(ms.sqrt_softplus(y @ w.T), K, target, iters=120)
    st = ms.routing_stats(
        ms.topk_idx(ms.sqrt_softplus(ms.unit_rms_states(rng, 4096, H) @ w.T) + b, K), E, 6
    )
    assert st["zipf_exponent"] == pytest.approx(1.0, abs=0.2)
    assert st["experts_used"] == E
    # the hottest expert is the one with the best target rank
    idx = ms.topk_idx(ms.sqrt_softplus(y @ w.T) + b, K)
    assert np.bincount(idx.ravel(), minlength=E).argmax() == target.argmax()


def test_tid2eid_rows_distinct_and_skewed(ms):
    d = ms.TINY.__class__(**{**ms.TINY.__dict__, "experts": 64, "vocab": 3000})
    t = np.concatenate(list(ms.Router(3, d).tid2eid(0, rows_per_chunk=1000)))
    assert t.shape == (3000, 6) and t.dtype == np.int64
    assert t.min() >= 0 and t.max() < 64
    assert all(len(set(r)) == 6 for r in t)
    cnt = np.sort(np.bincount(t.ravel(), minlength=64))[::-1]
    assert cnt[0] > 5 * np.median(cnt)


# --------------------------------------------------------------------------------------------
# A whole tiny synthetic checkpoint
# --------------------------------------------------------------------------------------------
def test_synthetic_checkpoint_is_accepted(ms, tiny_synth):
    out, info = tiny_synth
    assert info["shards"] > 1
    assert _core.open_checkpoint(str(out)) == info["tensors"]
    cfg = v4flash.load_config(out)
    assert cfg.num_hidden_layers == 4 and cfg.num_hash_layers == 3
    idx = json.loads((out / "model.safetensors.index.json").read_text())
    heads = bench.read_headers(out)
    assert set(idx["weight_map"]) == set(heads)
    assert idx["metadata"]["total_size"] == sum(v[2] for v in heads.values()) == info["bytes"]
    files = sorted(out.glob("model-*.safetensors"))
    assert [f.name for f in files] == sorted(set(idx["weight_map"].values()))
    t = ms.read_tensor(out, "layers.1.ffn.gate.tid2eid")
    assert all(len(set(r)) == cfg.num_experts_per_tok for r in t)
    assert np.isfinite(ms.read_tensor(out, "layers.3.ffn.gate.bias")).all()


def test_synthetic_0731_checkpoint_has_the_drafter_the_plan_leaves_out(ms, tiny_synth, tmp_path):
    from v4flash.doctor import inspect_checkpoint

    out = tmp_path / "synth0731"
    info = ms.build(out, 4, 7, ms.TINY, 1 << 20, log=lambda *a: None, release="0731")
    ins = inspect_checkpoint(out, tokenizer=False)
    assert ins.ok, ins.problems
    assert ins.drafter["usable"] and ins.drafter["blocks"] == 3
    assert ins.sizes["drafter"] == ins.drafter["bytes"] > 0
    # the drafter's stages sit in shards of their own, after the model's
    wm = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    for stage in range(3):
        files = {f for n, f in wm.items() if n.startswith(f"mtp.{stage}.")}
        assert all(n.startswith(f"mtp.{stage}.") for n, f in wm.items() if f in files)
    # the same model as the first release's: the same plan, no drafter byte in it
    first, _ = tiny_synth
    plan, plan_first = v4flash.plan(out, ram_gb=2), v4flash.plan(first, ram_gb=2)
    assert plan.pop("drafter_bytes") == ins.sizes["drafter"]
    assert plan_first.pop("drafter_bytes") == 0
    assert plan == plan_first
    assert info["bytes"] == sum(ins.sizes.values())


def test_synthetic_checkpoint_is_deterministic(ms, tiny_synth, tmp_path):
    out, _ = tiny_synth
    again = tmp_path / "again"
    ms.build(again, n_layers=4, seed=7, d=ms.TINY, max_shard_bytes=1 << 20, log=lambda *a: None)
    for f in sorted(out.glob("model-*.safetensors")):
        assert (again / f.name).read_bytes() == f.read_bytes(), f.name
    other = tmp_path / "other"
    ms.main(["--tiny", "--layers", "4", "--seed", "8", "--out", str(other), "--shard-mb", "1"])
    f = sorted(out.glob("model-*.safetensors"))[0]
    assert (other / f.name).read_bytes() != f.read_bytes()


def test_synthetic_checkpoint_runs(tiny_synth):
    out, _ = tiny_synth
    m = v4flash.load(out)
    logits = m.logits(list(range(1, 60)))
    assert np.isfinite(logits).all()
    assert 0.1 < logits.std() < 100
    toks = m.generate([5, 6, 7], max_new_tokens=40, stop_ids=[])
    assert len(toks) == 40 and len(set(toks)) > 3
    r = bench.run_bench(str(out), prompt_len=4, gen_tokens=2, measure_machine=False, quiet=True)
    assert 0 <= r["hit_rate"] <= 1
    # a tiny vocabulary gets no tokenizer: the prompt is random ids, and the bench says so
    assert r["prompt_kind"] == "random ids"
    assert any("random token ids" in n for n in r["notes"]), r["notes"]


def test_check_routing_cli(ms, tiny_synth, capsys):
    out, _ = tiny_synth
    assert ms.main(["--check-routing", str(out)]) == 0
    text = capsys.readouterr().out
    assert "hash" in text and "learned" in text and "zipf s" in text


# --- the pre-fault wait and the cold start ---------------------------------------------------


def _bench_json(capsys, *extra):
    from v4flash.cli import main

    main(
        ["bench", "--model", str(TINY_A), "--prompt", "5", "--gen", "2", "--json"]
        + ["--no-machine", *extra]
    )
    return json.loads(capsys.readouterr().out)


def test_bench_waits_for_the_prefault_before_the_prompt(capsys):
    r = _bench_json(capsys)
    assert r["cold"] is False
    # every slot was pre-faulted when the prompt went in
    assert r["prefaulted_at_prompt"] == r["expert_slots"] > 0
    # the first token comes from the prefill's logits
    assert r["ttft_s"] >= r["prefill_s"] > 0


def test_bench_cold_sends_the_prompt_right_after_load(capsys):
    r = _bench_json(capsys, "--cold")
    assert r["cold"] is True
    assert 0 <= r["prefaulted_at_prompt"] <= r["expert_slots"]
    assert r["ttft_s"] >= r["prefill_s"] > 0
    assert r["decode_tokens"] == 2
    bench.run_bench(str(TINY_A), prompt_len=3, gen_tokens=1, measure_machine=False, cold=True)
    assert "(cold: sent right after load" in capsys.readouterr().out


def test_bench_does_not_wait_for_a_prefault_that_never_runs(capsys, monkeypatch):
    """With V4FLASH_PREFAULT=0 no slot is ever pre-faulted; the bench must not wait for one
    (it used to poll the counter until its 600 s guard)."""
    monkeypatch.setenv("V4FLASH_PREFAULT", "0")
    r = _bench_json(capsys)
    assert r["prefaulted_at_prompt"] == 0 < r["expert_slots"]
    assert not any("pre-fault" in n for n in r["notes"]), r["notes"]


def test_bench_predict_has_the_dspark_columns(capsys):
    from v4flash import dspark_predict as dp

    code, out, _ = _bench_cli(capsys, "--predict", "--mem-gbs", 50, "--json")
    rows = json.loads(out)
    for r in rows:
        d = r["dspark"]
        steps = [d["pass_steps"][str(k)] for k in range(1, 6)]
        # a pass of k+1 tokens costs more than k tokens', less than k+1 plain steps
        assert steps == sorted(steps) and all(1 < s < k + 1 for k, s in enumerate(steps, 2))
        assert d["plain_tok_s"] == pytest.approx(r["limit_tok_s"])  # the limit formula's
        # the drafter's RAM and observation cost something; only drafting can gain
        assert d["with_drafter_plain_tok_s"] < d["plain_tok_s"]
        gains = [d["gain"][a]["speed_up"] for a in ("0.5", "0.7", "0.9")]
        assert gains == sorted(gains)
        for g in d["gain"].values():
            if g["k"] == 0:  # plain steps, with the drafter loaded
                assert g["speed_up"] == pytest.approx(
                    d["with_drafter_plain_tok_s"] / d["plain_tok_s"]
                )
            else:  # the cost model's rule: predicted to beat its plain step by the margin
                ratio = g["speed_up"] * d["plain_tok_s"] / d["with_drafter_plain_tok_s"]
                assert ratio > 1 + dp.MARGIN
    # a faster draft never gains less
    fast = dp.dspark_row(64, 7.0, 50.0, draft_ms=1.0)
    slow = dp.dspark_row(64, 7.0, 50.0, draft_ms=500.0)
    assert fast["gain"]["0.9"]["speed_up"] > slow["gain"]["0.9"]["speed_up"]
    assert fast["draft_measured"] and fast["draft_ms"]["3"] == 1.0
    # the table prints, its assumptions named
    code, out, _ = _bench_cli(capsys, "--predict", "--mem-gbs", 50, "--draft-ms", 100)
    assert code == 0 and "DSpark" in out and "measured (--draft-ms)" in out
    assert "Zipf" in out and "a = 0.7" in out
