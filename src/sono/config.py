"""Layered settings with provenance.

Layers, later wins: defaults < user file (``$XDG_CONFIG_HOME/so/config.toml``) < project
file (``<project>/.so/config.toml``) < environment variables < command-line flags.

Every resolved value remembers the layer it came from (:class:`Setting`) so ``so config``
can show it. Unknown keys and bad values raise :class:`~sono.errors.ConfigError` with one
line naming the file (or env var, or flag), the key and the fix. Nothing here prints or
keeps global state; the caller passes ``env`` and ``home`` so tests never see the real ones.
Each key's env vars and flag are in :mod:`sono.settings`; the values it takes are here.
"""

from __future__ import annotations

import difflib
import errno
import json
import math
import os
import re
import shlex
import stat
import tomllib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

from sono import trust as t
from sono.errors import ConfigError
from sono.net.secrets import Secret
from sono.settings import BY_KEY, flag_name
from sono.textsafe import for_terminal
from sono.trust import Rule, TrustStore

DEFAULT_HARNESSES: tuple[str, ...] = ("claude", "custom", "codex", "opencode", "pi")
DEFAULT_EXCLUDE: tuple[str, ...] = (".env", ".env.*", ".envrc", "*.pem", "*.key", "id_*")

_T = TypeVar("_T")
_Parse = Callable[[object], object]


@dataclass(frozen=True)
class Setting:
    """One resolved setting and where it came from.

    ``source`` is ``"default"``, ``"user file (<path>)"``, ``"project file (<path>)"``,
    ``"env SO_X"`` or ``"flag --x"``.
    """

    key: str
    value: object
    source: str


@dataclass(frozen=True)
class Config:
    """The resolved settings; ``sources`` maps every key to its :class:`Setting`."""

    harness: str
    iterations: int
    sandbox: str
    workspace: str
    model: str | None
    effort: str | None
    agent_cmd: str | None
    iteration_timeout: float
    no_progress_limit: int
    commit_retries: int
    exclude: tuple[str, ...]
    bwrap: str | None
    pager: str | None
    docker_base: str | None
    max_cost: float | None
    max_tokens: int | None
    network_mode: str
    network_allow: tuple[str, ...]
    network_deny: tuple[str, ...]
    secrets: tuple[Secret, ...]
    files_ro: tuple[str, ...]
    files_rw: tuple[str, ...]
    memory: int | None
    cpus: float | None
    pids: int | None
    disk: int | None
    total_time: float | None
    on_kill: str
    enforce: str
    sources: Mapping[str, Setting]
    project_file: ProjectFile | None = None

    def is_default(self, key: str) -> bool:
        """True when no file, env var or flag set ``key``."""
        return self.sources[key].source == "default"

    def provenance(self) -> list[Setting]:
        """Every setting with its source, in the documented key order."""
        return list(self.sources.values())

    def to_json(self) -> dict[str, dict[str, object]]:
        """``{key: {"value": ..., "source": ...}}``, ready for ``json.dumps``."""
        return {
            key: {"value": _jsonable(s.value), "source": s.source}
            for key, s in self.sources.items()
        }


# ---------------------------------------------------------------- durations

_NUMBER = r"[0-9]+(?:\.[0-9]+)?"
_UNIT_SECONDS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_DURATION = re.compile(
    "".join(rf"(?:(?P<{unit}>{_NUMBER})\s*{unit}\s*)?" for unit in _UNIT_SECONDS)
)


def parse_duration(text: str | int | float) -> float:
    """Seconds in ``text``: a plain number, or units d/h/m/s in that order ("1h30m", "7d").

    Raises ValueError on anything else, including negative, infinite or NaN values.
    """
    if isinstance(text, bool):
        raise ValueError(f"invalid duration {text!r}: expected seconds, not a boolean")
    if isinstance(text, int | float):
        return _finite_seconds(float(text), text)
    stripped = text.strip().lower()
    if re.fullmatch(_NUMBER, stripped):
        return float(stripped)
    match = _DURATION.fullmatch(stripped)
    if not stripped or match is None:
        raise ValueError(
            f"invalid duration {text!r}: use seconds or a number with a unit, "
            "like 90s, 30m, 2h, 1h30m or 7d"
        )
    parts = match.groupdict()
    return sum(float(parts[u] or 0) * secs for u, secs in _UNIT_SECONDS.items())


