"""so config: every resolved setting and where it came from."""

from __future__ import annotations

import argparse
from pathlib import Path

from sono.app.policy import backend_settings
from sono.backends import choose_auto
from sono.commands import _common as c
from sono.config import ProjectFile, project_config_path, user_config_path
from sono.errors import SoError
from sono.textsafe import one_line
from sono.workspace import inspect_host


def run(args: argparse.Namespace) -> int:
    try:
        project: Path | None = inspect_host(Path.cwd()).root
    except SoError:
        project = None
    cfg = c.config(args, project)
    backend, why = cfg.sandbox, "set explicitly"
    if backend == "auto":
        backend, why = choose_auto(backend_settings(c.context(args), cfg))
    if getattr(args, "json", False):
        data = cfg.to_json()
        data["sandbox"] = {**data["sandbox"], "resolved": backend, "why": why}
        c.print_json(data)
        return 0
    rows = [(s.key, _show(s.value), s.source) for s in cfg.provenance()]
    width = max(len(r[0]) for r in rows)
    vwidth = max(len(r[1]) for r in rows)
    for key, value, source in rows:
        print(f"{key.ljust(width)}  {value.ljust(vwidth)}  {source}")
    print(f"\nsandbox now:  {backend} ({why})")
    print(f"user file:    {user_config_path(c.environ(), Path.home())}")
    if project is not None:
        print(f"project file: {project_config_path(project)}{_trust(cfg.project_file)}")
    return 0


def _trust(pf: ProjectFile | None) -> str:
    if pf is None:
        return " (none)"
    if pf.trusted:
        return f" (trusted, sha256 {pf.sha256[:16]}: all its keys apply)"
    return " (untrusted: only keys safe in a project file apply; see so trust --show)"


def _show(value: object) -> str:
    # Values may come from a project file, i.e. from whoever writes the project.
    if value is None:
        return "-"
    if isinstance(value, tuple):
        return one_line(",".join(map(str, value)), 120)
    return one_line(str(value), 120)
