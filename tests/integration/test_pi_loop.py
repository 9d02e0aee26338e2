"""The real pinned pi CLI end to end: real `so run -H pi`, real bwrap, real git, against the
scripted model server (its Anthropic Messages API, reached through pi's own provider)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import AGENTS_CACHE, in_sandbox, make_repo, so
from sono.testing.model_server import ModelServer

pytestmark = pytest.mark.integration

# Records the Node that runs pi itself (the bash tool's ancestor), not the one on PATH:
# the host's /usr/bin/node may be 20, which pi 1.6 cannot run on.
PROBE_NODE = r"""
p=$$
while [ "$p" -gt 1 ]; do
  exe=$(readlink /proc/$p/exe)
  case "$exe" in */node) { echo "$exe"; "$exe" --version; } > pi-node.txt; break ;; esac
  p=$(sed -n 's/^PPid:[[:space:]]*//p' /proc/$p/status)
done
"""
DO_ITEM = r"""
echo "item 1" > item1.txt
sed -i '0,/- \[ \]/s//- [x]/' specs/implementation-plan.md
echo "Status: done" > specs/status.md
git add -A && git commit -q -m "item 1"
"""


def test_pi_runs_on_bundled_node_and_commits(
    tmp_path: Path, installed_agent: Callable[[str], Path], model_server: ModelServer
) -> None:
    installed_agent("pi")
    prompt = f"Do one item of the plan.\n<so-script>{PROBE_NODE + DO_ITEM}</so-script>\n"
    repo = make_repo(
        tmp_path / "project",
        {
            "specs/prompt.md": prompt,
            "specs/implementation-plan.md": "# Plan\n\n- [ ] one\n",
            "specs/status.md": "Status: pending\n",
        },
    )
    # pi ignores ANTHROPIC_BASE_URL (it hands each model's baseUrl to the SDK): the
    # built-in provider is re-pointed in models.json, the key comes from the environment.
    agent = Path.home() / ".pi" / "agent"
    agent.mkdir(parents=True)
    models = {"providers": {"anthropic": {"baseUrl": model_server.url}}}
    (agent / "models.json").write_text(json.dumps(models))
    env = {"ANTHROPIC_API_KEY": "sk-test"}
    out = so("run", "-H", "pi", "--yes", "--json", cwd=repo, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    summary = lines[-1]
    assert summary["outcome"] == "done", out.stdout

    kinds = {x.get("kind") for x in lines}
    assert {"session_started", "tool_call", "tool_result", "usage", "result"} <= kinds
    assert [x["name"] for x in lines if x.get("kind") == "tool_call"] == ["bash"]
    assert all(x["ok"] for x in lines if x.get("kind") == "result")
    assert in_sandbox(summary["id"], "git", "log", "-1", "--format=%s", cwd=repo) == "item 1"
    exe, version = in_sandbox(summary["id"], "cat", "pi-node.txt", cwd=repo).split()
    assert Path(exe).is_relative_to(AGENTS_CACHE / "pi")  # the node installed with pi
    assert int(version.lstrip("v").split(".")[0]) >= 22
    # pi reached the scripted server through the endpoint so handed it, never the vendor.
    posts = [r for r in model_server.requests if r.path == "/v1/messages"]
    assert posts and all(r.headers.get("x-api-key") == "sk-test" for r in posts)
