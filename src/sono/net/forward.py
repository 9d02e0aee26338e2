"""Inside the sandbox: expose Unix sockets as TCP ports on 127.0.0.1.

    python3 -S -E -s /run/so/forward.py [--ready PATH] [--ignore-stdin] \\
        127.0.0.1:3128=/run/so/proxy.sock 127.0.0.1:3129=/run/so/gateway.sock

Each TCP connection is copied both ways to a fresh connection to the socket (half-closes
passed on; a reset on either end closes both). Once every port listens it prints one
``listening HOST:PORT=SOCKET`` line per mapping (the real port when 0 was asked for) and
then ``ready``; ``--ready PATH`` also writes those lines to PATH (atomically). It exits on
SIGTERM/SIGINT, and when stdin reaches EOF unless ``--ignore-stdin`` is given.
``--euid UID`` (started as root): once ready, connect to the sockets as UID, their owner,
while the real and saved uid stay 0, so processes of that uid cannot signal or trace it.

Standalone on purpose: stdlib only, Python 3.9+, no imports from ``sono`` (the file is
mounted read-only into sandboxes whose Python may be old). It runs in every sandbox, so it
is built to start fast and stay small: built-in modules only (``_socket``, ``_signal`` and
``posix``, not ``socket``, ``signal`` and ``os``, which import enum, selectors and more), no
argparse, no threads: one ``poll`` loop accepts, connects (non-blocking) and relays. A
socket is not read while its last read still waits for the other side, so a direction holds
at most one read (``BUFFER``). Python compiles a script on every run, without a cache; the
compiler's time and memory grow with the tokens (about 1 µs and 0.5 KB each): keep it short.
"""

from __future__ import annotations

import _socket
import errno
import posix
import select
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # typeshed has no stub for _signal, the C half of signal
    import signal as _signal
else:
    import _signal

BUFFER = 65536
CLOSE_GRACE_S = 5.0  # once the server side is done, how long the client may still send
CONNECT_TIMEOUT_S = 10.0  # a Unix socket with a full backlog says EAGAIN: retry until then
RETRY_S = 0.01  # ... this often
ACCEPT_PAUSE_S = 0.1  # how long a listener rests when accept fails
AGAIN = (errno.EAGAIN, errno.EINPROGRESS, errno.EALREADY, errno.EINTR)
IN, OUT = select.POLLIN, select.POLLOUT
USAGE = """usage: forward.py [-h] [--ready PATH] [--ignore-stdin] [--euid UID]
                  HOST:PORT=SOCKET [HOST:PORT=SOCKET ...]
"""
HELP = """
Forward TCP ports to Unix sockets.

positional arguments:
  HOST:PORT=SOCKET

options:
  -h, --help        show this help message and exit
  --ready PATH      also write the ready lines here
  --ignore-stdin    do not exit on stdin EOF
  --euid UID        once ready, connect as UID (real and saved uid kept)"""

poll = select.poll()
listeners: dict[int, tuple[_socket.socket, str]] = {}  # fd → (socket, Unix socket path)
socks: dict[int, _socket.socket] = {}  # both sockets of every pair
peer: dict[int, int] = {}  # the other socket of the pair
paths: dict[int, str] = {}  # upstream (Unix) socket → its path
out: dict[int, memoryview] = {}  # read from the peer, not yet taken by this socket
reading: set[int] = set()  # sockets (of connected pairs) whose flow to the peer is on
masks: dict[int, int] = {}  # what each socket is polled for
timers: dict[int, float] = {}  # upstream: deadline to connect, or client's grace; listener


class UsageError(Exception):
    pass


class Stop(Exception):
    """Raised by the signal handlers (so that ``poll`` is not just restarted)."""


def parse_mapping(text: str) -> tuple[str, int, str]:
    """``HOST:PORT=SOCKET`` → (host, port, socket path)."""
    listen, _, path = text.partition("=")
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if not path or not host or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"argument HOST:PORT=SOCKET: expected HOST:PORT=SOCKET, got {text!r}")
    return host, int(port), path


def parse_args(argv: list[str]) -> tuple[list[tuple[str, int, str]], str, bool]:
    """(mappings, --ready or "", --ignore-stdin), as argparse said; no mappings: --help."""
    mappings, ready, ignore_stdin, args = [], "", False, iter(argv)
    for arg in args:
        if arg in ("-h", "--help"):
            return [], "", False
        if arg == "--ignore-stdin":
            ignore_stdin = True
        elif arg.partition("=")[0] == "--ready":
            ready = arg[8:] if "=" in arg else next(args, "-")
            if ready[:1] == "-" and "=" not in arg:
                raise UsageError("argument --ready: expected one argument")
        elif arg[:1] == "-":
            raise UsageError(f"unrecognized arguments: {arg}")
        else:
            mappings.append(parse_mapping(arg))
    if not mappings:
        raise UsageError("the following arguments are required: HOST:PORT=SOCKET")
    return mappings, ready, ignore_stdin


def watch(fd: int) -> None:
    """Poll ``fd`` for reading while its peer has taken all, for writing while it has not."""
    mask = (IN if fd in reading and peer[fd] not in out else 0) | (OUT if fd in out else 0)
    if mask != masks.get(fd, 0):
        if mask:
            poll.register(fd, mask)
        else:
            poll.unregister(fd)
        masks[fd] = mask


def close(fd: int) -> None:
    """Close ``fd`` and its peer."""
    for f in (fd, peer[fd]):
        if masks.pop(f, 0):
            poll.unregister(f)
        socks.pop(f).close()
        for table in (peer, paths, out, timers):
            table.pop(f, None)
        reading.discard(f)


