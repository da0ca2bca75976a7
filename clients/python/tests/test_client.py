"""The Python client against the real exec-server."""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
from collections.abc import Awaitable, Callable

import pytest

import execward
from execward import file_uri

ENV = {"PATH": "/usr/bin:/bin"}


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 20))


async def collect(process: execward.Process) -> tuple[bytes, list[int]]:
    data = b""
    seqs: list[int] = []
    async for chunk in process.output():
        data += chunk.data
        seqs.append(chunk.seq)
    return data, seqs


@pytest.mark.parametrize("binary", [True, False])
def test_start_output_both_frame_forms(server_url: str, binary: bool) -> None:
    async def body() -> None:
        client = await execward.connect(server_url, binary_output=binary)
        assert client.binary_output is binary
        with pytest.raises(TypeError, match="cwd"):
            await client.start(["true"])  # type: ignore[call-arg]
        process = await client.start(
            ["sh", "-c", "printf out; printf err >&2; exit 3"], cwd="/tmp", env=ENV
        )
        chunks = [chunk async for chunk in process.output()]
        status = await process.wait()
        assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"out"
        assert b"".join(c.data for c in chunks if c.stream == "stderr") == b"err"
        assert [c.seq for c in chunks] == sorted(c.seq for c in chunks)
        assert (status.code, status.signal, status.reason) == (3, None, "exit")
        await client.close()

    run(body)


def test_unix_socket_and_stdin(unix_url: str) -> None:
    async def body() -> None:
        client = await execward.connect(unix_url)
        process = await client.start(["cat"], cwd="/tmp", env=ENV, pipe_stdin=True)
        assert await process.write(b"hello ") == "accepted"
        assert await process.write(b"world", close=True) == "accepted"
        data, _ = await collect(process)
        assert data == b"hello world"
        assert (await process.wait()).code == 0
        assert await process.write(b"late") == "stdinClosed"
        await client.close()

    run(body)


def test_signal_and_terminate_reasons(server_url: str) -> None:
    async def body() -> None:
        client = await execward.connect(server_url)
        killed = await client.start(["sleep", "30"], cwd="/tmp", env=ENV)
        assert await killed.signal("kill") is True
        status = await killed.wait()
        assert (status.signal, status.reason) == (signal.SIGKILL, "signal")
        termed = await client.start(["sleep", "30"], cwd="/tmp", env=ENV)
        assert await termed.terminate() is True
        status = await termed.wait()
        assert (status.signal, status.reason) == (signal.SIGTERM, "terminated")
        await client.close()

    run(body)


def test_sandboxed_write_is_denied(sandbox_server: tuple[str, int]) -> None:
    url, uid = sandbox_server

    async def body() -> None:
        client = await execward.connect(url)
        with tempfile.TemporaryDirectory(dir="/var/tmp") as directory:
            os.chmod(directory, 0o777)  # the uid 65534 server's control must be able to write
            target = os.path.join(directory, "landed")
            script = f"echo x > {target}"
            # Control: without a sandbox the same command writes the file.
            control = await client.start(["sh", "-c", script], cwd="/tmp", env=ENV)
            assert (await control.wait()).code == 0
            assert os.stat(target).st_uid == uid  # the command ran as the server's uid
            os.unlink(target)
            process = await client.start(
                ["sh", "-c", script],
                cwd="/tmp",
                env=ENV,
                sandbox={"profile": "read-only"},
            )
            data, _ = await collect(process)
            assert (await process.wait()).code != 0
            assert not os.path.exists(target)
            with pytest.raises(execward.SandboxDenied) as denied:
                await client.fs_write_file(
                    file_uri(target), b"x", sandbox={"profile": "read-only"}
                )
            assert denied.value.code == -32600
            assert denied.value.kind == "sandboxDenied"
            assert not os.path.exists(target)
        await client.close()

    run(body)


