"""Multi-turn chat: a conversation state machine that reuses the session between turns, and
the ``rich`` terminal front end of ``v4flash chat``.

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

Answers keep the ids the model generated: in the re-encoded prompt, each earlier answer's
content (the ids between ``<｜Assistant｜></think>`` and its EOS) is replaced by the generated
ids when they decode to the same text, because re-tokenizing generated text may split it
differently (common with a small vocabulary). Every other id, template and user text
alike, must match the session's exactly, or the session is not reused.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .encoding import END_THINK, ROLES, encoder_file
from .model import sample_params
from .resume import History, turn_boundary
from .textapi.stream import StopMatcher
from .tokenizer import encode_prompt_ids

PREFILL_CHUNK = 256  # the smallest prefill chunk of the engine (the plan's may be larger)
CHAT_SESSION_VERSION = 1  # of the conversation kept in a session file's metadata

TextCallback = Callable[[str, str], None]  # (kind: "reasoning" | "content", text)
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


def status_line(s: Dict[str, Any]) -> str:
    """One line: tokens, speed, time to first token, prefill, expert hit rate."""
    parts = [f"{s.get('generated_tokens', 0)} tokens"]
    if s.get("decode_tok_s") is not None:
        parts.append(f"{s['decode_tok_s']:.1f} tok/s")
    if s.get("ttft_s") is not None:
        parts.append(f"TTFT {s['ttft_s']:.2f} s")
    pre = f"prefill {s.get('prefill_tokens', 0)}"
    if s.get("reused_tokens"):
        pre += f" (reused {s['reused_tokens']}, {s.get('reuse')})"
    parts.append(pre)
    hit = s.get("expert_hit_rate")
    parts.append("experts " + ("-" if hit is None else f"{hit:.0%} hit"))
    if s.get("stop") not in (None, "eos"):
        parts.append(str(s["stop"]))
    return " · ".join(parts)


def detail_line(s: Dict[str, Any]) -> str:
    """``--verbose``: the status line's figures with their times, and the expert traffic."""
    pre_n, pre_s = s.get("prefill_tokens", 0), s.get("prefill_s") or 0.0
    pre = f"prefill {pre_n} tokens in {pre_s:.2f} s"
    if pre_n and pre_s:
        pre += f" ({pre_n / pre_s:.1f} tok/s)"
    pre += f", reused {s.get('reused_tokens', 0)} ({s.get('reuse')})"
    parts = [pre]
    if s.get("ttft_s") is not None:
        parts.append(f"TTFT {s['ttft_s']:.2f} s")
    dec = f"decode {s.get('generated_tokens', 0)} tokens"
    if s.get("decode_s"):
        dec += f" in {s['decode_s']:.2f} s"
    if s.get("decode_tok_s") is not None:
        dec += f" ({s['decode_tok_s']:.1f} tok/s)"
    parts.append(dec)
    hit = s.get("expert_hit_rate")
    parts.append(
        f"experts {s.get('expert_requests', 0)} requests, "
        + ("-" if hit is None else f"{hit:.0%}")
        + f" hit, {s.get('expert_bytes_read', 0) / (1 << 20):.1f} MB read"
    )
    parts.append(f"{s.get('session_tokens', 0)} tokens in the session")
    parts.append(f"stop: {s.get('stop')}")
    return " · ".join(parts)


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
        phase = "reasoning" if thinking else "content"
        dec = tok.stream_decoder()
        ids: List[int] = []
        parts: Dict[str, List[str]] = {"reasoning": [], "content": []}
        shown: List[str] = []  # the text as shown, </think> included (cut at a stop string)
        t_first = t_last = None
        stop, error = "length", None
        # stop strings are matched in the reasoning and in the answer (not across </think>)
        matcher = StopMatcher(sampling.stop)

        def show(kind: str, text: str) -> None:
            if text:
                parts[kind].append(text)
                shown.append(text)
                if on_text is not None:
                    on_text(kind, text)

        def emit(kind: str, text: str) -> None:
            show(kind, matcher.push(text))

        def take(t: int) -> bool:
            """Records a generated id and shows its text; True at EOS or a stop string."""
            nonlocal phase
            ids.append(t)
            if t == tok.eos_id:
                return True
            if phase == "reasoning" and t == tok.end_think_id:
                emit("reasoning", dec.flush())
                show("reasoning", matcher.flush())
                if matcher.stopped is None:
                    shown.append(END_THINK)
                phase = "content"
            else:
                emit(phase, dec.push(t))
            return matcher.stopped is not None

        try:
            stream = self.session.stream(
                prompt[cut:],
                max_new_tokens=sampling.max_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                seed=sampling.seed,
                stop_ids=[tok.eos_id],
            )
            for t in stream:
                t_last = time.perf_counter()
                if t_first is None:
                    t_first = t_last
                if take(t):
                    stop = "eos" if matcher.stopped is None else "stop"
                    break
        except KeyboardInterrupt:
            stop = "interrupted"
        except (ValueError, RuntimeError) as e:  # e.g. the context is full: keep what we have
            stop, error = "error", str(e)
        if stop in ("interrupted", "error"):
            # the session is the truth: a token sampled just as Ctrl-C arrived may not have
            # reached the loop above
            for t in self.session.tokens[len(prompt) + len(ids) :]:
                take(t)
        emit(phase, dec.flush())
        show(phase, matcher.flush())

        # the answer as the model wrote it: content ids (no EOS) for later turns
        body = ids[:-1] if stop == "eos" else list(ids)
        if thinking:
            if tok.end_think_id in body:
                j = body.index(tok.end_think_id)
                content_ids = body[j + 1 :]
            else:
                content_ids = []
        else:
            content_ids = body
        reasoning, content = "".join(parts["reasoning"]), "".join(parts["content"])
        answer_ids: Optional[List[int]] = content_ids
        if stop == "stop":  # cut by a stop string: the answer is the text shown
            answer_ids = None
        if messages is not None:
            self.messages = messages + [
                {
                    "role": "assistant",
                    "content": content if answer_ids is None else tok.decode(content_ids),
                    "reasoning_content": reasoning,
                }
            ]
            self._answers.append(answer_ids)

        after = dict(self.model.stats())
        req = after.get("expert_requests", 0) - before.get("expert_requests", 0)
        hits = after.get("expert_hits", 0) - before.get("expert_hits", 0)
        n = len(ids)
        decode_s = (t_last - t_first) if (t_first is not None and n > 1) else None
        stats = {
            "turn": len(self.turns) + 1,
            "mode": self.mode if messages is not None else "raw",
            "prompt_tokens": len(prompt),
            "reused_tokens": kept,
            "prefill_tokens": len(prompt) - kept,
            "reuse": how,
            "generated_tokens": n,
            "stop": stop,
            "prefill_s": round(t_prefill - t0, 4),
            "ttft_s": None if t_first is None else round(t_first - t0, 4),
            "decode_s": None if decode_s is None else round(decode_s, 4),
            "decode_tok_s": None if not decode_s else round((n - 1) / decode_s, 2),
            "expert_requests": req,
            "expert_hits": hits,
            "expert_hit_rate": (hits / req) if req else None,
            "expert_bytes_read": after.get("expert_bytes_read", 0)
            - before.get("expert_bytes_read", 0),
            "session_tokens": len(prompt) + n,
        }
        if error:
            stats["error"] = error
        self.turns.append(stats)
        text = "".join(shown) if stop == "stop" else tok.decode(ids)
        return TurnResult(prompt, ids, text, reasoning, content, stop, stats)


