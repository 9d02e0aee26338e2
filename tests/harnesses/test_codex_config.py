"""codex's own configuration read on the host (access) and its sandbox copy (provision)."""

from __future__ import annotations

import json
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from sono.harnesses.base import Access, AgentOptions
from sono.harnesses.codex import CodexHarness
from sono.harnesses.codex_config import (
    ACCOUNT_HEADER,
    AUTH_CLAIM,
    AuthFormat,
    dumps,
    jwt_claims,
    placeholder_jwt,
)
from sono.net.oauth import FileToken
from sono.net.upstream import PLACEHOLDER, Upstream

GW = "http://127.0.0.1:3129"


def home_with(tmp_path: Path, config: str = "", auth: dict[str, Any] | None = None) -> Path:
    codex = tmp_path / "home" / ".codex"
    codex.mkdir(parents=True)
    if config:
        (codex / "config.toml").write_text(config)
    if auth is not None:
        (codex / "auth.json").write_text(json.dumps(auth))
    return tmp_path / "home"


def access(home: Path, env: dict[str, str] | None = None) -> Access:
    return CodexHarness().access(env or {}, home)


def only(result: Access) -> Upstream:
    assert result.refusal is None, result.refusal
    [upstream] = result.upstreams
    return upstream


def provisioned(tmp_path: Path, home: Path, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    seed = tmp_path / "seed"
    seed.mkdir(exist_ok=True)
    opts = AgentOptions(endpoints={name: f"{GW}/{name}"})
    CodexHarness().provision(home_seed=seed, host_home=home, opts=opts)
    config_file, auth_file = seed / ".codex" / "config.toml", seed / ".codex" / "auth.json"
    config = tomllib.loads(config_file.read_text()) if config_file.exists() else {}
    auth = json.loads(auth_file.read_text()) if auth_file.exists() else {}
    return config, auth


CUSTOM = """model_provider = "fake"
[model_providers.fake]
name = "Fake"
base_url = "http://127.0.0.1:8080/v1"
env_key = "FAKE_KEY"
wire_api = "responses"
"""


def test_custom_provider_with_env_key(tmp_path: Path) -> None:
    home = home_with(tmp_path, CUSTOM)
    up = only(access(home, {"FAKE_KEY": "sk-real-1234"}))
    assert (up.name, up.api, up.base_url) == ("fake", "openai", "http://127.0.0.1:8080/v1")
    assert up.source == "~/.codex/config.toml [model_providers.fake]"
    cred = up.credential
    assert (cred.kind, cred.source, cred.header, cred.value) == (
        "API key",
        "env FAKE_KEY",
        "bearer",
        "sk-real-1234",
    )
    config, _ = provisioned(tmp_path, home, "fake")
    table = config["model_providers"]["fake"]
    assert table["base_url"] == f"{GW}/fake"
    assert table["experimental_bearer_token"] == PLACEHOLDER
    assert "env_key" not in table and config["model_provider"] == "fake"


def test_missing_env_key_is_refused_with_the_fix(tmp_path: Path) -> None:
    result = access(home_with(tmp_path, CUSTOM))
    assert result.refusal is not None
    assert "$FAKE_KEY" in result.refusal and "set it" in result.refusal


def test_profile_selects_its_provider(tmp_path: Path) -> None:
    config = (
        'model_provider = "fake"\nprofile = "local"\n'
        '[profiles.local]\nmodel_provider = "Local.LLM"\n'
        '[model_providers."Local.LLM"]\nbase_url = "http://localhost:8000/v1"\n'
        + CUSTOM.split("\n", 1)[1]
    )
    home = home_with(tmp_path, config)
    up = only(access(home))
    assert (up.name, up.base_url, up.credential.kind) == (
        "local_llm",
        "http://localhost:8000/v1",
        "none",
    )
    assert up.source == "~/.codex/config.toml [model_providers.Local.LLM]"
    sandbox, _ = provisioned(tmp_path, home, "local_llm")
    assert sandbox["model_provider"] == "local_llm"
    assert sandbox["profiles"]["local"]["model_provider"] == "local_llm"
    assert sandbox["model_providers"]["local_llm"]["base_url"] == f"{GW}/local_llm"
    assert "Local.LLM" not in sandbox["model_providers"]
    argv = CodexHarness().unattended_argv(AgentOptions(endpoints={"local_llm": f"{GW}/local_llm"}))
    assert 'model_providers.local_llm.base_url="http://127.0.0.1:3129/local_llm"' in argv


def test_azure_keeps_query_params_and_stays_azure_behind_the_gateway(tmp_path: Path) -> None:
    home = home_with(
        tmp_path,
        'model_provider = "az"\n[model_providers.az]\nname = "Azure OpenAI"\n'
        'base_url = "https://me.openai.azure.com/openai/v1"\nenv_key = "AZURE_OPENAI_API_KEY"\n'
        'query_params = { api-version = "2025-04-01-preview" }\n',
    )
    up = only(access(home, {"AZURE_OPENAI_API_KEY": "azure-real-key"}))
    # codex sends Authorization: Bearer to Azure too (it has no api-key header).
    assert (up.base_url, up.credential.header) == (
        "https://me.openai.azure.com/openai/v1",
        "bearer",
    )
    config, _ = provisioned(tmp_path, home, "az")
    table = config["model_providers"]["az"]
    assert table["query_params"] == {"api-version": "2025-04-01-preview"}
    assert table["name"] == "azure"  # codex's Azure behaviour keys on the name or the host


def test_builtin_ollama_needs_no_key(tmp_path: Path) -> None:
    home = home_with(tmp_path, 'model_provider = "ollama"\n')
    up = only(access(home))
    assert (up.name, up.base_url, up.credential.kind) == (
        "ollama",
        "http://localhost:11434/v1",
        "none",
    )
    assert (
        only(access(home, {"CODEX_OSS_BASE_URL": "http://box:1/v1"})).base_url == "http://box:1/v1"
    )


def test_header_tables_go_to_the_gateway_only(tmp_path: Path) -> None:
    home = home_with(
        tmp_path,
        CUSTOM
        + 'http_headers = { "X-Team" = "team-secret-value" }\n'
        + 'env_http_headers = { "X-Org" = "ORG_VAR", "X-Unset" = "UNSET_VAR" }\n',
    )
    up = only(access(home, {"FAKE_KEY": "k" * 12, "ORG_VAR": "org-secret-value"}))
    assert dict(up.headers) == {"X-Team": "team-secret-value", "X-Org": "org-secret-value"}
    config, _ = provisioned(tmp_path, home, "fake")
    assert "http_headers" not in config["model_providers"]["fake"]
    assert "env_http_headers" not in config["model_providers"]["fake"]


def test_experimental_bearer_token_becomes_a_placeholder(tmp_path: Path) -> None:
    home = home_with(
        tmp_path,
        'model_provider = "p"\n[model_providers.p]\nbase_url = "https://x/v1"\n'
        'experimental_bearer_token = "tok-real-123456"\n',
    )
    up = only(access(home))
    assert (up.credential.kind, up.credential.value) == ("bearer token", "tok-real-123456")
    config, _ = provisioned(tmp_path, home, "p")
    assert config["model_providers"]["p"]["experimental_bearer_token"] == PLACEHOLDER


def test_auth_json_api_key(tmp_path: Path) -> None:
    home = home_with(tmp_path, 'model = "o3"\n', {"OPENAI_API_KEY": "sk-real-abcdef"})
    up = only(access(home))
    assert (up.name, up.base_url, up.source) == (
        "openai",
        "https://api.openai.com/v1",
        "built-in default",
    )
    assert (up.credential.kind, up.credential.source, up.credential.value) == (
        "API key",
        "~/.codex/auth.json",
        "sk-real-abcdef",
    )
    config, auth = provisioned(tmp_path, home, "openai")
    assert auth == {"OPENAI_API_KEY": PLACEHOLDER}
    assert config["openai_base_url"] == f"{GW}/openai" and config["model"] == "o3"


def chatgpt_auth(exp: float) -> dict[str, Any]:
    claims = {
        "email": "me@x.io",
        AUTH_CLAIM: {"chatgpt_plan_type": "pro", "chatgpt_account_id": "acct-real"},
    }
    return {
        "OPENAI_API_KEY": None,
        "tokens": {
            "id_token": placeholder_jwt(claims),
            "access_token": placeholder_jwt({**claims, "exp": int(exp)}),
            "refresh_token": "rt-real",
            "account_id": "acct-real",
        },
        "last_refresh": "2026-11-30T10:00:00Z",
    }


def test_chatgpt_login_is_a_host_token_with_the_account_header(tmp_path: Path) -> None:
    exp = time.time() + 3600
    home = home_with(tmp_path, "", chatgpt_auth(exp))
    up = only(access(home))
    assert up.base_url == "https://chatgpt.com/backend-api/codex"
    assert dict(up.headers) == {ACCOUNT_HEADER: "acct-real"}
    cred = up.credential
    assert (cred.kind, cred.source, cred.header) == (
        "ChatGPT login",
        "~/.codex/auth.json",
        "bearer",
    )
    assert isinstance(cred.value, FileToken)
    assert cred.current() == chatgpt_auth(exp)["tokens"]["access_token"]
    assert cred.value.refresher is not None
    assert cred.value.refresher.url == "https://auth.openai.com/oauth/token"


def test_chatgpt_base_url_from_config(tmp_path: Path) -> None:
    home = home_with(
        tmp_path, 'openai_base_url = "http://127.0.0.1:7/v1"\n', chatgpt_auth(time.time() + 60)
    )
    up = only(access(home))
    assert (up.base_url, up.source) == (
        "http://127.0.0.1:7/v1",
        "~/.codex/config.toml openai_base_url",
    )


def test_chatgpt_login_placeholder_is_accepted_and_never_refreshed(tmp_path: Path) -> None:
    home = home_with(tmp_path, "", chatgpt_auth(time.time() + 60))
    _, auth = provisioned(tmp_path, home, "openai")
    tokens = auth["tokens"]
    assert "acct-real" not in json.dumps(auth) and "rt-real" not in json.dumps(auth)
    assert tokens["refresh_token"] == PLACEHOLDER
    access_claims = jwt_claims(tokens["access_token"])
    assert access_claims["exp"] > time.time() + 5 * 365 * 86400
    id_claims = jwt_claims(tokens["id_token"])
    assert id_claims["email"] == "me@x.io"
    assert id_claims[AUTH_CLAIM]["chatgpt_plan_type"] == "pro"
    assert auth["last_refresh"].endswith("Z")


def test_auth_format_expiry_from_exp_else_last_refresh() -> None:
    fmt = AuthFormat()
    with_exp = fmt.read(chatgpt_auth(1_900_000_000))
    assert with_exp is not None and with_exp.expires_at == 1_900_000_000
    opaque = {
        "tokens": {"access_token": "opaque", "refresh_token": "r"},
        "last_refresh": "2026-01-01T00:00:00Z",
    }
    tokens = fmt.read(opaque)
    assert tokens is not None and tokens.expires_at == 1767225600 + 8 * 86400
    assert fmt.read({"OPENAI_API_KEY": "k"}) is None


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ('model_provider = "amazon-bedrock"\n', "AWS"),
        ('model_provider = "nope"\n', "[model_providers.nope]"),
        ("model = [", "cannot be read"),
    ],
)
def test_unroutable_setups_are_refused(tmp_path: Path, config: str, why: str) -> None:
    result = access(home_with(tmp_path, config, {"OPENAI_API_KEY": "k"}))
    assert result.refusal is not None and why in result.refusal
    assert result.refusal.startswith("codex: ")


