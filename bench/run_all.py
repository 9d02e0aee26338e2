#!/usr/bin/env python3
"""Run every benchmark in ``bench/`` and print one combined markdown report.

Each benchmark runs as its own process with this interpreter (progress on stderr, its
markdown section on stdout); the report starts with the machine it ran on. About 10 minutes
on 2 cores, most of it the 100k-file repo of ``creation.py``.

Usage: python bench/run_all.py [--only creation,iteration,...] [--skip docker_overhead]
       python bench/run_all.py > report.md
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import FrameType

from benchlib import rm_rf, say

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Bench:
    name: str
    args: tuple[str, ...] = ()
    needs_docker: bool = False
    title: str = ""  # for scripts that print a bare table


BENCHES = (
    Bench("creation"),
    Bench("iteration"),
    Bench("list_startup"),
    Bench("concurrency"),
    Bench("gateway"),
    Bench(
        "docker_overhead",
        ("--runs", "10"),
        needs_docker=True,
        title="Docker: what `so` adds around `docker exec`; sandbox creation",
    ),
)


def _out(argv: Sequence[str]) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _cpuinfo(key: str) -> str:
    with Path("/proc/cpuinfo").open() as fh:
        for line in fh:
            if line.split(":")[0].strip() == key:
                return line.split(":", 1)[1].strip()
    return "unknown"


def _mem_gib() -> float:
    with Path("/proc/meminfo").open() as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    return 0.0


def docker_engine() -> str:
    """The engine's version when one answers, else ""."""
    if shutil.which("docker") is None:
        return ""
    return _out(["docker", "version", "--format", "{{.Server.Version}}"])


def machine(engine: str) -> str:
    from sono.backends.bwrap import bundled_bwrap

    flags = _cpuinfo("flags").split()
    virt = "virtual machine (hypervisor flag set)" if "hypervisor" in flags else "bare metal?"
    bwrap = _out([bundled_bwrap(), "--version"]) or "unknown"
    rows = [
        ("date", datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")),
        ("cores", str(os.cpu_count())),
        ("CPU", f"{_cpuinfo('model name')} ({virt})"),
        ("memory", f"{_mem_gib():.1f} GiB"),
        ("kernel", f"{platform.system()} {platform.release()}"),
        (
            "OS",
            platform.freedesktop_os_release().get("PRETTY_NAME", "?")
            if hasattr(platform, "freedesktop_os_release")
            else "?",
        ),
        ("Python", f"{platform.python_version()} ({sys.executable})"),
        ("git", _out(["git", "--version"]).removeprefix("git version ") or "?"),
        ("bwrap", f"{bwrap} (bundled)"),
        ("Docker engine", engine or "none answering"),
        ("temp dir", tempfile.gettempdir()),
    ]
    return "\n".join(["| machine | |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in rows)])


def leftover_containers(tmp: Path) -> list[str]:
    """Containers made by `so` whose workspace lies in ``tmp`` (a benchmark killed before
    its own cleanup, e.g. docker_overhead.py on Ctrl-C)."""
    ids = _out(["docker", "ps", "-aq", "--filter", "label=so.sandbox"]).split()
    if not ids:
        return []
    fmt = "{{.Id}} {{range .Mounts}}{{.Source}} {{end}}"
    found = []
    for line in _out(["docker", "inspect", "--format", fmt, *ids]).splitlines():
        cid, *sources = line.split()
        if any(Path(s).is_relative_to(tmp) for s in sources):
            found.append(cid)
    return found


def run_bench(bench: Bench, env: dict[str, str]) -> tuple[str, float]:
    """(markdown section, seconds); a failure becomes a section saying so."""
    start = time.perf_counter()
    say(f"=== {bench.name} ===")
    command = " ".join([f"python bench/{bench.name}.py", *bench.args])
    proc = subprocess.Popen(
        [sys.executable, str(HERE / f"{bench.name}.py"), *bench.args],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        out, _ = proc.communicate()
    except KeyboardInterrupt:
        stop_child(proc)
        raise
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        out = (
            f"## {bench.title or bench.name}\n\n**failed** (exit {proc.returncode}); run "
            f"`{command}` to see why."
        )
    elif not out.lstrip().startswith("#"):
        out = f"## {bench.title or bench.name}\n\n`{command}`\n\n{out.strip()}"
    return out.strip(), seconds


def stop_child(proc: subprocess.Popen[str]) -> None:
    """Let the child clean up: after a SIGTERM to us, pass it on; after a terminal's Ctrl-C
    the child has its own SIGINT already, so give it a moment before sending one."""
    if _terminated.is_set():
        proc.send_signal(signal.SIGTERM)
    else:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


_terminated = threading.Event()  # set when we got SIGTERM (not a terminal's Ctrl-C)


def _sigterm(signum: int, frame: FrameType | None) -> None:
    _terminated.set()
    raise KeyboardInterrupt


def main() -> None:
    names = [b.name for b in BENCHES]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help=f"comma-separated subset of: {', '.join(names)}")
    parser.add_argument("--skip", default="", help="comma-separated benchmarks to leave out")
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else set(names)
    skip = set(filter(None, args.skip.split(",")))
    unknown = (only | skip) - set(names)
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(sorted(unknown))}")
    signal.signal(signal.SIGTERM, _sigterm)
    engine = docker_engine()
    sections = [f"# so benchmarks\n\n{machine(engine)}"]
    timings = []
    # Children make their temp dirs in here: whatever a killed child leaves is ours to remove.
    tmp = Path(tempfile.mkdtemp(prefix="so-bench-all-")).resolve()
    env = {**os.environ, "TMPDIR": str(tmp)}
    total = time.perf_counter()
    try:
        for bench in BENCHES:
            if bench.name not in only or bench.name in skip:
                continue
            if bench.needs_docker and not engine:
                sections.append(f"## {bench.name}\n\nskipped: no Docker engine answers.")
                continue
            section, seconds = run_bench(bench, env)
            sections.append(section)
            timings.append(f"{bench.name} {seconds:.0f} s")
    finally:
        if engine:
            for cid in leftover_containers(tmp):
                say(f"removing container {cid[:12]}, left behind by an interrupted benchmark")
                subprocess.run(["docker", "rm", "-f", cid], capture_output=True, check=False)
        rm_rf(tmp)
    parts = f": {', '.join(timings)}" if timings else ""
    sections.append(f"_Total {time.perf_counter() - total:.0f} s{parts}._")
    print("\n\n".join(sections))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        say("interrupted; the benchmarks' temp dirs and containers have been removed")
        sys.exit(130)
