"""so list: every sandbox with its status; --json for scripts."""

from __future__ import annotations

import contextlib
import json
import os

# `so list` must start fast: sono.home only (no argparse, dataclasses, harness, backend).
from sono.home import home_dir, pid_alive
from sono.textsafe import one_line
from sono.ui.age import age

TYPE_CHECKING = False  # typing itself costs start-up time
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping
    from typing import Any

    from sono.state import SandboxRecord

COUNTS = ("iterations", "commits")
EMPTY = "no sandboxes yet: start one with `so run` (or try `so demo`)"


def as_json(rec: SandboxRecord) -> dict[str, object]:
    data = rec.to_json()
    data["status"] = rec.live_status()
    data["branch"] = rec.branch
    return data


def table(records: list[SandboxRecord]) -> str:
    return render([{**r.to_json(), "status": r.live_status()} for r in records])


def render(records: list[dict[str, Any]]) -> str:
    """The table for a terminal: every cell one safe line (a record's strings reach the
    terminal only through :func:`sono.textsafe.one_line`)."""
    header = ("ID", "PROJECT", "HARNESS", "BACKEND", "STATUS", "ITER", "COMMITS", "AGE")
    keys = ("id", "project_name", "harness", "backend", "status", "iterations", "commits")
    rows = [header] + [
        (
            *(one_line(str(r.get(key, 0 if key in COUNTS else None)), 60) for key in keys),
            age(str(r.get("created", ""))),
        )
        for r in records
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def config_files(env: Mapping[str, str], cwd: str = ".") -> list[str]:
    """The config files that exist for ``cwd``: the user file and the project's
    ``.so/config.toml``. A few ``stat`` calls and no imports: ``so list`` can afford it."""
    xdg = env.get("XDG_CONFIG_HOME", "")
    home = os.path.expanduser("~")  # noqa: PTH111 - no pathlib: start-up
    base = xdg if os.path.isabs(xdg) else os.path.join(home, ".config")  # noqa: PTH117, PTH118
    candidates = [os.path.join(base, "so", "config.toml")]  # noqa: PTH118
    project = project_dir(cwd)
    if project is not None:
        candidates.append(os.path.join(project, ".so", "config.toml"))  # noqa: PTH118
    return [path for path in candidates if os.path.lexists(path)]


def project_dir(cwd: str) -> str | None:
    """The nearest directory up from ``cwd`` with a ``.git`` (a repository's top level),
    commits or not."""
    try:
        here = os.path.abspath(cwd)  # noqa: PTH100
    except OSError:  # the working directory was removed: no project
        return None
    while not os.path.lexists(os.path.join(here, ".git")):  # noqa: PTH118
        parent = os.path.dirname(here)  # noqa: PTH120
        if parent == here:
            return None
        here = parent
    return here


def check_config() -> None:
    """Raise ConfigError for a broken user or project config file (TOML, unknown key, bad
    value), without applying it or asking for trust: commands that only show sandboxes
    (list, menu) must not pass over a file every other command refuses."""
    from pathlib import Path

    from sono.config import DEFAULT_HARNESSES, inspect_project, load_config

    project = project_dir(".")
    # The config's own harness names (sono.harnesses' registry, without importing it).
    home, choices = Path.home(), DEFAULT_HARNESSES
    if project is not None:  # the user file, then the project file
        inspect_project(project=Path(project), env=os.environ, home=home, harness_choices=choices)
        return
    # No project: the user file alone (env vars are each command's business).
    env = {k: v for k, v in os.environ.items() if k in ("XDG_CONFIG_HOME", "SO_HOME")}
    load_config(project=None, env=env, home=home, flags={}, harness_choices=choices)


def fast(as_json_output: bool) -> int:
    """``so list`` / ``so list --json`` without argparse, dataclasses or pathlib: the
    registry's JSON files read as they are (the same objects ``--json`` always gave)."""
    root = os.path.join(home_dir(), "sandboxes")  # noqa: PTH118 - no pathlib: start-up
    records = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(root):
            try:
                with open(entry.path + "/sandbox.json", encoding="utf-8") as fh:  # noqa: PTH123
                    data = json.load(fh)
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and isinstance(data.get("id"), str):
                records.append(data)
    records.sort(key=lambda d: str(d.get("created", "")))
    for data in records:
        status = data.get("status")
        if status == "running" and not pid_alive(data.get("runner_pid")):
            status = "stopped"
        data["status"] = status
        data["branch"] = f"so/{data['id']}"
    if as_json_output:
        print(json.dumps(records, indent=2, sort_keys=True))
    elif not records:
        print(EMPTY)
    else:
        print(render(records))
    return 0


def run(args: argparse.Namespace) -> int:
    from sono.state import Store, so_home

    check_config()
    records = Store(so_home(os.environ)).all()
    if getattr(args, "json", False):
        print(json.dumps([as_json(r) for r in records], indent=2, sort_keys=True))
    elif not records:
        print(EMPTY)
    else:
        print(table(records))
    return 0
