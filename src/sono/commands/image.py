"""so image build|list|rm|bootstrap: the Docker runner image (content-hashed, offline base)."""

from __future__ import annotations

import argparse
from pathlib import Path

from sono.app.policy import backend_settings
from sono.backends.docker import DockerBackend
from sono.commands import _common as c
from sono.errors import SoError
from sono.workspace import inspect_host


def _project() -> Path | None:
    try:
        return inspect_host(Path.cwd()).root
    except SoError:
        return None


def run(args: argparse.Namespace) -> int:
    project = _project()
    cfg = c.config(args, project)
    settings = backend_settings(c.context(args), cfg)
    docker = DockerBackend(base=cfg.docker_base, project=project, progress=settings.progress)
    images = docker.images()
    if args.action == "bootstrap":
        tag = images.bootstrap(args.suite, args.mirror, settings.progress)
        print(f"so: base image {tag} ready; the runner image builds FROM it by default")
        return 0
    if args.action == "build":
        tag = images.ensure(docker.runner_spec(), settings.progress)
        print(f"so: image {tag} ready")
        return 0
    if args.action == "list":
        rows = images.list()
        if getattr(args, "json", False):
            c.print_json(rows)
        elif not rows:
            print("no so images yet: `so image build` (offline: `so image bootstrap` first)")
        for row in rows if not getattr(args, "json", False) else []:
            print(f"{row['tag']:40} {row['id']:20} {row['size_mb']:>8} MB  {row['created']}")
        return 0
    if not args.ref:
        raise SoError("name the image to remove: so image rm TAG (see `so image list`)")
    for ref in args.ref:
        images.remove(ref)
        print(f"so: removed {ref}")
    return 0
