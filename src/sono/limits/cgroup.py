"""cgroup jails: where this host lets so create a cgroup (v2 or v1), the jail that
limits one sandbox exec group in it, and the counters that tell a limit was hit.

* **cgroup v2** (unified hierarchy): a child of a cgroup we may write to — for root the
  hierarchy's root (``/sys/fs/cgroup/so/<name>``), for anyone the nearest cgroup around
  the current process that is delegated to us (systemd ``Delegate=``) and can hold the
  controllers. ``memory.max`` + ``memory.swap.max=0``, ``cpu.max``, ``pids.max``.
* **cgroup v1** (one hierarchy per controller): ``<mount>/<our cgroup>/so/<name>`` in
  the memory, cpu and pids hierarchies (in practice: root only).

Every host path (``/sys/fs/cgroup``, ``/proc``) is read under a ``root`` seam so the
tests can fake a v2 or v1 layout in a temporary directory.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import stat
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

from sono.limits.model import Limits, Mechanism

log = logging.getLogger("sono.limits")

# Limit name → cgroup controller that enforces it.
LIMIT_CONTROLLERS: Mapping[str, str] = {"memory": "memory", "cpus": "cpu", "pids": "pids"}
CONTROLLERS: tuple[str, ...] = ("memory", "cpu", "pids")
CPU_PERIOD_US = 100_000
CPU_MIN_QUOTA_US = 1_000  # the kernel's floor for a CFS quota
JAIL_PARENT = "so"  # every jail is <delegated cgroup>/so/<name>
CGROUP_FS = Path("sys/fs/cgroup")
JOIN_FAILED = 125  # exit status of :meth:`CgroupJail.wrap` when it cannot join the cgroup
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


@dataclass(frozen=True)
class CgroupSite:
    """Where jails can be created: controller → the directory that receives
    ``so/<name>`` (on v2 the same directory for every controller)."""

    version: Literal[1, 2]
    dirs: Mapping[str, Path]


# ---------------------------------------------------------------------------- host facts


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return ""


def _keyed(path: Path) -> dict[str, int]:
    """A flat-keyed cgroup file ("oom_kill 3\\nmax 0") as a dict."""
    out: dict[str, int] = {}
    for line in _read(path).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _may_write(path: Path, uid: int) -> bool:
    """Whether ``uid`` may write ``path`` (create entries, for a directory).

    Judged from the mode bits rather than access(2) so that a uid other than ours can be
    evaluated (tests, diagnostics); cgroupfs has no ACLs, so the bits are the truth there.
    """
    try:
        st = path.stat()
        read_only = os.statvfs(path).f_flag & os.ST_RDONLY
    except OSError:
        return False
    if read_only:
        return False
    if uid == 0:
        return True
    groups = {os.getgid(), *os.getgroups()} if uid == os.getuid() else set()
    if st.st_uid == uid:
        w, x = stat.S_IWUSR, stat.S_IXUSR
    elif st.st_gid in groups:
        w, x = stat.S_IWGRP, stat.S_IXGRP
    else:
        w, x = stat.S_IWOTH, stat.S_IXOTH
    need = w | x if stat.S_ISDIR(st.st_mode) else w
    return st.st_mode & need == need


def kernel_version(root: Path = Path("/")) -> tuple[int, int]:
    """(major, minor) of the running kernel; (0, 0) when unknown."""
    release = _read(root / "proc/sys/kernel/osrelease") or (
        os.uname().release if root == Path("/") else ""
    )
    m = re.match(r"(\d+)\.(\d+)", release.strip())
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def in_initial_userns(root: Path) -> bool:
    """Whether ``root``'s process runs in the initial user namespace (real root is root)."""
    fields_ = _read(root / "proc/self/uid_map").split()
    return not fields_ or fields_[:3] == ["0", "0", "4294967295"]


def _own_cgroups(root: Path) -> dict[str, str]:
    """/proc/self/cgroup as controller → path; the v2 line is under the key ""."""
    out: dict[str, str] = {}
    for line in _read(root / "proc/self/cgroup").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            out[controller] = path
    return out


def find_cgroup(*, root: Path = Path("/"), uid: int | None = None) -> CgroupSite | None:
    """The cgroup hierarchy ``uid`` can create jails in, or None (→ rlimits)."""
    uid = os.getuid() if uid is None else uid
    fs = root / CGROUP_FS
    own = _own_cgroups(root)
    if (fs / "cgroup.controllers").is_file():
        return _find_v2(fs, own.get("", "/"), uid)
    return _find_v1(fs, own, uid)


