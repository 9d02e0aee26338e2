"""opencode's own configuration read on the host (access) and written into the sandbox's
HOME with the gateway and placeholders (provision, env)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from sono.harnesses.base import Access, AgentOptions
from sono.harnesses.opencode import OpencodeHarness
from sono.harnesses.opencode_config import (
    FAR_EXPIRY_MS,
    REFRESHERS,
    AuthJsonFormat,
    parse_jsonc,
    substitute,
    upstream_name,
)
from sono.net.oauth import FileToken, Tokens
from sono.net.upstream import PLACEHOLDER, CredentialError

GW = "http://127.0.0.1:3129"
KEY = "sk-real-key-0123456789"


@pytest.fixture(autouse=True)
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The project (cwd) holds no opencode.json unless a test puts one there."""
    work = tmp_path / "project"
    work.mkdir()
    (work / ".git").mkdir()
    monkeypatch.chdir(work)


def home_with(tmp_path: Path, files: dict[str, Any], auth: Any = None) -> Path:
    home = tmp_path / "home"
    conf = home / ".config" / "opencode"
    conf.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        text = content if isinstance(content, str) else json.dumps(content)
        (conf / name).write_text(text)
    if auth is not None:
        data = home / ".local" / "share" / "opencode"
        data.mkdir(parents=True, exist_ok=True)
        (data / "auth.json").write_text(json.dumps(auth))
    return home


def access(home: Path, env: dict[str, str] | None = None) -> Access:
    return OpencodeHarness().access({"HOME": str(home), **(env or {})}, home)


def custom(npm: str = "@ai-sdk/openai-compatible", **options: Any) -> dict[str, Any]:
    return {"npm": npm, "options": options, "models": {"m": {"name": "m"}}}


# --- access: shapes of the user's config ----------------------------------------------------


def test_custom_provider_with_base_url_key_and_headers(tmp_path: Path) -> None:
    cfg = {
        "model": "fake/m",
        "provider": {
            "fake": custom(
                baseURL="http://127.0.0.1:9999/v1", apiKey=KEY, headers={"X-Team": "secret-team"}
            )
        },
    }
    got = access(home_with(tmp_path, {"opencode.json": cfg}))
    assert got.refusal is None
    up = got.upstream("opencode-fake")
    assert up is not None and up.api == "openai"
    assert up.base_url == "http://127.0.0.1:9999/v1"
    assert up.source == "~/.config/opencode/opencode.json provider.fake.options.baseURL"
    assert (up.credential.kind, up.credential.header, up.credential.current()) == (
        "API key",
        "bearer",
        KEY,
    )
    assert up.credential.source == "~/.config/opencode/opencode.json provider.fake.options.apiKey"
    assert up.headers == (("X-Team", "secret-team"),)
    # so's own plain-env providers only where the environment names an endpoint.
    assert {u.name for u in got.upstreams} == {"opencode-fake"}
    with_env = access(home_with(tmp_path, {"opencode.json": cfg}), {"OPENAI_BASE_URL": "http://o"})
    assert {u.name for u in with_env.upstreams} == {"opencode-fake", "openai"}


def test_anthropic_package_speaks_messages_without_v1(tmp_path: Path) -> None:
    cfg = {"provider": {"proxy": custom("@ai-sdk/anthropic", baseURL="https://p.example/v1")}}
    got = access(home_with(tmp_path, {"opencode.json": cfg}), {"ANTHROPIC_API_KEY": KEY})
    up = got.upstream("opencode-proxy")
    assert up is not None and up.api == "anthropic" and up.base_url == "https://p.example"
    assert up.credential.kind == "none"  # a custom provider reads no vendor variable