def _finite_seconds(seconds: float, original: object) -> float:
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"invalid duration {original!r}: must be a finite number >= 0")
    return seconds


# ---------------------------------------------------------------- value parsers
# Each parser returns the typed value or raises ValueError; the caller turns that into
# a ConfigError naming the layer, using the spec's ``expect`` text.


def _int_at_least(minimum: int) -> _Parse:
    def parse(value: object) -> int:
        if isinstance(value, str) and re.fullmatch(r"\s*[0-9]+\s*", value):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError
        return value

    return parse


def _choice(choices: Sequence[str]) -> _Parse:
    def parse(value: object) -> str:
        if not isinstance(value, str) or value not in choices:
            raise ValueError
        return value

    return parse


def _text(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError
    return value.strip()


def _optional_text(value: object) -> str | None:
    # TOML has no null: an empty string unsets a value a lower layer set.
    if not isinstance(value, str):
        raise ValueError
    return value.strip() or None


def _optional_name(value: object) -> str | None:
    """A name passed as one argument (``--model NAME``): never something a harness's
    option parser could read as another option."""
    name = _optional_text(value)
    if name is not None and (
        name.startswith("-") or not re.fullmatch(r"[^\s\x00-\x1f\x7f-\x9f]+", name)
    ):
        raise ValueError
    return name


def _timeout(value: object) -> float:
    if not isinstance(value, str | int | float):
        raise ValueError
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError
    return seconds


def _optional_number(kind: type[int] | type[float]) -> _Parse:
    """A positive number, or unset (None / empty string)."""

    def parse(value: object) -> int | float | None:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if isinstance(value, str):
            value = float(value) if kind is float else int(value)  # ValueError on junk
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError
        if kind is int and not isinstance(value, int):
            raise ValueError
        if not math.isfinite(value) or value <= 0:
            raise ValueError
        return kind(value)

    return parse


def _patterns(value: object) -> tuple[str, ...]:
    if isinstance(value, str):  # env / flag form: comma-separated
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, list | tuple) and all(isinstance(p, str) and p.strip() for p in value):
        return tuple(p.strip() for p in value)
    raise ValueError


_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)i?b?\s*", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value: object) -> int:
    """Bytes in ``value``: an integer, or a number with k/m/g/t ("512m", "4g", "1.5GiB")."""
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, int):
        if value <= 0:
            raise ValueError
        return value
    if not isinstance(value, str):
        raise ValueError
    match = _SIZE.fullmatch(value)
    if match is None or float(match[1]) <= 0:
        raise ValueError
    return int(float(match[1]) * _SIZE_UNITS[match[2].lower()])


def _optional(parse: _Parse) -> _Parse:
    """``parse``, or unset for None / an empty string (TOML has no null)."""

    def wrapped(value: object) -> object:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        return parse(value)

    return wrapped


def _hosts(value: object) -> tuple[str, ...]:
    """Network policy entries: a host, a ``.suffix`` or an IP/CIDR (see sono.net.policy)."""
    from sono.net.policy import parse_entry

    entries = _patterns(value) if value != [] else ()
    for entry in entries:
        parse_entry(entry)  # ValueError on garbage
    return entries


def _paths(value: object) -> tuple[str, ...]:
    paths = _patterns(value) if value != [] else ()
    for path in paths:
        if not Path(path).expanduser().is_absolute():
            raise ValueError
    return tuple(str(Path(p).expanduser()) for p in paths)