def _find_v2(fs: Path, own: str, uid: int) -> CgroupSite | None:
    parts = [p for p in own.split("/") if p]
    # Deepest first: nest inside whatever already limits us. Root tries the hierarchy's
    # root first (the conventional /sys/fs/cgroup/so), then the same chain.
    chain = ["/".join(parts[:i]) for i in range(len(parts), -1, -1)]
    if uid == 0:
        chain = ["", *chain[:-1]]
    best: tuple[Path, frozenset[str]] | None = None
    for rel in chain:
        base = fs / rel if rel else fs
        # Moving a process needs write access to cgroup.procs of the common ancestor of
        # its old and new cgroup — that is `base` itself for base/so/<name>.
        if not (_may_write(base, uid) and _may_write(base / "cgroup.procs", uid)):
            continue
        usable = _v2_usable(base, uid)
        if usable and (best is None or len(usable) > len(best[1])):
            best = (base, usable)
        if len(usable) == len(CONTROLLERS):
            break
    if best is None:
        return None
    base, usable = best
    return CgroupSite(2, {c: base for c in CONTROLLERS if c in usable})


def _v2_usable(base: Path, uid: int) -> frozenset[str]:
    """Controllers a child of ``base`` can have: already enabled for its children, or
    available and enable-able (we may write cgroup.subtree_control and ``base`` holds no
    processes — the "no internal processes" rule; the real root, which has no
    cgroup.type file, is exempt)."""
    wanted = set(CONTROLLERS)
    enabled = set(_read(base / "cgroup.subtree_control").split()) & wanted
    missing = (set(_read(base / "cgroup.controllers").split()) & wanted) - enabled
    is_root = not (base / "cgroup.type").exists()
    if (
        missing
        and _may_write(base / "cgroup.subtree_control", uid)
        and (is_root or not _read(base / "cgroup.procs").strip())
    ):
        enabled |= missing
    parent = base / JAIL_PARENT
    if parent.exists() and not (
        _may_write(parent, uid) and _may_write(parent / "cgroup.subtree_control", uid)
    ):
        return frozenset()  # someone else's so/
    return frozenset(enabled)


def _find_v1(fs: Path, own: Mapping[str, str], uid: int) -> CgroupSite | None:
    dirs: dict[str, Path] = {}
    for controller in CONTROLLERS:
        mount = fs / controller  # may be a symlink to "cpu,cpuacct"
        if not (mount / "cgroup.procs").is_file() or (mount / "cgroup.controllers").exists():
            continue
        rel = own.get(controller, "/").strip("/")
        # Nest inside our own cgroup; without a cgroup namespace the path may not exist
        # under this mount (containers), and the mount root is then ours.
        base = mount / rel if rel and (mount / rel).is_dir() else mount
        parent = base / JAIL_PARENT
        if _may_write(parent if parent.exists() else base, uid):
            dirs[controller] = base
    return CgroupSite(1, dirs) if dirs else None


# ---------------------------------------------------------------------------- planning


def cpu_quota(cpus: float) -> int:
    """CFS quota in µs per :data:`CPU_PERIOD_US` for ``cpus`` CPUs."""
    return max(CPU_MIN_QUOTA_US, round(cpus * CPU_PERIOD_US))


