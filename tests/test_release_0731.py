"""The checkpoint people download today, DeepSeek-V4-Flash-0731: ``fixtures/tiny-b`` has its
shape (``compress_ratios`` = layers + 3 DSpark drafter stages, the four ``dspark_*`` keys, the
stages ``mtp.0``..``mtp.2`` in their own shards). Every command runs it; the drafter is checked,
and read only when asked for (``drafter=True``); a broken drafter disables the drafter, never the
model; other releases and bad ``dspark_*`` values are refused with one line naming the key."""

from __future__ import annotations

import json
import shutil
import signal
import sys

import numpy as np
import pytest

import v4flash
from conftest import FIXTURES, main_
from helpers import cli, serving
from make_bad_checkpoints import Shard, load_json
from v4flash import _core
from v4flash.doctor import inspect_checkpoint

TINY_B = FIXTURES / "tiny-b"
INDEX = "model.safetensors.index.json"


def copy(tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(TINY_B, d)
    return d


def shard_of(d, name):
    return load_json(d / INDEX)["weight_map"][name]


def test_the_fixture_is_shaped_like_0731():
    cfg = v4flash.load_config(TINY_B)
    assert len(cfg.compress_ratios) == cfg.num_hidden_layers + 3
    assert cfg.num_nextn_predict_layers == 1
    assert cfg.drafter == {"kind": "dspark", "blocks": 3}
    assert cfg.dspark_block_size == 5 and cfg.dspark_markov_rank == 16
    ins = inspect_checkpoint(TINY_B, tokenizer=False)
    assert ins.ok, ins.problems
    assert ins.drafter["usable"] and ins.drafter["problems"] == []
    assert ins.drafter["summary"].startswith("DSpark, 3 stages, ")
    assert ins.drafter["bytes"] == ins.sizes["drafter"] > 0
    # the first release's fixture carries the other drafter shape
    a = inspect_checkpoint(FIXTURES / "tiny-a", tokenizer=False)
    assert a.drafter["kind"] == "MTP block" and a.drafter["usable"]


def test_info_and_doctor_report_the_drafter(capsys):
    p = main_(capsys, "info", "-m", TINY_B, "--ram", 2)
    assert p.returncode == 0, p.stderr
    assert "drafter: DSpark, 3 stages" in p.stdout and "(not used yet)" in p.stdout
    assert "checkpoint ok" in p.stdout
    p = main_(capsys, "doctor", "-m", TINY_B, "--ram", 2)
    assert p.returncode == 0, p.stderr
    assert "drafter: DSpark, 3 stages" in p.stdout and "FAIL" not in p.stdout


def test_the_plan_counts_no_drafter_byte():
    ins = inspect_checkpoint(TINY_B, tokenizer=False)
    plan = v4flash.plan(TINY_B, ram_gb=2)
    assert plan["dense_bytes"] == ins.sizes["dense"]
    assert ins.sizes["drafter"] > 0
    assert plan["drafter_resident_bytes"] == plan["drafter_cache_bytes"] == 0
    assert plan["drafter_slots"] == 0


def test_the_drafter_loads_on_request_and_the_plan_counts_it():
    """drafter=True loads the DSpark drafter (its drafts are checked against the torch
    reference by the core's tests, rust/model/dspark/tests.rs); the plan counts its resident
    tensors and its own expert cache; the model answers as without it."""
    plain, plan = v4flash.plan(TINY_B, ram_gb=2), v4flash.plan(TINY_B, ram_gb=2, drafter=True)
    assert 0 < plan["drafter_resident_bytes"] <= plan["drafter_bytes"]
    assert plan["drafter_slots"] > 0 and plan["drafter_cache_bytes"] > 0
    extra = plan["drafter_resident_bytes"] + plan["drafter_cache_bytes"]
    assert plan["total_bytes"] - plain["total_bytes"] == extra
    m = v4flash.load(TINY_B, drafter=True)
    assert m.plan()["drafter_slots"] == plan["drafter_slots"]
    ids = [0, 5, 9, 77, 300]
    assert np.array_equal(m.logits(ids), v4flash.load(TINY_B).logits(ids))
    with pytest.raises(ValueError, match="no DSpark drafter"):
        v4flash.load(FIXTURES / "tiny-a", drafter=True)


def test_run_and_chat_answer_as_the_reference():
    ref = json.loads((FIXTURES / "tiny-b.ref.json").read_text())
    case = ref["cases"][-1]
    p = cli("run", "-m", TINY_B, "--raw", "--json", "--temperature", "0", "-n", 3, "hello")
    assert p.returncode == 0, p.stderr
    assert len(json.loads(p.stdout)["ids"]) > 0
    # the target model is unchanged: the engine's logits equal transformers'
    m = v4flash.load(TINY_B)
    want = np.load(FIXTURES / "tiny-b.ref.npz")[case["name"] + ".logits"]
    got = m.logits(case["ids"])
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    n = len(case["greedy_new"])
    assert m.session().generate(case["ids"], n, stop_ids=[]) == case["greedy_new"]
    p = cli("chat", "-m", TINY_B, "--temperature", "0", "-n", "4", input="Hello\n/exit\n")
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="needs SIGINT")
def test_serve_answers():
    httpx = pytest.importorskip("httpx")
    with serving("-m", TINY_B, "-n", "3") as (p, _, url):
        msgs = [{"role": "user", "content": "Hello"}]
        r = httpx.post(url + "/chat/completions", json={"messages": msgs}, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=30) == 0


