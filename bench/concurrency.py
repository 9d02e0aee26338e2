#!/usr/bin/env python3
"""Benchmark: 20 concurrent bwrap sandboxes running a small scripted agent.

Creates 20 sandboxes from one small repo, then, per round, runs one iteration in each at the
same time (20 concurrent ``so continue ID -i 1 --yes -q`` processes) with a custom agent that
sleeps 1 s, writes a file and commits. Measured in the same run, rounds interleaved:

  * baseline: the same agent script run 20 times concurrently in 20 plain clones, no `so`,
    no sandbox;
  * 20 sandboxes concurrently; and 1 sandbox alone (the same command, for contention);
  * memory: every 0.1 s a sampler reads VmRSS (``/proc/PID/status``) and Pss
    (``/proc/PID/smaps_rollup``) of every process in each `so` process's tree and splits it
    into the `so` process itself, the sandbox's processes (the two bwrap processes, the
    ``sh`` init and so's own git execs) and the agent's subtree (``sh bench-agent.sh`` and
    its children). Per sandbox and round it keeps the peak of each part; the table gives the
    median over all sandboxes and rounds.

Usage: python bench/concurrency.py [--sandboxes 20] [--rounds 3]   Prints a markdown section.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from benchlib import (
    IDENT,
    bench_env,
    git,
    main_guard,
    median,
    ratio,
    run,
    say,
    so_command,
    table,
    verdict,
)

from sono.backends.bwrap import BwrapBackend
from sono.sandbox import Sandbox, create_sandbox, remove_sandbox
from sono.state import Store
from sono.workspace import inspect_host

GOAL_MB = 10.0  # the goal: so + sandbox overhead per sandbox, bwrap
SAMPLE_S = 0.1
AGENT_SCRIPT = """#!/bin/sh
# The benchmark's agent: think for a second, write a file, commit it.
sleep 1
echo "iteration ${SO_ITERATION:-0} $(date +%s%N)" > "out-${SO_ITERATION:-0}.txt"
git add -A
git commit -q -m "bench agent: iteration ${SO_ITERATION:-0}"
"""
AGENT_ARGV = ("sh", "bench-agent.sh")
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.invalid",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.invalid",
}


# ------------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    comm: str


def _read(path: str) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except OSError:  # the process ended between listing and reading
        return None


def process_table() -> dict[int, ProcInfo]:
    table_: dict[int, ProcInfo] = {}
    for dirent in os.scandir("/proc"):
        entry = dirent.name
        if not entry.isdigit():
            continue
        raw = _read(f"/proc/{entry}/stat")
        if raw is None:
            continue
        text = raw.decode(errors="replace")
        comm = text[text.find("(") + 1 : text.rfind(")")]
        fields = text[text.rfind(")") + 2 :].split()
        table_[int(entry)] = ProcInfo(int(entry), int(fields[1]), comm)
    return table_


def memory_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, Pss) in kB; zeros when the process is gone or a kernel thread."""
    rss = pss = 0
    status = _read(f"/proc/{pid}/status")
    for line in (status or b"").splitlines():
        if line.startswith(b"VmRSS:"):
            rss = int(line.split()[1])
    rollup = _read(f"/proc/{pid}/smaps_rollup")
    for line in (rollup or b"").splitlines():
        if line.startswith(b"Pss:"):
            pss = int(line.split()[1])
    return rss, pss


def is_agent(pid: int) -> bool:
    """``sh bench-agent.sh`` (so resolves ``sh`` to its real path, e.g. ``/usr/bin/dash``);
    not the init ``/bin/sh -c … so-init sh bench-agent.sh`` before its ``exec``."""
    argv = (_read(f"/proc/{pid}/cmdline") or b"").split(b"\0")
    return len(argv) > 1 and argv[1] == AGENT_ARGV[1].encode()


@dataclass
class Peaks:
    """Peak memory (kB) of one tree's parts over one round: [rss, pss] each."""

    so: list[int] = field(default_factory=lambda: [0, 0])
    sandbox: list[int] = field(default_factory=lambda: [0, 0])
    agent: list[int] = field(default_factory=lambda: [0, 0])
    overhead: list[int] = field(default_factory=lambda: [0, 0])  # so + sandbox, same instant


def _raise(peak: list[int], now: Iterable[int]) -> None:
    for k, value in enumerate(now):
        peak[k] = max(peak[k], value)


