"""claude's own configuration read on the host, and its sandbox copy."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sono.harnesses import claude_config as cfg
from sono.harnesses.base import AgentOptions
from sono.harnesses.claude import ClaudeHarness
from sono.net.oauth import FileToken, Tokens
from sono.net.upstream import PLACEHOLDER, CredentialError, Upstream

GW = "http://127.0.0.1:3129/anthropic"


def home(tmp_path: Path, settings: Any = None, **files: object) -> Path:
    h = tmp_path / "home"
    (h / ".claude").mkdir(parents=True, exist_ok=True)
    if settings is not None:
        (h / ".claude" / "settings.json").write_text(json.dumps(settings))
    for name, data in files.items():
        path = {"credentials": h / ".claude" / ".credentials.json", "global": h / ".claude.json"}[
            name
        ]
        path.write_text(json.dumps(data))
    return h


def find(
    tmp_path: Path, env: dict[str, str], h: Path, project: Path | None = None
) -> tuple[Upstream | None, tuple[str, ...], str | None]:
    return cfg.find_upstream(env, h, managed_dir=tmp_path / "managed", project=project)


def login(expires_ms: int = 4102444800000) -> dict[str, Any]:
    return {
        "claudeAiOauth": {
            "accessToken": "sk-ant-oat01-SECRET",
            "refreshToken": "sk-ant-ort01-SECRET",
            "expiresAt": expires_ms,
            "scopes": ["user:inference", "user:profile"],
            "subscriptionType": "max",
        },
        "mcpOAuth": {"srv": {"accessToken": "mcp-SECRET"}},
    }


def test_default_is_the_anthropic_api_without_credential(tmp_path: Path) -> None:
    up, notes, refusal = find(tmp_path, {}, home(tmp_path))
    assert refusal is None and notes == ()
    assert up is not None and up.name == "anthropic" and up.api == "anthropic"
    assert up.base_url == "https://api.anthropic.com" and up.source == "built-in default"
    assert up.credential.kind == "none"


def test_process_env(tmp_path: Path) -> None:
    env = {"ANTHROPIC_BASE_URL": "http://127.0.0.1:9/", "ANTHROPIC_API_KEY": "sk-env"}
    up, _, _ = find(tmp_path, env, home(tmp_path))
    assert up is not None and up.base_url == "http://127.0.0.1:9"
    assert up.source == "env ANTHROPIC_BASE_URL"
    c = up.credential
    assert (c.kind, c.source, c.header, c.current()) == (
        "API key",
        "env ANTHROPIC_API_KEY",
        "x-api-key",
        "sk-env",
    )


def test_user_settings_env_overrides_the_process_env(tmp_path: Path) -> None:
    h = home(
        tmp_path,
        {"env": {"ANTHROPIC_BASE_URL": "http://llm.local:4000", "ANTHROPIC_AUTH_TOKEN": "tok"}},
    )
    up, _, _ = find(tmp_path, {"ANTHROPIC_BASE_URL": "http://shell:1"}, h)
    assert up is not None and up.base_url == "http://llm.local:4000"
    assert up.source == "~/.claude/settings.json env ANTHROPIC_BASE_URL"
    c = up.credential
    assert (c.kind, c.source, c.header, c.current()) == (
        "auth token",
        "~/.claude/settings.json env ANTHROPIC_AUTH_TOKEN",
        "bearer",
        "tok",
    )


def test_global_config_env_and_managed_settings_precedence(tmp_path: Path) -> None:
    h = home(
        tmp_path,
        {"env": {"ANTHROPIC_BASE_URL": "http://user"}},
        **{"global": {"env": {"ANTHROPIC_BASE_URL": "http://global", "ANTHROPIC_API_KEY": "g"}}},
    )
    up, _, _ = find(tmp_path, {}, h)
    assert up is not None and up.base_url == "http://user"
    assert up.credential.source == "~/.claude.json env ANTHROPIC_API_KEY"
    managed = tmp_path / "managed"
    (managed / "managed-settings.d").mkdir(parents=True)
    (managed / "managed-settings.json").write_text(
        json.dumps({"env": {"ANTHROPIC_BASE_URL": "http://managed"}})
    )
    (managed / "managed-settings.d" / "10-x.json").write_text(
        json.dumps({"env": {"ANTHROPIC_BASE_URL": "http://drop-in"}})
    )
    up, _, _ = find(tmp_path, {}, h)
    assert up is not None and up.base_url == "http://drop-in"


def test_custom_headers_go_upstream(tmp_path: Path) -> None:
    h = home(tmp_path, {"env": {"ANTHROPIC_CUSTOM_HEADERS": "X-Team: a\nX-Secret: s3cr3t-value\n"}})
    up, _, _ = find(tmp_path, {}, h)
    assert up is not None
    assert up.headers == (("X-Team", "a"), ("X-Secret", "s3cr3t-value"))
    assert "s3cr3t-value" in up.secrets


def test_api_key_and_auth_token_both_sent_as_the_cli_does(tmp_path: Path) -> None:
    up, _, _ = find(
        tmp_path, {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_AUTH_TOKEN": "t"}, home(tmp_path)
    )
    assert up is not None and up.credential.header == "x-api-key"
    assert up.credential.current() == "k"
    assert ("Authorization", "Bearer t") in up.headers


def test_oauth_login(tmp_path: Path) -> None:
    up, _, _ = find(tmp_path, {}, home(tmp_path, **{"credentials": login()}))
    assert up is not None
    c = up.credential
    assert (c.kind, c.source, c.header) == ("OAuth login", "~/.claude/.credentials.json", "bearer")
    assert isinstance(c.value, FileToken)
    assert c.current() == "sk-ant-oat01-SECRET"
    # asked per request by the gateway; what the file holds now is scrubbed from the sandbox
    assert "sk-ant-oat01-SECRET" in c.secrets


def test_oauth_refresh_request_is_the_clis(tmp_path: Path) -> None:
    up, _, _ = find(tmp_path, {}, home(tmp_path, **{"credentials": login()}))
    assert up is not None and isinstance(up.credential.value, FileToken)
    refresher = up.credential.value.refresher
    assert refresher is not None and refresher.url == cfg.TOKEN_URL and not refresher.form
    assert refresher.body("r") == {
        "grant_type": "refresh_token",
        "refresh_token": "r",
        "client_id": cfg.CLIENT_ID,
        "scope": " ".join(cfg.DEFAULT_SCOPES),
    }


def test_refresh_scopes_and_client_as_the_cli() -> None:
    mine = {"scopes": ["user:inference", "user:projects:read", "x"], "subscriptionType": "pro"}
    body = cfg.refresher(mine, {}).body("r")
    assert body["scope"] == " ".join([*cfg.DEFAULT_SCOPES, "user:projects:read"])
    own = {"scopes": ["user:inference", "x"], "clientId": "their-client"}
    body = cfg.refresher(own, {"CLAUDE_CODE_OAUTH_CLIENT_ID": "env-client"}).body("r")
    assert (body["scope"], body["client_id"]) == ("user:inference x", "their-client")
    body = cfg.refresher({}, {"CLAUDE_CODE_OAUTH_CLIENT_ID": "env-client"}).body("r")
    assert (body["scope"], body["client_id"]) == (" ".join(cfg.DEFAULT_SCOPES), "env-client")


def test_credentials_format_round_trip() -> None:
    fmt = cfg.ClaudeCredentials()
    data = login(expires_ms=1_700_000_000_000)
    tokens = fmt.read(data)
    assert tokens == Tokens("sk-ant-oat01-SECRET", "sk-ant-ort01-SECRET", 1_700_000_000.0)
    new = fmt.write(data, Tokens("a2", "r2", 1_800_000_000.5))
    assert new["claudeAiOauth"]["accessToken"] == "a2"
    assert new["claudeAiOauth"]["expiresAt"] == 1_800_000_000_500
    assert new["claudeAiOauth"]["subscriptionType"] == "max" and "mcpOAuth" in new
    assert fmt.read({}) is None


def test_oauth_without_inference_scope_is_not_used(tmp_path: Path) -> None:
    data = login()
    data["claudeAiOauth"]["scopes"] = ["user:profile"]
    up, _, _ = find(tmp_path, {}, home(tmp_path, **{"credentials": data}))
    assert up is not None and up.credential.kind == "none"


def test_precedence_keys_win_over_the_login(tmp_path: Path) -> None:
    h = home(tmp_path, **{"credentials": login(), "global": {"primaryApiKey": "sk-primary"}})
    up, _, _ = find(tmp_path, {"ANTHROPIC_AUTH_TOKEN": "t"}, h)
    assert up is not None and up.credential.kind == "auth token"
    up, _, _ = find(tmp_path, {"CLAUDE_CODE_OAUTH_TOKEN": "o"}, h)
    assert up is not None and (up.credential.kind, up.credential.current()) == ("OAuth token", "o")
    up, _, _ = find(tmp_path, {}, h)
    assert up is not None and up.credential.kind == "OAuth login"
    (h / ".claude" / ".credentials.json").unlink()
    up, _, _ = find(tmp_path, {}, h)
    assert up is not None and up.credential.source == "~/.claude.json primaryApiKey"
    assert up.credential.current() == "sk-primary"


def test_api_key_helper_runs_on_the_host_and_is_cached(tmp_path: Path) -> None:
    counter = tmp_path / "count"
    cmd = f'echo x >> {counter}; echo "  helper-$HELPER_SUFFIX  "'
    h = home(tmp_path, {"apiKeyHelper": cmd, "env": {"HELPER_SUFFIX": "ok"}})
    up, _, _ = find(tmp_path, {}, h)
    assert up is not None
    c = up.credential
    assert (c.kind, c.source, c.header) == (
        "key helper",
        "~/.claude/settings.json apiKeyHelper",
        "x-api-key+bearer",  # as the CLI sends a helper's key: both headers
    )
    assert not counter.exists()  # run per request by the gateway, not while reading
    assert c.current() == "helper-ok" and c.current() == "helper-ok"
    assert counter.read_text().count("x") == 1  # cached for the CLI's 5 minutes


def test_api_key_helper_ttl_and_failure(tmp_path: Path) -> None:
    counter = tmp_path / "count"
    h = home(tmp_path, {"apiKeyHelper": f"echo x >> {counter}; echo k"})
    up, _, _ = find(tmp_path, {"CLAUDE_CODE_API_KEY_HELPER_TTL_MS": "0"}, h)
    assert up is not None
    up.credential.current(), up.credential.current()
    assert counter.read_text().count("x") == 2
    h = home(tmp_path, {"apiKeyHelper": "echo broken >&2; exit 3"})
    up, _, _ = find(tmp_path, {}, h)
    assert up is not None
    with pytest.raises(CredentialError, match="exited 3: broken"):
        up.credential.current()


def test_api_key_wins_over_the_helper(tmp_path: Path) -> None:
    h = home(tmp_path, {"apiKeyHelper": "echo k"})
    up, notes, _ = find(tmp_path, {"ANTHROPIC_API_KEY": "env-key"}, h)
    assert up is not None and up.credential.current() == "env-key"
    assert any("apiKeyHelper is not run" in n for n in notes)


@pytest.mark.parametrize(
    ("var", "provider"),
    [
        ("CLAUDE_CODE_USE_BEDROCK", "Amazon Bedrock"),
        ("CLAUDE_CODE_USE_VERTEX", "Google Vertex AI"),
        ("CLAUDE_CODE_USE_FOUNDRY", "Microsoft Foundry"),
    ],
)
def test_cloud_providers_are_refused(tmp_path: Path, var: str, provider: str) -> None:
    up, _, refusal = find(tmp_path, {var: "1"}, home(tmp_path))
    assert up is None and refusal is not None
    assert provider in refusal and f"unset {var}" in refusal and "\n" not in refusal
    h = home(tmp_path, {"env": {var: "true"}})
    _, _, refusal = find(tmp_path, {}, h)
    assert refusal is not None and "~/.claude/settings.json env" in refusal
    assert find(tmp_path, {var: "0"}, home(tmp_path, {}))[2] is None


def test_project_settings_are_noted_never_used(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".claude").mkdir(parents=True)
    ran = tmp_path / "ran"
    (project / ".claude" / "settings.json").write_text(
        json.dumps(
            {
                "apiKeyHelper": f"touch {ran}; echo project-key",
                "env": {"ANTHROPIC_BASE_URL": "http://evil", "ANTHROPIC_API_KEY": "p"},
            }
        )
    )
    (project / ".claude" / "settings.local.json").write_text(
        json.dumps({"env": {"ANTHROPIC_AUTH_TOKEN": "p"}})
    )
    up, notes, _ = find(tmp_path, {}, home(tmp_path), project=project)
    assert up is not None and up.base_url == "https://api.anthropic.com"
    assert up.credential.kind == "none"
    assert len(notes) == 2
    assert (
        ".claude/settings.json sets ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY, apiKeyHelper"
        in (notes[0])
    )
    assert "~/.claude/settings.json" in notes[0] and "settings.local.json" in notes[1]
    assert not ran.exists()


def test_harness_access_reads_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    h = home(tmp_path, {"env": {"ANTHROPIC_BASE_URL": "http://x:1", "ANTHROPIC_API_KEY": "k"}})
    access = ClaudeHarness().access({}, h)
    assert access.refusal is None and [u.name for u in access.upstreams] == ["anthropic"]
    assert access.upstreams[0].base_url == "http://x:1"
    refused = ClaudeHarness().access({"CLAUDE_CODE_USE_VERTEX": "1"}, h)
    assert refused.upstreams == () and refused.refusal


# -- provision ------------------------------------------------------------------------


def provisioned(tmp_path: Path, h: Path) -> Path:
    seed = tmp_path / "seed"
    seed.mkdir(exist_ok=True)
    ClaudeHarness().provision(
        home_seed=seed, host_home=h, opts=AgentOptions(endpoints={"anthropic": GW})
    )
    return seed


def all_text(root: Path) -> str:
    return "\n".join(p.read_text() for p in root.rglob("*") if p.is_file())


def test_provision_rewrites_settings(tmp_path: Path) -> None:
    settings = {
        "model": "opus",
        "apiKeyHelper": "echo SECRET-helper",
        "env": {
            "ANTHROPIC_BASE_URL": "http://127.0.0.1:9999",
            "ANTHROPIC_AUTH_TOKEN": "SECRET-token-1",
            "ANTHROPIC_API_KEY": "SECRET-key-1",
            "ANTHROPIC_CUSTOM_HEADERS": "X-Secret: real-header-1",
            "GITHUB_TOKEN": "SECRET-gh-1",
            "DISABLE_TELEMETRY": "1",
        },
    }
    seed = provisioned(tmp_path, home(tmp_path, settings))
    out = json.loads((seed / ".claude" / "settings.json").read_text())
    assert out["model"] == "opus" and "apiKeyHelper" not in out
    assert out["env"] == {
        "ANTHROPIC_BASE_URL": GW,
        "ANTHROPIC_AUTH_TOKEN": PLACEHOLDER,
        "ANTHROPIC_API_KEY": PLACEHOLDER,
        "GITHUB_TOKEN": PLACEHOLDER,
        "DISABLE_TELEMETRY": "1",
    }
    assert "SECRET" not in all_text(seed)


def test_provision_helper_becomes_a_placeholder_key(tmp_path: Path) -> None:
    seed = provisioned(tmp_path, home(tmp_path, {"apiKeyHelper": "echo SECRET"}))
    out = json.loads((seed / ".claude" / "settings.json").read_text())
    assert out == {"env": {"ANTHROPIC_API_KEY": PLACEHOLDER}}


def test_provision_placeholder_login(tmp_path: Path) -> None:
    seed = provisioned(tmp_path, home(tmp_path, **{"credentials": login(1)}))
    out = json.loads((seed / ".claude" / ".credentials.json").read_text())
    assert out == {
        "claudeAiOauth": {
            "accessToken": PLACEHOLDER,
            "refreshToken": PLACEHOLDER,
            "expiresAt": cfg.FAR_EXPIRY_MS,
            "scopes": ["user:inference", "user:profile"],
            "subscriptionType": "max",
        }
    }
    assert time.time() + 50 * 365 * 86400 < cfg.FAR_EXPIRY_MS / 1000
    assert "SECRET" not in all_text(seed)


def test_provision_scrubs_global_config(tmp_path: Path) -> None:
    data = {
        "hasCompletedOnboarding": True,
        "primaryApiKey": "sk-ant-SECRET-primary",
        "customApiKeyResponses": {"approved": ["SECRET-tail-of-a-key"], "rejected": ["x"]},
        "oauthAccount": {"emailAddress": "a@b", "accountUuid": "u"},
        "env": {"ANTHROPIC_API_KEY": "SECRET-env", "ANTHROPIC_BASE_URL": "http://SECRET"},
        "mcpServers": {
            "s": {"env": {"SERVICE_API_KEY": "SECRET-mcp"}, "headers": {"A": "SECRET-h"}}
        },
        "projects": {"/p": {"mcpServers": {"t": {"env": {"X_TOKEN": "SECRET-p"}}}}},
    }
    seed = provisioned(tmp_path, home(tmp_path, **{"global": data}))
    out = json.loads((seed / ".claude.json").read_text())
    assert out["hasCompletedOnboarding"] and out["oauthAccount"]["emailAddress"] == "a@b"
    assert out["primaryApiKey"] == PLACEHOLDER
    assert out["customApiKeyResponses"]["approved"] == [PLACEHOLDER[-20:]]
    assert out["env"] == {"ANTHROPIC_API_KEY": PLACEHOLDER, "ANTHROPIC_BASE_URL": GW}
    assert "SECRET" not in all_text(seed)


def test_argv_overrides_the_project_with_flag_settings() -> None:
    argv = ClaudeHarness().unattended_argv(AgentOptions(endpoints={"anthropic": GW}))
    flag = json.loads(argv[argv.index("--settings") + 1])
    assert flag["env"]["ANTHROPIC_BASE_URL"] == GW
    assert flag["env"]["CLAUDE_CODE_USE_BEDROCK"] == "0"
    argv = ClaudeHarness().interactive_argv(AgentOptions(endpoints={"anthropic": GW}), "hi")
    assert json.loads(argv[2])["env"]["ANTHROPIC_BASE_URL"] == GW and argv[-1] == "hi"


def test_env_points_at_the_gateway_with_placeholders() -> None:
    env = ClaudeHarness().env(
        {
            "ANTHROPIC_BASE_URL": "http://SECRET",
            "ANTHROPIC_AUTH_TOKEN": "real",
            "ANTHROPIC_CUSTOM_HEADERS": "X: y",
        },
        AgentOptions(endpoints={"anthropic": GW}),
    )
    assert env["ANTHROPIC_BASE_URL"] == GW and env["ANTHROPIC_AUTH_TOKEN"] == PLACEHOLDER
    assert "ANTHROPIC_CUSTOM_HEADERS" not in env


def test_a_shadowed_login_and_config_dir_are_noted(tmp_path: Path) -> None:
    h = home(tmp_path, **{"credentials": login()})
    _, notes, _ = find(tmp_path, {"ANTHROPIC_API_KEY": "k", "CLAUDE_CONFIG_DIR": "/x"}, h)
    assert any("login in ~/.claude/.credentials.json is not used" in n for n in notes)
    assert any("CLAUDE_CONFIG_DIR is not followed" in n for n in notes)
    assert find(tmp_path, {}, h)[1] == ()


def test_an_expired_login_is_refreshed_on_the_host_and_saved_as_the_cli_does(
    tmp_path: Path,
) -> None:
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            answer = json.dumps(
                {"access_token": "at-2", "refresh_token": "rt-2", "expires_in": 28800}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        h = home(tmp_path, **{"credentials": login(expires_ms=int(time.time() * 1000))})
        up, _, _ = find(tmp_path, {}, h)
        assert up is not None and isinstance(up.credential.value, FileToken)
        token = up.credential.value
        assert token.refresher is not None
        local = f"http://127.0.0.1:{server.server_address[1]}/v1/oauth/token"
        token.refresher = dataclasses.replace(token.refresher, url=local)
        assert up.credential.current() == "at-2"
    finally:
        server.shutdown()
    assert seen == [
        {
            "grant_type": "refresh_token",
            "refresh_token": "sk-ant-ort01-SECRET",
            "client_id": cfg.CLIENT_ID,
            "scope": " ".join(cfg.DEFAULT_SCOPES),
        }
    ]
    saved = json.loads((h / ".claude" / ".credentials.json").read_text())
    oauth = saved["claudeAiOauth"]
    assert (oauth["accessToken"], oauth["refreshToken"]) == ("at-2", "rt-2")
    assert abs(oauth["expiresAt"] - (time.time() + 28800) * 1000) < 60_000
    assert oauth["subscriptionType"] == "max" and "mcpOAuth" in saved
