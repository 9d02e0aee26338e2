"""Resource limits for sandboxes: which mechanism can enforce each limit here, and the
enforcement itself.

Mechanisms, best first:

* **cgroup v2** (unified hierarchy): a child of a cgroup we may write to — for root the
  hierarchy's root (``/sys/fs/cgroup/so/<name>``), for anyone the nearest cgroup around
  the current process that is delegated to us (systemd ``Delegate=``) and can hold the
  controllers. ``memory.max`` + ``memory.swap.max=0``, ``cpu.max``, ``pids.max``.
* **cgroup v1** (one hierarchy per controller): ``<mount>/<our cgroup>/so/<name>`` in
  the memory, cpu and pids hierarchies (in practice: root only).
* **rlimit**: without a cgroup only the process count has a usable rlimit
  (``RLIMIT_NPROC``, see :func:`plan_bwrap`); memory and CPU rate have none that works
  for coding agents.
* **watchdog**: the disk limit is the size of the workspace tree, measured by
  :class:`DiskWatch`; ``RLIMIT_FSIZE`` adds a per-file cap.
* **docker**: the engine applies memory, CPU and pids limits through its own cgroups.

Every host path (``/sys/fs/cgroup``, ``/proc``) is read under a ``root`` seam so the
tests can fake a v2 or v1 layout in a temporary directory.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

log = logging.getLogger("sono.limits")

Mechanism = Literal["cgroup-v2", "cgroup-v1", "docker", "microvm", "rlimit", "watchdog", "none"]

MECHANISM_LABELS: Mapping[Mechanism, str] = {
    "cgroup-v2": "cgroup v2",
    "cgroup-v1": "cgroup v1",
    "docker": "Docker (engine cgroup)",
    "microvm": "microVM (the guest's own RAM/vCPUs)",
    "rlimit": "rlimit",
    "watchdog": "watchdog",
    "none": "not enforced",
}

# Limit name → cgroup controller that enforces it.
LIMIT_CONTROLLERS: Mapping[str, str] = {"memory": "memory", "cpus": "cpu", "pids": "pids"}
CONTROLLERS: tuple[str, ...] = ("memory", "cpu", "pids")
CPU_PERIOD_US = 100_000
CPU_MIN_QUOTA_US = 1_000  # the kernel's floor for a CFS quota
JAIL_PARENT = "so"  # every jail is <delegated cgroup>/so/<name>
NPROC_PER_USERNS = (5, 14)  # RLIMIT_NPROC counted per user namespace (ucounts) from here
CGROUP_FS = Path("sys/fs/cgroup")
JOIN_FAILED = 125  # exit status of :meth:`CgroupJail.wrap` when it cannot join the cgroup
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


@dataclass(frozen=True)
class Limits:
    """What a sandbox may use; ``None`` means unlimited.

    ``memory`` and ``disk`` are bytes (``disk``: the workspace's own writes), ``cpus`` a
    number of CPUs, ``pids`` a process/thread count, ``wall`` seconds per iteration
    (enforced by the loop's timeout, informational here).
    """

    memory: int | None = None
    cpus: float | None = None
    pids: int | None = None
    disk: int | None = None
    wall: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and not value > 0:
                raise ValueError(f"limit {f.name} must be > 0, got {value!r}")

    def any(self) -> bool:
        """True when at least one limit is set."""
        return any(getattr(self, f.name) is not None for f in fields(self))


@dataclass(frozen=True)
class Enforcement:
    """How one limit is enforced: ``value`` is the limit for humans ("4.0 GiB")."""

    limit: str
    mechanism: Mechanism
    detail: str
    value: str = ""


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


def _in_initial_userns(root: Path) -> bool:
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


def format_size(n: int) -> str:
    """Bytes for humans: "4.0 GiB", "512.0 MiB", "900 B"."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def _value(limit: str, limits: Limits) -> str:
    v = getattr(limits, limit)
    if v is None:
        return ""
    if limit in ("memory", "disk"):
        return format_size(int(v))
    if limit == "cpus":
        return f"{float(v):g}"
    return str(v)


def cpu_quota(cpus: float) -> int:
    """CFS quota in µs per :data:`CPU_PERIOD_US` for ``cpus`` CPUs."""
    return max(CPU_MIN_QUOTA_US, round(cpus * CPU_PERIOD_US))


def _cgroup_detail(limit: str, limits: Limits, site: CgroupSite) -> str:
    where = f"in {site.dirs[LIMIT_CONTROLLERS[limit]] / JAIL_PARENT}/<sandbox>"
    if limit == "memory":
        if site.version == 2:
            files = f"memory.max={limits.memory}, memory.swap.max=0"
        else:
            files = f"memory.limit_in_bytes={limits.memory}"
            if (site.dirs["memory"] / "memory.memsw.limit_in_bytes").exists():
                files += " and memory.memsw.limit_in_bytes (no swap)"
        return f"{files} {where}; the kernel OOM-kills inside the sandbox"
    if limit == "cpus":
        quota = cpu_quota(limits.cpus or 0)
        if site.version == 2:
            return f"cpu.max={quota} {CPU_PERIOD_US} {where}"
        return f"cpu.cfs_quota_us={quota} per cpu.cfs_period_us={CPU_PERIOD_US} {where}"
    return f"pids.max={limits.pids} {where}; fork fails with EAGAIN beyond it"


def _fallback(
    limit: str, limits: Limits, uid: int, kernel: tuple[int, int], root: Path
) -> tuple[Mechanism, str]:
    controller = LIMIT_CONTROLLERS[limit]
    no_cgroup = f"no writable cgroup with the {controller} controller"
    if limit == "memory":
        return "none", (
            f"{no_cgroup}; RLIMIT_AS is not used: it caps virtual address space, which "
            "V8/Node (and Go, the JVM) reserve far beyond what they touch, so they would "
            "fail to start (and RLIMIT_RSS is ignored by Linux)"
        )
    if limit == "cpus":
        return "none", (
            f"{no_cgroup}; rlimits have no CPU-rate limit (RLIMIT_CPU caps total CPU "
            "seconds and would kill a long-running agent)"
        )
    if uid == 0 and _in_initial_userns(root):
        return "none", (
            f"{no_cgroup}; RLIMIT_NPROC does not apply to root (uid 0 is exempt from it)"
        )
    if kernel < NPROC_PER_USERNS:
        return "none", (
            f"{no_cgroup}; on Linux < 5.14 RLIMIT_NPROC counts every process of uid {uid} "
            "on the host, not only the sandbox's, so it is not set (the sandbox would fail "
            f"to fork once your other processes reach {limits.pids})"
        )
    return "rlimit", (
        f"RLIMIT_NPROC={limits.pids} set inside the sandbox ({no_cgroup}): since Linux "
        "5.14 it counts per user namespace, and bwrap gives the sandbox its own, so only "
        "the sandbox's processes count (set before bwrap, the namespace would take it as a "
        f"ceiling on all of uid {uid}'s processes)"
    )


def _disk(limits: Limits, *, fsize: bool) -> Enforcement:
    detail = (
        "DiskWatch measures the blocks allocated under the workspace, on its own filesystem, "
        f"each file, directory or link counted as at least {ENTRY_MIN_BYTES // 1024} KiB "
        f"(an inode budget), about every second and stops the sandbox above "
        f"{_value('disk', limits)}"
    )
    if fsize:
        detail += "; RLIMIT_FSIZE caps any single file at the same size (SIGXFSZ)"
    return Enforcement("disk", "watchdog", detail, _value("disk", limits))


def plan_bwrap(
    limits: Limits,
    *,
    root: Path = Path("/"),
    uid: int | None = None,
    kernel: tuple[int, int] | None = None,
) -> dict[str, Enforcement]:
    """How each set limit of memory/cpus/pids/disk is enforced for a bwrap sandbox here.

    Pure: reads the host (under ``root``), creates nothing. ``uid`` defaults to ours,
    ``kernel`` to the running kernel. Without a writable cgroup: pids → RLIMIT_NPROC
    ("rlimit") only where it counts the sandbox alone (Linux >= 5.14, non-root; see
    :func:`rlimit_prefix` for where to apply it), else "none"; memory and cpus → "none".
    """
    uid = os.getuid() if uid is None else uid
    kernel = kernel_version(root) if kernel is None else kernel
    wants_cgroup = any(getattr(limits, name) is not None for name in LIMIT_CONTROLLERS)
    site = find_cgroup(root=root, uid=uid) if wants_cgroup else None
    plan: dict[str, Enforcement] = {}
    for limit, controller in LIMIT_CONTROLLERS.items():
        if getattr(limits, limit) is None:
            continue
        if site is not None and controller in site.dirs:
            mechanism: Mechanism = "cgroup-v2" if site.version == 2 else "cgroup-v1"
            detail = _cgroup_detail(limit, limits, site)
        else:
            mechanism, detail = _fallback(limit, limits, uid, kernel, root)
        plan[limit] = Enforcement(limit, mechanism, detail, _value(limit, limits))
    if limits.disk is not None:
        plan["disk"] = _disk(limits, fsize=True)
    return plan


def plan_docker(limits: Limits) -> dict[str, Enforcement]:
    """How each set limit is enforced for a Docker sandbox (see :func:`docker_kwargs`)."""
    kw = docker_kwargs(limits)
    plan: dict[str, Enforcement] = {}
    if limits.memory is not None:
        plan["memory"] = Enforcement(
            "memory",
            "docker",
            f"mem_limit={kw['mem_limit']}, memswap_limit={kw['memswap_limit']} (no swap); "
            "the engine's cgroup OOM-kills inside the container",
            _value("memory", limits),
        )
    if limits.cpus is not None:
        plan["cpus"] = Enforcement(
            "cpus", "docker", f"nano_cpus={kw['nano_cpus']} (CFS quota)", _value("cpus", limits)
        )
    if limits.pids is not None:
        plan["pids"] = Enforcement(
            "pids", "docker", f"pids_limit={kw['pids_limit']}", _value("pids", limits)
        )
    if limits.disk is not None:
        plan["disk"] = _disk(limits, fsize=False)
    return plan


def describe(plan: Mapping[str, Enforcement]) -> list[str]:
    """One line per limit for ``so doctor``: "memory 4.0 GiB: cgroup v1 (…)"."""
    lines = []
    for e in plan.values():
        head = f"{e.limit} {e.value}" if e.value else e.limit
        lines.append(f"{head}: {MECHANISM_LABELS[e.mechanism]} ({e.detail})")
    return lines


def docker_kwargs(limits: Limits) -> dict[str, Any]:
    """Keyword arguments for docker-py ``containers.create`` (``{}`` when none are set)."""
    kw: dict[str, Any] = {}
    if limits.memory is not None:
        kw["mem_limit"] = limits.memory
        kw["memswap_limit"] = limits.memory  # memory + swap = memory: no swap
    if limits.cpus is not None:
        kw["nano_cpus"] = round(limits.cpus * 1e9)
    if limits.pids is not None:
        kw["pids_limit"] = limits.pids
    return kw


# ---------------------------------------------------------------------------- cgroup jail


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


def _prlimit() -> str | None:
    return shutil.which("prlimit")


# Fallback when util-linux prlimit is missing: argv[1] nproc, argv[2] fsize ("-" = unset),
# argv[3] "--", then the command, exec'd as is.
_PY_RLIMIT = (
    "import os, resource, sys\n"
    "for res, v in ((resource.RLIMIT_NPROC, sys.argv[1]), (resource.RLIMIT_FSIZE, sys.argv[2])):\n"
    "    if v != '-':\n"
    "        resource.setrlimit(res, (int(v), int(v)))\n"
    "os.execvp(sys.argv[4], sys.argv[4:])\n"
)


def rlimit_prefix(limits: Limits, *, nproc: bool, fsize: int | None) -> list[str]:
    """A command prefix (ending in ``--``) that sets RLIMIT_NPROC to ``limits.pids``
    (when ``nproc``) and RLIMIT_FSIZE to ``fsize`` bytes, soft = hard; ``[]`` when
    neither applies. util-linux ``prlimit`` (absolute host path), else ``python3 -c``.

    Put it *inside* the sandbox (after bwrap's command separator): a user namespace
    records its creator's RLIMIT_NPROC as the ceiling for the user's processes in the
    parent namespace, so applied before bwrap it would count all of the user's processes.
    """
    n = limits.pids if nproc else None
    if n is None and fsize is None:
        return []
    tool = _prlimit()
    if tool is not None:
        argv = [tool]
        if n is not None:
            argv.append(f"--nproc={n}:{n}")
        if fsize is not None:
            argv.append(f"--fsize={fsize}:{fsize}")
        return [*argv, "--"]
    return [
        "python3",
        "-c",
        _PY_RLIMIT,
        "-" if n is None else str(n),
        "-" if fsize is None else str(fsize),
        "--",
    ]


# ---------------------------------------------------------------------------- disk watch


# What DiskWatch charges at least for every entry (file, directory, link, whiteout): an
# empty file allocates no block but takes an inode, and a flood of them would exhaust the
# host filesystem's inodes inside any byte budget. 4 KiB (a block) per inode ties the
# inode budget to the disk limit: a 1 GiB limit allows 262 144 entries.
ENTRY_MIN_BYTES = 4096


def tree_size(path: Path, *, entry_min: int = 0) -> int:
    """Bytes allocated under ``path`` (st_blocks * 512, so sparse files count what they
    use), each entry counted as at least ``entry_min`` bytes: symlinks not followed,
    other filesystems (mount points) neither counted nor entered, a hard-linked inode
    counted once. Entries that vanish mid-walk are skipped.

    Cost: one lstat per entry — roughly 1-3 µs each in CPython, so ~0.1-0.3 s of CPU per
    100 000 files (a big node_modules).
    """
    try:
        top = os.lstat(path)
    except OSError:
        return 0
    total = max(top.st_blocks * 512, entry_min)
    if not stat.S_ISDIR(top.st_mode):
        return total
    dev = top.st_dev
    seen: set[int] = set()
    stack = [os.fspath(path)]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = list(it)
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_dev != dev:
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            if st.st_nlink > 1 and not is_dir:
                if st.st_ino in seen:
                    continue
                seen.add(st.st_ino)
            total += max(st.st_blocks * 512, entry_min)
            if is_dir:
                stack.append(entry.path)
    return total


class DiskWatch:
    """A daemon thread that measures ``path`` (and ``also``) with :func:`tree_size` (every entry at
    least :data:`ENTRY_MIN_BYTES`, so the limit bounds inodes too) and calls
    ``on_exceed(size)`` once, the first time ``size > limit``, then stops.

    It waits at least ``interval`` seconds between walks, and at least
    ``(1 / budget - 1)`` times the last walk's duration, so on a huge tree it uses at
    most ``budget`` (20 %) of one core. The first walk starts immediately.
    """

    def __init__(
        self,
        path: Path,
        limit: int,
        on_exceed: Callable[[int], None],
        interval: float = 1.0,
        *,
        budget: float = 0.2,
        also: Sequence[Path] = (),
    ) -> None:
        if limit <= 0 or interval <= 0 or not 0 < budget <= 1:
            raise ValueError("DiskWatch needs limit > 0, interval > 0 and 0 < budget <= 1")
        self.path = path
        self.also = tuple(also)  # more writable places counted in the same budget
        self.limit = limit
        self.interval = interval
        self.budget = budget
        self._on_exceed = on_exceed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.size: int | None = None  # last measurement
        self.exceeded = False

    def start(self) -> Self:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"so-diskwatch:{self.path}", daemon=True
            )
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            size = sum(tree_size(p, entry_min=ENTRY_MIN_BYTES) for p in (self.path, *self.also))
            took = time.monotonic() - began
            self.size = size
            if size > self.limit:
                self.exceeded = True
                try:
                    self._on_exceed(size)
                except Exception:
                    log.exception("DiskWatch: on_exceed failed for %s", self.path)
                return
            self._stop.wait(max(self.interval, took * (1 / self.budget - 1)))

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# ---------------------------------------------------------------------------- guard


class Guard:
    """Watches one agent run for a limit being hit; :meth:`check` (polled by the caller)
    returns ``"memory"``, ``"pids"`` or ``"disk"`` once one was, so the run is killed and
    recorded as such. Counters are read relative to the start (a cgroup may be reused)."""

    def __init__(
        self,
        *,
        jail: CgroupJail | None = None,
        disk: DiskWatch | None = None,
        counters: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        self.jail = jail
        self.disk = disk
        self.counters = counters  # (oom kills, pids-limit hits) of a cgroup we do not own
        self._base = counters() if counters is not None else (0, 0)

    def check(self) -> str | None:
        if self.disk is not None and self.disk.exceeded:
            return "disk"
        if self.jail is not None:
            if self.jail.oom_killed():
                return "memory"
            if self.jail.pids_hit():
                return "pids"
        if self.counters is not None:
            oom, pids = self.counters()
            if oom > self._base[0]:
                return "memory"
            if pids > self._base[1]:
                return "pids"
        return None


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
