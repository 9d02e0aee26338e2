#!/usr/bin/env python3
"""Benchmark: `so list` start-up with 100 sandboxes in the registry.

Writes 100 valid registry records (``sono.state.Store.save`` of ``SandboxRecord``s; no real
workspaces) into a private ``SO_HOME``, then measures, interleaved in the same run:

  * ``python -c pass`` with the same interpreter — the baseline;
  * ``so list`` and ``so list --json`` (the venv's ``so`` console script).

Usage: python bench/list_startup.py [--runs 20] [--sandboxes 100]   Prints a markdown section.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from benchlib import (
    bench_env,
    interleaved,
    main_guard,
    median,
    ratio,
    run,
    say,
    so_command,
    table,
    verdict,
)

from sono.state import BLOCKED, CREATED, DONE, FAILED, STOPPED, SandboxRecord, Store

GOAL = 3.0  # the goal: `so list` ≤ 3× a bare interpreter start
STATUSES = (CREATED, DONE, STOPPED, BLOCKED, FAILED)


def fill_registry(store: Store, count: int, root: Path) -> None:
    for n in range(count):
        project = f"project{n % 7}"
        sandbox_id = f"{project}-{n:04x}"
        store.save(
            SandboxRecord(
                id=sandbox_id,
                project=str(root / "projects" / project),
                project_name=project,
                host_branch="main",
                host_head=f"{n:040x}",
                base_commit=f"{n:040x}",
                harness=("claude", "codex", "custom")[n % 3],
                backend=("bwrap", "docker")[n % 2],
                created=f"2026-11-{1 + n % 28:02d}T12:{n % 60:02d}:00+00:00",
                workspace=str(store.dir(sandbox_id) / "work"),
                status=STATUSES[n % len(STATUSES)],
                iterations=n % 10,
                commits=n % 5,
                model="opus" if n % 3 == 0 else None,
                last_error="agent exited with 1 in iteration 3" if n % 5 == 4 else None,
                mounts=(("/opt/agents/claude", "/opt/agents/claude"),),
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--sandboxes", type=int, default=100)
    args = parser.parse_args()
    with bench_env("list") as root:
        store = Store(Path(os.environ["SO_HOME"]))
        fill_registry(store, args.sandboxes, root)
        so = so_command()
        listed = run([*so, "list"]).stdout.decode().splitlines()
        if len(listed) != args.sandboxes + 1:  # + the header line
            raise RuntimeError(
                f"so list printed {len(listed)} lines, expected {args.sandboxes + 1}"
            )
        say(f"list: {args.sandboxes} sandboxes, {args.runs} runs per case")
        samples = interleaved(
            {
                "python": lambda: run([sys.executable, "-c", "pass"]),
                "list": lambda: run([*so, "list"]),
                "json": lambda: run([*so, "list", "--json"]),
            },
            args.runs,
            warmup=1,
        )
    base = median(samples["python"])
    rows = [
        ("`python -c pass` (baseline, same interpreter)", f"{base:.1f}", "1.00×", ""),
    ]
    for key, label in (("list", "`so list`"), ("json", "`so list --json`")):
        ms = median(samples[key])
        rows.append(
            (
                f"{label}, {args.sandboxes} sandboxes",
                f"{ms:.1f}",
                ratio(ms, base),
                verdict(ms / base <= GOAL),
            )
        )
    print(
        "\n".join(
            [
                "## `so list` start-up",
                "",
                "`python bench/list_startup.py`",
                "",
                table(
                    (
                        f"command (median of {args.runs})",
                        "ms",
                        "vs baseline",
                        f"goal ≤ {GOAL:.0f}×",
                    ),
                    rows,
                    right=(1, 2),
                ),
                "",
                f"- {args.sandboxes} valid `sandbox.json` records written with `Store.save` (no "
                "workspaces: `so list` reads only the registry); wall time of the whole process, "
                "start to exit, the three commands interleaved after one untimed warm-up round.",
                f"- Interpreter: `{sys.executable}` (Python {sys.version.split()[0]}); `so` is the "
                "console script of the same venv.",
            ]
        )
    )


if __name__ == "__main__":
    main_guard(main)
