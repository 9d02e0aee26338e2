"""forward.py as a real subprocess: TCP on 127.0.0.1 → Unix socket → proxy → origin."""

from __future__ import annotations

import ast
import http.client
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from net_helpers import (
    TIMEOUT_S,
    EchoServer,
    FakeResolver,
    OriginServer,
    json_lines,
    read_all,
    read_until,
    short_dir,
)

from sono.net import forward
from sono.net.policy import NetworkPolicy
from sono.net.proxy import ProxyThread

SCRIPT = Path(forward.__file__)
POLICY = NetworkPolicy("allowlist", ("allowed.test", "127.0.0.1/32"))


Forwarder = Callable[..., tuple[subprocess.Popen[str], dict[str, int]]]


@pytest.fixture
def start_forward() -> Iterator[Forwarder]:
    """``start_forward(*args)`` runs the script and returns it and {socket path: TCP port}
    once it says ready; every process is stopped and reaped at teardown."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str) -> tuple[subprocess.Popen[str], dict[str, int]]:
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None
        ports: dict[str, int] = {}
        for line in proc.stdout:
            if line.strip() == "ready":
                return proc, ports
            kind, _, mapping = line.strip().partition(" ")
            assert kind == "listening", line
            listen, _, path = mapping.partition("=")
            ports[path] = int(listen.rsplit(":", 1)[1])
        raise AssertionError("forward.py exited before it was ready")

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
        with proc:  # closes the pipes and waits
            pass


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    with short_dir() as d:
        yield d


def test_http_through_tcp_unix_socket_and_proxy(sock_dir: Path, start_forward: Forwarder) -> None:
    proxy_sock = sock_dir / "proxy.sock"
    resolver = FakeResolver({"allowed.test": ["127.0.0.1"]})
    with (
        OriginServer() as origin,
        ProxyThread(POLICY, proxy_sock, sock_dir / "denied.jsonl", resolver),
    ):
        proc, ports = start_forward(f"127.0.0.1:0={proxy_sock}")
        try:
            port = ports[str(proxy_sock)]
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
            conn.request("GET", f"http://allowed.test:{origin.port}/through/forward")
            response = conn.getresponse()
            assert response.status == 200
            assert response.read() == b"origin saw GET /through/forward\n"
            conn.close()
            # A tunnel (as for HTTPS) to a host off the allowlist is refused.
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
            conn.set_tunnel("blocked.test", 443)
            with pytest.raises(OSError, match="403 Forbidden"):
                conn.request("GET", "/")
            conn.close()
        finally:
            proc.terminate()
            proc.wait(TIMEOUT_S)
    assert origin.seen[0].headers["host"] == f"allowed.test:{origin.port}"
    assert [line["host"] for line in json_lines(sock_dir / "denied.jsonl")] == ["blocked.test"]


def test_connect_tunnel_half_close_and_two_mappings(
    sock_dir: Path, start_forward: Forwarder
) -> None:
    resolver = FakeResolver({"allowed.test": ["127.0.0.1"]})
    a, b = sock_dir / "a.sock", sock_dir / "b.sock"
    ready = sock_dir / "ready"
    with (
        EchoServer() as echo,
        ProxyThread(POLICY, a, sock_dir / "a.jsonl", resolver),
        ProxyThread(POLICY, b, sock_dir / "b.jsonl", resolver),
    ):
        proc, ports = start_forward("--ready", str(ready), f"127.0.0.1:0={a}", f"127.0.0.1:0={b}")
        try:
            assert set(ports) == {str(a), str(b)}
            assert ready.read_text().splitlines()[-1] == "ready"
            for path in (a, b):
                with socket.create_connection(("127.0.0.1", ports[str(path)]), TIMEOUT_S) as sock:
                    sock.sendall(f"CONNECT allowed.test:{echo.port} HTTP/1.1\r\n\r\n".encode())
                    head, rest = read_until(sock, b"\r\n\r\n")
                    assert head.startswith(b"HTTP/1.1 200 ")
                    payload = path.name.encode() * 100_000
                    sock.sendall(payload)
                    sock.shutdown(socket.SHUT_WR)
                    assert read_all(sock, rest) == payload
        finally:
            proc.terminate()
            proc.wait(TIMEOUT_S)
    assert echo.connections == 2


def test_missing_socket_closes_the_client_connection(
    sock_dir: Path, start_forward: Forwarder
) -> None:
    proc, ports = start_forward(f"127.0.0.1:0={sock_dir / 'nothing.sock'}")
    port = ports[str(sock_dir / "nothing.sock")]
    with socket.create_connection(("127.0.0.1", port), TIMEOUT_S) as sock:
        assert read_all(sock) == b""
    proc.terminate()
    _, err = proc.communicate(timeout=TIMEOUT_S)
    assert "cannot connect" in err


def test_exits_when_stdin_closes(sock_dir: Path, start_forward: Forwarder) -> None:
    proc, _ = start_forward(f"127.0.0.1:0={sock_dir / 'x.sock'}")
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(TIMEOUT_S) == 0


def test_exits_on_sigterm_even_when_ignoring_stdin(
    sock_dir: Path, start_forward: Forwarder
) -> None:
    proc, ports = start_forward("--ignore-stdin", f"127.0.0.1:0={sock_dir / 'x.sock'}")
    assert proc.stdin is not None
    proc.stdin.close()
    port = ports[str(sock_dir / "x.sock")]
    with socket.create_connection(("127.0.0.1", port), TIMEOUT_S):
        pass  # still serving after stdin EOF
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(TIMEOUT_S) == 0


def test_bad_mapping_is_a_usage_error() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "127.0.0.1:notaport=/x.sock"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 2
    assert "HOST:PORT=SOCKET" in proc.stderr


def test_script_is_standalone_python39() -> None:
    source = SCRIPT.read_text()
    tree = ast.parse(source, feature_version=(3, 9))  # no match, no 3.10+ syntax
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (
            node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")]
        )
    }
    assert imported <= sys.stdlib_module_names
    assert "sono" not in imported
