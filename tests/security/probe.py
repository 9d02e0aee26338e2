"""Run INSIDE a sandbox by the escape suite: one small step per subcommand.

    python3 ~/probe.py SUBCOMMAND ARGS...

Exit status 0 means the step SUCCEEDED (a connection was made, a socket created, a secret
found...), 1 that it failed; what happened is printed. The suite runs each escape attempt
with this exit convention: an attack must exit non-zero, its control zero.

Standalone on purpose: stdlib only, Python 3.9+ (it runs on the sandbox's python3).
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

TIMEOUT_S = 5.0
PROXY = ("127.0.0.1", 3128)
GATEWAY = ("127.0.0.1", 3129)
PTRACE_ATTACH = 16
PTRACE_DETACH = 17
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SKIP_DIRS = ("/proc", "/sys", "/dev")


def ok(message: str) -> int:
    print(f"probe: SUCCEEDED: {message}", flush=True)
    return 0


def failed(message: str) -> int:
    print(f"probe: failed: {message}", flush=True)
    return 1


# System call numbers for the perl fallback (the runner image's python3 has no ctypes).
SYSCALLS = {
    "x86_64": {"ptrace": 101, "mount": 165, "unshare": 272},
    "aarch64": {"ptrace": 117, "mount": 40, "unshare": 97},
}
PERL_PTRACE = (
    "my ($nr, $pid) = map { $_ + 0 } @ARGV; "
    'if (syscall($nr, 16, $pid, 0, 0) == -1) { print "$!\\n"; exit 1 } '
    "waitpid($pid, 0); syscall($nr, 17, $pid, 0, 0); exit 0"
)
PERL_SYSCALL = (
    "my $nr = shift @ARGV; "
    "my @a = map { /^[0-9]+$/ ? $_ + 0 : $_ } @ARGV; "
    'if (syscall($nr, @a) == -1) { print "$!\\n"; exit 1 } exit 0'
)


def _perl(script: str, *args: str) -> tuple[bool, str]:
    argv = ["perl", "-e", script, *args]
    out = subprocess.run(argv, check=False, capture_output=True, text=True)
    return out.returncode == 0, out.stdout.strip() or out.stderr.strip()


def _nr(name: str) -> str:
    return str(SYSCALLS[os.uname().machine][name])


def _syscall(name: str, *args: str | int) -> tuple[bool, str]:
    """``name(*args)`` through libc (ctypes) or, without ctypes, perl's syscall()."""
    try:
        import ctypes
        import ctypes.util
    except ImportError:
        return _perl(PERL_SYSCALL, _nr(name), *(str(a) for a in args))
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    native = [a.encode() if isinstance(a, str) else a for a in args]
    if getattr(libc, name)(*native) != 0:
        return False, os.strerror(ctypes.get_errno())
    return True, "ok"


# --- sockets -------------------------------------------------------------------------


def tcp(host: str, port: str) -> int:
    try:
        with socket.create_connection((host, int(port)), timeout=TIMEOUT_S):
            return ok(f"connected to {host}:{port}")
    except OSError as exc:
        return failed(f"tcp {host}:{port}: {exc}")


def _exchange(address: tuple[str, int], data: bytes) -> bytes:
    with socket.create_connection(address, timeout=TIMEOUT_S) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def _status(reply: bytes) -> int:
    parts = reply.split(b"\r\n", 1)[0].split()
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def _judge(reply: bytes, marker: str | None, what: str) -> int:
    text = reply.decode("latin-1")
    print(text[:600], flush=True)
    status = _status(reply)
    if not 200 <= status < 300:
        return failed(f"{what}: status {status or 'none'}")
    if marker is not None and marker not in text:
        return failed(f"{what}: status {status} but not {marker!r} in the answer")
    return ok(f"{what}: status {status}")


