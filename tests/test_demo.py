"""The bundled demo is a trained model: the engine reproduces transformers on it, and what it
writes is English-looking text, not noise.

``fixtures/make_demo.py`` trains it and records, in ``fixtures/demo.ref.json``, transformers'
float32 greedy answers (with each step's top-k logits) and its loss on held-out text. The demo
ships inside the package; the tests load it from there, as a user's ``run`` does.
"""

import json
import math
import re

import numpy as np
import pytest

import v4flash
from conftest import FIXTURES, main_
from v4flash.demo import demo_path
from v4flash.encoding import encode_messages

REF = json.loads((FIXTURES / "demo.ref.json").read_text())
CASES = REF["cases"]
REL_TOL = 1e-4  # logits: float32 summation order only, relative to the row's largest logit


@pytest.fixture(scope="module")
def demo():
    path = demo_path()
    assert path is not None, "this installation does not carry the demo"
    return v4flash.load(path)


def test_the_reference_describes_the_shipped_demo(demo):
    # the prompts were tokenized by the demo's own tokenizer, as the CLI does
    for case in CASES:
        prompt = encode_messages(
            [{"role": "user", "content": case["prompt"]}], thinking_mode="chat"
        )
        assert demo.tokenizer.encode(prompt) == case["ids"]
        # the recorded greedy choices are unambiguous in float32
        assert case["greedy_min_margin_rel"] > 10 * REL_TOL, case["prompt"]


@pytest.mark.parametrize("case", CASES, ids=[c["prompt"] for c in CASES])
def test_greedy_answers_match_transformers(demo, case):
    new = demo.generate(case["ids"], max_new_tokens=len(case["greedy_new"]))
    assert new == case["greedy_new"]


@pytest.mark.parametrize("case", CASES, ids=[c["prompt"] for c in CASES])
def test_every_step_logits_match_transformers(demo, case):
    s = demo.session()
    s.feed(case["ids"])
    tol = REL_TOL * case["max_abs_logit"]
    for step, (ids, vals) in enumerate(zip(case["topk_ids"], case["topk_logits"])):
        logits = s.last_logits()
        np.testing.assert_allclose(logits[ids], vals, rtol=0, atol=tol, err_msg=f"step {step}")
        assert int(np.argmax(logits)) == case["greedy_new"][step]
        if step + 1 < len(case["greedy_new"]):
            s.feed([case["greedy_new"][step]])


def _mean_nll(logits: np.ndarray, ids) -> float:
    lg = logits[:-1].astype(np.float64)
    m = lg.max(axis=-1, keepdims=True)
    logz = m[:, 0] + np.log(np.exp(lg - m).sum(axis=-1))
    return float(np.mean(logz - lg[np.arange(len(ids) - 1), ids[1:]]))


def test_held_out_text_is_predicted_as_transformers_predicts_it(demo):
    ids = REF["held_out"]["ids"]
    nll = _mean_nll(demo.logits(ids), ids)
    assert abs(nll - REF["held_out"]["mean_nll"]) < 1e-3
    # ...and far better than chance: random weights sit at about log(vocab) or above
    assert nll < 0.7 * math.log(demo.tokenizer.vocab_size), nll


def test_run_prints_what_transformers_answered(capsys):
    case = next(c for c in CASES if c["prompt"] == "Once upon a time")
    n = len(case["greedy_new"])
    r = main_(capsys, "run", "--temperature", "0", "-n", n, "-q", case["prompt"])
    assert r.returncode == 0, r.stderr
    expected = case["text"].replace("<｜end▁of▁sentence｜>", "")
    assert r.stdout.strip() == expected.strip()
    # English-looking: mostly words made of letters
    words = r.stdout.split()
    alpha = [w for w in words if re.fullmatch(r"[\"'(]?[A-Za-z][A-Za-z'-]*[.,;:!?\"')]*", w)]
    assert len(words) >= 5 and len(alpha) >= 0.8 * len(words), r.stdout
