"""``GET /metrics``: the server's counters in Prometheus' text format (0.0.4).

Names follow the pattern other engines use (``…_prompt_tokens_total``,
``…_generation_tokens_total``), prefixed ``v4flash_``: tokens (prompt, cached, generated),
requests by endpoint and status, the queue, time to first token and time per output token as
histograms, and the engine's own counters (expert cache hits, bytes read from disk) from
``Model.stats()``.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

TTFT_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class Histogram:
    def __init__(self, buckets: Sequence[float]):
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, v: float) -> None:
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1
        self.total += 1
        self.sum += v

    def lines(self, name: str) -> List[str]:
        out = [f'{name}_bucket{{le="{_num(b)}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{le="+Inf"}} {self.total}')
        out.append(f"{name}_sum {_num(self.sum)}")
        out.append(f"{name}_count {self.total}")
        return out


def _num(v: float) -> str:
    return repr(float(v)) if isinstance(v, float) and not float(v).is_integer() else str(v)


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generation_tokens = 0
        self.requests: Dict[Tuple[str, int], int] = {}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)

    def request(self, endpoint: str, status: int, usage: Any = None, timings: Any = None) -> None:
        with self._lock:
            key = (endpoint, status)
            self.requests[key] = self.requests.get(key, 0) + 1
            if usage is not None:
                self.prompt_tokens += usage.prompt_tokens
                self.cached_tokens += usage.cached_tokens
                self.generation_tokens += usage.completion_tokens
            t = timings or {}
            if t.get("ttft_s") is not None:
                self.ttft.observe(float(t["ttft_s"]) + float(t.get("queue_s") or 0))
            if t.get("decode_tok_s"):
                self.tpot.observe(1.0 / float(t["decode_tok_s"]))

    def render(self, running: int, queued: int, stats: Optional[Dict[str, Any]]) -> str:
        with self._lock:
            lines: List[str] = []

            def metric(name: str, kind: str, help_: str, samples: List[str]) -> None:
                lines.append(f"# HELP {name} {help_}")
                lines.append(f"# TYPE {name} {kind}")
                lines.extend(samples)

            metric(
                "v4flash_prompt_tokens_total",
                "counter",
                "Prompt tokens of finished requests (cached ones included).",
                [f"v4flash_prompt_tokens_total {self.prompt_tokens}"],
            )
            metric(
                "v4flash_prompt_tokens_cached_total",
                "counter",
                "Prompt tokens resumed from the prompt cache instead of prefilled.",
                [f"v4flash_prompt_tokens_cached_total {self.cached_tokens}"],
            )
            metric(
                "v4flash_generation_tokens_total",
                "counter",
                "Generated tokens.",
                [f"v4flash_generation_tokens_total {self.generation_tokens}"],
            )
            metric(
                "v4flash_requests_total",
                "counter",
                "Requests answered, by endpoint and HTTP status.",
                [
                    f'v4flash_requests_total{{endpoint="{e}",status="{s}"}} {n}'
                    for (e, s), n in sorted(self.requests.items())
                ],
            )
            metric(
                "v4flash_requests_running",
                "gauge",
                "Requests holding the engine.",
                [f"v4flash_requests_running {running}"],
            )
            metric(
                "v4flash_requests_queued",
                "gauge",
                "Requests waiting for the engine.",
                [f"v4flash_requests_queued {queued}"],
            )
            metric(
                "v4flash_time_to_first_token_seconds",
                "histogram",
                "Time from a request's arrival to its first generated token.",
                self.ttft.lines("v4flash_time_to_first_token_seconds"),
            )
            metric(
                "v4flash_time_per_output_token_seconds",
                "histogram",
                "Decode time per generated token, per request.",
                self.tpot.lines("v4flash_time_per_output_token_seconds"),
            )
        if stats:
            hit = stats.get("expert_hit_rate")
            engine = [
                ("v4flash_expert_requests_total", "counter", "Routed experts asked of the cache.",
                 stats.get("expert_requests")),
                ("v4flash_expert_hits_total", "counter", "Routed experts found in the cache.",
                 stats.get("expert_hits")),
                ("v4flash_expert_bytes_read_total", "counter", "Bytes of experts read from disk.",
                 stats.get("expert_bytes_read")),
                ("v4flash_expert_cache_hit_ratio", "gauge", "Expert cache hits per request.",
                 hit),
                ("v4flash_prefill_tokens_total", "counter", "Tokens prefilled by the engine.",
                 stats.get("prefill_tokens")),
                ("v4flash_decode_tokens_total", "counter", "Tokens decoded by the engine.",
                 stats.get("decode_tokens")),
            ]  # fmt: skip
            for name, kind, help_, v in engine:
                if v is not None:
                    metric(name, kind, help_, [f"{name} {_num(v)}"])
        return "\n".join(lines) + "\n"
