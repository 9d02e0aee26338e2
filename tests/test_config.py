"""Layered settings with provenance: precedence, sources, durations and one-line errors."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from sono.config import (
    DEFAULT_EXCLUDE,
    KEYS,
    Config,
    Setting,
    inspect_project,
    load_config,
    parse_duration,
    parse_size,
    project_config_path,
    user_config_path,
)
from sono.errors import ConfigError
from sono.settings import flag_name
from sono.trust import TrustStore, digest


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "cfg-home"
    path.mkdir()
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def user_file(home: Path, text: str) -> Path:
    return write(home / ".config" / "so" / "config.toml", text)


def project_file(project: Path, text: str) -> Path:
    return write(project / ".so" / "config.toml", text)


def load(
    home: Path,
    project: Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, object] | None = None,
) -> Config:
    return load_config(project=project, env=env or {}, home=home, flags=flags or {})


def config_error(
    home: Path,
    project: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, object] | None = None,
) -> str:
    with pytest.raises(ConfigError) as info:
        load(home, project, env, flags)
    message = str(info.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- defaults and layers


def test_defaults_when_nothing_is_configured(home: Path, project: Path) -> None:
    config = load(home, project)
    assert (config.harness, config.iterations, config.sandbox) == ("claude", 10, "auto")
    assert (config.model, config.effort, config.agent_cmd) == (None, None, None)
    assert config.iteration_timeout == 1800.0
    assert (config.no_progress_limit, config.commit_retries) == (3, 3)
    assert config.exclude == DEFAULT_EXCLUDE
    assert config.exclude == (".env", ".env.*", ".envrc", "*.pem", "*.key", "id_*")
    assert (config.bwrap, config.pager) == (None, None)
    assert [s.source for s in config.provenance()] == ["default"] * len(KEYS)
    assert [s.key for s in config.provenance()] == list(KEYS)


def test_each_layer_overrides_the_previous(home: Path, project: Path) -> None:
    user = user_file(home, "iterations = 2\n")
    config = load(home, project)
    assert config.iterations == 2
    assert config.sources["iterations"] == Setting("iterations", 2, f"user file ({user})")

    proj = project_file(project, "iterations = 3\n")
    config = load(home, project)
    assert config.iterations == 3
    assert config.sources["iterations"].source == f"project file ({proj}, untrusted)"

    env = {"SO_ITERATIONS": "4"}
    config = load(home, project, env)
    assert config.iterations == 4
    assert config.sources["iterations"].source == "env SO_ITERATIONS"

    config = load(home, project, env, {"iterations": 5})
    assert config.iterations == 5
    assert config.sources["iterations"].source == "flag --iterations"


def test_layers_merge_key_by_key(home: Path, project: Path) -> None:
    user = user_file(home, 'model = "opus"\neffort = "low"\n')
    proj = project_file(project, 'effort = "high"\n')
    config = load(home, project, {"SO_HARNESS": "codex"})
    assert (config.model, config.effort, config.harness) == ("opus", "high", "codex")
    assert config.sources["model"].source == f"user file ({user})"
    assert config.sources["effort"].source == f"project file ({proj}, untrusted)"
    assert config.sources["harness"].source == "env SO_HARNESS"
    assert config.sources["sandbox"].source == "default"


def test_project_none_skips_the_project_file(home: Path, project: Path) -> None:
    project_file(project, "iterations = 3\n")
    assert load(home, None).iterations == 10


def test_flags_set_to_none_are_not_passed(home: Path) -> None:
    user_file(home, "iterations = 2\n")
    config = load(home, flags={"iterations": None, "model": None})
    assert config.iterations == 2
    assert config.sources["model"].source == "default"


def test_flags_accept_raw_strings_and_name_the_flag(home: Path) -> None:
    config = load(home, flags={"iteration_timeout": "1h", "no_progress_limit": "5"})
    assert config.iteration_timeout == 3600.0
    assert config.no_progress_limit == 5
    assert config.sources["iteration_timeout"].source == "flag --timeout"
    assert flag_name("agent_cmd") == "--agent-cmd"


def test_empty_string_unsets_an_optional_value(home: Path, project: Path) -> None:
    user_file(home, 'model = "opus"\n')
    proj = project_file(project, 'model = ""\n')
    config = load(home, project)
    assert config.model is None
    assert config.sources["model"].source == f"project file ({proj}, untrusted)"


def test_all_keys_from_a_file(home: Path) -> None:
    user_file(
        home,
        """
