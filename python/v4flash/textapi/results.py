"""What the text API returns: token counts (:class:`Usage`), whole answers
(:class:`ChatResult`, :class:`CompletionResult`) and streamed pieces (:class:`ChatDelta`,
:class:`CompletionDelta`). Plain data: the server's dialects render them in their own JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens resumed from the prompt cache (not prefilled)
    reasoning_tokens: int = 0  # completion tokens up to and including </think>

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> Dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "cached_tokens": self.cached_tokens,
            "reasoning_tokens": self.reasoning_tokens,
        }


@dataclass
class ChatDelta:
    """One streamed piece of a chat answer. The last delta carries ``finish_reason``,
    ``usage`` and ``timings`` (and possibly text)."""

    reasoning: str = ""
    content: str = ""
    tool_calls: List[Dict[str, Any]] = field(default_factory=list)  # complete calls
    finish_reason: Optional[str] = None
    usage: Optional[Usage] = None
    timings: Optional[Dict[str, Any]] = None


@dataclass
class ChatResult:
    content: str
    reasoning: str
    tool_calls: List[Dict[str, Any]]  # OpenAI format: {"id", "type", "function": {...}}
    finish_reason: str  # "stop" | "length" | "tool_calls" | "cancelled"
    usage: Usage
    timings: Dict[str, Any] = field(default_factory=dict)
    text: str = ""  # the generated text as decoded (cut at a stop string)
    ids: List[int] = field(default_factory=list)  # the generated token ids
    stop_string: Optional[str] = None  # the stop string that ended the answer, if one did
    logprobs: Optional[List[Dict[str, Any]]] = None  # per generated token, when asked for

    @property
    def message(self) -> Dict[str, Any]:
        """The answer as an OpenAI assistant message, ready to append to ``messages``."""
        msg: Dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": dict(c["function"])}
                for c in self.tool_calls
            ]
        return msg


@dataclass
class CompletionDelta:
    text: str = ""
    finish_reason: Optional[str] = None
    usage: Optional[Usage] = None
    timings: Optional[Dict[str, Any]] = None


@dataclass
class CompletionResult:
    text: str
    finish_reason: str  # "stop" | "length" | "cancelled"
    usage: Usage
    timings: Dict[str, Any] = field(default_factory=dict)
    ids: List[int] = field(default_factory=list)
    stop_string: Optional[str] = None
    logprobs: Optional[List[Dict[str, Any]]] = None
