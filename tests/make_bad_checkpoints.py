"""Derives broken checkpoints from the good fixture ``fixtures/tiny-a`` at test time.

Each case is a function that edits a fresh copy of the fixture in place (shard bytes, header
JSON, the index, config.json, tokenizer.json, file modes) plus what it must produce: the
exception type, the words the message must contain, and the stage that raises it:

- ``load``: ``v4flash.load(dir)`` (``load_config``, which validates through the core, then the
  Rust reader and loader)
- ``core``: ``v4flash._core.Model.load(dir)`` directly (the engine without Python first)
- ``run``: loading succeeds, the error comes from the first forward pass (lazily read experts)
- ``tokenizer``: ``v4flash.tokenizer.load_tokenizer(dir)``

Run as a script to write every case under a directory for manual inspection:
``python tests/make_bad_checkpoints.py OUT_DIR``.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
GOOD = ROOT / "fixtures" / "tiny-a"
S1 = "model-00001-of-00002.safetensors"
S2 = "model-00002-of-00002.safetensors"
INDEX = "model.safetensors.index.json"


# ---------------------------------------------------------------- safetensors editing helpers


class Shard:
    """A shard parsed into (header dict in file order, data section bytes)."""

    def __init__(self, path: Path):
        self.path = path
        raw = path.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        self.header: Dict = json.loads(raw[8 : 8 + n])
        self.data = bytearray(raw[8 + n :])

    def tensor_names(self) -> List[str]:
        return [k for k in self.header if k != "__metadata__"]

    def span(self, name: str) -> Tuple[int, int]:
        b, e = self.header[name]["data_offsets"]
        return b, e

    def bytes_of(self, name: str) -> bytearray:
        b, e = self.span(name)
        return self.data[b:e]

    def set_bytes(self, name: str, at: int, new: bytes) -> None:
        b, e = self.span(name)
        assert b + at + len(new) <= e
        self.data[b + at : b + at + len(new)] = new

    def write(self, header_bytes: bytes = None) -> None:
        h = header_bytes if header_bytes is not None else header_json(self.header)
        self.path.write_bytes(struct.pack("<Q", len(h)) + h + bytes(self.data))

    def tensors(self) -> Dict[str, Tuple[dict, bytes]]:
        return {k: (self.header[k], bytes(self.bytes_of(k))) for k in self.tensor_names()}


def header_json(h: Dict) -> bytes:
    b = json.dumps(h, separators=(",", ":")).encode()
    return b + b" " * (-len(b) % 8)


def repack(path: Path, tensors: Dict[str, Tuple[dict, bytes]]) -> None:
    """Writes a well-formed shard holding exactly ``tensors`` (name -> (entry, bytes))."""
    header: Dict = {"__metadata__": {"format": "pt"}}
    data = bytearray()
    for name, (entry, b) in tensors.items():
        header[name] = {
            "dtype": entry["dtype"],
            "shape": entry["shape"],
            "data_offsets": [len(data), len(data) + len(b)],
        }
        data += b
    h = header_json(header)
    path.write_bytes(struct.pack("<Q", len(h)) + h + bytes(data))


def load_json(p: Path):
    return json.loads(p.read_text())


def save_json(p: Path, v) -> None:
    p.write_text(json.dumps(v, indent=1))


def shard_of(d: Path, name: str) -> str:
    return load_json(d / INDEX)["weight_map"][name]


def edit_index(d: Path, fn: Callable[[Dict], None]) -> None:
    idx = load_json(d / INDEX)
    fn(idx)
    save_json(d / INDEX, idx)


def edit_config(d: Path, fn: Callable[[Dict], None]) -> None:
    cfg = load_json(d / "config.json")
    fn(cfg)
    save_json(d / "config.json", cfg)


def edit_header(d: Path, shard: str, fn: Callable[[Dict], None]) -> None:
    s = Shard(d / shard)
    fn(s.header)
    s.write()


def edit_bytes(d: Path, name: str, at: int, new: bytes) -> None:
    s = Shard(d / shard_of(d, name))
    s.set_bytes(name, at, new)
    s.write()


# ---------------------------------------------------------------------------- the cases


@dataclass
class Case:
    name: str
    make: Callable[[Path], None]
    exc: str  # "V4FlashError", "FileNotFoundError", "OSError", "ValueError", "PermissionError"
    words: List[str]
    stage: str = "load"
    needs: List[str] = field(default_factory=list)  # e.g. ["non-root"]
    doc: str = ""


CASES: List[Case] = []


def case(name, exc, words, stage="load", needs=(), doc=""):
    def deco(fn):
        CASES.append(Case(name, fn, exc, list(words), stage, list(needs), doc or fn.__doc__ or ""))
        return fn

    return deco


# --- shard files: size and header framing


@case("truncated_shard", "V4FlashError", [S2, "past the end of the data section", "truncated"])
def _(d):
    """The second shard cut in half (a half-finished download)."""
    p = d / S2
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


@case("truncated_inside_header", "V4FlashError", [S1, "exceeds the file size"])
def _(d):
    """A shard cut inside its JSON header."""
    p = d / S1
    p.write_bytes(p.read_bytes()[:1000])


@case("shard_shorter_than_prefix", "V4FlashError", [S2, "5 bytes", "too short"])
def _(d):
    (d / S2).write_bytes(b"\x10\x00\x00\x00\x00")


@case("empty_shard", "V4FlashError", [S1, "0 bytes", "too short"])
def _(d):
    (d / S1).write_bytes(b"")


@case("header_len_past_eof", "V4FlashError", [S1, "header length", "exceeds the file size"])
def _(d):
    p = d / S1
    raw = bytearray(p.read_bytes())
    raw[:8] = struct.pack("<Q", len(raw))
    p.write_bytes(bytes(raw))


@case("header_len_absurd", "V4FlashError", [S1, "implausible", "not a safetensors file"])
def _(d):
    p = d / S1
    raw = bytearray(p.read_bytes())
    raw[:8] = b"\xff" * 8
    p.write_bytes(bytes(raw))


@case("header_not_json", "V4FlashError", [S2, "header is not valid JSON"])
def _(d):
    s = Shard(d / S2)
    h = header_json(s.header)
    s.write(b"<html>404 Not Found</html>".ljust(len(h), b" "))


@case("header_not_utf8", "V4FlashError", [S2, "header is not valid UTF-8"])
def _(d):
    s = Shard(d / S2)
    h = bytearray(header_json(s.header))
    h[2] = 0xFF
    s.write(bytes(h))


@case("header_not_object", "V4FlashError", [S1, "header is not a JSON object"])
def _(d):
    s = Shard(d / S1)
    h = header_json(s.header)
    s.write(b"[1, 2, 3]".ljust(len(h), b" "))


@case("not_safetensors_at_all", "V4FlashError", [S1, "header length"])
def _(d):
    """A renamed file of another format (here: a zip/pytorch pickle magic)."""
    (d / S1).write_bytes(b"PK\x03\x04" + os.urandom(4000))


# --- shard header entries


@case("offsets_past_end", "V4FlashError", [S1, "hc_head_base", "run past the end"])
def _(d):
    def fn(h):
        h["hc_head_base"]["data_offsets"] = [10**9, 10**9 + 16]

    edit_header(d, S1, fn)


@case("offsets_end_before_begin", "V4FlashError", [S1, "hc_head_base", "end before begin"])
def _(d):
    def fn(h):
        b, e = h["hc_head_base"]["data_offsets"]
        h["hc_head_base"]["data_offsets"] = [e, b]

    edit_header(d, S1, fn)


@case("offsets_overlap", "V4FlashError", [S1, "embed.weight", "hc_head_base", "overlap"])
def _(d):
    """hc_head_base's range moved 8 bytes back, into embed.weight (same length)."""

    def fn(h):
        b, e = h["hc_head_base"]["data_offsets"]
        h["hc_head_base"]["data_offsets"] = [b - 8, e - 8]

    edit_header(d, S1, fn)