_SECRET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _secret_headers(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        raise ValueError
    if not all(isinstance(h, str) and _HEADER_NAME.fullmatch(h) for h in value):
        raise ValueError
    return tuple(dict.fromkeys(h.lower() for h in value))


def _secrets(value: object) -> tuple[Secret, ...]:
    if not isinstance(value, dict):
        raise ValueError
    out = []
    for name, spec in value.items():
        if not _SECRET_NAME.fullmatch(name) or not isinstance(spec, dict):
            raise ValueError
        if set(spec) - {"env", "file", "hosts", "headers"} or ("env" in spec) == ("file" in spec):
            raise ValueError
        source = spec.get("env", spec.get("file"))
        if not isinstance(source, str) or not source.strip():
            raise ValueError
        hosts = _hosts(spec.get("hosts", []))
        if not hosts:
            raise ValueError
        file = str(Path(source).expanduser()) if "file" in spec else None
        headers = _secret_headers(spec.get("headers"))
        out.append(Secret(name, source if "env" in spec else None, file, hosts, headers))
    return tuple(out)


# ---------------------------------------------------------------- the key table


@dataclass(frozen=True)
class _Spec:
    """What values a key takes; how a user names it (env vars, flag) is
    :data:`sono.settings.OPTIONS`."""

    key: str
    default: object
    parse: _Parse
    expect: str
    example: object
    # What a project file may set without the user's trust (see sono.trust).
    trust: Rule = field(kw_only=True)


def _specs(harness_choices: Sequence[str]) -> dict[str, _Spec]:
    specs = [
        _Spec(
            "harness",
            "claude",
            _choice(harness_choices),
            f"one of {', '.join(harness_choices)}",
            "claude",
            # Each harness spends its own login or key from your home (through the gateway).
            trust=t.same_or("custom", "spends its login or key from your home"),
        ),
        _Spec(
            "iterations",
            10,
            _int_at_least(1),
            "an integer >= 1",
            10,
            trust=t.safe(),
        ),
        _Spec(
            "sandbox",
            "auto",
            _choice(("auto", "bwrap", "docker", "microvm")),
            "one of auto, bwrap, docker, microvm",
            "docker",
            trust=t.unless_chosen("auto"),
        ),
        _Spec(
            "workspace",
            "auto",
            _choice(("auto", "overlay", "copy")),
            "one of auto, overlay, copy",
            "copy",
            trust=t.safe(),
        ),
        # Safe in a project file because it is only ever one argv value of the harness.
        _Spec(
            "model",
            None,
            _optional_name,
            "a model name (no spaces or control characters, not starting with '-')",
            "opus",
            trust=t.safe(),
        ),
        _Spec("effort", None, _optional_text, "a string", "high", trust=t.safe()),
        _Spec(
            "agent_cmd",
            None,
            _optional_text,
            "a command-line string",
            "my-agent",
            trust=t.host("runs on your host in so plan and so learn"),
        ),
        _Spec(
            "iteration_timeout",
            1800.0,
            _timeout,
            'a duration > 0 (seconds, or like "90s", "30m", "1h30m")',
            "30m",
            trust=t.safe(),
        ),
        _Spec(
            "no_progress_limit",
            3,
            _int_at_least(1),
            "an integer >= 1",
            3,
            trust=t.safe(),
        ),
        _Spec(
            "commit_retries",
            3,
            _int_at_least(0),
            "an integer >= 0",
            3,
            trust=t.safe(),
        ),
        _Spec(
            "exclude",
            DEFAULT_EXCLUDE,
            _patterns,
            "a list of non-empty glob strings",
            [".env", "*.pem"],
            trust=t.superset(),
        ),
        _Spec(
            "bwrap",
            None,
            _optional_text,
            "a path string",
            "/usr/bin/bwrap",
            trust=t.host("runs on your host"),
        ),
        _Spec(
            "pager",
            None,
            _optional_text,
            "a command-line string",
            "less -R",
            trust=t.host("runs on your host"),
        ),
        _Spec(
            "docker_base",
            None,
            _optional_text,
            "an image reference",
            "debian:bookworm-slim",
            trust=t.host("your Docker engine pulls it and builds the runner image from it"),
        ),
        _Spec(
            "max_cost",
            None,
            _optional_number(float),
            "a number of dollars > 0",
            5.0,
            trust=t.at_most(),
        ),
        _Spec(
            "network.mode",
            "allowlist",
            _choice(("none", "allowlist", "open")),
            "one of none, allowlist, open",
            "allowlist",
            trust=t.ordered(("none", "allowlist", "open")),
        ),
        _Spec(
            "network.allow",
            (),
            _hosts,
            "a list of hosts, .suffixes or IP/CIDR ranges",
            ["github.com", ".npmjs.org"],
            trust=t.subset(),
        ),
        _Spec(
            "network.deny",
            (),
            _hosts,
            "a list of hosts, .suffixes or IP/CIDR ranges",
            ["evil.example"],
            trust=t.superset(),
        ),
        _Spec(
            "secrets",
            (),
            _secrets,
            'a table of [secrets.NAME] with env = "VAR" or file = "PATH", hosts = [...] '
            "and optionally headers = [...] (header names)",
            {"GH_TOKEN": {"env": "GH_TOKEN", "hosts": ["api.github.com"]}},
            trust=t.subset(),
        ),
        _Spec(
            "files.ro",
            (),
            _paths,
            "a list of absolute host paths",
            ["~/datasets"],
            trust=t.subset(),
        ),
        _Spec(
            "files.rw",
            (),
            _paths,
            "a list of absolute host paths",
            ["/srv/scratch"],
            trust=t.subset(),
        ),
        _Spec(
            "limits.memory",
            None,
            _optional(parse_size),
            'a size like "4g" or "512m"',
            "4g",
            trust=t.at_most(),
        ),
        _Spec(
            "limits.cpus",
            None,
            _optional_number(float),
            "a number of CPUs > 0",
            2,
            trust=t.at_most(),
        ),
        _Spec(
            "limits.pids",
            None,
            _optional(_int_at_least(16)),
            "an integer >= 16",
            512,
            trust=t.at_most(),
        ),
        _Spec(
            "limits.disk",
            None,
            _optional(parse_size),
            'a size like "10g"',
            "10g",
            trust=t.at_most(),
        ),
        _Spec(
            "limits.total_time",
            None,
            _optional(_timeout),
            'a duration > 0, like "4h"',
            "4h",
            trust=t.at_most(),
        ),
        _Spec(
            "limits.on_kill",
            "continue",
            _choice(("continue", "stop")),
            "one of continue, stop",
            "stop",
            trust=t.ordered(("stop", "continue")),
        ),
        _Spec(
            "enforce",
            "strict",
            _choice(("strict", "best-effort")),
            "one of strict, best-effort",
            "strict",
            trust=t.ordered(("strict", "best-effort")),
        ),
        _Spec(
            "max_tokens",
            None,
            _optional_number(int),
            "an integer > 0",
            2_000_000,
            trust=t.at_most(),
        ),
    ]
    return {spec.key: spec for spec in specs}


KEYS: tuple[str, ...] = tuple(_specs(DEFAULT_HARNESSES))


# ---------------------------------------------------------------- paths


def user_config_path(env: Mapping[str, str], home: Path) -> Path:
    """``$XDG_CONFIG_HOME/so/config.toml``; a relative XDG value is ignored, as the spec says."""
    xdg = env.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else home / ".config"
    return base / "so" / "config.toml"


def project_config_path(project: Path) -> Path:
    """``<project>/.so/config.toml``."""
    return project / ".so" / "config.toml"


# ---------------------------------------------------------------- loading


@dataclass(frozen=True)
class ProjectFile:
    """A project's ``.so/config.toml`` as read: the sha256 of its bytes, whether the user
    trusted exactly this content (``so trust``), and the keys that need that trust."""

    path: Path
    project: Path
    sha256: str
    trusted: bool
    changed: bool  # trusted once, with another content
    findings: tuple[t.Finding, ...]

    @property
    def label(self) -> str:
        return "trusted" if self.trusted else "untrusted"


def load_config(
    *,
    project: Path | None,
    env: Mapping[str, str],
    home: Path,
    flags: Mapping[str, object],
    harness_choices: Sequence[str] = DEFAULT_HARNESSES,
    trust: TrustStore | None = None,
) -> Config:
    """Resolve every setting across the five layers; raise ConfigError on bad input, and
    when an untrusted project file sets a key that needs trust (see :mod:`sono.trust`).

    ``flags`` maps keys to the values the user passed (typed or raw strings); ``None``
    means "not passed". ``trust`` defaults to the store under ``$SO_HOME``.
    """
    specs = _specs(harness_choices)
    settings = _lower_layers(specs, env, home)
    read = None if project is None else _project_layer(project, specs, settings, trust, env)
    env_layer = _env_layer(env, specs)
    flag_layer = _flag_layer(flags, specs)
    if read is not None:
        project_file, layer = read
        _require_trust(project_file, overridden=env_layer.keys() | flag_layer.keys())
        settings.update(layer)
    settings.update(env_layer)
    settings.update(flag_layer)
    return _build(settings, None if read is None else read[0])


def inspect_project(
    *,
    project: Path,
    env: Mapping[str, str],
    home: Path,
    harness_choices: Sequence[str] = DEFAULT_HARNESSES,
    trust: TrustStore | None = None,
) -> ProjectFile | None:
    """The project file, its hash, trust and findings, without refusing it (``so trust``).
    None when the project has no ``.so/config.toml``; ConfigError when it is invalid."""
    specs = _specs(harness_choices)
    read = _project_layer(project, specs, _lower_layers(specs, env, home), trust, env)
    return None if read is None else read[0]


def _lower_layers(
    specs: Mapping[str, _Spec], env: Mapping[str, str], home: Path
) -> dict[str, Setting]:
    """Defaults and the user file: what a project file is compared against."""
    settings = {key: Setting(key, spec.default, "default") for key, spec in specs.items()}
    settings.update(_file_layer(user_config_path(env, home), "user file", specs))
    return settings


def _project_layer(
    project: Path,
    specs: Mapping[str, _Spec],
    lower: Mapping[str, Setting],
    store: TrustStore | None,
    env: Mapping[str, str],
) -> tuple[ProjectFile, dict[str, Setting]] | None:
    path = project_config_path(project)
    data = _read_project_bytes(path)
    if data is None:
        return None
    values = _values(path, _parse_toml(path, _decode(path, data)), specs)
    sha256 = t.digest(data)
    known = (store or TrustStore.default(env)).trusted_digest(project)
    found = t.findings(
        values,
        {key: s.value for key, s in lower.items()},
        {key: spec.trust for key, spec in specs.items()},
    )
    pf = ProjectFile(path, project, sha256, known == sha256, known not in (None, sha256), found)
    source = f"project file ({path}, {pf.label})"
    return pf, {key: Setting(key, value, source) for key, value in values.items()}


def _require_trust(pf: ProjectFile, *, overridden: Collection[str]) -> None:
    """Refuse an untrusted file that sets a key needing trust (one an env var or flag
    overrides is never used, so it needs none). Never half-applied: all or an error."""
    needed = [f for f in pf.findings if f.key not in overridden]
    if needed and not pf.trusted:
        raise _fail(t.untrusted_message(pf.path, pf.project, needed, changed=pf.changed))


# Tables whose keys are settings of their own (``[network] mode = ...`` is ``network.mode``).
TABLES = ("network", "files", "limits")
# Other names for a setting: the policy's vocabulary next to the seed's.
ALIASES = {"files.hide": "exclude", "limits.iteration_time": "iteration_timeout"}


def _flatten(data: Mapping[str, object]) -> list[tuple[str, object]]:
    items: list[tuple[str, object]] = []
    for key, raw in data.items():
        if key in TABLES and isinstance(raw, dict):
            items += [(f"{key}.{sub}", value) for sub, value in raw.items()]
        else:
            items.append((key, raw))
    return [(ALIASES.get(key, key), raw) for key, raw in items]


def _file_layer(path: Path, label: str, specs: Mapping[str, _Spec]) -> dict[str, Setting]:
    source = f"{label} ({path})"
    values = _values(path, _read_toml(path), specs)
    return {key: Setting(key, value, source) for key, value in values.items()}


def _values(
    path: Path, data: Mapping[str, object], specs: Mapping[str, _Spec]
) -> dict[str, object]:
    """The parsed value of every key in a file; ConfigError on an unknown key or bad value."""
    values = {}
    for key, raw in _flatten(data):
        spec = specs.get(key)
        if spec is None:
            raise _fail(_unknown_key(path, key, raw, specs))
        fix = f"e.g. {key} = {_toml_literal(spec.example)}"
        values[key] = _check(spec, raw, where=str(path), got=True, fix=fix)
    return values


def _env_layer(env: Mapping[str, str], specs: Mapping[str, _Spec]) -> dict[str, Setting]:
    layer = {}
    for key, spec in specs.items():
        var = next((name for name in reversed(BY_KEY[key].env) if name in env), None)
        if var is None:
            continue
        fix = f"e.g. {var}={_shell_literal(spec.example)}, or unset {var}"
        value = _check(spec, env[var], where=f"{var}={_show_env(env[var])}", got=False, fix=fix)
        layer[key] = Setting(key, value, f"env {var}")
    return layer


def _flag_layer(flags: Mapping[str, object], specs: Mapping[str, _Spec]) -> dict[str, Setting]:
    layer = {}
    for key, raw in flags.items():
        if raw is None:
            continue
        spec = specs.get(key)
        if spec is None:  # the CLI and this table disagree: a bug, not a user error
            raise ValueError(f"unknown config flag key {key!r}; known: {', '.join(specs)}")
        flag = flag_name(key)
        fix = f"e.g. {flag} {_shell_literal(spec.example)}"
        value = _check(spec, raw, where=flag, got=True, fix=fix)
        layer[key] = Setting(key, value, f"flag {flag}")
    return layer


def _check(spec: _Spec, raw: object, *, where: str, got: bool, fix: str) -> object:
    try:
        return spec.parse(raw)
    except ValueError:
        shown = f", got {_show(raw)} ({type(raw).__name__})" if got else ""
        raise _fail(f"{where}: '{spec.key}' must be {spec.expect}{shown}; {fix}") from None


def _build(settings: Mapping[str, Setting], project_file: ProjectFile | None) -> Config:
    def get(key: str, kind: type[_T]) -> _T:
        value = settings[key].value
        if not isinstance(value, kind):  # the parsers guarantee this; a bug otherwise
            raise TypeError(f"config key {key!r} resolved to {value!r}, not {kind.__name__}")
        return value

    def opt(key: str) -> str | None:
        return None if settings[key].value is None else get(key, str)

    def maybe(key: str, kind: type[_T]) -> _T | None:
        return None if settings[key].value is None else get(key, kind)

    return Config(
        harness=get("harness", str),
        iterations=get("iterations", int),
        sandbox=get("sandbox", str),
        workspace=get("workspace", str),
        model=opt("model"),
        effort=opt("effort"),
        agent_cmd=opt("agent_cmd"),
        iteration_timeout=get("iteration_timeout", float),
        no_progress_limit=get("no_progress_limit", int),
        commit_retries=get("commit_retries", int),
        exclude=get("exclude", tuple),
        bwrap=opt("bwrap"),
        pager=opt("pager"),
        docker_base=opt("docker_base"),
        max_cost=None if settings["max_cost"].value is None else get("max_cost", float),
        max_tokens=None if settings["max_tokens"].value is None else get("max_tokens", int),
        network_mode=get("network.mode", str),
        network_allow=get("network.allow", tuple),
        network_deny=get("network.deny", tuple),
        secrets=get("secrets", tuple),
        files_ro=get("files.ro", tuple),
        files_rw=get("files.rw", tuple),
        memory=maybe("limits.memory", int),
        cpus=maybe("limits.cpus", float),
        pids=maybe("limits.pids", int),
        disk=maybe("limits.disk", int),
        total_time=maybe("limits.total_time", float),
        on_kill=get("limits.on_kill", str),
        enforce=get("enforce", str),
        sources=MappingProxyType(dict(settings)),
        project_file=project_file,
    )


# ---------------------------------------------------------------- files


def _read_toml(path: Path) -> dict[str, object]:
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except OSError as exc:
        raise _unreadable(path, exc) from exc
    return _parse_toml(path, _decode(path, data))


def _parse_toml(path: Path, text: str) -> dict[str, object]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _fail(_toml_error(path, text, exc)) from exc


def _decode(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(
            f"{path}: config file is not UTF-8 text; re-save it as UTF-8 or move it away"
        ) from exc


def _unreadable(path: Path, exc: OSError) -> ConfigError:
    return _fail(
        f"{path}: cannot read config file ({exc.strerror or exc}); "
        "fix its permissions or move it away"
    )


PROJECT_FILE_LIMIT = 1 << 20


def _read_project_bytes(path: Path) -> bytes | None:
    """The project file's bytes, or None when there is none. Whoever writes the project
    writes this file, so: no symbolic link is followed (trust pins this file's content,
    not another file's), and only a regular file of at most 1 MiB is read (a FIFO or
    device would hang or flood so)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        dir_fd = os.open(path.parent, flags | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        if path.parent.is_symlink():  # Linux says ENOTDIR for O_NOFOLLOW on a link here
            raise _linked(path.parent) from None
        return None
    except OSError as exc:
        raise _linked(path.parent) if exc.errno == errno.ELOOP else _unreadable(path, exc) from exc
    try:
        fd = os.open(path.name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _linked(path) if exc.errno == errno.ELOOP else _unreadable(path, exc) from exc
    finally:
        os.close(dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _fail(f"{path}: not a regular file; replace it with a file or remove it")
        chunks, size = [], 0
        while size <= PROJECT_FILE_LIMIT and (chunk := os.read(fd, 1 << 16)):
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > PROJECT_FILE_LIMIT:
        raise _fail(f"{path}: larger than 1 MiB; a config file is a few lines, remove it")
    return data


def _linked(path: Path) -> ConfigError:
    return _fail(
        f"{path}: is a symbolic link, which so does not follow for project config; "
        "replace it with the file itself"
    )


_TOML_WHERE = re.compile(r"\s*\((?:at line (?P<line>\d+), column \d+|at end of document)\)$")


def _toml_error(path: Path, text: str, exc: tomllib.TOMLDecodeError) -> str:
    # Python 3.11's TOMLDecodeError has no lineno attribute: read it from the message.
    message = str(exc)
    match = _TOML_WHERE.search(message)
    line = len(text.splitlines()) or 1
    if match:
        message = message[: match.start()]
        line = int(match["line"]) if match["line"] else line
    return f"{path}: invalid TOML at line {line}: {message}. Fix the syntax or move the file away."


def _unknown_key(path: Path, key: str, raw: object, specs: Mapping[str, _Spec]) -> str:
    what = f"table [{key}]" if isinstance(raw, dict) else f"key '{key}'"
    close = difflib.get_close_matches(key, list(specs), n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(specs)}"
    return f"{path}: unknown {what} ({hint}); rename or remove it"


# ---------------------------------------------------------------- rendering


def _fail(message: str) -> ConfigError:
    """A ConfigError whose message is one line, its control characters made visible (it
    quotes files that whoever writes the project wrote)."""
    return ConfigError(for_terminal(" ".join(message.splitlines())))


def _show(value: object) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _show_env(value: str) -> str:
    return value if value.isprintable() and len(value) <= 60 else _show(value)


def _toml_literal(value: object) -> str:
    return json.dumps(value)  # JSON strings, numbers and lists of strings are valid TOML


def _shell_literal(value: object) -> str:
    text = ",".join(value) if isinstance(value, list) else str(value)
    return shlex.quote(text)


def _jsonable(value: object) -> object:
    if isinstance(value, Secret):  # where the value comes from, never the value
        return {
            "name": value.name,
            "env": value.env,
            "file": value.file,
            "hosts": list(value.hosts),
        }
    return [_jsonable(v) for v in value] if isinstance(value, tuple) else value
