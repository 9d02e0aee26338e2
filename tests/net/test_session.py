"""The per-sandbox network session: what the agent is told, and the servers it reaches."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import pytest

from sono.layout import (
    GATEWAY_SOCK,
    INSIDE_DIR,
    PROXY_SOCK,
    SOCKETS,
    forwarder_argv,
    proxy_env,
)
from sono.net.policy import NetworkPolicy
from sono.net.session import NetSession, gateway_for
from sono.net.upstream import PLACEHOLDER


def test_keys_become_placeholders_and_base_urls_point_at_the_gateway() -> None:
    host = {
        "ANTHROPIC_API_KEY": "sk-ant-real",
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9/",
        "OPENAI_API_KEY": "sk-openai-real",
        "PATH": "/usr/bin",
    }
    gw = gateway_for(host)
    assert gw.env["ANTHROPIC_API_KEY"] == PLACEHOLDER
    assert gw.env["OPENAI_API_KEY"] == PLACEHOLDER
    assert gw.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:3129/anthropic"
    assert gw.env["OPENAI_BASE_URL"] == "http://127.0.0.1:3129/openai"
    assert gw.env["PATH"] == "/usr/bin"
    assert "sk-ant-real" not in json.dumps(gw.env)
    assert gw.endpoints == {
        "anthropic": "http://127.0.0.1:3129/anthropic",
        "openai": "http://127.0.0.1:3129/openai",
    }
    routes = {r.prefix: r for r in gw.routes}
    assert routes["/anthropic"].upstream == "http://127.0.0.1:9/"
    assert routes["/anthropic"].auth == "x-api-key"
    assert routes["/anthropic"].key == "sk-ant-real"
    assert routes["/openai"].upstream == "https://api.openai.com/v1"
    assert routes["/openai"].auth == "bearer"
    assert "sk-ant-real" not in repr(gw.routes)


def test_a_host_without_keys_sends_no_credential_upstream() -> None:
    # The sandbox holds placeholders only: there is nothing of its own to pass through.
    gw = gateway_for({"ANTHROPIC_AUTH_TOKEN": ""})
    routes = {r.prefix: r for r in gw.routes}
    assert routes["/anthropic"].auth == "none"
    assert "ANTHROPIC_API_KEY" not in gw.env


def test_every_credential_is_replaced_in_the_env_the_sandbox_may_see() -> None:
    host = {
        "ANTHROPIC_API_KEY": "sk-ant-real-key-1",
        "GROQ_API_KEY": "gsk-real-2",
        "MY_SERVICE_TOKEN_SECRET": "s3cr3t-value",
        "ANTHROPIC_OAUTH_TOKEN": "sk-ant-oat01-real",
        "GITHUB_TOKEN": "ghp_real_value",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "32000",
        "ANTHROPIC_CUSTOM_HEADERS": "X-Key: sk-ant-real-key-1",
        "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer otel-real-123",
        "MY_LLM_KEY": "llm-real-key-9",
        "AZURE_OPENAI_KEY": "azure-real-key-7",
        "CLAUDE_CODE_CLIENT_KEY_PASSPHRASE": "mtls-real-pass",
        "DATABASE_URL": "postgres://app:db-real-pass@db:5432/app",
        "EMPTY_API_KEY": "",
        "HOME": "/home/u",
    }
    gw = gateway_for(host)
    assert gw.env["ANTHROPIC_API_KEY"] == gw.env["GROQ_API_KEY"] == PLACEHOLDER
    assert gw.env["MY_SERVICE_TOKEN_SECRET"] == PLACEHOLDER
    assert gw.env["ANTHROPIC_OAUTH_TOKEN"] == gw.env["GITHUB_TOKEN"] == PLACEHOLDER
    assert gw.env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "32000"
    # header-only variables are dropped (a placeholder would not parse as headers)
    assert "ANTHROPIC_CUSTOM_HEADERS" not in gw.env
    assert "OTEL_EXPORTER_OTLP_HEADERS" not in gw.env
    assert gw.env["MY_LLM_KEY"] == gw.env["AZURE_OPENAI_KEY"] == PLACEHOLDER
    assert gw.env["CLAUDE_CODE_CLIENT_KEY_PASSPHRASE"] == PLACEHOLDER
    assert gw.env["DATABASE_URL"] == f"postgres://app:{PLACEHOLDER}@db:5432/app"
    assert gw.env["EMPTY_API_KEY"] == "" and gw.env["HOME"] == "/home/u"
    secrets = [v for k, v in host.items() if len(v) > 8 and k != "CLAUDE_CODE_MAX_OUTPUT_TOKENS"]
    assert not any(v in text for v in secrets for text in gw.env.values())


def test_auth_token_is_sent_as_bearer() -> None:
    gw = gateway_for({"ANTHROPIC_AUTH_TOKEN": "tok"})
    route = next(r for r in gw.routes if r.prefix == "/anthropic")
    assert (route.auth, route.key) == ("bearer", "tok")
    assert gw.env["ANTHROPIC_AUTH_TOKEN"] == PLACEHOLDER


def test_proxy_env_sends_everything_but_loopback_through_the_proxy() -> None:
    env = proxy_env()
    assert env["HTTPS_PROXY"] == env["http_proxy"] == "http://127.0.0.1:3128"
    assert "127.0.0.1" in env["NO_PROXY"].split(",")


def _connects(path: Path) -> bool:
    """Connect by a short relative path (the real one may be too long for AF_UNIX)."""
    cwd = Path.cwd()
    os.chdir(path.parent)
    try:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(path.name)
            except OSError:
                return False
        return True
    finally:
        os.chdir(cwd)


def test_session_serves_both_sockets_and_reports_per_iteration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    # A long directory name: socket paths beyond ~107 bytes need the short-link detour.
    net_dir = tmp_path / ("x" * 60) / "net"
    session = NetSession(net_dir, NetworkPolicy(mode="allowlist"), gateway_for({}).routes)
    with session:
        assert _connects(net_dir / "sock" / SOCKETS / PROXY_SOCK)
        assert _connects(net_dir / "sock" / SOCKETS / GATEWAY_SOCK)
        start = session.offsets()
        os.chdir(net_dir / "sock" / SOCKETS)
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(PROXY_SOCK)
            s.sendall(b"CONNECT denied.example:443 HTTP/1.1\r\nHost: denied.example:443\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 403")
        log = session.since(start)
        assert [(d["host"], d["port"]) for d in log.denied] == [("denied.example", 443)]
        assert session.since(session.offsets()).denied == []
    assert not _connects(net_dir / "sock" / SOCKETS / PROXY_SOCK)
    assert (net_dir / "denied.jsonl").is_file()
    assert not (net_dir / "sock" / "denied.jsonl").exists()  # logs stay out of the sandbox


def test_mode_none_serves_only_the_gateway(tmp_path: Path) -> None:
    with NetSession(tmp_path / "net", NetworkPolicy(mode="none"), gateway_for({}).routes):
        assert _connects(tmp_path / "net" / "sock" / SOCKETS / GATEWAY_SOCK)
        assert not (tmp_path / "net" / "sock" / SOCKETS / PROXY_SOCK).exists()


def test_since_keeps_distinct_denials_with_counts_in_bounded_memory(tmp_path: Path) -> None:
    """Whatever the logs hold, an iteration's network record stays small."""
    from sono.net.session import MAX_LOG_LINE, MAX_RECORD_DENIALS

    session = NetSession(tmp_path / "net", NetworkPolicy(mode="allowlist"), ())
    session.dir.mkdir(parents=True)
    start = session.offsets()
    with session.denied_log.open("w") as fh:
        for i in range(200):
            line = {"time": "t", "host": f"h{i % 100}.test", "port": 443, "reason": "r"}
            fh.write(json.dumps({**line, "count": 2}) + "\n")
        fh.write('{"host": "' + "x" * (MAX_LOG_LINE * 3) + '"}\n')  # skipped, not parsed
        fh.write("not json\n")
    with session.usage_log.open("w") as fh:
        for _ in range(1000):
            fh.write(json.dumps({"input_tokens": 3, "output_tokens": 2}) + "\n")
    log = session.since(start)
    assert len(log.denied) == MAX_RECORD_DENIALS + 1
    assert log.denied[0] == {"time": "t", "host": "h0.test", "port": 443, "reason": "r", "count": 4}
    assert log.denied[-1]["host"] == "*"
    assert sum(d["count"] for d in log.denied) == 400
    assert (log.requests, log.tokens_in, log.tokens_out) == (1000, 3000, 2000)
    assert len(json.dumps(log.denied)) < 20_000


