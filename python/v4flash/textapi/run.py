"""Running a :class:`~v4flash.textapi.prompts.Job`: :func:`run_job` checks a session out of
the prompt cache (or takes a fresh one), prefills what the session does not hold yet, then
generates token by token, decoding UTF-8 safely, cutting at stop strings, splitting
reasoning / content / tool calls, under the job's grammar when it has one (a response
format, forced or strict tool calls). Everything comes out as ``(kind, value)`` events,
which the public functions (``api``) and the server's dialects turn into their own shapes.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ..resume import History, turn_boundary
from .attached import cache_for, tokenizer_for
from .cache import Lease, PromptCache
from .prompts import Job
from .results import Usage
from .stream import Splitter, StopMatcher


class _PrefillCancelled(Exception):
    """Raised from the prefill's progress callback to stop it (the request was cancelled)."""


Cancel = Callable[[], bool]


def _cache_of(job: Job) -> Optional[PromptCache]:
    if job.cache is True:
        return cache_for(job.model)
    if job.cache is False or job.cache is None:
        return None
    if isinstance(job.cache, PromptCache):
        return job.cache
    raise ValueError("cache must be True, False or a PromptCache")


def run_job(
    job: Job,
    cancel: Optional[Cancel] = None,
    progress: Optional[Callable[[int, int, int], None]] = None,
) -> Iterator[Tuple[str, Any]]:
    """Runs a job; yields ``(kind, value)`` events: ``"start"`` with ``{"prompt_tokens",
    "cached_tokens"}`` once the prompt cache has been consulted, ``"logprob"`` with ``{"id",
    "logprob", "top"}`` for each generated token when the job asks, ``"reasoning"`` /
    ``"content"`` / ``"text"`` (raw mode) with text, ``"tool_call"`` with a call, and finally
    ``"end"`` with
    ``{"finish_reason", "usage", "timings", "ids", "text", "stop_string"}``.

    ``cancel()`` is polled between prefill chunks and between tokens; when it returns True the
    run ends with ``finish_reason="cancelled"``. ``progress(done, total, cached)`` is called
    during the prefill (prompt tokens done of total, those taken from the cache included).
    Closing the iterator early is fine too: the session goes back to the cache either way.
    A job's ``reasoning_budget`` caps the reasoning: when it is spent, ``</think>`` is fed
    and the answer follows. A job's ``constraint`` (a compiled grammar) holds the answer to
    it, from the first token (chat, raw) or from ``</think>`` on (thinking).
    """
    model, tok = job.model, tokenizer_for(job.model)
    cache = _cache_of(job)
    cancel = cancel or (lambda: False)
    prompt = job.prompt
    t0 = time.perf_counter()
    spec0 = _speculation(model)
    if cache is not None:
        lease = cache.checkout(prompt)
    else:
        lease = Lease(History(model.session()), 0, "new")
    sess, cached = lease.session, lease.cached
    try:
        # prefill through the last <｜Assistant｜> (snapshot there), else all but the last token
        cut = turn_boundary(prompt, cached, tok.assistant_id)

        # the whole prefill in one call; the engine reports progress as it goes, and a
        # cancellation (client gone) is seen within ~20 ms, between layers
        def check(done: int, total: int) -> None:
            if cancel():
                raise _PrefillCancelled
            if progress is not None and total:
                n = cut - cached
                progress(cached + min(n, n * done // total), len(prompt), cached)

        if cancel():
            yield "end", _end("cancelled", job, cached, [], 0, 0, t0, None, None, "")
            return
        yield "start", {"prompt_tokens": len(prompt), "cached_tokens": cached}
        if cut > cached:
            try:
                sess.feed(prompt[cached:cut], progress=check)
            except _PrefillCancelled:
                yield "end", _end("cancelled", job, cached, [], 0, 0, t0, None, None, "")
                return
        if cut > cached and cache is not None:
            lease.entry.add_snapshot(cut, sess.snapshot())
        if progress is not None:  # the prompt is in (its last token goes with the first step)
            progress(len(prompt), len(prompt), cached)
        t_prefill = time.perf_counter()

        raw = job.mode == "raw"
        splitter = None if raw else Splitter(job.mode == "thinking", job.parse_tools)
        matcher = StopMatcher(job.stops)
        dec = tok.stream_decoder()
        ids: List[int] = []
        shown: List[str] = []
        reasoning_tokens = 0
        in_reasoning = job.mode == "thinking"
        room = int(model.ctx) - len(prompt)
        budget = min(job.max_new_tokens, room)
        feed = prompt[cut:]
        extra_prompt = 0
        think_budget = job.reasoning_budget if in_reasoning else None
        t_first: Optional[float] = None
        finish: Optional[str] = None

        def route(text: str) -> Iterator[Tuple[str, Any]]:
            if not text:
                return
            shown.append(text)
            if raw:
                yield "text", text
            else:
                yield from splitter.push(text)

        while finish is None:
            close_think = False
            args: Dict[str, Any] = dict(
                max_new_tokens=budget - len(ids),
                temperature=job.temperature,
                top_p=job.top_p,
                top_k=job.top_k,
                seed=(job.seed + len(ids)) % (1 << 64),
                stop_ids=[tok.eos_id],
            )
            if job.constraint is not None:
                # the answer's grammar; in the reasoning it waits for </think> (a sampled
                # EOS there becomes </think>: the answer is never left out)
                args["constraint"] = job.constraint
                args["wait_for"] = tok.end_think_id if in_reasoning else None
            if job.logprobs is None:
                stream = sess.stream(feed, **args)
            else:
                stream = sess.stream_logprobs(feed, top_logprobs=job.logprobs, **args)
            try:
                for t in stream:
                    if job.logprobs is not None:
                        t, lp, top = t
                        yield "logprob", {"id": int(t), "logprob": lp, "top": top}
                    t = int(t)
                    if t_first is None:
                        t_first = time.perf_counter()
                    ids.append(t)
                    if t == tok.eos_id:
                        finish = "stop"
                        break
                    if in_reasoning and t == tok.end_think_id:
                        in_reasoning = False
                        reasoning_tokens = len(ids)
                    yield from route(matcher.push(dec.push(t)))
                    if matcher.stopped is not None:
                        finish = "stop"
                        break
                    if cancel():
                        finish = "cancelled"
                        break
                    if in_reasoning and think_budget is not None and len(ids) >= think_budget:
                        close_think = True
                    if close_think or len(ids) >= budget:
                        break
            finally:
                close = getattr(stream, "close", None)
                if close is not None:
                    close()
            if finish is None and close_think and len(ids) < budget:
                # the reasoning budget is spent: close the reasoning, the answer follows
                in_reasoning = False
                reasoning_tokens = len(ids)
                yield from route(matcher.push(dec.push(tok.end_think_id)))
                feed = [tok.end_think_id]
                extra_prompt += len(feed)
                budget = min(budget, room - extra_prompt)
                if budget <= len(ids):
                    finish = "length"
            elif finish is None:
                finish = "length"
        if in_reasoning:
            reasoning_tokens = len(ids)
        if finish != "stop" or matcher.stopped is None:
            yield from route(matcher.push(dec.flush()))
            yield from route(matcher.flush())
        if splitter is not None:
            yield from splitter.finish()
            if splitter.calls and finish != "cancelled":
                finish = "tool_calls"
        yield (
            "end",
            _end(
                finish,
                job,
                cached,
                ids,
                reasoning_tokens,
                extra_prompt,
                t0,
                t_prefill,
                t_first,
                "".join(shown),
                matcher.stopped,
                _spec_delta(spec0, _speculation(model)),
            ),
        )
    finally:
        if cache is not None:
            cache.checkin(lease)


def _speculation(model: Any) -> Dict[str, Any]:
    return model.stats().get("speculation") or {}


def _spec_delta(before: Dict[str, Any], after: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """What speculation did during one request (requests run one at a time): verifies,
    drafted and accepted tokens, seconds saved; None when nothing was verified."""
    d = {k: after.get(k, 0) - before.get(k, 0) for k in ("verifies", "drafted", "accepted")}
    if not d["verifies"]:
        return None
    d["saved_s"] = round(after.get("saved_s", 0.0) - before.get("saved_s", 0.0), 4)
    return d


def _end(
    finish,
    job,
    cached,
    ids,
    reasoning_tokens,
    extra_prompt,
    t0,
    t_prefill,
    t_first,
    text,
    stop=None,
    speculation=None,
):
    t_end = time.perf_counter()
    n = len(ids)
    decode_s = (t_end - t_first) if t_first is not None else None
    timings = {
        "prefill_s": None if t_prefill is None else round(t_prefill - t0, 4),
        "ttft_s": None if t_first is None else round(t_first - t0, 4),
        "total_s": round(t_end - t0, 4),
        "decode_tok_s": round((n - 1) / decode_s, 2) if decode_s and n > 1 else None,
    }
    if speculation:
        timings["speculation"] = speculation
    usage = Usage(
        prompt_tokens=len(job.prompt) + extra_prompt,
        completion_tokens=n,
        cached_tokens=cached,
        reasoning_tokens=reasoning_tokens,
    )
    return {
        "finish_reason": finish,
        "usage": usage,
        "timings": timings,
        "ids": ids,
        "text": text,
        "stop_string": stop,
    }
