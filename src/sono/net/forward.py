"""Inside the sandbox: expose Unix sockets as TCP ports on 127.0.0.1.

    python3 /run/so/forward.py [--ready PATH] [--ignore-stdin] \\
        127.0.0.1:3128=/run/so/proxy.sock 127.0.0.1:3129=/run/so/gateway.sock

Each TCP connection is copied both ways to a fresh connection to the socket (half-closes
passed on). Once every port listens it prints one ``listening HOST:PORT=SOCKET`` line per
mapping (the real port when 0 was asked for) and then ``ready``; ``--ready PATH`` also
writes those lines to PATH (atomically). It exits on SIGTERM/SIGINT, and when stdin
reaches EOF unless ``--ignore-stdin`` is given.

Standalone on purpose: stdlib only, Python 3.9+, no imports from ``sono`` (the file is
mounted read-only into sandboxes whose Python may be old).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

BUFFER = 65536
CLOSE_GRACE_S = 5.0


def parse_mapping(text: str) -> tuple[str, int, str]:
    """``HOST:PORT=SOCKET`` → (host, port, socket path)."""
    listen, _, path = text.partition("=")
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if not path or not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT=SOCKET, got {text!r}")
    return host, int(port), path


def pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy until EOF or an error, then half-close ``dst``."""
    try:
        while True:
            data = src.recv(BUFFER)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def serve(client: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError as exc:
        print(f"forward: cannot connect to {path}: {exc}", file=sys.stderr, flush=True)
        client.close()
        upstream.close()
        return
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    up = threading.Thread(target=pump, args=(client, upstream), daemon=True)
    up.start()
    pump(upstream, client)
    # The server side is done; give the client a moment to finish, then cut it off.
    up.join(CLOSE_GRACE_S)
    for sock in (client, upstream):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    up.join()
    client.close()
    upstream.close()


def accept_loop(server: socket.socket, path: str) -> None:
    while True:
        try:
            client, _ = server.accept()
        except OSError:
            return
        threading.Thread(target=serve, args=(client, path), daemon=True).start()


def watch_stdin(stop: threading.Event) -> None:
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    stop.set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Forward TCP ports to Unix sockets.")
    parser.add_argument("mappings", nargs="+", type=parse_mapping, metavar="HOST:PORT=SOCKET")
    parser.add_argument("--ready", metavar="PATH", help="also write the ready lines here")
    parser.add_argument("--ignore-stdin", action="store_true", help="do not exit on stdin EOF")
    args = parser.parse_args(argv)

    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    servers: list[tuple[socket.socket, str]] = []
    for host, port, path in args.mappings:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server = socket.socket(family, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((host, port))
        server.listen(128)
        servers.append((server, path))
    lines = []
    for server, path in servers:
        host, port = server.getsockname()[:2]
        lines.append(f"listening {host}:{port}={path}")
        threading.Thread(target=accept_loop, args=(server, path), daemon=True).start()
    lines.append("ready")
    if args.ready:
        tmp = Path(args.ready + ".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(args.ready)
    print("\n".join(lines), flush=True)
    if not args.ignore_stdin:
        threading.Thread(target=watch_stdin, args=(stop,), daemon=True).start()
    while not stop.wait(1.0):
        pass
    for server, _ in servers:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
