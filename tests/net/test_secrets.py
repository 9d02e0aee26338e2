"""Secrets: placeholders in the sandbox, real values only on HTTPS requests to their hosts.

Real sockets and real TLS: a local HTTPS upstream with a certificate from a test CA, the
proxy on a Unix socket intercepting hosts with bound secrets, and http.client on top of a
CONNECT tunnel trusting the session CA."""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import logging
import re
import socket
import ssl
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from net_helpers import (
    TIMEOUT_S,
    FakeResolver,
    json_lines,
    read_until,
    short_dir,
    unix_connect,
)

from sono.config import load_config
from sono.errors import SoError
from sono.net.policy import NetworkPolicy
from sono.net.proxy import ProxyThread
from sono.net.secrets import (
    DEFAULT_HEADERS,
    BoundSecret,
    Scrubber,
    Secret,
    Unbound,
    resolve,
    sandbox_env,
    substitute_headers,
)
from sono.net.session import NetSession, gateway_for, session_for
from sono.net.tls import BUNDLE_FILE, CA_FILE, SessionCA, load_chain, trust_env, write_trust_files

API = "api.example.test"  # GH_TOKEN is bound here
OTHER = "other.example.test"  # OTHER_TOKEN is bound here
PLAIN = "plain.example.test"  # no secret: an opaque tunnel
HOSTS = (API, OTHER, PLAIN)
POLICY = NetworkPolicy("allowlist", (*HOSTS, "127.0.0.1/32"))
SECRETS = (
    Secret("GH_TOKEN", "HOST_GH", None, (API,)),
    Secret("OTHER_TOKEN", "HOST_OTHER", None, (".other.example.test",)),
)
HOST_ENV = {"HOST_GH": "ghp_real_value", "HOST_OTHER": "other_real_value"}
PLACEHOLDER_RE = re.compile(r"so-secret-[A-Za-z0-9_]+-[0-9a-f]{16}")


# --- a test CA and an HTTPS upstream ---------------------------------------------------


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


@dataclass(frozen=True)
class Pki:
    server: ssl.SSLContext  # the upstream's, with a certificate for HOSTS
    client: ssl.SSLContext  # trusts the test CA only (the proxy's upstream context)
    ca_pem: bytes


