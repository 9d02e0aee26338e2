"""Where things are inside every sandbox, whatever the backend: the network's bound
directory and sockets, the forwarder, its ports, the session CA, the proxy variables;
and how so names a project's sandboxes and volumes on the host.

Stdlib only, and importing nothing of so's: the backends and :mod:`sono.net.session`
both read these names here, so a backend never loads the network stack to learn a path.
"""

from __future__ import annotations

import re
from pathlib import Path

PROXY_PORT = 3128  # the egress proxy on the sandbox's loopback
GATEWAY_PORT = 3129  # the model gateway on the sandbox's loopback
INSIDE_DIR = "/run/so/net"  # where the host's sock/ dir is bound, read-only
FORWARDER_INSIDE = "/run/so/forward.py"
SOCKETS = "p"  # the sockets' own directory (private, 0700), under the bound one; short: sun_path
PROXY_SOCK = "proxy.sock"
GATEWAY_SOCK = "gateway.sock"
CA_INSIDE = f"{INSIDE_DIR}/ca.pem"  # the session CA's certificate, when there are secrets
SANDBOX_ID_VAR = "SO_SANDBOX_ID"  # every process inside knows its sandbox's id


def slug(name: str) -> str:
    """A project's name as it starts its sandboxes' and volumes' ids on the host."""
    text = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return (text or "project")[:24].rstrip("-")


def forwarder_path() -> Path:
    """The forwarder script on the host (:mod:`sono.net.forward`), bound at
    :data:`FORWARDER_INSIDE`."""
    return Path(__file__).parent / "net" / "forward.py"


def socket_path(bound_dir: Path, name: str) -> Path:
    """Where socket ``name`` is on the host, ``bound_dir`` being the one bound inside."""
    return bound_dir / SOCKETS / name


def forwarder_argv(python: str = "python3", *, euid: int | None = None) -> list[str]:
    """The forwarder's command line inside; ``euid``: started as root, it connects as
    that uid (the sockets' owner)."""
    inside = f"{INSIDE_DIR}/{SOCKETS}/"
    return [
        python,
        "-S",  # no site, no environment, no user dir: start-up time, and no
        "-E",  # PYTHON* variables of the agent's choosing
        "-s",
        FORWARDER_INSIDE,
        *(("--euid", str(euid)) if euid is not None else ()),
        "--ignore-stdin",
        f"127.0.0.1:{PROXY_PORT}={inside}{PROXY_SOCK}",
        f"127.0.0.1:{GATEWAY_PORT}={inside}{GATEWAY_SOCK}",
    ]


def proxy_env() -> dict[str, str]:
    """Every HTTP client inside sends all but loopback through the proxy."""
    url = f"http://127.0.0.1:{PROXY_PORT}"
    loopback = "localhost,127.0.0.1,::1"
    return {
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "NO_PROXY": loopback,
        "no_proxy": loopback,
    }
