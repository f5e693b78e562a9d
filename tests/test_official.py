"""`official` numerics held to a torch reference layer by layer, and the layer probe it uses.

The reference (`fixtures/make_official_ref.py`, run by hand with torch + transformers) is
transformers' float32 DeepseekV4ForCausalLM with DeepSeek's quantization steps added by hooks;
it records each layer's input and output streams for one prompt per fixture. Here each engine
layer is fed the reference's input and its output is compared with the reference's. A whole-
model comparison would not be meaningful: a value on a rounding boundary flips, and the flip
grows through the layers; fed the reference's input, flips stay local and rare.
"""

import numpy as np
import pytest

import v4flash
from conftest import FIXTURE_NAMES, FIXTURES, model_for


def _chain(model, ids):
    """Every layer through the probe, each fed the previous one's output."""
    x, sels = None, {}
    for layer in range(model.config.num_hidden_layers):
        x, sel = model._core._layer_probe(layer, ids, x)
        if sel is not None:
            sels[layer] = sel
    return x, sels


@pytest.mark.parametrize("mode", ["exact", "official"])
@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_the_layer_probe_chained_is_the_forward_pass(name, mode):
    model = model_for(name, numerics=mode)
    ids = [int(i) for i in np.random.default_rng(5).integers(2, 100, size=45)]
    x, sels = _chain(model, ids)
    logits = model._core._probe_logits(x, list(range(len(ids))))
    assert np.array_equal(logits, model.logits(ids))
    kinds = model.config.layer_types
    assert sorted(sels) == [i for i, k in enumerate(kinds) if k == "compressed_sparse_attention"]
    k = model.config.index_topk
    for sel in sels.values():
        assert len(sel) == len(ids)
        for t, s in enumerate(sel):
            visible = (t + 1) // 4
            assert s == sorted(s) and len(s) == min(k, visible) and all(e < visible for e in s)


def test_the_layer_probe_rejects_bad_input():
    core = model_for("tiny-a")._core
    with pytest.raises(ValueError, match="layer 99 out of range"):
        core._layer_probe(99, [3, 4])
    with pytest.raises(ValueError, match="expected 2 ids"):
        core._layer_probe(0, [3, 4], np.zeros((2, 7), dtype=np.float32))
    with pytest.raises(ValueError):
        core._layer_probe(0, [3, 10**6])
    with pytest.raises(ValueError):
        core._layer_probe(0, [])
    with pytest.raises(ValueError, match="out of range"):
        core._probe_logits(np.zeros((1, 4 * 192), dtype=np.float32), [1])