def test_project_config_is_a_note_never_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    (project / ".codex").mkdir(parents=True)
    (project / ".git").mkdir()
    (project / ".codex" / "config.toml").write_text('model_provider = "evil"\n')
    monkeypatch.chdir(project)
    home = home_with(tmp_path, CUSTOM)
    result = access(home, {"FAKE_KEY": "k" * 10})
    assert only(result).name == "fake"
    [note] = result.notes
    assert "model_provider" in note and "not used" in note and "~/.codex/config.toml" in note


def test_dumps_round_trips() -> None:
    data = {"a": 1, "s": 'q"x', "t": {"k-1": [1, 2], "in": {"x": True}, "sub": {"deep": "v"}}}
    assert tomllib.loads(dumps(data)) == data


def test_openai_base_url_from_the_environment_is_still_honoured(tmp_path: Path) -> None:
    home = home_with(tmp_path)
    up = only(access(home, {"OPENAI_API_KEY": "sk-real-env", "OPENAI_BASE_URL": "http://box:8"}))
    assert (up.base_url, up.source) == ("http://box:8/v1", "env OPENAI_BASE_URL")
    assert up.credential.source == "env OPENAI_API_KEY"
    configured = home_with(tmp_path / "b", 'openai_base_url = "http://cfg:9/v1"\n')
    up = only(access(configured, {"OPENAI_API_KEY": "k" * 10, "OPENAI_BASE_URL": "http://box:8"}))
    assert up.base_url == "http://cfg:9/v1"  # the config file wins
