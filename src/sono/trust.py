"""Trust for a project's ``.so/config.toml``: what a project file may set on its own, and
the contents the user reviewed and trusted (like ``direnv allow``).

A project file is written by whoever writes the project — an agent in a sandbox, whose
work you merge, included. So a key in it is **safe** only when its value can neither run
on your host nor loosen the policy the layers below it (the defaults and your own
``~/.config/so/config.toml``) set. Every key of the config table carries one
:class:`Rule`:

- ``safe``: how the loop runs (harness, iterations, model, effort, timeout, …). Any value.
- ``host``: the value runs on your host or your host builds from it (``pager``, ``bwrap``,
  ``agent_cmd`` — ``so plan``/``so learn`` run the harness on the host — and
  ``docker_base``). Needs trust unless it equals the value below (or unsets it).
- ``policy``: a value may only *tighten* the policy: a stricter network mode, fewer
  allowed hosts, more denied ones, more hidden files, fewer extra mounts or secrets, lower
  limits and budgets, ``enforce = "strict"``. A looser value needs trust.

The user trusts one exact content: ``so trust`` records the file's sha256 for the project
path in ``$SO_HOME/trust.json`` (outside every sandbox) — and, when the project has a
``.so/Dockerfile`` (the Docker backend's project layer, built on the host's engine), the
sha256 of that build context (:func:`context_digest`: every file of ``.so/``), without
which the layer is neither built nor run. Any change of the file — a merge,
an edit — makes it untrusted again; a trusted file applies whole. The user file, the
environment and flags are always trusted. Nothing here prints.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

SAFE = "safe"
HOST = "host"
POLICY = "policy"

# (project value, value of the layers below) -> why the project value needs trust, or None.
Check = Callable[[object, object], str | None]


@dataclass(frozen=True)
class Rule:
    """What a project file may do with one key: ``kind`` is safe, host or policy."""

    kind: str
    check: Check
    doc: str  # the rule in words, for the docs and ``so trust --show``


@dataclass(frozen=True)
class Finding:
    """One key of an untrusted project file that needs the user's trust, and why."""

    key: str
    kind: str  # HOST or POLICY
    detail: str

    def describe(self) -> str:
        if self.kind == HOST:
            return f"{self.key} ({self.detail})"
        return f"{self.key} ({self.detail}: widens the sandbox policy)"


# ---------------------------------------------------------------- rules


def safe() -> Rule:
    return Rule(SAFE, lambda _value, _lower: None, "safe: any value")


def host(what: str) -> Rule:
    """A command or image the host runs or builds; unsetting it (back to the user's own
    choice, e.g. ``$PAGER``) is safe."""

    def check(value: object, lower: object) -> str | None:
        return None if value is None or value == lower else what

    return Rule(HOST, check, f"needs trust: {what}")


def ordered(levels: Sequence[str]) -> Rule:
    """A choice from strictest to loosest; the project may pick an equal or stricter one."""

    def check(value: object, lower: object) -> str | None:
        value, lower = str(value), str(lower)
        if value in levels and lower in levels and levels.index(value) <= levels.index(lower):
            return None
        return f"{_show(value)} is looser than {_show(lower)}"

    return Rule(POLICY, check, f"only as strict or stricter: {' < '.join(levels)}")


def at_most() -> Rule:
    """A limit or budget (None = unlimited): the project may lower it, or set one."""

    def check(value: object, lower: object) -> str | None:
        if lower is None:
            return None
        if value is None:
            return f"removes the limit {_show(lower)}"
        if _number(value) <= _number(lower):
            return None
        return f"{_show(value)} is above {_show(lower)}"

    return Rule(POLICY, check, "only lower (a limit may be added, not raised or removed)")


def subset() -> Rule:
    """Grants (allowed hosts, extra mounts, secrets): only some of those below."""

    def check(value: object, lower: object) -> str | None:
        extra = [v for v in _items(value) if v not in _items(lower)]
        return f"adds {_list(extra)}" if extra else None

    return Rule(POLICY, check, "only a subset of the value below (nothing added)")


def superset() -> Rule:
    """Denials (denied hosts, hidden files): all of those below, and more if you like."""

    def check(value: object, lower: object) -> str | None:
        missing = [v for v in _items(lower) if v not in _items(value)]
        return f"drops {_list(missing)}" if missing else None

    return Rule(POLICY, check, "only a superset of the value below (nothing removed)")


def unless_chosen(default: str) -> Rule:
    """A choice the project may make while the user left it at ``default`` (e.g. the
    sandbox backend under ``auto``), but not replace once the user chose."""

    def check(value: object, lower: object) -> str | None:
        if lower in (default, value):
            return None
        return f"replaces your {_show(lower)} with {_show(value)}"

    return Rule(POLICY, check, f"only while the value below is {default!r}")