@case("offsets_hole", "V4FlashError", [S1, "unused bytes before tensor", "tile the data section"])
def _(d):
    """A tensor dropped from the header but not from the data: a hole in the data section."""

    def fn(h):
        del h["hc_head_base"]

    edit_header(d, S1, fn)


@case("trailing_bytes", "V4FlashError", [S2, "trailing bytes"])
def _(d):
    with open(d / S2, "ab") as f:
        f.write(b"\0" * 100)


@case("byte_len_vs_shape", "V4FlashError", [S1, "hc_head_base", "F32 [5] needs 20 bytes", "16"])
def _(d):
    def fn(h):
        h["hc_head_base"]["shape"] = [5]

    edit_header(d, S1, fn)


@case("unknown_dtype", "V4FlashError", [S1, "hc_head_base", "unknown dtype", "F64"])
def _(d):
    def fn(h):
        h["hc_head_base"]["dtype"] = "F64"

    edit_header(d, S1, fn)


@case("negative_dimension", "V4FlashError", [S1, "hc_head_base", "negative dimension"])
def _(d):
    def fn(h):
        h["hc_head_base"]["shape"] = [-4]

    edit_header(d, S1, fn)


@case("entry_missing_offsets", "V4FlashError", [S1, "hc_head_base", "data_offsets"])
def _(d):
    def fn(h):
        del h["hc_head_base"]["data_offsets"]

    edit_header(d, S1, fn)


