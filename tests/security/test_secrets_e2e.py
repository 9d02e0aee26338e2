"""`[secrets.*]` end to end: the real `so` CLI, the `custom` harness agent
(tests/security/secrets_agent.py) inside bwrap and Docker, the proxy on the host, and an
HTTPS upstream the host trusts through a test CA given to `so` as ``SSL_CERT_FILE``.

The upstream is lenient on purpose (bare LF line ends, chunk extensions, pipelining: what
a request-smuggling attack needs) and echoes every header it gets, in its response
headers and in a chunked body cut into 3-byte chunks. It must see the real value only in
the bound header; the agent must never see it (env, files, echoes); each attack fails
while its control succeeds."""

from __future__ import annotations

import ast
import datetime
import secrets
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hostile import HostileUser

pytestmark = pytest.mark.integration

AGENT = (Path(__file__).parent / "secrets_agent.py").read_text()


def _pki(tmp: Path) -> tuple[Path, ssl.SSLContext]:
    """A test CA (its certificate written to a file) and a server context for localhost."""
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "so e2e test CA")])
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
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
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_file = tmp / "test-ca.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pem = tmp / "upstream.pem"
    pem.write_bytes(
        leaf.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pem)
    pem.unlink()
    return ca_file, context


@dataclass
class Seen:
    line: str
    headers: list[tuple[str, str]]


@dataclass
class Lenient:
    """A deliberately lenient HTTP/1.1 server (lines end at LF, chunk extensions
    ignored, keep-alive and pipelining served) that echoes what it gets."""

    tls: ssl.SSLContext | None
    seen: list[Seen] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(32)
        self.port = int(self.sock.getsockname()[1])
        self.lock = threading.Lock()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def _conn(self, conn: socket.socket) -> None:
        try:
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            conn.settimeout(30)
            f = conn.makefile("rb")
            while self._request(f, conn):
                pass
        except (OSError, ValueError):
            pass
        finally:
            conn.close()

    def _request(self, f: object, conn: socket.socket) -> bool:
        readline = f.readline  # type: ignore[attr-defined]
        line = readline()
        if not line:
            return False
        headers = []
        while (h := readline()).strip():
            k, _, v = h.decode("latin-1").partition(":")
            headers.append((k.strip(), v.strip()))
        with self.lock:
            self.seen.append(Seen(line.decode("latin-1").strip(), headers))
        lower = {k.lower(): v for k, v in headers}
        if lower.get("transfer-encoding", "").lower() == "chunked":
            while size := int(readline().split(b";")[0].strip() or b"0", 16):
                f.read(size)  # type: ignore[attr-defined]
                readline()
            while readline().strip():
                pass
        elif lower.get("content-length"):
            f.read(int(lower["content-length"]))  # type: ignore[attr-defined]
        echo = "".join(f"{k}: {v}\n" for k, v in headers).encode("latin-1")
        chunks = b"".join(
            b"%x\r\n%s\r\n" % (len(echo[i : i + 3]), echo[i : i + 3])
            for i in range(0, len(echo), 3)
        )
        echoed = "; ".join(v for _, v in headers)
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
            + f"X-Echo: {echoed}\r\nX-Echo-Auth: {lower.get('authorization', '')}\r\n\r\n".encode(
                "latin-1"
            )
            + chunks
            + b"0\r\n\r\n"
        )
        return "close" not in lower.get("connection", "").lower()

    def lines(self) -> list[str]:
        with self.lock:
            return [s.line for s in self.seen]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def upstreams(tmp_path: Path) -> Iterator[tuple[Path, Lenient, Lenient]]:
    ca_file, context = _pki(tmp_path)
    https, plain = Lenient(context), Lenient(None)
    for server in (https, plain):
        threading.Thread(target=server.serve, daemon=True).start()
    yield ca_file, https, plain
    https.close()
    plain.close()


def _configure(user: HostileUser, value: str) -> None:
    config = user.home / ".config" / "so" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        '[network]\nmode = "allowlist"\n'
        'allow = ["localhost", "127.0.0.1/32", "::1/128"]\n\n'
        '[secrets.API_TOKEN]\nenv = "SO_E2E_TOKEN"\nhosts = ["localhost"]\n'
    )
    user.env["SO_E2E_TOKEN"] = value


def _results(text: str) -> dict[str, object]:
    for line in text.splitlines():
        if line.startswith("RESULT "):
            return dict(ast.literal_eval(line[len("RESULT ") :]))
    raise AssertionError(f"the agent printed no RESULT line:\n{text[-3000:]}")


def _status(outcome: object) -> object:
    return outcome["status"] if isinstance(outcome, dict) else outcome


def test_secret_reaches_only_its_header_and_never_the_agent(
    tmp_path: Path, backend: str, upstreams: tuple[Path, Lenient, Lenient]
) -> None:
    ca_file, https, plain = upstreams
    value = f"real-e2e-{secrets.token_hex(12)}"
    user = HostileUser.make(tmp_path, {"agent.py": AGENT})
    _configure(user, value)
    user.env["SSL_CERT_FILE"] = str(ca_file)  # the host trusts the upstream the usual way
    script = f"python3 /workspace/agent.py {https.port} {plain.port}\n"
    result = user.attack(script, backend=backend)
    everything = result.everything()
    got = _results(everything)

    # The placeholder and the CA trust reached the custom agent.
    assert str(got["token"]).startswith("so-secret-API_TOKEN-"), got["token"]
    assert got["ssl_cert_file"] == "/run/so/net/ca-bundle.pem"
    # Controls: the bound headers carry the value; a well-framed chunked body and the
    # request after it pass; the right SNI works; the first plain request is served.
    for control in ("control", "control_api_key", "chunked_control", "sni_control"):
        assert _status(got[control]) == 200, (control, got[control])
    assert _status(got["pipelined"]) == 200
    # Attacks: refused.
    for attack in ("header_name", "echo_Cookie", "echo_Origin", "echo_X-Request-Id", "path"):
        assert _status(got[attack]) == 403, (attack, got[attack])
    assert _status(got["host_fronting"]) == 400, got["host_fronting"]
    assert got["sni_fronting"] in ("tls-refused", "closed"), got["sni_fronting"]
    for attack in ("chunk_ext", "bare_lf_trailer", "chunk_ext_plain"):
        assert _status(got[attack]) != 200, (attack, got[attack])

    # The upstream got the value in the bound headers only, and never a smuggled request.
    lines = https.lines()
    assert "GET /after HTTP/1.1" in lines  # the control's pipelined request, checked
    assert not [line for line in lines + plain.lines() if "smuggled" in line or "pipe" in line]
    assert "GET /first HTTP/1.1" in plain.lines()
    carried = {k.lower() for s in https.seen for k, v in s.headers if value in v}
    assert carried == {"authorization", "x-api-key"}, carried
    assert not [s for s in https.seen for k, _ in s.headers if value in k]
    # The agent saw the echoes (masked), never the value: not in its output, its files,
    # the records so keeps, or anything so printed.
    echoed = got["control"]
    assert isinstance(echoed, dict)
    assert "X-Echo-Auth: Bearer " + "*" * len(value) in str(echoed["text"])
    assert value not in everything
    assert not user.leaks(everything)
