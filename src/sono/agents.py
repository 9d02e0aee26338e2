"""Finding agent CLIs (pinned installs under the agents dir, else PATH) and mounting them.

``so agents install NAME`` runs npm into ``$SO_HOME/agents/NAME`` at the pinned
version; the sandbox sees the install read-only at the same path.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from sono import proc
from sono.backends.base import Mount
from sono.errors import SoError
from sono.harnesses.base import NpmPackage

SYSTEM_PREFIXES = ("/usr/", "/bin/", "/sbin/", "/lib/", "/lib64/", "/opt/")
# Tools `so` itself runs inside sandboxes (not agents): installable the same way.
TOOLS: dict[str, NpmPackage] = {"jscpd": NpmPackage("jscpd", "4.0.5", "jscpd")}


@dataclass(frozen=True)
class Located:
    path: Path  # what to exec inside the sandbox (a real, mounted path)
    mounts: tuple[Mount, ...]
    source: str  # "so-installed" | "PATH"


def installed_bin(agents_dir: Path, name: str, pkg: NpmPackage) -> Path:
    return agents_dir / name / "node_modules" / ".bin" / pkg.bin


def locate(name: str, pkg: NpmPackage | None, agents_dir: Path) -> Located | None:
    """The pinned install first (reproducible), then whatever PATH has."""
    if pkg is not None:
        candidate = installed_bin(agents_dir, name, pkg)
        if candidate.exists():
            return Located(candidate.resolve(), mounts_for(candidate), "so-installed")
    found = shutil.which(pkg.bin if pkg else name)
    if found is None:
        return None
    return Located(Path(found).resolve(), mounts_for(Path(found)), "PATH")


def mounts_for(executable: Path) -> tuple[Mount, ...]:
    """Read-only mounts that make ``executable`` (and its interpreter) run inside.

    The sandbox runs the resolved path, so only its install root is mounted, and never
    more than a self-contained prefix: a stray script mounts alone, not its directory."""
    roots: list[Path] = []
    root = _install_root(executable.resolve())
    if root is not None:
        roots.append(root)
    interp = _interpreter(executable.resolve())
    if interp is not None:
        roots += [m.src for m in mounts_for(interp) if m.src not in roots]
    return tuple(Mount(src=r, dest=str(r)) for r in roots)


def _install_root(path: Path) -> Path | None:
    text = str(path)
    if text.startswith(SYSTEM_PREFIXES):
        return None
    parts = path.parts
    if "node_modules" in parts:
        return Path(*parts[: parts.index("node_modules")])
    prefix = path.parent.parent
    shared = (Path.home(), Path.home() / ".local", Path("/"))
    if path.parent.name == "bin" and (prefix / "lib").is_dir() and prefix not in shared:
        return prefix  # a self-contained prefix: a pyenv/nvm version, a venv
    return path  # just the file: never a whole shared directory


def _interpreter(path: Path) -> Path | None:
    """The shebang interpreter of a script, when it lives outside the system dirs."""
    try:
        with path.open("rb") as fh:
            first = fh.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if not words:
        return None
    prog = words[1] if words[0].endswith("/env") and len(words) > 1 else words[0]
    found = shutil.which(prog) if "/" not in prog else prog
    if found is None or found.startswith(SYSTEM_PREFIXES):
        return None
    return Path(found)


def installed_version(agents_dir: Path, name: str, pkg: NpmPackage) -> str | None:
    return _manifest_version(agents_dir / name, pkg.name)


def _manifest_version(prefix: Path, package: str) -> str | None:
    manifest = prefix / "node_modules" / package / "package.json"
    try:
        version = json.loads(manifest.read_text()).get("version")
    except (OSError, ValueError):
        return None
    return version if isinstance(version, str) else None


def _complete(agents_dir: Path, name: str, pkg: NpmPackage) -> bool:
    """The pinned package and every pinned extra (``name@version``) are in the prefix."""
    if installed_version(agents_dir, name, pkg) != pkg.version:
        return False
    for spec in pkg.extra:
        extra, _, version = spec.rpartition("@")
        if _manifest_version(agents_dir / name, extra) != version:
            return False
    return True


def install(name: str, pkg: NpmPackage, agents_dir: Path) -> Path:
    """npm-install ``pkg`` at its pinned version into the agents dir (no-op when present)."""
    path = installed_bin(agents_dir, name, pkg)
    if path.exists() and _complete(agents_dir, name, pkg):
        return path
    npm = shutil.which("npm")
    if npm is None:
        raise SoError(f"npm is needed to install {name}: install Node.js (with npm), then retry")
    prefix = agents_dir / name
    prefix.mkdir(parents=True, exist_ok=True)
    proc.run(
        [
            npm,
            "install",
            "--prefix",
            str(prefix),
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            f"{pkg.name}@{pkg.version}",
            *pkg.extra,
        ]
    )
    if not path.exists():
        raise SoError(f"npm installed {pkg.name}@{pkg.version} but {path} is missing")
    return path


def bundled_node(path: Path) -> Path | None:
    """The Node installed in the same npm prefix as ``path`` (``NpmPackage.extra``), if any."""
    parts = path.parts
    if "node_modules" not in parts:
        return None
    node = Path(*parts[: parts.index("node_modules")], "node_modules", ".bin", "node")
    return node.resolve() if node.exists() else None


def runner(path: Path) -> list[str]:
    """How to run an installed script: with its bundled Node when there is one (never the
    host's, which may be too old), else as it is (its shebang)."""
    node = bundled_node(path)
    return [str(node), str(path)] if node else [str(path)]


def version(path: Path) -> str:
    out = proc.run([*runner(path), "--version"], check=False, timeout=30)
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text else "unknown"
