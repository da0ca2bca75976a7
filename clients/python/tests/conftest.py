"""Starts the real exec-server ($EXECWARD_BIN_DIR, else the workspace's target/debug)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def bin_dir() -> Path:
    configured = os.environ.get("EXECWARD_BIN_DIR")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[3] / "target" / "debug"


def start_server(listen: str, user: int | None = None) -> tuple[subprocess.Popen[bytes], str]:
    server = subprocess.Popen(
        [str(bin_dir() / "exec-server"), "--listen", listen],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        user=user,
        group=user,
        extra_groups=[] if user is not None else None,
    )
    assert server.stdout is not None
    url = server.stdout.readline().decode().strip()
    assert url, "exec-server printed no URL"
    return server, url


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    server, url = start_server("ws://127.0.0.1:0")
    yield url
    server.terminate()
    server.wait(10)


@pytest.fixture(scope="session")
def unix_url() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as directory:
        server, url = start_server(f"unix:{directory}/exec.sock")
        yield url
        server.terminate()
        server.wait(10)


@pytest.fixture(scope="session", params=["root", "nobody"])
def sandbox_server(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    """(URL, uid) of a server as root and of one as uid 65534 (the suite runs as root)."""
    if request.param == "nobody":
        if os.geteuid() != 0:
            pytest.fail("the uid 65534 run needs root")
        server, url = start_server("ws://127.0.0.1:0", user=65534)
    else:
        server, url = start_server("ws://127.0.0.1:0")
    yield url, 65534 if request.param == "nobody" else os.geteuid()
    server.terminate()
    server.wait(10)