def test_files_merge_in_opencodes_order_with_jsonc(tmp_path: Path) -> None:
    files = {
        "config.json": {"provider": {"p": custom(baseURL="http://a/v1", apiKey="k-config")}},
        "opencode.json": {"provider": {"p": {"options": {"baseURL": "http://b/v1"}}}},
        "opencode.jsonc": (
            "{\n  // the user's comment\n"
            '  "provider": {"p": {"options": {"apiKey": "k-jsonc",},},},\n}'
        ),
    }
    home = home_with(tmp_path, files)
    custom_file = tmp_path / "custom.json"
    custom_file.write_text(json.dumps({"provider": {"p": {"options": {"baseURL": "http://c/v1"}}}}))
    up = access(home, {"OPENCODE_CONFIG": str(custom_file)}).upstream("opencode-p")
    assert up is not None and up.base_url == "http://c/v1" and up.credential.current() == "k-jsonc"
    inline = json.dumps({"provider": {"p": {"options": {"baseURL": "http://d/v1"}}}})
    env = {"OPENCODE_CONFIG": str(custom_file), "OPENCODE_CONFIG_CONTENT": inline}
    up = access(home, env).upstream("opencode-p")
    assert up is not None and up.base_url == "http://d/v1"
    assert up.source == "env OPENCODE_CONFIG_CONTENT provider.p.options.baseURL"


def test_env_and_file_substitution(tmp_path: Path) -> None:
    home = home_with(tmp_path, {})
    conf = home / ".config" / "opencode"
    (conf / "key.txt").write_text("  from-file-key\n")
    (home / "k2").write_text("home-key")
    cfg = (
        '{"provider": {'
        '"a": {"npm": "@ai-sdk/openai", "options": {"baseURL": "{env:A_URL}", '
        '"apiKey": "{file:key.txt}"}},'
        '"b": {"npm": "@ai-sdk/openai", "options": {"baseURL": "http://b/v1", '
        '"apiKey": "{file:~/k2}"}}}}'
    )
    (conf / "opencode.json").write_text(cfg)
    got = access(home, {"A_URL": "http://a.example/v1"})
    a, b = got.upstream("opencode-a"), got.upstream("opencode-b")
    assert a is not None and a.base_url == "http://a.example/v1"
    assert a.credential.current() == "from-file-key"
    assert b is not None and b.credential.current() == "home-key"
    # As opencode: an unset variable is empty, a {file:} on a // line is left alone.
    text = '{\n// "{file:gone}"\n"x": "{env:UNSET}"}'
    assert substitute(text, {}, conf, home) == '{\n// "{file:gone}"\n"x": ""}'
    assert parse_jsonc('{"a": "//not a comment", /* c */ "b": [1,],}', "t") == {
        "a": "//not a comment",
        "b": [1],
    }


def test_missing_file_reference_is_refused(tmp_path: Path) -> None:
    cfg = {"provider": {"a": custom(baseURL="http://a/v1", apiKey="{file:nope.txt}")}}
    got = access(home_with(tmp_path, {"opencode.json": cfg}))
    assert got.refusal is not None and "nope.txt" in got.refusal


def test_nothing_configured_keeps_the_plain_env_reading(tmp_path: Path) -> None:
    got = access(home_with(tmp_path, {}), {"OPENAI_BASE_URL": "http://o:1"})
    assert [u.name for u in got.upstreams] == ["anthropic", "openai"]
    assert got.notes == () and got.refusal is None


def test_builtin_keys_from_env(tmp_path: Path) -> None:
    home = home_with(tmp_path, {})
    got = access(home, {"OPENROUTER_API_KEY": KEY, "ANTHROPIC_API_KEY": "sk-ant-0123456789"})
    up = got.upstream("opencode-openrouter")
    assert up is not None and up.base_url == "https://openrouter.ai/api/v1"
    assert (up.credential.source, up.credential.header) == ("env OPENROUTER_API_KEY", "bearer")
    # anthropic/openai with only an env key: the plain-env reading, as before.
    assert got.upstream("opencode-anthropic") is None
    anthropic = got.upstream("anthropic")
    assert anthropic is not None and anthropic.credential.source == "env ANTHROPIC_API_KEY"


