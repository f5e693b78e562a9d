"""The command line: run / info / doctor on the fixtures and on broken copies, chat driven
through piped stdin (session reuse between turns), and the bundled demo."""

import json
import re
import shutil
import subprocess
import sys

import pytest

import v4flash
from conftest import FIXTURES, main_, model_for
from helpers import cli
from v4flash.chat.conversation import Conversation, Sampling
from v4flash.cli import main as cli_main
from v4flash.config import expected_tensors
from v4flash.doctor import inspect_checkpoint
from v4flash.tokenizer import encode_prompt_ids, load_tokenizer

GREEDY = ["--temperature", "0"]


@pytest.fixture(autouse=True)
def _state_home(tmp_path, monkeypatch):
    """What v4flash remembers (used checkpoints, servers, chat history) goes to a folder of
    the test's own, not the home of whoever runs the tests."""
    monkeypatch.setenv("V4FLASH_HOME", str(tmp_path / "v4flash-home"))


def assert_clean_error(p, *fragments):
    assert p.returncode != 0
    assert "Traceback" not in p.stderr, p.stderr
    assert "v4flash: error:" in p.stderr
    for f in fragments:
        assert f in p.stderr, p.stderr


# --- version, help ----------------------------------------------------------------------------


def test_version():
    p = cli("--version")
    assert p.returncode == 0
    assert p.stdout.strip() == f"v4flash {v4flash.__version__}"


COMMANDS = {
    "chat": "interactive chat",
    "run": "answer one prompt",
    "serve": "HTTP server for OpenAI and Anthropic API clients",
    "info": "describe a checkpoint",
    "doctor": "check a checkpoint",
    "bench": "whole-run benchmark",
    "download": "download a checkpoint from the Hugging Face hub",
}


def test_help_lists_commands():
    p = cli("--help")
    assert p.returncode == 0
    for cmd, text in COMMANDS.items():  # each command on its own line, with what it does
        assert re.search(rf"^\s+{cmd}\s+{re.escape(text)}", p.stdout, re.M), (cmd, p.stdout)


