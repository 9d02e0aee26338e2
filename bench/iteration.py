#!/usr/bin/env python3
"""Benchmark: what `so` adds around the agent per loop iteration, with agent = `true`.

Measured in the same run, interleaved, each a median:

  * bwrap: a raw ``bwrap --unshare-all --ro-bind / / true`` (the bundled bwrap) — baseline;
    so's exec of ``true`` through the bwrap backend (its full policy); one
    ``Loop.iteration`` with the custom harness and ``--agent-cmd true``;
  * Docker (when an engine answers and the runner image is built): a raw
    ``docker exec <container> true`` (the docker CLI) — baseline; so's exec of ``true``;
    one ``Loop.iteration``.

Usage: python bench/iteration.py [--runs 20] [--docker-runs 10]   Prints a markdown section.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from benchlib import (
    bench_env,
    git,
    interleaved,
    main_guard,
    median,
    ratio,
    run,
    say,
    table,
    verdict,
)

from sono.backends.base import Backend
from sono.backends.bwrap import BwrapBackend, bundled_bwrap
from sono.errors import SoError
from sono.harnesses.base import AgentOptions
from sono.harnesses.custom import CustomHarness
from sono.loop import Loop, LoopOptions
from sono.sandbox import Sandbox, create_sandbox, remove_sandbox
from sono.state import Store
from sono.ui.reporter import PlainReporter
from sono.workspace import inspect_host

GOAL = 1.5  # the goal: one iteration ≤ 1.5× a raw exec of the same backend


@dataclass(frozen=True)
class Row:
    backend: str
    what: str
    runs: int
    ms: float | None
    baseline_ms: float | None
    note: str = ""


def make_repo(root: Path) -> Path:
    repo = root / "repo"
    (repo / "specs").mkdir(parents=True)
    run(["git", "init", "-q", "-b", "main", str(repo)])
    for i in range(50):
        (repo / f"file{i}.txt").write_text(f"{i}\n")
    (repo / "specs" / "prompt.md").write_text("bench: do nothing\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "init")
    return repo


def new_sandbox(store: Store, repo: Path, name: str, backend: Backend) -> Sandbox:
    return create_sandbox(
        store=store,
        host=inspect_host(repo),
        harness="custom",
        backend_name=name,
        backend=backend,
        exclude=(),
        allow_dirty=False,
        model=None,
        effort=None,
        agent_cmd="true",
        workspace="auto",  # as `so run`: copy-on-write where the backend can mount it
    )


@contextlib.contextmanager
def sandbox_of(store: Store, repo: Path, name: str, backend: Backend) -> Iterator[Sandbox]:
    sandbox = new_sandbox(store, repo, name, backend)
    try:
        yield sandbox
    finally:
        with contextlib.suppress(Exception):
            remove_sandbox(sandbox)  # Docker: the container goes too


def so_cases(sandbox: Sandbox) -> dict[str, Callable[[], object]]:
    """so's exec of `true`, and one whole loop iteration with agent = `true`."""
    loop = Loop(
        sandbox,
        harness=CustomHarness(),
        agent=AgentOptions(agent_cmd="true"),
        opts=LoopOptions(iterations=1, timeout_s=60, commit_retries=0),
        reporter=PlainReporter(io.StringIO()),
        env={},
    )
    counter = iter(range(1, 1_000_000))

    def exec_true() -> None:
        result = sandbox.backend.exec(
            spec=sandbox.spec,
            argv=["true"],
            env={},
            stdin_text="prompt",
            timeout=60,
            on_line=lambda line: None,
        )
        if result.returncode != 0:
            raise RuntimeError(f"so exec of true exited {result.returncode}")

    def iteration() -> None:
        record = loop.iteration(next(counter), 1, 1)
        if record.exit_code != 0:
            raise RuntimeError(f"iteration exited {record.exit_code}")

    return {"exec": exec_true, "iteration": iteration}


