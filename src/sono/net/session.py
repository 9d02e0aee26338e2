"""One sandbox's network for the length of a run.

The sandbox has no network interface but loopback. Two host-side servers listen on Unix
sockets in ``$SO_HOME/sandboxes/<id>/net/sock/p/`` (``sock/`` is bound into the
sandbox at ``/run/so/net``); a small forwarder inside (:mod:`sono.net.forward`) exposes them as

* ``127.0.0.1:3128`` — the egress proxy (``HTTP(S)_PROXY``), which allows only what the
  policy allows and logs every denial to ``net/denied.jsonl``;
* ``127.0.0.1:3129`` — the model gateway: the harness's base URLs point here, the sandbox
  holds a placeholder key, the gateway puts the real one on the upstream request and logs
  usage per request to ``net/usage.jsonl``.

The logs live next to ``sock/``, never inside it: the agent cannot read or forge them.

Only the user reaches the sockets: each is mode 0600 in ``p/`` (0700), owned by the
user, below the sandbox's dir and ``$SO_HOME/sandboxes`` (both 0700). Inside, bwrap maps
the agent to the user's uid; on Docker the forwarder runs as root in the container and,
when so is not root on the host, connects with the user's uid as its effective uid
(``--euid``; its real uid stays root, so the agent cannot signal it).

Secrets (``[secrets.NAME]``, :mod:`sono.net.secrets`) reach the sandbox as placeholders
(``NAME=so-secret-NAME-…``); the proxy swaps them for the real values on HTTPS requests to
the hosts each is bound to, terminating TLS for those hosts with a per-session CA
(:mod:`sono.net.tls`) whose certificate is ``sock/ca.pem`` (and ``sock/ca-bundle.pem``,
the host's roots plus that CA), which the sandbox is told to trust.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from secrets import token_hex
from typing import Any

from sono.layout import CA_INSIDE, GATEWAY_PORT, GATEWAY_SOCK, PROXY_SOCK, SOCKETS
from sono.net import scrub
from sono.net.gateway import AuthStyle, GatewayThread, Route
from sono.net.policy import NetworkPolicy
from sono.net.proxy import ProxyThread
from sono.net.secrets import BoundSecret, Secret, resolve, sandbox_env
from sono.net.upstream import PLACEHOLDER, Upstream, env_upstreams
from sono.net.usage import Measured, measure

# Variables that hold a credential by name, whatever a harness does with them: the
# sandbox gets a placeholder in their place (a CLI may insist that its key is set).
CREDENTIAL_VARS = frozenset(
    {
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "CLAUDE_CODE_OAUTH_TOKEN",
        "OPENAI_API_KEY",
        "CODEX_API_KEY",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_BEARER_TOKEN_BEDROCK",
    }
)
BASE_URL_VARS = {"ANTHROPIC_BASE_URL": "anthropic", "OPENAI_BASE_URL": "openai"}


@dataclass(frozen=True)
class Gatewayed:
    """What the agent is given instead of the host's model settings."""

    routes: tuple[Route, ...]
    endpoints: dict[str, str]  # upstream name -> base URL inside the sandbox
    env: dict[str, str]  # the host env as the harness may see it (credentials replaced)
    # What the sandbox gets whatever the harness keeps of ``env``: the secrets'
    # placeholders and the variables that make its clients trust the session CA.
    sandbox_env: dict[str, str] = field(default_factory=dict)
    upstreams: tuple[Upstream, ...] = ()
    # Every credential value the host knows of (the upstreams', the credential-named
    # variables'): nothing the sandbox gets may hold one (see sono.net.scrub).
    secrets: tuple[str, ...] = field(default=(), repr=False)


def route_for(upstream: Upstream) -> Route:
    cred = upstream.credential
    auth: AuthStyle = cred.header
    if cred.value == "" or auth == "none":
        return Route(
            f"/{upstream.name}", upstream.base_url, "none", "", upstream.api, upstream.headers
        )
    return Route(
        f"/{upstream.name}", upstream.base_url, auth, cred.value, upstream.api, upstream.headers
    )


def scrub_env(host_env: Mapping[str, str], secrets: Iterable[str]) -> dict[str, str]:
    """``host_env`` for the sandbox (:func:`sono.net.scrub.scrub_env`): every variable
    named like a credential (and :data:`CREDENTIAL_VARS`) a placeholder, header-only
    variables dropped, every known credential value and credential-shaped text replaced."""
    named = {k: PLACEHOLDER for k, v in host_env.items() if v and k in CREDENTIAL_VARS}
    return {**scrub.scrub_env(host_env, secrets), **named}


