"""forward.py as a real subprocess: TCP on 127.0.0.1 → Unix socket → proxy → origin."""

from __future__ import annotations

import ast
import contextlib
import http.client
import queue
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
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


# --- the single-threaded relay, run as the sandboxes run it (python3 -S -E -s) ------------


@pytest.fixture
def start_isolated() -> Iterator[Forwarder]:
    """Like ``start_forward``, with the interpreter flags the sandboxes use."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str) -> tuple[subprocess.Popen[str], dict[str, int]]:
        proc = subprocess.Popen(
            [sys.executable, "-S", "-E", "-s", str(SCRIPT), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None
        ports: dict[str, int] = {}
        for line in proc.stdout:
            if line == "ready\n":
                return proc, ports
            listen, _, path = line.removeprefix("listening ").strip().partition("=")
            ports[path] = int(listen.rsplit(":", 1)[1])
        raise AssertionError("forward.py exited before it was ready")

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
        with proc:
            pass


Handler = Callable[[socket.socket], None]


@contextlib.contextmanager
def unix_server(path: Path, handle: Handler, backlog: int = 256) -> Iterator[socket.socket]:
    """A Unix socket server calling ``handle(conn)`` in a thread per connection (the
    connection is closed after); yields the listening socket."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(backlog)
    server.settimeout(0.05)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(TIMEOUT_S)
            handle(conn)

    def accept_loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept_loop, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        thread.join()
        server.close()


def echo(conn: socket.socket) -> None:
    while data := conn.recv(65536):
        conn.sendall(data)


def test_fifty_clients_at_once(sock_dir: Path, start_isolated: Forwarder) -> None:
    path, ready = sock_dir / "echo.sock", sock_dir / "ready"
    with unix_server(path, echo):
        proc, ports = start_isolated("--ignore-stdin", "--ready", str(ready), f"127.0.0.1:0={path}")
        assert proc.stdin is not None
        proc.stdin.close()  # ignored
        assert ready.read_text() == f"listening 127.0.0.1:{ports[str(path)]}={path}\nready\n"
        clients = [
            socket.create_connection(("127.0.0.1", ports[str(path)]), TIMEOUT_S) for _ in range(50)
        ]
        try:
            for i, sock in enumerate(clients):
                sock.sendall(f"client {i};".encode() * 1000)
            for i, sock in enumerate(clients):
                sock.shutdown(socket.SHUT_WR)
                assert read_all(sock) == f"client {i};".encode() * 1000
        finally:
            for sock in clients:
                sock.close()
        assert proc.poll() is None


def test_five_megabytes_each_way_at_once(sock_dir: Path, start_isolated: Forwarder) -> None:
    path = sock_dir / "both.sock"
    up, down = random.randbytes(5 << 20), random.randbytes(5 << 20)
    received: queue.Queue[bytes] = queue.Queue()

    def both_ways(conn: socket.socket) -> None:
        def send() -> None:
            conn.sendall(down)
            conn.shutdown(socket.SHUT_WR)

        sender = threading.Thread(target=send)
        sender.start()
        received.put(read_all(conn))
        sender.join()

    with unix_server(path, both_ways):
        _, ports = start_isolated(f"127.0.0.1:0={path}")
        with socket.create_connection(("127.0.0.1", ports[str(path)]), TIMEOUT_S) as sock:
            got: list[bytes] = []
            reader = threading.Thread(target=lambda: got.append(read_all(sock)))
            reader.start()
            sock.sendall(up)
            sock.shutdown(socket.SHUT_WR)
            reader.join(TIMEOUT_S)
            assert got == [down]
        assert received.get(timeout=TIMEOUT_S) == up


def test_half_closes_both_ways(sock_dir: Path, start_isolated: Forwarder) -> None:
    path, path2 = sock_dir / "count.sock", sock_dir / "greet.sock"
    received: queue.Queue[bytes] = queue.Queue()

    def count(conn: socket.socket) -> None:  # answers once the client has said all
        conn.sendall(f"got {len(read_all(conn))} bytes".encode())

    def greet(conn: socket.socket) -> None:  # says all first, then listens
        conn.sendall(b"hello")
        conn.shutdown(socket.SHUT_WR)
        received.put(read_all(conn))

    with unix_server(path, count), unix_server(path2, greet):
        _, ports = start_isolated(f"127.0.0.1:0={path}", f"127.0.0.1:0={path2}")
        with socket.create_connection(("127.0.0.1", ports[str(path)]), TIMEOUT_S) as sock:
            sock.sendall(b"x" * 100_000)
            sock.shutdown(socket.SHUT_WR)
            assert read_all(sock) == b"got 100000 bytes"
        with socket.create_connection(("127.0.0.1", ports[str(path2)]), TIMEOUT_S) as sock:
            assert read_all(sock) == b"hello"
            sock.sendall(b"still talking")
            sock.shutdown(socket.SHUT_WR)
            assert received.get(timeout=TIMEOUT_S) == b"still talking"
            assert read_all(sock) == b""