def test_builtin_chosen_in_config_is_the_users_provider(tmp_path: Path) -> None:
    cfg = {"model": "anthropic/claude-sonnet-4-5"}
    got = access(home_with(tmp_path, {"opencode.json": cfg}), {"ANTHROPIC_API_KEY": KEY})
    up = got.upstream("opencode-anthropic")
    assert up is not None and up.base_url == "https://api.anthropic.com"
    assert (up.credential.header, up.credential.source) == ("x-api-key", "env ANTHROPIC_API_KEY")
    assert got.upstream("anthropic") is None  # covered by the user's own provider
    assert got.upstream("openai") is None  # not named by the environment either


def test_api_key_login_in_auth_json(tmp_path: Path) -> None:
    home = home_with(tmp_path, {}, {"anthropic": {"type": "api", "key": KEY}})
    up = access(home, {"ANTHROPIC_API_KEY": "sk-env-0123456789"}).upstream("opencode-anthropic")
    assert up is not None and up.credential.current() == KEY
    assert up.credential.source == "~/.local/share/opencode/auth.json"


def test_oauth_login_is_a_file_token(tmp_path: Path) -> None:
    expires = int((time.time() + 3600) * 1000)
    login = {"type": "oauth", "access": "at-real", "refresh": "rt-real", "expires": expires}
    home = home_with(tmp_path, {"opencode.json": {"model": "anthropic/x"}}, {"anthropic": login})
    up = access(home).upstream("opencode-anthropic")
    assert up is not None and up.credential.kind == "OAuth login"
    assert up.credential.header == "bearer"
    assert up.credential.source == "~/.local/share/opencode/auth.json [anthropic]"
    assert isinstance(up.credential.value, FileToken)
    assert up.credential.value.refresher is not None  # refreshed on the host when due
    assert up.credential.current() == "at-real"


def test_auth_json_format_round_trip() -> None:
    fmt = AuthJsonFormat("anthropic")
    data = {"anthropic": {"type": "oauth", "access": "a", "refresh": "r", "expires": 2000}}
    assert fmt.read(data) == Tokens("a", "r", 2.0)
    out = fmt.write({**data, "other": {"type": "api", "key": "k"}}, Tokens("a2", "r2", 5.0))
    assert out["anthropic"] == {"type": "oauth", "access": "a2", "refresh": "r2", "expires": 5000}
    assert out["other"] == {"type": "api", "key": "k"}
    assert fmt.read({"anthropic": {"type": "api", "key": "k"}}) is None


def test_auth_content_variable_wins_over_the_file(tmp_path: Path) -> None:
    home = home_with(tmp_path, {}, {"openrouter": {"type": "api", "key": "from-file"}})
    inline = json.dumps({"openrouter": {"type": "api", "key": "from-env-0123456789"}})
    up = access(home, {"OPENCODE_AUTH_CONTENT": inline}).upstream("opencode-openrouter")
    assert up is not None and up.credential.current() == "from-env-0123456789"
    assert up.credential.source == "env OPENCODE_AUTH_CONTENT"


def test_chatgpt_login_is_refused_when_chosen_else_noted(tmp_path: Path) -> None:
    login = {"type": "oauth", "access": "a", "refresh": "r", "expires": FAR_EXPIRY_MS}
    chosen = home_with(tmp_path, {"opencode.json": {"model": "openai/gpt-5"}}, {"openai": login})
    got = access(chosen)
    assert got.refusal is not None and "ChatGPT" in got.refusal
    assert "\n" not in got.refusal
    other = tmp_path / "other"
    other.mkdir()
    got = access(home_with(other, {}, {"openai": login}))
    assert got.refusal is None and any("'openai' is not routed" in n for n in got.notes)


def test_unknown_package_is_noted_or_refused(tmp_path: Path) -> None:
    cfg = {"provider": {"bed": custom("@ai-sdk/amazon-bedrock", region="x")}}
    got = access(home_with(tmp_path, {"opencode.json": cfg}))
    assert got.refusal is None and got.upstream("opencode-bed") is None
    assert any("@ai-sdk/amazon-bedrock" in n for n in got.notes)
    chosen = tmp_path / "chosen"
    chosen.mkdir()
    got = access(home_with(chosen, {"opencode.json": {**cfg, "model": "bed/m"}}))
    assert got.refusal is not None and "bed" in got.refusal


