"""bwrap hardening through the real CLI: no host environment or host path in any process
inside (agent runs, `so shell`, so's own git runs), the seccomp filter (session keyring,
TIOCSTI into the human's terminal), git config that runs programs neutralised in the
human's shell, every tmpfs sized and empty-file floods counted by the disk limit.

Each attack is paired with a control that shows the same kind of action works on
something harmless.
"""

from __future__ import annotations

import ctypes
import platform
import secrets
import sys
from pathlib import Path

import pytest
from hostile import HostileUser, Outcome, canary_process_env, run_in_pty

from helpers import SO
from sono.backends.base import SandboxSpec
from sono.backends.bwrap import BwrapBackend

pytestmark = pytest.mark.integration

# Every process visible inside: its environment and command line, one block each.
DUMP_PROCS = r"""
for p in /proc/[0-9]*; do
  echo "== $p"
  tr '\0' '\n' < "$p/environ" 2>/dev/null
  echo "-- cmdline"
  tr '\0' ' ' < "$p/cmdline" 2>/dev/null; echo
  echo "-- fds"
  for f in "$p"/fd/*; do readlink "$f"; done 2>/dev/null
done
"""


def host_paths(user: HostileUser) -> list[str]:
    """Host paths that must not show inside: the project, SO_HOME, the home, so's venv."""
    return [str(user.project), str(user.so_home), str(user.home), sys.prefix]


def shown(user: HostileUser, text: str) -> list[str]:
    return user.leaks(text) + [p for p in host_paths(user) if p in text]


def upper_file(result: Outcome, name: str) -> str:
    assert result.sandbox_dir is not None
    found = [p for p in result.sandbox_dir.rglob(name) if p.is_file()]
    assert found, f"{name} was not written: {result.stderr}"
    return found[0].read_text(errors="replace")


# ------------------------------------------------------------------ host environment


@pytest.mark.parametrize("limits", [(), ("--memory", "512m", "--pids", "256")])
def test_no_process_of_an_agent_run_shows_host_env_or_paths(
    tmp_path: Path, limits: tuple[str, ...]
) -> None:
    """Also with limits: then a cgroup wrapper starts bwrap."""
    user = HostileUser.make(tmp_path)
    result = user.attack(
        f"{{ {DUMP_PROCS} }} > /workspace/procs.txt; sleep 0.3; {{ {DUMP_PROCS} }} >> "
        "/workspace/procs.txt; cat /proc/1/environ > /workspace/pid1-environ",
        backend="bwrap",
        extra=limits,
    )
    dump = upper_file(result, "procs.txt")
    # Control: the dump read real processes (pid 1 = bwrap, the agent's own environment).
    assert "== /proc/1\n" in dump and "SO_SANDBOX_ID=" in dump and "bwrap --args" in dump
    assert not shown(user, dump)
    assert not user.leaks(result.everything())
    assert "so-bwrap-args" not in dump and "so-seccomp" not in dump  # no fd left open
    assert upper_file(result, "pid1-environ") == ""


def test_no_process_of_so_shell_shows_host_env_or_paths(tmp_path: Path) -> None:
    user = HostileUser.make(tmp_path)
    run = user.attack("true", backend="bwrap")
    assert run.sandbox_id is not None
    shell = user.so("shell", run.sandbox_id, "--", "sh", "-c", DUMP_PROCS)
    assert shell.returncode == 0, shell.stderr
    assert "== /proc/1\n" in shell.stdout and "PS1=" in shell.stdout  # control
    assert not shown(user, shell.stdout + shell.stderr)


def test_so_own_git_runs_show_no_host_env_or_paths(tmp_path: Path) -> None:
    """BwrapBackend.run is how so runs git inside (diffs, commits): same launch."""
    user = HostileUser.make(tmp_path)
    work = tmp_path / "ws"
    work.mkdir()
    seed = tmp_path / "seed" / "home"
    seed.mkdir(parents=True)
    spec = SandboxSpec(id="git-1", workspace=work, home_seed=seed)
    backend = BwrapBackend()
    with canary_process_env(user):
        out = backend.run(spec=spec, argv=["sh", "-c", DUMP_PROCS], check=False)
    assert "== /proc/1\n" in out.stdout and "SO_SANDBOX_ID=git-1" in out.stdout  # control
    assert not user.leaks(out.stdout + out.stderr)
    assert str(tmp_path) not in out.stdout and sys.prefix not in out.stdout


