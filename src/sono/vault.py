"""The host's own record of what a sandbox produced: the review vault.

The sandbox repo is the agent's: its refs, replace refs, config, hooks and even its object
files can say anything (an object file read through git's alternates is not re-hashed).
So the host never reviews or merges from it. After every iteration (and every shell or
reset) so takes the sandbox's ``HEAD`` as pure data — a bundle made inside the sandbox,
copied out without following links, unpacked by ``git index-pack``, which hashes every
object — into a bare repository that only so writes (``$SO_HOME/sandboxes/<id>/vault.git``,
its objects borrowed from the host repo's). The commit id it learnt is recorded in the
sandbox record. ``so diff``, the review app and ``so merge`` all read that recorded id from
the vault, with host git and so's own settings: what you review is what you merge.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sono import proc
from sono.errors import SoError

COMMIT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
# git reads no replace refs, no system or global config that could run a program here.
SAFE_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "TZ", "HOME", "USER", "XDG_CONFIG_HOME")
BUNDLE_LIMIT = 4 << 30  # the most so copies out of a sandbox in one take
_OVERRIDES = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.pager=cat",
    "gc.auto=0",
    "diff.external=",
    "core.attributesFile=/dev/null",
    "color.ui=auto",
    "safe.directory=*",  # the vault is so's; a seed reads a fresh git dir a container owns
)


def git_env() -> dict[str, str]:
    """Host git for the vault: the user's environment basics, no replace objects, no
    system or global config (a global textconv or diff driver must not matter)."""
    env = {k: os.environ[k] for k in SAFE_ENV_KEYS if k in os.environ}
    env |= {
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_OPTIONAL_LOCKS": "0",
    }
    return env


def valid_commit_id(text: str) -> bool:
    return COMMIT_ID.fullmatch(text) is not None


@dataclass(frozen=True)
class Vault:
    """A bare repository under so's control with the sandbox's commits as pure data."""

    path: Path

    def git(self, *args: str, check: bool = True, timeout: float | None = 600) -> proc.Completed:
        overrides = [x for o in _OVERRIDES for x in ("-c", o)]
        return proc.run(
            ["git", *overrides, f"--git-dir={self.path}", *args],
            check=check,
            env=git_env(),
            timeout=timeout,
        )

    def exists(self) -> bool:
        return (self.path / "objects").is_dir()

    def create(self, host_objects: Path) -> None:
        """A bare repo whose objects fall back to the host repo's (the base is there)."""
        if not self.exists():
            proc.run(["git", "init", "-q", "--bare", "--template=", str(self.path)], env=git_env())
        info = self.path / "objects" / "info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "alternates").write_text(f"{host_objects}\n")
        # HEAD names a ref that never exists: no attributes or config read from a tree.
        (self.path / "HEAD").write_text("ref: refs/so/none\n")

    def has_commit(self, commit: str) -> bool:
        if not valid_commit_id(commit):
            return False
        out = self.git("cat-file", "-t", commit, check=False)
        return out.returncode == 0 and out.stdout.strip() == "commit"

    def keep(self, name: str, commit: str) -> None:
        """Pin ``commit`` under ``refs/so/<name>`` (it survives any gc of the vault)."""
        self.git("update-ref", f"refs/so/{name}", commit)

    def receive(self, bundle: Path) -> dict[str, str]:
        """Unpack a bundle (every object re-hashed by index-pack); its heads by name."""
        heads = self.git("bundle", "list-heads", str(bundle), check=False)
        if heads.returncode != 0:
            raise SoError("the sandbox produced an unreadable bundle of its commits")
        self.git("bundle", "unbundle", str(bundle))
        found: dict[str, str] = {}
        for line in heads.stdout.splitlines():
            parts = line.split(" ", 1)
            if len(parts) == 2 and valid_commit_id(parts[0]):
                found[parts[1]] = parts[0]
        return found

    def connected(self, commit: str, base: str) -> bool:
        """Every object of ``commit`` (down to ``base``) is here, parsed and typed."""
        out = self.git(
            "rev-list", "--objects", "--missing=error", commit, "--not", base, check=False
        )
        return out.returncode == 0

    def diff(self, start: str, end: str, *args: str) -> str:
        return self.git(
            "diff", "--no-ext-diff", "--no-textconv", "--no-renames", *args, start, end
        ).stdout

    def changed(self, start: str, end: str) -> list[str]:
        """Paths that differ, exactly as stored (no C-quoting of odd names)."""
        out = self.git("diff", "--no-renames", "--name-only", "-z", start, end).stdout
        return [p for p in out.split("\0") if p]

    def count(self, start: str, end: str) -> int:
        out = self.git("rev-list", "--count", f"{start}..{end}").stdout.strip()
        return int(out or 0)

    def subjects(self, start: str, end: str) -> list[str]:
        out = self.git("log", "-z", "--format=%s", f"{start}..{end}").stdout
        return [s for s in out.split("\0") if s]


