"""Sessions that survive a restart: ``Session.save`` / ``Model.load_session`` give back a
session that continues bit for bit (after a prefill, a generation, a rollback; in another
process too), files of another model or damaged ones are refused with what is wrong, and
``chat --session FILE`` resumes a conversation. The format's own checks have cargo tests in
rust/model/session/file.rs."""

import json
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import FIXTURES, model_for
from v4flash.chat import Conversation, Sampling
from v4flash.tokenizer import load_tokenizer

SAMPLING = dict(temperature=1.0, top_p=0.9, top_k=50, seed=11, stop_ids=[])


def _ids(m, n, salt=0):
    return [(i * 7 + salt * 13 + 3) % m.config.vocab_size for i in range(n)]


def _same_future(a, b):
    """``a`` and ``b`` hold the same sequence and continue identically, bit for bit."""
    assert a.tokens == b.tokens and a.position == b.position
    la, lb = a.last_logits(), b.last_logits()
    assert (la is None) == (lb is None)
    if la is not None:
        assert la.tobytes() == lb.tobytes()
    assert a.generate([], max_new_tokens=6, **SAMPLING) == b.generate(
        [], max_new_tokens=6, **SAMPLING
    )
    more = _ids(a._model, 9, 1)
    a.feed(more)
    b.feed(more)
    assert a.last_logits().tobytes() == b.last_logits().tobytes()


def _round_trip(m, s, path, **kw):
    n = s.save(path, metadata={"who": "test", "n": [1, 2]}, **kw)
    assert n == path.stat().st_size
    t = m.load_session(path)
    assert t.metadata == {"who": "test", "n": [1, 2]}
    return t


@pytest.mark.parametrize("name", ["tiny-a", "tiny-b"])
def test_round_trip_is_bit_identical_after_prefill_generate_and_rollback(tmp_path, name):
    m = model_for(name)
    f = tmp_path / "s.v4session"
    for n in (1, 6, 23, 41):  # around the sliding windows and the compression ratios
        prompt = _ids(m, n)
        a = m.session()
        a.feed(prompt)
        _same_future(a, _round_trip(m, a, f))

        a = m.session()
        a.generate(prompt, max_new_tokens=4, **SAMPLING)  # a sampled token is pending
        assert a.last_logits() is None
        _same_future(a, _round_trip(m, a, f))

        a = m.session()
        a.feed(prompt)
        snap = a.snapshot()
        a.generate([], max_new_tokens=5, **SAMPLING)
        a.rollback(snap)
        _same_future(a, _round_trip(m, a, f))


def test_a_snapshot_can_be_saved_and_a_restored_session_equals_a_fresh_one(tmp_path):
    m = model_for("tiny-a")
    f = tmp_path / "s.v4session"
    a = m.session()
    a.feed(_ids(m, 17))
    snap = a.snapshot()
    a.generate(_ids(m, 5, 2), max_new_tokens=3, **SAMPLING)
    b = _round_trip(m, a, f, snapshot=snap)
    assert b.position == snap.position
    fresh = m.session()
    fresh.feed(_ids(m, 17))
    _same_future(fresh, b)
    # the greedy answer of a restored session is the never-saved one
    c = m.session()
    c.feed(_ids(m, 30))
    c.save(f)
    d = m.load_session(f)
    assert d.metadata is None
    assert d.generate([], max_new_tokens=8) == c.generate([], max_new_tokens=8)


def test_a_session_survives_a_restart(tmp_path):
    """Saved by another process (another model object, another run), continued here."""
    f = tmp_path / "s.v4session"
    script = textwrap.dedent(
        f"""
        import v4flash
        m = v4flash.load({str(FIXTURES / "tiny-b")!r})
        s = m.session()
        s.feed([(i * 7 + 3) % 600 for i in range(37)])
        s.generate([], max_new_tokens=3, temperature=1.0, top_p=0.9, top_k=50, seed=11,
                   stop_ids=[])
        s.save({str(f)!r}, metadata={{"pid": "other"}})
        """
    )
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    m = model_for("tiny-b")
    here = m.session()
    here.feed([(i * 7 + 3) % 600 for i in range(37)])
    here.generate([], max_new_tokens=3, **SAMPLING)
    there = m.load_session(f)
    assert there.metadata == {"pid": "other"}
    _same_future(here, there)