def make_pki() -> Pki:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("test upstream CA"))
        .issuer_name(_name("test upstream CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(h) for h in HOSTS]
    names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name(API))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    load_chain(
        server,
        leaf.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    client = ssl.create_default_context(cadata=ca_pem.decode())
    return Pki(server, client, ca_pem)


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes


@dataclass
class _State:
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    release: threading.Event = field(default_factory=threading.Event)
    released: list[bool] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _TLSServer(ThreadingHTTPServer):
    daemon_threads = True
    tls: ssl.SSLContext
    state: _State

    def finish_request(self, request: Any, client_address: Any) -> None:
        """The handshake in the connection's own thread, not the accepting one."""
        with self.state.lock:
            self.state.connections += 1
        try:
            tls = self.tls.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        super().finish_request(tls, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class HTTPSUpstream:
    """Records every request. ``/stream`` answers chunked: ``first``, then waits for
    ``release`` (recording whether it came in time), then ``second``; anything else
    answers ``upstream saw METHOD PATH`` and the request body."""

    def __init__(self, tls: ssl.SSLContext) -> None:
        state = _State()
        self.state = state

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    parts = []
                    while size := int(self.rfile.readline().split(b";")[0], 16):
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                    while self.rfile.readline() not in (b"\r\n", b""):
                        pass
                    return b"".join(parts)
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _answer(self) -> None:
                body = self._body()
                headers = {k.lower(): v for k, v in self.headers.items()}
                with state.lock:
                    state.seen.append(Seen(self.command, self.path, headers, body))
                if self.path.partition("?")[0] == "/stream":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self.wfile.write(b"6\r\nfirst\n\r\n")
                    self.wfile.flush()
                    state.released.append(state.release.wait(TIMEOUT_S))
                    self.wfile.write(b"7\r\nsecond\n\r\n0\r\n\r\n")
                    return
                reply = f"upstream saw {self.command} {self.path}\n".encode() + body
                self.send_response(200)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            do_GET = do_POST = _answer

        self._server = _TLSServer(("127.0.0.1", 0), Handler)
        self._server.tls = tls
        self._server.state = state
        self.port: int = self._server.server_address[1]

    @property
    def seen(self) -> list[Seen]:
        with self.state.lock:
            return list(self.state.seen)

    @property
    def connections(self) -> int:
        with self.state.lock:
            return self.state.connections

    def __enter__(self) -> Self:
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.state.release.set()
        self._server.shutdown()
        self._server.server_close()


# --- the setup -------------------------------------------------------------------------


@dataclass
class Setup:
    dir: Path
    sock: Path
    log: Path
    resolver: FakeResolver
    pki: Pki
    bound: list[BoundSecret]

    def proxy(self) -> ProxyThread:
        return ProxyThread(
            POLICY,
            self.sock,
            self.log,
            self.resolver,
            secrets=self.bound,
            upstream_ssl=self.pki.client,
        )

    def placeholder(self, name: str) -> str:
        return next(b.placeholder for b in self.bound if b.name == name)


@pytest.fixture(scope="module")
def pki() -> Pki:
    return make_pki()


@pytest.fixture
def setup(pki: Pki) -> Iterator[Setup]:
    with short_dir() as d:
        resolver = FakeResolver({h: ["127.0.0.1"] for h in HOSTS})
        bound = resolve(SECRETS, HOST_ENV)
        yield Setup(d, d / "proxy.sock", d / "logs" / "denied.jsonl", resolver, pki, bound)


def open_tunnel(sock_path: Path, host: str, port: int) -> socket.socket:
    sock = unix_connect(sock_path)
    sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head, rest = read_until(sock, b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert rest == b""
    return sock


def https(
    proxy: ProxyThread, sock_path: Path, host: str, port: int, context: ssl.SSLContext
) -> http.client.HTTPConnection:
    """An HTTP/1.1 connection to ``host`` through a CONNECT tunnel, TLS with ``context``."""
    tls = context.wrap_socket(open_tunnel(sock_path, host, port), server_hostname=host)
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)
    conn.sock = tls
    return conn


def session_trust(proxy: ProxyThread, directory: Path) -> ssl.SSLContext:
    """A client context trusting the bundle the sandbox would get (host roots + CA)."""
    ca = proxy.proxy.ca
    assert ca is not None
    bundle = write_trust_files(directory, ca)
    context = ssl.create_default_context(cafile=str(bundle))
    assert context.get_ca_certs()  # the bundle loaded
    return context


# --- resolving -------------------------------------------------------------------------


def test_resolve_reads_env_and_files_and_hides_values(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("file_value\n")
    secrets = (
        Secret("FROM_ENV", "HOST_VAR", None, ("api.example.test",)),
        Secret("FROM_FILE", None, str(token), (".example.org", "10.0.0.0/8")),
    )
    bound = resolve(secrets, {"HOST_VAR": "env_value\r\n"})
    assert [(b.name, b.value) for b in bound] == [
        ("FROM_ENV", "env_value"),
        ("FROM_FILE", "file_value"),
    ]
    for b in bound:
        assert PLACEHOLDER_RE.fullmatch(b.placeholder)
        assert b.placeholder.startswith(f"so-secret-{b.name}-")
        assert b.value not in repr(b)
    assert sandbox_env(bound) == {b.name: b.placeholder for b in bound}
    env_secret, file_secret = bound
    assert env_secret.bound_to("API.example.test.")
    assert not env_secret.bound_to("sub.api.example.test")
    assert file_secret.bound_to("example.org")
    assert file_secret.bound_to("a.b.example.org")
    assert file_secret.bound_to("10.1.2.3")
    assert not file_secret.bound_to("notexample.org")
    assert not file_secret.bound_to("11.1.2.3")


def test_placeholders_are_unique_per_session() -> None:
    first = resolve(SECRETS, HOST_ENV)
    second = resolve(SECRETS, HOST_ENV)
    placeholders = [b.placeholder for b in first + second]
    assert len(set(placeholders)) == len(placeholders)


def test_missing_env_var_is_a_one_line_error() -> None:
    with pytest.raises(SoError) as info:
        resolve([Secret("GH_TOKEN", "NOPE_VAR", None, (API,))], {})
    message = str(info.value)
    assert "\n" not in message
    assert "GH_TOKEN" in message
    assert "NOPE_VAR is not set" in message
    assert "[secrets.GH_TOKEN]" in message


def test_missing_or_empty_file_is_a_one_line_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(SoError, match=rf"secret TOKEN: file {missing} does not exist"):
        resolve([Secret("TOKEN", None, str(missing), (API,))], {})
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(SoError, match="is empty"):
        resolve([Secret("TOKEN", None, str(empty), (API,))], {})


def test_values_that_a_header_cannot_carry_are_refused() -> None:
    with pytest.raises(SoError, match="HTTP header cannot carry"):
        resolve([Secret("T", "V", None, (API,))], {"V": "two\nlines"})


# --- the CA ------------------------------------------------------------------------------


def test_trust_env_points_clients_at_the_bundle() -> None:
    env = trust_env()
    for var in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "GIT_SSL_CAINFO", "CURL_CA_BUNDLE"):
        assert env[var] == "/run/so/net/ca-bundle.pem"
    assert env["NODE_EXTRA_CA_CERTS"] == "/run/so/net/ca.pem"


def test_trust_files_append_the_ca_to_the_host_bundle(tmp_path: Path) -> None:
    roots = tmp_path / "roots.pem"
    roots.write_bytes(b"-----BEGIN CERTIFICATE-----\nhost roots\n-----END CERTIFICATE-----")
    ca = SessionCA()
    bundle = write_trust_files(tmp_path, ca, roots)
    assert bundle == tmp_path / BUNDLE_FILE
    assert bundle.read_bytes() == roots.read_bytes() + b"\n" + ca.cert_pem
    assert (tmp_path / CA_FILE).read_bytes() == ca.cert_pem
    assert stat.S_IMODE(bundle.stat().st_mode) == 0o644


def test_leaf_keys_load_without_memfd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr("os.memfd_create", raising=False)
    ca = SessionCA()
    context = ca.server_context(API)  # through the FIFO fallback
    assert context is ca.server_context(API)


def test_session_writes_the_ca_certificate_but_never_a_private_key() -> None:
    bound = resolve(SECRETS, HOST_ENV)
    with short_dir() as d:
        net_dir = d / "net"
        with NetSession(net_dir, POLICY, gateway_for({}).routes, bound) as session:
            assert session.secrets == tuple(bound)
            ca_pem = (net_dir / "sock" / CA_FILE).read_bytes()
            assert ca_pem.startswith(b"-----BEGIN CERTIFICATE-----")
            assert (net_dir / "sock" / BUNDLE_FILE).read_bytes().endswith(ca_pem)
            for path in net_dir.rglob("*"):
                if path.is_file():
                    data = path.read_bytes()
                    assert b"PRIVATE KEY" not in data, path
                    for b in bound:
                        assert b.value.encode() not in data, path


def test_session_for_gives_placeholders_and_trust_but_never_values(tmp_path: Path) -> None:
    host_env = {**HOST_ENV, "COPY_OF_GH": "ghp_real_value", "PATH": "/usr/bin"}
    policy = NetworkPolicy("allowlist", HOSTS)
    session, gatewayed = session_for(tmp_path / "net", policy, SECRETS, host_env)
    env = gatewayed.env
    assert PLACEHOLDER_RE.fullmatch(env["GH_TOKEN"])
    assert PLACEHOLDER_RE.fullmatch(env["OTHER_TOKEN"])
    assert {b.name: b.placeholder for b in session.secrets} == {
        "GH_TOKEN": env["GH_TOKEN"],
        "OTHER_TOKEN": env["OTHER_TOKEN"],
    }
    assert env["SSL_CERT_FILE"] == "/run/so/net/ca-bundle.pem"
    assert env["PATH"] == "/usr/bin"
    for leak in ("HOST_GH", "HOST_OTHER", "COPY_OF_GH"):
        assert leak not in env
    assert "real_value" not in repr(env)

    plain_session, plain = session_for(tmp_path / "net2", policy, (), host_env)
    assert plain_session.secrets == ()
    assert "SSL_CERT_FILE" not in plain.env
    assert "GH_TOKEN" not in plain.env


# --- interception, end to end ----------------------------------------------------------


def test_bound_placeholder_reaches_the_upstream_as_the_value_and_streams_back(
    setup: Setup,
) -> None:
    placeholder = setup.placeholder("GH_TOKEN")
    with HTTPSUpstream(setup.pki.server) as upstream, setup.proxy() as proxy:
        context = session_trust(proxy, setup.dir)
        context.set_alpn_protocols(["h2", "http/1.1"])
        conn = https(proxy, setup.sock, API, upstream.port, context)
        assert isinstance(conn.sock, ssl.SSLSocket)
        assert conn.sock.selected_alpn_protocol() == "http/1.1"
        conn.request(
            "GET",
            "/stream?page=1",
            headers={"Authorization": f"Bearer {placeholder}", "X-Api-Key": placeholder * 2},
        )
        response = conn.getresponse()
        assert response.status == 200
        first = response.read1()
        assert first == b"first\n"  # arrived while the upstream still holds the rest
        upstream.state.release.set()
        assert response.read() == b"second\n"
        raw_headers = str(response.headers)
        conn.close()
    (seen,) = upstream.seen
    assert seen.headers["authorization"] == "Bearer ghp_real_value"
    assert seen.headers["x-api-key"] == "ghp_real_value" * 2
    assert seen.path == "/stream?page=1"
    assert upstream.state.released == [True]  # not buffered: the client saw `first` first
    assert "ghp_real_value" not in raw_headers + first.decode()
    assert json_lines(setup.log) == []


def test_keep_alive_serves_several_requests_on_one_connection(setup: Setup) -> None:
    placeholder = setup.placeholder("GH_TOKEN")
    with HTTPSUpstream(setup.pki.server) as upstream, setup.proxy() as proxy:
        conn = https(proxy, setup.sock, API, upstream.port, session_trust(proxy, setup.dir))
        bodies = []
        for path in ("/one", "/two"):
            conn.request("GET", path, headers={"Authorization": f"token {placeholder}"})
            response = conn.getresponse()
            bodies.append(response.read())
        big = bytes(range(256)) * 4096  # 1 MiB, streamed through the TLS termination
        conn.request("POST", "/upload", body=big, headers={"X-Api-Key": placeholder})
        assert conn.getresponse().read() == b"upstream saw POST /upload\n" + big
        conn.close()
    assert bodies == [b"upstream saw GET /one\n", b"upstream saw GET /two\n"]
    assert [s.headers["authorization"] for s in upstream.seen[:2]] == ["token ghp_real_value"] * 2
    assert upstream.seen[2].headers["x-api-key"] == "ghp_real_value"
    assert upstream.connections == 1


def test_bodies_are_not_substituted(setup: Setup) -> None:
    placeholder = setup.placeholder("GH_TOKEN")
    body = f'{{"token": "{placeholder}"}}'.encode()
    with HTTPSUpstream(setup.pki.server) as upstream, setup.proxy() as proxy:
        conn = https(proxy, setup.sock, API, upstream.port, session_trust(proxy, setup.dir))
        conn.request("POST", "/fixed", body=body)
        conn.getresponse().read()
        conn.request("POST", "/chunked", body=iter([body[:10], body[10:]]))
        conn.getresponse().read()
        conn.close()
    assert [s.body for s in upstream.seen] == [body, body]


def test_a_placeholder_sent_to_another_host_is_refused_and_logged(setup: Setup) -> None:
    placeholder = setup.placeholder("GH_TOKEN")
    with HTTPSUpstream(setup.pki.server) as upstream, setup.proxy() as proxy:
        conn = https(proxy, setup.sock, OTHER, upstream.port, session_trust(proxy, setup.dir))
        conn.request("GET", "/steal", headers={"Authorization": f"Bearer {placeholder}"})
        response = conn.getresponse()
        assert response.status == 403
        assert b"secret GH_TOKEN is not bound to" in response.read()
        conn.close()
    assert upstream.connections == 0
    (denial,) = json_lines(setup.log)
    assert denial["host"] == OTHER
    assert denial["port"] == upstream.port
    assert denial["reason"] == f"secret GH_TOKEN is not bound to {OTHER}"


def test_a_host_without_secrets_stays_an_opaque_tunnel(setup: Setup) -> None:
    placeholder = setup.placeholder("GH_TOKEN")
    with HTTPSUpstream(setup.pki.server) as upstream, setup.proxy() as proxy:
        ca = proxy.proxy.ca
        assert ca is not None
        only_session_ca = ssl.create_default_context(cadata=ca.cert_pem.decode())
        with pytest.raises(ssl.SSLCertVerificationError):
            https(proxy, setup.sock, PLAIN, upstream.port, only_session_ca)
        # The upstream's own certificate comes through; nothing is substituted.
        conn = https(proxy, setup.sock, PLAIN, upstream.port, setup.pki.client)
        conn.request("GET", "/", headers={"Authorization": f"Bearer {placeholder}"})
        assert conn.getresponse().status == 200
        conn.close()
    (seen,) = upstream.seen
    assert seen.headers["authorization"] == f"Bearer {placeholder}"


def test_a_bound_host_the_policy_denies_is_refused_before_any_tls(setup: Setup) -> None:
    bound = resolve([Secret("T", "V", None, ("blocked.example.test",))], {"V": "value"})
    with ProxyThread(POLICY, setup.sock, setup.log, setup.resolver, secrets=bound):
        sock = unix_connect(setup.sock)
        sock.sendall(b"CONNECT blocked.example.test:443 HTTP/1.1\r\n\r\n")
        head, _ = read_until(sock, b"\r\n\r\n")
        sock.close()
    assert head.startswith(b"HTTP/1.1 403")
    assert json_lines(setup.log)[0]["host"] == "blocked.example.test"
    assert setup.resolver.calls == []


def test_a_placeholder_in_plain_http_is_refused(setup: Setup) -> None:
    placeholder = setup.placeholder("GH_TOKEN")
    with setup.proxy():
        sock = unix_connect(setup.sock)
        sock.sendall(
            f"GET http://{API}/ HTTP/1.1\r\nHost: {API}\r\nX-Key: {placeholder}\r\n\r\n".encode()
        )
        head, _ = read_until(sock, b"\r\n\r\n")
        sock.close()
    assert head.startswith(b"HTTP/1.1 403")
    assert json_lines(setup.log)[0]["reason"] == "secret GH_TOKEN is sent only over HTTPS"
    assert setup.resolver.calls == []


def test_stopping_with_an_open_intercepted_connection_is_quick_and_quiet(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    with HTTPSUpstream(setup.pki.server) as upstream:
        proxy = setup.proxy().start()
        conn = https(proxy, setup.sock, API, upstream.port, session_trust(proxy, setup.dir))
        conn.request("GET", "/held")
        assert conn.getresponse().read() == b"upstream saw GET /held\n"
        started = time.monotonic()
        proxy.stop()  # the client neither closes nor answers close_notify
        assert time.monotonic() - started < 2.0
        conn.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_placeholder_in_the_path_is_refused(setup: Setup) -> None:
    """Servers echo paths back (resource names, errors): secrets go in headers only."""
    placeholder = setup.placeholder("GH_TOKEN")
    with HTTPSUpstream(setup.pki.server) as upstream, setup.proxy() as proxy:
        conn = https(proxy, setup.sock, API, upstream.port, session_trust(proxy, setup.dir))
        conn.request("GET", f"/repos?name={placeholder}")
        assert conn.getresponse().status == 403
        conn.close()
    assert upstream.seen == []
    assert "may be sent in headers only" in json_lines(setup.log)[0]["reason"]


# --- where a value may go, and what comes back -----------------------------------------


def _bound(headers: tuple[str, ...] = DEFAULT_HEADERS) -> BoundSecret:
    return BoundSecret("GH_TOKEN", "ghp_real/value", "so-secret-GH_TOKEN-0", (API,), headers)


@pytest.mark.parametrize(
    "headers",
    [
        [("X-so-secret-GH_TOKEN-0", "1")],  # a header name
        [("Cookie", "t=so-secret-GH_TOKEN-0")],  # headers servers echo back
        [("Origin", "so-secret-GH_TOKEN-0")],
        [("X-Request-Id", "so-secret-GH_TOKEN-0")],
    ],
)
def test_a_placeholder_outside_its_bound_headers_is_refused(
    headers: list[tuple[str, str]],
) -> None:
    with pytest.raises(Unbound):
        substitute_headers(headers, [_bound()], API)


def test_placeholders_become_values_in_the_bound_headers_only() -> None:
    headers = [("Authorization", "Bearer so-secret-GH_TOKEN-0"), ("Accept", "*/*")]
    assert substitute_headers(headers, [_bound()], API)[0] == (
        "Authorization",
        "Bearer ghp_real/value",
    )
    custom = _bound(("private-token",))
    assert substitute_headers([("Private-Token", custom.placeholder)], [custom], API) == [
        ("Private-Token", "ghp_real/value")
    ]
    with pytest.raises(Unbound):
        substitute_headers(headers, [custom], API)  # Authorization is not its header
    with pytest.raises(Unbound):
        substitute_headers(headers, [_bound()], OTHER)


def test_secret_headers_are_configurable(tmp_path: Path) -> None:
    config = tmp_path / ".config" / "so" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(
        '[secrets.T]\nenv = "V"\nhosts = ["gitlab.example"]\nheaders = ["Private-Token"]\n'
    )
    cfg = load_config(
        project=None, env={"XDG_CONFIG_HOME": str(tmp_path / ".config")}, home=tmp_path, flags={}
    )
    (secret,) = cfg.secrets
    assert secret.headers == ("private-token",)
    (bound,) = resolve(cfg.secrets, {"V": "x"})
    assert bound.headers == ("private-token",)


def test_the_scrubber_masks_values_split_across_pieces_and_keeps_lengths() -> None:
    value = "ghp_real/value"
    stream = f'{{"a": "{value}", "j": "ghp_real\\/value", "u": "ghp_real%2Fvalue"}} tail'.encode()
    for size in (1, 2, 5, 1000):
        scrubber = Scrubber([_bound()])
        pieces = [stream[i : i + size] for i in range(0, len(stream), size)]
        out = b"".join(scrubber.feed(p) for p in pieces) + scrubber.flush()
        assert len(out) == len(stream)
        assert b"ghp_real" not in out, size
        assert out.endswith(b" tail")
    scrubber = Scrubber([_bound()])
    assert scrubber.feed(b"first\n") == b"first\n"  # nothing held back that cannot match