# ------------------------------------------------------------------------------------------
# The terminal front end
# ------------------------------------------------------------------------------------------


class PrefillBar:
    """A transient progress bar on a terminal for prompts of 512+ tokens (else silent; no
    console: never)."""

    def __init__(self, console: Any, min_tokens: int = 2 * PREFILL_CHUNK):
        self.console = console
        self.min_tokens = min_tokens
        self._progress: Any = None
        self._task: Any = None
        on = console is not None and console.is_terminal
        self.callback: Optional[ProgressCallback] = self._update if on else None

    def _update(self, done: int, total: int) -> None:
        if total < self.min_tokens:
            return
        if self._progress is None:
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

            self._progress = Progress(
                TextColumn("prefill"),
                BarColumn(),
                TaskProgressColumn(),
                TextColumn("{task.completed}/{task.total} tokens"),
                console=self.console,
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task("prefill", total=total)
        self._progress.update(self._task, completed=done)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


HELP = """commands:
  /think on|off    thinking mode (reasoning shown dimmed before the answer)
  /system TEXT     set the system prompt (/system alone clears it)
  /set KEY VALUE   temperature, top_p, top_k, seed (a number or random), max_tokens;
                   /set alone shows them
  /regen           answer the last message again (drops the last answer)
  /reset           start a new conversation
  /save FILE       write the conversation as JSON messages
  /load FILE       continue a saved conversation (JSON messages)
  /stats           per-turn and engine statistics
  /exit            quit (also /quit, Ctrl-D)
A paste is one message, whatever its lines; \"\"\" opens a multi-line message and \"\"\" closes it.
Ctrl-C stops the current answer and keeps the conversation."""

PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"  # bracketed paste (xterm, VT-style terminals)
PASTE_ON, PASTE_OFF = "\x1b[?2004h", "\x1b[?2004l"
BLOCK = '"""'


@dataclass
class Message:
    text: str
    literal: bool = False  # several lines (a paste, a """ block): a message, never a command


class MessageReader:
    """Turns raw input lines into messages.

    * A bracketed paste (the text a terminal sends between ``ESC[200~`` and ``ESC[201~``
      once bracketed-paste mode is on) is one message, whatever its newlines; so is a line
      that already holds newlines (GNU readline assembles a paste itself).
    * A line starting with ``\"\"\"`` opens a block, a line ending with ``\"\"\"`` closes it
      (as in ollama; ``\"\"\"one line\"\"\"`` is a block too): the lines between are one
      message. The end of input closes an open block.
    * Any other line is one message.

    ``read_line(kind)`` returns the next line without its newline, or None at the end of
    input; ``kind`` is ``"first"`` (a new message), ``"block"`` (inside a \"\"\" block) or
    ``"paste"`` (the rest of a paste)."""

    def __init__(self, read_line: Callable[[str], Optional[str]]):
        self.read_line = read_line
        self.eof = False

    def _line(self, kind: str) -> Optional[Tuple[str, bool]]:
        """(text, several_lines) with any bracketed paste resolved."""
        line = self.read_line(kind)
        if line is None:
            self.eof = True
            return None
        if PASTE_START not in line:
            text = line.replace(PASTE_END, "")
            return text, "\n" in text.strip("\r\n")
        before, _, rest = line.partition(PASTE_START)
        while PASTE_END not in rest:
            more = self.read_line("paste")
            if more is None:
                self.eof = True
                break
            rest += "\n" + more
        pasted, _, after = rest.partition(PASTE_END)
        text = before + pasted + after.replace(PASTE_START, "").replace(PASTE_END, "")
        text = text.replace("\r\n", "\n")
        return text, "\n" in text.strip("\r\n")

    def read(self) -> Optional[Message]:
        """The next message, or None at the end of input."""
        if self.eof:
            return None
        got = self._line("first")
        if got is None:
            return None
        text, several = got
        if several:
            return Message(text.strip("\r\n"), True)
        head = text.lstrip()
        if not head.startswith(BLOCK):
            return Message(text, False)
        rest = head[len(BLOCK) :].rstrip()
        if len(rest) >= len(BLOCK) and rest.endswith(BLOCK):
            return Message(rest[: -len(BLOCK)], True)
        lines = [rest] if rest else []
        while True:
            got = self._line("block")
            if got is None:
                break
            t = got[0].rstrip()
            if t.endswith(BLOCK):
                lines.append(t[: -len(BLOCK)])
                break
            lines.append(got[0])
        return Message("\n".join(lines).strip("\n"), True)


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _parse_int(v: str, lo: int) -> int:
    try:
        x = int(v)
    except ValueError:
        raise ValueError(f"expected an integer, got {v!r}") from None
    if x < lo:
        raise ValueError(f"expected an integer >= {lo}, got {v!r}")
    return x


def _sampling(name: str, convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """A /set parser for a sampling parameter: converted here, checked by the core's one rule
    (``model.sample_params``), whose message names the parameter."""
    what = "a number" if convert is float else "an integer"

    def parse(v: str) -> Any:
        if name == "seed" and v.lower() in ("random", "none", "off"):
            return None
        try:
            x = convert(v)
        except ValueError:
            raise ValueError(f"expected {what}, got {v!r}") from None
        sample_params(**{name: x})
        return x

    return parse


# /set KEY VALUE: the sampling knobs (names as the options and the OpenAI API spell them)
SETTINGS: Dict[str, Callable[[str], Any]] = {
    "temperature": _sampling("temperature", float),
    "top_p": _sampling("top_p", float),
    "top_k": _sampling("top_k", int),
    "seed": _sampling("seed", int),
    "max_tokens": lambda v: _parse_int(v, 1),
}
SETTING_ALIASES = {
    "temp": "temperature",
    "num_predict": "max_tokens",
    "max_new_tokens": "max_tokens",
}


class ChatApp:
    """Reads messages (terminal or piped stdin), runs commands and turns, renders with rich."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        sampling: Sampling,
        *,
        thinking: bool = False,
        system: Optional[str] = None,
        reasoning_effort: Optional[str] = None,
        demo: bool = False,
        stdin: Any = None,
        console: Any = None,
        verbosity: int = 0,
        session_path: Optional[Path] = None,
    ):
        from rich.console import Console

        self.conv = Conversation(
            model, tokenizer, thinking=thinking, system=system, reasoning_effort=reasoning_effort
        )
        # chat --session FILE: resumed at the start, saved at the end (not after a refusal)
        self.session_path = session_path
        self._overrides = (system, thinking, reasoning_effort)
        self._save_on_exit = False
        self.sampling = sampling
        self.demo = demo
        self.verbosity = verbosity  # -1 --quiet (no status lines), 0, 1 --verbose
        self.stdin = stdin if stdin is not None else sys.stdin
        self.out = console or Console(highlight=False, emoji=False, soft_wrap=True)
        self.err = Console(stderr=True, highlight=False, emoji=False)
        self.interactive = bool(getattr(self.stdin, "isatty", lambda: False)())
        self.reader = MessageReader(self._read_line)
        self._paste_mode = ""  # "readline" | "terminal" | "" (none)
        self._eof_newline = self.interactive
        if self.interactive:
            self._setup_terminal()

    # --- input ---------------------------------------------------------------------------

    def _setup_terminal(self) -> None:
        """Line editing, and bracketed paste so that a paste is one message: GNU readline
        asks the terminal for it around each line it reads (CPython turns it off); without
        readline the mode is switched on here for the whole chat and the markers are parsed
        from the lines. Not with libedit (macOS): its key handling would mangle the markers."""
        try:
            import readline
        except ImportError:
            readline = None  # type: ignore[assignment]
        if readline is not None:
            backend = getattr(readline, "backend", None) or (
                "editline" if "libedit" in (readline.__doc__ or "") else "readline"
            )
            if backend != "readline":
                return
            readline.parse_and_bind("set enable-bracketed-paste on")
            self._paste_mode = "readline"
            # readline >= 8.1 ends the line itself at EOF while the mode is on
            ver = getattr(readline, "_READLINE_LIBRARY_VERSION", "0")
            try:
                self._eof_newline = tuple(int(x) for x in ver.split(".")[:2]) < (8, 1)
            except ValueError:
                self._eof_newline = True
        elif os.name == "posix" and self.out.is_terminal:
            import atexit

            self._paste_mode = "terminal"
            self._write_terminal(PASTE_ON)
            atexit.register(self._restore_terminal)

    def _write_terminal(self, seq: str) -> None:
        try:
            self.out.file.write(seq)
            self.out.file.flush()
        except (OSError, ValueError):
            pass

    def _restore_terminal(self) -> None:
        if self._paste_mode == "terminal":
            self._paste_mode = ""
            self._write_terminal(PASTE_OFF)

    def _read_line(self, kind: str) -> Optional[str]:
        if self.interactive:
            prompt = {"first": "[bold green]you ›[/] ", "block": "[dim]...[/] "}.get(kind, "")
            try:
                return self.out.input(prompt)
            except EOFError:
                if self._eof_newline:  # Ctrl-D: leave the terminal at the start of a line
                    self.out.print()
                return None
        line = self.stdin.readline()
        if not line:
            return None
        return line.rstrip("\r\n")

    def _read(self) -> Optional[Message]:
        msg = self.reader.read()
        if msg is not None and not self.interactive:  # echo piped input
            self.out.print("you › " + msg.text.replace("\n", "\n      "), markup=False)
        return msg

    # --- loop ----------------------------------------------------------------------------

    def run(self) -> int:
        code = 1
        try:
            code = self._loop()
        finally:
            self._restore_terminal()
            if self._save_on_exit and not self.save_session():
                code = 1
        return code

    def resume_session(self) -> Optional[str]:
        """``--session FILE``: continues the conversation saved there (the options given on
        the command line, --system, --thinking, --reasoning-effort, override the saved ones),
        or starts a new one when there is no such file. Returns the note to show. A file that
        cannot be used raises ``ValueError``/``OSError``, and is then never overwritten."""
        path = self.session_path
        if path is None:
            return None
        try:
            n = self.conv.resume(path)
        except FileNotFoundError:
            self._save_on_exit = True
            return f"new session: the conversation is saved to {path} at exit"
        system, thinking, effort = self._overrides
        if system is not None:
            self.conv.set_system(system)
        if thinking:
            self.conv.set_thinking(True)
        if effort is not None:
            self.conv.reasoning_effort = effort
        self._save_on_exit = True
        tokens = self.conv.session.position
        return (
            f"resumed {_plural(n, 'message')} from {path} ({_plural(tokens, 'token')} of state, "
            "not prefilled again); saved there at exit"
        )

    def save_session(self) -> bool:
        """Writes the conversation to ``--session FILE``; a note either way."""
        path = self.session_path
        try:
            size = self.conv.save_session(path)
        except (OSError, ValueError, RuntimeError) as e:
            self.err.print(f"v4flash: error: cannot save the session to {path}: {e}", markup=False)
            return False
        self._note(f"session saved to {path} ({size / 1e6:.2f} MB)")
        return True

    def _loop(self) -> int:
        resumed = self.resume_session()
        mode = "thinking" if self.conv.thinking else "chat"
        title = "v4flash chat" + (" · tiny DEMO model (not DeepSeek)" if self.demo else "")
        self.out.print(f"[bold]{title}[/] · {mode} mode · /help for commands", highlight=False)
        if resumed:
            self._note(resumed)
        interrupts = 0
        while True:
            try:
                msg = self._read()
            except KeyboardInterrupt:
                self.out.print()
                interrupts += 1
                if interrupts > 1 or not self.interactive:
                    break
                self._note("Ctrl-C again, /exit or Ctrl-D to quit")
                continue
            interrupts = 0
            if msg is None:
                break
            text = msg.text.strip()
            if text:
                if text.startswith("/") and not msg.literal:
                    if self.command(text) == "exit":
                        break
                else:
                    self.turn(msg.text)
            if self.reader.eof:  # the input ended inside a block: that was the last message
                break
        return 0

    def command(self, text: str) -> Optional[str]:
        cmd, _, arg = text.partition(" ")
        arg = arg.strip()
        cmd = cmd.lower()
        if cmd in ("/exit", "/quit", "/bye"):
            return "exit"
        if cmd == "/think":
            if arg.lower() in ("on", "1", "true", "yes"):
                self.conv.set_thinking(True)
            elif arg.lower() in ("off", "0", "false", "no"):
                self.conv.set_thinking(False)
            elif arg:
                self._note("usage: /think on|off")
                return None
            self._note(f"thinking mode {'on' if self.conv.thinking else 'off'}")
        elif cmd == "/system":
            self.conv.set_system(arg)
            self._note(f"system prompt set: {arg}" if arg else "system prompt cleared")
        elif cmd == "/set":
            self._set(arg)
        elif cmd in ("/regen", "/retry"):
            self.regen()
        elif cmd == "/reset":
            self.conv.reset()
            self._note("conversation reset")
        elif cmd == "/stats":
            self.print_stats()
        elif cmd in ("/save", "/load"):
            self._save_load(cmd, arg)
        elif cmd in ("/help", "/?"):
            self.out.print(HELP, markup=False)
        else:
            self._note(f"unknown command {cmd}; /help lists them")
        return None

    def settings_text(self) -> str:
        s = self.sampling
        seed = "random" if s.seed is None else str(s.seed)
        text = (
            f"temperature {s.temperature:g} · top_p {s.top_p:g} · top_k {s.top_k} · "
            f"seed {seed} · max_tokens {s.max_tokens}"
        )
        if s.stop:
            text += " · stop " + ", ".join(repr(x) for x in s.stop)
        return text

    def _set(self, arg: str) -> None:
        words = arg.split()
        if words and words[0].lower() == "parameter":  # ollama's /set parameter KEY VALUE
            words = words[1:]
        if not words:
            self._note(self.settings_text())
            return
        key = words[0].lower().replace("-", "_")
        key = SETTING_ALIASES.get(key, key)
        if key not in SETTINGS:
            self._note(f"unknown setting {words[0]!r}; /set takes {', '.join(SETTINGS)}")
            return
        if len(words) != 2:
            self._note(f"usage: /set {key} VALUE")
            return
        try:
            value = SETTINGS[key](words[1])
        except ValueError as e:
            self._note(f"/set {key}: {e}")
            return
        setattr(self.sampling, key, value)
        self._note(f"{key} set to {'random' if value is None else value}")

    def regen(self) -> None:
        if not self.conv.can_regenerate():
            self._note("nothing to regenerate: the conversation does not end with an answer")
            return
        self._note("regenerating the last answer")
        result = self._answer(lambda *cb: self.conv.regenerate(self.sampling, *cb))
        if result is not None and result.stop == "cancelled":
            self._note("the previous answer stays")

    def _save_load(self, cmd: str, arg: str) -> None:
        if not arg:
            self._note(f"usage: {cmd} FILE")
            return
        path = Path(arg).expanduser()
        try:
            if cmd == "/save":
                doc = self.conv.export()
                path.write_text(json.dumps(doc, ensure_ascii=False, indent=1), encoding="utf-8")
                self._note(f"saved {len(doc)} messages to {path}")
            else:
                try:
                    doc = json.loads(path.read_text(encoding="utf-8"))
                except UnicodeDecodeError as e:
                    raise ValueError(f"not UTF-8 text ({e.reason})") from None
                n = self.conv.load(doc)
                self._note(f"loaded {n} messages from {path}")
        except (OSError, ValueError) as e:
            what = "save to" if cmd == "/save" else "load"
            self._note(f"cannot {what} {path}: {e}")

    def _note(self, msg: str) -> None:
        self.out.print(f"· {msg}", style="dim", markup=False)

    def turn(self, user_text: str) -> Optional[TurnResult]:
        return self._answer(lambda *cb: self.conv.respond(user_text, self.sampling, *cb))

    def _answer(self, go: Callable[..., Optional[TurnResult]]) -> Optional[TurnResult]:
        """Runs ``go(on_text, on_progress)`` and renders the answer as it streams."""
        from rich.text import Text

        out = self.out
        state = {"kind": None}

        def on_text(kind: str, text: str) -> None:
            if state["kind"] is None:
                out.print("assistant › ", style="bold cyan", end="")
                if kind == "reasoning":
                    out.print("[thinking] ", style="dim italic", end="", markup=False)
            elif kind != state["kind"]:
                out.print()
                out.print("[answer] ", style="dim italic", end="", markup=False)
            state["kind"] = kind
            out.print(Text(text, style="dim" if kind == "reasoning" else ""), end="")

        bar = PrefillBar(self.err if self.verbosity >= 0 else None)
        try:
            result = go(on_text, bar.callback)
        except (ValueError, RuntimeError) as e:
            out.print(f"error: {e}", style="red", markup=False)
            return None
        finally:
            bar.stop()
        if result is None:
            return None
        if state["kind"] is None:
            out.print("assistant › ", style="bold cyan", end="")
        out.print()
        if result.stop == "cancelled":
            self._note("cancelled during the prompt; the turn was dropped")
            return result
        if result.stop == "interrupted":
            self._note("stopped; the partial answer stays in the conversation")
        if result.stats.get("error"):
            out.print(f"error: {result.stats['error']}", style="red", markup=False)
        if self.verbosity > 0:
            out.print(f"[{detail_line(result.stats)}]", style="dim", markup=False)
        elif self.verbosity == 0:
            out.print(f"[{status_line(result.stats)}]", style="dim", markup=False)
        return result

    # --- stats ---------------------------------------------------------------------------

    def stats_doc(self) -> Dict[str, Any]:
        return {
            "turns": self.conv.turns,
            "reuse": dict(self.conv.reuse_counts),
            "engine": {k: v for k, v in self.conv.model.stats().items()},
            "sampling": asdict(self.sampling),
            "session_tokens": self.conv.session.position,
        }

    def print_stats(self) -> None:
        from rich import box
        from rich.table import Table

        t = Table(title="turns", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for col in (
            "#",
            "mode",
            "prompt",
            "reused",
            "prefill",
            "how",
            "gen",
            "tok/s",
            "TTFT",
            "hit",
        ):
            t.add_column(
                col,
                justify="left" if col in ("mode", "how") else "right",
                no_wrap=True,
                min_width={"mode": 8, "how": 8, "hit": 4, "tok/s": 5}.get(col, len(col)),
            )
        for s in self.conv.turns:
            hit = s.get("expert_hit_rate")
            t.add_row(
                str(s["turn"]),
                s["mode"],
                str(s["prompt_tokens"]),
                str(s["reused_tokens"]),
                str(s["prefill_tokens"]),
                s["reuse"],
                str(s["generated_tokens"]),
                "-" if s["decode_tok_s"] is None else f"{s['decode_tok_s']:.1f}",
                "-" if s["ttft_s"] is None else f"{s['ttft_s']:.2f}s",
                "-" if hit is None else f"{hit:.0%}",
            )
        self.out.print(t)
        e = self.conv.model.stats()
        hit = e.get("expert_hit_rate")
        threads = e["threads"]
        self.out.print(
            f"engine: prefill {e['prefill_tokens']} tok in {e['prefill_s']:.2f} s · decode "
            f"{e['decode_tokens']} tok in {e['decode_s']:.2f} s · experts "
            f"{e['expert_requests']} requests, "
            f"{'-' if hit is None else format(hit, '.1%')} hit, "
            f"{e['expert_bytes_read'] / (1 << 20):.1f} MB read · kernels {e['kernel_tier']} · "
            f"{threads} thread{'' if threads == 1 else 's'}",
            markup=False,
        )