def test_fs_round_trip(server_url: str) -> None:
    async def body() -> None:
        client = await execward.connect(server_url)
        with tempfile.TemporaryDirectory() as directory:
            sub = file_uri(os.path.join(directory, "a b"))
            await client.fs_create_directory(sub)
            path = file_uri(os.path.join(directory, "a b", "f.bin"))
            data = bytes(range(256)) * 3
            await client.fs_write_file(path, data)
            assert await client.fs_read_file(path) == data
            with open(os.path.join(directory, "a b", "f.bin"), "rb") as f:
                assert f.read() == data
            entries = await client.fs_read_directory(sub)
            assert [e["fileName"] for e in entries] == ["f.bin"]
            assert (await client.fs_get_metadata(path))["size"] == len(data)
            copy = file_uri(os.path.join(directory, "copy"))
            await client.fs_copy(path, copy)
            assert await client.fs_read_file(copy) == data
            await client.fs_remove(sub)
            assert not os.path.exists(os.path.join(directory, "a b"))
            with pytest.raises(execward.NotFound) as missing:
                await client.fs_read_file(path)
            assert (missing.value.code, missing.value.kind) == (-32004, "notFound")
        await client.close()

    run(body)


@pytest.mark.parametrize("binary", [True, False])
def test_resume_after_drop_delivers_every_byte_once(server_url: str, binary: bool) -> None:
    async def body() -> None:
        client = await execward.connect(server_url, binary_output=binary)
        session = client.session_id
        script = "i=0; while [ $i -lt 400 ]; do echo line-$i; i=$((i+1)); sleep 0.002; done"
        process = await client.start(["sh", "-c", script], cwd="/tmp", env=ENV)
        data = b""
        seqs: list[int] = []
        dropped = False
        async for chunk in process.output():
            data += chunk.data
            seqs.append(chunk.seq)
            if not dropped and b"line-50\n" in data:
                # Stop reading so notifications the server sends pile up in the socket's
                # buffers, then abort it: those are lost and only process/read recovers them.
                client._ws.transport.pause_reading()  # type: ignore[union-attr]
                await asyncio.sleep(0.2)
                client.drop_connection()
                dropped = True
        assert dropped and client.resumes >= 1
        assert client.session_id == session
        assert seqs == list(range(1, len(seqs) + 1))
        expected = "".join(f"line-{i}\n" for i in range(400)).encode()
        assert data == expected
        assert (await process.wait()).code == 0
        await client.close()

    run(body)


def test_bad_request_gives_typed_exception(server_url: str) -> None:
    async def body() -> None:
        client = await execward.connect(server_url)
        with pytest.raises(execward.InvalidParams) as native:
            await client.fs_read_file("/etc/hostname")
        assert (native.value.code, native.value.kind) == (-32602, "invalidPath")
        assert "file:///etc/hostname" in native.value.message
        with pytest.raises(execward.MethodNotFound) as unknown:
            await client.request("no/such", {})
        assert (unknown.value.code, unknown.value.kind) == (-32601, "methodNotFound")
        with pytest.raises(execward.InvalidRequest) as twice:
            await client.request("initialize", {"clientName": "again"})
        assert twice.value.kind == "alreadyInitialized"
        # The connection still serves.
        process = await client.start(["true"], cwd="/tmp", env=ENV)
        assert (await process.wait()).code == 0
        await client.close()

    run(body)


def test_output_frame_decoding_refuses_malformed_frames() -> None:
    good = b"\x01\x01" + (7).to_bytes(8, "big") + (1).to_bytes(2, "big") + b"pX"
    process_id, chunk = execward.decode_output_frame(good)
    assert (process_id, chunk.stream, chunk.seq, chunk.data) == ("p", "stderr", 7, b"X")
    for bad in [good[:-1], b"\x02" + good[1:], good[:1] + b"\x03" + good[2:], good[:10] + b"\0\0p"]:
        with pytest.raises(ValueError):
            execward.decode_output_frame(bad)
