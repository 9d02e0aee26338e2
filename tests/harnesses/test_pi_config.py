"""pi's own configuration read on the host (access) and its sandbox copy (provision), for
every shape pi 1.6.0 documents: models.json providers (literal, ``$ENV`` and ``!command``
keys, headers, authHeader), auth.json API keys and OAuth logins, the providers' env keys,
settings.json's default provider, PI_CODING_AGENT_DIR, and the project's own ``.pi``."""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from sono.harnesses.base import AgentOptions
from sono.harnesses.pi import ROUTES_PATH, PiHarness
from sono.harnesses.pi_config import (
    FAR_EXPIRY_MS,
    KeyCommand,
    PiLogin,
    codex_account,
    interpolate,
    route_name,
)
from sono.net.oauth import FileToken, Refresher, Tokens
from sono.net.upstream import PLACEHOLDER, CredentialError, Upstream

SECRET = "sk-real-secret-0123456789"


def agent_files(home: Path, **files: Any) -> Path:
    agent = home / ".pi" / "agent"
    agent.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (agent / f"{name}.json").write_text(json.dumps(data))
    return agent


def access(home: Path, env: dict[str, str] | None = None) -> dict[str, Upstream]:
    result = PiHarness().access(env or {}, home)
    assert result.refusal is None, result.refusal
    return {u.name: u for u in result.upstreams}


@pytest.fixture(autouse=True)
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """access() reads the project's .pi from the working directory, as pi does."""
    repo = tmp_path / "repo"
    repo.mkdir()
    monkeypatch.chdir(repo)
    return repo


def jwt(claims: dict[str, Any]) -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'RS256'})}.{part(claims)}.sig"


# --- models.json ----------------------------------------------------------------------


def test_a_custom_anthropic_provider_with_a_literal_key(tmp_path: Path) -> None:
    models = {
        "providers": {
            "my-proxy": {
                "baseUrl": "http://127.0.0.1:4000",
                "api": "anthropic-messages",
                "apiKey": SECRET,
                "headers": {"x-team": "$TEAM_ID"},
                "models": [{"id": "claude-x"}],
            }
        }
    }
    agent_files(tmp_path, models=models)
    up = access(tmp_path, {"TEAM_ID": "team-42"})["my-proxy"]
    assert (up.api, up.base_url) == ("anthropic", "http://127.0.0.1:4000")
    assert up.source == "~/.pi/agent/models.json [providers.my-proxy]"
    cred = up.credential
    assert (cred.kind, cred.header, cred.current()) == ("API key", "x-api-key", SECRET)
    assert cred.source == "~/.pi/agent/models.json [providers.my-proxy].apiKey"
    assert up.headers == (("x-team", "team-42"),)


@pytest.mark.parametrize("api", ["openai-completions", "openai-responses"])
def test_an_openai_compatible_provider_takes_its_key_from_an_env_variable(
    tmp_path: Path, api: str
) -> None:
    models = {
        "providers": {
            "ollama": {
                "baseUrl": "http://localhost:11434/v1",
                "api": api,
                "apiKey": "${OLLAMA_KEY}",
                "models": [{"id": "qwen"}],
            }
        }
    }
    agent_files(tmp_path, models=models)
    up = access(tmp_path, {"OLLAMA_KEY": SECRET})["ollama"]
    assert (up.api, up.base_url) == ("openai", "http://localhost:11434/v1")
    assert (up.credential.header, up.credential.current()) == ("bearer", SECRET)
    named = "~/.pi/agent/models.json [providers.ollama].apiKey"
    assert up.credential.source == f"env OLLAMA_KEY (named in {named})"
    # The variable unset: pi has no key for it, and neither has the gateway.
    assert access(tmp_path)["ollama"].credential.kind == "none"


def test_the_api_and_base_url_may_be_given_per_model(tmp_path: Path) -> None:
    models = {
        "providers": {
            "vllm": {"models": [{"id": "m", "api": "openai-completions", "baseUrl": "http://v/v1"}]}
        }
    }
    agent_files(tmp_path, models=models)
    up = access(tmp_path)["vllm"]
    assert (up.api, up.base_url, up.credential.kind) == ("openai", "http://v/v1", "none")