def same_or(free: str, what: str) -> Rule:
    """A choice the project may repeat, or set to ``free`` (which grants nothing)."""

    def check(value: object, lower: object) -> str | None:
        if value in (lower, free):
            return None
        return f"{_show(value)} instead of {_show(lower)} {what}"

    return Rule(POLICY, check, f"only the value below, or {free!r}")


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.inf  # the parsers guarantee numbers; anything else counts as loosest
    return float(value)


def _items(value: object) -> tuple[object, ...]:
    return tuple(value) if isinstance(value, tuple | list) else ()


def _list(items: Sequence[object]) -> str:
    shown = [_name(item) for item in items[:5]]
    more = f" and {len(items) - 5} more" if len(items) > 5 else ""
    return ", ".join(shown) + more


def _name(item: object) -> str:
    name = getattr(item, "name", None)  # a Secret: its name says which
    return f"[secrets.{name}]" if isinstance(name, str) else _show(item)


def _show(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False) if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def findings(
    project: Mapping[str, object], lower: Mapping[str, object], rules: Mapping[str, Rule]
) -> tuple[Finding, ...]:
    """The keys of a project layer that need trust, against the values below it."""
    out = []
    for key, value in project.items():
        rule = rules[key]
        detail = None if rule.kind == SAFE else rule.check(value, lower.get(key))
        if detail is not None:
            out.append(Finding(key, rule.kind, detail))
    return tuple(out)


def untrusted_message(path: Path, project: Path, found: Sequence[Finding], *, changed: bool) -> str:
    """The one line saying which file, which keys, why, and the fix."""
    host_keys = ", ".join(f.key for f in found if f.kind == HOST)
    policy = "; ".join(f"{f.key}: {f.detail}" for f in found if f.kind == POLICY)
    what = [f"keys that run on your host ({host_keys})"] if host_keys else []
    what += [f"keys that widen the sandbox policy ({policy})"] if policy else []
    state = "changed since you trusted it" if changed else "not trusted"
    shown = path.relative_to(project) if path.is_relative_to(project) else path
    return (
        f"{path} is {state} and sets {' and '.join(what)}. "
        f"Review {shown}, then run `so trust` in {project} — or remove those keys"
    )


# ---------------------------------------------------------------- the store


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def context_digest(directory: Path) -> str:
    """The sha256 of a build context: every entry below ``directory``, by relative path,
    with its content (a symlink: its target, never followed) and executable bit."""
    sha = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        rel = str(path.relative_to(directory)).encode("utf-8", "surrogateescape")
        if path.is_symlink():
            kind, data = b"l", str(path.readlink()).encode("utf-8", "surrogateescape")
        elif path.is_file():
            kind = b"x" if path.stat().st_mode & 0o111 else b"f"
            data = path.read_bytes()
        else:
            kind, data = b"d", b""
        for part in (kind, rel, data):
            sha.update(len(part).to_bytes(8, "big") + part)
    return sha.hexdigest()


@dataclass(frozen=True)
class TrustStore:
    """``{project path: sha256 of its .so/config.toml}`` that the user trusted, in one
    JSON file under so's state home. Unreadable or garbled means nothing is trusted."""

    path: Path

    @classmethod
    def default(cls, env: Mapping[str, str]) -> TrustStore:
        from sono.home import home_dir

        return cls(Path(home_dir(env)) / "trust.json")

    def trusted_digest(self, project: Path) -> str | None:
        entry = self._entries().get(_key(project))
        value = entry.get("sha256") if isinstance(entry, dict) else None
        return value if isinstance(value, str) else None

    def trusted_context(self, project: Path) -> str | None:
        """The :func:`context_digest` of the ``.so/`` Docker build context trusted."""
        entry = self._entries().get(_key(project))
        value = entry.get("context_sha256") if isinstance(entry, dict) else None
        return value if isinstance(value, str) else None

    def is_trusted(self, project: Path, sha256: str) -> bool:
        return self.trusted_digest(project) == sha256

    def trust(
        self, project: Path, sha256: str | None, *, file: Path, context: str | None = None
    ) -> None:
        """Trust the project file's ``sha256`` and the Docker build ``context`` digest
        (each None when the project has none): exactly these, nothing earlier."""
        from sono.state import now_iso

        entries = self._entries()
        entry: dict[str, str] = {"file": str(file), "trusted_at": now_iso()}
        if sha256 is not None:
            entry["sha256"] = sha256
        if context is not None:
            entry["context_sha256"] = context
        entries[_key(project)] = entry
        self._write(entries)

    def revoke(self, project: Path) -> bool:
        """Forget the project; False when it was not trusted."""
        entries = self._entries()
        if entries.pop(_key(project), None) is None:
            return False
        self._write(entries)
        return True

    def _entries(self) -> dict[str, object]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        projects = data.get("projects") if isinstance(data, dict) else None
        return dict(projects) if isinstance(projects, dict) else {}

    def _write(self, entries: Mapping[str, object]) -> None:
        from sono.home import write_json_atomic

        write_json_atomic(self.path, {"version": 1, "projects": dict(entries)})  # mode 0600


def _key(project: Path) -> str:
    return str(project.resolve())
