"""so trust [--show | --revoke]: trust this exact content of the project's .so/config.toml
(and of its .so/Dockerfile build context, when it has one).

A project file may always set the keys that are safe in it; the keys that run on your host
or widen the sandbox policy apply only once you reviewed the file and ran ``so trust``.
Any later change of the file (a merge, an edit) makes it untrusted again.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sono.commands import _common as c
from sono.config import ProjectFile, inspect_project, project_config_path
from sono.errors import SoError
from sono.harnesses import HARNESSES
from sono.images import project_dockerfile
from sono.textsafe import one_line
from sono.trust import TrustStore, context_digest
from sono.workspace import inspect_host


def run(args: argparse.Namespace) -> int:
    project = inspect_host(Path.cwd()).root
    store = TrustStore.default(c.environ())
    if getattr(args, "revoke", False):
        return _revoke(store, project)
    pf = inspect_project(
        project=project,
        env=c.environ(),
        home=Path.home(),
        harness_choices=list(HARNESSES),
        trust=store,
    )
    if getattr(args, "show", False):
        return _show(pf, project)
    dockerfile = project_dockerfile(project)
    if pf is None and dockerfile is None:
        raise SoError(f"{project_config_path(project)} does not exist: there is nothing to trust")
    context = context_digest(dockerfile.parent) if dockerfile is not None else None
    file = pf.path if pf is not None else dockerfile
    assert file is not None
    store.trust(project, pf.sha256 if pf else None, file=file, context=context)
    if pf is not None:
        print(f"so: trusted {pf.path} (sha256 {pf.sha256[:16]}); it applies until it changes")
        for finding in pf.findings:
            print(f"  now applies: {one_line(finding.describe(), 300)}")
    if dockerfile is not None and context is not None:
        print(
            f"so: trusted the Docker project layer {dockerfile} (every file of "
            f"{dockerfile.parent}, sha256 {context[:16]}); it is built until one changes"
        )
    return 0


def _revoke(store: TrustStore, project: Path) -> int:
    if store.revoke(project):
        print(f"so: {project}: trust revoked; keys that need it are refused until `so trust`")
    else:
        print(f"so: {project}: was not trusted")
    return 0


def _show(pf: ProjectFile | None, project: Path) -> int:
    if pf is None:
        print(f"project file: {project_config_path(project)} (none)")
        return 0
    state = "changed since you trusted it" if pf.changed else pf.label
    print(f"project file: {pf.path}")
    print(f"sha256:       {pf.sha256}")
    print(f"status:       {state}")
    if not pf.findings:
        print("needs trust:  nothing (every key it sets is safe in a project file)")
    for i, finding in enumerate(pf.findings):
        label = "needs trust: " if i == 0 else ""
        print(f"{label:<13} {one_line(finding.describe(), 300)}")
    return 0
