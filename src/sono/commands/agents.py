"""so agents install|list: agent CLIs (and tools) at pinned versions under the agents dir."""

from __future__ import annotations

import argparse

from sono import agents
from sono.commands import _common as c
from sono.errors import SoError
from sono.harnesses import available, harness_class
from sono.harnesses.base import NpmPackage
from sono.state import agents_dir


def installable() -> dict[str, NpmPackage]:
    classes = {name: harness_class(name) for name in available()}
    found = {name: cls.npm for name, cls in classes.items() if cls.npm is not None}
    return {**found, **agents.TOOLS}


def run(args: argparse.Namespace) -> int:
    table = installable()
    target = agents_dir(c.environ())
    if args.action == "list":
        for name, pkg in table.items():
            path = agents.installed_bin(target, name, pkg)
            have = agents.installed_version(target, name, pkg)
            state = f"installed {have}" if have and path.exists() else "not installed"
            print(f"{name:8} {pkg.name}@{pkg.version}  {state}  {path}")
        return 0
    names = args.names or ["claude"]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SoError(f"cannot install {', '.join(unknown)}; installable: {', '.join(table)}")
    for name in names:
        pkg = table[name]
        print(f"so: installing {pkg.name}@{pkg.version} into {target / name} …")
        path = agents.install(name, pkg, target)
        print(f"so: {name} ready: {path}")
    return 0
