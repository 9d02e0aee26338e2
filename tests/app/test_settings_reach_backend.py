"""A sandbox's backend settings come from its project's config every time it is opened —
not only at creation (Docker would otherwise rebuild its view and recreate the container
on `so continue`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers import make_repo, so

pytestmark = pytest.mark.integration

AGENT = """#!/bin/sh
cat > /dev/null
echo "step $SO_ITERATION" >> steps.txt
git add -A && git commit -qm "step $SO_ITERATION"
"""


@pytest.fixture(scope="module")
def other_base(docker_ready: str) -> str:
    """A second local base image (one label apart from the offline base)."""
    tag = "so-base:settings-test"
    subprocess.run(
        ["docker", "build", "-q", "-t", tag, "-"],
        input=f"FROM {docker_ready}\nLABEL so.test=settings\n",
        text=True,
        check=True,
        capture_output=True,
    )
    return tag


def container_id(sandbox_id: str) -> str:
    out = subprocess.run(
        ["docker", "inspect", "-f", "{{.Id}}", f"so-{sandbox_id}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_continue_keeps_the_container_built_from_the_configured_base(
    tmp_path: Path, other_base: str
) -> None:
    repo = make_repo(tmp_path / "proj", {"specs/prompt.md": "go\n"})
    script = tmp_path / "agent.sh"
    script.write_text(AGENT)
    script.chmod(0o755)
    env = {"SO_DOCKER_BASE": other_base, "SO_HOME": str(tmp_path / "so")}
    common = ("-s", "docker", "-H", "custom", "--agent-cmd", str(script), "--yes", "--json")
    first = so("run", *common, "-i", "1", cwd=repo, env=env, timeout=600)
    assert first.returncode in (0, 5), first.stderr
    sid = json.loads(first.stdout.splitlines()[-1])["id"]
    before = container_id(sid)
    more = so("continue", sid, *common, "-i", "1", cwd=repo, env=env, timeout=600)
    assert more.returncode in (0, 5), more.stderr
    assert json.loads(more.stdout.splitlines()[-1])["iterations"][0]["commits"]
    assert container_id(sid) == before  # the same container: same image, same settings
    so("rm", sid, "--yes", cwd=repo, env=env)
