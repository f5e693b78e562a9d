"""Text in, text out: ``Model.chat`` / ``chat_stream`` / ``complete`` / ``complete_stream``.

The layer between token ids and people (and the HTTP server). It owns no knowledge of the
chat format: prompts come from ``tokenizer.encode_prompt_ids`` (the format of
``encoding.py``), completions are split with the rules of ``encoding.parse_completion``
(tool-call blocks are handed to it verbatim), so the format lives in ``encoding.py`` only.

One module per step of a request:

* ``attached``: what a model carries for the text API (its tokenizer, its prompt cache);
* ``prompts``: a request checked and encoded into a :class:`Job` (``prepare_chat``,
  ``prepare_completion``) before any work, every argument error a ``ValueError``;
* ``cache``: the :class:`PromptCache`, idle sessions with snapshots at turn boundaries; a
  prompt resumes from the longest cached state that is a strict prefix of it
  (``resume.History``), and the output equals a cold run's;
* ``run``: :func:`run_job`, prefill then generation as ``(kind, value)`` events;
* ``stream``: what the run passes its text through: stop strings (``StopMatcher``, exact
  across tokens, never leaked) and the reasoning / content / tool-call split (``Splitter``);
* ``results``: the returned data (``Usage``, ``ChatResult``, ``ChatDelta``, …);
* ``api``: the public functions, a job run to the end or streamed.

This package exposes the public API below; code inside v4flash imports from the module that
defines a name.
"""

from __future__ import annotations

from .api import chat, chat_stream, collect_chat, collect_completion, complete, complete_stream
from .attached import cache_for, tokenizer_for, use_tokenizer
from .cache import PromptCache
from .prompts import ContextLengthError, Job, prepare_chat, prepare_completion
from .results import ChatDelta, ChatResult, CompletionDelta, CompletionResult, Usage
from .run import run_job

__all__ = [
    "ChatDelta",
    "ChatResult",
    "CompletionDelta",
    "CompletionResult",
    "ContextLengthError",
    "Job",
    "PromptCache",
    "Usage",
    "cache_for",
    "chat",
    "chat_stream",
    "collect_chat",
    "collect_completion",
    "complete",
    "complete_stream",
    "prepare_chat",
    "prepare_completion",
    "run_job",
    "tokenizer_for",
    "use_tokenizer",
]