def test_auth_header_sends_an_anthropic_key_as_a_bearer_token(tmp_path: Path) -> None:
    gw = {
        "baseUrl": "https://gw",
        "api": "anthropic-messages",
        "apiKey": SECRET,
        "authHeader": True,
    }
    models = {"providers": {"gw": gw}}
    agent_files(tmp_path, models=models)
    assert access(tmp_path)["gw"].credential.header == "bearer"


def test_a_key_command_from_the_users_models_json_runs_on_the_host_when_needed(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "ran"
    models = {
        "providers": {
            "corp": {
                "baseUrl": "https://llm.corp/v1",
                "api": "openai-completions",
                "apiKey": f"!touch {marker} && echo {SECRET}",
            }
        }
    }
    agent_files(tmp_path, models=models)
    cred = access(tmp_path)["corp"].credential
    assert cred.kind == "key command" and not marker.exists()  # not at access time
    assert cred.current() == SECRET and marker.exists()
    assert cred.secrets == ()  # nothing static to scrub: the value lives in the gateway


def test_a_failing_key_command_is_one_line_naming_where_it_is_configured() -> None:
    with pytest.raises(CredentialError, match=r"^models.json \[x\]: the key command exited 3"):
        KeyCommand("exit 3", "models.json [x]").token()


def test_interpolation_is_pis() -> None:
    env = {"A": "1", "B": "2"}
    assert interpolate("k-$A-${B}", env) == "k-1-2"
    assert interpolate("$$A $!x", env) == "$A !x"
    assert interpolate("$MISSING", env) is None
    assert interpolate("plain", env) == "plain"


def test_a_non_routable_provider_is_skipped(tmp_path: Path) -> None:
    models = {"providers": {"g": {"baseUrl": "https://g", "api": "google-generative-ai"}}}
    agent_files(tmp_path, models=models)
    assert "g" not in access(tmp_path)


def test_route_names() -> None:
    assert route_name("anthropic") == "anthropic"
    assert route_name("My.Proxy") == "pi-my-proxy"
    # pi posts to <base>/codex/responses unless the base ends in /codex.
    assert route_name("openai-codex") == "codex"
    assert route_name("codex") == "pi-codex"  # a custom provider of that name


# --- auth.json and the environment ----------------------------------------------------


def test_a_stored_key_wins_over_models_json_and_the_env(tmp_path: Path) -> None:
    agent_files(
        tmp_path,
        models={"providers": {"anthropic": {"baseUrl": "http://local:1", "apiKey": "models"}}},
        auth={"anthropic": {"type": "api_key", "key": "$MY_KEY", "env": {"MY_KEY": SECRET}}},
    )
    up = access(tmp_path, {"ANTHROPIC_API_KEY": "from-env"})["anthropic"]
    assert up.base_url == "http://local:1"
    assert up.credential.current() == SECRET
    assert up.credential.source == "~/.pi/agent/auth.json [anthropic].env.MY_KEY"


def test_builtin_providers_take_keys_from_the_env_in_pis_order(tmp_path: Path) -> None:
    ups = access(tmp_path, {"ANTHROPIC_API_KEY": "a", "OPENAI_API_KEY": "o"})
    anthropic, openai = ups["anthropic"], ups["openai"]
    assert (anthropic.base_url, anthropic.credential.header) == (
        "https://api.anthropic.com",
        "x-api-key",
    )
    assert anthropic.source == "pi built-in provider anthropic"
    assert (openai.base_url, openai.credential.header) == ("https://api.openai.com/v1", "bearer")
    # ANTHROPIC_AUTH_TOKEN comes first and is a bearer token.
    both = access(tmp_path, {"ANTHROPIC_API_KEY": "a", "ANTHROPIC_AUTH_TOKEN": "t"})["anthropic"]
    assert (both.credential.source, both.credential.header) == (
        "env ANTHROPIC_AUTH_TOKEN",
        "bearer",
    )
    # Without any key or login, pi does not offer a built-in provider: no upstream.
    assert access(tmp_path) == {}


def test_an_anthropic_oauth_login_is_a_host_refreshed_file_token(tmp_path: Path) -> None:
    expires = int((time.time() + 3600) * 1000)
    login = {"type": "oauth", "access": "sk-ant-oat01-real", "refresh": "r", "expires": expires}
    agent = agent_files(tmp_path, auth={"anthropic": login})
    up = access(tmp_path)["anthropic"]
    cred = up.credential
    assert (cred.kind, cred.header, cred.source) == (
        "OAuth login",
        "bearer",
        "~/.pi/agent/auth.json [anthropic]",
    )
    assert isinstance(cred.value, FileToken) and cred.value.path == agent / "auth.json"
    assert cred.current() == "sk-ant-oat01-real"
    assert up.base_url == "https://api.anthropic.com"


def test_the_login_format_is_pis_milliseconds_stored_early() -> None:
    fmt = PiLogin("anthropic", margin_ms=300_000)
    data = {"anthropic": {"type": "oauth", "access": "a", "refresh": "r", "expires": 1_000_000}}
    assert fmt.read(data) == Tokens("a", "r", 1300.0)
    written = fmt.write({**data, "openai": {"type": "api_key"}}, Tokens("a2", "r2", 2000.0))
    assert written["anthropic"] == {
        "type": "oauth",
        "access": "a2",
        "refresh": "r2",
        "expires": 1_700_000,
    }
    assert written["openai"] == {"type": "api_key"}
    assert fmt.read({"anthropic": {"type": "api_key", "key": "k"}}) is None


def test_a_chatgpt_login_routes_to_codex_with_the_account_header(tmp_path: Path) -> None:
    access_token = jwt({"https://api.openai.com/auth": {"chatgpt_account_id": "acct-1"}})
    login = {"type": "oauth", "access": access_token, "refresh": "r", "expires": 1}
    agent_files(tmp_path, auth={"openai-codex": login})
    up = access(tmp_path)["codex"]
    assert (up.api, up.base_url) == ("openai", "https://chatgpt.com/backend-api/codex")
    assert up.headers == (("chatgpt-account-id", "acct-1"),)
    assert codex_account(access_token) == "acct-1"


# --- settings.json, PI_CODING_AGENT_DIR, the project ----------------------------------


def test_the_default_provider_comes_first(tmp_path: Path) -> None:
    agent_files(tmp_path, settings={"defaultProvider": "openai"})
    result = PiHarness().access({"ANTHROPIC_API_KEY": "a", "OPENAI_API_KEY": "o"}, tmp_path)
    assert [u.name for u in result.upstreams] == ["openai", "anthropic"]


def test_a_default_provider_so_cannot_route_is_refused(tmp_path: Path) -> None:
    agent_files(tmp_path, settings={"defaultProvider": "google"})
    refusal = PiHarness().access({"GEMINI_API_KEY": "g"}, tmp_path).refusal
    assert refusal is not None and "google" in refusal and "\n" not in refusal
    assert "~/.pi/agent/settings.json" in refusal and "defaultProvider" in refusal


def test_a_default_provider_without_a_key_is_refused_with_the_fix(tmp_path: Path) -> None:
    agent_files(tmp_path, settings={"defaultProvider": "anthropic"})
    refusal = PiHarness().access({}, tmp_path).refusal
    assert refusal is not None and "/login anthropic" in refusal


def test_pi_coding_agent_dir_moves_the_agent_directory(tmp_path: Path) -> None:
    elsewhere = tmp_path / "cfg"
    elsewhere.mkdir()
    models = {"providers": {"p": {"baseUrl": "http://p/v1", "api": "openai-completions"}}}
    (elsewhere / "models.json").write_text(json.dumps(models))
    assert "p" in access(tmp_path, {"PI_CODING_AGENT_DIR": str(elsewhere)})
    (tmp_path / "rel").mkdir()
    (tmp_path / "rel" / "models.json").write_text(json.dumps(models))
    assert "p" in access(tmp_path, {"PI_CODING_AGENT_DIR": "~/rel"})


def test_the_projects_pi_config_is_only_a_note(tmp_path: Path, project: Path) -> None:
    (project / ".pi").mkdir()
    (project / ".pi" / "settings.json").write_text(json.dumps({"defaultProvider": "evil"}))
    models = {"providers": {"evil": {"baseUrl": "http://x", "apiKey": "!touch pwned"}}}
    (project / ".pi" / "models.json").write_text(json.dumps(models))
    (project / ".pi" / "extensions").mkdir()
    (project / ".pi" / "extensions" / "p.ts").write_text("pi.registerProvider('x', {})")
    result = PiHarness().access({}, tmp_path)
    assert result.refusal is None and result.upstreams == ()
    project_notes = [n for n in result.notes if "project's .pi/" in n]
    assert len(project_notes) == 3 and all("\n" not in n for n in project_notes)
    assert not (project / "pwned").exists()
    assert any(n.startswith("pi: no model provider") for n in result.notes)


def test_what_cannot_work_inside_is_a_note(tmp_path: Path) -> None:
    models = {
        "providers": {
            "split": {
                "api": "openai-completions",
                "models": [
                    {"id": "a", "baseUrl": "http://a/v1"},
                    {"id": "b", "baseUrl": "http://b/v1"},
                ],
            },
        }
    }
    copilot = {"type": "oauth", "access": "t", "refresh": "r", "expires": 1}
    agent_files(tmp_path, models=models, auth={"github-copilot": copilot})
    result = PiHarness().access({}, tmp_path)
    assert [u.name for u in result.upstreams] == ["split"]
    assert any("'github-copilot' (~/.pi/agent/auth.json)" in n for n in result.notes)
    assert any("'split' gives its models different baseUrls" in n for n in result.notes)


# --- provision: the sandbox's copy ----------------------------------------------------


def test_provision_points_every_provider_at_the_gateway_with_placeholders(
    tmp_path: Path,
) -> None:
    host = tmp_path / "host"
    models = {
        "providers": {
            "my-proxy": {
                "baseUrl": "http://127.0.0.1:4000",
                "api": "anthropic-messages",
                "apiKey": SECRET,
                "headers": {"x-secret": SECRET},
                "models": [
                    {"id": "m", "baseUrl": "http://127.0.0.1:4001", "headers": {"h": SECRET}}
                ],
                "modelOverrides": {"m2": {"headers": {"h": SECRET}, "name": "two"}},
            },
            "anthropic": {"baseUrl": "http://127.0.0.1:5000"},
        }
    }
    login = {"type": "oauth", "access": SECRET, "refresh": SECRET, "expires": 1}
    codex = {"type": "oauth", "access": SECRET, "refresh": SECRET, "expires": 1, "accountId": "a"}
    auth = {
        "anthropic": login,
        "openai-codex": codex,
        "openai": {"type": "api_key", "key": SECRET, "env": {"X": SECRET}},
    }
    agent_files(host, models=models, auth=auth, settings={"defaultProvider": "my-proxy"})
    endpoints = {
        "my-proxy": "http://127.0.0.1:3129/my-proxy",
        "anthropic": "http://127.0.0.1:3129/anthropic",
        "codex": "http://127.0.0.1:3129/codex",
    }
    seed = tmp_path / "seed"
    assert PiHarness().provision(
        home_seed=seed, host_home=host, opts=AgentOptions(endpoints=endpoints)
    ) == ["~/.pi/agent"]
    for path in seed.rglob("*"):
        assert not path.is_file() or SECRET not in path.read_text(), path

    copied = seed / ".pi" / "agent"
    proxy = json.loads((copied / "models.json").read_text())["providers"]["my-proxy"]
    assert proxy["baseUrl"] == proxy["models"][0]["baseUrl"] == endpoints["my-proxy"]
    assert proxy["apiKey"] == PLACEHOLDER and "headers" not in proxy
    assert "headers" not in proxy["models"][0]
    assert proxy["modelOverrides"] == {"m2": {"name": "two"}}

    stored = json.loads((copied / "auth.json").read_text())
    assert stored["anthropic"]["access"].startswith("sk-ant-oat")  # still an OAuth token to pi
    assert stored["anthropic"]["refresh"] == PLACEHOLDER
    assert stored["anthropic"]["expires"] == FAR_EXPIRY_MS  # pi never refreshes inside
    assert codex_account(stored["openai-codex"]["access"])  # still a JWT with an account
    assert stored["openai"] == {"type": "api_key", "key": PLACEHOLDER}
    assert (copied / "auth.json").stat().st_mode & 0o777 == 0o600

    routes = json.loads((seed / ROUTES_PATH).read_text())
    assert routes == {
        "my-proxy": endpoints["my-proxy"],
        "anthropic": endpoints["anthropic"],
        "openai-codex": endpoints["codex"],
    }


def test_provision_keeps_no_other_credential_of_pis(tmp_path: Path) -> None:
    """MCP servers' secrets and logins, and keys pi 0.x kept in settings.json."""
    host = tmp_path / "host"
    mcp = {
        "mcpServers": {
            "docs": {
                "url": "https://docs/mcp",
                "headers": {"Authorization": "Bearer ${DOCS_TOKEN}", "X-Key": SECRET},
                "oauth": {"clientId": "c", "clientSecret": SECRET},
            },
            "tools": {
                "command": "uvx",
                "env": {"API_KEY": SECRET, "MODE": "fast", "GH": "!gh auth token", "T": "${T}"},
            },
        }
    }
    agent = agent_files(host, mcp=mcp, settings={"apiKeys": {"anthropic": SECRET}, "theme": "x"})
    (agent / "mcp-auth.json").write_text(json.dumps({"docs": {"tokens": SECRET}}))
    (agent / "oauth.json").write_text(json.dumps({"anthropic": {"access": SECRET}}))
    seed = tmp_path / "seed"
    PiHarness().provision(home_seed=seed, host_home=host, opts=AgentOptions())
    for path in seed.rglob("*"):
        assert not path.is_file() or SECRET not in path.read_text(), path
    copied = seed / ".pi" / "agent"
    assert not (copied / "mcp-auth.json").exists() and not (copied / "oauth.json").exists()
    assert json.loads((copied / "settings.json").read_text()) == {"theme": "x", "transport": "sse"}
    servers = json.loads((copied / "mcp.json").read_text())["mcpServers"]
    assert servers["docs"]["headers"] == {
        "Authorization": "Bearer ${DOCS_TOKEN}",
        "X-Key": PLACEHOLDER,
    }
    assert servers["docs"]["oauth"] == {"clientId": "c", "clientSecret": PLACEHOLDER}
    assert servers["tools"]["env"] == {
        "API_KEY": PLACEHOLDER,
        "MODE": "fast",
        "GH": PLACEHOLDER,
        "T": "${T}",
    }


def test_a_due_chatgpt_login_is_refreshed_on_the_host_and_written_back_like_pi(
    tmp_path: Path,
) -> None:
    """The refresh request pi sends (client id issued at login, form body, resource), and
    the file as pi writes it: milliseconds, its margin, the other fields kept."""
    seen: list[dict[str, list[str]]] = []

    class TokenEndpoint(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"])).decode()
            seen.append(parse_qs(body))
            reply = json.dumps({"access_token": "new", "refresh_token": "r2", "expires_in": 3600})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply.encode())

        def log_message(self, format: str, *args: Any) -> None:
            pass

    login = {"type": "oauth", "access": "old", "refresh": "r1", "expires": 1, "clientId": "cid"}
    agent = agent_files(tmp_path, auth={"openai": login, "anthropic": {"type": "api_key"}})
    result = PiHarness().access({}, tmp_path)
    assert any("Sign in with ChatGPT" in n for n in result.notes)
    token = result.upstreams[0].credential.value
    assert isinstance(token, FileToken) and token.refresher is not None
    assert token.refresher.body("r1")["client_id"] == "cid"
    server = HTTPServer(("127.0.0.1", 0), TokenEndpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/token"
        token.refresher = Refresher(url, token.refresher.body, form=True)
        before = time.time()
        assert token.token() == "new"
    finally:
        server.shutdown()
    assert seen[0]["client_id"] == ["cid"] and seen[0]["refresh_token"] == ["r1"]
    assert seen[0]["resource"] == ["https://api.openai.com/v1"]
    stored = json.loads((agent / "auth.json").read_text())
    assert stored["anthropic"] == {"type": "api_key"}
    entry = stored["openai"]
    assert (entry["access"], entry["refresh"], entry["clientId"]) == ("new", "r2", "cid")
    expected_ms = (before + 3600) * 1000 - 180_000
    assert expected_ms - 5000 < entry["expires"] < expected_ms + 5000


def test_anthropic_custom_headers_are_sent_by_the_gateway(tmp_path: Path) -> None:
    env = {"ANTHROPIC_API_KEY": "a" * 10, "ANTHROPIC_CUSTOM_HEADERS": "X-Org: org-1\nbad line"}
    up = access(tmp_path, env)["anthropic"]
    assert ("X-Org", "org-1") in up.headers
