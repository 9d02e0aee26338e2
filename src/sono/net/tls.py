"""The per-session certificate authority behind secret substitution.

For a host that a secret is bound to (:mod:`sono.net.secrets`), the egress proxy ends the
sandbox's TLS itself, so it can put the real value where the placeholder was. It shows the
client a leaf certificate for that host signed by a :class:`SessionCA`: an EC P-256 CA
made in memory when the network session starts, valid for :data:`CA_VALIDITY`, whose
private key never leaves this process (it is never written anywhere). Leaf keys do not
touch the disk either: OpenSSL loads them from an anonymous memory file
(``memfd_create``), or from a FIFO where that does not exist.

The sandbox trusts the CA through :func:`write_trust_files` (``ca.pem``, the CA alone, and
``ca-bundle.pem``, the host's CA bundle followed by the CA, both public) and the
variables of :func:`trust_env`. Clients that carry their own trust store and ignore those
variables cannot reach hosts with bound secrets (their handshake with the proxy fails);
every other host is an opaque tunnel and sees the sandbox's own TLS.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from sono.layout import CA_INSIDE

CA_VALIDITY = datetime.timedelta(days=30)
CLOCK_SKEW = datetime.timedelta(hours=1)  # certificates start this long before "now"
CA_FILE = "ca.pem"
BUNDLE_FILE = "ca-bundle.pem"
HOST_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Alpine, Arch
    "/etc/pki/tls/certs/ca-bundle.crt",  # Fedora, RHEL
    "/etc/ssl/ca-bundle.pem",  # openSUSE
    "/etc/ssl/cert.pem",  # macOS, BSDs
)
# Where the variables of :func:`trust_env` point: the bundle, except Node's, which adds
# its file to Node's built-in roots (so the CA alone is enough there).
BUNDLE_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO")
EXTRA_CA_VARS = ("NODE_EXTRA_CA_CERTS",)


class SessionCA:
    """A CA for one network session; :meth:`server_context` gives the TLS server context
    the proxy presents for a host (one leaf per host, made on first use and kept)."""

    def __init__(self, *, validity: datetime.timedelta = CA_VALIDITY) -> None:
        now = datetime.datetime.now(datetime.UTC)
        self.not_before = now - CLOCK_SKEW
        self.not_after = now + validity
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "so"),
                x509.NameAttribute(NameOID.COMMON_NAME, f"so session CA {now:%Y-%m-%d %H:%M:%S}Z"),
            ]
        )
        public = self._key.public_key()
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(self.not_before)
            .not_valid_after(self.not_after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.cert_pem = self.certificate.public_bytes(serialization.Encoding.PEM)
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SessionCA(not_after={self.not_after.isoformat(timespec='seconds')})"

    def leaf(self, host: str) -> x509.Certificate:
        """A server certificate for ``host`` (a normalised name or an IP literal)."""
        try:
            alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            alt = x509.DNSName(host)
        public = self._leaf_key.public_key()
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(self.certificate.subject)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(self.not_before)
            .not_valid_after(self.not_after)
            .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )

    def server_context(self, host: str) -> ssl.SSLContext:
        """TLS 1.2+, ALPN ``http/1.1`` only, presenting :meth:`leaf` for ``host``."""
        with self._lock:
            context = self._contexts.get(host)
            if context is None:
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                context.minimum_version = ssl.TLSVersion.TLSv1_2
                context.set_alpn_protocols(["http/1.1"])
                cert = self.leaf(host).public_bytes(serialization.Encoding.PEM)
                key = self._leaf_key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
                load_chain(context, cert, key)
                self._contexts[host] = context
            return context


def load_chain(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """``context.load_cert_chain`` from memory: OpenSSL only reads files, so the PEM goes
    to an anonymous memory file, or (without ``memfd_create``) the key through a FIFO
    that is read once and holds nothing afterwards. Never a file on disk."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None:
        fd = memfd_create("so-leaf", getattr(os, "MFD_CLOEXEC", 0))
        try:
            _write_all(fd, cert_pem + key_pem)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="so-tls-") as tmp:
        cert_path = Path(tmp) / "leaf.pem"
        cert_path.write_bytes(cert_pem)  # public
        key_path = Path(tmp) / "key.fifo"
        os.mkfifo(key_path, 0o600)

        def feed() -> None:
            with key_path.open("wb") as fifo:  # blocks until OpenSSL (or finally) opens it
                fifo.write(key_pem)

        writer = threading.Thread(target=feed, name="so-tls-key", daemon=True)
        writer.start()
        try:
            context.load_cert_chain(str(cert_path), str(key_path))
        finally:
            # Unblock the writer if OpenSSL never opened the FIFO, then drain it.
            fd = os.open(key_path, os.O_RDONLY | os.O_NONBLOCK)
            writer.join(5.0)
            os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def host_bundle(env: Mapping[str, str] | None = None) -> Path | None:
    """The host's CA bundle: ``SSL_CERT_FILE`` when set, else OpenSSL's default file, else
    the first of :data:`HOST_BUNDLES` that exists; ``None`` when there is none."""
    environ = os.environ if env is None else env
    candidates = [environ.get("SSL_CERT_FILE") or "", ssl.get_default_verify_paths().cafile or ""]
    for candidate in (*candidates, *HOST_BUNDLES):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def write_trust_files(directory: Path, ca: SessionCA, bundle: Path | None = None) -> Path:
    """``ca.pem`` and ``ca-bundle.pem`` (``bundle`` or :func:`host_bundle`, then the CA)
    in ``directory``, world-readable, each replaced atomically; returns the bundle."""
    source = bundle if bundle is not None else host_bundle()
    roots = source.read_bytes() if source is not None else b""
    if roots and not roots.endswith(b"\n"):
        roots += b"\n"
    _replace(directory / CA_FILE, ca.cert_pem)
    _replace(directory / BUNDLE_FILE, roots + ca.cert_pem)
    return directory / BUNDLE_FILE


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o644)
    tmp.replace(path)


def trust_env(ca_path_inside: str = CA_INSIDE) -> dict[str, str]:
    """The variables that make the sandbox's usual clients (OpenSSL and Python, requests,
    curl, git, Node) trust the session CA; the bundle sits next to ``ca_path_inside``."""
    bundle = str(PurePosixPath(ca_path_inside).with_name(BUNDLE_FILE))
    env = dict.fromkeys(BUNDLE_VARS, bundle)
    env.update(dict.fromkeys(EXTRA_CA_VARS, ca_path_inside))
    return env