def test_project_config_naming_an_endpoint_is_a_note(tmp_path: Path) -> None:
    project = Path.cwd()
    (project / "opencode.json").write_text(
        json.dumps({"provider": {"evil": custom(baseURL="http://evil/v1", apiKey="k")}})
    )
    got = access(home_with(tmp_path, {}))
    assert got.upstream("opencode-evil") is None
    assert any("opencode.json provider 'evil' sets baseURL, apiKey" in n for n in got.notes)


def test_upstream_names() -> None:
    assert upstream_name("fake") == "opencode-fake"
    assert upstream_name("My.Proxy/EU") == "opencode-my-proxy-eu"
    assert len(upstream_name("x" * 200)) <= 63


# --- provision and env: the sandbox's side ---------------------------------------------------


def user_setup(tmp_path: Path) -> tuple[Path, AgentOptions]:
    cfg = {
        "model": "fake/m",
        "theme": "dark",
        "provider": {
            "fake": custom(baseURL="http://127.0.0.1:9999/v1", apiKey=KEY, headers={"X": "hv"}),
            "claude": custom("@ai-sdk/anthropic", apiKey="{env:MY_ANTHROPIC}"),
            "other": {
                "npm": "@ai-sdk/google",
                "options": {"apiKey": "g-real-key"},
                "models": {"g": {"headers": {"X-Model": "model-hv-real"}}},
            },
        },
    }
    auth = {
        "anthropic": {"type": "oauth", "access": "at-real", "refresh": "rt-real", "expires": 1},
        "openrouter": {"type": "api", "key": "or-real"},
    }
    home = home_with(tmp_path, {"opencode.json": cfg}, auth)
    (home / ".local" / "share" / "opencode" / "mcp-auth.json").write_text('{"t": "mcp-real"}')
    endpoints = {
        "opencode-fake": f"{GW}/opencode-fake",
        "opencode-claude": f"{GW}/opencode-claude",
    }
    return home, AgentOptions(endpoints=endpoints)


def test_provision_writes_gateway_and_placeholders(tmp_path: Path) -> None:
    home, opts = user_setup(tmp_path)
    seed = tmp_path / "seed"
    seed.mkdir()
    copied = OpencodeHarness().provision(home_seed=seed, host_home=home, opts=opts)
    assert copied == ["~/.config/opencode", "~/.local/share/opencode/auth.json"]
    cfg = json.loads((seed / ".config/opencode/opencode.json").read_text())
    assert cfg["model"] == "fake/m" and cfg["theme"] == "dark"
    fake = cfg["provider"]["fake"]
    assert fake["options"] == {"baseURL": f"{GW}/opencode-fake", "apiKey": PLACEHOLDER}
    assert fake["models"] == {"m": {"name": "m"}}
    claude = cfg["provider"]["claude"]["options"]
    assert claude == {"baseURL": f"{GW}/opencode-claude/v1", "apiKey": PLACEHOLDER}
    auth = json.loads((seed / ".local/share/opencode/auth.json").read_text())
    assert auth == {
        "anthropic": {
            "type": "oauth",
            "access": PLACEHOLDER,
            "refresh": PLACEHOLDER,
            "expires": FAR_EXPIRY_MS,
        },
        "openrouter": {"type": "api", "key": PLACEHOLDER},
    }
    assert not (seed / ".local/share/opencode/mcp-auth.json").exists()
    assert cfg["provider"]["other"]["options"] == {"apiKey": PLACEHOLDER}  # not routed
    for path in seed.rglob("*"):
        if path.is_file():
            text = path.read_text()
            secrets = (KEY, "hv", "at-real", "rt-real", "or-real", "mcp-real", "g-real", "model-hv")
            for secret in secrets:
                assert secret not in text, (path, secret)