def _write(path: Path, text: str) -> bool:
    """Write a cgroup control file (never creating it); False, logged, on failure."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    except OSError as exc:
        log.debug("cgroup: cannot open %s: %s", path, exc)
        return False
    try:
        os.write(fd, text.encode())
    except OSError as exc:
        log.debug("cgroup: writing %r to %s: %s", text, path, exc)
        return False
    finally:
        os.close(fd)
    return True


def _pids_in(path: Path) -> set[int]:
    return {int(x) for x in _read(path).split() if x.isdigit()}


# /bin/sh program behind CgroupJail.wrap: "$1".. are cgroup.procs files up to "--", then
# the command. Nothing from the command is ever parsed by the shell: it only runs "$@".
_JOIN = (
    'while [ "$1" != -- ]; do '
    'echo "$$" > "$1" || { echo "so: cannot join cgroup ($1)" >&2; exit 125; }; '
    'shift; done; shift; exec "$@"'
)
# The same in Python: sys.argv[1:] are cgroup.procs files up to "--", then the file to
# execute and the argument vector it gets (argv[0] included); it gets no environment.
_JOIN_PY = (
    "import os, sys\n"
    "args = sys.argv[1:]\n"
    "while args[0] != '--':\n"
    "    try:\n"
    "        with open(args.pop(0), 'w') as f:\n"
    "            f.write(str(os.getpid()))\n"
    "    except OSError as e:\n"
    "        print(f'so: cannot join cgroup ({e})', file=sys.stderr)\n"
    "        sys.exit(125)\n"
    "os.execve(args[1], args[2:], {})\n"
)


class CgroupJail:
    """A cgroup (one per controller on v1) for one sandbox exec group.

    Create with :meth:`create`; prefix the command with :meth:`wrap`; afterwards ask
    :meth:`oom_killed` / :meth:`pids_hit`, and :meth:`remove` it (or use ``with``).
    A jail whose name already exists is adopted and the set limits are rewritten, so
    names must be unique among live jails.
    """

    def __init__(
        self, name: str, version: Literal[1, 2], dirs: Mapping[str, Path], enforced: frozenset[str]
    ) -> None:
        self.name = name
        self.version: Literal[1, 2] = version
        self.dirs = dict(dirs)  # controller → leaf cgroup directory
        self.enforced = enforced  # limit names whose control files were written
        self.leaves: tuple[Path, ...] = tuple(dict.fromkeys(self.dirs.values()))

    @property
    def mechanism(self) -> Mechanism:
        return "cgroup-v2" if self.version == 2 else "cgroup-v1"

    @classmethod
    def create(
        cls, name: str, limits: Limits, *, root: Path = Path("/"), uid: int | None = None
    ) -> CgroupJail | None:
        """Make ``so/<name>`` in every usable controller and write the limits; None when
        there is no writable cgroup. Check :attr:`enforced` for what actually took."""
        if not _NAME.fullmatch(name):
            raise ValueError(f"invalid cgroup name: {name!r}")
        site = find_cgroup(root=root, uid=uid)
        if site is None:
            return None
        dirs = _make_v2(site, name) if site.version == 2 else _make_v1(site, name)
        if not dirs:
            return None
        apply = _apply_v2 if site.version == 2 else _apply_v1
        enforced = frozenset(apply(dirs, limits))
        jail = cls(name, site.version, dirs, enforced)
        missing = {n for n in LIMIT_CONTROLLERS if getattr(limits, n) is not None} - enforced
        if missing:
            log.warning("cgroup %s: could not set %s", name, ", ".join(sorted(missing)))
        return jail

    def wrap(self, argv: Sequence[str], *, executable: str | None = None) -> list[str]:
        """``argv`` behind a host /bin/sh prefix that moves itself into the jail and
        execs it (exit status 125, command not run, when joining fails); wrap the whole
        bwrap command line, so bwrap and everything below it are inside. Injection-free:
        the command reaches the shell only as "$@".

        With ``executable``, that file is run with ``argv`` as its argument vector
        (``argv[0]`` only a name) and an empty environment: the prefix is then this
        Python (``-I -S``), as a POSIX shell cannot choose the ``argv[0]`` of what it
        execs, and Python adds to the environment it inherits (``LC_CTYPE``, when it
        coerces the C locale)."""
        if not argv:
            raise ValueError("wrap needs a command")
        procs = [str(leaf / "cgroup.procs") for leaf in self.leaves]
        if executable is not None:
            join = [sys.executable, "-I", "-S", "-c", _JOIN_PY]
            return [*join, *procs, "--", executable, *argv]
        return ["/bin/sh", "-c", _JOIN, "so-cgroup", *procs, "--", *argv]

    def procs(self) -> set[int]:
        """PIDs in the jail (and any cgroups created below it)."""
        out: set[int] = set()
        for leaf in self.leaves:
            for top, _dirs, _files in os.walk(leaf):
                out |= _pids_in(Path(top) / "cgroup.procs")
        return out

    def oom_killed(self) -> bool:
        """Whether the kernel OOM-killed a process here. v1 without the ``oom_kill``
        counter (Linux < 4.13): whether the limit was hit at all (failcnt)."""
        memory = self.dirs.get("memory")
        if memory is None:
            return False
        if self.version == 2:
            return _keyed(memory / "memory.events").get("oom_kill", 0) > 0
        oom = _keyed(memory / "memory.oom_control")
        if "oom_kill" in oom:
            return oom["oom_kill"] > 0
        return any(
            _read(memory / f).strip() not in ("", "0")
            for f in ("memory.memsw.failcnt", "memory.failcnt")
        )

    def pids_hit(self) -> bool:
        """Whether a fork was refused for reaching ``pids.max``."""
        pids = self.dirs.get("pids")
        return pids is not None and _keyed(pids / "pids.events").get("max", 0) > 0

    def kill_all(self, timeout: float = 5.0) -> bool:
        """SIGKILL everything in the jail; True once it is empty. Uses cgroup.kill (v2,
        Linux >= 5.14) when present, else sweeps cgroup.procs until nothing is left."""
        if self.version == 2:
            for leaf in self.leaves:
                if (leaf / "cgroup.kill").exists():
                    _write(leaf / "cgroup.kill", "1")
        deadline = time.monotonic() + timeout
        me = os.getpid()
        while True:
            pids = self.procs() - {me, 0, 1}
            if not pids:
                return True
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                log.warning("cgroup %s: %d processes survived SIGKILL", self.name, len(pids))
                return False
            time.sleep(0.01)

    def remove(self) -> None:
        """Kill everything, then remove the jail's cgroups (races ignored)."""
        self.kill_all()
        for leaf in self.leaves:
            for top, _dirs, _files in os.walk(leaf, topdown=False):
                _rmdir(Path(top))
            with contextlib.suppress(OSError):
                (leaf.parent).rmdir()  # so/, when no other jail is left in it

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"CgroupJail({self.name!r}, v{self.version}, {sorted(self.dirs)})"


