"""The asyncio client: connect, start processes, stream output, fs and http calls, resume."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import struct
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.asyncio.client import unix_connect
from websockets.exceptions import ConnectionClosed

from .errors import ConnectionLost, ExecwardError, SessionAttached, error_from_json

_STREAMS = {0: "stdout", 1: "stderr", 2: "pty"}
_FRAME_HEAD = struct.Struct(">BBQH")


@dataclass(frozen=True)
class OutputChunk:
    """One output chunk of a process, in seq order."""

    stream: str
    data: bytes
    seq: int


@dataclass(frozen=True)
class ExitStatus:
    """How a process ended (``process/exited`` plus the denials reported before ``closed``)."""

    code: int | None
    signal: int | None
    reason: str | None
    denials: list[dict[str, Any]] = field(default_factory=list)


def decode_output_frame(frame: bytes) -> tuple[str, OutputChunk]:
    """Decode a binary ``process/output`` frame (docs/protocol.md) into (processId, chunk)."""
    if len(frame) < _FRAME_HEAD.size:
        raise ValueError("binary frame shorter than its header")
    kind, stream, seq, id_len = _FRAME_HEAD.unpack_from(frame)
    if kind != 0x01:
        raise ValueError(f"binary frame of unknown kind {kind}")
    if stream not in _STREAMS:
        raise ValueError(f"binary frame of unknown stream {stream}")
    start = _FRAME_HEAD.size
    if id_len < 1 or start + id_len >= len(frame):
        raise ValueError("binary frame with an empty id, an id past its end, or no chunk")
    process_id = frame[start : start + id_len].decode("utf-8")
    return process_id, OutputChunk(_STREAMS[stream], bytes(frame[start + id_len :]), seq)


class Process:
    """A process started by :meth:`Client.start`. Events are delivered once, in seq order."""

    def __init__(self, client: Client, process_id: str) -> None:
        self._client = client
        self.process_id = process_id
        self.last_seq = 0
        self._pending: dict[int, tuple[str, dict[str, Any]]] = {}
        self._chunks: asyncio.Queue[OutputChunk | None] = asyncio.Queue()
        self._exit: dict[str, Any] | None = None
        self.denials: list[dict[str, Any]] = []
        self._denial_numbers: set[int] = set()
        self._closed = asyncio.Event()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def _event(self, seq: int, kind: str, params: dict[str, Any]) -> None:
        if seq <= self.last_seq or seq in self._pending:
            return
        self._pending[seq] = (kind, params)
        while self.last_seq + 1 in self._pending:
            self.last_seq += 1
            kind, params = self._pending.pop(self.last_seq)
            if kind == "output":
                self._chunks.put_nowait(params["chunk"])
            elif kind == "exited":
                self._exit = params
            elif kind == "closed":
                self._closed.set()
                self._chunks.put_nowait(None)

    def _denial(self, number: int, denial: dict[str, Any]) -> None:
        if number not in self._denial_numbers:
            self._denial_numbers.add(number)
            self.denials.append(denial)

    async def output(self) -> AsyncIterator[OutputChunk]:
        """Every output chunk once, in order, until the process is closed."""
        while True:
            chunk = await self._chunks.get()
            if chunk is None:
                self._chunks.put_nowait(None)
                return
            yield chunk

    async def write(self, data: bytes, *, close: bool = False) -> str:
        """Write to stdin; returns the server's status (``accepted``, ``stdinClosed``, ...).

        A write cut off by a dropped connection is sent again after the resume with the same
        ``writeId``, so the server applies it once.
        """
        params = {
            "processId": self.process_id,
            "chunk": base64.b64encode(data).decode(),
            "writeId": uuid.uuid4().hex,
            "close": close,
        }
        while True:
            try:
                result = await self._client.request("process/write", params)
            except ConnectionLost:
                if self._client._failure is not None:
                    raise
                continue
            return str(result["status"])

    async def close_stdin(self) -> str:
        return await self.write(b"", close=True)

    async def signal(self, signal: str) -> bool:
        """Send ``interrupt``, ``terminate``, ``kill`` or ``hangup``; returns ``running``."""
        result = await self._client.request(
            "process/signal", {"processId": self.process_id, "signal": signal}
        )
        return bool(result.get("running"))

    async def terminate(self) -> bool:
        result = await self._client.request("process/terminate", {"processId": self.process_id})
        return bool(result.get("running"))

    async def wait(self) -> ExitStatus:
        """Wait until the process is closed; its exit status and denials."""
        await self._closed.wait()
        exit_ = self._exit or {}
        return ExitStatus(
            exit_.get("exitCode"), exit_.get("signal"), exit_.get("reason"), list(self.denials)
        )


class Client:
    """A connection to an execward server holding one session; resumes it after a disconnect."""

    def __init__(
        self,
        url: str,
        token: str | None,
        client_name: str,
        binary_output: bool,
        resume_attempts: int,
    ) -> None:
        self.url = url
        self._token = token
        self._client_name = client_name
        self._binary_output = binary_output
        self._resume_attempts = resume_attempts
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._processes: dict[str, Process] = {}
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()
        self._closing = False
        self._failure: BaseException | None = None
        self.session_id: str | None = None
        self.binary_output = False
        self.resumes = 0

    async def _open(self) -> ClientConnection:
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else None
        if self.url.startswith("unix:"):
            return await unix_connect(
                self.url[len("unix:") :],
                uri="ws://localhost/",
                additional_headers=headers,
                max_size=None,
            )
        return await ws_connect(self.url, additional_headers=headers, max_size=None)

    async def _attach(self) -> None:
        ws = await self._open()
        self._ws = ws
        self._reader = asyncio.create_task(self._read_loop(ws))
        params: dict[str, Any] = {"clientName": self._client_name}
        if self._binary_output:
            params["binaryOutput"] = True
        if self.session_id is not None:
            params["resumeSessionId"] = self.session_id
        result = await self._send_request(ws, "initialize", params)
        self.session_id = str(result["sessionId"])
        self.binary_output = bool(result.get("binaryOutput"))
        await ws.send(json.dumps({"method": "initialized", "params": {}}))
        self._connected.set()

    async def _read_loop(self, ws: ClientConnection) -> None:
        try:
            async for message in ws:
                if isinstance(message, bytes) and message[:1] == b"\x01":
                    process_id, chunk = decode_output_frame(message)
                    process = self._processes.get(process_id)
                    if process is not None:
                        process._event(chunk.seq, "output", {"chunk": chunk})
                    continue
                self._dispatch(json.loads(message))
        except ConnectionClosed:
            pass
        finally:
            if self._ws is ws:
                self._connected.clear()
                for future in self._pending.values():
                    if not future.done():
                        future.set_exception(ConnectionLost("connection closed"))
                self._pending.clear()
                if not self._closing:
                    asyncio.get_running_loop().create_task(self._resume())

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "id" in message and ("result" in message or "error" in message):
            future = self._pending.pop(message["id"], None)
            if future is None or future.done():
                return
            if "error" in message:
                future.set_exception(error_from_json(message["error"]))
            else:
                future.set_result(message["result"])
            return
        method = message.get("method")
        params = message.get("params") or {}
        process = self._processes.get(params.get("processId", ""))
        if process is None:
            return
        if method == "process/output":
            chunk = OutputChunk(
                params["stream"], base64.b64decode(params["chunk"]), int(params["seq"])
            )
            process._event(chunk.seq, "output", {"chunk": chunk})
        elif method == "process/exited":
            process._event(int(params["seq"]), "exited", params)
        elif method == "process/closed":
            process._event(int(params["seq"]), "closed", params)
        elif method == "process/denied":
            process._denial(int(params["number"]), params["denial"])

    async def _resume(self) -> None:
        """Re-attach the session, then read every process's events after its last seq."""
        for attempt in range(self._resume_attempts):
            try:
                await self._attach()
                break
            except SessionAttached:
                await asyncio.sleep(0.05 * (attempt + 1))
            except (OSError, ConnectionClosed, ConnectionLost):
                await asyncio.sleep(0.05 * (attempt + 1))
            except ExecwardError as error:
                self._fail(error)
                return
        else:
            self._fail(ConnectionLost("could not resume the session"))
            return
        self.resumes += 1
        try:
            for process in list(self._processes.values()):
                await self._catch_up(process)
        except (ConnectionLost, ConnectionClosed):
            pass  # the next resume catches up again

    async def _catch_up(self, process: Process) -> None:
        while not process.closed:
            result = await self.request(
                "process/read",
                {
                    "processId": process.process_id,
                    "afterSeq": process.last_seq,
                    "afterDenial": max(process._denial_numbers, default=0),
                },
            )
            if result.get("outputDropped"):
                self._fail(ConnectionLost(f"output of {process.process_id} was dropped"))
                return
            for chunk in result.get("chunks", []):
                data = base64.b64decode(chunk["chunk"])
                item = OutputChunk(chunk["stream"], data, int(chunk["seq"]))
                process._event(item.seq, "output", {"chunk": item})
            denials = result.get("denials") or []
            first = int(result.get("nextDenial", len(denials) + 1)) - len(denials)
            for number, denial in enumerate(denials, start=first):
                process._denial(number, denial)
            if result.get("exited") and result.get("exitSeq") is not None:
                process._event(
                    int(result["exitSeq"]),
                    "exited",
                    {
                        "exitCode": result.get("exitCode"),
                        "signal": result.get("signal"),
                        "reason": result.get("exitReason"),
                    },
                )
            if result.get("closed") and result.get("closedSeq") is not None:
                process._event(int(result["closedSeq"]), "closed", {})
            if int(result.get("nextSeq", 0)) - 1 <= process.last_seq:
                return  # caught up; notifications carry the rest

    def _fail(self, error: BaseException) -> None:
        self._failure = error
        for process in self._processes.values():
            if not process.closed:
                process._chunks.put_nowait(None)
                process._closed.set()

    async def _send_request(self, ws: ClientConnection, method: str, params: Any) -> Any:
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        await ws.send(json.dumps({"id": request_id, "method": method, "params": params}))
        return await future

    async def request(self, method: str, params: Mapping[str, Any] | None = None) -> Any:
        """Send one JSON-RPC request; its result, or a typed :class:`ExecwardError`."""
        if self._failure is not None:
            raise ConnectionLost("the session is lost") from self._failure
        await self._connected.wait()
        assert self._ws is not None
        return await self._send_request(self._ws, method, dict(params or {}))

    async def start(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str] | None = None,
        env_policy: Mapping[str, Any] | None = None,
        tty: bool = False,
        pipe_stdin: bool = False,
        sandbox: Mapping[str, Any] | None = None,
        limits: Mapping[str, Any] | None = None,
        audit_denials: bool = False,
        process_id: str | None = None,
    ) -> Process:
        """``process/start``; the returned :class:`Process` streams its output.

        ``cwd`` is required, as the server requires it: the directory the command runs in on
        the server's machine (a local directory means nothing to a remote server).
        """
        process_id = process_id or uuid.uuid4().hex
        params: dict[str, Any] = {
            "processId": process_id,
            "argv": list(argv),
            "cwd": cwd,
            "env": dict(env or {}),
            "tty": tty,
            "pipeStdin": pipe_stdin,
        }
        if env_policy is not None:
            params["envPolicy"] = dict(env_policy)
        if sandbox is not None:
            params["sandbox"] = dict(sandbox)
        if limits is not None:
            params["limits"] = dict(limits)
        if audit_denials:
            params["auditDenials"] = True
        process = Process(self, process_id)
        self._processes[process_id] = process
        try:
            await self.request("process/start", params)
        except BaseException:
            del self._processes[process_id]
            raise
        return process

    # Files (paths are file: URIs; see file_uri).
    async def fs_read_file(self, path: str, *, sandbox: Mapping[str, Any] | None = None) -> bytes:
        result = await self.request("fs/readFile", _with_sandbox({"path": path}, sandbox))
        return base64.b64decode(result["dataBase64"])

    async def fs_write_file(
        self,
        path: str,
        data: bytes,
        *,
        atomic: bool = False,
        sandbox: Mapping[str, Any] | None = None,
    ) -> None:
        params = {"path": path, "dataBase64": base64.b64encode(data).decode(), "atomic": atomic}
        await self.request("fs/writeFile", _with_sandbox(params, sandbox))

    async def fs_create_directory(
        self, path: str, *, recursive: bool = True, sandbox: Mapping[str, Any] | None = None
    ) -> None:
        params = {"path": path, "recursive": recursive}
        await self.request("fs/createDirectory", _with_sandbox(params, sandbox))

    async def fs_get_metadata(
        self, path: str, *, sandbox: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        return dict(await self.request("fs/getMetadata", _with_sandbox({"path": path}, sandbox)))

    async def fs_canonicalize(self, path: str, *, sandbox: Mapping[str, Any] | None = None) -> str:
        result = await self.request("fs/canonicalize", _with_sandbox({"path": path}, sandbox))
        return str(result["path"])

    async def fs_read_directory(
        self, path: str, *, sandbox: Mapping[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        result = await self.request("fs/readDirectory", _with_sandbox({"path": path}, sandbox))
        return list(result["entries"])

    async def fs_walk(
        self,
        path: str,
        *,
        max_depth: int = 256,
        max_entries: int = 10000,
        sandbox: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        params = {"path": path, "maxDepth": max_depth, "maxEntries": max_entries}
        return dict(await self.request("fs/walk", _with_sandbox(params, sandbox)))

    async def fs_remove(
        self,
        path: str,
        *,
        recursive: bool = True,
        force: bool = True,
        sandbox: Mapping[str, Any] | None = None,
    ) -> None:
        params = {"path": path, "recursive": recursive, "force": force}
        await self.request("fs/remove", _with_sandbox(params, sandbox))

    async def fs_copy(
        self,
        source: str,
        destination: str,
        *,
        recursive: bool = False,
        sandbox: Mapping[str, Any] | None = None,
    ) -> None:
        params = {"sourcePath": source, "destinationPath": destination, "recursive": recursive}
        await self.request("fs/copy", _with_sandbox(params, sandbox))

    async def http_request(
        self,
        method: str,
        url: str,
        *,
        headers: Sequence[tuple[str, str]] = (),
        body: bytes | None = None,
        timeout_ms: int | None = None,
        sandbox: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A buffered ``http/request``; ``body`` of the result is bytes."""
        params: dict[str, Any] = {
            "method": method,
            "url": url,
            "requestId": uuid.uuid4().hex,
            "headers": [{"name": n, "value": v} for n, v in headers],
        }
        if body is not None:
            params["bodyBase64"] = base64.b64encode(body).decode()
        if timeout_ms is not None:
            params["timeoutMs"] = timeout_ms
        result = dict(await self.request("http/request", _with_sandbox(params, sandbox)))
        result["body"] = base64.b64decode(result.pop("bodyBase64", ""))
        return result

    def drop_connection(self) -> None:
        """Abort the socket without closing the session (it is then resumed); for tests."""
        if self._ws is not None:
            self._ws.transport.abort()

    async def close(self) -> None:
        self._closing = True
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            await self._reader

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _with_sandbox(params: dict[str, Any], sandbox: Mapping[str, Any] | None) -> dict[str, Any]:
    if sandbox is not None:
        params["sandbox"] = dict(sandbox)
    return params


def file_uri(path: str) -> str:
    """The ``file:`` URI of an absolute native path."""
    from urllib.parse import quote

    return "file://" + quote(path)


async def connect(
    url: str,
    *,
    token: str | None = None,
    client_name: str = "execward-python",
    binary_output: bool = True,
    resume_attempts: int = 50,
) -> Client:
    """Connect to ``ws://...``, ``wss://...`` or ``unix:/path`` and initialize a session."""
    if token is not None and url.startswith("ws://"):
        host = url[len("ws://") :].split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
        if host not in ("localhost", "::1") and not host.startswith("127."):
            raise ValueError("a token is sent over plain ws:// only to a loopback host")
    client = Client(url, token, client_name, binary_output, resume_attempts)
    await client._attach()
    return client
