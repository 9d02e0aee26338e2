"""The escape suite: every attempt in ``attempts.py`` run inside a real sandbox on each
backend (bwrap and Docker), with the real proxy and model gateway, against a host that
has things worth stealing: a fake ``~/.ssh`` key, a service on 127.0.0.1, another
sandbox, a model API key, a process to signal.

One sandbox per backend for the whole module. ``SO_SECURITY_REPORT=path`` appends one
JSON line per (attempt, backend) result to ``path`` (``table.py`` turns it into the
table of docs/security.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from attempts import ATTEMPTS, RESOURCES, Attempt, Policy

from helpers import git, make_repo, pids, tree_snapshot, unique_sleep
from sono.backends.base import Backend
from sono.backends.bwrap import BwrapBackend
from sono.backends.docker import DockerBackend
from sono.config import DEFAULT_EXCLUDE
from sono.net.gateway import Route
from sono.net.policy import NetworkPolicy, normalize_host
from sono.net.session import NetSession, gateway_for
from sono.net.upstream import PLACEHOLDER
from sono.proc import Streamed
from sono.sandbox import Sandbox, create_sandbox, remove_sandbox
from sono.state import Store
from sono.workspace import inspect_host

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
PROJECT_MARKER = "SO-PROJECT-MARKER-" + secrets.token_hex(6)
GIT_MARKER = "SO-HOST-GIT-MARKER-" + secrets.token_hex(6)
KEY_MARKER = "SO-HOST-SSH-KEY-" + secrets.token_hex(6)
CONTROL_PROMPT = "SO-CONTROL-PROMPT"
REPORT_ENV = "SO_SECURITY_REPORT"


# --- host-side servers ------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """One request a host-side server received."""

    server: str
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class Recorder:
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, item: Seen) -> None:
        with self.lock:
            self.seen.append(item)

    def since(self, start: int) -> list[Seen]:
        with self.lock:
            return list(self.seen[start:])

    def __len__(self) -> int:
        with self.lock:
            return len(self.seen)


class _V4Server(ThreadingHTTPServer):
    daemon_threads = True


class _V6Server(ThreadingHTTPServer):
    daemon_threads = True
    address_family = socket.AF_INET6


def serve(name: str, host: str, body: str, recorder: Recorder) -> ThreadingHTTPServer:
    """An HTTP server answering every request ``200 body`` and recording it."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            if length:
                self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            recorder.add(Seen(name, self.command, self.path, headers))
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = _answer
        do_POST = _answer
        do_PUT = _answer
        do_DELETE = _answer

    cls = _V6Server if ":" in host else _V4Server
    server = cls((host, 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _accept_and_close(listener: socket.socket) -> None:
    """A host Unix socket service: accept and hang up (its backlog never fills)."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        conn.close()


def host_ip() -> str:
    """The host's address on its default route (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 9))
            address = str(probe.getsockname()[0])
        except OSError:
            address = socket.gethostbyname(socket.gethostname())
    if address.startswith("127."):
        pytest.skip("the escape suite needs a non-loopback host address")
    return address


# --- the world around the sandboxes -----------------------------------------------------


@dataclass
class World:
    root: Path
    so_home: Path
    host_home: Path
    ssh_key: Path
    host_ip: str
    real_key: str
    recorder: Recorder
    servers: dict[str, ThreadingHTTPServer]
    other: Sandbox
    victim_cmd: str
    victim: subprocess.Popen[bytes]
    victim_sock: Path
    abstract: str

    @property
    def pwned(self) -> Path:
        """Exists only if the host ran something the sandbox planted."""
        return self.root / "so-pwned"

    def port(self, name: str) -> int:
        return int(self.servers[name].server_address[1])

    @property
    def upstream_url(self) -> str:
        return f"http://127.0.0.1:{self.port('upstream')}"

    def restart_victim(self) -> None:
        self.victim = subprocess.Popen(self.victim_cmd.split())


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("escape")
    so_home = root / "so-home"
    host_home = root / "host-home"
    ssh_key = host_home / ".ssh" / "id_ed25519"
    ssh_key.parent.mkdir(parents=True)
    ssh_key.write_text(f"-----BEGIN OPENSSH PRIVATE KEY-----\n{KEY_MARKER}\n-----END-----\n")
    ssh_key.chmod(0o600)
    (host_home / ".bash_history").write_text("export SECRET=hunter2\n")

    recorder = Recorder()
    servers = {
        "allowed": serve("allowed", "0.0.0.0", "ALLOWED-SERVER\n", recorder),
        "loopback": serve("loopback", "127.0.0.1", "HOST-LOOPBACK-SECRET\n", recorder),
        "v6": serve("v6", "::", "HOST-V6-SECRET\n", recorder),
        "loopback6": serve("loopback6", "::1", "HOST-LOOPBACK6-SECRET\n", recorder),
        "upstream": serve("upstream", "127.0.0.1", '{"marker": "UPSTREAM"}', recorder),
    }

    other_project = make_repo(root / "other-project")
    other = create_sandbox(
        store=Store(so_home),
        host=inspect_host(other_project),
        harness="custom",
        backend_name="bwrap",
        backend=BwrapBackend(),
        exclude=DEFAULT_EXCLUDE,
        allow_dirty=False,
        model=None,
        effort=None,
        workspace="auto",
    )
    (other.work / "secret.txt").write_text("OTHER-SANDBOX-SECRET\n")

    victim_cmd = unique_sleep()
    victim = subprocess.Popen(victim_cmd.split())
    victim_sock = root / "victim.sock"
    victim_server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    victim_server.bind(str(victim_sock))
    victim_sock.chmod(0o600)
    abstract = f"so-sec-{secrets.token_hex(6)}"
    abstract_server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract_server.bind("\0" + abstract)
    for listener in (victim_server, abstract_server):
        listener.listen(64)
        threading.Thread(target=_accept_and_close, args=(listener,), daemon=True).start()

    w = World(
        root=root,
        so_home=so_home,
        host_home=host_home,
        ssh_key=ssh_key,
        host_ip=host_ip(),
        real_key="sk-ant-REAL-" + secrets.token_hex(20),
        recorder=recorder,
        servers=servers,
        other=other,
        victim_cmd=victim_cmd,
        victim=victim,
        victim_sock=victim_sock,
        abstract=abstract,
    )
    yield w
    w.victim.kill()
    w.victim.wait()
    for listener in (victim_server, abstract_server):
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
    for server in servers.values():
        server.shutdown()
        server.server_close()
    remove_sandbox(other)


# --- one sandbox per backend --------------------------------------------------------------


@dataclass
class Box:
    backend: str
    sb: Sandbox
    project: Path
    routes: tuple[Route, ...]
    env: dict[str, str]
    stray: str
    racer: str
    snapshot: dict[str, bytes]


def _new_backend(name: str) -> Backend:
    return BwrapBackend() if name == "bwrap" else DockerBackend()


@pytest.fixture(scope="module", params=["bwrap", "docker"])
def box(request: pytest.FixtureRequest, world: World) -> Iterator[Box]:
    name = str(request.param)
    if name == "docker":
        request.getfixturevalue("docker_ready")
    project = make_repo(world.root / f"project-{name}", {"README.md": f"# {PROJECT_MARKER}\n"})
    git(project, "config", "so-test.marker", GIT_MARKER)
    with pytest.MonkeyPatch.context() as mp:
        if name == "docker" and os.getuid() == 0:
            # Docker's overlay needs the project owned by the container user; root's git
            # then needs safe.directory for a repo it does not own.
            subprocess.run(["chown", "-R", "1000:1000", str(project)], check=True)
            mp.setenv("GIT_CONFIG_COUNT", "1")
            mp.setenv("GIT_CONFIG_KEY_0", "safe.directory")
            mp.setenv("GIT_CONFIG_VALUE_0", "*")
        sb = create_sandbox(
            store=Store(world.so_home),
            host=inspect_host(project),
            harness="custom",
            backend_name=name,
            backend=_new_backend(name),
            exclude=DEFAULT_EXCLUDE,
            allow_dirty=False,
            model=None,
            effort=None,
            workspace="auto",
        )
    shutil.copy(HERE / "probe.py", sb.home_seed / "probe.py")
    gw = gateway_for(
        {"ANTHROPIC_API_KEY": world.real_key, "ANTHROPIC_BASE_URL": world.upstream_url}
    )
    assert world.real_key not in json.dumps(gw.env)
    try:
        yield Box(
            backend=name,
            sb=sb,
            project=project,
            routes=gw.routes,
            env=dict(gw.env),
            stray=unique_sleep(),
            racer=f"so-racer-{secrets.token_hex(6)}",
            snapshot=tree_snapshot(project),
        )
    finally:
        remove_sandbox(sb)


# --- running attempts -----------------------------------------------------------------------


def policy(kind: Policy, address: str) -> NetworkPolicy:
    if kind == "open":
        return NetworkPolicy(mode="open", allow=(f"{address}/32",), deny=(".blocked.test",))
    return NetworkPolicy(mode="allowlist", allow=(f"{address}/32",))


def context(world: World, box: Box, attempt: Attempt) -> dict[str, str]:
    victim_re = "[" + world.victim_cmd[0] + "]" + world.victim_cmd[1:]
    return {
        "host_ip": world.host_ip,
        "http_port": str(world.port("allowed")),
        "loop_port": str(world.port("loopback")),
        "v6_port": str(world.port("v6")),
        "loop6_port": str(world.port("loopback6")),
        "abstract": world.abstract,
        "host_home": str(world.host_home),
        "ssh_key": str(world.ssh_key),
        "project": str(box.project),
        "objects": str(box.project / ".git" / "objects"),
        "git_marker": GIT_MARKER,
        "so_home": str(world.so_home),
        "other_work": str(world.other.work),
        "other_json": str(world.other.dir / "sandbox.json"),
        "net_dir": str(box.sb.net_dir),
        "victim_pid": str(world.victim.pid),
        "victim_re": victim_re,
        "victim_sock": str(world.victim_sock),
        "host_pid": str(os.getpid()),
        "stray": box.stray,
        "pwned": str(world.pwned),
        "racer": box.racer,
        "rev_key": world.real_key[::-1],
        "rev_placeholder": PLACEHOLDER[::-1],
        "rev_probe": "probe.py"[::-1],
        "rev_project_marker": PROJECT_MARKER[::-1],
        "mark": f"/so-sec-{attempt.id}",
    }


@dataclass
class Ran:
    returncode: int | None
    killed: str | None
    output: list[str]

    def show(self) -> str:
        return f"exit {self.returncode}, killed {self.killed}:\n" + "\n".join(self.output[-30:])


def execute(box: Box, command: str, timeout: float, spec: Any = None) -> Ran:
    lines: list[str] = []
    result: Streamed = box.sb.backend.exec(
        spec=spec or box.sb.spec,
        argv=["sh", "-c", command],
        env=box.env,
        stdin_text=None,
        timeout=timeout,
        on_line=lines.append,
    )
    return Ran(result.returncode, result.killed, lines)


def denied_has(entries: list[dict[str, Any]], expected: str) -> bool:
    host, _, port = expected.rpartition(":")
    want = normalize_host(host) or host
    return any(
        str(e.get("port")) == port and (normalize_host(str(e.get("host"))) or e.get("host")) == want
        for e in entries
    )


def report(attempt: Attempt, backend: str, result: str, detail: str = "") -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    record = {"id": attempt.id, "backend": backend, "result": result, "detail": detail}
    line = json.dumps(record)
    with Path(path).open("a", encoding="utf-8") as fh:
        fh.write(line + "\n")


class Escaped(AssertionError):
    """An attack got through (a known hole is an expected failure of exactly this)."""


# --- host-side judges (attempt.check / control_check): True = the step succeeded -----------

Check = Callable[[World, Box, str], bool]


def check_project_changed(world: World, box: Box, phase: str) -> bool:
    return tree_snapshot(box.project) != box.snapshot


def check_host_read(world: World, box: Box, phase: str) -> bool:
    text = box.sb.read_file("specs/prompt.md") or ""
    return (KEY_MARKER if phase == "attack" else CONTROL_PROMPT) in text


def check_host_read_dir(world: World, box: Box, phase: str) -> bool:
    return KEY_MARKER in (box.sb.read_file("specs/id_ed25519") or "")


def check_host_read_race(world: World, box: Box, phase: str) -> bool:
    """so reads specs/prompt.md host-side (the next prompt) while the racer runs."""
    try:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            if KEY_MARKER in (box.sb.read_file("specs/prompt.md") or ""):
                return True
        return False
    finally:
        for pid in pids(box.racer):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def check_hook_ran_on_host(world: World, box: Box, phase: str) -> bool:
    """The host-side half of ``so diff``: the drift check and the diff itself."""
    from sono import review

    review.drift_notes(box.sb)
    review.diff_text(box.sb, iteration=None, stat=False, color=False)
    review.diff_text(box.sb, iteration=None, stat=True, color=False)
    return world.pwned.exists()


def check_net_dir_symlink(world: World, box: Box, phase: str) -> bool:
    """A second so process opens the sandbox's network while the first still serves it
    (``so shell`` during ``so run``): does the victim socket change mode?"""
    before = stat.S_IMODE(world.victim_sock.stat().st_mode)
    with (
        contextlib.suppress(Exception),
        NetSession(box.sb.net_dir, policy("allowlist", world.host_ip), box.routes),
    ):
        pass
    after = stat.S_IMODE(world.victim_sock.stat().st_mode)
    world.victim_sock.chmod(before)
    planted = box.sb.net_dir / "sock" / "gateway.sock"
    if planted.is_symlink():  # left behind when the session's socket path was an alias
        planted.unlink()
    return after != before


def check_victim_dead(world: World, box: Box, phase: str) -> bool:
    for _ in range(10):
        if world.victim.poll() is not None:
            world.restart_victim()
            return True
        time.sleep(0.02)
    return False


def check_stray_alive(world: World, box: Box, phase: str) -> bool:
    found = pids(f"^{box.stray}$")
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    return bool(found)


CHECKS: dict[str, Check] = {
    "project_changed": check_project_changed,
    "host_read": check_host_read,
    "host_read_dir": check_host_read_dir,
    "host_read_race": check_host_read_race,
    "hook_ran_on_host": check_hook_ran_on_host,
    "net_dir_symlink": check_net_dir_symlink,
    "victim_dead": check_victim_dead,
    "stray_alive": check_stray_alive,
}


def judge(attempt: Attempt, name: str | None, ran: Ran, world: World, box: Box, phase: str) -> bool:
    return CHECKS[name](world, box, phase) if name else ran.returncode == 0


def _prepare(request: pytest.FixtureRequest, attempt: Attempt, backend: str) -> None:
    if backend not in attempt.backends:
        report(attempt, backend, "n/a")
        pytest.skip(f"{attempt.id} does not apply to {backend}")
    hole = attempt.holes.get(backend)
    if hole:  # only the attack getting through is expected; anything else still fails
        request.applymarker(pytest.mark.xfail(strict=True, reason=hole, raises=Escaped))


@pytest.mark.parametrize("attempt", ATTEMPTS, ids=[a.id for a in ATTEMPTS])
def test_attempt(attempt: Attempt, box: Box, world: World, request: pytest.FixtureRequest) -> None:
    _prepare(request, attempt, box.backend)
    ctx = context(world, box, attempt)
    start_seen = len(world.recorder)
    with NetSession(box.sb.net_dir, policy(attempt.policy, world.host_ip), box.routes) as net:
        offsets = net.offsets()
        attack = execute(box, attempt.attack.format(**ctx), attempt.timeout)
        escaped = judge(attempt, attempt.check, attack, world, box, "attack")
        denied = net.since(offsets).denied
        control = execute(box, attempt.control.format(**ctx), attempt.timeout)
        control_ok = judge(attempt, attempt.control_check, control, world, box, "control")
    mark = ctx["mark"]
    leaked = [
        s
        for s in world.recorder.since(start_seen)
        if s.path.startswith(mark) and not s.path.startswith(mark + "-control")
        if s.server not in attempt.reach
    ]
    escaped = escaped or bool(leaked)
    report(
        attempt,
        box.backend,
        "ESCAPED" if escaped else ("blocked" if control_ok else "control failed"),
    )
    assert control_ok, f"control failed ({attempt.control}): {control.show()}"
    if escaped:
        raise Escaped(f"attack got through: {attack.show()}\nreached: {leaked}")
    if attempt.denied:
        expected = attempt.denied.format(**ctx)
        assert denied_has(denied, expected), f"{expected} not in the deny log: {denied}"


# --- host-side assertions ---------------------------------------------------------------------


def test_gateway_holds_the_key(box: Box, world: World) -> None:
    """The upstream gets the real key; the sandbox sent a placeholder or its own key,
    neither of which reaches the upstream; no host-side log or state file holds the key."""
    start = len(world.recorder)
    command = (
        "python3 /home/agent/probe.py gateway POST /anthropic/v1/messages --body '{}' "
        "--key sk-agent-own-key --marker UPSTREAM && "
        "python3 /home/agent/probe.py gateway POST /anthropic/v1/messages --body '{}' "
        "--marker UPSTREAM"
    )
    with NetSession(box.sb.net_dir, policy("allowlist", world.host_ip), box.routes):
        ran = execute(box, command, 30)
    assert ran.returncode == 0, ran.show()
    upstream = [s for s in world.recorder.since(start) if s.server == "upstream"]
    assert len(upstream) == 2
    netloc = f"127.0.0.1:{world.port('upstream')}"
    for seen in upstream:
        assert seen.headers.get("x-api-key") == world.real_key
        assert "authorization" not in seen.headers
        assert seen.headers.get("host") == netloc
    for seen in world.recorder.since(0):
        values = " ".join(seen.headers.values())
        assert PLACEHOLDER not in values
        if seen.server != "upstream":
            assert world.real_key not in values, f"{seen.server} got the key"
        else:
            assert seen.headers.get("host") == netloc, f"upstream got Host {seen.headers}"
    for name in ("usage.jsonl", "denied.jsonl"):
        log = box.sb.net_dir / name
        if log.exists():
            assert world.real_key not in log.read_text()
    assert (box.sb.net_dir / "usage.jsonl").is_file()
    for path in world.so_home.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert world.real_key.encode() not in path.read_bytes(), path
    if box.backend == "docker":
        import docker

        container = docker.from_env().containers.get(f"so-{box.sb.record.id}")
        assert world.real_key not in json.dumps(container.attrs)


def test_host_repo_untouched(box: Box) -> None:
    """After every attempt: the host project, its .git/config and hooks byte for byte."""
    after = tree_snapshot(box.project)
    assert after.keys() == box.snapshot.keys()
    changed = [name for name in after if after[name] != box.snapshot[name]]
    assert changed == []
    assert b"hooksPath" not in after[".git/config"]
    assert GIT_MARKER.encode() in after[".git/config"]
    hooks = [n for n in after if n.startswith(".git/hooks/")]
    assert not [n for n in hooks if not n.endswith(".sample")]


# --- resources (last: they push the sandbox to its limits) -----------------------------------


def kill_leftovers(ctx: dict[str, str]) -> int:
    """Kill, by pid, whatever the attack left running (found by its unique tag or sleep);
    how many there were right after the run."""
    patterns = [ctx["tag"], f"^{ctx['fill']}$"]
    first = None
    for _ in range(100):
        found = {pid for pattern in patterns for pid in pids(pattern)}
        first = len(found) if first is None else first
        if not found:
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.05)
    return first or 0


@pytest.mark.parametrize("attempt", RESOURCES, ids=[a.id for a in RESOURCES])
def test_resources(
    attempt: Attempt, box: Box, world: World, request: pytest.FixtureRequest
) -> None:
    """Under limits (pids 64, memory 256 MiB, disk 50 MiB) each attack is stopped (its exit
    or ``killed``), leaves nothing running behind, the control still works and the host
    keeps answering (starting a process on it never takes 2 s)."""
    from sono.limits import Limits

    _prepare(request, attempt, box.backend)
    limits = Limits(pids=64, memory=256 << 20, disk=50 << 20)
    spec = dataclasses.replace(box.sb.spec, limits=limits)
    ctx = context(world, box, attempt) | {
        "tag": f"so-tag-{attempt.id}-{secrets.token_hex(4)}",
        "fill": unique_sleep(),
    }
    worst = [0.0]
    done = threading.Event()

    def watch_host() -> None:
        while not done.is_set():
            t = time.monotonic()
            subprocess.run(["true"], check=True)
            worst[0] = max(worst[0], time.monotonic() - t)
            time.sleep(0.1)

    watcher = threading.Thread(target=watch_host, daemon=True)
    watcher.start()
    try:
        with NetSession(box.sb.net_dir, policy("allowlist", world.host_ip), box.routes):
            attack = execute(box, attempt.attack.format(**ctx), attempt.timeout, spec)
            time.sleep(0.3)
            left = kill_leftovers(ctx)
            # What a killed attack left behind (a full disk) would fail the control.
            box.sb.backend.run(spec=spec, argv=["rm", "-f", "/workspace/so-fill"], check=False)
            control = execute(box, attempt.control.format(**ctx), attempt.timeout, spec)
    finally:
        done.set()
        watcher.join()
    stopped = attack.returncode != 0 or attack.killed is not None
    escaped = bool(left) if attempt.check == "leftovers" else not stopped
    how = f"killed: {attack.killed}" if attack.killed else f"exit {attack.returncode}"
    detail = how + (f", {left} process(es) left running" if left else "")
    report(attempt, box.backend, "ESCAPED" if escaped else "blocked", detail)
    assert control.returncode == 0, control.show()
    assert worst[0] < 2.0, f"the host stalled {worst[0]:.1f}s"
    if escaped:
        raise Escaped(f"not contained ({detail}): {attack.show()}")
