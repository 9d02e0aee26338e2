"""The servers' plumbing: a Unix socket, a connection cap, a thread of its own.

A tiny echo server shows the contract directly; the flood and descriptor tests go through
the egress proxy, the server the sandbox reaches first."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from net_helpers import FakeResolver, read_all, short_dir, unix_connect

from sono.net.policy import NetworkPolicy
from sono.net.proxy import ProxyThread
from sono.net.server import MAX_CONNECTIONS, ServerThread, UnixServer


class LineEcho(UnixServer):
    """Answers each connection's first line, then closes it."""

    async def start(self) -> None:
        await self._listen(self._handle)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            writer.write(b"echo " + await reader.readline())
            await writer.drain()
        writer.close()


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    with short_dir() as d:
        yield d


def test_a_server_on_a_thread_replaces_a_stale_socket_and_removes_it_on_stop(
    sock_dir: Path,
) -> None:
    path = sock_dir / "echo.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))  # left behind by a dead run
    stale.close()
    with ServerThread(LineEcho(path), "echo"), unix_connect(path) as sock:
        sock.sendall(b"hello\n")
        assert read_all(sock) == b"echo hello\n"
    assert not path.exists()


def test_start_raises_what_the_server_raised(sock_dir: Path) -> None:
    path = sock_dir / "echo.sock"
    path.write_text("a regular file is never replaced")
    with pytest.raises(OSError):
        ServerThread(LineEcho(path), "echo").start()
    assert path.read_text().startswith("a regular file")


def test_connections_past_the_cap_wait_and_are_served_once_others_go(sock_dir: Path) -> None:
    path = sock_dir / "echo.sock"
    server = LineEcho(path)
    server.max_connections = 2
    with ServerThread(server, "echo"):
        idle = [unix_connect(path) for _ in range(2)]  # hold both slots
        waiting = unix_connect(path)
        waiting.sendall(b"third\n")
        waiting.settimeout(0.5)
        with pytest.raises(TimeoutError):
            waiting.recv(100)
        idle[0].close()
        waiting.settimeout(10)
        assert read_all(waiting) == b"echo third\n"
        for sock in (waiting, *idle[1:]):
            sock.close()


# --- bounds, through the proxy ----------------------------------------------------------------


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _connect_blocked(path: Path) -> bytes:
    with unix_connect(path) as sock:
        sock.sendall(b"CONNECT blocked.test:443 HTTP/1.1\r\nHost: blocked.test:443\r\n\r\n")
        return read_all(sock)


def test_a_connection_flood_is_capped_and_the_proxy_keeps_serving(sock_dir: Path) -> None:
    """More connections than the cap, all idle (slowloris): the proxy holds at most the
    cap open, answers again as soon as they go, and never dies."""
    path = sock_dir / "proxy.sock"
    policy = NetworkPolicy("allowlist")
    with ProxyThread(policy, path, sock_dir / "denied.jsonl", FakeResolver({})):
        base = _open_fds()
        flood: list[socket.socket] = []
        for _ in range(MAX_CONNECTIONS + 150):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(str(path))
            except BlockingIOError:
                sock.close()
                continue
            sock.send(b"CONNECT ")  # a head that never ends
            flood.append(sock)
        time.sleep(0.5)
        client_side = len(flood)
        server_side = _open_fds() - base - client_side
        assert server_side <= MAX_CONNECTIONS + 5
        for sock in flood:
            sock.close()
        assert _connect_blocked(path).startswith(b"HTTP/1.1 403 ")


EMFILE_SCRIPT = """
import resource, socket, sys, time
from pathlib import Path
from sono.net.policy import NetworkPolicy
from sono.net.proxy import ProxyThread
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
d = Path(sys.argv[1])
with ProxyThread(NetworkPolicy("allowlist"), d / "p.sock", d / "denied.jsonl"):
    print("ready", flush=True)
    sys.stdin.readline()
    time.sleep(float(sys.argv[2]))
"""


def test_accept_survives_running_out_of_descriptors(sock_dir: Path) -> None:
    """The server process at its descriptor limit (EMFILE in accept): it pauses, then
    serves again once connections are gone."""
    child = subprocess.Popen(
        [sys.executable, "-c", EMFILE_SCRIPT, str(sock_dir), "3"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    try:
        assert child.stdout.readline().strip() == "ready"
        flood = []
        for _ in range(120):  # more than the 64 descriptors the server may have
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                sock.connect(str(sock_dir / "p.sock"))
            flood.append(sock)
        time.sleep(1.0)
        for sock in flood:
            sock.close()
        assert _connect_blocked(sock_dir / "p.sock").startswith(b"HTTP/1.1 403 ")
        assert child.poll() is None  # still alive
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=30) == 0
    finally:
        child.kill()
        child.wait()


class Raising(LineEcho):
    """A handler with a bug that input can reach: the first line ``boom`` raises."""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        if line.strip() == b"boom":
            int("\u00b2")  # ValueError, as a malformed number would
        writer.write(b"echo " + line)
        await writer.drain()
        writer.close()


def test_a_handler_error_ends_only_its_connection_and_prints_nothing(
    sock_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = sock_dir / "raise.sock"
    with ServerThread(Raising(path), "raise"):
        for _ in range(3):
            with unix_connect(path) as sock:
                sock.sendall(b"boom\n")
                assert read_all(sock) == b""  # closed, no answer
        with unix_connect(path) as sock:  # control: the server still serves
            sock.sendall(b"hello\n")
            assert read_all(sock) == b"echo hello\n"
    err = capfd.readouterr().err
    assert "Traceback" not in err and "exception was never retrieved" not in err