def finish(fd: int) -> None:
    """The flow out of ``fd`` is done: pass the half-close on; close once both are."""
    other = peer[fd]
    reading.discard(fd)
    out.pop(other, None)
    try:  # noqa: SIM105 (contextlib costs start-up time)
        socks[other].shutdown(_socket.SHUT_WR)
    except OSError:
        pass
    if other not in reading:
        close(fd)
    elif fd in paths:  # the server side is done: the client has a grace period
        timers[fd] = time.monotonic() + CLOSE_GRACE_S


def flush(fd: int) -> None:
    """Write what waits for ``fd``; if that fails, the flow into ``fd`` is done."""
    try:
        sent = socks[fd].send(out[fd])
    except BlockingIOError:
        return
    except OSError:
        finish(peer[fd])
        return
    if sent < len(out[fd]):
        out[fd] = out[fd][sent:]
    else:
        del out[fd]


def on_socket(fd: int) -> None:
    other = peer[fd]
    if fd in out:
        flush(fd)
    if fd in reading and other not in out:
        try:
            data = socks[fd].recv(BUFFER)
        except BlockingIOError:
            return
        except OSError:  # reset: nothing more comes from or goes into ``fd``
            close(fd)
            return
        if data:
            out[other] = memoryview(data)
            flush(other)
        else:
            finish(fd)
    if fd in socks:
        watch(fd)
        watch(other)


def connect(fd: int) -> None:
    """Connect upstream socket ``fd``; called again (by ``run``) while it says EAGAIN."""
    try:
        err = socks[fd].connect_ex(paths[fd])
        why = OSError(err, posix.strerror(err))
    except OSError as exc:  # a path too long, say
        err, why = -1, exc
    if err in (0, errno.EISCONN):
        del timers[fd]
        reading.update((fd, peer[fd]))
        watch(fd)
        watch(peer[fd])
    elif err not in AGAIN or time.monotonic() > timers[fd]:
        print(f"forward: cannot connect to {paths[fd]}: {why}", file=sys.stderr, flush=True)
        close(fd)


def accept(fd: int) -> None:
    """Take a connection on listener ``fd`` (one a call: ``poll`` tells again if more wait)."""
    listener, path = listeners[fd]
    try:
        client = _socket.socket(fileno=listener._accept()[0])  # type: ignore[attr-defined]
        upstream = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    except BlockingIOError:
        return
    except OSError as exc:  # out of descriptors, say (a client accepted is closed again)
        print(f"forward: cannot accept on {path}: {exc}", file=sys.stderr, flush=True)
        poll.unregister(fd)
        timers[fd] = time.monotonic() + ACCEPT_PAUSE_S
        return
    for sock in (client, upstream):
        sock.setblocking(False)
    try:  # noqa: SIM105
        client.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
    except OSError:
        pass
    a, b = client.fileno(), upstream.fileno()
    socks[a], socks[b], peer[a], peer[b], paths[b] = client, upstream, b, a, path
    timers[b] = time.monotonic() + CONNECT_TIMEOUT_S
    connect(b)


def run() -> None:
    while True:
        for fd, deadline in list(timers.items()):
            if fd in listeners:
                if time.monotonic() > deadline:
                    del timers[fd]
                    poll.register(fd, IN)
            elif fd not in reading and peer[fd] not in reading:  # still connecting
                connect(fd)
            elif time.monotonic() > deadline:  # the client's grace is over
                close(fd)
        for fd, _ in poll.poll(RETRY_S * 1000 if timers else None):
            if fd in listeners:
                accept(fd)
            elif fd in socks:
                on_socket(fd)
            elif fd == 0:
                try:
                    if posix.read(0, 4096):
                        continue
                except OSError:
                    pass
                return


def on_signal(signum: int, frame: object) -> None:
    raise Stop


def split_euid(argv: list[str]) -> tuple[int | None, list[str]]:
    """``--euid UID`` (first, if given) and the other arguments."""
    if argv[:1] != ["--euid"]:
        return None, argv
    if len(argv) < 2 or not argv[1].isdigit():
        raise UsageError("argument --euid: expected a uid")
    return int(argv[1]), argv[2:]


def main(argv: list[str] | None = None) -> int:
    try:
        euid, argv = split_euid(sys.argv[1:] if argv is None else argv)
        mappings, ready, ignore_stdin = parse_args(argv)
    except UsageError as exc:
        sys.stderr.write(f"{USAGE}forward.py: error: {exc}\n")
        return 2
    if not mappings:
        print(USAGE + HELP)
        return 0
    _signal.signal(_signal.SIGTERM, on_signal)
    _signal.signal(_signal.SIGINT, on_signal)
    text = ""
    try:
        for host, port, path in mappings:
            sock = _socket.socket(_socket.AF_INET6 if ":" in host else _socket.AF_INET)
            sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(128)
            sock.setblocking(False)
            listeners[sock.fileno()] = sock, path
            poll.register(sock.fileno(), IN)
            bound = sock.getsockname()
            text += f"listening {bound[0]}:{bound[1]}={path}\n"
        text += "ready\n"
        if ready:
            with open(ready + ".tmp", "w") as file:  # noqa: PTH123 (pathlib: slow to import)
                file.write(text)
            posix.replace(ready + ".tmp", ready)
        if euid is not None:
            posix.setresuid(-1, euid, -1)
        print(text, end="", flush=True)
        if not ignore_stdin:
            poll.register(0, IN)
        run()
    except Stop:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