def _help(capsys, *cmd):
    with pytest.raises(SystemExit) as e:
        cli_main([*cmd, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("cmd", list(COMMANDS))
def test_every_command_has_help_with_the_short_flags(capsys, cmd):
    out = _help(capsys, cmd)
    assert out.startswith(f"usage: v4flash {cmd}")
    if cmd == "download":
        assert "--dir DIR" in out and "--no-verify" in out
        return
    assert "-m DIR, --model DIR" in out
    if cmd in ("chat", "run", "serve", "bench"):
        assert "-t N, --threads N" in out and "-c TOKENS, --ctx TOKENS" in out
    if cmd in ("chat", "run", "serve"):
        assert "-n N, --max-tokens N" in out
    if cmd in ("chat", "run"):
        assert "-v, --verbose" in out and "-q, --quiet" in out
    if cmd == "run":
        assert "-p TEXT, --prompt TEXT" in out
    if cmd == "bench":
        assert "-p N, --prompt N" in out and "-n N, --gen N" in out
        assert "--cache-policy" in out
    if cmd == "doctor":
        assert "-t N, --threads N" in out and "--verify" in out


def test_short_flags_mean_the_long_ones():
    from v4flash.cli.options import parser

    p = parser()
    pairs = [
        ("run", ["-m", "D", "-n", "5", "-t", "3", "-c", "512", "-p", "hi", "-q"]),
        (
            "run",
            ["--model", "D", "--max-tokens", "5", "--threads", "3", "--ctx", "512"]
            + ["--prompt", "hi", "--quiet"],
        ),
        ("chat", ["-m", "D", "-n", "5", "-t", "3", "-c", "512", "-v"]),
        (
            "chat",
            ["--model", "D", "--max-tokens", "5", "--threads", "3", "--ctx", "512"] + ["--verbose"],
        ),
        ("bench", ["-m", "D", "-p", "64", "-n", "8", "-t", "3", "-c", "512"]),
        (
            "bench",
            ["--model", "D", "--prompt", "64", "--gen", "8", "--threads", "3"] + ["--ctx", "512"],
        ),
        ("serve", ["-m", "D", "-n", "5", "-t", "3", "-c", "512"]),
        ("serve", ["--model", "D", "--max-tokens", "5", "--threads", "3", "--ctx", "512"]),
        ("info", ["-m", "D", "-c", "512"]),
        ("info", ["--model", "D", "--ctx", "512"]),
    ]
    for (cmd, short), (_, long) in zip(pairs[::2], pairs[1::2]):
        assert p.parse_args([cmd, *short]) == p.parse_args([cmd, *long]), cmd
    a = p.parse_args(["run", "-m", "D", "-n", "5", "-t", "3", "-c", "512", "-p", "hi"])
    assert (a.model, a.max_tokens, a.threads, a.ctx, a.prompt_option) == ("D", 5, 3, 512, "hi")
    a = p.parse_args(["bench", "-p", "64", "-n", "8", "--cache-policy", "lru"])
    assert (a.prompt, a.gen, a.cache_policy) == (64, 8, "lru")
    assert p.parse_args(["bench", "--policy", "lru"]).cache_policy == "lru"  # the old name


# --- run ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tiny-a", "tiny-b"])
def test_run_json_matches_the_api(capsys, name):
    p = main_(
        capsys, "run", "--model", FIXTURES / name, *GREEDY, "--max-tokens", 6, "--json", "Hello"
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    tok = load_tokenizer(FIXTURES / name)
    prompt = encode_prompt_ids(tok, [{"role": "user", "content": "Hello"}])
    assert doc["prompt_ids"] == prompt
    want = model_for(name).generate(prompt, max_new_tokens=6, temperature=0.0)
    assert doc["ids"] == want
    assert doc["text"] == tok.decode(want)
    assert doc["stats"]["prefill_tokens"] == len(prompt)
    assert doc["demo"] is False


def test_run_streams_the_answer_to_stdout():
    args = ("run", "--model", FIXTURES / "tiny-a", *GREEDY, "--max-tokens", 8, "Hi there")
    p = cli(*args)
    assert p.returncode == 0, p.stderr
    j = json.loads(cli(*args, "--json").stdout)
    assert p.stdout == j["content"] + "\n"
    assert "plan:" in p.stderr and "tok/s" in p.stderr  # plan and status go to stderr


def test_run_raw_and_stdin_prompt():
    p = cli(
        "run",
        "--model",
        FIXTURES / "tiny-b",
        "--raw",
        *GREEDY,
        "--max-tokens",
        4,
        "--json",
        input="abc",
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    tok = load_tokenizer(FIXTURES / "tiny-b")
    assert doc["prompt_ids"] == tok.encode("abc")
    assert doc["ids"] == model_for("tiny-b").generate(tok.encode("abc"), max_new_tokens=4)


def test_run_without_model_uses_the_demo(capsys):
    p = main_(capsys, "run", *GREEDY, "--max-tokens", 3, "Hello")
    assert p.returncode == 0, p.stderr
    assert "bundled demo" in p.stderr and "NOT DeepSeek" in p.stderr


def test_run_errors_are_one_line(capsys):
    assert_clean_error(main_(capsys, "run", "--model", FIXTURES / "nope", "Hi"), "nope")
    p = cli("run", "--temperature", "-1", "Hi")
    assert p.returncode == 2 and "temperature" in p.stderr and "Traceback" not in p.stderr
    # argparse errors with the core's message for the sampling knobs (model.sample_params)
    for flag, value, message in [
        ("--top-p", "2", "argument --top-p: top_p must be in (0, 1], got 2"),
        ("--top-k", "-1", "argument --top-k: top_k must be >= 0, got -1"),
        ("--seed", "-1", "argument --seed: seed must be >= 0, got -1"),
        ("--top-p", "x", "argument --top-p: expected a number, got 'x'"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            cli_main(["run", flag, value, "Hi"])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and message in err, err


def test_run_combines_piped_stdin_with_the_prompt():
    args = ("run", "--model", FIXTURES / "tiny-a", *GREEDY, "--max-tokens", 2, "--json")
    tok = load_tokenizer(FIXTURES / "tiny-a")

    def prompt_of(p):
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["prompt_ids"]

    def encoded(text):
        return encode_prompt_ids(tok, [{"role": "user", "content": text}])

    notes = "Line one.\nLine two.\n"
    # the piped text, a blank line, then the instruction
    assert prompt_of(cli(*args, "Summarize", input=notes)) == encoded(
        "Line one.\nLine two.\n\nSummarize"
    )
    assert prompt_of(cli(*args, "-p", "Summarize", input=notes)) == encoded(
        "Line one.\nLine two.\n\nSummarize"
    )
    # stdin alone, the argument alone (an empty pipe adds nothing)
    assert prompt_of(cli(*args, input=notes)) == encoded(notes)
    assert prompt_of(cli(*args, "Summarize", input="")) == encoded("Summarize")
    assert prompt_of(cli(*args, "Summarize")) == encoded("Summarize")  # stdin: /dev/null
    # --raw takes the combined text too
    p = cli(*args, "--raw", "B", input="A")
    assert prompt_of(p) == tok.encode("A\n\nB")


def test_run_prompt_given_twice_or_not_at_all(capsys):
    p = main_(capsys, "run", "-p", "a", "b")
    assert p.returncode == 2 and "give the prompt once" in p.stderr
    p = cli("run", "--model", FIXTURES / "tiny-a")  # stdin is /dev/null: empty
    assert p.returncode == 2 and "the prompt is empty" in p.stderr


def test_run_thinking_ends_the_reasoning_line_before_the_status_line():
    p = cli(
        "run", "--model", FIXTURES / "tiny-a", "--thinking", "--seed", 1, "--max-tokens", 5, "Hi"
    )
    assert p.returncode == 0, p.stderr
    last = p.stderr.splitlines()[-1]
    assert last.startswith("5 tokens · "), p.stderr  # not glued to the reasoning
    assert p.stderr.endswith("\n")


def test_run_quiet_and_verbose(capsys):
    args = ["run", "--model", FIXTURES / "tiny-a", *GREEDY, "--max-tokens", 3, "Hi"]
    normal = main_(capsys, *args)
    assert "plan:" in normal.stderr and "loaded in" in normal.stderr and "tok/s" in normal.stderr
    quiet = main_(capsys, *args, "--quiet")
    assert quiet.returncode == 0 and quiet.stdout == normal.stdout
    assert quiet.stderr == ""
    verbose = main_(capsys, *args, "-v")
    assert verbose.stdout == normal.stdout
    for what in ("plan:", "resident weights:", "expert cache:", "expert reads:", "loaded in"):
        assert what in verbose.stderr, what
    last = verbose.stderr.splitlines()[-1]
    assert last.startswith("prefill ") and "decode 3 tokens in" in last and "MB read" in last
    # --quiet silences the demo notice too (issue 49, friction 8); without it, it is there
    demo = main_(capsys, "run", *GREEDY, "--max-tokens", 2, "-q", "Hi")
    assert demo.returncode == 0 and demo.stderr == ""
    demo = main_(capsys, "run", *GREEDY, "--max-tokens", 2, "Hi")
    assert "NOT DeepSeek" in demo.stderr


def test_one_thread_is_singular(capsys, tmp_path):
    p = main_(capsys, "run", "-m", FIXTURES / "tiny-a", *GREEDY, "-n", 2, "-t", 1, "Hi")
    assert "· 1 thread\n" in p.stderr and "threads" not in p.stderr
    c = cli("chat", "-m", FIXTURES / "tiny-a", "-t", 1, *GREEDY, "-n", 2, input="Hi\n/stats\n")
    assert "· 1 thread" in c.stdout and "1 threads" not in c.stdout


@pytest.mark.parametrize("how", ["missing-shard", "wrong-shape", "bad-config"])
def test_no_plan_line_before_an_error_that_makes_it_moot(capsys, tmp_path, how):
    d, _ = _broken(tmp_path, how)
    p = main_(capsys, "run", "--model", d, "Hi")
    assert_clean_error(p)
    assert "plan:" not in p.stderr and "loaded in" not in p.stderr
    assert p.stderr.count("\n") == 1  # the error and nothing else


def test_a_missing_tokenizer_fails_before_the_load(capsys, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(FIXTURES / "tiny-a", d)
    (d / "tokenizer.json").unlink()
    p = main_(capsys, "run", "--model", d, "Hi")
    assert_clean_error(p, "tokenizer.json")
    assert "plan:" not in p.stderr


# --- info / doctor ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tiny-a", "tiny-b"])
def test_expected_tensor_table_matches_the_fixtures(name):
    ins = inspect_checkpoint(FIXTURES / name, tokenizer=False)
    assert ins.ok, ins.problems
    have = {n for n in ins.tensors if not n.startswith("mtp.")}
    assert set(expected_tensors(ins.config)) == have


@pytest.mark.parametrize("name", ["tiny-a", "tiny-b"])
def test_info_and_doctor_pass_on_the_fixtures(capsys, name):
    p = main_(capsys, "info", "--model", FIXTURES / name, "--ram", 2, "--ctx", 4096)
    assert p.returncode == 0, p.stderr
    assert "checkpoint ok" in p.stdout and "expert cache" in p.stdout
    p = main_(capsys, "doctor", "--model", FIXTURES / name)
    assert p.returncode == 0, p.stderr
    assert "FAIL" not in p.stdout and "all checks passed" in p.stdout


def test_info_plan_table_names_every_part_of_the_total(capsys):
    plan = v4flash.plan(FIXTURES / "tiny-a", ram_gb=1)
    p = main_(capsys, "info", "-m", FIXTURES / "tiny-a", "--ram", 1)
    assert p.returncode == 0, p.stderr
    parts = ["resident weights", "session state", "scratch", "overhead", "expert cache"]
    if plan.get("span_bytes"):
        parts.append(f"prefill span ({plan['prefill_span']:,} tokens)")
    for what in parts:
        assert what in p.stdout, what


def test_info_without_model_describes_the_demo(capsys):
    p = main_(capsys, "info")
    assert p.returncode == 0, p.stderr
    assert "bundled demo" in p.stderr and "NOT DeepSeek" in p.stderr
    assert "DEMO" in p.stdout and "checkpoint ok" in p.stdout


def _broken(tmp_path, how):
    d = tmp_path / how
    shutil.copytree(FIXTURES / "tiny-a", d)
    index = d / "model.safetensors.index.json"
    if how == "truncated":
        shard = d / "model-00002-of-00002.safetensors"
        shard.write_bytes(shard.read_bytes()[:-1000])
        return d, ["truncated", "model-00002-of-00002.safetensors"]
    if how == "unindexed":
        doc = json.loads(index.read_text())
        del doc["weight_map"]["layers.1.attn.wkv.weight"]
        index.write_text(json.dumps(doc))
        return d, ["layers.1.attn.wkv.weight", "not in the index"]
    if how == "missing-shard":
        (d / "model-00001-of-00002.safetensors").unlink()
        return d, ["model-00001-of-00002.safetensors", "missing"]
    if how == "wrong-shape":
        cfg = json.loads((d / "config.json").read_text())
        cfg["moe_intermediate_size"] = 64
        (d / "config.json").write_text(json.dumps(cfg))
        return d, ["wrong dtype/shape", "expected"]
    if how == "bad-config":
        (d / "config.json").write_text("{not json")
        return d, ["config.json", "not valid JSON"]
    raise AssertionError(how)


@pytest.mark.parametrize(
    "how", ["truncated", "unindexed", "missing-shard", "wrong-shape", "bad-config"]
)
def test_doctor_and_info_reject_broken_checkpoints(capsys, tmp_path, how):
    d, fragments = _broken(tmp_path, how)
    p = main_(capsys, "doctor", "--model", d)
    assert_clean_error(p, *fragments)
    assert "FAIL" in p.stdout
    assert_clean_error(main_(capsys, "info", "--model", d), *fragments)
    if how == "truncated":  # and the subprocess: exit code, one line on stderr
        assert_clean_error(cli("doctor", "--model", d), *fragments)


def test_run_rejects_a_broken_checkpoint(capsys, tmp_path):
    d, _ = _broken(tmp_path, "missing-shard")
    assert_clean_error(main_(capsys, "run", "--model", d, "Hi"), "model-00001-of-00002")


# --- chat through piped stdin --------------------------------------------------------------------


def _chat(tmp_path, lines, *extra, model="tiny-a"):
    stats = tmp_path / "stats.json"
    p = cli(
        "chat",
        "--model",
        FIXTURES / model,
        *GREEDY,
        "--max-tokens",
        6,
        "--stats-json",
        stats,
        *extra,
        input="\n".join(lines) + "\n",
    )
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    return p, json.loads(stats.read_text())


QUESTIONS = ["Hello there", "What is 2+2?", "Thanks!"]


def test_chat_three_turns_prefill_only_the_new_turn(tmp_path):
    p, doc = _chat(tmp_path, QUESTIONS + ["/stats"])
    turns = doc["turns"]
    assert [t["reuse"] for t in turns] == ["new", "append", "append"]
    tok = load_tokenizer(FIXTURES / "tiny-a")
    for prev, t, q in zip(turns, turns[1:], QUESTIONS[1:]):
        # exactly: the EOS closing the previous answer (unless it ended with one) + the new turn
        new_turn = tok.encode(f"<｜User｜>{q}<｜Assistant｜></think>")
        eos = 0 if prev["stop"] == "eos" else 1
        assert t["prefill_tokens"] == len(new_turn) + eos
        assert t["reused_tokens"] == prev["session_tokens"]
        assert t["prompt_tokens"] == t["reused_tokens"] + t["prefill_tokens"]
    assert doc["reuse"]["reset"] == 0
    assert "you › What is 2+2?" in p.stdout and "assistant ›" in p.stdout
    # /stats prints the per-turn table and the engine line, and nothing else
    assert "turns" in p.stdout and "engine: prefill" in p.stdout
    assert "stats-json" not in p.stdout
    assert "tok/s" in p.stdout


def test_chat_thinking_mode_rolls_back_to_the_assistant_snapshot(tmp_path):
    _, doc = _chat(tmp_path, QUESTIONS, "--thinking")
    turns = doc["turns"]
    assert [t["reuse"] for t in turns] == ["new", "rollback", "rollback"]
    for prev, t in zip(turns, turns[1:]):
        # the previous prompt ended "<｜Assistant｜><think>": the snapshot is before <think>
        assert t["reused_tokens"] == prev["prompt_tokens"] - 1
        assert t["prefill_tokens"] == t["prompt_tokens"] - t["reused_tokens"]


def test_chat_commands(tmp_path):
    lines = [
        "Hi",
        "/think on",
        "Why?",
        "/think off",
        "And?",
        "/system Be brief.",
        "Ok",
        "/reset",
        "Again",
        "/nonsense",
        "/exit",
        "never sent",
    ]
    p, doc = _chat(tmp_path, lines)
    assert [t["reuse"] for t in doc["turns"]] == ["new", "append", "rollback", "reset", "new"]
    assert [t["mode"] for t in doc["turns"]] == ["chat", "thinking", "chat", "chat", "chat"]
    assert "thinking mode on" in p.stdout and "system prompt set" in p.stdout
    assert "unknown command" in p.stdout
    assert "never sent" not in p.stdout


def test_chat_without_model_says_it_is_the_demo():
    p = cli("chat", *GREEDY, "--max-tokens", 2, input="Hi\n")
    assert p.returncode == 0, p.stderr
    assert "NOT DeepSeek" in p.stderr and "DEMO" in p.stdout


# --- the conversation state machine in-process ---------------------------------------------------


@pytest.mark.parametrize("thinking", [False, True])
def test_session_reuse_gives_the_same_tokens_as_a_fresh_prefill(thinking):
    m = model_for("tiny-a")
    tok = load_tokenizer(FIXTURES / "tiny-a")
    conv = Conversation(m, tok, thinking=thinking, system="Be brief.")
    s = Sampling(temperature=0.0, max_tokens=5)
    for q in QUESTIONS:
        r = conv.respond(q, s)
        fresh = m.session().generate(r.prompt_ids, max_new_tokens=5, temperature=0.0)
        assert r.ids == fresh
        assert conv.session.tokens == r.prompt_ids + r.ids


def test_ctrl_c_keeps_the_partial_answer_and_the_conversation():
    m = model_for("tiny-a")
    tok = load_tokenizer(FIXTURES / "tiny-a")
    conv = Conversation(m, tok)
    seen = []

    def on_text(kind, text):
        seen.append(text)
        if len(seen) == 3:
            raise KeyboardInterrupt

    r = conv.respond("Hello", Sampling(temperature=0.0, max_tokens=20), on_text=on_text)
    assert r.stop == "interrupted" and 0 < len(r.ids) < 20
    assert conv.messages[-1]["role"] == "assistant"
    r2 = conv.respond("Go on", Sampling(temperature=0.0, max_tokens=3))
    assert r2.stats["reuse"] == "append" and r2.stop != "interrupted"


@pytest.mark.skipif(sys.platform == "win32", reason="needs SIGINT")
def test_sigint_stops_the_answer_and_the_chat_goes_on():
    import signal
    import threading
    import time

    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "v4flash",
            "chat",
            "--model",
            str(FIXTURES / "tiny-a"),
            "--max-tokens",
            "100000",
            "--seed",
            "1",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
    )
    out = []
    # the answer streams without newlines: read characters, not lines
    reader = threading.Thread(target=lambda: out.extend(iter(lambda: p.stdout.read(1), "")))
    reader.start()
    try:
        p.stdin.write("Hello\n")
        p.stdin.flush()
        deadline = time.time() + 60
        while "assistant ›" not in "".join(out) and time.time() < deadline:
            time.sleep(0.05)
        # a signal landing between two steps can be absorbed by the engine (see report)
        while "stopped" not in "".join(out) and time.time() < deadline:
            p.send_signal(signal.SIGINT)
            time.sleep(0.5)
        p.stdin.write("/stats\n/exit\n")
        p.stdin.flush()
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
        reader.join()
    text = "".join(out)
    assert p.returncode == 0, p.stderr.read()
    assert "stopped; the partial answer stays" in text and "interrupted" in text
    assert "engine: prefill" in text  # /stats ran after the interrupted answer


# --- /save, /load and --stop ------------------------------------------------------------------


def test_chat_save_and_load(tmp_path):
    saved, bad = tmp_path / "conv.json", tmp_path / "bad.json"
    bad.write_text(json.dumps([{"role": "robot", "content": "x"}]))
    lines = [
        "Hello there",
        f"/save {saved}",
        "/reset",
        f"/load {tmp_path / 'missing.json'}",
        f"/load {bad}",
        f"/load {saved}",
        "What is 2+2?",
        "/exit",
    ]
    p, doc = _chat(tmp_path, lines, "--system", "Be brief.")
    msgs = json.loads(saved.read_text(encoding="utf-8"))
    assert [m["role"] for m in msgs] == ["system", "user", "assistant"]
    assert msgs[0]["content"] == "Be brief." and msgs[1]["content"] == "Hello there"
    assert "saved 3 messages" in p.stdout and "loaded 3 messages" in p.stdout
    assert p.stdout.count("cannot load") == 2 and "robot" in p.stdout
    first, second = doc["turns"]
    assert second["reuse"] == "new"  # loading starts a new session: the next turn prefills all
    tok = load_tokenizer(FIXTURES / "tiny-a")
    want = encode_prompt_ids(tok, msgs + [{"role": "user", "content": "What is 2+2?"}])
    assert second["prompt_tokens"] == len(want)


def test_run_stop_string(capsys):
    args = ["run", "--model", FIXTURES / "tiny-a", *GREEDY, "--max-tokens", 40, "--json", "Hi"]
    full = json.loads(main_(capsys, *args).stdout)
    tok = load_tokenizer(FIXTURES / "tiny-a")
    dec = tok.stream_decoder()
    pieces = [dec.push(t) for t in full["ids"]]
    # a stop string spanning two tokens (the end of one, the start of the next)
    at = 0
    for i in range(len(pieces) - 1):
        at += len(pieces[i])
        stop = pieces[i][-2:] + pieces[i + 1][:2]
        start = at - len(pieces[i][-2:])
        if (
            len(stop) >= 2
            and start >= 3
            and "\ufffd" not in stop
            and full["text"].find(stop) == start
        ):
            break
    else:
        raise AssertionError("no spanning stop string")
    doc = json.loads(main_(capsys, *args, "--stop", stop, "--stop", "@@").stdout)
    assert doc["text"] == doc["content"] == full["text"][:start]
    assert doc["stop"] == "stop" and len(doc["ids"]) == i + 2
    out = main_(capsys, *args[:-2], "--stop", stop, "Hi")
    assert out.returncode == 0 and out.stdout == full["text"][:start] + "\n"
    assert "stop" in out.stderr  # the status line says why it ended


def test_chat_stop_keeps_the_cut_answer(tmp_path):
    saved = tmp_path / "conv.json"
    p, doc = _chat(tmp_path, ["Hello there", f"/save {saved}", "Again"], "--stop", " ")
    answer = json.loads(saved.read_text(encoding="utf-8"))[1]
    assert " " not in answer["content"]  # cut before the first space
    assert doc["turns"][0]["stop"] == "stop" and "· stop]" in p.stdout
    assert doc["turns"][1]["reuse"] == "rollback"  # the session held tokens past the cut


def test_stop_must_not_be_empty():
    p = cli("run", "--stop", "", "Hi")
    assert p.returncode == 2 and "stop string cannot be empty" in p.stderr