def test_sockets_are_the_users_alone(tmp_path: Path) -> None:
    """0600 sockets in a 0700 dir of the user's; the bound dir keeps only CA files."""
    net_dir = tmp_path / "net"
    (net_dir / "sock").mkdir(parents=True)
    (net_dir / "sock").chmod(0o711)  # as sandboxes made before kept it
    with NetSession(net_dir, NetworkPolicy(mode="allowlist"), gateway_for({}).routes):
        private = net_dir / "sock" / SOCKETS
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
        assert private.stat().st_uid == os.getuid()
        for name in (PROXY_SOCK, GATEWAY_SOCK):
            mode = (private / name).stat().st_mode
            assert stat.S_ISSOCK(mode)
            assert stat.S_IMODE(mode) == 0o600
        assert stat.S_IMODE((net_dir / "sock").stat().st_mode) == 0o755
        assert sorted(p.name for p in (net_dir / "sock").iterdir()) == [SOCKETS]


def test_forwarder_argv_connects_through_the_private_dir() -> None:
    argv = forwarder_argv(euid=1234)
    assert argv[argv.index("--euid") + 1] == "1234"
    assert f"{INSIDE_DIR}/{SOCKETS}/{PROXY_SOCK}" in argv[-2]
    assert "--euid" not in forwarder_argv()


def test_a_usage_log_longer_than_so_reads_is_marked_incomplete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading stops at MAX_LOG_READ bytes; what was left unread makes the measurement a
    floor, and the log says so (the loop then cannot hold a budget)."""
    from sono.net import session as s

    net = NetSession(tmp_path / "net", NetworkPolicy(mode="none"), ())
    net.dir.mkdir()
    line = '{"route": "/anthropic", "status": 404, "refused": "no route"}\n'
    net.usage_log.write_text(line * 10)
    monkeypatch.setattr(s, "MAX_LOG_READ", len(line) * 10)
    assert not net.since(s.Offsets(0, 0)).incomplete  # all of it read
    net.usage_log.write_text(line * 11)
    log = net.since(s.Offsets(0, 0))
    assert log.incomplete and log.requests == 10


def test_a_token_in_an_upstream_header_is_scrubbed_without_its_scheme() -> None:
    from sono.net.upstream import Credential, Upstream

    up = Upstream(
        "anthropic",
        "anthropic",
        "https://api.anthropic.com",
        "built-in default",
        Credential("API key", "env ANTHROPIC_API_KEY", "x-api-key", "sk-ant-key-1"),
        (("Authorization", "Bearer tok-real-123456"),),
    )
    gw = gateway_for({"MY_VAR": "prefix tok-real-123456", "OTHER": "sk-ant-key-1"}, [up])
    assert gw.env["MY_VAR"] == f"prefix {PLACEHOLDER}" and gw.env["OTHER"] == PLACEHOLDER
