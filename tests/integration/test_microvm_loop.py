"""The Foundation scenario on real microVMs (``-s microvm``): ``so run`` with a custom agent
that commits, then review, diff and merge — wherever a microVM can boot. Elsewhere the
whole module is skipped with the detected reason (shown by ``-ra`` in CI output)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from helpers import git, make_repo, so
from sono.kvm import boot_support

SUPPORT = boot_support()
if not SUPPORT.ok:
    pytest.skip(f"no microVM can boot on this host: {SUPPORT.reason}", allow_module_level=True)

pytestmark = pytest.mark.integration

AGENT = """#!/bin/bash
n=$SO_ITERATION
[ -f "$HOME/.so/prompt.md" ] || { echo "no prompt file"; exit 9; }
echo "agent $n as $(id -un) ($(id -u)) in $(pwd) on $(uname -r)"
echo "step $n" > "step$n.txt"
echo "$n" >> "$HOME/.runs"
sed -i '0,/- \\[ \\]/s//- [x]/' specs/implementation-plan.md
git add -A && git commit -qm "step $n"
"""


def agent(tmp_path: Path) -> str:
    path = tmp_path / "bin" / "agent.sh"
    path.parent.mkdir(parents=True)
    path.write_text(AGENT)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    tmp_path.chmod(tmp_path.stat().st_mode | stat.S_IXOTH)
    return str(path)


def project(tmp_path: Path) -> Path:
    return make_repo(
        tmp_path / "proj",
        {
            "README.md": "# p\n",
            "specs/prompt.md": "Do one item.\n",
            "specs/implementation-plan.md": "- [ ] item 1\n- [ ] item 2\n- [ ] item 3\n",
        },
    )


def run(repo: Path, cmd: str, *args: str) -> dict[str, object]:
    out = so(
        "run",
        "-s",
        "microvm",
        "-H",
        "custom",
        "--agent-cmd",
        cmd,
        "--yes",
        "--json",
        *args,
        cwd=repo,
        timeout=900,
    )
    assert out.stdout, out.stderr
    summary = json.loads(out.stdout.splitlines()[-1])
    assert isinstance(summary, dict)
    return summary


def test_foundation_scenario_in_a_microvm(tmp_path: Path, docker_ready: str) -> None:
    repo = project(tmp_path)
    summary = run(repo, agent(tmp_path), "-i", "2")
    assert summary["outcome"] == "exhausted", summary
    sid = str(summary["id"])

    listed = json.loads(so("list", "--json", cwd=repo).stdout)
    assert listed[0]["id"] == sid and listed[0]["commits"] == 2
    assert so("diff", sid, "--stat", cwd=repo).stdout.count("step") == 2

    inside = so("shell", sid, "--", "sh", "-c", "id -u; pwd; cat step2.txt", cwd=repo)
    assert inside.returncode == 0, inside.stderr
    assert inside.stdout.split() == ["1000", "/workspace", "step", "2"]
    # Its own kernel: the hardware boundary this backend exists for.
    guest = so("shell", sid, "--", "uname", "-r", cwd=repo).stdout.strip()
    assert guest and guest != os.uname().release

    # The agent's home is the project's volume: it outlives the sandbox.
    volumes = json.loads(so("volume", "list", "--json", cwd=repo).stdout)
    (volume,) = [v for v in volumes if v["project"] == str(repo)]
    assert (Path(volume["path"]) / ".runs").read_text().split() == ["1", "2"]

    merged = so("merge", sid, "--commit", "--yes", cwd=repo)
    assert merged.returncode == 0, merged.stderr
    assert (repo / "step1.txt").read_text() == "step 1\n"
    assert (repo / "step2.txt").read_text() == "step 2\n"
    assert git(repo, "status", "--porcelain") == ""  # committed on the host branch
    assert json.loads(so("list", "--json", cwd=repo).stdout) == []  # merged and removed

    again = run(repo, agent(tmp_path), "-i", "1")
    assert again["outcome"] in ("exhausted", "done"), again
    assert (Path(volume["path"]) / ".runs").read_text().split() == ["1", "2", "1"]
    assert so("rm", str(again["id"]), "--yes", cwd=repo).returncode == 0