@case("duplicate_name_in_header", "V4FlashError", [S1, "hc_head_base", "appears twice"])
def _(d):
    s = Shard(d / S1)
    h = header_json(s.header).rstrip(b" ")
    e = json.dumps(s.header["hc_head_base"], separators=(",", ":")).encode()
    h = h[:-1] + b',"hc_head_base":' + e + b"}"
    s.write(h + b" " * (-len(h) % 8))


# --- tensors: shape, dtype, presence


@case(
    "wrong_shape", "V4FlashError", [S1, "embed.weight", "expected shape [512, 192]", "[192, 512]"]
)
def _(d):
    def fn(h):
        h["embed.weight"]["shape"] = [192, 512]

    edit_header(d, S1, fn)


@case("wrong_dtype_float", "V4FlashError", ["layers.0.attn.attn_sink", "expected dtype F32", "I32"])
def _(d):
    name = "layers.0.attn.attn_sink"
    s = shard_of(d, name)

    def fn(h):
        h[name]["dtype"] = "I32"

    edit_header(d, s, fn)


@case(
    "wrong_dtype_fp8",
    "V4FlashError",
    ["layers.0.attn.wq_a.weight", "expected dtype F8_E4M3", "found I8"],
)
def _(d):
    name = "layers.0.attn.wq_a.weight"

    def fn(h):
        h[name]["dtype"] = "I8"

    edit_header(d, shard_of(d, name), fn)


@case(
    "wrong_dtype_expert",
    "V4FlashError",
    ["layers.1.ffn.experts.3.w2.scale", "expected dtype F8_E8M0", "found I8"],
)
def _(d):
    name = "layers.1.ffn.experts.3.w2.scale"

    def fn(h):
        h[name]["dtype"] = "I8"

    edit_header(d, shard_of(d, name), fn)


def _drop_tensor(d: Path, name: str) -> None:
    s = shard_of(d, name)
    t = Shard(d / s).tensors()
    del t[name]
    repack(d / s, t)
    edit_index(d, lambda idx: idx["weight_map"].pop(name))


@case("missing_tensor", "V4FlashError", ["missing tensor layers.2.attn.wkv.scale", "config.json"])
def _(d):
    """A dense tensor missing from both its shard and the index."""
    _drop_tensor(d, "layers.2.attn.wkv.scale")


@case(
    "transformers_layout",
    "V4FlashError",
    ["missing tensor embed.weight", "Hugging Face transformers conversion", "model.embed.weight"],
)
def _(d):
    """Another layout of the same model: every tensor renamed with a ``model.`` prefix."""
    for s in (S1, S2):
        repack(d / s, {"model." + k: v for k, v in Shard(d / s).tensors().items()})
    edit_index(
        d,
        lambda idx: idx.__setitem__(
            "weight_map", {"model." + k: v for k, v in idx["weight_map"].items()}
        ),
    )


@case("missing_expert_tensor", "V4FlashError", ["missing tensor layers.4.ffn.experts.15.w3.weight"])
def _(d):
    _drop_tensor(d, "layers.4.ffn.experts.15.w3.weight")


# --- the index and the shard set


@case("missing_shard", "FileNotFoundError", [S2, "shard named in model.safetensors.index.json"])
def _(d):
    (d / S2).unlink()


@case("renamed_shard", "FileNotFoundError", [S2, "shard named in model.safetensors.index.json"])
def _(d):
    """Shard files renamed (e.g. re-numbered by a download tool) without the index."""
    (d / S2).rename(d / "model-00002-of-00003.safetensors")