def test_env_overrides_routed_providers_above_the_project(tmp_path: Path) -> None:
    home, opts = user_setup(tmp_path)
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps({"provider": {"side": custom(baseURL="http://s/v1", apiKey=KEY)}}))
    inline = {"provider": {"fake": {"options": {"headers": {"Y": "inline-secret"}}}}}
    host_env = {
        "HOME": str(home),
        "OPENCODE_CONFIG": str(extra),
        "OPENCODE_CONFIG_CONTENT": json.dumps(inline),
        "OPENCODE_AUTH_CONTENT": '{"x": {"type": "api", "key": "k"}}',
    }
    opts = AgentOptions(endpoints={**opts.endpoints, "opencode-side": f"{GW}/opencode-side"})
    harness = OpencodeHarness()
    env = harness.env(host_env, opts)
    assert "OPENCODE_AUTH_CONTENT" not in env and "OPENCODE_CONFIG" not in env
    cfg = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    providers = cfg["provider"]
    assert providers["fake"]["options"] == {"baseURL": f"{GW}/opencode-fake", "apiKey": PLACEHOLDER}
    # Defined only in the host's OPENCODE_CONFIG file: the whole definition travels inline.
    assert providers["side"]["npm"] == "@ai-sdk/openai-compatible"
    assert providers["side"]["options"]["baseURL"] == f"{GW}/opencode-side"
    assert "inline-secret" not in env["OPENCODE_CONFIG_CONTENT"]
    assert KEY not in env["OPENCODE_CONFIG_CONTENT"]
    # The user's config picks the model: no -m, no small model of so's own.
    assert "small_model" not in cfg
    assert "-m" not in harness.unattended_argv(opts)
    assert harness.unattended_argv(AgentOptions(endpoints=opts.endpoints, model="fake/m"))[-2:] == [
        "-m",
        "fake/m",
    ]


def test_config_dir_variable_is_read_after_the_files(tmp_path: Path) -> None:
    home = home_with(
        tmp_path, {"opencode.json": {"provider": {"p": custom(baseURL="http://a/v1")}}}
    )
    folder = tmp_path / "dir"
    folder.mkdir()
    (folder / "opencode.jsonc").write_text(
        '{"provider": {"p": {"options": {"baseURL": "http://z/v1"}}}}'
    )
    up = access(home, {"OPENCODE_CONFIG_DIR": str(folder)}).upstream("opencode-p")
    assert up is not None and up.base_url == "http://z/v1"


def test_wellknown_login_is_a_note_and_stays_out(tmp_path: Path) -> None:
    auth = {"https://corp.example": {"type": "wellknown", "key": "K", "token": "wk-real"}}
    home = home_with(tmp_path, {}, auth)
    got = access(home)
    assert got.refusal is None and not any(u.name.startswith("opencode-") for u in got.upstreams)
    assert any("https://corp.example" in n for n in got.notes)
    seed = tmp_path / "seed"
    seed.mkdir()
    OpencodeHarness().provision(home_seed=seed, host_home=home, opts=AgentOptions())
    assert json.loads((seed / ".local/share/opencode/auth.json").read_text()) == {}


def test_anthropic_login_refreshes_as_opencodes_plugin_does() -> None:
    refresher = REFRESHERS["anthropic"]
    assert refresher.url == "https://console.anthropic.com/v1/oauth/token" and not refresher.form
    assert refresher.body("rt") == {
        "grant_type": "refresh_token",
        "refresh_token": "rt",
        "client_id": "9d1c250a-e61b-44d9-88ed-5944d1962f5e",
    }


def test_expired_login_without_refresher_says_what_to_do(tmp_path: Path) -> None:
    login = {"type": "oauth", "access": "at", "refresh": "rt", "expires": 1000}
    cfg = {"model": "poe/m", "provider": {"poe": custom(baseURL="http://p/v1")}}
    up = access(home_with(tmp_path, {"opencode.json": cfg}, {"poe": login})).upstream(
        "opencode-poe"
    )
    assert up is not None
    with pytest.raises(CredentialError, match="login expired; run `opencode auth login`"):
        up.credential.current()
