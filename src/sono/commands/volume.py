"""so volume list|reset: the agent's persistent home, one per project.

A volume is ``$SO_HOME/volumes/<project-slug>-<hash of the project path>/``: what the
agent keeps in its home (caches, settings, history) survives from one sandbox of the
project to the next. Only microVM sandboxes (``-s microvm``) mount it today; bwrap and
Docker give every sandbox a fresh home still.
"""

from __future__ import annotations

import argparse

from sono.backends.microvm_volumes import empty_dir, find_volume, list_volumes
from sono.commands import _common as c
from sono.errors import SoError
from sono.limits import format_size
from sono.state import so_home


def run(args: argparse.Namespace) -> int:
    home = so_home(c.environ())
    if args.action == "list":
        volumes = list_volumes(home)
        if getattr(args, "json", False):
            c.print_json([v.to_json() for v in volumes])
            return 0
        if not volumes:
            print("no volumes yet: a microVM sandbox (-s microvm) makes one per project")
        for v in volumes:
            print(f"{v.id:40} {format_size(v.size_bytes()):>10}  {v.project or '?'}")
        return 0
    if not args.name:
        raise SoError("name the volume to reset: so volume reset NAME (see `so volume list`)")
    volume = find_volume(home, args.name)
    if not c.confirm(args, f"empty the agent's home {volume.id} ({volume.project or '?'})?"):
        print("so: nothing reset")
        return 1
    empty_dir(volume.path)
    print(f"so: volume {volume.id} is empty; the next sandbox's agent starts from a fresh home")
    return 0