@case("index_wrong_shard", "V4FlashError", [INDEX, "hc_head_fn", f"mapped to {S2}", f"in {S1}"])
def _(d):
    edit_index(d, lambda idx: idx["weight_map"].__setitem__("hc_head_fn", S2))


@case("index_names_absent_tensor", "V4FlashError", ["maps tensor layers.9.attn.wq_a.weight", S2])
def _(d):
    edit_index(d, lambda idx: idx["weight_map"].__setitem__("layers.9.attn.wq_a.weight", S2))


@case("tensor_not_in_index", "V4FlashError", [S1, "hc_head_fn", "not listed in", INDEX])
def _(d):
    edit_index(d, lambda idx: idx["weight_map"].pop("hc_head_fn"))


@case("duplicate_across_shards", "V4FlashError", ["hc_head_fn", S1, S2, "duplicate name"])
def _(d):
    t1 = Shard(d / S1).tensors()
    t2 = Shard(d / S2).tensors()
    t2["hc_head_fn"] = t1["hc_head_fn"]
    repack(d / S2, t2)


@case("index_not_json", "V4FlashError", [INDEX, "not valid JSON"])
def _(d):
    p = d / INDEX
    p.write_bytes(p.read_bytes()[:200])


@case("index_no_weight_map", "V4FlashError", [INDEX, '"weight_map"'])
def _(d):
    save_json(d / INDEX, {"metadata": {"total_size": 1}})


@case("index_path_traversal", "V4FlashError", [INDEX, "../../etc/passwd", "not a plain file name"])
def _(d):
    edit_index(d, lambda idx: idx["weight_map"].__setitem__("hc_head_fn", "../../etc/passwd"))


@case("shard_is_directory", "V4FlashError", [S2, "not a regular file"])
def _(d):
    (d / S2).unlink()
    (d / S2).mkdir()


@case("shard_is_fifo", "V4FlashError", [S2, "not a regular file"], needs=["fifo"])
def _(d):
    """A named pipe in place of a shard: must not block forever on open/read."""
    (d / S2).unlink()
    os.mkfifo(d / S2)


@case("no_index_no_single_file", "FileNotFoundError", [INDEX, "neither"])
def _(d):
    (d / INDEX).unlink()


@case("unreadable_shard", "PermissionError", [S2], needs=["non-root"])
def _(d):
    os.chmod(d / S2, 0)


# --- values


@case(
    "e8m0_nan_scale",
    "V4FlashError",
    ["layers.0.attn.wq_a.scale", "scale byte 0 is 255", "F8_E8M0 NaN"],
)
def _(d):
    edit_bytes(d, "layers.0.attn.wq_a.scale", 0, b"\xff")


@case(
    "e8m0_nan_expert_scale",
    "V4FlashError",
    ["layers.0.ffn.experts", ".w1.scale", "is 255", "F8_E8M0 NaN"],
    stage="run",
)
def _(d):
    """Expert scales are read lazily: the first forward pass that uses them fails."""
    for e in range(16):
        edit_bytes(d, f"layers.0.ffn.experts.{e}.w1.scale", 3, b"\xff")


@case("f32_nan", "V4FlashError", [S1, "hc_head_base", "element 2 is NaN", "finite"])
def _(d):
    edit_bytes(d, "hc_head_base", 8, struct.pack("<f", float("nan")))


@case("f32_inf", "V4FlashError", ["layers.3.ffn.gate.bias", "element 0 is inf"])
def _(d):
    edit_bytes(d, "layers.3.ffn.gate.bias", 0, struct.pack("<f", float("inf")))


@case("bf16_nan", "V4FlashError", [S1, "embed.weight", "element 5 is NaN"])
def _(d):
    edit_bytes(d, "embed.weight", 10, b"\xc0\x7f")


@case("fp8_nan", "V4FlashError", ["layers.1.attn.wkv.weight", "element 7", "F8_E4M3 NaN"])
def _(d):
    edit_bytes(d, "layers.1.attn.wkv.weight", 7, b"\x7f")


@case(
    "tid2eid_out_of_range",
    "V4FlashError",
    ["layers.0.ffn.gate.tid2eid", "row 3 has expert id 16", "expected 0..15"],
)
def _(d):
    edit_bytes(d, "layers.0.ffn.gate.tid2eid", (3 * 4 + 1) * 8, struct.pack("<q", 16))


