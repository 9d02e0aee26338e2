#!/usr/bin/env python3
"""Benchmark: sandbox creation time versus repository size.

For generated repos of ~1k, ~10k and ~100k files on disk (40% tracked files in a few hundred
directories, 20% ignored files in ``node_modules/``, the rest ``.git`` with a short history
as loose objects), measured in the same run and interleaved:

  * so: ``inspect_host`` + ``sono.sandbox.create_sandbox`` as ``so run`` does before the
    first iteration (removal is not timed): the copy-on-write overlay on bwrap and on Docker
    (when an engine answers), and the copy fallback;
  * the seed's method: ``cp -a <repo> <dest>``;
  * ``git worktree add --detach <dest>`` (tracked files only: less work than either).

Usage: python bench/creation.py [--sizes 1k,10k,100k] [--runs N]   Prints a markdown section.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from collections.abc import Callable
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

from sono.backends.bwrap import BwrapBackend
from sono.backends.docker import DockerBackend
from sono.config import DEFAULT_EXCLUDE
from sono.errors import SoError
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
    ms: dict[str, float]  # median per case (see CASES)


# name → (column title, workspace mode, backend)
CASES = {
    "bwrap": ("so, overlay, bwrap", "overlay", "bwrap"),
    "docker": ("so, overlay, Docker", "overlay", "docker"),
    "copy": ("so, copy fallback (bwrap)", "copy", "bwrap"),
}
BASELINES = {"cp": "`cp -a`", "worktree": "`git worktree add`"}


def docker_usable() -> bool:
    try:
        DockerBackend().client()
    except SoError:
        return False
    return True


def measure(repo: Repo, root: Path, store: Store, runs: int, *, docker: bool) -> Measured:
    backends: dict[str, Any] = {"bwrap": BwrapBackend()}
    if docker:
        backends["docker"] = DockerBackend()
    dest = root / f"copy-{repo.label}"
    created: list[Sandbox] = []

    project = dict.fromkeys(CASES, repo.path)
    if docker and os.getuid() == 0:
        # On a root host Docker's overlay needs the project owned by the container user.
        project["docker"] = root / f"repo-{repo.label}-uid1000"
        run(["cp", "-a", str(repo.path), str(project["docker"])])
        run(["chown", "-R", "1000:1000", str(project["docker"])])
        # chown changed every ctime: refresh the index as a user's own repo would have it.
        git(project["docker"], "update-index", "-q", "--refresh")

    def so_create(mode: str, backend_name: str) -> Callable[[], None]:
        def create() -> None:
            host = inspect_host(project[backend_name if mode == "overlay" else "copy"])
            sandbox = create_sandbox(
                store=store,
                host=host,
                harness="custom",
                backend_name=backend_name,
                backend=backends[backend_name],
                exclude=DEFAULT_EXCLUDE,
                allow_dirty=False,
                model=None,
                effort=None,
                agent_cmd="true",
                workspace=mode,
            )
            created.append(sandbox)
            if sandbox.record.workspace_mode != mode:
                raise SystemExit(f"creation: wanted a {mode} workspace, got a copy")

        return create

    def cleanup(name: str) -> None:
        if name in CASES:
            while created:
                sandbox = created.pop()
                if sandbox.record.workspace_mode == "copy":
                    rm_rf(sandbox.work)  # rm -rf: quicker than remove_sandbox's rmtree
                remove_sandbox(sandbox)
        elif name == "worktree":
            rm_rf(dest)
            git(repo.path, "worktree", "prune")
        else:
            rm_rf(dest)

    cases: dict[str, Callable[[], object]] = {
        name: so_create(mode, backend)
        for name, (_, mode, backend) in CASES.items()
        if backend in backends
    }
    cases["cp"] = lambda: run(["cp", "-a", str(repo.path), str(dest)])
    cases["worktree"] = lambda: git(
        repo.path, "worktree", "add", "--detach", "-q", str(dest), "HEAD"
    )
    warmup = WARMUP[repo.label]
    if "docker" in cases and not warmup:
        cases["docker"]()  # the engine's first container of a run is slower: untimed
        cleanup("docker")
    try:
        samples = interleaved(cases, runs, after=cleanup, warmup=warmup)
    finally:
        for name in cases:
            cleanup(name)
        if project.get("docker", repo.path) != repo.path:
            rm_rf(project["docker"])
    return Measured(repo, runs, {name: median(values) for name, values in samples.items()})


def report(results: list[Measured], reflink: bool, fs: str) -> str:
    names = [n for n in (*CASES, *BASELINES) if any(n in m.ms for m in results)]
    titles = {**{k: v[0] for k, v in CASES.items()}, **BASELINES}
    rows = []
    for m in results:
        r = m.repo
        cells = [f"{m.ms[n]:,.0f}" if n in m.ms else "n/a" for n in names]
        rows.append(
            (
                f"{r.label}: {r.total:,} files ({r.tracked:,} tracked / {r.ignored:,} ignored / "
                f"{r.git_files:,} in .git)",
                str(m.runs),
                *cells,
                ratio(m.ms["bwrap"], m.ms["cp"]),
                ratio(m.ms["bwrap"], m.ms["worktree"]),
            )
        )
    header = (
        "repo",
        "runs",
        *(f"{titles[n]} (ms)" for n in names),
        "overlay vs cp -a",
        "overlay vs worktree",
    )
    lines = [
        "## Sandbox creation vs repo size",
        "",
        "`python bench/creation.py`",
        "",
        table(header, rows, right=range(1, len(header))),
        "",
    ]
    big = next((m for m in results if m.repo.label == "100k"), None)
    if big is not None:
        for name in ("bwrap", "docker"):
            if name in big.ms:
                ms = big.ms[name]
                lines.append(
                    f"- Goal ≤ {GOAL_MS:.0f} ms at 100k files, {titles[name]}: "
                    f"{verdict(ms <= GOAL_MS)} ({ms:,.0f} ms)."
                )
    gen = ", ".join(f"{m.repo.label} {m.repo.seconds:.1f} s" for m in results)
    lines += [
        "- Each figure is the median of `runs` creations, all methods interleaved "
        "round-robin with a rotating start, after one untimed warm-up round (none at 100k); "
        "removal is not timed; the page cache is warm (the repos were just written).",
        "- **so** = what `so run` does before the first iteration: `inspect_host` "
        "(rev-parse, symbolic-ref, `git status`) + `create_sandbox`. **overlay**: the upper "
        "and work dirs, the frozen lower layer (the project's directories re-created, every "
        "file hard-linked, hidden files left out), the sandbox git dir (`git init`, the "
        "host's index copied, alternates to so's per-project packs of the objects the base "
        "reaches: built by the first creation, cached for the next ones), the sandbox's "
        "home; on Docker also creating and starting the container with its overlay volume. "
        "**copy fallback** (hosts without overlay support): `git init` + the same packs + "
        "`cp -a --reflink=auto` of the working tree + a Python walk for secrets.",
        "- **`cp -a`** is the seed's method: the whole directory, `.git` included. "
        "**`git worktree add --detach`** checks out tracked files only (no ignored files, "
        "shares `.git`): a floor for any method that materialises a real tree.",
        f"- Filesystem of the temp dir: {fs}; copy-on-write reflinks: "
        f"{'yes' if reflink else 'no (every byte is copied)'}. `.git` holds loose objects "
        f"(never packed), so it counts for ~40% of the files. Repo generation took {gen}.",
        "- Docker: on a root host the project must belong to the container user for an "
        "overlay (uid 1000 here), so the Docker case runs on a chowned copy of the repo.",
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
        docker = docker_usable()
        if docker and os.getuid() == 0:  # root runs git on the chowned repos
            os.environ |= {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory"}
            os.environ["GIT_CONFIG_VALUE_0"] = "*"
        results = []
        for label in labels:
            say(f"creation: generating the {label}-file repo")
            repo = generate_repo(root, label, SIZES[label])
            runs = args.runs or DEFAULT_RUNS[label]
            say(f"creation: {repo.total:,} files, {runs} run(s) per method")
            results.append(measure(repo, root, store, runs, docker=docker))
            rm_rf(repo.path)  # keep the disk footprint to one repo at a time
        print(report(results, reflink, filesystem_of(root)))


if __name__ == "__main__":
    main_guard(main)