def test_a_reset_on_either_side_closes_the_pair(sock_dir: Path, start_isolated: Forwarder) -> None:
    path = sock_dir / "reset.sock"
    ended: queue.Queue[str] = queue.Queue()

    def handle(conn: socket.socket) -> None:
        first = conn.recv(1)
        if first == b"r":  # the server resets: closes with unread data
            return
        conn.sendall(b"ok")  # wait for the client's reset
        try:
            rest = read_all(conn)
        except ConnectionResetError:
            rest = b"reset"
        ended.put(rest.decode())

    with unix_server(path, handle):
        proc, ports = start_isolated(f"127.0.0.1:0={path}")
        port = ports[str(path)]
        # The client resets: the server side is closed.
        sock = socket.create_connection(("127.0.0.1", port), TIMEOUT_S)
        sock.sendall(b"c")
        assert sock.recv(2) == b"ok"
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        assert ended.get(timeout=TIMEOUT_S) in ("", "reset")
        # The server resets: the client is closed.
        with socket.create_connection(("127.0.0.1", port), TIMEOUT_S) as sock:
            sock.sendall(b"r" + b"unread" * 1000)
            with contextlib.suppress(ConnectionResetError):
                assert read_all(sock) == b""
        # Still serving.
        with socket.create_connection(("127.0.0.1", port), TIMEOUT_S) as sock:
            sock.sendall(b"c")
            assert sock.recv(2) == b"ok"
    assert proc.poll() is None


def test_connects_are_retried_while_the_backlog_is_full(
    sock_dir: Path, start_isolated: Forwarder
) -> None:
    path = sock_dir / "slow.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(0)  # one waiting connection; a second one gets EAGAIN
    server.settimeout(TIMEOUT_S)
    with server:
        _, ports = start_isolated(f"127.0.0.1:0={path}")
        clients = [
            socket.create_connection(("127.0.0.1", ports[str(path)]), TIMEOUT_S) for _ in range(3)
        ]
        for i, sock in enumerate(clients):
            sock.sendall(b"%d" % i)
            sock.shutdown(socket.SHUT_WR)
        time.sleep(0.2)
        for _ in clients:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(TIMEOUT_S)
                conn.sendall(read_all(conn) * 2)
        assert sorted(read_all(sock) for sock in clients) == [b"00", b"11", b"22"]
        for sock in clients:
            sock.close()


def test_exits_on_stdin_eof_and_sigint(sock_dir: Path, start_isolated: Forwarder) -> None:
    proc, _ = start_isolated(f"127.0.0.1:0={sock_dir / 'x.sock'}")
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(TIMEOUT_S) == 0
    proc, _ = start_isolated("--ignore-stdin", f"127.0.0.1:0={sock_dir / 'x.sock'}")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(TIMEOUT_S) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "the following arguments are required: HOST:PORT=SOCKET"),
        (["--ready"], "argument --ready: expected one argument"),
        (["--bogus", "127.0.0.1:0=/x"], "unrecognized arguments: --bogus"),
        (
            ["127.0.0.1:99999=/x"],
            "argument HOST:PORT=SOCKET: expected HOST:PORT=SOCKET, got '127.0.0.1:99999=/x'",
        ),
    ],
)
def test_usage_errors(args: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-S", "-E", "-s", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.startswith("usage: forward.py [-h] [--ready PATH] [--ignore-stdin]")
    assert proc.stderr.endswith(f"forward.py: error: {message}\n")


def test_starts_without_heavy_imports() -> None:
    """Start-up time and memory: only built-in modules (no socket → enum, selectors...)."""
    proc = subprocess.run(
        [sys.executable, "-S", "-E", "-s", "-X", "importtime", str(SCRIPT), "--help"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=True,
    )
    assert "--ignore-stdin    do not exit on stdin EOF" in proc.stdout
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()[1:]}
    assert {"_socket", "select", "_signal"} <= imported
    assert not imported & {"socket", "enum", "selectors", "threading", "argparse", "os", "typing"}