def _options(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """``--name value`` pairs out of ``args``."""
    rest, opts = [], {}
    i = 0
    while i < len(args):
        if args[i].startswith("--") and i + 1 < len(args):
            opts[args[i][2:]] = args[i + 1]
            i += 2
        else:
            rest.append(args[i])
            i += 1
    return rest, opts


def http(url: str, *args: str) -> int:
    """GET as an ordinary client does: through ``http_proxy`` from the environment unless
    the host is in ``no_proxy`` (or ``--no-proxy 1``), directly otherwise."""
    _, opts = _options(list(args))
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 80
    proxy = os.environ.get("http_proxy") or os.environ.get("HTTP_PROXY") or ""
    bypass = os.environ.get("no_proxy") or os.environ.get("NO_PROXY") or ""
    if opts.get("no-proxy") or host in [b.strip() for b in bypass.split(",")]:
        proxy = ""
    if proxy:
        address = urlsplit(proxy)
        where, target = (address.hostname or "", address.port or 80), url
    else:
        where, target = (host, port), (parts.path or "/")
    request = f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n"
    via = f"via {where[0]}:{where[1]}"
    try:
        reply = _exchange(where, request.encode())
    except OSError as exc:
        return failed(f"GET {url} {via}: {exc}")
    return _judge(reply, opts.get("marker"), f"GET {url} {via}")


def proxy_get(url: str, *args: str) -> int:
    """A raw absolute-form GET through the proxy; ``--host H`` sets the Host header,
    ``--origin 1`` sends origin-form (the URL's path only), ``--marker M``."""
    _, opts = _options(list(args))
    parts = urlsplit(url)
    host = opts.get("host", parts.netloc)
    target = (parts.path or "/") if opts.get("origin") else url
    request = f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    try:
        reply = _exchange(PROXY, request.encode())
    except OSError as exc:
        return failed(f"proxy: {exc}")
    return _judge(reply, opts.get("marker"), f"GET {target} (Host: {host}) via the proxy")


def connect(authority: str, *args: str) -> int:
    """CONNECT through the proxy, then ``GET --path`` in the tunnel; success needs the
    tunnel to be established (200) and, with ``--marker``, the marker in the answer."""
    _, opts = _options(list(args))
    host_header = opts.get("host", authority)
    path = opts.get("path", "/")
    try:
        with socket.create_connection(PROXY, timeout=TIMEOUT_S) as sock:
            sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {host_header}\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                head += chunk
            if _status(head) != 200:
                return _judge(head, None, f"CONNECT {authority}")
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            reply = b""
            while True:
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    break
                if not chunk:
                    break
                reply += chunk
    except OSError as exc:
        return failed(f"CONNECT {authority}: {exc}")
    return _judge(reply, opts.get("marker"), f"CONNECT {authority} then GET {path}")


def gateway(method: str, target: str, *args: str) -> int:
    """A raw request to the model gateway: ``--host``, ``--body``, ``--key``, ``--marker``."""
    _, opts = _options(list(args))
    body = opts.get("body", "").encode()
    lines = [f"{method} {target} HTTP/1.1", f"Host: {opts.get('host', '127.0.0.1:3129')}"]
    lines += [f"x-api-key: {opts.get('key', os.environ.get('ANTHROPIC_API_KEY', ''))}"]
    lines += ["content-type: application/json", f"Content-Length: {len(body)}"]
    lines += ["Connection: close", "", ""]
    try:
        reply = _exchange(GATEWAY, "\r\n".join(lines).encode() + body)
    except OSError as exc:
        return failed(f"gateway: {exc}")
    return _judge(reply, opts.get("marker"), f"{method} {target} via the gateway")


def dns(name: str) -> int:
    try:
        infos = socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)
    except OSError as exc:
        return failed(f"getaddrinfo({name}): {exc}")
    return ok(f"{name} -> {sorted({i[4][0] for i in infos})}")


def udp(host: str, port: str) -> int:
    """A DNS query for example.com; success needs an answer."""
    query = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
    query += b"\x07example\x03com\x00" + struct.pack(">HH", 1, 1)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.settimeout(2.0)
            sock.sendto(query, (host, int(port)))
            data, peer = sock.recvfrom(4096)
    except OSError as exc:
        return failed(f"udp {host}:{port}: {exc}")
    return ok(f"{len(data)} bytes from {peer}")


