"""The credential scan the harness tests rely on can fail: a marker planted in the
sandbox's home and in a live process's environment is found (real so, bwrap)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import credscan
from helpers import in_sandbox, make_repo, so

pytestmark = pytest.mark.integration


def test_the_scan_finds_a_planted_credential_in_a_file_and_a_process(tmp_path: Path) -> None:
    half = len(credscan.MARKER) // 2
    glued = f'm="{credscan.MARKER[:half]}""{credscan.MARKER[half:]}"'
    script = (
        f'{glued}; echo "$m-file" > "$HOME/planted.txt"; '
        'env LEAKED="$m-env" sleep 120 & '
        f"sleep 1; {credscan.scan_step()}; kill %1\n"
    )
    files = {
        "scan.sh": script,
        "specs/prompt.md": "scan\n",
        "specs/implementation-plan.md": "- [ ] scan\n",
        "specs/status.md": "Status: pending\n",
    }
    repo = make_repo(tmp_path / "project", files)
    out = so(
        "run", "-H", "custom", "--agent-cmd", "sh scan.sh", "-i", "1", "--yes", "--json", cwd=repo
    )
    sid = json.loads(out.stdout.splitlines()[-1])["id"]
    found = credscan.findings(in_sandbox(sid, "cat", credscan.RESULT, cwd=repo))
    assert any(f.startswith("file ") and f.endswith("/planted.txt") for f in found), found
    assert any(f.startswith("proc ") and f.endswith("/environ") for f in found), found
    assert not any("scan.sh" in f for f in found)  # the glued marker is not a hit