def _rmdir(path: Path, attempts: int = 50) -> None:
    for _ in range(attempts):
        try:
            path.rmdir()
        except FileNotFoundError:
            return
        except OSError as exc:
            # EBUSY: the last processes are still exiting. Anything else (ENOTEMPTY on
            # a non-cgroup fs, EACCES) will not get better.
            if exc.errno != errno.EBUSY:
                log.debug("cgroup: rmdir %s: %s", path, exc)
                return
            time.sleep(0.02)
        else:
            return


def _make_v2(site: CgroupSite, name: str) -> dict[str, Path]:
    base = next(iter(site.dirs.values()))
    controllers = [c for c in CONTROLLERS if c in site.dirs]
    enabled = set(_read(base / "cgroup.subtree_control").split())
    for c in controllers:
        if c not in enabled:
            _write(base / "cgroup.subtree_control", f"+{c}")
    parent = base / JAIL_PARENT
    try:
        parent.mkdir(exist_ok=True)
        for c in controllers:
            _write(parent / "cgroup.subtree_control", f"+{c}")
        leaf = parent / name
        leaf.mkdir(exist_ok=True)
    except OSError as exc:
        log.warning("cgroup v2: cannot create %s/%s: %s", parent, name, exc)
        return {}
    return dict.fromkeys(controllers, leaf)


def _make_v1(site: CgroupSite, name: str) -> dict[str, Path]:
    dirs: dict[str, Path] = {}
    for controller, base in site.dirs.items():
        leaf = base / JAIL_PARENT / name
        try:
            leaf.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("cgroup v1: cannot create %s: %s", leaf, exc)
            continue
        dirs[controller] = leaf
    return dirs


def _apply_v2(dirs: Mapping[str, Path], limits: Limits) -> set[str]:
    done: set[str] = set()
    if limits.memory is not None and "memory" in dirs:
        leaf = dirs["memory"]
        if _write(leaf / "memory.max", str(limits.memory)):
            done.add("memory")
            if (leaf / "memory.swap.max").exists():  # absent without swap accounting
                _write(leaf / "memory.swap.max", "0")
    if (
        limits.pids is not None
        and "pids" in dirs
        and _write(dirs["pids"] / "pids.max", str(limits.pids))
    ):
        done.add("pids")
    if limits.cpus is not None and "cpu" in dirs:
        quota = f"{cpu_quota(limits.cpus)} {CPU_PERIOD_US}"
        if _write(dirs["cpu"] / "cpu.max", quota):
            done.add("cpus")
    return done


def _apply_v1(dirs: Mapping[str, Path], limits: Limits) -> set[str]:
    done: set[str] = set()
    if limits.memory is not None and "memory" in dirs:
        leaf, value = dirs["memory"], str(limits.memory)
        memsw = leaf / "memory.memsw.limit_in_bytes"
        # memsw must stay >= limit_in_bytes: limit first, unless an adopted cgroup has a
        # lower memsw already (then memsw first).
        ok = _write(leaf / "memory.limit_in_bytes", value)
        if memsw.exists():
            _write(memsw, value)
        if not ok:
            ok = _write(leaf / "memory.limit_in_bytes", value)
        if ok:
            done.add("memory")
    if (
        limits.pids is not None
        and "pids" in dirs
        and _write(dirs["pids"] / "pids.max", str(limits.pids))
    ):
        done.add("pids")
    if limits.cpus is not None and "cpu" in dirs:
        leaf = dirs["cpu"]
        if _write(leaf / "cpu.cfs_period_us", str(CPU_PERIOD_US)) and _write(
            leaf / "cpu.cfs_quota_us", str(cpu_quota(limits.cpus))
        ):
            done.add("cpus")
    return done


# ---------------------------------------------------------------------------- rlimits


def cgroup_counters(dirs: Mapping[str, Path]) -> tuple[int, int]:
    """(OOM kills, pids-limit hits) from a cgroup's memory and pids directories (v1 or
    v2 file names), 0 where a counter does not exist."""
    memory, pids = dirs.get("memory"), dirs.get("pids")
    oom = 0
    if memory is not None:
        oom = _keyed(memory / "memory.events").get("oom_kill", 0) or _keyed(
            memory / "memory.oom_control"
        ).get("oom_kill", 0)
    hits = _keyed(pids / "pids.events").get("max", 0) if pids is not None else 0
    return oom, hits