class Sampler:
    """Samples the trees under ``roots`` every SAMPLE_S seconds in a thread.

    ``root_is_so``: the root is a `so` process (its own memory is "so", its non-agent
    descendants "sandbox"); otherwise the root is the agent itself.
    """

    def __init__(self, roots: list[int], *, root_is_so: bool) -> None:
        self.peaks = {pid: Peaks() for pid in roots}
        self.root_is_so = root_is_so
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(SAMPLE_S)

    def sample(self) -> None:
        procs = process_table()
        children: dict[int, list[int]] = {}
        for p in procs.values():
            children.setdefault(p.ppid, []).append(p.pid)
        for root, peaks in self.peaks.items():
            if root not in procs:
                continue
            parts = {"so": [0, 0], "sandbox": [0, 0], "agent": [0, 0]}
            stack = [(root, not self.root_is_so)]
            while stack:
                pid, in_agent = stack.pop()
                in_agent = in_agent or is_agent(pid)
                if pid == root and self.root_is_so:
                    part = "so"
                else:
                    part = "agent" if in_agent else "sandbox"
                for k, value in enumerate(memory_kb(pid)):
                    parts[part][k] += value
                stack += [(child, in_agent) for child in children.get(pid, ())]
            _raise(peaks.so, parts["so"])
            _raise(peaks.sandbox, parts["sandbox"])
            _raise(peaks.agent, parts["agent"])
            _raise(
                peaks.overhead, (a + b for a, b in zip(parts["so"], parts["sandbox"], strict=True))
            )


# ------------------------------------------------------------------------------- setup


def make_repo(root: Path) -> Path:
    repo = root / "repo"
    (repo / "specs").mkdir(parents=True)
    run(["git", "init", "-q", "-b", "main", str(repo)])
    for i in range(30):
        (repo / f"file{i}.txt").write_text(f"{i}\n")
    (repo / "specs" / "prompt.md").write_text("bench: write a file and commit it\n")
    (repo / "bench-agent.sh").write_text(AGENT_SCRIPT)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "init")
    return repo


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """Ctrl-C-like stop for children still running (so records the interruption), then
    kill whatever is left."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def concurrently(
    commands: list[tuple[list[str], Path | None, dict[str, str] | None]], *, root_is_so: bool
) -> tuple[float, list[Peaks]]:
    """Start every command at once; wait for all. Returns (wall s, peaks per command)."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        start = time.perf_counter()
        for argv, cwd, env in commands:
            procs.append(
                subprocess.Popen(
                    argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
                )
            )
        with Sampler([p.pid for p in procs], root_is_so=root_is_so) as sampler:
            errors = [p.communicate()[1] for p in procs]
        wall = time.perf_counter() - start
    finally:
        stop_all(procs)
    for (argv, _, _), p, err in zip(commands, procs, errors, strict=True):
        if p.returncode not in (0, 5):  # 5: all iterations ran, status not done — expected
            raise RuntimeError(
                f"{' '.join(argv)} exited {p.returncode}: "
                f"{err.decode(errors='replace').strip()[-500:]}"
            )
    return wall, list(sampler.peaks.values())


# ------------------------------------------------------------------------------- run


@dataclass
class Results:
    wall: dict[str, list[float]] = field(default_factory=lambda: {"raw": [], "so": [], "one": []})
    so_peaks: list[Peaks] = field(default_factory=list)
    raw_peaks: list[Peaks] = field(default_factory=list)


def bench(root: Path, store: Store, count: int, rounds: int) -> Results:
    repo = make_repo(root)
    clones = []
    for i in range(count):
        clone = root / "clones" / f"c{i}"
        run(["git", *IDENT, "clone", "-q", str(repo), str(clone)])
        clones.append(clone)
    sandboxes: list[Sandbox] = []
    try:
        say(f"concurrency: creating {count + 1} sandboxes")
        backend = BwrapBackend()
        host = inspect_host(repo)
        for _ in range(count + 1):
            sandboxes.append(
                create_sandbox(
                    store=store,
                    host=host,
                    harness="custom",
                    backend_name="bwrap",
                    backend=backend,
                    exclude=(),
                    allow_dirty=False,
                    model=None,
                    effort=None,
                    agent_cmd=" ".join(AGENT_ARGV),
                    workspace="auto",
                )
            )
        return _rounds(store, sandboxes, clones, rounds)
    finally:
        for sandbox in sandboxes:
            with contextlib.suppress(Exception):
                remove_sandbox(sandbox)


def _rounds(store: Store, sandboxes: list[Sandbox], clones: list[Path], rounds: int) -> Results:
    so = so_command()
    many, alone = sandboxes[:-1], sandboxes[-1]
    results = Results()

    def raw(n: int) -> None:
        env = {**os.environ, **GIT_IDENTITY, "SO_ITERATION": str(n)}
        wall, peaks = concurrently([(list(AGENT_ARGV), c, env) for c in clones], root_is_so=False)
        results.wall["raw"].append(wall)
        results.raw_peaks += peaks

    def in_sandboxes(n: int) -> None:
        wall, peaks = concurrently(
            [
                ([*so, "continue", sb.record.id, "-i", "1", "--yes", "-q"], None, None)
                for sb in many
            ],
            root_is_so=True,
        )
        check_progress(store, many, n)
        results.wall["so"].append(wall)
        results.so_peaks += peaks

    def one(n: int) -> None:
        wall, _ = concurrently(
            [([*so, "continue", alone.record.id, "-i", "1", "--yes", "-q"], None, None)],
            root_is_so=True,
        )
        check_progress(store, [alone], n + 1)  # + the warm-up iteration
        results.wall["one"].append(wall)

    say("concurrency: warm-up iteration (fills the bytecode cache)")
    concurrently(
        [([*so, "continue", alone.record.id, "-i", "1", "--yes", "-q"], None, None)],
        root_is_so=True,
    )

    cases: list[Callable[[int], None]] = [raw, in_sandboxes, one]
    for n in range(1, rounds + 1):
        say(f"concurrency: round {n}/{rounds}")
        shift = (n - 1) % len(cases)
        for case in cases[shift:] + cases[:shift]:
            case(n)
    return results


