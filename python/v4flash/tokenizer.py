"""The checkpoint's tokenizer (``tokenizer.json``, byte-level BPE) and a streaming decoder.

A thin wrapper over ``tokenizers.Tokenizer``: encoding never adds BOS (the chat encoder writes
it as text), control-token ids are looked up by their strings (``encoding.CONTROL_TOKENS``)
rather than hard-coded, :func:`encode_prompt_ids` turns the chat format's prompt into ids with
control tokens only where the template put them, and :class:`StreamDecoder` turns generated
ids into text without ever emitting half a UTF-8 character (a byte-level token can end in the
middle of one).
"""

from __future__ import annotations

import codecs
import os
import re
from typing import Any, Dict, Iterable, List, Optional, Pattern, Union

from .encoding import CONTROL_TOKENS, encode_segments


def _byte_decoder() -> Dict[str, int]:
    """Inverse of the GPT-2 byte-level alphabet: printable bytes map to themselves, the others
    to U+0100 and up."""
    keep = list(range(ord("!"), ord("~") + 1))
    keep += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


_BYTE_DECODER = _byte_decoder()


class V4Tokenizer:
    """``tokenizers.Tokenizer`` plus the lookups the engine needs."""

    def __init__(self, tokenizer, path: Optional[str] = None):
        self._tok = tokenizer
        self.path = path
        added = tokenizer.get_added_tokens_decoder()  # {id: AddedToken}
        self.added_tokens: Dict[str, int] = {t.content: i for i, t in added.items()}
        self._special_ids = frozenset(i for i, t in added.items() if t.special)
        self._added_by_id = {i: t.content for i, t in added.items()}
        self._bytes_cache: Dict[int, bytes] = {}
        self._pattern: Optional[Pattern[str]] = None
        self.special_ids: Dict[str, int] = {}
        for name, text in CONTROL_TOKENS.items():
            tid = tokenizer.token_to_id(text)
            if tid is None:
                where = f" in {path}" if path else ""
                raise ValueError(f"token {text!r} ({name}) not found{where}")
            self.special_ids[name] = tid

    bos_id = property(lambda self: self.special_ids["bos"])
    eos_id = property(lambda self: self.special_ids["eos"])
    user_id = property(lambda self: self.special_ids["user"])
    assistant_id = property(lambda self: self.special_ids["assistant"])
    think_id = property(lambda self: self.special_ids["think"])
    end_think_id = property(lambda self: self.special_ids["end_think"])

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def inner(self):
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._tok

    @property
    def added_token_pattern(self) -> Optional[Pattern[str]]:
        """Regex matching added tokens leftmost-longest, as the tokenizer splits them."""
        if self._pattern is None and self.added_tokens:
            alts = sorted(self.added_tokens, key=len, reverse=True)
            self._pattern = re.compile("|".join(re.escape(a) for a in alts))
        return self._pattern

    def encode(self, text: str) -> List[int]:
        """Ids of ``text``; added tokens (``<｜User｜>``, …) in it match as single ids."""
        return self._tok.encode(_check_text(text), add_special_tokens=False).ids

    def encode_plain(self, text: str) -> List[int]:
        """Ids of ``text`` as plain text: added-token strings become ordinary BPE pieces.

        Runs the pre-tokenizer and the BPE model directly (this tokenizer has no normalizer),
        which is what :meth:`encode` does for text holding no added token.
        """
        text = _check_text(text)
        pre = self._tok.pre_tokenizer
        pieces = pre.pre_tokenize_str(text) if pre is not None else [(text, None)]
        model = self._tok.model
        return [t.id for piece, _ in pieces for t in model.tokenize(piece)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        ids = list(ids)
        n = self._tok.get_vocab_size(with_added_tokens=True)
        for i in ids:
            if not 0 <= i < n:
                raise ValueError(f"token id {i} is out of range for this tokenizer (0..{n - 1})")
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> Optional[int]:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> Optional[str]:
        return self._tok.id_to_token(token_id)

    def is_special(self, token_id: int) -> bool:
        """True for added tokens flagged special (skipped by ``skip_special_tokens``)."""
        return token_id in self._special_ids

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for, as the ByteLevel decoder maps them."""
        cached = self._bytes_cache.get(token_id)
        if cached is not None:
            return cached
        token = self._tok.id_to_token(token_id)
        if token is None:
            raise ValueError(f"token id {token_id} out of range (vocab size {self.vocab_size})")
        try:
            raw = bytes(_BYTE_DECODER[c] for c in token)
        except KeyError:  # not byte-level text (e.g. an added token such as <｜User｜>)
            raw = token.encode("utf-8")
        self._bytes_cache[token_id] = raw
        return raw

    def stream_decoder(self, skip_special_tokens: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special_tokens=skip_special_tokens)


def load_tokenizer(model_dir: Union[str, os.PathLike]) -> V4Tokenizer:
    """Load ``model_dir/tokenizer.json`` (``model_dir`` may also be the file itself)."""
    path = os.fspath(model_dir)
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"tokenizer file not found: {path}")
    try:
        from tokenizers import Tokenizer
    except ImportError as err:  # pragma: no cover - a declared dependency
        raise ImportError("v4flash needs the 'tokenizers' package: pip install tokenizers") from err
    try:
        tok = Tokenizer.from_file(path)
    except Exception as err:  # the binding raises a bare Exception on bad JSON
        raise ValueError(f"{path} is not a valid tokenizer.json: {err}") from None
    return V4Tokenizer(tok, path)


class StreamDecoder:
    """Incremental detokenizer: feed ids one at a time, get back only completed text.

    The concatenation of every :meth:`push` result and the final :meth:`flush` equals
    ``tokenizer.decode(ids)``: token bytes are joined and decoded as UTF-8, holding back an
    incomplete trailing sequence until the next token completes it; invalid bytes become
    U+FFFD exactly as the whole-sequence decode would make them.
    """

    def __init__(self, tokenizer: V4Tokenizer, skip_special_tokens: bool = False):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Add one id; return the text it completes (possibly ``""``)."""
        if self._skip and self._tok.is_special(token_id):
            return ""
        return self._utf8.decode(self._tok.token_bytes(token_id))

    def push_many(self, ids: Iterable[int]) -> str:
        return "".join(self.push(i) for i in ids)

    def flush(self) -> str:
        """End of stream: return held-back bytes (an unfinished character becomes U+FFFD)."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text

    @property
    def pending(self) -> bool:
        """Whether bytes of an unfinished character are held back."""
        return bool(self._utf8.getstate()[0])


def encode_prompt_ids(tokenizer: Any, messages: List[Dict[str, Any]], **kwargs: Any) -> List[int]:
    """Token ids of the chat prompt (:func:`~v4flash.encoding.encode_segments`), with control
    tokens produced only by the template (docs/chat-format.md §8).

    ``tokenizer`` is a :class:`V4Tokenizer` or a ``tokenizers.Tokenizer``; ``kwargs`` are those
    of :func:`~v4flash.encoding.encode_messages`. Text from the messages that contains (or, with
    its neighbours, forms) an added token such as ``<｜User｜>`` is encoded as plain text
    (byte-level BPE pieces), never as that token's id. All other text is encoded in runs as
    large as possible, so ordinary prompts get exactly ``tokenizer.encode(prompt)``.
    """
    tok = tokenizer if isinstance(tokenizer, V4Tokenizer) else V4Tokenizer(tokenizer)
    segments = encode_segments(messages, **kwargs)
    full = "".join(s for s, _ in segments)
    # Mark message text overlapping any added-token match of the whole prompt.
    starts, pos = [], 0
    for text, _ in segments:
        starts.append(pos)
        pos += len(text)
    plain = [False] * len(segments)
    pattern = tok.added_token_pattern
    if pattern is not None:
        seg = 0
        for match in pattern.finditer(full):
            a, b = match.span()
            while seg < len(segments) and starts[seg] + len(segments[seg][0]) <= a:
                seg += 1
            k = seg
            while k < len(segments) and starts[k] < b:
                if not segments[k][1]:
                    plain[k] = True
                k += 1
    ids: List[int] = []
    run: List[str] = []
    for (text, _), is_plain in zip(segments, plain):
        if is_plain:
            if run:
                ids += tok.encode("".join(run))
                run = []
            ids += tok.encode_plain(text)
        else:
            run.append(text)
    if run:
        ids += tok.encode("".join(run))
    return ids


def _check_text(text: str) -> str:
    """Rejects what cannot be encoded as UTF-8 (lone surrogates) with a clear ValueError."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"text holds a lone surrogate at position {e.start} ({text[e.start]!r}); "
            "it cannot be encoded as UTF-8"
        ) from None
    return text
