"""The egress proxy on a real Unix socket, in front of real local TCP servers."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from net_helpers import (
    EchoServer,
    FakeResolver,
    OriginServer,
    exchange,
    json_lines,
    read_all,
    read_until,
    short_dir,
    unix_connect,
)

from sono.net.http1 import MAX_HEAD
from sono.net.policy import NetworkPolicy
from sono.net.proxy import DenyLog, ProxyThread

ALLOW_LOCAL = NetworkPolicy("allowlist", ("allowed.test", "127.0.0.1/32"))


@dataclass
class Setup:
    dir: Path
    sock: Path
    log: Path
    resolver: FakeResolver

    def proxy(self, policy: NetworkPolicy = ALLOW_LOCAL) -> ProxyThread:
        return ProxyThread(policy, self.sock, self.log, self.resolver)


@pytest.fixture
def setup() -> Iterator[Setup]:
    with short_dir() as d:
        resolver = FakeResolver(
            {
                "allowed.test": ["127.0.0.1"],
                "evil.test": ["127.0.0.1"],
                "rebind.test": ["93.184.216.34", "127.0.0.1"],
            }
        )
        yield Setup(d, d / "proxy.sock", d / "logs" / "denied.jsonl", resolver)


def connect_tunnel(sock_path: Path, target: str, host: str | None = None) -> socket.socket:
    sock = unix_connect(sock_path)
    host_line = f"Host: {host or target}\r\n"
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\n{host_line}\r\n".encode())
    return sock


def test_connect_allowed_round_trips_bytes(setup: Setup) -> None:
    with EchoServer() as echo, setup.proxy():
        target = f"allowed.test:{echo.port}"
        sock = unix_connect(setup.sock)
        # Early data right behind the CONNECT head must not be lost.
        sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\nearly ".encode())
        head, rest = read_until(sock, b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 Connection Established\r\n")
        payload = bytes(range(256)) * 1000
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)  # half-close: the echo still flows back
        assert read_all(sock, rest) == b"early " + payload
        sock.close()
    assert setup.resolver.calls == ["allowed.test"]
    assert json_lines(setup.log) == []


def test_connect_denied_host_is_403_and_logged_without_dns(setup: Setup) -> None:
    with EchoServer() as echo, setup.proxy():
        sock = connect_tunnel(setup.sock, "blocked.test:443")
        response = read_all(sock).decode()
        sock.close()
        assert echo.connections == 0
    assert response.startswith("HTTP/1.1 403 Forbidden\r\n")
    assert "blocked.test" in response
    assert "blocked by so network policy" in response
    assert setup.resolver.calls == []  # denied by name: no DNS lookup to exfiltrate through
    [line] = json_lines(setup.log)
    assert line["host"] == "blocked.test"
    assert line["port"] == 443
    assert "not on the allowlist" in line["reason"]
    assert line["time"].endswith("+00:00")


def test_connect_to_literal_loopback_is_denied_unless_allowed_by_cidr(setup: Setup) -> None:
    with EchoServer() as echo:
        with setup.proxy(NetworkPolicy("open")):
            sock = connect_tunnel(setup.sock, f"127.0.0.1:{echo.port}")
            response = read_all(sock).decode()
            sock.close()
            for mapped in ("[::ffff:127.0.0.1]", "[::ffff:7f00:1]"):
                sock = connect_tunnel(setup.sock, f"{mapped}:{echo.port}")
                assert read_all(sock).startswith(b"HTTP/1.1 403 ")
                sock.close()
        assert response.startswith("HTTP/1.1 403 ")
        assert "loopback" in response
        assert echo.connections == 0
        assert [line["host"] for line in json_lines(setup.log)] == [
            "127.0.0.1",
            "::ffff:7f00:1",
            "::ffff:7f00:1",
        ]
        # The same literal with an explicit CIDR entry goes through.
        with setup.proxy(NetworkPolicy("open", ("127.0.0.1/32",))):
            sock = connect_tunnel(setup.sock, f"127.0.0.1:{echo.port}")
            head, _ = read_until(sock, b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ")
            sock.sendall(b"ping")
            assert sock.recv(4) == b"ping"
            sock.close()


def test_rebinding_host_with_a_private_address_is_denied(setup: Setup) -> None:
    with EchoServer() as echo, setup.proxy(NetworkPolicy("open")):
        sock = connect_tunnel(setup.sock, f"rebind.test:{echo.port}")
        assert read_all(sock).startswith(b"HTTP/1.1 403 ")
        sock.close()
        assert echo.connections == 0
    [line] = json_lines(setup.log)
    assert line["host"] == "rebind.test"
    assert "127.0.0.1" in line["reason"]


def test_mode_none_denies_even_allowlisted_hosts(setup: Setup) -> None:
    policy = NetworkPolicy("none", ("allowed.test", "127.0.0.1/32"))
    with EchoServer() as echo, setup.proxy(policy):
        sock = connect_tunnel(setup.sock, f"allowed.test:{echo.port}")
        assert read_all(sock).startswith(b"HTTP/1.1 403 ")
        sock.close()
    assert setup.resolver.calls == []
    assert "disabled" in json_lines(setup.log)[0]["reason"]


def test_plain_http_absolute_form_is_forwarded(setup: Setup) -> None:
    with OriginServer() as origin, setup.proxy():
        authority = f"allowed.test:{origin.port}"
        request = (
            f"POST http://{authority}/path?q=1 HTTP/1.1\r\n"
            f"Host: {authority}\r\n"
            "Proxy-Connection: keep-alive\r\n"
            "Proxy-Authorization: Basic c2VjcmV0\r\n"
            "X-Custom: kept\r\n"
            "Content-Length: 5\r\n\r\nhello"
        )
        response = exchange(setup.sock, request.encode())
    assert response.status == 200
    assert response.body == b"origin saw POST /path?q=1\nhello"
    [seen] = origin.seen
    assert seen.path == "/path?q=1"  # origin-form upstream
    assert seen.headers["host"] == authority
    assert seen.headers["x-custom"] == "kept"
    assert seen.headers["connection"] == "close"
    assert "proxy-authorization" not in seen.headers
    assert "proxy-connection" not in seen.headers


def test_plain_http_to_a_denied_host_is_403(setup: Setup) -> None:
    with setup.proxy():
        response = exchange(setup.sock, b"GET http://evil.example/ HTTP/1.1\r\n\r\n")
    assert response.status == 403
    assert b"evil.example" in response.body
    assert json_lines(setup.log)[0]["port"] == 80


@pytest.mark.parametrize(
    "request_text",
    [
        "CONNECT allowed.test:{port} HTTP/1.1\r\nHost: other.test:{port}\r\n\r\n",
        "CONNECT allowed.test:{port} HTTP/1.1\r\nHost: allowed.test:1\r\n\r\n",
        "GET http://allowed.test:{port}/ HTTP/1.1\r\nHost: other.test\r\n\r\n",
        "GET http://allowed.test:{port}/ HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n",
        "GET /index.html HTTP/1.1\r\nHost: allowed.test\r\n\r\n",  # origin-form
        "GET https://allowed.test:{port}/ HTTP/1.1\r\n\r\n",  # https must use CONNECT
        "GET http://user@allowed.test:{port}/ HTTP/1.1\r\n\r\n",
        "CONNECT allowed.test HTTP/1.1\r\n\r\n",  # no port
        "GET http://allowed.test:{port}/ HTTP/1.1\r\nBad Header: x\r\n\r\n",
        "GET http://allowed.test:{port}/ HTTP/2.0\r\n\r\n",
    ],
)
def test_malformed_or_mismatched_requests_are_400(setup: Setup, request_text: str) -> None:
    with OriginServer() as origin, EchoServer() as echo, setup.proxy():
        port = origin.port if "GET" in request_text else echo.port
        response = exchange(setup.sock, request_text.format(port=port).encode())
        assert response.status == 400
        assert origin.seen == [] and echo.connections == 0
    assert json_lines(setup.log) == []


def test_oversized_head_is_431(setup: Setup) -> None:
    with setup.proxy():
        big = "X-Big: " + "a" * MAX_HEAD + "\r\n"
        response = exchange(setup.sock, f"CONNECT allowed.test:1 HTTP/1.1\r\n{big}\r\n".encode())
    assert response.status == 431


def test_unreachable_allowed_target_is_502(setup: Setup) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]  # bound but not listening: refused
        with setup.proxy():
            sock = connect_tunnel(setup.sock, f"allowed.test:{closed_port}")
            assert read_all(sock).startswith(b"HTTP/1.1 502 ")
            sock.close()
    assert json_lines(setup.log) == []  # not a policy denial


def test_many_concurrent_tunnels(setup: Setup) -> None:
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            sock = connect_tunnel(setup.sock, f"allowed.test:{echo.port}")
            _, rest = read_until(sock, b"\r\n\r\n")
            payload = f"client {i} ".encode() * 500
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            assert read_all(sock, rest) == payload
            sock.close()
        except BaseException as exc:
            errors.append(exc)

    with EchoServer() as echo, setup.proxy():
        threads = [threading.Thread(target=one, args=(i,)) for i in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert echo.connections == 64


def test_stop_closes_open_tunnels_and_removes_the_socket(setup: Setup) -> None:
    setup.sock.write_text("stale")  # a regular file is not replaced...
    with pytest.raises(OSError):
        setup.proxy().start()
    setup.sock.unlink()
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(setup.sock))  # ...but a stale socket from a dead run is
    stale.close()
    with EchoServer() as echo:
        proxy = setup.proxy().start()
        sock = connect_tunnel(setup.sock, f"allowed.test:{echo.port}")
        read_until(sock, b"\r\n\r\n")
        proxy.stop()
        assert read_all(sock) == b""  # the tunnel was closed by stop()
        sock.close()
    assert not setup.sock.exists()


# --- bounds: whatever the sandbox sends, the host's so stays small --------------------------


def test_a_huge_connect_host_is_a_400_and_never_logged(setup: Setup) -> None:
    with setup.proxy():
        for host in ("h" * 60_000, "a." * 200 + "test", "bad_host!"):
            sock = connect_tunnel(setup.sock, f"{host}:443", host="x")
            response = read_all(sock)
            sock.close()
            assert response.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 431 ")), response[:80]
            assert len(response) < 2000
    assert json_lines(setup.log) == []
    assert setup.resolver.calls == []


def test_repeated_denials_are_counted_and_distinct_ones_capped(setup: Setup) -> None:
    with setup.proxy() as thread:
        thread.proxy.denials.max_keys = 5
        for _ in range(30):
            sock = connect_tunnel(setup.sock, "blocked.test:443")
            assert read_all(sock).startswith(b"HTTP/1.1 403 ")
            sock.close()
        for i in range(20):
            sock = connect_tunnel(setup.sock, f"h{i}.blocked.test:443")
            assert read_all(sock).startswith(b"HTTP/1.1 403 ")
            sock.close()
    lines = json_lines(setup.log)
    counts: dict[str, int] = {}
    for line in lines:
        counts[line["host"]] = counts.get(line["host"], 0) + line["count"]
    assert counts["blocked.test"] == 30
    assert counts["*"] == 16  # past 5 distinct keys: counted together
    assert sum(counts.values()) == 50
    assert len(lines) <= 8  # not 50 lines


def test_deny_log_stops_growing_past_its_byte_budget(tmp_path: Path) -> None:
    log = DenyLog(tmp_path / "denied.jsonl", max_keys=10_000, max_bytes=2000)
    for i in range(1000):
        log.add(f"h{i}.test" + "x" * 5000, 443, "r" * 5000)
        if i % 100 == 0:
            log.flush()
    log.flush()
    size = (tmp_path / "denied.jsonl").stat().st_size
    assert size < 2000 + 11 * 1000  # the budget, one line past it, one summary per flush
    lines = json_lines(tmp_path / "denied.jsonl")
    assert sum(line["count"] for line in lines) == 1000
    assert all(len(line["host"]) < 300 and len(line["reason"]) < 400 for line in lines)