# --- a broken drafter disables the drafter, not the model ------------------------------------


def _wrong_shape(d):
    """mtp.0.main_proj.weight [128, 384] written as [384, 128] (same bytes)."""
    name = "mtp.0.main_proj.weight"
    s = Shard(d / shard_of(d, name))
    s.header[name]["shape"] = s.header[name]["shape"][::-1]
    s.write()
    return [name, "expected", "[128, 384]", "disabled"]


def _truncated(d):
    f = shard_of(d, "mtp.2.markov_head.markov_w1.weight")
    p = d / f
    p.write_bytes(p.read_bytes()[:-100])
    return [f, "truncated", "disabled"]


def _missing_shard(d):
    f = shard_of(d, "mtp.1.attn.wq_a.weight")
    (d / f).unlink()
    return [f, "missing", "disabled"]


def _missing_tensor(d):
    """A drafter tensor gone from its shard and from the index."""
    name = "mtp.1.ffn.experts.3.w2.scale"
    s = Shard(d / shard_of(d, name))
    t = s.tensors()
    del t[name]
    from make_bad_checkpoints import repack

    repack(s.path, t)
    idx = load_json(d / INDEX)
    del idx["weight_map"][name]
    (d / INDEX).write_text(json.dumps(idx))
    return [name, "missing", "disabled"]


@pytest.mark.parametrize("how", [_wrong_shape, _truncated, _missing_shard, _missing_tensor])
def test_a_broken_drafter_is_a_warning_and_the_model_runs(tmp_path, capsys, how):
    d = copy(tmp_path)
    words = how(d)
    ins = inspect_checkpoint(d, tokenizer=False)
    assert ins.ok, ins.problems
    row = next(r for r in ins.checks if r[1] == "drafter")
    assert row[0] == "warn", row
    for w in words:
        assert w in row[2], (w, row)
    assert not ins.drafter["usable"]
    p = main_(capsys, "info", "-m", d, "--ram", 2)
    assert p.returncode == 0, p.stderr
    assert "warn" in p.stdout and words[0] in p.stdout and "checkpoint ok" in p.stdout
    # the engine loads and answers exactly as with the whole checkpoint
    ids = [0, 5, 9, 77, 300]
    assert np.array_equal(v4flash.load(d).logits(ids), v4flash.load(TINY_B).logits(ids))
    # asking for the drafter is an error naming what is wrong, in planning and loading
    for call in (v4flash.plan, v4flash.load):
        with pytest.raises(v4flash.V4FlashError, match=words[0].replace(".", r"\.")):
            call(d, ram_gb=2, drafter=True)


def test_a_broken_model_shard_is_still_an_error(tmp_path):
    d = copy(tmp_path)
    f = shard_of(d, "layers.2.attn.wq_a.weight")
    (d / f).write_bytes((d / f).read_bytes()[:-100])
    with pytest.raises(v4flash.V4FlashError, match=f):
        _core.open_checkpoint(str(d))
    assert not inspect_checkpoint(d, tokenizer=False).ok


# --- other releases and bad drafter keys: one line naming the key ------------------------------


@pytest.mark.parametrize(
    "edit,words",
    [
        (lambda c: c.update(dspark_block_size=1), ['"dspark_block_size" = 1']),
        (lambda c: c.update(dspark_noise_token_id=600), ['"dspark_noise_token_id" = 600']),
        (
            lambda c: c.update(dspark_target_layer_ids=[2, 3, 5]),
            ["dspark_target_layer_ids[2] = 5", "num_hidden_layers 5"],
        ),
        (lambda c: c.update(dspark_markov_rank="16"), ['"dspark_markov_rank"']),
        (lambda c: c.pop("dspark_noise_token_id"), ['missing key "dspark_noise_token_id"']),
        (
            lambda c: c.update(compress_ratios=c["compress_ratios"][:4]),
            ['"compress_ratios" has 4 entries', "at least num_hidden_layers (5)"],
        ),
        (
            lambda c: c.update(compress_ratios=c["compress_ratios"][:5]),
            ['"compress_ratios"', "DSpark drafter's stages"],
        ),
        (
            lambda c: c.update(model_type="deepseek_v41", text_config={"hidden_size": 5120}),
            ['"model_type" is "deepseek_v41"', "DeepSeek V4.1", "not support"],
        ),
    ],
)
def test_bad_drafter_keys_and_v41_are_one_clear_line(tmp_path, edit, words):
    d = copy(tmp_path)
    c = json.loads((d / "config.json").read_text())
    edit(c)
    (d / "config.json").write_text(json.dumps(c))
    with pytest.raises(v4flash.V4FlashError) as e:
        v4flash.load(d)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    p = cli("info", "-m", d)
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("v4flash: error:"), p.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_unknown_top_level_keys_still_load(tmp_path):
    d = copy(tmp_path)
    c = json.loads((d / "config.json").read_text())
    c["some_future_key"] = {"x": 1}
    c["n_mtp_layers"] = 3
    (d / "config.json").write_text(json.dumps(c))
    assert v4flash.load_config(d).drafter == {"kind": "dspark", "blocks": 3}