def gateway_for(
    host_env: Mapping[str, str], upstreams: Sequence[Upstream] | None = None
) -> Gatewayed:
    """A route per upstream (by default the plain environment's, :func:`env_upstreams`);
    the sandbox sees the gateway and placeholders: ``env`` is ``host_env`` with every
    credential replaced and the base-URL variables pointing at the gateway (or gone)."""
    ups = tuple(upstreams) if upstreams is not None else env_upstreams(host_env)
    names = [u.name for u in ups]
    if len(set(names)) != len(names):
        raise ValueError(f"two upstreams share a name: {names}")
    endpoints = {u.name: f"http://127.0.0.1:{GATEWAY_PORT}/{u.name}" for u in ups}
    known = [s for u in ups for s in u.secrets]
    known += [v for k, v in host_env.items() if v and scrub.is_credential_name(k)]
    env = scrub_env(host_env, known)
    for var, family in BASE_URL_VARS.items():
        env.pop(var, None)
        if family in endpoints:
            env[var] = endpoints[family]
    routes = tuple(route_for(u) for u in ups)
    return Gatewayed(routes, endpoints, env, upstreams=ups, secrets=tuple(known))


@dataclass
class Offsets:
    denied: int = 0
    usage: int = 0


# What an iteration record keeps of the network, whatever the logs hold: at most this many
# distinct denials (with counts; the rest summed into one), each log line read at most
# MAX_LOG_LINE bytes, and at most MAX_LOG_READ bytes of a log read per iteration.
MAX_RECORD_DENIALS = 50
MAX_LOG_LINE = 4096
MAX_LOG_READ = 64 * 1024 * 1024
OTHER_DENIALS = "other denials (more distinct ones than a record keeps)"


@dataclass
class NetLog:
    """What one iteration did on the network: the policy's denials, distinct, with
    ``count`` (bounded, see :data:`MAX_RECORD_DENIALS`), and the gateway's requests."""

    denied: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    refused: int = 0  # requests the gateway refused (not a model endpoint)
    refused_reasons: list[str] = field(default_factory=list)  # the first few, bounded
    measured: Measured = field(default_factory=lambda: measure(()))
    # The gateway's log of this iteration was longer than so reads (MAX_LOG_READ): what it
    # measured is a floor, and a budget cannot be held (the loop stops).
    incomplete: bool = False


class NetSession:
    """The proxy and the gateway of one sandbox, on threads of this process."""

    def __init__(
        self,
        net_dir: Path,
        policy: NetworkPolicy,
        routes: tuple[Route, ...],
        secrets: Sequence[BoundSecret] = (),
    ) -> None:
        self.dir = net_dir
        self.sock_dir = net_dir / "sock"  # bound inside: the CA files, and p/
        self.private_dir = self.sock_dir / SOCKETS
        self.denied_log = net_dir / "denied.jsonl"
        self.usage_log = net_dir / "usage.jsonl"
        self.policy = policy
        self.routes = routes
        self.secrets = tuple(secrets)
        self._threads: list[Any] = []

    def __enter__(self) -> NetSession:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.sock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.sock_dir.chmod(0o755)  # the CA certificates: for the agent whatever its uid
        # The sockets: the user's alone (the agent reaches them as the user, see above).
        self.private_dir.mkdir(mode=0o700, exist_ok=True)
        if self.private_dir.is_symlink() or not self.private_dir.is_dir():
            raise OSError(f"{self.private_dir} is not a directory")
        self.private_dir.chmod(0o700)
        with _short_dir(self.private_dir) as short:
            if not _serving(short / GATEWAY_SOCK):  # one so process serves a sandbox
                self._threads.append(
                    GatewayThread(self.routes, short / GATEWAY_SOCK, self.usage_log).start()
                )
            if self.policy.mode != "none" and not _serving(short / PROXY_SOCK):
                self._threads.append(self._proxy(short / PROXY_SOCK).start())
        for name in (GATEWAY_SOCK, PROXY_SOCK):
            if _is_socket(self.sock_dir / name):  # where sockets were before p/
                with contextlib.suppress(OSError):
                    (self.sock_dir / name).unlink()
            path = self.private_dir / name
            if _is_socket(path):  # never through a link (the dir is read-only inside)
                with contextlib.suppress(FileNotFoundError):
                    path.chmod(0o600)

    def _proxy(self, socket_path: Path) -> ProxyThread:
        """The proxy thread; with secrets, a fresh CA whose certificate (never its key)
        is written to ``sock/`` first, replacing any earlier session's."""
        if not self.secrets:
            return ProxyThread(self.policy, socket_path, self.denied_log)
        from sono.net.tls import SessionCA, write_trust_files

        ca = SessionCA()
        write_trust_files(self.sock_dir, ca)
        return ProxyThread(self.policy, socket_path, self.denied_log, secrets=self.secrets, ca=ca)

    def stop(self) -> None:
        for thread in reversed(self._threads):
            thread.stop()
        self._threads.clear()

    def offsets(self) -> Offsets:
        self._flush()
        return Offsets(_size(self.denied_log), _size(self.usage_log))

    def since(self, start: Offsets) -> NetLog:
        self._flush()
        log = NetLog(denied=_denials(_lines(self.denied_log, start.denied)))

        def cut() -> None:
            log.incomplete = True

        def counted() -> Iterator[dict[str, Any]]:
            for item in _lines(self.usage_log, start.usage, cut):
                held = _int(item.get("suppressed"))
                if held:  # requests the gateway only counted (see MAX_QUIET_LINES)
                    log.requests += held
                    log.refused += _int(item.get("refused_count"))
                    continue
                log.requests += 1
                log.tokens_in += _int(item.get("input_tokens"))
                log.tokens_out += _int(item.get("output_tokens"))
                if item.get("client_left") and item.get("output_tokens") is None:
                    cut()  # served, but the answer ended unmeasured: the usage is a floor
                if item.get("refused"):
                    log.refused += 1
                    if len(log.refused_reasons) < 3:
                        log.refused_reasons.append(str(item["refused"])[:200])
                yield item

        log.measured = measure(counted())  # streamed: bounded memory
        return log

    def _flush(self) -> None:
        """Counts of repeated denials reach the log (when this process runs the proxy)."""
        for thread in self._threads:
            if isinstance(thread, ProxyThread):
                thread.proxy.denials.flush()
            elif isinstance(thread, GatewayThread):
                thread.gateway.flush()


