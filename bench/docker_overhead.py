#!/usr/bin/env python3
"""Benchmark: what `so` adds around `docker exec`, and how long a Docker sandbox takes to make.

Measured in the same run, each a median of repeated runs:
  * raw `docker exec <container> true` (the docker CLI)            — the baseline
  * so's exec of `true` through the Docker backend (SDK)            — what an agent start costs
  * one whole loop iteration with agent = `true` (so's git checks,
    iteration ref, records)                                         — per-iteration overhead
  * sandbox creation (workspace copy + container start) vs a raw `docker run -d … sleep`

Usage: python bench/docker_overhead.py [--runs 20]   (needs a Docker engine and the runner
image: `so image bootstrap` offline). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sono.backends.docker import DockerBackend
from sono.harnesses.base import AgentOptions
from sono.harnesses.custom import CustomHarness
from sono.loop import Loop, LoopOptions
from sono.sandbox import Sandbox, create_sandbox, remove_sandbox
from sono.state import Store
from sono.ui.reporter import PlainReporter
from sono.workspace import inspect_host


def median_ms(fn: Callable[[], object], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def make_repo(root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir()
    ident = ["-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for i in range(200):
        (repo / f"file{i}.txt").write_text(f"{i}\n")
    (repo / "specs").mkdir()
    (repo / "specs" / "prompt.md").write_text("bench\n")
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", *ident, "-C", str(repo), "commit", "-qm", "init"], check=True)
    return repo


def new_sandbox(store: Store, repo: Path, backend: DockerBackend) -> Sandbox:
    return create_sandbox(
        store=store,
        host=inspect_host(repo),
        harness="custom",
        backend_name="docker",
        backend=backend,
        exclude=(),
        allow_dirty=False,
        model=None,
        effort=None,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory(prefix="so-bench-") as tmp:
        root = Path(tmp)
        os.environ["SO_HOME"] = str(root / "so")
        repo = make_repo(root)
        store = Store(root / "so")
        backend = DockerBackend()
        image = backend.images().ensure(backend.runner_spec(), lambda line: None)
        sandbox = new_sandbox(store, repo, backend)
        container = f"so-{sandbox.record.id}"
        spec = sandbox.spec

        raw = median_ms(
            lambda: subprocess.run(["docker", "exec", container, "true"], check=True), runs
        )
        so_exec = median_ms(
            lambda: backend.exec(
                spec=spec,
                argv=["true"],
                env={},
                stdin_text="prompt",
                timeout=60,
                on_line=lambda line: None,
            ),
            runs,
        )
        loop = Loop(
            sandbox,
            harness=CustomHarness(),
            agent=AgentOptions(agent_cmd="true"),
            opts=LoopOptions(iterations=1, timeout_s=60, commit_retries=0),
            reporter=PlainReporter(io.StringIO()),
            env={},
        )
        counter = iter(range(1, 10_000))
        iteration = median_ms(lambda: loop.iteration(next(counter), 1, 1), runs)

        creation_runs = max(3, runs // 4)
        created: list[Sandbox] = []
        create = median_ms(lambda: created.append(new_sandbox(store, repo, backend)), creation_runs)
        raw_run = median_ms(
            lambda: subprocess.run(
                ["docker", "run", "-d", "--rm", image, "sleep", "1"],
                check=True,
                capture_output=True,
            ),
            creation_runs,
        )
        for sb in [sandbox, *created]:
            remove_sandbox(sb)

    print(f"| measurement (median of {runs}) | ms | vs baseline |")
    print("| --- | ---: | ---: |")
    print(f"| raw `docker exec … true` (baseline) | {raw:.1f} | 1.00× |")
    print(f"| so exec of `true` (Docker backend) | {so_exec:.1f} | {so_exec / raw:.2f}× |")
    print(f"| one loop iteration, agent = `true` | {iteration:.1f} | {iteration / raw:.2f}× |")
    print(f"| raw `docker run -d … sleep` (median of {creation_runs}) | {raw_run:.1f} | 1.00× |")
    print(
        f"| so sandbox creation, 200-file repo (median of {creation_runs}) | {create:.1f} | "
        f"{create / raw_run:.2f}× |"
    )


if __name__ == "__main__":
    main()
