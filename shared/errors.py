"""The in-process exception that becomes a coded error reply at a process boundary."""

from __future__ import annotations


class CodedError(Exception):
    """Something went wrong that a caller can act on; ``code`` is stable, ``message`` teaches.

    Raised inside a process; the RPC layer turns it into an error reply, never a
    traceback on the wire.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        path: str | None = None,
        retry_after_ms: int | None = None,
        detail: dict[str, str] | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.path = path
        self.retry_after_ms = retry_after_ms
        self.detail = detail or {}
