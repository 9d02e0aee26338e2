"""The agent's persistent home, one per project (``so volume``): the microVM backend
mounts it as ``/home/agent``; bwrap and Docker give every sandbox a fresh home still.

A volume is ``$SO_HOME/volumes/<project-slug>-<hash of the project path>/``, its record
(which project it is for) next to it, where the agent cannot write.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from sono.errors import SoError
from sono.home import write_json_atomic
from sono.layout import slug
from sono.limits.watch import tree_size
from sono.overlay import remove_tree


@dataclass(frozen=True)
class HomeVolume:
    """The agent's home for one project, kept across sandboxes (``so volume``)."""

    id: str
    path: Path
    project: str

    def size_bytes(self) -> int:
        return tree_size(self.path)

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "project": self.project,
            "path": str(self.path),
            "size_bytes": self.size_bytes(),
        }


def volumes_root(so_home: Path) -> Path:
    return so_home / "volumes"


def volume_id(project: Path) -> str:
    digest = hashlib.sha256(str(project).encode()).hexdigest()[:12]
    return f"{slug(project.name)}-{digest}"


def home_volume(so_home: Path, project: Path) -> HomeVolume:
    """The project's volume, made on first use; its metadata sits next to it (the agent
    can write the volume, never the record of whose it is)."""
    vid = volume_id(project)
    root = volumes_root(so_home)
    path = root / vid
    path.mkdir(parents=True, exist_ok=True)
    meta = root / f"{vid}.json"
    if not meta.is_file():
        write_json_atomic(meta, {"id": vid, "project": str(project)})
    return HomeVolume(vid, path, str(project))


def list_volumes(so_home: Path) -> list[HomeVolume]:
    root = volumes_root(so_home)
    found = []
    for path in sorted(p for p in root.glob("*") if p.is_dir()) if root.is_dir() else []:
        project = ""
        with contextlib.suppress(OSError, ValueError):
            data = json.loads((root / f"{path.name}.json").read_text())
            project = str(data.get("project", "")) if isinstance(data, dict) else ""
        found.append(HomeVolume(path.name, path, project))
    return found


def find_volume(so_home: Path, name: str) -> HomeVolume:
    """A volume by id or unique id prefix."""
    volumes = list_volumes(so_home)
    exact = [v for v in volumes if v.id == name]
    matches = exact or [v for v in volumes if v.id.startswith(name)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise SoError(f"no volume {name!r}; see `so volume list`")
    names = ", ".join(v.id for v in matches)
    raise SoError(f"volume {name!r} is ambiguous ({names}); give more of its id")


def empty_dir(path: Path) -> None:
    """Remove everything inside ``path``, keeping ``path`` itself."""
    for child in path.iterdir() if path.is_dir() else []:
        if child.is_dir() and not child.is_symlink():
            remove_tree(child)
        else:
            child.unlink()
