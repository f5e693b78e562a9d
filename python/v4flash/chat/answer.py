"""One answer of the chat, streamed from its session: the ids the model generates, shown as
text as they come (reasoning, then ``</think>``, then content), cut at a stop string, stopped
by Ctrl-C with what was generated kept; and the figures of the turn.

Stop strings are matched in the reasoning and in the answer, not across ``</think>``. The
session is the truth: a token sampled just as Ctrl-C arrived is shown too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..encoding import END_THINK
from ..textapi.stream import StopMatcher

TextCallback = Callable[[str, str], None]  # (kind: "reasoning" | "content", text)


@dataclass
class Answer:
    ids: List[int]  # generated ids (EOS included when it ended the answer)
    content_ids: List[int]  # the answer as the model wrote it: the content's ids, no EOS
    reasoning: str
    content: str
    text: str  # everything generated: as shown when cut at a stop string, else decoded
    stop: str  # "eos" | "stop" (a stop string) | "length" | "interrupted" | "error"
    error: Optional[str]
    t_first: Optional[float]  # when the first / last token came (perf_counter)
    t_last: Optional[float]


def stream_answer(
    session: Any,
    tok: Any,
    feed: List[int],
    held: int,
    sampling: Any,
    thinking: bool,
    on_text: Optional[TextCallback],
) -> Answer:
    """Feeds ``feed`` after the ``held`` tokens of ``session`` and generates the answer
    (``sampling``: a ``Sampling``); in ``thinking`` mode it starts with the reasoning."""
    phase = "reasoning" if thinking else "content"
    dec = tok.stream_decoder()
    ids: List[int] = []
    parts: Dict[str, List[str]] = {"reasoning": [], "content": []}
    shown: List[str] = []  # the text as shown, </think> included (cut at a stop string)
    t_first = t_last = None
    stop, error = "length", None
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
        stream = session.stream(
            feed,
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
        for t in session.tokens[held + len(feed) + len(ids) :]:
            take(t)
    emit(phase, dec.flush())
    show(phase, matcher.flush())

    body = ids[:-1] if stop == "eos" else list(ids)
    if thinking:
        j = body.index(tok.end_think_id) + 1 if tok.end_think_id in body else len(body)
        body = body[j:]
    text = "".join(shown) if stop == "stop" else tok.decode(ids)
    reasoning, content = "".join(parts["reasoning"]), "".join(parts["content"])
    return Answer(ids, body, reasoning, content, text, stop, error, t_first, t_last)


def turn_stats(
    head: Dict[str, Any],
    a: Answer,
    prompt_tokens: int,
    kept: int,
    how: str,
    times: Tuple[float, float],
    engine: Tuple[Dict[str, Any], Dict[str, Any]],
) -> Dict[str, Any]:
    """A turn's figures after ``head`` (its number and mode): tokens, reuse (``kept`` tokens
    resumed, ``how``), ``times`` (start, prefill done), the engine's expert traffic during it
    (its counters before and after)."""
    (t0, t_prefill), (before, after) = times, engine
    req = after.get("expert_requests", 0) - before.get("expert_requests", 0)
    hits = after.get("expert_hits", 0) - before.get("expert_hits", 0)
    n = len(a.ids)
    decode_s = (a.t_last - a.t_first) if (a.t_first is not None and n > 1) else None
    stats = {
        **head,
        "prompt_tokens": prompt_tokens,
        "reused_tokens": kept,
        "prefill_tokens": prompt_tokens - kept,
        "reuse": how,
        "generated_tokens": n,
        "stop": a.stop,
        "prefill_s": round(t_prefill - t0, 4),
        "ttft_s": None if a.t_first is None else round(a.t_first - t0, 4),
        "decode_s": None if decode_s is None else round(decode_s, 4),
        "decode_tok_s": None if not decode_s else round((n - 1) / decode_s, 2),
        "expert_requests": req,
        "expert_hits": hits,
        "expert_hit_rate": (hits / req) if req else None,
        "expert_bytes_read": after.get("expert_bytes_read", 0) - before.get("expert_bytes_read", 0),
        "session_tokens": prompt_tokens + n,
    }
    if a.error:
        stats["error"] = a.error
    return stats
