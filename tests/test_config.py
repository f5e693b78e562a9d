"""One source of truth: config validation, the expected tensor table and the routed-expert test
live in the core (rust/config.rs, rust/checkpoint/expected.rs), and Python (config.py, doctor,
bench, info) uses them. These tests check that Python and the engine agree, and that the table
agrees with test_fixtures.py's own, independent one."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re

import pytest

import v4flash
from make_bad_checkpoints import CONFIG_CASES, GOOD
from test_fixtures import expected_tensors as independent_table
from v4flash import _core, bench, doctor
from v4flash.config import Config, drafter_tensors, expected_tensors, load_config, validate

FIXTURES = GOOD.parent


def good() -> dict:
    return json.loads((GOOD / "config.json").read_text())


def published() -> dict:
    return json.loads(_core.PUBLISHED_CONFIG)


@pytest.mark.parametrize(
    "name,edit,words", [c for c in CONFIG_CASES if c[1]], ids=[c[0] for c in CONFIG_CASES if c[1]]
)
def test_python_and_the_engine_refuse_a_config_with_the_same_message(tmp_path, name, edit, words):
    d = good()
    edit(d)
    with pytest.raises(v4flash.V4FlashError) as py:
        validate(copy.deepcopy(d))
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").write_text(json.dumps(d))
    with pytest.raises(v4flash.V4FlashError) as from_file:
        load_config(ck)
    with pytest.raises(v4flash.V4FlashError) as engine:
        _core.Model.load(str(ck))
    assert str(py.value) == str(from_file.value) == str(engine.value)
    for w in words:
        assert w in str(py.value), (w, str(py.value))


@pytest.mark.parametrize(
    "key,value,message",
    [
        # drift: the engine used to accept a non-string scoring_func that Python refused
        ("scoring_func", 5, '"scoring_func" is 5, expected "sqrtsoftplus"'),
        ("scoring_func", None, '"scoring_func" is null, expected "sqrtsoftplus"'),
        ("scoring_func", ["sqrtsoftplus"], '"scoring_func" is ["sqrtsoftplus"], expected'),
        # drift: the two sides gave different o_groups messages
        ("o_groups", 3, '"num_attention_heads" = 4 must be divisible by "o_groups" = 3'),
        # a non-string model_type was reported as a missing key by the engine
        ("model_type", 4, '"model_type" is 4, expected "deepseek_v4"'),
        ("rope_scaling", [1], '"rope_scaling" must be an object, found [1]'),
        ("compress_ratios", "0,0,4", '"compress_ratios" must be a list of integers, found "0,0,4"'),
        ("num_key_value_heads", 1.0, '"num_key_value_heads" is 1.0, expected 1'),
        ("hidden_size", 200, '"hidden_size" = 200 must be a multiple of 32'),
        ("hc_mult", 65, '"hc_mult" = 65 is implausibly large (at most 64)'),
        ("vocab_size", True, '"vocab_size" must be a non-negative integer, found true'),
    ],
)
def test_values_both_sides_used_to_read_differently(key, value, message):
    d = good()
    d[key] = value
    with pytest.raises(v4flash.V4FlashError) as e:
        validate(d)
    assert str(e.value).startswith("config.json: ") and message in str(e.value), str(e.value)


def test_rope_scaling_betas_are_checked_not_defaulted():
    d = good()
    d["rope_scaling"]["beta_fast"] = "32"
    with pytest.raises(v4flash.V4FlashError, match=r'"rope_scaling.beta_fast" must be a number'):
        validate(d)
    del d["rope_scaling"]["beta_fast"], d["rope_scaling"]["beta_slow"]
    assert validate(d).rope_scaling["beta_fast"] == 32.0
    assert validate(d).rope_scaling["beta_slow"] == 1.0


def test_values_that_are_not_json_are_refused():
    for bad, words in [
        ({**good(), "rms_norm_eps": float("nan")}, "NaN is not a JSON number"),
        ({**good(), 3: 4}, "the key 3 is not a string"),
        ({**good(), "x": object()}, "a value of type object is not a JSON value"),
        ({**good(), "x": 10**400}, "an integer of 401 digits"),
        ([good()], "the top level must be a JSON object"),
    ]:
        with pytest.raises(v4flash.V4FlashError, match=re.escape(words)):
            validate(bad)


def test_the_config_holds_what_the_core_returns():
    cfg = load_config(GOOD)
    d = _core.validate_config(str(GOOD / "config.json"))
    assert set(d) == {f.name for f in dataclasses.fields(Config)}
    assert cfg == Config(**d)
    assert cfg.raw == good()  # the whole file, unknown keys included
    assert cfg.compress_ratios == good()["compress_ratios"]  # as written, the MTP entry too
    kinds = {0: "sliding_attention", 4: "compressed_sparse_attention"}
    assert cfg.layer_types == [
        kinds.get(r, "heavily_compressed_attention")
        for r in cfg.compress_ratios[: cfg.num_hidden_layers]
    ]
    assert cfg.drafter == {"kind": "mtp", "blocks": 1} and cfg.dspark_block_size is None
    assert cfg.rms_norm_eps == 1e-6  # as written, not rounded to f32
    # to_json describes the same model, and so does a Config built by hand
    assert validate(cfg.to_json()) == cfg
    by_hand = dataclasses.replace(cfg, raw={})
    assert expected_tensors(by_hand) == expected_tensors(cfg)


def test_the_published_config_validates_as_the_real_model():
    cfg = validate(published())
    assert (cfg.num_hidden_layers, cfg.n_routed_experts, cfg.hidden_size) == (43, 256, 4096)
    assert cfg.layer_types.count("compressed_sparse_attention") == 21
    assert cfg.layer_types.count("heavily_compressed_attention") == 20
    # every key of the release (test_fixtures keeps the list, as the fixtures copy them)
    from test_fixtures import REAL_CONFIG_KEYS

    assert set(published()) == REAL_CONFIG_KEYS


@pytest.mark.parametrize("name", ["tiny-a", "tiny-b"])
def test_the_table_agrees_with_the_independent_one(name):
    """test_fixtures.py derives the tensor table on its own (with the published dtypes); the
    engine's table must list the same tensors, accept the published dtype first, and give the
    same shapes."""
    raw = json.loads((FIXTURES / name / "config.json").read_text())
    ours = expected_tensors(validate(raw))
    theirs = {n: v for n, v in independent_table(raw).items() if not n.startswith("mtp.")}
    assert sorted(ours) == sorted(theirs)
    for n, (dtype, shape) in theirs.items():
        assert ours[n][0][0] == dtype, n
        assert ours[n][1] == shape, n
    # the drafter's table (first release: MTP block; 0731: DSpark stages) likewise
    drafter = drafter_tensors(validate(raw))
    theirs = {n: v for n, v in independent_table(raw).items() if n.startswith("mtp.")}
    assert drafter and sorted(drafter) == sorted(theirs)
    for n, (dtype, shape) in theirs.items():
        assert drafter[n][0][0] == dtype and drafter[n][1] == shape, n


def test_one_routed_expert_test():
    assert doctor.is_routed_expert is _core.is_routed_expert
    yes = ["layers.0.ffn.experts.0.w1.weight", "layers.42.ffn.experts.255.w2.scale"]
    no = [
        "mtp.0.ffn.experts.0.w1.weight",
        "layers.0.ffn.shared_experts.w1.weight",
        "layers.0.ffn.gate.weight",
        "model.layers.0.ffn.experts.0.w1.weight",
        "layers.0.ffn.experts.0",
    ]
    assert [_core.is_routed_expert(n) for n in yes + no] == [True] * 2 + [False] * 5
    # the planner counts as dense exactly what the test does not call an expert (nor mtp.*)
    ins = doctor.inspect_checkpoint(GOOD, tokenizer=False)
    dense = sum(
        t.nbytes
        for t in ins.tensors.values()
        if not _core.is_routed_expert(t.name) and not t.name.startswith("mtp.")
    )
    assert v4flash.plan(GOOD, ram_gb=2)["dense_bytes"] == dense


def test_real_model_bytes_come_from_the_table():
    m = bench.real_model_bytes()
    assert m["expert_bytes"] == 13_369_344  # docs/checkpoint.md §5
    table = _core.expected_tensors(published())
    assert sum(1 for n, _, _ in table if _core.is_routed_expert(n)) == 43 * 256 * 6
    # a shorter cut of the published model: the same table, fewer layers
    four = bench.real_model_bytes(4)
    assert four["expert_bytes"] == m["expert_bytes"]
    assert four["embed_bytes"] == m["embed_bytes"] == 129280 * 4096 * 2
    assert four["dense_resident_bytes"] < m["dense_resident_bytes"]
    with pytest.raises(ValueError, match="n_layers must be in 1..43"):
        bench.real_model_bytes(44)
    # dense_resident_bytes is the planner's dense part: on a fixture (exactly the table plus
    # mtp.*) the table's dense entries in their published dtypes add up to the plan's
    dense = sum(
        math.prod(shape) * bench.ITEMSIZE[dtypes[0]]
        for name, dtypes, shape in _core.expected_tensors(good())
        if not _core.is_routed_expert(name)
    )
    assert v4flash.plan(GOOD, ram_gb=2)["dense_bytes"] == dense
    assert m["dense_resident_bytes"] / 1e9 == pytest.approx(8.85, abs=0.005)  # architecture §3


def test_doctor_plans_the_context_the_engine_runs_with(capsys):
    """Drift: doctor/info planned for the model's maximum context while the engine runs with
    min(maximum, 65536); both go through the core's resolve_ctx now."""
    from v4flash.cli import main

    mx = good()["max_position_embeddings"]
    assert mx > 65536
    assert main(["info", "--model", str(GOOD), "--ram", "2"]) == 0
    out = capsys.readouterr().out
    assert "session state (ctx 65,536)" in out
    assert v4flash.load(GOOD, ram_gb=2).ctx == 65536