@case(
    "tid2eid_negative",
    "V4FlashError",
    ["layers.1.ffn.gate.tid2eid", "expert id -1", "expected 0..15"],
)
def _(d):
    edit_bytes(d, "layers.1.ffn.gate.tid2eid", 0, struct.pack("<q", -1))


@case("tid2eid_repeated", "V4FlashError", ["layers.2.ffn.gate.tid2eid", "row 0 selects expert"])
def _(d):
    name = "layers.2.ffn.gate.tid2eid"
    s = Shard(d / shard_of(d, name))
    first = bytes(s.bytes_of(name)[:8])
    s.set_bytes(name, 8, first)
    s.write()


# --- config.json


def _cfg(fn):
    return lambda d: edit_config(d, fn)


CONFIG_CASES = [
    ("config_missing_field", lambda c: c.pop("hidden_size"), ['missing key "hidden_size"']),
    (
        "config_negative",
        lambda c: c.__setitem__("num_attention_heads", -4),
        ["num_attention_heads"],
    ),
    ("config_zero", lambda c: c.__setitem__("head_dim", 0), ['"head_dim" must be positive']),
    ("config_wrong_type", lambda c: c.__setitem__("vocab_size", "512"), ['"vocab_size"']),
    (
        "config_float_for_int",
        lambda c: c.__setitem__("num_hidden_layers", 6.0),
        ['"num_hidden_layers"'],
    ),
    (
        "config_compress_ratios_length",
        lambda c: c.__setitem__("compress_ratios", [0, 0, 4]),
        ['"compress_ratios" has 3 entries', "num_hidden_layers (6)"],
    ),
    (
        "config_compress_ratios_missing",
        lambda c: c.pop("compress_ratios"),
        ['missing key "compress_ratios"'],
    ),
    (
        "config_compress_ratio_negative",
        lambda c: c["compress_ratios"].__setitem__(2, -4),
        ["compress_ratios[2]", "non-negative integer"],
    ),
    ("config_heads_vs_o_groups", lambda c: c.__setitem__("o_groups", 3), ["o_groups", "divisible"]),
    (
        "config_rope_dim_odd",
        lambda c: c.__setitem__("qk_rope_head_dim", 33),
        ['"qk_rope_head_dim" = 33', "even"],
    ),
    (
        "config_hidden_not_32",
        lambda c: c.__setitem__("hidden_size", 200),
        ["hidden_size", "200", "multiple"],
    ),
    (
        "config_topk_gt_experts",
        lambda c: c.__setitem__("num_experts_per_tok", 17),
        ['"num_experts_per_tok" = 17', '"n_routed_experts" = 16'],
    ),
    (
        "config_hash_layers_gt_layers",
        lambda c: c.__setitem__("num_hash_layers", 7),
        ['"num_hash_layers" = 7', "num_hidden_layers = 6"],
    ),
    (
        "config_unknown_model_type",
        lambda c: c.__setitem__("model_type", "llama"),
        ['"model_type"', "llama", "deepseek_v4"],
    ),
    ("config_no_model_type", lambda c: c.pop("model_type"), ['"model_type"', "deepseek_v4"]),
    (
        "config_eos_outside_vocab",
        lambda c: c.__setitem__("eos_token_id", 512),
        ['"eos_token_id" = 512', "vocab"],
    ),
    (
        "config_rope_scaling_type",
        lambda c: c["rope_scaling"].__setitem__("type", "linear"),
        ['"rope_scaling.type"', "linear", "yarn"],
    ),
    (
        "config_eps_negative",
        lambda c: c.__setitem__("rms_norm_eps", -1e-6),
        ['"rms_norm_eps"', "positive"],
    ),
    ("config_not_object", None, ["top level must be a JSON object"]),
]


def _register_config_cases():
    for name, fn, words in CONFIG_CASES:
        if fn is None:
            make = lambda d: (d / "config.json").write_text("[1, 2]")  # noqa: E731
        else:
            make = _cfg(fn)
        for stage in ("load", "core"):
            CASES.append(
                Case(f"{name}[{stage}]", make, "V4FlashError", ["config.json"] + words, stage)
            )


_register_config_cases()


@case("config_not_json", "V4FlashError", ["config.json", "not valid JSON"])
def _(d):
    (d / "config.json").write_bytes(b'{"model_type": "deepseek_v4", ')


@case("config_deeply_nested", "V4FlashError", ["config.json", "not valid JSON"])
def _(d):
    (d / "config.json").write_text("[" * 100_000 + "]" * 100_000)


