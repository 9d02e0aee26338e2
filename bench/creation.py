#!/usr/bin/env python3
"""Benchmark: sandbox creation time versus repository size.

For generated repos of ~1k, ~10k and ~100k files on disk (40% tracked files in a few hundred
directories, 20% ignored files in ``node_modules/``, the rest ``.git`` with a short history
as loose objects), measured in the same run and interleaved:

  * so: ``inspect_host`` + ``sono.sandbox.create_sandbox`` on the bwrap backend, as ``so run``
    does before the first iteration (removal is not timed);
  * the seed's method: ``cp -a <repo> <dest>``;
  * ``git worktree add --detach <dest>`` (tracked files only: less work than either).

Usage: python bench/creation.py [--sizes 1k,10k,100k] [--runs N]   Prints a markdown section.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib import (
    bench_env,
    git,
    interleaved,
    main_guard,
    median,
    ratio,
    rm_rf,
    run,
    say,
    table,
    verdict,
    write_file,
)

import sono.workspace
from sono.backends.bwrap import BwrapBackend
from sono.config import DEFAULT_EXCLUDE
from sono.sandbox import Sandbox, create_sandbox, remove_sandbox
from sono.state import Store
from sono.workspace import inspect_host

SIZES = {"1k": 1_000, "10k": 10_000, "100k": 100_000}
DEFAULT_RUNS = {"1k": 7, "10k": 5, "100k": 3}  # the 100k copies take seconds each
WARMUP = {"1k": 1, "10k": 1, "100k": 0}  # untimed rounds first (too slow at 100k)
GOAL_MS = 500.0  # the goal for 100k files
FILES_PER_DIR = 100
HISTORY_COMMITS = 4  # after the initial one, each touching ~0.5% of the tracked files


@dataclass(frozen=True)
class Repo:
    label: str
    path: Path
    tracked: int
    ignored: int
    git_files: int
    seconds: float  # generation time

    @property
    def total(self) -> int:
        return self.tracked + self.ignored + self.git_files


def count_files(path: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(path))


def source_text(i: int, version: int = 0) -> bytes:
    return (f"# module {i} v{version}\n" + f"value_{i} = {i * 7 + version}\n" * 6).encode()


def generate_repo(root: Path, label: str, total: int) -> Repo:
    """A repo with ``total`` files on disk, roughly: 40% tracked, 20% ignored, 40% .git."""
    start = time.perf_counter()
    repo = root / f"repo-{label}"
    repo.mkdir()
    run(["git", "init", "-q", "-b", "main", str(repo)])
    git(repo, "config", "gc.auto", "0")  # keep the objects loose: ~40% of the files
    tracked, ignored = total * 40 // 100, total * 20 // 100
    dirs = max(2, tracked // FILES_PER_DIR)  # 100k files → 400 directories
    paths: list[Path] = []
    for d in range(dirs):
        directory = repo / "src" / f"pkg{d // 20}" / f"mod{d}"
        directory.mkdir(parents=True)
        paths += [directory / f"file{i}.py" for i in range(d, tracked, dirs)]
    for i, path in enumerate(paths):
        write_file(path, source_text(i))
    write_file(repo / ".gitignore", b"node_modules/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial import")
    for version in range(1, HISTORY_COMMITS + 1):
        for i in range(version, len(paths), 200):  # ~0.5% of the files per commit
            write_file(paths[i], source_text(i, version))
        git(repo, "commit", "-q", "-a", "-m", f"change {version}")
    packages = max(1, ignored // 100)
    for p in range(packages):
        lib = repo / "node_modules" / f"dep{p}" / "lib"
        lib.mkdir(parents=True)
        write_file(lib.parent / "package.json", f'{{"name": "dep{p}"}}\n'.encode())
        for i in range(ignored // packages - 1):
            write_file(lib / f"m{i}.js", f"module.exports = {i};\n".encode())
    return Repo(
        label=label,
        path=repo,
        tracked=len(paths) + 1,
        ignored=count_files(repo / "node_modules"),
        git_files=count_files(repo / ".git"),
        seconds=time.perf_counter() - start,
    )


def reflink_supported(directory: Path) -> bool:
    src, dest = directory / "reflink-probe", directory / "reflink-probe-copy"
    write_file(src, b"probe\n")
    done = subprocess.run(
        ["cp", "--reflink=always", str(src), str(dest)], capture_output=True, check=False
    )
    src.unlink()
    dest.unlink(missing_ok=True)
    return done.returncode == 0


@dataclass
class Measured:
    repo: Repo
    runs: int
    so_ms: float
    steps: dict[str, float]  # parts of so_ms: inspect_host, and sono.workspace's STEPS
    cp_ms: float
    worktree_ms: float


# Steps of sono.workspace.create_workspace timed inside "so create" (when they exist).
STEPS = ("populate_tree", "remove_secrets")


def _timer(fn: Callable[..., Any], into: list[float]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            into.append((time.perf_counter() - start) * 1000)

    return timed


@contextlib.contextmanager
def timed_steps(into: dict[str, list[float]]) -> Iterator[None]:
    """Wrap the STEPS functions of sono.workspace so that every call is timed."""
    originals = {}
    for name in STEPS:
        fn = getattr(sono.workspace, name, None)
        if callable(fn):
            originals[name] = fn
            setattr(sono.workspace, name, _timer(fn, into.setdefault(name, [])))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(sono.workspace, name, fn)


def measure(repo: Repo, root: Path, store: Store, runs: int) -> Measured:
    backend = BwrapBackend()
    dest = root / f"copy-{repo.label}"
    created: list[Sandbox] = []
    steps: dict[str, list[float]] = {"inspect_host": []}

    def so_create() -> None:
        start = time.perf_counter()
        host = inspect_host(repo.path)
        steps["inspect_host"].append((time.perf_counter() - start) * 1000)
        created.append(
            create_sandbox(
                store=store,
                host=host,
                harness="custom",
                backend_name="bwrap",
                backend=backend,
                exclude=DEFAULT_EXCLUDE,
                allow_dirty=False,
                model=None,
                effort=None,
                agent_cmd="true",
            )
        )

    def cleanup(name: str) -> None:
        if name == "so":
            while created:
                sandbox = created.pop()
                rm_rf(sandbox.work)  # rm -rf: quicker than remove_sandbox's rmtree
                remove_sandbox(sandbox)
        elif name == "worktree":
            rm_rf(dest)
            git(repo.path, "worktree", "prune")
        else:
            rm_rf(dest)

    cases: dict[str, Callable[[], object]] = {
        "so": so_create,
        "cp": lambda: run(["cp", "-a", str(repo.path), str(dest)]),
        "worktree": lambda: git(repo.path, "worktree", "add", "--detach", "-q", str(dest), "HEAD"),
    }
    warmup = WARMUP[repo.label]
    try:
        with timed_steps(steps):
            samples = interleaved(cases, runs, after=cleanup, warmup=warmup)
    finally:
        for name in cases:
            cleanup(name)
    return Measured(
        repo,
        runs,
        median(samples["so"]),
        {name: median(values[warmup:]) for name, values in steps.items() if values[warmup:]},
        median(samples["cp"]),
        median(samples["worktree"]),
    )


def report(results: list[Measured], reflink: bool, fs: str) -> str:
    rows = []
    for m in results:
        r = m.repo
        rows.append(
            (
                f"{r.label}: {r.total:,} files ({r.tracked:,} tracked / {r.ignored:,} ignored / "
                f"{r.git_files:,} in .git)",
                str(m.runs),
                f"{m.so_ms:,.0f}",
                " / ".join(
                    f"{m.steps[k]:,.0f}" if k in m.steps else "?" for k in ("inspect_host", *STEPS)
                ),
                f"{m.cp_ms:,.0f}",
                f"{m.worktree_ms:,.0f}",
                ratio(m.so_ms, m.cp_ms),
                ratio(m.so_ms, m.worktree_ms),
            )
        )
    header = (
        "repo",
        "runs",
        "so create (ms)",
        "of which: host status / tree copy / secret walk (ms)",
        "`cp -a` (ms)",
        "`git worktree add` (ms)",
        "so vs cp -a",
        "so vs worktree",
    )
    lines = [
        "## Sandbox creation vs repo size (bwrap)",
        "",
        "`python bench/creation.py`",
        "",
        table(header, rows, right=range(1, 8)),
        "",
    ]
    big = next((m for m in results if m.repo.label == "100k"), None)
    if big is not None:
        lines.append(
            f"- Goal ≤ {GOAL_MS:.0f} ms at 100k files: {verdict(big.so_ms <= GOAL_MS)} "
            f"({big.so_ms:,.0f} ms, {big.so_ms / GOAL_MS:.1f}× the goal)."
        )
    gen = ", ".join(f"{m.repo.label} {m.repo.seconds:.1f} s" for m in results)
    lines += [
        "- Each figure is the median of `runs` creations, the three methods interleaved "
        "round-robin with a rotating start, after one untimed warm-up round (none at 100k: "
        "too slow); removal is not timed; the page cache is warm (the repos were just "
        "written).",
        "- **so create** = `inspect_host` (git rev-parse, symbolic-ref, `git status`) + "
        "`create_sandbox`: `git clone --shared --no-checkout`, `read-tree`, "
        "`cp -a --reflink=auto` of the working tree (ignored files included, `.git` not), "
        "the secret-exclusion walk, `update-index --refresh`, the sandbox's home and etc. "
        "The breakdown times `inspect_host`, `sono.workspace.populate_tree` (the copy) and "
        "`sono.workspace.remove_secrets` (a Python walk of the copied tree) inside it; "
        "`?` when a step no longer exists under that name.",
        "- **`cp -a`** is the seed's method: the whole directory, `.git` included. "
        "**`git worktree add --detach`** checks out tracked files only (no ignored files, "
        "shares `.git`): a floor for any method that materialises a real tree.",
        f"- Filesystem of the temp dir: {fs}; copy-on-write reflinks: "
        f"{'yes' if reflink else 'no (every byte is copied)'}. `.git` holds loose objects "
        f"(never packed), so it counts for ~40% of the files. Repo generation took {gen}.",
    ]
    return "\n".join(lines)


def filesystem_of(path: Path) -> str:
    """The type of the filesystem holding ``path``, from the longest matching mount point."""
    best, kind = "", "unknown"
    with Path("/proc/mounts").open() as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) < 3:
                continue
            point = fields[1].replace("\\040", " ")
            inside = str(path) == point or str(path).startswith(point.rstrip("/") + "/")
            if inside and len(point) > len(best):
                best, kind = point, fields[2]
    return f"{kind} ({path.parent})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default="1k,10k,100k", help=f"comma-separated, from {', '.join(SIZES)}"
    )
    parser.add_argument("--runs", type=int, help="runs per size (default: 7 / 5 / 3)")
    args = parser.parse_args()
    labels = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in labels if s not in SIZES]
    if unknown:
        parser.error(f"unknown size(s) {', '.join(unknown)}; choose from {', '.join(SIZES)}")
    with bench_env("creation") as root:
        store = Store(Path(os.environ["SO_HOME"]))
        reflink = reflink_supported(root)
        results = []
        for label in labels:
            say(f"creation: generating the {label}-file repo")
            repo = generate_repo(root, label, SIZES[label])
            runs = args.runs or DEFAULT_RUNS[label]
            say(f"creation: {repo.total:,} files, {runs} run(s) per method")
            results.append(measure(repo, root, store, runs))
            rm_rf(repo.path)  # keep the disk footprint to one repo at a time
        print(report(results, reflink, filesystem_of(root)))


if __name__ == "__main__":
    main_guard(main)
