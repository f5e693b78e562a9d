"""The conversation: a state machine that reuses the session between turns.

:class:`Conversation` knows nothing about the terminal (tests drive it directly). Each turn it
re-encodes the whole conversation with the DeepSeek V4 template, then reuses as much of the
session as is valid:

* **append** (chat mode): the session already holds a prefix of the new prompt (previous
  prompt + answer; the EOS that closes the answer is fed with the new turn), so only the new
  tokens are prefilled;
* **rollback** (thinking mode, or a mode switch): the previous answer was generated after
  ``<think>`` but is re-rendered as ``</think>`` + content, so the session rolls back to the
  snapshot taken right after the previous turn's ``<｜Assistant｜>`` and feeds from there;
* **reset**: nothing matches (e.g. the system prompt changed): full prefill, counted.

Which one is ``resume.History``'s rule, the prompt cache's too.

Answers keep the ids the model generated: in the re-encoded prompt, each earlier answer's
content (the ids between ``<｜Assistant｜></think>`` and its EOS) is replaced by the generated
ids when they decode to the same text, because re-tokenizing generated text may split it
differently (common with a small vocabulary). Every other id, template and user text
alike, must match the session's exactly, or the session is not reused.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..encoding import ROLES, encoder_file
from ..resume import History, turn_boundary
from ..tokenizer import encode_prompt_ids
from .answer import TextCallback, stream_answer, turn_stats

CHAT_SESSION_VERSION = 1  # of the conversation kept in a session file's metadata

ProgressCallback = Callable[[int, int], None]  # (tokens done, total)


@dataclass
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: Optional[int] = None
    max_tokens: int = 1024
    stop: Tuple[str, ...] = ()  # stop strings (the answer ends before the first one)


@dataclass
class TurnResult:
    prompt_ids: List[int]
    ids: List[int]  # generated ids (the prompt's trailing <think>/</think> not included)
    text: str  # everything generated, decoded
    reasoning: str
    content: str
    stop: str  # "eos" | "stop" (a stop string) | "length" | "interrupted" | "cancelled"
    stats: Dict[str, Any] = field(default_factory=dict)


class Conversation:
    """Messages plus a session that holds their state; see the module docstring."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        thinking: bool = False,
        system: Optional[str] = None,
        reasoning_effort: Optional[str] = None,
        release: Optional[str] = None,
    ):
        self.model = model
        self.tok = tokenizer
        self.thinking = thinking
        self.system = system or None
        self.reasoning_effort = reasoning_effort
        self.release = release
        self.encoder_path = encoder_file(getattr(model, "path", "."))
        # the session, with snapshots at each turn's <｜Assistant｜> (resume.History)
        self._history = History(model.session())
        self.messages: List[Dict[str, Any]] = []
        self._answers: List[Optional[List[int]]] = []  # per assistant message: content ids
        self.turns: List[Dict[str, Any]] = []
        self.reuse_counts = {"new": 0, "append": 0, "rollback": 0, "reset": 0}
        # validate the settings now rather than at the first turn
        self.encode([{"role": "user", "content": "x"}])

    # --- state ---------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the conversation (the system prompt and mode stay)."""
        self._history.reset()
        self.messages.clear()
        self._answers.clear()

    def export(self) -> List[Dict[str, Any]]:
        """The conversation as OpenAI-style messages (the system prompt first, if any)."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [dict(m) for m in self.messages]

    def load(self, doc: Any) -> int:
        """Replaces the conversation with ``doc`` (a list of messages, or an object with
        ``messages``): a leading plain system message becomes the system prompt. The state is
        rebuilt by the next turn's prefill. Returns the number of messages; ``ValueError``
        (nothing changed) for anything the chat format cannot encode."""
        msgs = doc.get("messages") if isinstance(doc, dict) else doc
        if not isinstance(msgs, list):
            raise ValueError('expected a JSON list of messages (or {"messages": [...]})')
        for i, m in enumerate(msgs):
            if not isinstance(m, dict):
                raise ValueError(f"message {i} is not an object")
            if m.get("role") not in ROLES:
                raise ValueError(
                    f"message {i} has role {m.get('role')!r}; expected one of {', '.join(ROLES)}"
                )
        count, system = len(msgs), None
        if msgs and set(msgs[0]) <= {"role", "content"} and msgs[0]["role"] == "system":
            if not isinstance(msgs[0].get("content"), str):
                raise ValueError("the system message's content must be a string")
            system, msgs = msgs[0]["content"] or None, msgs[1:]
        old = self.system
        self.system = system
        try:
            self.encode(msgs + [{"role": "user", "content": "x"}])  # validates
        except ValueError:
            self.system = old
            raise
        self.reset()
        self.messages = [dict(m) for m in msgs]
        self._answers = [None] * sum(m["role"] == "assistant" for m in msgs)
        return count

    # --- the conversation on disk (chat --session FILE) --------------------------------------

    def save_session(self, path: Any) -> int:
        """Writes the session and the conversation to ``path``: a session file (the engine's
        state, so that a later run continues without a prefill) whose metadata holds the
        messages, the generated answer ids and the settings. The state saved is the one the
        next turn would reuse: the session as it stands when the next prompt extends it (chat
        mode), else the latest snapshot the next prompt extends (thinking mode: the one after
        the last ``<｜Assistant｜>``). Returns the file's size in bytes."""
        probe = self._canonical(self.encode(self.messages + [{"role": "user", "content": "x"}]))
        self._history.sync()
        _, snap = self._history.match(probe)
        doc = {
            "version": CHAT_SESSION_VERSION,
            "messages": self.messages,
            "answers": self._answers,
            "system": self.system,
            "thinking": self.thinking,
            "reasoning_effort": self.reasoning_effort,
        }
        return self.session.save(path, snapshot=snap, metadata={"chat": doc})

    def resume(self, path: Any) -> int:
        """Continues the conversation :meth:`save_session` wrote to ``path``: its session
        (nothing to prefill), messages, answers and settings. ``FileNotFoundError`` when there
        is no such file, ``ValueError`` for one that cannot be used (another model, damaged,
        a conversation the chat format cannot encode); nothing changes then. A session file
        that holds no conversation gives its session and no messages. Returns the number of
        messages."""
        session = self.model.load_session(path)
        meta = session.metadata
        doc = meta.get("chat") if isinstance(meta, dict) else None
        if doc is None:
            doc = {}
        if (
            not isinstance(doc, dict)
            or doc.get("version", CHAT_SESSION_VERSION) != CHAT_SESSION_VERSION
        ):
            raise ValueError(f"{path}: the saved conversation is of an unknown version")
        msgs = doc.get("messages", [])
        if not isinstance(msgs, list) or not all(
            isinstance(m, dict) and m.get("role") in ROLES for m in msgs
        ):
            raise ValueError(f"{path}: the saved conversation's messages are malformed")
        n_answers = sum(m["role"] == "assistant" for m in msgs)
        answers = doc.get("answers")
        vocab = self.model.config.vocab_size
        if not (
            isinstance(answers, list)
            and len(answers) == n_answers
            and all(
                a is None
                or (
                    isinstance(a, list)
                    and all(isinstance(t, int) and not isinstance(t, bool) for t in a)
                    and all(0 <= t < vocab for t in a)
                )
                for a in answers
            )
        ):
            answers = [None] * n_answers  # answers then re-tokenize (a prefill, never wrong)
        old = (self.system, self.thinking, self.reasoning_effort)
        if "system" in doc:  # the saved settings (a bare session file has none)
            system = doc["system"]
            self.system = system if isinstance(system, str) and system else None
        if "thinking" in doc:
            self.thinking = bool(doc["thinking"])
        if "reasoning_effort" in doc:
            effort = doc["reasoning_effort"]
            self.reasoning_effort = effort if isinstance(effort, str) else None
        try:
            self.encode(msgs + [{"role": "user", "content": "x"}])
        except ValueError as e:
            self.system, self.thinking, self.reasoning_effort = old
            raise ValueError(f"{path}: the saved conversation cannot be encoded: {e}") from None
        self._history = History(session)
        self._history.sync()
        self.messages = [dict(m) for m in msgs]
        self._answers = list(answers)
        toks = self._history.tokens
        if toks and toks[-1] == self.tok.assistant_id and session.last_logits() is not None:
            # saved at the snapshot after <｜Assistant｜>: keep it one (for /regen)
            self._history.add_snapshot(len(toks), session.snapshot())
        return len(self.messages)

    def set_system(self, text: Optional[str]) -> None:
        self.system = text or None

    def set_thinking(self, on: bool) -> None:
        self.thinking = bool(on)

    @property
    def mode(self) -> str:
        return "thinking" if self.thinking else "chat"

    def encode(self, messages: Sequence[Dict[str, Any]]) -> List[int]:
        msgs = list(messages)
        if self.system:
            msgs.insert(0, {"role": "system", "content": self.system})
        return encode_prompt_ids(
            self.tok,
            msgs,
            thinking_mode=self.mode,
            reasoning_effort=self.reasoning_effort if self.thinking else None,
            release=self.release,
            encoder_path=self.encoder_path,
        )

    def _canonical(self, ids: List[int]) -> List[int]:
        """``ids`` with each earlier answer's content replaced by the ids the model generated
        (when they decode to the same text)."""
        asst, end_think, eos = self.tok.assistant_id, self.tok.end_think_id, self.tok.eos_id
        out: List[int] = []
        i, k, n = 0, 0, len(ids)
        while i < n:
            if ids[i] == asst and i + 1 < n and ids[i + 1] == end_think and eos in ids[i + 2 :]:
                e = ids.index(eos, i + 2)
                span = ids[i + 2 : e]
                gen = self._answers[k] if k < len(self._answers) else None
                k += 1
                if (
                    gen is not None
                    and gen != span
                    and self.tok.decode(gen) == self.tok.decode(span)
                ):
                    span = gen
                out += [asst, end_think] + span
                i = e
                continue
            out.append(ids[i])
            i += 1
        return out

    @property
    def session(self) -> Any:
        """The session that holds the conversation's state."""
        return self._history.session

    def _reconcile(self, prompt: List[int]) -> Tuple[int, str]:
        """Brings the session to the longest valid prefix of ``prompt``: (kept, how)."""
        self._history.sync()
        return self._history.resume(prompt)

    def _feed(self, ids: List[int], progress: Optional[ProgressCallback]) -> None:
        if not ids:
            return
        # the engine reports its progress itself (layer by layer), the prompt goes in whole
        self.session.feed(ids, progress=progress)

    # --- a turn ----------------------------------------------------------------------------

    def respond(
        self,
        user_text: str,
        sampling: Sampling,
        on_text: Optional[TextCallback] = None,
        on_progress: Optional[ProgressCallback] = None,
    ) -> TurnResult:
        """Adds a user turn and generates the answer (streamed through ``on_text``).

        Ctrl-C during generation stops the answer and keeps it (``stop="interrupted"``); during
        the prefill it cancels the turn (``stop="cancelled"``, nothing is added)."""
        messages = self.messages + [{"role": "user", "content": user_text}]
        prompt = self._canonical(self.encode(messages))
        return self._run(prompt, sampling, on_text, on_progress, messages)

    def can_regenerate(self) -> bool:
        """The conversation ends with a user message and its answer."""
        m = self.messages
        return len(m) >= 2 and m[-1]["role"] == "assistant" and m[-2]["role"] == "user"

    def regenerate(
        self,
        sampling: Sampling,
        on_text: Optional[TextCallback] = None,
        on_progress: Optional[ProgressCallback] = None,
    ) -> Optional[TurnResult]:
        """Answers the last user message again: the last answer is dropped and the session
        rolls back to the snapshot before it (so only the prompt's last token or two are fed
        again). None when the conversation does not end with a user message and its answer.
        A turn cancelled during the prefill (or an error) keeps the previous answer."""
        if not self.can_regenerate():
            return None
        msgs = self.messages
        old = (list(msgs), list(self._answers))
        self.messages = msgs[:-2]
        del self._answers[-1:]
        messages = self.messages + [msgs[-2]]
        try:
            prompt = self._canonical(self.encode(messages))
            result = self._run(prompt, sampling, on_text, on_progress, messages)
        except BaseException:
            self.messages, self._answers = old
            raise
        if result.stop == "cancelled":
            self.messages, self._answers = old
        return result

    def complete_raw(
        self,
        prompt_ids: List[int],
        sampling: Sampling,
        on_text: Optional[TextCallback] = None,
        on_progress: Optional[ProgressCallback] = None,
    ) -> TurnResult:
        """Continues raw token ids (no template, no conversation bookkeeping)."""
        self._history.reset()
        return self._run(list(prompt_ids), sampling, on_text, on_progress, None)

    def _run(self, prompt, sampling, on_text, on_progress, messages) -> TurnResult:
        tok = self.tok
        t0 = time.perf_counter()
        before = dict(self.model.stats())
        kept, how = self._reconcile(prompt) if messages is not None else (0, "raw")
        if how in self.reuse_counts:
            self.reuse_counts[how] += 1
        # split: feed through the last <｜Assistant｜> (snapshot there), then generate
        # starting with the rest (<think> or </think>)
        cut = turn_boundary(prompt, kept, tok.assistant_id)
        start = self.session.snapshot() if kept else None
        try:
            self._feed(prompt[kept:cut], on_progress)
            if messages is not None and cut > 0 and prompt[cut - 1] == tok.assistant_id:
                self._history.add_snapshot(cut, self.session.snapshot())
        except BaseException as e:  # Ctrl-C or an error (context full): undo the turn
            if start is not None:
                self.session.rollback(start)
            else:
                self.session.reset()
            self._history.sync()  # snapshots past the undone turn go
            if isinstance(e, KeyboardInterrupt):
                return TurnResult(prompt, [], "", "", "", "cancelled", {"stop": "cancelled"})
            raise
        t_prefill = time.perf_counter()

        thinking = self.thinking and messages is not None and prompt[-1] == tok.think_id
        a = stream_answer(self.session, tok, prompt[cut:], cut, sampling, thinking, on_text)
        if messages is not None:
            # the answer as the model wrote it, for later turns; cut by a stop string: the
            # answer is the text shown
            answer_ids = None if a.stop == "stop" else a.content_ids
            content = a.content if answer_ids is None else tok.decode(answer_ids)
            self.messages = messages + [
                {"role": "assistant", "content": content, "reasoning_content": a.reasoning}
            ]
            self._answers.append(answer_ids)
        head = {"turn": len(self.turns) + 1, "mode": self.mode if messages is not None else "raw"}
        stats = turn_stats(
            head,
            a,
            len(prompt),
            kept,
            how,
            (t0, t_prefill),
            (before, dict(self.model.stats())),
        )
        self.turns.append(stats)
        return TurnResult(prompt, a.ids, a.text, a.reasoning, a.content, a.stop, stats)