def session_for(
    net_dir: Path,
    policy: NetworkPolicy,
    secrets: Sequence[Secret],
    host_env: Mapping[str, str],
    upstreams: Sequence[Upstream] | None = None,
) -> tuple[NetSession, Gatewayed]:
    """The network of a sandbox under ``policy``, and what its agent is told.

    With ``secrets`` (``[secrets]``), their values are read from ``host_env`` or their files now (a
    missing one raises :class:`sono.errors.SoError`); the agent gets each as a
    placeholder, loses every host variable that held a secret's value, and is told to
    trust the session CA (:func:`sono.net.tls.trust_env`) when there is a proxy. Those
    variables are in ``sandbox_env`` too: every harness filters the host env it is given,
    so the caller adds them after the harness (they must reach any agent)."""
    gatewayed = gateway_for(host_env, upstreams)
    bound = resolve(secrets, host_env) if secrets else []
    if bound:
        sources = {s.env for s in secrets if s.env is not None}
        values = {b.value for b in bound}
        env = {k: v for k, v in gatewayed.env.items() if k not in sources and v not in values}
        forced = sandbox_env(bound)
        if policy.mode != "none":
            from sono.net.tls import trust_env

            forced.update(trust_env(CA_INSIDE))
        env.update(forced)
        gatewayed = dataclasses.replace(
            gatewayed, env=env, sandbox_env=forced, secrets=(*gatewayed.secrets, *values)
        )
    return NetSession(net_dir, policy, gatewayed.routes, bound), gatewayed


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _lines(
    path: Path, offset: int, cut: Callable[[], None] = lambda: None
) -> Iterator[dict[str, Any]]:
    """The JSON objects of ``path`` from ``offset`` on, read in bounded memory: at most
    :data:`MAX_LOG_READ` bytes (``cut`` is called when more was left), lines longer
    than :data:`MAX_LOG_LINE` skipped."""
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return
    with fh:
        fh.seek(offset)
        budget = MAX_LOG_READ
        while budget > 0:
            want = min(MAX_LOG_LINE, budget)
            line = fh.readline(want)
            if not line:
                return
            budget -= len(line)
            if not line.endswith(b"\n") and len(line) < want:
                return  # the last line, still being written
            if not line.endswith(b"\n"):  # too long: skip to the end of it, say so
                cut()  # (so writes bounded lines: a longer one may hide tokens)
                while (more := fh.readline(MAX_LOG_LINE)) and not more.endswith(b"\n"):
                    budget -= len(more)
                budget -= len(more)
                continue
            with contextlib.suppress(ValueError):
                item = json.loads(line)
                if isinstance(item, dict):
                    yield item
        if fh.read(1):
            cut()


def _denials(items: Iterator[dict[str, Any]]) -> list[dict[str, Any]]:
    """Distinct (host, port, reason) with summed ``count`` and first ``time``; past
    :data:`MAX_RECORD_DENIALS`, the rest in one entry."""
    found: dict[tuple[str, int, str], dict[str, Any]] = {}
    other: dict[str, Any] | None = None
    for item in items:
        key = (str(item.get("host"))[:253], _int(item.get("port")), str(item.get("reason"))[:300])
        count = max(1, _int(item.get("count", 1)))
        entry = found.get(key)
        if entry is None and len(found) >= MAX_RECORD_DENIALS:
            other = other or {"time": item.get("time"), "host": "*", "port": 0, "count": 0}
            other["reason"] = OTHER_DENIALS
            other["count"] += count
            continue
        if entry is None:
            host, port, reason = key
            found[key] = {"time": str(item.get("time"))[:40], "host": host, "port": port}
            found[key].update(reason=reason, count=count)
        else:
            entry["count"] += count
    return [*found.values(), *([other] if other else [])]


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


def _serving(path: Path) -> bool:
    if not _is_socket(path):
        with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
            if path.is_symlink():
                path.unlink()  # a planted link: never connect through it
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def _short_dir(directory: Path) -> Iterator[Path]:
    """A short path to ``directory`` (Unix socket paths are limited to ~107 bytes): a
    symlink in the temp dir, removed again once the sockets are bound."""
    if len(str(directory)) < 80:
        yield directory
        return
    link = Path(tempfile.gettempdir()) / f"so-{os.getpid()}-{token_hex(4)}"
    link.symlink_to(directory)
    try:
        yield link
    finally:
        link.unlink()
