"""Sampling parameters, checked by the core's one rule (``SampleParams::new`` in
``rust/model/sample.rs``): every front end (the Python API, the text API, the server's
dialects, the CLI, the chat's ``/set``) converts its input and calls :func:`sample_params`.
A leaf module (it imports only the core), so that any of them can."""

from __future__ import annotations

from typing import Any, NamedTuple

from . import _core


class SampleParams(NamedTuple):
    """Sampling parameters checked by the core (``sample_params``)."""

    temperature: float
    top_p: float
    top_k: int
    seed: int


def sample_params(
    temperature: Any = 1.0, top_p: Any = 1.0, top_k: Any = 0, seed: Any = None
) -> SampleParams:
    """Checks sampling parameters with the core's rules (the one place they live:
    ``SampleParams::new`` in ``rust/model/sample.rs``); ``seed`` None draws a random one.
    ``ValueError`` names the parameter first (``"top_p must be in (0, 1], got 2"``)."""
    return SampleParams(*_core.sample_params(temperature, top_p, top_k, seed))