# ------------------------------------------------------------------ session keyring

KEY_SPEC_SESSION_KEYRING = -3
ADD_KEY, KEYCTL, KEYCTL_REVOKE = 248, 250, 3  # x86_64
SESSION_PAYLOAD_READ = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
KEYCTL_SEARCH, KEYCTL_READ = 10, 11
key = libc.syscall(250 if __import__("platform").machine() == "x86_64" else 219,
                   KEYCTL_SEARCH, -3, b"user", sys.argv[1].encode(), 0)
print("search", key, ctypes.get_errno())
buf = ctypes.create_string_buffer(256)
n = libc.syscall(250 if __import__("platform").machine() == "x86_64" else 219,
                 KEYCTL_READ, key, buf, 256)
print("read", n, buf.raw[: max(n, 0)].decode(errors="replace"))
print("uname", __import__("os").uname().sysname)
"""


def add_session_key(description: str, payload: str) -> int:
    if platform.machine() != "x86_64":
        pytest.skip("the add_key number here is x86_64's")
    libc = ctypes.CDLL(None, use_errno=True)
    args = (description.encode(), payload.encode(), len(payload), KEY_SPEC_SESSION_KEYRING)
    key = ctypes.c_int32(libc.syscall(ADD_KEY, b"user", *args)).value
    if key < 0:
        pytest.skip(f"cannot add a key to the session keyring here (errno {ctypes.get_errno()})")
    return int(key)


def test_session_keyring_is_out_of_reach(tmp_path: Path) -> None:
    description = f"so-test-{secrets.token_hex(4)}"
    secret = f"KEYCANARY{secrets.token_hex(8)}"
    key = add_session_key(description, secret)
    try:
        user = HostileUser.make(tmp_path, {"read_key.py": SESSION_PAYLOAD_READ})
        user.canaries["@s key"] = secret
        result = user.attack(
            f"python3 /workspace/read_key.py {description} > /workspace/key.txt 2>&1",
            backend="bwrap",
        )
        text = upper_file(result, "key.txt")
        assert "search -1 1" in text  # EPERM from the filter
        assert "uname Linux" in text  # control: an ordinary call works
        assert not user.leaks(result.everything() + text)
    finally:
        ctypes.CDLL(None).syscall(KEYCTL, KEYCTL_REVOKE, key)


# ------------------------------------------------------------------ the human's terminal

INJECT = (
    "import fcntl, termios, sys\n"
    "try:\n"
    "    for ch in sys.argv[1] + '\\n':\n"
    "        fcntl.ioctl(0, termios.TIOCSTI, ch.encode())\n"
    "    print('TIOCSTI-OK')\n"
    "except OSError as e:\n"
    "    print('TIOCSTI-FAILED', e.errno)\n"
)


def pty_shell(user: HostileUser, sandbox_id: str, command: str, keys: bytes = b"") -> str:
    """bash on a fresh terminal runs ``so shell ID -- <command>``, then reads one line
    from the terminal — whatever was typed, or injected, while so shell ran."""
    script = f'"$0" shell {sandbox_id} -- {command}; IFS= read -r -t 3 line; echo "GOT[$line]"'
    out = run_in_pty(
        ["/bin/bash", "--norc", "-c", script, SO], env=user.env, cwd=user.project, keys=keys
    )
    return out.output.decode(errors="replace")


def test_so_shell_cannot_type_into_the_users_terminal(tmp_path: Path) -> None:
    user = HostileUser.make(tmp_path, {"inject.py": INJECT})
    sid = user.attack("true", backend="bwrap").sandbox_id
    assert sid is not None
    marker = f"touch-{secrets.token_hex(4)}"
    attack = pty_shell(user, sid, f"python3 /workspace/inject.py {marker}")
    assert "TIOCSTI-FAILED 1" in attack
    assert f"GOT[{marker}]" not in attack and "GOT[]" in attack
    # Control: keys the human types while so shell runs still reach the shell after it.
    control = pty_shell(user, sid, "sleep 1", keys=b"typed-by-human\n")
    assert "GOT[typed-by-human]" in control


PLANT_GIT = r"""
cd /workspace
git config core.pager 'sh -c "echo pager > /workspace/ran-core-pager; cat"'
git config pager.log 'sh -c "echo pager > /workspace/ran-pager-log; cat"'
git config core.fsmonitor 'sh -c "echo fsm > /workspace/ran-fsmonitor" #'
git config core.editor 'sh -c "echo ed > /workspace/ran-editor" #'
mkdir -p .git/hooks .githooks
printf '#!/bin/sh\necho hook > /workspace/ran-hook\n' > .git/hooks/pre-commit
cp .git/hooks/pre-commit .githooks/pre-commit
chmod +x .git/hooks/pre-commit .githooks/pre-commit
git config core.hooksPath .githooks
git config credential.helper '!sh -c "echo cred > /workspace/ran-credential"'
"""


def test_agent_git_config_does_not_run_in_the_humans_shell(tmp_path: Path) -> None:
    user = HostileUser.make(tmp_path)
    run = user.attack(PLANT_GIT, backend="bwrap")
    assert run.sandbox_id is not None
    sid = run.sandbox_id
    # so's own git runs after the agent may have run them inside the sandbox: start clean.
    user.so("shell", sid, "--", "sh", "-c", "rm -f /workspace/ran-*")
    log = pty_shell(user, sid, "git log -1 --format=LOG-%s")
    status = user.so("shell", sid, "--", "git", "status", "--short")
    commit = user.so(
        "shell", sid, "--", "sh", "-c",
        "git -c user.name=h -c user.email=h@x commit -q --allow-empty -m by-human && "
        "git log -1 --format=%s && ls /workspace",
    )  # fmt: skip
    cred = user.so(
        "shell", sid, "--", "sh", "-c",
        "printf 'protocol=https\\nhost=example.com\\n' | git credential fill </dev/null; true",
    )  # fmt: skip
    # Controls: each git command ran.
    assert "LOG-" in log
    assert status.returncode == 0, status.stderr
    assert "by-human" in commit.stdout, commit.stderr
    ran = [line for line in commit.stdout.split() + cred.stdout.split() if line.startswith("ran-")]
    assert ran == []


# ------------------------------------------------------------------ disk


def test_an_empty_file_flood_hits_the_disk_limit(tmp_path: Path) -> None:
    user = HostileUser.make(tmp_path)
    flood = "mkdir -p /workspace/f && cd /workspace/f && seq 1 30000 | xargs touch; sleep 20"
    user.env["SO_LIMIT_DISK"] = "16m"
    result = user.attack(flood, backend="bwrap")
    assert "the disk limit was hit" in result.stdout + result.stderr
    # Control: a few hundred empty files are fine under the same limit.
    calm = HostileUser.make(tmp_path / "calm")
    calm.env["SO_LIMIT_DISK"] = "16m"
    ok = calm.attack("mkdir -p /workspace/f && cd /workspace/f && seq 1 300 | xargs touch",
                     backend="bwrap")  # fmt: skip
    assert "limit was hit" not in ok.stdout + ok.stderr


FILL = r"""
for d in /tmp /dev/shm /home/agent; do
  if head -c 48M /dev/zero > "$d/fill" 2>/dev/null
  then echo "$d big-ok"; else echo "$d big-refused"; fi
  rm -f "$d/fill"
  if head -c 1M /dev/zero > "$d/small" 2>/dev/null; then echo "$d small-ok"; fi
done > /workspace/fill.txt
df -k /tmp /dev/shm /home >> /workspace/fill.txt
"""


def test_every_tmpfs_is_sized_by_the_disk_limit(tmp_path: Path) -> None:
    user = HostileUser.make(tmp_path)
    user.env["SO_LIMIT_DISK"] = "32m"
    text = upper_file(user.attack(FILL, backend="bwrap"), "fill.txt")
    for d in ("/tmp", "/dev/shm", "/home/agent"):
        assert f"{d} big-refused" in text, text
        assert f"{d} small-ok" in text, text  # control


def test_every_tmpfs_has_a_cap_without_a_disk_limit(tmp_path: Path) -> None:
    user = HostileUser.make(tmp_path)
    text = upper_file(user.attack(FILL, backend="bwrap"), "fill.txt")
    sizes = {}
    for line in text.splitlines():
        parts = line.split()
        if line.startswith("tmpfs") and len(parts) >= 6:
            sizes[parts[5]] = int(parts[1]) * 1024
    assert sizes["/dev/shm"] == 512 * 1024**2
    assert sizes["/tmp"] == sizes["/home"] == 2 * 1024**3
    assert "/tmp big-ok" in text  # control: 48 MiB fit under the default cap
