"""Every broken checkpoint from ``make_bad_checkpoints`` ends in its own clear error: the right
exception type, a message naming the file / tensor / key and what was expected, never a panic
(``pyo3_runtime.PanicException`` derives from BaseException, so ``pytest.raises`` with an
Exception subclass lets it through and the test fails)."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import v4flash
from make_bad_checkpoints import CASES, make
from v4flash import _core
from v4flash.tokenizer import load_tokenizer

EXC = {
    "V4FlashError": v4flash.V4FlashError,
    "FileNotFoundError": FileNotFoundError,
    "OSError": OSError,
    "PermissionError": PermissionError,
    "ValueError": ValueError,
}
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
# As root, file modes do not bind (CAP_DAC_OVERRIDE); setpriv (util-linux) runs a child with
# every capability dropped, so the unreadable-file cases still run for real.
SETPRIV = shutil.which("setpriv") if IS_ROOT else None

_CHILD = textwrap.dedent(
    """
    import sys, v4flash
    from v4flash import _core
    from v4flash.tokenizer import load_tokenizer
    stage, path = sys.argv[1], sys.argv[2]
    try:
        if stage == "load":
            v4flash.load(path)
        elif stage == "core":
            _core.Model.load(path)
        elif stage == "tokenizer":
            load_tokenizer(path)
        else:
            m = v4flash.load(path, expert_cache_mb=1e-6)
            m.logits(list(range(0, 40)))
    except BaseException as e:
        print(type(e).__name__)
        print(str(e))
    else:
        print("NO ERROR")
    """
)


def _run_without_capabilities(c, path):
    """Runs the case in a child without capabilities; returns (exception type name, message)."""
    r = subprocess.run(
        [SETPRIV, "--bounding-set=-all", "--inh-caps=-all", "--", sys.executable, "-c", _CHILD]
        + [c.stage, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    name, _, msg = r.stdout.partition("\n")
    return name.strip(), msg


def test_there_are_at_least_25_distinct_cases():
    assert len({c.name.split("[")[0] for c in CASES}) >= 25
    assert len({c.name for c in CASES}) == len(CASES)


def _run(c, path):
    if c.stage == "load":
        v4flash.load(path)
    elif c.stage == "core":
        _core.Model.load(str(path))
    elif c.stage == "tokenizer":
        load_tokenizer(path)
    elif c.stage == "run":
        m = v4flash.load(path, expert_cache_mb=1e-6)
        m.logits(list(range(0, 40)))
    else:
        raise AssertionError(c.stage)


@pytest.mark.parametrize("c", CASES, ids=[c.name for c in CASES])
def test_bad_checkpoint_gives_clear_error(c, tmp_path):
    if "non-root" in c.needs and IS_ROOT and not SETPRIV:
        pytest.skip("root reads files whatever their mode, and setpriv is missing")
    if "fifo" in c.needs and not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    path = make(c, tmp_path / "ck")
    if "non-root" in c.needs and IS_ROOT:
        name, msg = _run_without_capabilities(c, path)
        assert name == c.exc, f"{c.name}: got {name}: {msg}"
        for w in c.words:
            assert w in msg, f"{c.name}: {w!r} not in {msg!r}"
        return
    exc = EXC[c.exc]
    with pytest.raises(exc) as ei:
        _run(c, path)
    # the exact type, not a broader one (an OSError must not pass for a V4FlashError)
    if c.exc == "OSError":
        assert type(ei.value) is OSError, repr(ei.value)
    msg = str(ei.value)
    for w in c.words:
        assert w in msg, f"{c.name}: {w!r} not in {msg!r}"
    assert "panicked" not in msg and "internal error" not in msg, msg


# Defects of the file structure: the reader alone (``_core.open_checkpoint``: no config, no
# weights read) must reject them, before anything is loaded or computed.
READER_CASES = {
    "truncated_shard", "truncated_inside_header", "shard_shorter_than_prefix", "empty_shard",
    "header_len_past_eof", "header_len_absurd", "header_not_json", "header_not_utf8",
    "header_not_object", "not_safetensors_at_all", "offsets_past_end", "offsets_end_before_begin",
    "offsets_overlap", "offsets_hole", "trailing_bytes", "byte_len_vs_shape", "unknown_dtype",
    "negative_dimension", "entry_missing_offsets", "duplicate_name_in_header", "missing_shard",
    "index_wrong_shard", "index_names_absent_tensor", "tensor_not_in_index",
    "duplicate_across_shards", "index_not_json", "index_no_weight_map", "index_path_traversal",
    "shard_is_directory", "shard_is_fifo", "no_index_no_single_file",
}  # fmt: skip


@pytest.mark.parametrize("c", [c for c in CASES if c.name in READER_CASES], ids=lambda c: c.name)
def test_file_structure_defects_fail_in_the_reader(c, tmp_path):
    path = make(c, tmp_path / "ck")
    with pytest.raises(EXC[c.exc]) as ei:
        _core.open_checkpoint(str(path))
    for w in c.words:
        assert w in str(ei.value), (c.name, w, str(ei.value))
