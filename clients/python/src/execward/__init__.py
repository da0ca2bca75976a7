"""execward: an asyncio client for the execward exec server."""

from .client import Client, ExitStatus, OutputChunk, Process, connect, decode_output_frame, file_uri
from .errors import (
    ConnectionLost,
    ExecwardError,
    InternalError,
    InvalidParams,
    InvalidRequest,
    MethodNotFound,
    NotFound,
    SandboxDenied,
    SessionAttached,
)

__all__ = [
    "Client",
    "ConnectionLost",
    "ExecwardError",
    "ExitStatus",
    "InternalError",
    "InvalidParams",
    "InvalidRequest",
    "MethodNotFound",
    "NotFound",
    "OutputChunk",
    "Process",
    "SandboxDenied",
    "SessionAttached",
    "connect",
    "decode_output_frame",
    "file_uri",
]
