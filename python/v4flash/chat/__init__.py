"""Multi-turn chat: ``v4flash chat`` in the terminal, and the conversation it runs.

* ``conversation``: :class:`Conversation`, the state machine (messages, the session that
  holds them, what each turn reuses of it), knowing nothing about the terminal;
* ``answer``: one answer streamed from the session (reasoning, content, stop strings,
  Ctrl-C) and the turn's figures;
* ``terminal``: :class:`ChatApp`, the ``rich`` front end (input, rendering, ``--session``);
* ``reader``: input lines into messages (a paste or a \"\"\" block is one message);
* ``commands``: the slash commands (``/set``, ``/regen``, ``/save``, …);
* ``display``: the status lines and the prefill bar (``v4flash run`` shows them too).

This package exposes the classes below; code inside v4flash imports from the module that
defines a name.
"""

from __future__ import annotations

from .conversation import Conversation, Sampling, TurnResult
from .terminal import ChatApp

__all__ = ["ChatApp", "Conversation", "Sampling", "TurnResult"]