def copy_out(dir_fd: int, name: str, dest: Path, limit: int = BUNDLE_LIMIT) -> None:
    """Copy ``name`` in the directory ``dir_fd`` (a file the sandbox wrote) to ``dest``
    without following a link and refusing anything but a regular file or one larger than
    ``limit``: the sandbox cannot swap in a host file between check and read."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        raise SoError("the sandbox produced no readable bundle of its commits") from exc
    with contextlib.ExitStack() as stack:
        src = stack.enter_context(os.fdopen(fd, "rb"))
        info = os.fstat(src.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            raise SoError("the sandbox's bundle of its commits is not a regular file or too big")
        out = stack.enter_context(dest.open("xb"))
        copied = 0
        while chunk := src.read(1 << 20):
            copied += len(chunk)
            if copied > limit:
                raise SoError("the sandbox's bundle of its commits is too big")
            out.write(chunk)


def take_head(
    vault: Vault,
    *,
    run_inside: Callable[[list[str]], proc.Completed],
    git_dir: Path,
    base: str,
    exclude: list[str],
    scratch: Path,
) -> str:
    """Bring the sandbox's HEAD commit (and what it needs beyond ``base``) into the vault
    as verified data; return its id. ``run_inside`` runs argv inside the sandbox (its
    workspace root is the cwd); ``git_dir`` is where the sandbox's ``.git`` lies on the
    host; ``exclude`` are commits the vault already has (the bundle stops there)."""
    name = f"so-take-{secrets.token_hex(6)}.bundle"
    script = (
        "export GIT_NO_REPLACE_OBJECTS=1; "
        'h=$(git rev-parse --verify -q "HEAD^{commit}") || exit 3; echo "$h"; '
        '[ "$h" = "$1" ] && exit 0; '
        'n=$2; shift 2; git bundle create -q ".git/$n" HEAD "$@" 2>&1 || exit 4'
    )
    result = run_inside(["sh", "-c", script, "so-take", base, name, *(f"^{c}" for c in exclude)])
    lines = result.stdout.strip().splitlines()
    head = lines[0].strip() if lines else ""
    if result.returncode == 3 or not valid_commit_id(head):
        raise SoError("the sandbox's HEAD is not a commit; `so reset ID base` repairs it")
    if head == base or vault.has_commit(head):
        return head  # nothing new: the vault holds it, verified when it came in
    if result.returncode != 0:
        detail = " ".join(lines[1:])[-200:]
        raise SoError(f"could not read the sandbox's commits ({detail or 'git bundle failed'})")
    scratch.mkdir(parents=True, exist_ok=True)
    copy = scratch / name
    try:
        dir_fd = os.open(git_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise SoError(f"cannot open the sandbox's git dir {git_dir}: {exc.strerror}") from exc
    try:
        copy_out(dir_fd, name, copy)
        heads = vault.receive(copy)
    finally:
        copy.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        os.close(dir_fd)
    tip = heads.get("HEAD", "")
    if not valid_commit_id(tip) or not vault.has_commit(tip) or not vault.connected(tip, base):
        raise SoError("the sandbox's bundle did not hold a complete commit; try again")
    return tip


def host_objects(project: Path) -> Path:
    """The host repo's object store (the vault borrows the base's objects from it)."""
    from sono.workspace import host_git

    out = host_git(project, "rev-parse", "--path-format=absolute", "--git-common-dir")
    return Path(out.stdout.strip()) / "objects"


def seed(vault: Vault, project: Path, gitdir: Path, base_ref: str, host_head: str) -> None:
    """At creation, before any agent ran: the vault, and the base commit when it is so's
    own snapshot of a dirty host tree (it exists only in the fresh sandbox repo)."""
    vault.create(host_objects(project))
    fresh = Vault(gitdir)  # not a vault, but as fresh and as trusted at this moment
    commit = fresh.git("rev-parse", base_ref).stdout.strip()
    if commit != host_head:
        bundle = vault.path / "seed.bundle"
        fresh.git("bundle", "create", "-q", str(bundle), base_ref, f"^{host_head}")
        try:
            vault.receive(bundle)
        finally:
            bundle.unlink(missing_ok=True)
    vault.keep("base", commit)
    vault.keep("tip", commit)
