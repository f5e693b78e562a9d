"""Odd prompts end in a correct answer or a clear error: empty / control-character / very
long text, literal special-token strings in user text, lone surrogates, out-of-range ids given
to the decoder."""

import pytest

import v4flash
from conftest import FIXTURES, model_for
from v4flash.tokenizer import encode_prompt_ids, load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(FIXTURES / "tiny-a")


@pytest.mark.parametrize(
    "text",
    ["", " ", "\x00\x01\x7f", "\u202e\u200b\ufeff", "e\u0301" * 8, "\U0010ffff" * 3, "🙂" * 6],
    ids=["empty", "space", "control", "bidi-zwsp-bom", "combining", "max-codepoint", "emoji"],
)
def test_odd_user_text_encodes_and_generates(tok, text):
    m = model_for("tiny-a")
    ids = encode_prompt_ids(tok, [{"role": "user", "content": text}])
    assert ids and all(0 <= i < m.config.vocab_size for i in ids)
    out = m.generate(ids, max_new_tokens=3, stop_ids=[])
    assert len(out) == 3
    assert isinstance(tok.decode(out), str)


def test_special_token_text_in_plain_user_content_is_not_a_control_token(tok):
    eos = "<｜end▁of▁sentence｜>"
    assert tok.encode(eos) == [tok.eos_id]
    assert tok.eos_id not in tok.encode_plain("say " + eos + " now")


def test_prompt_longer_than_ctx_from_text(tok):
    m = v4flash.load(FIXTURES / "tiny-a", ctx=64)
    ids = encode_prompt_ids(tok, [{"role": "user", "content": "word " * 200}])
    assert len(ids) > 64
    with pytest.raises(ValueError, match="more than the context of 64 tokens"):
        m.generate(ids, max_new_tokens=1)


def test_decoder_rejects_out_of_range_ids_in_token_bytes(tok):
    with pytest.raises(ValueError, match="out of range"):
        tok.token_bytes(10**6)
    with pytest.raises(ValueError, match="out of range"):
        tok.stream_decoder().push(10**6)


def test_lone_surrogate_gives_a_clear_error(tok):
    with pytest.raises(ValueError, match="surrogate"):
        tok.encode("bad \ud800 text")


@pytest.mark.parametrize("bad", [10**6, -1])
def test_decode_rejects_out_of_range_ids(tok, bad):
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([5, bad])
