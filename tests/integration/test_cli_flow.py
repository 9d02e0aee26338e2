"""The review workflow through the real `so` CLI on real bwrap, with a scripted custom agent
(fast); the claude CLI runs the same paths in test_claude_loop.py."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from helpers import SO, git, in_sandbox, make_repo, pids, so, tree_snapshot, unique_sleep

pytestmark = pytest.mark.integration

AGENT = """#!/bin/bash
prompt=$(cat)
n=$SO_ITERATION
[ -f "$HOME/.so/prompt.md" ] || { echo "no prompt file"; exit 9; }
echo "agent $n as $(id -un) in $(pwd)"
echo "step $n" > "step$n.txt"
sed -i '0,/- \\[ \\]/s//- [x]/' specs/implementation-plan.md
git add -A && git commit -qm "step $n"
"""


def agent(tmp_path: Path, body: str = AGENT) -> str:
    path = tmp_path / "bin" / "agent.sh"
    path.parent.mkdir(exist_ok=True)
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def project(tmp_path: Path, items: int = 3) -> Path:
    plan = "".join(f"- [ ] item {i}\n" for i in range(1, items + 1))
    return make_repo(
        tmp_path / "proj",
        {
            "README.md": "# p\n",
            "specs/prompt.md": "Do one item.\n",
            "specs/implementation-plan.md": plan,
        },
    )


def run(repo: Path, cmd: str, *args: str) -> dict[str, object]:
    out = so("run", "-H", "custom", "--agent-cmd", cmd, "--yes", "--json", *args, cwd=repo)
    summary = json.loads(out.stdout.splitlines()[-1])
    assert isinstance(summary, dict)
    return summary


def test_review_workflow(tmp_path: Path) -> None:
    repo = project(tmp_path)
    summary = run(repo, agent(tmp_path), "-i", "2")
    assert summary["outcome"] == "exhausted" and summary["exit_code"] == 5
    sid = str(summary["id"])
    assert so("diff", sid, "--stat", cwd=repo).stdout.count("step") == 2

    inside = so("shell", sid, "--", "sh", "-c", "id -un; pwd; cat step2.txt", cwd=repo)
    assert inside.returncode == 0 and inside.stdout.split() == ["agent", "/workspace", "step", "2"]
    failing = so("shell", sid, "--", "sh", "-c", "exit 7", cwd=repo)
    assert failing.returncode == 7

    reset = so("reset", sid, "iter-1", cwd=repo)
    assert reset.returncode == 0, reset.stderr
    assert "step2.txt" not in so("diff", sid, "--stat", cwd=repo).stdout

    more = so("continue", sid, "-i", "5", "--yes", "--json", cwd=repo)
    cont = json.loads(more.stdout.splitlines()[-1])
    # After the reset two plan items are open again: continue runs exactly those two.
    assert [r["n"] for r in cont["iterations"]] == [3, 4]
    listed = json.loads(so("list", "--json", cwd=repo).stdout)
    assert listed[0]["iterations"] == 4 and listed[0]["commits"] == 3

    assert so("rm", sid, cwd=repo).returncode == 0
    assert json.loads(so("list", "--json", cwd=repo).stdout) == []


def test_kill_9_of_so_leaves_a_recoverable_sandbox(tmp_path: Path) -> None:
    sleep = unique_sleep()
    body = AGENT.replace(
        "prompt=$(cat)", f"prompt=$(cat)\n[ -f .slept ] || {{ touch .slept; {sleep}; }}"
    )
    repo = project(tmp_path, items=1)
    before = tree_snapshot(repo)
    cmd = [SO, "run", "-H", "custom", "--agent-cmd", agent(tmp_path, body), "--yes"]
    proc = subprocess.Popen(cmd, cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not pids(sleep):
        time.sleep(0.1)
    assert pids(sleep)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and pids(sleep):
        time.sleep(0.1)
    assert pids(sleep) == [], "the agent outlived so (no --die-with-parent?)"
    [rec] = json.loads(so("list", "--json", cwd=repo).stdout)
    assert rec["status"] == "stopped"  # the record said running; its runner is gone
    assert tree_snapshot(repo) == before
    out = so("continue", str(rec["id"]), "-i", "1", "--yes", "--json", cwd=repo)
    assert json.loads(out.stdout.splitlines()[-1])["iterations"][0]["commits"]


def test_docker_after_kill_9_continue_ends_the_orphaned_agent_first(
    tmp_path: Path, docker_ready: str
) -> None:
    """On Docker the agent outlives a kill -9 of so (the engine keeps its exec): the next
    so command that uses the container ends it first — never two agents at once."""
    sleep = unique_sleep()
    body = AGENT.replace(
        "prompt=$(cat)",
        f"prompt=$(cat)\n[ -f .slept ] || {{ touch .slept; {sleep}; echo late > late.txt; }}",
    )
    repo = project(tmp_path, items=2)
    script = agent(tmp_path, body)
    Path(script).chmod(0o755)  # the container's agent uid runs it
    cmd = [SO, "run", "-s", "docker", "-H", "custom", "--agent-cmd", script]
    log = tmp_path / "run.log"
    with log.open("wb") as out_fh:
        proc = subprocess.Popen([*cmd, "--yes"], cwd=repo, stdout=out_fh, stderr=out_fh)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not pids(sleep) and proc.poll() is None:
        time.sleep(0.2)
    assert pids(sleep), log.read_text()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    [rec] = json.loads(so("list", "--json", cwd=repo).stdout)
    out = so("continue", str(rec["id"]), "-i", "1", "--yes", "--json", cwd=repo, timeout=300)
    assert pids(sleep) == []  # the orphan was ended before the new agent started
    assert json.loads(out.stdout.splitlines()[-1])["iterations"][0]["commits"]
    files = so("shell", str(rec["id"]), "--", "ls", cwd=repo).stdout.split()
    assert "late.txt" not in files  # the orphan never went on to write
    so("rm", str(rec["id"]), "--yes", cwd=repo)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_terminating_so_records_why_and_stops_the_agent(tmp_path: Path, sig: int) -> None:
    """kill (SIGTERM) or a closed terminal (SIGHUP) mid-iteration: the agent's processes
    go with so, and the record says stopped and why — not `running` with a dead runner."""
    sleep = unique_sleep()
    body = AGENT.replace(
        "prompt=$(cat)", f"prompt=$(cat)\n[ -f .slept ] || {{ touch .slept; {sleep}; }}"
    )
    repo = project(tmp_path, items=1)
    before = tree_snapshot(repo)
    cmd = [SO, "run", "-H", "custom", "--agent-cmd", agent(tmp_path, body), "--yes"]
    proc = subprocess.Popen(cmd, cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not pids(sleep):
        time.sleep(0.1)
    assert pids(sleep)
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig
    assert pids(sleep) == []
    name = signal.Signals(sig).name
    [rec] = json.loads(so("list", "--json", cwd=repo).stdout)
    assert rec["status"] == "stopped" and rec["runner_pid"] is None
    assert rec["stop_reason"] == f"so was terminated ({name})"
    # As after Ctrl-C: the iteration is on record and so says how to go on.
    assert rec["iterations"] == 1
    assert f"so was terminated ({name}); sandbox {rec['id']} kept" in err.decode()
    assert tree_snapshot(repo) == before
    out = so("continue", str(rec["id"]), "-i", "1", "--yes", "--json", cwd=repo)
    assert json.loads(out.stdout.splitlines()[-1])["iterations"][0]["commits"]


def test_crashing_agent_is_reported(tmp_path: Path) -> None:
    repo = project(tmp_path)
    out = so(
        "run",
        "-H",
        "custom",
        "--agent-cmd",
        agent(tmp_path, "#!/bin/sh\nexit 42\n"),
        "--yes",
        cwd=repo,
    )
    assert out.returncode == 6  # no progress
    assert "without a new commit" in out.stderr
    [rec] = json.loads(so("list", "--json", cwd=repo).stdout)
    assert rec["status"] == "stopped" and rec["iterations"] == 3


def test_missing_agent_command(tmp_path: Path) -> None:
    repo = project(tmp_path)
    out = so("run", "-H", "custom", "--agent-cmd", "/nonexistent/agent", "--yes", cwd=repo)
    assert out.returncode == 1 and "not found" in out.stderr
    assert json.loads(so("list", "--json", cwd=repo).stdout) == []


def test_step_with_yes_and_clean(tmp_path: Path) -> None:
    repo = project(tmp_path, items=2)
    seen = tmp_path / "prompts"
    seen.mkdir()
    body = AGENT.replace("prompt=$(cat)", 'prompt=$(cat)\necho "$prompt" | head -c 400')
    out = so("step", "-H", "custom", "--agent-cmd", agent(tmp_path, body), "--yes", cwd=repo)
    assert out.returncode == 5, out.stderr
    assert "Do NOT commit" in out.stderr  # step mode tells the agent the human decides
    out = so(
        "clean", "-H", "custom", "--agent-cmd", agent(tmp_path, body), "-i", "1", "--yes", cwd=repo
    )
    assert "ONE code smell" in out.stderr


def test_dup_runs_jscpd_inside_the_sandbox(tmp_path: Path) -> None:
    block = "".join(
        f"def f{i}(x):\n    y = x * {i}\n    z = y + {i}\n    return z - x\n\n" for i in range(1)
    )
    code = (
        "def a(items):\n    total = 0\n    for item in items:\n        if item > 10:\n"
        "            total += item * 2\n        else:\n            total -= item\n"
        "    print(total)\n    return total\n\n"
    ) * 2
    repo = make_repo(
        tmp_path / "proj",
        {
            "one.py": block + code.replace("def a", "def b", 1),
            "two.py": code.replace("def a", "def c", 1),
        },
    )
    body = '#!/bin/bash\ncat > "$HOME/../seen-prompt"\n'
    out = so(
        "dup",
        "-H",
        "custom",
        "--agent-cmd",
        agent(tmp_path, body),
        "-i",
        "1",
        "--yes",
        "--json",
        cwd=repo,
    )
    assert out.stdout, out.stderr
    summary = json.loads(out.stdout.splitlines()[-1])
    prompt = (
        Path(os.environ["SO_HOME"])
        / "sandboxes"
        / str(summary["id"])
        / "iterations"
        / "1"
        / "prompt.md"
    ).read_text()
    assert "duplicate-code report (jscpd)" in prompt
    assert "one.py" in prompt and "two.py" in prompt


def test_rm_older_than_and_all(tmp_path: Path) -> None:
    repo = project(tmp_path, items=1)
    first = str(run(repo, agent(tmp_path))["id"])
    record = Path(os.environ["SO_HOME"]) / "sandboxes" / first / "sandbox.json"
    data = json.loads(record.read_text())
    data["created"] = "2020-01-01T00:00:00+00:00"
    record.write_text(json.dumps(data))
    second = str(run(repo, agent(tmp_path))["id"])
    out = so("rm", "--older-than", "7d", "--yes", cwd=repo)
    assert out.returncode == 0 and first in out.stdout
    assert [r["id"] for r in json.loads(so("list", "--json", cwd=repo).stdout)] == [second]
    assert so("rm", "--all", cwd=repo).returncode == 1  # no terminal to confirm, no --yes
    assert so("rm", "--all", "--yes", cwd=repo).returncode == 0
    assert json.loads(so("list", "--json", cwd=repo).stdout) == []


def test_allow_dirty_snapshots_host_changes(tmp_path: Path) -> None:
    repo = project(tmp_path, items=1)
    (repo / "README.md").write_text("# edited on the host\n")
    summary = run(repo, agent(tmp_path), "--allow-dirty")
    base = in_sandbox(
        str(summary["id"]), "git", "rev-parse", f"refs/so/{summary['id']}/base", cwd=repo
    )
    assert (
        in_sandbox(str(summary["id"]), "git", "show", f"{base}:README.md", cwd=repo)
        == "# edited on the host"
    )
    assert (repo / "README.md").read_text() == "# edited on the host\n"


def test_agent_records_follow_what_ran_and_what_was_committed(tmp_path: Path) -> None:
    """`so continue -H NAME` records the agent that runs from then on; a commit made in
    `so shell` is counted at once; --agent-cmd without -H custom is an error, and with
    --json the error reaches stdout as JSON too."""
    repo = project(tmp_path)
    summary = run(repo, agent(tmp_path), "-i", "1")
    sid = str(summary["id"])
    commit = "echo x > shell.txt && git add -A && git commit -qm 'by hand'"
    assert so("shell", sid, "--", "sh", "-c", commit, cwd=repo).returncode == 0
    [rec] = json.loads(so("list", "--json", cwd=repo).stdout)
    assert rec["commits"] == 2
    so("continue", sid, "-H", "pi", "-i", "1", "--yes", cwd=repo)  # pi has no key: fails
    [rec] = json.loads(so("list", "--json", cwd=repo).stdout)
    assert rec["harness"] == "pi"
    wrong = so("run", "--agent-cmd", "/bin/true", "--json", "--yes", cwd=repo)
    assert wrong.returncode == 1
    assert "--agent-cmd is the command of the custom harness" in wrong.stderr
    error = json.loads(wrong.stdout.splitlines()[-1])
    assert error["kind"] == "error" and "add -H custom" in error["message"]


def test_merging_an_already_merged_sandbox_says_so(tmp_path: Path) -> None:
    repo = project(tmp_path)
    sid = str(run(repo, agent(tmp_path), "-i", "1")["id"])
    first = so("merge", sid, "--keep", "--yes", cwd=repo)
    assert first.returncode == 0 and f"merged 1 commit(s) from {sid} into main of" in first.stdout
    git(repo, "commit", "-qm", "the sandbox's work")
    again = so("merge", sid, "--yes", cwd=repo)
    assert again.returncode == 0
    assert f"nothing to merge: the changes of {sid} are already in main of {repo}" in again.stdout