def check_progress(store: Store, sandboxes: list[Sandbox], n: int) -> None:
    """Every sandbox has run n iterations, and the agent committed in each."""
    for sb in sandboxes:
        rec = store.load(sb.record.id)
        if rec.iterations != n or rec.commits != n:
            raise RuntimeError(
                f"sandbox {rec.id}: {rec.iterations} iteration(s), "
                f"{rec.commits} commit(s) after round {n}; expected {n}"
            )


def mb(values: Iterable[int]) -> float:
    return median(list(values)) / 1024


def report(r: Results, count: int, rounds: int) -> str:
    raw, so, one = (median(r.wall[k]) for k in ("raw", "so", "one"))
    wall_rows = [
        (f"{count} agents concurrently, no sandbox, no so (baseline)", f"{raw:.2f}", "1.00×"),
        (
            f"{count} sandboxes concurrently (`so continue ID -i 1 --yes -q` each)",
            f"{so:.2f}",
            ratio(so, raw),
        ),
        ("1 sandbox alone (same command)", f"{one:.2f}", ratio(one, raw)),
    ]
    p = r.so_peaks
    overhead = mb(x.overhead[0] for x in p)
    mem_rows = [
        (
            "agent alone, no sandbox (baseline run)",
            f"{mb(x.agent[0] for x in r.raw_peaks):.1f}",
            f"{mb(x.agent[1] for x in r.raw_peaks):.1f}",
            "",
        ),
        (
            "agent alone, in the sandbox",
            f"{mb(x.agent[0] for x in p):.1f}",
            f"{mb(x.agent[1] for x in p):.1f}",
            "",
        ),
        (
            "sandbox: 2 × bwrap + `sh` init + so's git execs",
            f"{mb(x.sandbox[0] for x in p):.1f}",
            f"{mb(x.sandbox[1] for x in p):.1f}",
            "",
        ),
        (
            "`so continue` process (Python)",
            f"{mb(x.so[0] for x in p):.1f}",
            f"{mb(x.so[1] for x in p):.1f}",
            "",
        ),
        (
            "**so + sandbox beyond the agent** (peak of the sum)",
            f"{overhead:.1f}",
            f"{mb(x.overhead[1] for x in p):.1f}",
            verdict(overhead <= GOAL_MB),
        ),
    ]
    return "\n".join(
        [
            f"## {count} concurrent sandboxes (bwrap), scripted agent",
            "",
            "`python bench/concurrency.py`",
            "",
            table(
                (f"wall time, median of {rounds} rounds", "s", "vs baseline"),
                wall_rows,
                right=(1, 2),
            ),
            "",
            table(
                (
                    f"peak memory per sandbox, median of {count} × {rounds}",
                    "RSS MB",
                    "PSS MB",
                    f"goal ≤ {GOAL_MB:.0f} MB (RSS)",
                ),
                mem_rows,
                right=(1, 2),
            ),
            "",
            "- The agent (`--agent-cmd 'sh bench-agent.sh'`, committed in the repo): `sleep 1`, "
            "write a file, `git add -A`, `git commit`. Each round runs the baseline, the "
            f"{count} sandboxes and the lone sandbox one after the other (rotating order); "
            "every sandbox must end the round with one more iteration and one more commit.",
            "- One untimed warm-up iteration (in the lone sandbox) comes first.",
            f"- Memory: a sampler thread reads every process of each tree every {SAMPLE_S} s: "
            "`VmRSS` from `/proc/PID/status` and `Pss` from `/proc/PID/smaps_rollup`. The tree "
            "of a sandbox is its `so continue` process and all its descendants; the agent part "
            "is the subtree of `sh bench-agent.sh` (after the init's `exec`), the rest below "
            "`so` is the sandbox. Each part's peak is taken over the round, and the overhead is "
            "the peak of so + sandbox at the same instant.",
            "- RSS counts shared pages (the Python interpreter, libc, the bwrap binary) in every "
            "process; PSS divides them among the processes sharing them, so it is the fairer "
            f'"cost of one more sandbox" when {count} run side by side. Samples every '
            f"{SAMPLE_S} s can miss short peaks (so's git execs last milliseconds).",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with bench_env("concurrency") as root:
        store = Store(Path(os.environ["SO_HOME"]))
        results = bench(root, store, args.sandboxes, args.rounds)
    print(report(results, args.sandboxes, args.rounds))


if __name__ == "__main__":
    main_guard(main)
