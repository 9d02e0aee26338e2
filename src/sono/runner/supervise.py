"""Run inside the Docker sandbox as root (``python3 -I -S -c <this file> ...``): the
parent of every command so runs there as the agent, and the reaper of what such a command
leaves behind. Standalone: the image's stdlib only, never anything the agent can write.

``run UID GID TOKEN CWD ARGV...``
    Fork; the child drops to UID/GID (no supplementary groups), enters CWD and execs ARGV
    with this environment; wait for it; then kill every process it left behind (below); exit with
    its code (128+N for signal N). The agent cannot signal, trace or outlive this root
    parent, and while it runs ``/run/so-run-TOKEN`` names it, so ``reap --end TOKEN`` can
    end its command early (a timeout, a limit, Ctrl-C).
``reap [--end TOKEN]``
    Kill every process the command did not own: see ``targets``.

What is kept is decided by what the agent cannot forge: a process whose parent is outside
the container's pid namespace (parent pid 0) was started by the engine (``docker exec``)
— an open ``so shell``, or another so command running now. Every unprivileged process
whose ancestry does not reach such a process (init, pid 1, is not one: orphans end up
there) is killed, whatever its name, environment, session or uid fields say.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import time
from pathlib import Path

PIDFILE = "/run/so-run-{token}"
TOKEN = re.compile(r"[0-9a-f]{8,64}\Z")
# A forking daemon can only add processes between our listing and our kill: a pass that
# finds no new one proves none is left. Bounded, so a reap always ends.
MAX_PASSES = 2000
MAX_SECONDS = 20.0

Proc = tuple[int, int, bool, int]  # parent pid, start time, unprivileged, zombie (0/1)


def read_proc(pid: int) -> Proc | None:
    """(parent, start time, unprivileged, zombie) of ``pid``; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        status = Path(f"/proc/{pid}/status").read_bytes()
    except OSError:
        return None
    fields = stat.rsplit(b")", 1)[1].split()
    uids = next((ln.split()[1:] for ln in status.splitlines() if ln.startswith(b"Uid:")), [])
    # Every uid field: the owner of /proc/PID reads as root for a non-dumpable process.
    unprivileged = any(u != b"0" for u in uids)
    # A zombie leader (it left with exit, not exit_group) while its other threads run is a
    # live process: killing its pid ends them all. Only a whole dead group is left to init.
    zombie = fields[0] in (b"Z", b"X") and not other_threads(pid)
    return int(fields[1]), int(fields[19]), unprivileged, int(zombie)


def other_threads(pid: int) -> bool:
    """Does ``pid``'s thread group have a thread besides its leader?"""
    try:
        return any(t.name != str(pid) for t in Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False


def table() -> dict[int, Proc]:
    procs: dict[int, Proc] = {}
    for entry in Path("/proc").iterdir():
        name = entry.name
        if name.isdigit():
            found = read_proc(int(name))
            if found is not None:
                procs[int(name)] = found
    return procs


def targets(procs: dict[int, Proc], ending: set[int], me: int) -> set[int]:
    """Unprivileged, live processes whose ancestry reaches no engine-started process
    other than init and ``ending`` (a chain that breaks counts as an orphan)."""
    kept: dict[int, bool] = {}

    def keep(pid: int) -> bool:
        chain = []
        verdict = False
        for _ in range(4096):
            if pid in kept:
                verdict = kept[pid]
                break
            chain.append(pid)
            entry = procs.get(pid)
            if entry is None:
                break
            if entry[0] == 0:
                verdict = pid != 1 and pid not in ending
                break
            pid = entry[0]
        for seen in chain:
            kept[seen] = verdict
        return verdict

    return {
        pid
        for pid, (_, _, unprivileged, zombie) in procs.items()
        if unprivileged and not zombie and pid != me and not keep(pid)
    }


def reap(ending: set[int]) -> int:
    """Kill the targets until a pass finds no new one; how many were killed."""
    me = os.getpid()
    signalled: set[tuple[int, int]] = set()
    deadline = time.monotonic() + MAX_SECONDS
    for _ in range(MAX_PASSES):
        procs = table()
        fresh = {p for p in targets(procs, ending, me) if (p, procs[p][1]) not in signalled}
        if not fresh:
            return len(signalled)
        for pid in fresh:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            signalled.add((pid, procs[pid][1]))
        if time.monotonic() > deadline:
            break
    print("so: processes left behind could not all be killed", file=sys.stderr)
    return len(signalled)


def running(token: str) -> set[int]:
    """The ``run`` parent ``token`` names, while it still runs (else nothing)."""
    try:
        pid, start = (int(x) for x in Path(PIDFILE.format(token=token)).read_text().split())
    except (OSError, ValueError):
        return set()
    entry = read_proc(pid)
    return {pid} if entry is not None and entry[1] == start and not entry[2] else set()


SETPRIV = "/usr/bin/setpriv"  # util-linux, in the image's read-only /usr


def drop_to(uid: int, gid: int) -> list[str]:
    return [
        f"--reuid={uid}",
        f"--regid={gid}",
        "--clear-groups",
        "--bounding-set=-all",
        "--inh-caps=-all",
        "--ambient-caps=-all",
    ]


def run(uid: int, gid: int, token: str, cwd: str, argv: list[str]) -> int:
    me = os.getpid()
    pidfile = Path(PIDFILE.format(token=token))
    entry = read_proc(me)
    pidfile.write_text(f"{me} {entry[1] if entry else 0}\n")
    try:
        child = os.fork()
        if child == 0:
            try:
                for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them
                    signal.signal(sig, signal.SIG_DFL)
                os.chdir(cwd)
                if Path(SETPRIV).is_file():
                    # Drop the uid and groups AND the capability bounding set: the agent's
                    # processes hold no capability at all, not even a bounding one.
                    os.execv(SETPRIV, [SETPRIV, *drop_to(uid, gid), "--", *argv])  # noqa: S606
                os.setgroups([])
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
                os.execvp(argv[0], argv)  # noqa: S606 - the command so was asked to run
            except OSError as exc:
                print(f"so: cannot run {argv[0]} in {cwd}: {exc.strerror}", file=sys.stderr)
            os._exit(127)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_IGN)
        _, status = os.waitpid(child, 0)
        code = os.waitstatus_to_exitcode(status)
        reap({me})
        return 128 - code if code < 0 else code
    finally:
        with contextlib.suppress(OSError):
            pidfile.unlink()


def main(args: list[str]) -> int:
    if args[:1] == ["run"] and len(args) >= 6 and TOKEN.match(args[3]):
        return run(int(args[1]), int(args[2]), args[3], args[4], args[5:])
    if args[:1] == ["reap"]:
        end = args[2] if args[1:2] == ["--end"] and len(args) == 3 else ""
        reap(running(end) if TOKEN.match(end) else set())
        return 0
    print("usage: run UID GID TOKEN CWD ARGV... | reap [--end TOKEN]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
