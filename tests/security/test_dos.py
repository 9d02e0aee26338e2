"""Denial of service of the host from inside the sandbox: the agent (a hostile
``attack.sh`` through the real ``so`` CLI) floods so's readers — one endless line, huge
CONNECT host names, thousands of connections, a sandbox repo whose git hangs, a tree
``so rm`` must delete — and so's own memory, descriptors, time and files stay bounded.
Every attack has a control: the same kind of thing, harmless, still works."""

from __future__ import annotations

import base64
import json
import resource
import time
from pathlib import Path
from typing import Any

import pytest
from hostile import HostileUser, Outcome

from sono.net.server import BACKLOG, MAX_CONNECTIONS

pytestmark = pytest.mark.integration


def make_user(tmp_path: Path) -> HostileUser:
    """A HostileUser whose ~/.docker/config.json canary is valid base64 (the Docker SDK
    reads that file and fails on anything else)."""
    user = HostileUser.make(tmp_path)
    value = user.canaries["~/.docker/config.json"]
    auth = base64.b64encode(f"u:{value}".encode()).decode()
    config = {"auths": {"r.example": {"auth": auth}}}
    (user.home / ".docker" / "config.json").write_text(json.dumps(config))
    return user


def children_max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def record(outcome: Outcome, n: int = 1) -> dict[str, Any]:
    assert outcome.sandbox_dir is not None
    path = outcome.sandbox_dir / "iterations" / str(n) / "record.json"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def iteration_file(outcome: Outcome, name: str, n: int = 1) -> Path:
    assert outcome.sandbox_dir is not None
    return outcome.sandbox_dir / "iterations" / str(n) / name


HUGE_OUTPUT = r"""
echo "CONTROL-LINE-BEFORE"
head -c 1500000000 /dev/zero | tr '\0' x        # 1.5 GB, no newline
echo
python3 -c '
import sys
line = b"y" * 1000 + b"\n"
for _ in range(60_000): sys.stdout.buffer.write(line)   # 60 MB of ordinary lines
'
echo "CONTROL-LINE-AFTER"
"""


def test_endless_line_and_output_flood_stay_bounded(tmp_path: Path, backend: str) -> None:
    user = make_user(tmp_path)
    rss_before = children_max_rss_mb()
    t0 = time.monotonic()
    out = user.attack(HUGE_OUTPUT, backend=backend, extra=("--timeout", "10m"))
    assert time.monotonic() - t0 < 400
    assert out.returncode != 3, out.stderr  # no crash
    log = iteration_file(out, "output.log")
    assert log.stat().st_size < 33 * 1024 * 1024  # the log budget, not 1.56 GB
    head = log.read_text(errors="replace")[:200]
    assert head.startswith("CONTROL-LINE-BEFORE\n")  # control: output is still logged
    assert "more bytes of this line dropped" in log.read_text(errors="replace")[:200_000]
    assert record(out)["log_bytes_dropped"] > 0
    assert iteration_file(out, "record.json").stat().st_size < 20_000
    # so's memory: the largest child of this test process is so itself (the agent's
    # processes run inside and are small); an unbounded reader needs GBs here.
    assert children_max_rss_mb() < max(rss_before, 0) + 400


NET_FLOOD = r"""
python3 - <<'PY'
import socket
def ask(target, host=None):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {host or target}\r\n\r\n".encode())
    data = s.recv(200)
    s.close()
    return data
print("CONTROL", ask("control-denied.example:443")[:12].decode())
for i in range(300):
    ask(("h" * 60000) + f"{i}.example:443")          # far beyond 253 bytes
for i in range(1500):
    ask("again.example:443")                        # one host, again and again
for i in range(1500):
    ask(f"h{i}-" + "a" * 50 + ".example:443")        # many distinct denied hosts
PY
"""


def test_deny_log_and_record_stay_small_under_a_denial_flood(tmp_path: Path, backend: str) -> None:
    user = make_user(tmp_path)
    out = user.attack(NET_FLOOD, backend=backend, extra=("--network", "allowlist"))
    assert out.returncode != 3, out.stderr
    assert "CONTROL HTTP/1.1 403" in iteration_file(out, "output.log").read_text()
    assert out.sandbox_dir is not None
    denied = out.sandbox_dir / "net" / "denied.jsonl"
    assert denied.stat().st_size < 1_000_000  # unbounded: ~40 MB here, GBs at scale
    rec = record(out)
    assert (out.sandbox_dir / "iterations" / "1" / "record.json").stat().st_size < 50_000
    counts = {d["host"]: d["count"] for d in rec["net_denied"]}
    assert counts["control-denied.example"] == 1  # control: a denial is recorded
    assert counts["again.example"] == 1500
    assert counts["*"] > 1000  # distinct ones past what a record keeps: summed
    assert sum(counts.values()) == 1 + 1500 + 1500  # the 400s are not denials
    assert all(len(d["host"]) <= 253 for d in rec["net_denied"])


