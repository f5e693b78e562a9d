"""The one error type of the server: what went wrong, as an HTTP status and the fields every
API's error carries. Each dialect writes it in its own JSON shape (``openai.error_body``)."""

from __future__ import annotations

from typing import Optional


class ApiError(Exception):
    """``status`` and ``message``; ``param``: the request field at fault; ``code``: a machine
    reading of it (``context_length_exceeded``, ``auth``); ``kind``: client's or server's."""

    def __init__(
        self,
        status: int,
        message: str,
        param: Optional[str] = None,
        *,
        code: Optional[str] = None,
        kind: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status,
            message,
            param,
            code,
            kind,
        )