harness = "custom"
iterations = 4
sandbox = "docker"
workspace = "copy"
model = "m"
effort = "e"
agent_cmd = "my-agent --go"
iteration_timeout = "1h30m"
no_progress_limit = 2
commit_retries = 0
exclude = ["*.secret"]
bwrap = "/usr/bin/bwrap"
pager = "less -R"
max_cost = 2.5
max_tokens = 100000
docker_base = "so-base:bookworm"
enforce = "best-effort"
[network]
mode = "open"
allow = ["github.com"]
deny = ["10.0.0.0/8"]
[secrets.GH]
env = "GH_TOKEN"
hosts = ["api.github.com"]
[files]
ro = ["/srv/data"]
rw = ["/srv/scratch"]
[limits]
memory = "2g"
cpus = 1.5
pids = 256
disk = "1g"
total_time = "2h"
on_kill = "stop"
""",
    )
    config = load(home)
    assert (config.max_cost, config.max_tokens) == (2.5, 100000)
    assert config.harness == "custom"
    assert config.agent_cmd == "my-agent --go"
    assert config.iteration_timeout == 5400.0
    assert config.commit_retries == 0
    assert config.exclude == ("*.secret",)
    assert (config.bwrap, config.pager) == ("/usr/bin/bwrap", "less -R")
    assert all(s.source.startswith("user file (") for s in config.provenance())


def test_config_is_frozen(home: Path) -> None:
    config = load(home)
    with pytest.raises(FrozenInstanceError):
        config.iterations = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.sources["iterations"] = Setting("iterations", 1, "x")  # type: ignore[index]


# ---------------------------------------------------------------- env specifics


def test_seed_sandbox_env_var(home: Path) -> None:
    config = load(home, env={"SANDBOX": "docker"})
    assert config.sandbox == "docker"
    assert config.sources["sandbox"].source == "env SANDBOX"


def test_so_sandbox_wins_over_sandbox(home: Path) -> None:
    config = load(home, env={"SANDBOX": "docker", "SO_SANDBOX": "microvm"})
    assert config.sandbox == "microvm"
    assert config.sources["sandbox"].source == "env SO_SANDBOX"


def test_losing_sandbox_var_is_not_validated(home: Path) -> None:
    assert load(home, env={"SANDBOX": "", "SO_SANDBOX": "docker"}).sandbox == "docker"


def test_exclude_from_env_is_comma_separated(home: Path) -> None:
    config = load(home, env={"SO_EXCLUDE": " .env , *.pem,,secrets/** "})
    assert config.exclude == (".env", "*.pem", "secrets/**")
    assert config.sources["exclude"].source == "env SO_EXCLUDE"


def test_empty_exclude_env_turns_exclusion_off(home: Path) -> None:
    assert load(home, env={"SO_EXCLUDE": ""}).exclude == ()


def test_exclude_flag_accepts_a_list(home: Path) -> None:
    assert load(home, flags={"exclude": ["a", "b"]}).exclude == ("a", "b")


def test_exclude_in_file_may_be_a_comma_separated_string(home: Path) -> None:
    user_file(home, 'exclude = ".env, *.pem"\n')
    assert load(home).exclude == (".env", "*.pem")


def test_other_env_vars(home: Path) -> None:
    env = {
        "SO_MODEL": "sonnet",
        "SO_EFFORT": "high",
        "SO_AGENT_CMD": "agent -p",
        "SO_ITERATION_TIMEOUT": "90s",
        "SO_NO_PROGRESS_LIMIT": "1",
        "SO_COMMIT_RETRIES": "0",
        "SO_BWRAP": "/opt/bwrap",
        "PAGER": "more",  # $PAGER is the pager's fallback elsewhere, not a config layer
    }
    config = load(home, env=env)
    assert (config.model, config.effort, config.agent_cmd) == ("sonnet", "high", "agent -p")
    assert config.iteration_timeout == 90.0
    assert (config.no_progress_limit, config.commit_retries) == (1, 0)
    assert config.bwrap == "/opt/bwrap"
    assert config.pager is None


# ---------------------------------------------------------------- paths


def test_user_config_path_defaults_to_dot_config(home: Path) -> None:
    assert user_config_path({}, home) == home / ".config" / "so" / "config.toml"


def test_xdg_config_home_is_honoured(home: Path, tmp_path: Path) -> None:
    xdg = tmp_path / "xdg"
    path = write(xdg / "so" / "config.toml", "iterations = 7\n")
    env = {"XDG_CONFIG_HOME": str(xdg)}
    assert user_config_path(env, home) == path
    config = load(home, env=env)
    assert config.iterations == 7
    assert config.sources["iterations"].source == f"user file ({path})"


def test_relative_or_empty_xdg_config_home_is_ignored(home: Path) -> None:
    expected = home / ".config" / "so" / "config.toml"
    assert user_config_path({"XDG_CONFIG_HOME": "rel/dir"}, home) == expected
    assert user_config_path({"XDG_CONFIG_HOME": ""}, home) == expected


def test_project_config_path(project: Path) -> None:
    assert project_config_path(project) == project / ".so" / "config.toml"


# ---------------------------------------------------------------- errors


def test_invalid_toml_names_file_and_line(home: Path) -> None:
    path = user_file(home, 'iterations = 2\nmodel = "x\n')
    message = config_error(home)
    assert message.startswith(f"{path}: invalid TOML at line 2: ")
    assert message.endswith("Fix the syntax or move the file away.")
    assert "(at line" not in message


def test_invalid_toml_at_end_of_document_uses_last_line(home: Path) -> None:
    path = user_file(home, "iterations = 2\nmodel =")
    assert config_error(home).startswith(f"{path}: invalid TOML at line 2: Invalid value.")


def test_unknown_key_suggests_the_closest(home: Path, project: Path) -> None:
    path = project_file(project, "iteration = 3\n")
    message = config_error(home, project)
    assert message.startswith(str(path))
    assert "unknown key 'iteration'" in message
    assert "did you mean 'iterations'?" in message


def test_unknown_key_without_a_close_match_lists_known_keys(home: Path) -> None:
    path = user_file(home, "colour = 1\n")
    message = config_error(home)
    assert message.startswith(f"{path}: unknown key 'colour'")
    assert "known keys: harness, iterations, sandbox" in message


def test_unknown_table_is_an_unknown_key(home: Path) -> None:
    path = user_file(home, "[netwrk]\nallow = []\n")
    message = config_error(home)
    assert message.startswith(f"{path}: unknown table [netwrk]")


def test_known_key_as_a_table_is_a_type_error(home: Path) -> None:
    path = user_file(home, "[model]\nname = 'x'\n")
    message = config_error(home)
    assert message.startswith(f"{path}: 'model' must be a model name (")
    assert "(dict)" in message


def test_wrong_type_in_file(home: Path) -> None:
    path = user_file(home, 'iterations = "five"\n')
    message = config_error(home)
    assert message.startswith(f"""{path}: 'iterations' must be an integer >= 1, got "five" (str)""")
    assert message.endswith("e.g. iterations = 10")


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("iterations = 0", "iterations"),
        ("iterations = true", "iterations"),
        ("iterations = 2.5", "iterations"),
        ("no_progress_limit = 0", "no_progress_limit"),
        ("commit_retries = -1", "commit_retries"),
        ("sandbox = ''", "sandbox"),
        ("sandbox = 3", "sandbox"),
        ("exclude = [1]", "exclude"),
        ("exclude = ['']", "exclude"),
        ("pager = ['less']", "pager"),
        ("harness = 'cursor'", "harness"),
    ],
)
def test_bad_values_in_file_name_file_and_key(home: Path, text: str, key: str) -> None:
    path = user_file(home, text + "\n")
    message = config_error(home)
    assert message.startswith(f"{path}: '{key}' must be ")
    assert f"e.g. {key} = " in message


@pytest.mark.parametrize("value", ["'soon'", "0", "-5", "'1h30'", "true", "nan"])
def test_bad_duration_in_file(home: Path, project: Path, value: str) -> None:
    path = project_file(project, f"iteration_timeout = {value}\n")
    message = config_error(home, project)
    assert message.startswith(f"{path}: 'iteration_timeout' must be a duration > 0")
    assert 'e.g. iteration_timeout = "30m"' in message


def test_bad_env_var_names_var_and_key(home: Path) -> None:
    message = config_error(home, env={"SO_ITERATIONS": "abc"})
    assert message.startswith("SO_ITERATIONS=abc: 'iterations' must be an integer >= 1")
    assert "unset SO_ITERATIONS" in message
    assert "got" not in message  # the value is already shown next to the variable


def test_bad_env_duration(home: Path) -> None:
    message = config_error(home, env={"SO_ITERATION_TIMEOUT": "a while"})
    assert message.startswith("SO_ITERATION_TIMEOUT=a while: 'iteration_timeout' must be")


def test_env_value_with_newline_stays_on_one_line(home: Path) -> None:
    message = config_error(home, env={"SO_ITERATIONS": "1\n2"})
    assert message.startswith('SO_ITERATIONS="1\\n2": ')


def test_bad_flag_names_flag_and_key(home: Path) -> None:
    message = config_error(home, flags={"iterations": "five"})
    assert message.startswith(
        """--iterations: 'iterations' must be an integer >= 1, got "five" (str)"""
    )
    assert message.endswith("e.g. --iterations 10")


def test_bad_typed_flag(home: Path) -> None:
    message = config_error(home, flags={"commit_retries": -1})
    assert message.startswith("--commit-retries: 'commit_retries' must be an integer >= 0")
    assert "got -1 (int)" in message


def test_harness_not_in_choices_env_and_flag(home: Path) -> None:
    expected = "'harness' must be one of claude, custom, codex, opencode, pi"
    message = config_error(home, env={"SO_HARNESS": "cursor"})
    assert message.startswith("SO_HARNESS=cursor: " + expected)
    message = config_error(home, flags={"harness": "cursor"})
    assert message.startswith("--harness: " + expected)


def test_harness_choices_are_passed_in(home: Path) -> None:
    config = load_config(
        project=None,
        env={"SO_HARNESS": "aider"},
        home=home,
        flags={},
        harness_choices=("claude", "aider"),
    )
    assert config.harness == "aider"
    with pytest.raises(ConfigError, match="'harness' must be one of claude, aider"):
        load_config(
            project=None,
            env={"SO_HARNESS": "pi"},
            home=home,
            flags={},
            harness_choices=("claude", "aider"),
        )


def test_unknown_flag_key_is_a_programming_error(home: Path) -> None:
    with pytest.raises(ValueError, match="unknown config flag key 'colour'"):
        load(home, flags={"colour": "red"})


def test_unreadable_file_is_named(home: Path) -> None:
    path = home / ".config" / "so" / "config.toml"
    path.mkdir(parents=True)  # a directory: reading fails even as root
    message = config_error(home)
    assert message.startswith(f"{path}: cannot read config file (")
    assert "move it away" in message


def test_non_utf8_file_is_named(home: Path) -> None:
    path = home / ".config" / "so" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"model = '\xff'\n")
    assert config_error(home).startswith(f"{path}: config file is not UTF-8 text")


def test_errors_in_a_lower_layer_are_reported_even_when_overridden(home: Path) -> None:
    # A broken file is broken no matter what overrides it; silently ignoring it is seed A's bug.
    user_file(home, "iterations = 0\n")
    with pytest.raises(ConfigError, match="'iterations'"):
        load(home, flags={"iterations": 3})


# ---------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30m", 1800.0),
        ("90s", 90.0),
        ("45s", 45.0),
        ("2h", 7200.0),
        ("1h30m", 5400.0),
        ("1h 30m 15s", 5415.0),
        ("7d", 604800.0),
        ("1d12h", 129600.0),
        ("1.5h", 5400.0),
        (" 2H ", 7200.0),
        ("1800", 1800.0),
        ("2.5", 2.5),
        ("0", 0.0),
        (1800, 1800.0),
        (0.5, 0.5),
    ],
)
def test_parse_duration(text: str | int | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "soon",
        "m",
        "1h30",
        "30m1h",
        "-5",
        "-5m",
        "1w",
        "1.h",
        "inf",
        True,
        -1,
        float("nan"),
        float("inf"),
    ],
)
def test_parse_duration_rejects_junk(text: str | int | float) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


def test_iteration_timeout_int_in_file_is_stored_as_float(home: Path) -> None:
    user_file(home, "iteration_timeout = 600\n")
    value = load(home).iteration_timeout
    assert value == 600.0
    assert isinstance(value, float)


# ---------------------------------------------------------------- JSON


def test_to_json_shape(home: Path) -> None:
    path = user_file(home, 'model = "opus"\n')
    data = load(home, env={"SO_ITERATIONS": "4"}).to_json()
    assert list(data) == list(KEYS)
    assert data["iterations"] == {"value": 4, "source": "env SO_ITERATIONS"}
    assert data["model"] == {"value": "opus", "source": f"user file ({path})"}
    assert data["effort"] == {"value": None, "source": "default"}
    assert data["exclude"] == {"value": list(DEFAULT_EXCLUDE), "source": "default"}
    assert data["iteration_timeout"]["value"] == 1800.0
    assert json.loads(json.dumps(data)) == data


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SO_MAX_COST": "1.5", "SO_MAX_TOKENS": "5000"}, (1.5, 5000)),
        ({"SO_MAX_COST": "", "SO_MAX_TOKENS": ""}, (None, None)),
        ({}, (None, None)),
    ],
)
def test_budget_keys(home: Path, env: dict[str, str], expected: tuple[object, object]) -> None:
    config = load(home, env=env)
    assert (config.max_cost, config.max_tokens) == expected


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"SO_MAX_COST": "-1"}, "max_cost"),
        ({"SO_MAX_COST": "lots"}, "max_cost"),
        ({"SO_MAX_TOKENS": "1.5"}, "max_tokens"),
        ({"SO_MAX_TOKENS": "0"}, "max_tokens"),
    ],
)
def test_bad_budget_is_a_clear_error(home: Path, env: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        load(home, env=env)


def test_is_default(home: Path) -> None:
    config = load(home, env={"SO_EFFORT": "high"})
    assert not config.is_default("effort") and config.is_default("model")


def test_policy_tables_sizes_and_aliases(home: Path) -> None:
    user_file(
        home,
        """