CONNECTION_FLOOD = r"""
ulimit -n 30000 2>/dev/null || ulimit -n "$(ulimit -Hn)"
python3 - <<'PY'
import os, socket, time
def hold(n):
    held = []
    for path in ("/run/so/net/p/proxy.sock", "/run/so/net/p/gateway.sock") * (n // 2):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(path)
            s.send(b"GET /anthropic/v1/models HTTP/1.1\r\nHo")   # slowloris: never ends
        except OSError:
            s.close()
            continue
        held.append(s)
    return held
kids = []
for _ in range(20):  # 20 processes: 20,000 connections whatever one process may open
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        held = hold(1000)
        os.write(w, str(len(held)).encode())
        time.sleep(8)
        os._exit(0)
    os.close(w)
    kids.append((pid, r))
total = sum(int(os.read(r, 20) or b"0") for _, r in kids)
print("HELD", total, flush=True)
for pid, _ in kids:
    os.waitpid(pid, 0)
tcp = []  # the same flood through the loopback forwarder, which every agent can use
for _ in range(3000):
    try:
        t = socket.create_connection(("127.0.0.1", 3128), timeout=2)
        t.send(b"GET http://x/ HTTP/1.1\r\nHo")
        tcp.append(t)
    except OSError:
        break
print("TCPHELD", len(tcp), flush=True)
for t in tcp:
    t.close()
time.sleep(1)
c = socket.create_connection(("127.0.0.1", 3128), timeout=30)
c.sendall(b"CONNECT control.example:443 HTTP/1.1\r\nHost: control.example:443\r\n\r\n")
print("CONTROL", c.recv(12).decode(), flush=True)
PY
"""


def test_connection_flood_does_not_exhaust_so(tmp_path: Path, backend: str) -> None:
    user = make_user(tmp_path)
    out = user.attack(CONNECTION_FLOOD, backend=backend, extra=("--network", "allowlist"))
    text = iteration_file(out, "output.log").read_text()
    [held] = [int(line.split()[1]) for line in text.splitlines() if line.startswith("HELD ")]
    if backend == "docker":
        # The sockets are the user's (0600 in a 0700 dir): the agent's uid cannot even
        # connect; only the forwarder (root in the container) can.
        assert held == 0
    else:
        # Served at once plus waiting in the backlog, per server; the rest are refused
        # (with no cap, every one of the 20,000 is accepted and holds a descriptor of so).
        assert 100 < held <= 2 * (MAX_CONNECTIONS + BACKLOG) + 10
    assert any(line.startswith("TCPHELD ") for line in text.splitlines())
    assert "CONTROL HTTP/1.1 403" in text  # the proxy still serves after the flood
    assert out.returncode != 3, out.stderr
    assert "Too many open files" not in out.stderr + out.stdout


GIT_HANG = r"""
git config core.fsmonitor "sleep 100000"
git config filter.slow.clean "sleep 100000; cat"
echo '* filter=slow' > .gitattributes
git config commit.gpgSign true
git config gpg.program "sleep 100000"
echo dirty > left-behind.txt
"""
GIT_CONTROL = r"""
echo work > done.txt && git add done.txt && git -c core.hooksPath=/dev/null commit -qm work
"""


def test_a_sandbox_repo_whose_git_hangs_cannot_hang_so(tmp_path: Path, backend: str) -> None:
    user = make_user(tmp_path)
    control = user.attack(GIT_CONTROL, backend=backend)
    assert control.returncode in (0, 5, 6), control.stderr  # control: the run completes
    t0 = time.monotonic()
    out = user.attack(GIT_HANG, backend=backend, extra=("--timeout", "40s"))
    elapsed = time.monotonic() - t0
    assert elapsed < 150, elapsed  # per git command within the iteration's 40 s
    assert out.returncode == 1
    [error] = [line for line in out.stderr.splitlines() if "did not finish within" in line]
    assert error.startswith("so: ")  # one line from the top-level handler, no traceback
    assert "Traceback" not in out.stderr
    assert out.sandbox_id is not None
    # Recoverable: the sandbox is still there to inspect and to remove.
    rm = user.so("rm", out.sandbox_id, "--yes", timeout=120)
    assert rm.returncode == 0, rm.stderr
    assert not (user.so_home / "sandboxes" / out.sandbox_id).exists()


DEEP_TREE = r"""
python3 - <<'PY'
import os
fd = os.open(".", os.O_RDONLY)
os.mkdir("deep", 0o755, dir_fd=fd)
fd = os.open("deep", os.O_RDONLY, dir_fd=fd)
for i in range(5000):
    os.mkdir("d", dir_fd=fd)
    sub = os.open("d", os.O_RDONLY, dir_fd=fd)
    os.symlink("..", "loop", dir_fd=sub)
    os.close(fd)
    fd = sub
os.close(fd)
os.makedirs("locked/inner", exist_ok=True)
open("locked/inner/f", "w").close()
os.chmod("locked/inner", 0)
os.chmod("locked", 0o500)
os.symlink("/", "root-link")
PY
"""


def test_so_rm_removes_any_tree_the_agent_leaves(tmp_path: Path, backend: str) -> None:
    user = make_user(tmp_path)
    out = user.attack(DEEP_TREE, backend=backend)
    assert out.sandbox_id is not None
    control = user.attack("echo fine > ok.txt\n", backend=backend)
    assert control.sandbox_id is not None
    for sid in (out.sandbox_id, control.sandbox_id):
        rm = user.so("rm", sid, "--yes", timeout=300)
        assert rm.returncode == 0, rm.stderr
        assert "RecursionError" not in rm.stderr
        assert not (user.so_home / "sandboxes" / sid).exists()
    assert Path("/etc/passwd").exists()