def bench_bwrap(store: Store, repo: Path, runs: int) -> list[Row]:
    raw_argv = [bundled_bwrap(), "--unshare-all", "--ro-bind", "/", "/", "true"]
    with sandbox_of(store, repo, "bwrap", BwrapBackend()) as sandbox:
        cases = {"raw": lambda: run(raw_argv), **so_cases(sandbox)}
        s = interleaved(cases, runs, warmup=1)
    raw = median(s["raw"])
    return [
        Row("bwrap", "raw `bwrap --unshare-all --ro-bind / / true` (baseline)", runs, raw, raw),
        Row(
            "bwrap", "so exec of `true` (bwrap backend, full policy)", runs, median(s["exec"]), raw
        ),
        Row("bwrap", "one `Loop.iteration`, agent = `true`", runs, median(s["iteration"]), raw),
    ]


def docker_unavailable() -> str | None:
    """Why the Docker half cannot run here, or None."""
    if shutil.which("docker") is None:
        return "no `docker` CLI on PATH (the raw baseline needs it)"
    from sono.backends.docker import DockerBackend

    backend = DockerBackend()
    try:
        backend.client()
        images = backend.images()
        tag = images.runner_tag(backend.runner_spec())
        if not images.exists(tag):
            return f"runner image {tag} not built (`so image build`, offline: `so image bootstrap`)"
    except SoError as exc:
        return str(exc).split(";")[0]
    return None


def bench_docker(store: Store, repo: Path, runs: int) -> list[Row]:
    why = docker_unavailable()
    if why is not None:
        return [Row("docker", "skipped", 0, None, None, why)]
    from sono.backends.docker import DockerBackend, container_name

    with sandbox_of(store, repo, "docker", DockerBackend()) as sandbox:
        raw_argv = ["docker", "exec", container_name(sandbox.record.id), "true"]
        cases = {"raw": lambda: run(raw_argv), **so_cases(sandbox)}
        s = interleaved(cases, runs, warmup=1)
    raw = median(s["raw"])
    return [
        Row("docker", "raw `docker exec <container> true` (baseline)", runs, raw, raw),
        Row("docker", "so exec of `true` (Docker backend, SDK)", runs, median(s["exec"]), raw),
        Row("docker", "one `Loop.iteration`, agent = `true`", runs, median(s["iteration"]), raw),
    ]


def report(rows: list[Row]) -> str:
    cells = []
    for r in rows:
        if r.ms is None or r.baseline_ms is None:
            cells.append((r.backend, f"skipped: {r.note}", "–", "–", "–", "–"))
            continue
        goal = "" if "iteration" not in r.what else verdict(r.ms / r.baseline_ms <= GOAL)
        cells.append(
            (r.backend, r.what, str(r.runs), f"{r.ms:.1f}", ratio(r.ms, r.baseline_ms), goal)
        )
    lines = [
        "## Per-iteration overhead around the agent (agent = `true`)",
        "",
        "`python bench/iteration.py`",
        "",
        table(
            ("backend", "measurement", "runs", "median ms", "vs raw exec", f"goal ≤ {GOAL}×"),
            cells,
            right=(2, 3, 4),
        ),
        "",
        "- All cases of a backend are interleaved round-robin after one untimed warm-up round; "
        "the baseline is a raw exec of `true` on the same backend, measured in the same run.",
        "- **so exec** adds so's policy to the raw exec: bwrap — the full mount/namespace "
        "command line and the `sh` init that seeds `$HOME`; Docker — the prompt copied in "
        "with `put_archive`, exec through the SDK, output streaming, exit-code lookup.",
        "- **One iteration** is what `so run` pays per iteration besides the agent's own "
        "work: the agent exec, so's git queries inside the sandbox (HEAD and recent "
        "commits for the prompt; the dirty check; iteration ref, commits and changed files "
        "— batched into a few sandbox execs), and the iteration and registry records "
        "written atomically (fsync). A raw exec is the floor for each of those execs.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="bwrap runs per case")
    parser.add_argument("--docker-runs", type=int, default=10, help="Docker runs per case")
    args = parser.parse_args()
    with bench_env("iteration") as root:
        store = Store(Path(os.environ["SO_HOME"]))
        repo = make_repo(root)
        say(f"iteration: bwrap, {args.runs} runs per case")
        rows = bench_bwrap(store, repo, args.runs)
        say(f"iteration: docker, {args.docker_runs} runs per case")
        rows += bench_docker(store, repo, args.docker_runs)
    print(report(rows))


if __name__ == "__main__":
    main_guard(main)