def _saved(tmp_path, name="tiny-a", n=21):
    m = model_for(name)
    s = m.session()
    s.feed(_ids(m, n))
    f = tmp_path / "good.v4session"
    s.save(f)
    return f, f.read_bytes()


def _refused(m, path, data, *fragments):
    path.write_bytes(data)
    with pytest.raises(ValueError) as e:
        m.load_session(path)
    msg = str(e.value)
    assert str(path) in msg, msg
    for frag in fragments:
        assert frag in msg, msg
    return msg


def test_damaged_files_are_refused_with_what_is_wrong(tmp_path):
    m = model_for("tiny-a")
    _, good = _saved(tmp_path)
    bad = tmp_path / "bad.v4session"
    for cut in (0, 7, 100, len(good) // 2, len(good) - 1):
        _refused(m, bad, good[:cut], "truncated")
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x40
    _refused(m, bad, bytes(flipped), "checksum mismatch", "corrupted")
    flipped = bytearray(good)
    flipped[20] ^= 0x01  # inside the header
    _refused(m, bad, bytes(flipped), "header checksum mismatch")
    _refused(m, bad, b"GGUF" + good[4:], "not a v4flash session file")
    _refused(m, bad, json.dumps({"messages": []}).encode(), "not a v4flash session file")
    _refused(m, bad, good[:8] + (7).to_bytes(4, "little") + good[12:], "format version 7")
    with pytest.raises(FileNotFoundError):
        m.load_session(tmp_path / "missing.v4session")


def test_a_file_of_another_model_is_refused_naming_what_differs(tmp_path):
    f, good = _saved(tmp_path, "tiny-a")
    msg = _refused(model_for("tiny-b"), f, good, "saved for a model with")
    assert "hidden_size 192, this one has 128" in msg
    fast = model_for("tiny-a", numerics="fast")
    _refused(fast, f, good, "numerics exact, this model runs fast")
    short = model_for("tiny-a", ctx=16)
    _refused(short, f, good, "21 tokens, more than this model's context of 16")
    # the right model still loads it
    model_for("tiny-a").load_session(f)


def test_save_checks_its_arguments(tmp_path):
    m = model_for("tiny-a")
    s = m.session()
    s.feed([1, 2, 3])
    with pytest.raises(ValueError, match="JSON-serializable"):
        s.save(tmp_path / "x", metadata={"f": object()})
    with pytest.raises(ValueError, match="is a directory"):
        s.save(tmp_path)
    other = m.session()
    other.feed([4, 5])
    with pytest.raises(ValueError, match="does not belong"):
        s.save(tmp_path / "x", snapshot=other.snapshot())
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing left behind


# --- chat ------------------------------------------------------------------------------------

QUESTIONS = ["Hello there", "What is 2+2?", "Thanks!"]


@pytest.mark.parametrize("name", ["tiny-a", "tiny-b"])
@pytest.mark.parametrize("thinking", [False, True])
def test_a_resumed_conversation_answers_as_the_uninterrupted_one(tmp_path, name, thinking):
    m = model_for(name)
    tok = load_tokenizer(FIXTURES / name)
    s = Sampling(temperature=0.0, max_tokens=5)
    whole = Conversation(m, tok, thinking=thinking, system="Be brief.")
    want = [whole.respond(q, s) for q in QUESTIONS]

    f = tmp_path / "conv.v4session"
    first = Conversation(m, tok, thinking=thinking, system="Be brief.")
    first.respond(QUESTIONS[0], s)
    first.save_session(f)
    # a new conversation object, as a new process has
    later = Conversation(m, tok)
    assert later.resume(f) == 2
    assert (later.system, later.thinking) == ("Be brief.", thinking)
    for q, w in zip(QUESTIONS[1:], want[1:]):
        r = later.respond(q, s)
        assert r.ids == w.ids and r.prompt_ids == w.prompt_ids
    r2 = later.turns[0]
    w2 = whole.turns[1]
    # nothing before the new turn is prefilled again
    assert r2["reuse"] == "append"
    assert (r2["reused_tokens"], r2["prefill_tokens"]) == (
        w2["reused_tokens"],
        w2["prefill_tokens"],
    )
    assert later.messages == whole.messages


def test_a_conversation_resumed_from_a_bare_session_starts_over(tmp_path):
    m = model_for("tiny-a")
    tok = load_tokenizer(FIXTURES / "tiny-a")
    s = m.session()
    s.feed([1, 2, 3])
    f = tmp_path / "bare.v4session"
    s.save(f)
    conv = Conversation(m, tok)
    assert conv.resume(f) == 0
    r = conv.respond("Hi", Sampling(temperature=0.0, max_tokens=3))
    assert r.stats["reuse"] == "reset"
    assert r.ids == m.session().generate(r.prompt_ids, max_new_tokens=3, temperature=0.0)


def _chat(tmp_path, lines, *extra, model="tiny-a"):
    stats = tmp_path / "stats.json"
    if stats.exists():
        stats.unlink()
    p = subprocess.run(
        [sys.executable, "-m", "v4flash", "chat", "--model", str(FIXTURES / model)]
        + ["--temperature", "0", "--max-tokens", "6", "--stats-json", str(stats)]
        + [str(x) for x in extra],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
    )
    assert "Traceback" not in p.stderr, p.stderr
    return p, (json.loads(stats.read_text()) if stats.exists() else None)


def _last_answer(out):
    return re.findall(r"assistant › (.*?)\n\[\d", out, re.S)[-1]


@pytest.mark.parametrize("thinking", [False, True])
def test_chat_session_resumes_the_conversation_through_piped_stdin(tmp_path, thinking):
    mode = ["--thinking"] if thinking else []
    p, whole = _chat(tmp_path, QUESTIONS[:2], *mode)
    assert p.returncode == 0, p.stderr

    f = tmp_path / "conv.v4session"
    p1, _ = _chat(tmp_path, QUESTIONS[:1], "--session", f, *mode)
    assert p1.returncode == 0, p1.stderr
    assert "new session" in p1.stdout and f"session saved to {f}" in p1.stdout
    # the second run: the mode comes from the file
    p2, resumed = _chat(tmp_path, QUESTIONS[1:2] + ["/exit"], "--session", f)
    assert p2.returncode == 0, p2.stderr
    assert f"resumed 2 messages from {f}" in p2.stdout
    assert ("thinking mode" if thinking else "chat mode") in p2.stdout
    t, w = resumed["turns"][0], whole["turns"][1]
    assert t["reuse"] == "append"
    assert (t["reused_tokens"], t["prefill_tokens"]) == (w["reused_tokens"], w["prefill_tokens"])
    assert _last_answer(p2.stdout) == _last_answer(p.stdout)
    # saved again at exit: a third run holds all four messages
    p3, _ = _chat(tmp_path, ["/exit"], "--session", f)
    assert "resumed 4 messages" in p3.stdout


def test_chat_session_refuses_a_file_it_cannot_use_and_keeps_it(tmp_path):
    f = tmp_path / "conv.v4session"
    p, _ = _chat(tmp_path, QUESTIONS[:1], "--session", f)
    assert p.returncode == 0, p.stderr
    before = f.read_bytes()
    p, _ = _chat(tmp_path, QUESTIONS[1:2], "--session", f, model="tiny-b")
    assert p.returncode == 1
    assert "v4flash: error:" in p.stderr and "hidden_size 192, this one has 128" in p.stderr
    assert f.read_bytes() == before
    f.write_bytes(before[:-10])
    p, _ = _chat(tmp_path, QUESTIONS[1:2], "--session", f)
    assert p.returncode == 1 and "truncated" in p.stderr
    assert f.read_bytes() == before[:-10]