def udp_self() -> int:
    """UDP on the sandbox's own loopback: send to ourselves."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx:
        rx.bind(("127.0.0.1", 0))
        rx.settimeout(2.0)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            tx.sendto(b"ping", rx.getsockname())
        try:
            data, _ = rx.recvfrom(16)
        except OSError as exc:
            return failed(f"udp loopback: {exc}")
    return ok(f"udp loopback got {data!r}")


def raw() -> int:
    try:
        socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close()
    except OSError as exc:
        return failed(f"SOCK_RAW: {exc}")
    return ok("created a SOCK_RAW socket")


def packet() -> int:
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3)).close()
    except OSError as exc:
        return failed(f"AF_PACKET: {exc}")
    return ok("created an AF_PACKET socket")


def unix(path: str) -> int:
    """Connect to a Unix socket; a leading ``@`` means the abstract namespace."""
    address = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(TIMEOUT_S)
            sock.connect(address)
    except OSError as exc:
        return failed(f"connect {path}: {exc}")
    return ok(f"connected to {path}")


def unix_own(path: str) -> int:
    """Listen on a Unix socket of our own (``@``: abstract) and connect to it: the
    sandbox can use Unix sockets at all (the control of the attempts on host ones)."""
    address = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(address)
            server.listen(1)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(TIMEOUT_S)
                sock.connect(address)
    except OSError as exc:
        return failed(f"own socket {path}: {exc}")
    return ok(f"connected to own {path}")


# --- processes and privilege ----------------------------------------------------------


def _ptrace(pid: int) -> tuple[bool, str]:
    """PTRACE_ATTACH, wait for the stop, PTRACE_DETACH."""
    try:
        import ctypes
        import ctypes.util
    except ImportError:
        return _perl(PERL_PTRACE, _nr("ptrace"), str(pid))
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.ptrace.restype = ctypes.c_long
    libc.ptrace.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p)
    if libc.ptrace(PTRACE_ATTACH, pid, None, None) != 0:
        return False, os.strerror(ctypes.get_errno())
    os.waitpid(pid, 0)
    libc.ptrace(PTRACE_DETACH, pid, None, None)
    return True, "attached"


def ptrace(pid: str) -> int:
    attached, why = _ptrace(int(pid))
    return ok(f"PTRACE_ATTACH {pid}") if attached else failed(f"PTRACE_ATTACH {pid}: {why}")


def ptrace_child() -> int:
    """Attach to a child of our own (what debuggers do): allowed."""
    child = os.fork()
    if child == 0:
        time.sleep(30)
        os._exit(0)
    try:
        attached, why = _ptrace(child)
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    return ok("attached to our child") if attached else failed(f"own child: {why}")


def caps() -> int:
    """Success if this process holds any capability at all."""
    status = Path("/proc/self/status").read_text()
    held = {}
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            held[name] = int(value.strip(), 16)
    print(held)
    if not held:
        return failed("no capability lines")
    return ok(f"capabilities {held}") if any(held.values()) else failed("no capabilities")


def setuid(uid: str) -> int:
    try:
        os.setuid(int(uid))
    except OSError as exc:
        return failed(f"setuid({uid}): {exc}")
    return ok(f"setuid({uid}); euid now {os.geteuid()}")


def mount(target: str) -> int:
    """The mount(2) syscall directly (no setuid helper): a tmpfs on ``target``."""
    Path(target).mkdir(parents=True, exist_ok=True)
    done, why = _syscall("mount", "none", target, "tmpfs", 0, 0)
    return ok(f"mounted a tmpfs on {target}") if done else failed(f"mount {target}: {why}")


def unshare(*names: str) -> int:
    flags = {"user": CLONE_NEWUSER, "mount": CLONE_NEWNS, "net": CLONE_NEWNET}
    mask = 0
    for name in names:
        mask |= flags[name]
    done, why = _syscall("unshare", mask)
    what = f"unshare({'|'.join(names)})"
    return ok(what) if done else failed(f"{what}: {why}")


def chroot(path: str) -> int:
    try:
        os.chroot(path)
    except OSError as exc:
        return failed(f"chroot({path}): {exc}")
    return ok(f"chroot({path})")


# --- secrets -------------------------------------------------------------------------


def _files(root: str) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in SKIP_DIRS]
        found += [Path(dirpath) / f for f in filenames]
    return found


def findkey(reversed_needle: str, *places: str) -> int:
    """Look for a string everywhere in ``places`` (``env``, ``proc`` — every readable
    /proc/*/environ and cmdline —, ``ps``, ``files:DIR``). The needle arrives reversed so
    that it is in no argv or file of the sandbox before this process reverses it in
    memory. Success means FOUND; only where is printed, never the value."""
    needle = reversed_needle[::-1].encode()
    hits: list[str] = []
    for place in places:
        if place == "env":
            hits += [f"env {k.decode()}" for k, v in os.environb.items() if needle in v]
        elif place == "proc":
            for proc in Path("/proc").iterdir():
                if not proc.name.isdigit():
                    continue
                for name in ("environ", "cmdline"):
                    try:
                        if needle in (proc / name).read_bytes():
                            hits.append(f"/proc/{proc.name}/{name}")
                    except OSError:
                        pass
        elif place == "ps":
            out = subprocess.run(["ps", "-eo", "args"], capture_output=True, check=False)
            if needle in out.stdout:
                hits.append("ps -eo args")
        elif place.startswith("files:"):
            for path in _files(place[len("files:") :]):
                try:
                    if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                        hits.append(str(path))
                except OSError:
                    pass
        else:
            return failed(f"unknown place {place}")
    if hits:
        return ok(f"found in {', '.join(sorted(set(hits))[:20])}")
    return failed(f"not found in {', '.join(places)}")


COMMANDS: dict[str, Callable[..., int]] = {
    "tcp": tcp,
    "http": http,
    "proxy-get": proxy_get,
    "connect": connect,
    "gateway": gateway,
    "dns": dns,
    "udp": udp,
    "udp-self": udp_self,
    "raw": raw,
    "packet": packet,
    "unix": unix,
    "unix-own": unix_own,
    "ptrace": ptrace,
    "ptrace-child": ptrace_child,
    "caps": caps,
    "setuid": setuid,
    "mount": mount,
    "unshare": unshare,
    "chroot": chroot,
    "findkey": findkey,
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: probe.py {{{','.join(COMMANDS)}}} ARGS...", file=sys.stderr)
        return 2
    try:
        return COMMANDS[argv[0]](*argv[1:])
    except Exception as exc:  # any surprise is a failed step, shown
        return failed(f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