@case("config_huge_integer", "V4FlashError", ["config.json", "vocab_size"])
def _(d):
    t = (d / "config.json").read_text()
    (d / "config.json").write_text(t.replace('"vocab_size": 512', '"vocab_size": ' + "9" * 30))


@case("config_huge_file", "V4FlashError", ["config.json", "implausibly large"])
def _(d):
    with open(d / "config.json", "ab") as f:
        f.truncate(65 << 20)  # sparse: 65 MB of zeros after the JSON


@case("config_missing", "FileNotFoundError", ["config.json", "no such file"])
def _(d):
    (d / "config.json").unlink()


@case("config_is_fifo", "V4FlashError", ["config.json", "not a regular file"], needs=["fifo"])
def _(d):
    (d / "config.json").unlink()
    os.mkfifo(d / "config.json")


@case("config_unreadable", "PermissionError", ["config.json"], needs=["non-root"])
def _(d):
    os.chmod(d / "config.json", 0)


@case(
    "config_valid_but_other_model",
    "V4FlashError",
    [S1, "embed.weight", "expected shape [512, 256]", "found [512, 192]"],
)
def _(d):
    """A self-consistent config describing a different model than the tensors."""
    edit_config(d, lambda c: c.__setitem__("hidden_size", 256))


@case(
    "config_more_layers_than_tensors",
    "V4FlashError",
    ["missing tensor layers.6.", "config.json"],
)
def _(d):
    def fn(c):
        c["num_hidden_layers"] = 7
        c["compress_ratios"] = [0, 0, 4, 8, 4, 8, 0, 0]

    edit_config(d, fn)


@case(
    "config_fewer_experts",
    "V4FlashError",
    ["tensor layers.0.ffn.gate.weight", "expected shape [8, 192]", "found [16, 192]"],
)
def _(d):
    edit_config(d, lambda c: c.__setitem__("n_routed_experts", 8))


# --- paths


@case("path_is_file", "ValueError", ["config.json", "is a file, not a checkpoint directory"])
def _(d):
    """``d`` is replaced by the caller with ``d/config.json`` (see ``target``)."""


@case("path_missing", "FileNotFoundError", ["no such checkpoint directory"])
def _(d):
    shutil.rmtree(d)


# --- tokenizer


@case("tokenizer_missing", "FileNotFoundError", ["tokenizer.json", "not found"], stage="tokenizer")
def _(d):
    (d / "tokenizer.json").unlink()


@case(
    "tokenizer_truncated",
    "ValueError",
    ["tokenizer.json", "not a valid tokenizer.json"],
    stage="tokenizer",
)
def _(d):
    p = d / "tokenizer.json"
    p.write_bytes(p.read_bytes()[:5000])


@case(
    "tokenizer_not_a_tokenizer",
    "ValueError",
    ["tokenizer.json", "not a valid tokenizer.json"],
    stage="tokenizer",
)
def _(d):
    shutil.copy(d / "config.json", d / "tokenizer.json")


@case(
    "tokenizer_other_model",
    "ValueError",
    ["<｜end▁of▁sentence｜>", "not found", "tokenizer.json"],
    stage="tokenizer",
)
def _(d):
    """A valid tokenizer.json of another model (no DeepSeek control tokens)."""
    t = load_json(d / "tokenizer.json")
    t["added_tokens"] = [a for a in t["added_tokens"] if "end▁of▁sentence" not in a["content"]]
    vocab = t["model"]["vocab"]
    for k in [k for k in vocab if "end▁of▁sentence" in k]:
        del vocab[k]
    save_json(d / "tokenizer.json", t)


def target(c: Case, d: Path) -> Path:
    """The path a case passes to the loader."""
    return d / "config.json" if c.name == "path_is_file" else d


def make(c: Case, d: Path) -> Path:
    """Copies the good fixture to ``d`` and applies case ``c``; returns the path to load."""
    shutil.copytree(GOOD, d)
    for p in d.iterdir():  # the repository's files may be read-only; the copies need not be
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    c.make(d)
    return target(c, d)


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "bad-checkpoints")
    out.mkdir(parents=True, exist_ok=True)
    for c in CASES:
        if "fifo" in c.needs:
            continue
        make(c, out / c.name.replace("[", "-").replace("]", ""))
        print(f"{c.name:40s} {c.exc}: {', '.join(c.words)}")
