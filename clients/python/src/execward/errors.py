"""Typed exceptions for JSON-RPC errors of the execward server."""

from __future__ import annotations

from typing import Any


class ExecwardError(Exception):
    """A JSON-RPC error answer: its code, message and ``data.kind``."""

    def __init__(self, code: int, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(f"{message} (code {code}, kind {(data or {}).get('kind')})")
        self.code = code
        self.message = message
        self.data: dict[str, Any] = data or {}
        self.kind: str | None = self.data.get("kind")


class InvalidRequest(ExecwardError):
    """-32600: invalid request, or not allowed now."""


class SandboxDenied(InvalidRequest):
    """-32600 with ``data.kind == "sandboxDenied"``: the sandbox refused the operation."""


class MethodNotFound(ExecwardError):
    """-32601: unknown method."""


class InvalidParams(ExecwardError):
    """-32602: invalid params."""


class InternalError(ExecwardError):
    """-32603: internal error."""


class NotFound(ExecwardError):
    """-32004: not found (path, process, handle)."""


class SessionAttached(ExecwardError):
    """-32010: the session is still attached to another connection."""


class ConnectionLost(Exception):
    """The connection ended and could not be resumed."""


_BY_CODE: dict[int, type[ExecwardError]] = {
    -32600: InvalidRequest,
    -32601: MethodNotFound,
    -32602: InvalidParams,
    -32603: InternalError,
    -32004: NotFound,
    -32010: SessionAttached,
}


def error_from_json(error: dict[str, Any]) -> ExecwardError:
    """The typed exception for a JSON-RPC ``error`` object."""
    code = int(error.get("code", -32603))
    message = str(error.get("message", ""))
    data = error.get("data")
    data = data if isinstance(data, dict) else {}
    cls = _BY_CODE.get(code, ExecwardError)
    if code == -32600 and data.get("kind") == "sandboxDenied":
        cls = SandboxDenied
    return cls(code, message, data)