[network]
allow = ["github.com", ".npmjs.org", "192.168.1.0/24"]
[files]
hide = ["*.secret"]
[limits]
memory = "512m"
iteration_time = "10m"
""",
    )
    config = load(home)
    assert config.network_mode == "allowlist"  # the default: the model API only
    assert config.network_allow == ("github.com", ".npmjs.org", "192.168.1.0/24")
    assert config.memory == 512 * 1024 * 1024
    assert config.exclude == ("*.secret",)  # files.hide is the exclude list
    assert config.iteration_timeout == 600.0
    assert config.sources["network.allow"].source.startswith("user file (")
    assert config.sources["exclude"].source.startswith("user file (")


def test_secrets_need_a_source_and_hosts(home: Path) -> None:
    user_file(home, '[secrets.GH]\nenv = "GH_TOKEN"\nhosts = ["api.github.com"]\n')
    (secret,) = load(home).secrets
    assert (secret.name, secret.env, secret.file, secret.hosts) == (
        "GH",
        "GH_TOKEN",
        None,
        ("api.github.com",),
    )
    for bad in (
        '[secrets.GH]\nenv = "GH_TOKEN"\n',  # no hosts
        '[secrets.GH]\nenv = "A"\nfile = "/x"\nhosts = ["a.b"]\n',  # both sources
        '[secrets.GH]\nenv = "A"\nhosts = ["not a host"]\n',
    ):
        user_file(home, bad)
        assert "'secrets' must be a table of [secrets.NAME]" in config_error(home)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[network]\nmode = "closed"\n', "'network.mode' must be one of none, allowlist, open"),
        ('[network]\nallow = ["http://x.org"]\n', "'network.allow' must be a list of hosts"),
        ('[limits]\nmemory = "lots"\n', "'limits.memory' must be a size"),
        ("[limits]\npids = 3\n", "'limits.pids' must be an integer >= 16"),
        ('[files]\nro = ["relative/path"]\n', "'files.ro' must be a list of absolute host paths"),
        ("[network]\nport = 1\n", "unknown key 'network.port'"),
    ],
)
def test_bad_policy_is_one_clear_line(home: Path, text: str, needle: str) -> None:
    user_file(home, text)
    message = config_error(home)
    assert needle in message
    assert "\n" not in message


def test_policy_flags_and_env(home: Path) -> None:
    config = load_config(
        project=None,
        env={"SO_NETWORK_DENY": "evil.example", "SO_LIMIT_PIDS": "64"},
        home=home,
        flags={"network.mode": "none", "network.allow": "a.example,b.example"},
    )
    assert config.network_mode == "none"
    assert config.network_allow == ("a.example", "b.example")
    assert config.network_deny == ("evil.example",)
    assert config.pids == 64
    assert config.sources["network.mode"].source == "flag --network"
    assert config.sources["limits.pids"].source == "env SO_LIMIT_PIDS"


def test_sizes() -> None:
    assert parse_size("4g") == 4 << 30
    assert parse_size("1.5GiB") == int(1.5 * (1 << 30))
    assert parse_size(1024) == 1024
    for bad in ("", "-1g", "4 apples", True, 0):
        with pytest.raises(ValueError):
            parse_size(bad)


# ---------------------------------------------------------------- project-file trust

# Every key and what a project file may do with it (sono.trust). A new key must be added
# here: its classification is a decision, not a default.
TRUST_KINDS = {
    "harness": "policy",
    "iterations": "safe",
    "sandbox": "policy",
    "workspace": "safe",
    "model": "safe",
    "effort": "safe",
    "agent_cmd": "host",
    "iteration_timeout": "safe",
    "no_progress_limit": "safe",
    "commit_retries": "safe",
    "exclude": "policy",
    "bwrap": "host",
    "pager": "host",
    "docker_base": "host",
    "max_cost": "policy",
    "network.mode": "policy",
    "network.allow": "policy",
    "network.deny": "policy",
    "secrets": "policy",
    "files.ro": "policy",
    "files.rw": "policy",
    "limits.memory": "policy",
    "limits.cpus": "policy",
    "limits.pids": "policy",
    "limits.disk": "policy",
    "limits.total_time": "policy",
    "limits.on_kill": "policy",
    "enforce": "policy",
    "max_tokens": "policy",
}


def test_every_key_is_classified() -> None:
    from sono.config import _specs

    assert {key: spec.trust.kind for key, spec in _specs(("claude",)).items()} == TRUST_KINDS


@pytest.fixture
def store(tmp_path: Path) -> TrustStore:
    return TrustStore(tmp_path / "so-state" / "trust.json")


def load_trusting(
    home: Path, project: Path, store: TrustStore, env: Mapping[str, str] | None = None
) -> Config:
    return load_config(project=project, env=env or {}, home=home, flags={}, trust=store)


def refusal(home: Path, project: Path, store: TrustStore) -> str:
    with pytest.raises(ConfigError) as info:
        load_trusting(home, project, store)
    message = str(info.value)
    assert "\n" not in message
    return message


SAFE_PROJECT = """
harness = "custom"
iterations = 3
workspace = "copy"
model = "opus"
effort = "high"
iteration_timeout = "2h"
no_progress_limit = 5
commit_retries = 1
exclude = [".env", ".env.*", ".envrc", "*.pem", "*.key", "id_*", "*.sqlite"]
[network]
mode = "none"
deny = ["evil.example"]
[limits]
memory = "1g"
pids = 64
on_kill = "stop"
"""


def test_safe_and_tightening_keys_apply_without_trust(
    home: Path, project: Path, store: TrustStore
) -> None:
    path = project_file(project, SAFE_PROJECT)
    config = load_trusting(home, project, store)
    assert (config.harness, config.iterations, config.model) == ("custom", 3, "opus")
    assert (config.network_mode, config.network_deny) == ("none", ("evil.example",))
    assert (config.memory, config.pids, config.on_kill) == (1 << 30, 64, "stop")
    assert "*.sqlite" in config.exclude
    assert config.sources["limits.memory"].source == (f"project file ({path}, untrusted)")
    assert config.project_file is not None
    assert not config.project_file.trusted and config.project_file.findings == ()


# (project file, user file, the key the refusal must name)
NEEDS_TRUST = [
    ("pager = \"sh -c 'touch /tmp/PWNED'\"\n", "", "pager"),
    ('bwrap = "/tmp/evil"\n', "", "bwrap"),
    ('agent_cmd = "sh -c evil"\n', "", "agent_cmd"),
    ('docker_base = "evil/image"\n', "", "docker_base"),
    ('harness = "codex"\n', "", "harness"),
    ('sandbox = "bwrap"\n', 'sandbox = "microvm"\n', "sandbox"),
    ('network.mode = "open"\n', "", "network.mode"),
    ('[network]\nmode = "allowlist"\n', '[network]\nmode = "none"\n', "network.mode"),
    ('network.allow = ["evil.example"]\n', "", "network.allow"),
    ("network.deny = []\n", 'network.deny = ["evil.example"]\n', "network.deny"),
    ('[secrets.K]\nfile = "~/.ssh/id_ed25519"\nhosts = ["evil.example"]\n', "", "secrets"),
    ('files.ro = ["/"]\n', "", "files.ro"),
    ('files.rw = ["/root"]\n', "", "files.rw"),
    ('exclude = ["*.pem"]\n', "", "exclude"),
    ("[files]\nhide = []\n", "", "exclude"),
    ('limits.memory = "8g"\n', 'limits.memory = "1g"\n', "limits.memory"),
    ('limits.memory = ""\n', 'limits.memory = "1g"\n', "limits.memory"),
    ("limits.pids = 100000\n", "limits.pids = 64\n", "limits.pids"),
    ('limits.total_time = "30d"\n', 'limits.total_time = "1h"\n', "limits.total_time"),
    ('limits.on_kill = "continue"\n', 'limits.on_kill = "stop"\n', "limits.on_kill"),
    ('enforce = "best-effort"\n', "", "enforce"),
    ("max_cost = 500.0\n", "max_cost = 5.0\n", "max_cost"),
    ("max_tokens = 1000000000\n", "max_tokens = 1000\n", "max_tokens"),
]


@pytest.mark.parametrize(("text", "user", "key"), NEEDS_TRUST)
def test_untrusted_keys_that_need_trust_are_refused_with_one_line(
    home: Path, project: Path, store: TrustStore, text: str, user: str, key: str
) -> None:
    if user:
        user_file(home, user)
    path = project_file(project, "iterations = 2\n" + text)
    message = refusal(home, project, store)
    assert message.startswith(f"{path} is not trusted and sets keys that ")
    assert f"({key}" in message or f" {key}:" in message
    assert "iterations" not in message  # a safe key is not blamed
    assert "then run `so trust`" in message


@pytest.mark.parametrize(("text", "user", "key"), NEEDS_TRUST)
def test_the_same_keys_apply_once_trusted(
    home: Path, project: Path, store: TrustStore, text: str, user: str, key: str
) -> None:
    if user:
        user_file(home, user)
    path = project_file(project, text)
    store.trust(project, digest(path.read_bytes()), file=path)
    config = load_trusting(home, project, store)
    assert config.sources[key].source == f"project file ({path}, trusted)"


@pytest.mark.parametrize(("text", "user", "key"), NEEDS_TRUST)
def test_the_same_keys_in_the_user_file_need_no_trust(
    home: Path, project: Path, store: TrustStore, text: str, user: str, key: str
) -> None:
    user_file(home, text)
    assert load_trusting(home, project, store).sources[key].source.startswith("user file")


def test_any_change_makes_the_file_untrusted_again(
    home: Path, project: Path, store: TrustStore
) -> None:
    path = project_file(project, 'pager = "less -R"\n')
    store.trust(project, digest(path.read_bytes()), file=path)
    assert load_trusting(home, project, store).pager == "less -R"
    path.write_text('pager = "less -R" \n')  # one byte more
    message = refusal(home, project, store)
    assert "changed since you trusted it" in message
    store.revoke(project)
    assert "is not trusted" in refusal(home, project, store)


def test_trust_is_per_project(home: Path, tmp_path: Path, store: TrustStore) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    for p in (one, two):
        project_file(p, 'pager = "less -R"\n')
    store.trust(one, digest((one / ".so" / "config.toml").read_bytes()), file=one)
    assert load_trusting(home, one, store).pager == "less -R"
    assert "is not trusted" in refusal(home, two, store)


def test_a_value_equal_to_the_layers_below_needs_no_trust(
    home: Path, project: Path, store: TrustStore
) -> None:
    user_file(home, 'pager = "less -R"\nnetwork.allow = ["a.example", "b.example"]\n')
    project_file(project, 'pager = "less -R"\nnetwork.allow = ["b.example"]\n')
    config = load_trusting(home, project, store)
    assert (config.pager, config.network_allow) == ("less -R", ("b.example",))


def test_a_key_an_env_var_or_flag_overrides_needs_no_trust(
    home: Path, project: Path, store: TrustStore
) -> None:
    project_file(project, 'bwrap = "/tmp/evil"\nnetwork.mode = "open"\n')
    config = load_config(
        project=project,
        env={"SO_BWRAP": "/usr/bin/bwrap"},
        home=home,
        flags={"network.mode": "none"},
        trust=store,
    )
    assert (config.bwrap, config.network_mode) == ("/usr/bin/bwrap", "none")
    message = refusal(home, project, store)
    assert "bwrap" in message and "network.mode" in message


def test_inspect_project_reports_without_refusing(
    home: Path, project: Path, store: TrustStore
) -> None:
    assert inspect_project(project=project, env={}, home=home, trust=store) is None
    path = project_file(project, 'iterations = 2\npager = "x"\nfiles.rw = ["/root"]\n')
    pf = inspect_project(project=project, env={}, home=home, trust=store)
    assert pf is not None
    assert (pf.path, pf.trusted, pf.changed) == (path, False, False)
    assert pf.sha256 == digest(path.read_bytes())
    assert [f.key for f in pf.findings] == ["pager", "files.rw"]


def test_an_invalid_untrusted_file_is_still_a_config_error(
    home: Path, project: Path, store: TrustStore
) -> None:
    project_file(project, "pager = 3\n")
    assert "'pager' must be" in refusal(home, project, store)


def test_control_characters_from_the_file_are_shown_inert(
    home: Path, project: Path, store: TrustStore
) -> None:
    project_file(project, 'files.rw = ["/tmp/\\u001b]52;c;evil\\u0007\\u009b"]\n')
    message = refusal(home, project, store)
    assert "\x1b" not in message and "\x07" not in message and "\x9b" not in message
    assert "<U+009B>" in message  # C1 CSI; JSON quoting already escaped ESC and BEL


def test_a_symlinked_project_file_is_not_followed(
    home: Path, project: Path, store: TrustStore, tmp_path: Path
) -> None:
    target = write(tmp_path / "elsewhere.toml", "iterations = 2\n")
    (project / ".so").mkdir()
    (project / ".so" / "config.toml").symlink_to(target)
    assert "is a symbolic link" in refusal(home, project, store)


def test_a_symlinked_project_dir_is_not_followed(
    home: Path, project: Path, store: TrustStore, tmp_path: Path
) -> None:
    write(tmp_path / "elsewhere" / "config.toml", "iterations = 2\n")
    (project / ".so").symlink_to(tmp_path / "elsewhere")
    message = refusal(home, project, store)
    assert "is a symbolic link" in message and message.startswith(f"{project / '.so'}:")


def test_a_fifo_or_huge_project_file_is_refused_without_hanging(
    home: Path, project: Path, store: TrustStore
) -> None:
    (project / ".so").mkdir()
    os.mkfifo(project / ".so" / "config.toml")
    assert "not a regular file" in refusal(home, project, store)
    (project / ".so" / "config.toml").unlink()
    project_file(project, "#" * (2 << 20))
    assert "larger than 1 MiB" in refusal(home, project, store)


def test_a_project_file_that_is_a_directory_is_an_error(
    home: Path, project: Path, store: TrustStore
) -> None:
    (project / ".so" / "config.toml").mkdir(parents=True)
    assert "config.toml" in refusal(home, project, store)


def test_secrets_show_in_json_as_where_they_come_from(home: Path) -> None:
    user_file(home, '[secrets.GH]\nenv = "GH_TOKEN"\nhosts = ["api.github.com"]\n')
    shown = json.dumps(load(home).to_json()["secrets"])
    assert json.loads(shown)["value"] == [
        {"name": "GH", "env": "GH_TOKEN", "file": None, "hosts": ["api.github.com"]}
    ]


@pytest.mark.parametrize("model", ["--dangerously-skip-permissions", "-x", "a b", "m\x1b[2J"])
def test_a_model_is_one_name_that_no_option_parser_reads_as_an_option(
    home: Path, project: Path, model: str
) -> None:
    project_file(project, f"model = {json.dumps(model)}\n")
    assert "'model' must be a model name" in config_error(home, project)


def test_model_names_with_slashes_and_dots_are_fine(home: Path) -> None:
    config = load(home, env={"SO_MODEL": "openrouter/anthropic/claude-3.5:beta"})
    assert config.model == "openrouter/anthropic/claude-3.5:beta"
