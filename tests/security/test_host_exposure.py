"""What a sandbox exposes on the host to other local users and to later runs: the model
gateway's and proxy's sockets (another uid must not reach them), setuid/setgid files the
agent marks (none survives on a host path), and the project's Docker layer (built only
from content the user trusted, without network). The agent is a hostile ``attack.sh``
run by the real ``so`` CLI; each attack has a control."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest
from hostile import HostileUser, Outcome

from sono.layout import GATEWAY_SOCK, PROXY_SOCK, SOCKETS

pytestmark = pytest.mark.integration

OTHER_USER = "so-test-other"

# Reaches the gateway through the forwarder (the control), then stays long enough for the
# host side to look at the sockets.
GATEWAY_THEN_WAIT = r"""
python3 - <<'EOF' > /workspace/gateway.txt 2>&1
import socket
s = socket.create_connection(("127.0.0.1", 3129), timeout=10)
s.sendall(b"GET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
print(s.recv(200).split(b"\r\n")[0].decode())
EOF
sleep 12; git add -A; git commit -qm "the agent's work"
"""


def other_user() -> str:
    if shutil.which("runuser") is None or os.getuid() != 0:
        pytest.skip("needs root and runuser (another uid tries the sockets)")
    if subprocess.run(["id", OTHER_USER], capture_output=True, check=False).returncode != 0:
        subprocess.run(["useradd", "--no-create-home", OTHER_USER], check=True)
    return OTHER_USER


def connect_as(user: str, path: Path) -> str:
    """Another uid connects to ``path`` by a short link to it (a socket path is limited
    to ~107 bytes; a link is what an attacker would use too)."""
    link = Path("/tmp") / f"so-test-link-{os.getpid()}"
    link.unlink(missing_ok=True)
    link.symlink_to(path)
    probe = (
        "import socket,sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n    s.connect(sys.argv[1]); print('connected')\n"
        "except OSError as e:\n    print(type(e).__name__, e)\n"
    )
    try:
        return _probe(user, probe, link)
    finally:
        link.unlink()


def _probe(user: str, probe: str, path: Path) -> str:
    out = subprocess.run(
        ["runuser", "-u", user, "--", "python3", "-c", probe, str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or out.stderr.strip()


def connect_here(path: Path) -> str:
    cwd = Path.cwd()
    os.chdir(path.parent)
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path.name)
    except OSError as exc:
        return type(exc).__name__
    finally:
        os.chdir(cwd)
    return "connected"


def test_sockets_are_closed_to_other_users(tmp_path: Path, backend: str) -> None:
    other = other_user()
    user = HostileUser.make(tmp_path)
    done: list[Outcome] = []
    runner = threading.Thread(
        target=lambda: done.append(user.attack(GATEWAY_THEN_WAIT, backend=backend))
    )
    runner.start()
    sockets = user.so_home / "sandboxes"
    deadline = time.monotonic() + 240
    found: list[Path] = []
    while time.monotonic() < deadline and not found:
        found = sorted(sockets.glob(f"*/net/sock/{SOCKETS}/{GATEWAY_SOCK}"))
        time.sleep(0.2)
    assert found, "the gateway socket never appeared"
    gateway = found[0]
    private = gateway.parent
    sandbox = private.parents[2]
    try:
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
        assert private.stat().st_uid == os.getuid()
        for name in (GATEWAY_SOCK, PROXY_SOCK):
            mode = (private / name).lstat().st_mode
            assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        for parent in (sandbox, sandbox.parent):  # $SO_HOME/sandboxes/<id>, .../sandboxes
            assert stat.S_IMODE(parent.stat().st_mode) & 0o077 == 0, parent
        assert connect_as(other, gateway).startswith("PermissionError")
        assert connect_as(other, private / PROXY_SOCK).startswith("PermissionError")
        assert connect_here(gateway) == "connected"  # control: the user reaches it
    finally:
        runner.join(300)
    outcome = done[0]
    assert outcome.returncode in (0, 1, 5), outcome.stderr  # 5: no status done
    assert outcome.sandbox_dir is not None
    # Control: the agent still reaches the gateway through the forwarder (any HTTP answer).
    workspace = _workspace_file(outcome.sandbox_dir, "gateway.txt")
    assert workspace.startswith("HTTP/1."), (workspace, outcome.stderr)


def _workspace_file(sandbox_dir: Path, name: str) -> str:
    for candidate in (sandbox_dir / "upper" / name, sandbox_dir / "work" / name):
        if candidate.is_file():
            return candidate.read_text()
    return ""


SETID = r"""
for dir in /workspace "$SO_RW"; do
    cp /bin/true "$dir/suid-u"; chmod u+s "$dir/suid-u"
    cp /bin/true "$dir/suid-g"; chmod g+s "$dir/suid-g"
    cp /bin/true "$dir/suid-ug"; chmod 6755 "$dir/suid-ug"
    mkdir -p "$dir/deep/er"; cp /bin/true "$dir/deep/er/suid"; chmod 4711 "$dir/deep/er/suid"
    chmod 311 "$dir/deep"    # unreadable: so must still look inside
    cp /bin/true "$dir/plain"; chmod 755 "$dir/plain"
    ls -l "$dir" > "$dir/ls-inside.txt" 2>&1
done
git add -A; git commit -qm "the agent's work"
"""


def test_setuid_and_setgid_never_survive_on_a_host_path(tmp_path: Path, backend: str) -> None:
    user = HostileUser.make(tmp_path)
    rw = tmp_path / "shared-rw"
    rw.mkdir()
    rw.chmod(0o777)  # the Docker agent is another uid when so runs as root
    config = user.home / ".config" / "so" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f'[files]\nrw = ["{rw}"]\n')
    outcome = user.attack(SETID.replace("$SO_RW", str(rw)), backend=backend)
    assert outcome.returncode in (0, 1, 5), outcome.stderr  # 5: no status done
    assert outcome.sandbox_dir is not None
    # The attack ran (control): its files are there, plain ones still executable.
    assert (rw / "ls-inside.txt").is_file(), outcome.stderr
    assert stat.S_IMODE((rw / "plain").stat().st_mode) == 0o755
    where = [rw, outcome.sandbox_dir]
    marked = [
        p
        for root in where
        for p in _files(root)
        if p.lstat().st_mode & (stat.S_ISUID | stat.S_ISGID) and not p.is_symlink()
    ]
    assert marked == []
    names = {p.name for root in where for p in _files(root)}
    assert {"suid-u", "suid-g", "suid-ug", "suid"} <= names


def _files(root: Path) -> list[Path]:
    out = []
    for dirpath, _dirs, files in os.walk(root):
        out += [Path(dirpath) / f for f in files]
    return out


def test_bwrap_tmpfs_are_sized_by_the_disk_limit(tmp_path: Path) -> None:
    """/home and /tmp are tmpfs of the disk limit's size on bwrap: writing past it fails
    (control: writing under it works)."""
    user = HostileUser.make(tmp_path)
    script = r"""
for d in "$HOME" /tmp; do
    head -c 2000000 /dev/zero > "$d/small" && echo "small-ok $d" >> /workspace/disk.txt
    head -c 40000000 /dev/zero > "$d/big" 2>/dev/null ||
        echo "big-refused $d" >> /workspace/disk.txt
    rm -f "$d/big" "$d/small"
done
"""
    config = user.home / ".config" / "so" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text('[limits]\ndisk = "20M"\n')
    outcome = user.attack(script, backend="bwrap")
    assert outcome.sandbox_dir is not None, outcome.stderr
    text = _workspace_file(outcome.sandbox_dir, "disk.txt")
    for where in ("/home/agent", "/tmp"):
        assert f"small-ok {where}" in text, (text, outcome.stderr)
        assert f"big-refused {where}" in text, text


UNTRUSTED_LAYER = "FROM so-runner\nRUN echo built > /built\n"


def test_project_docker_layer_needs_trust_and_builds_without_network(
    tmp_path: Path, docker_ready: str
) -> None:
    user = HostileUser.make(tmp_path)
    user.commit({".so/Dockerfile": UNTRUSTED_LAYER}, "an agent-written project layer")
    refused = user.attack("echo ran > /workspace/ran.txt\n", backend="docker")
    assert refused.returncode != 0
    lines = [line for line in refused.stderr.splitlines() if "so trust" in line]
    assert lines and "not trusted" in lines[0], refused.stderr
    # Control: once trusted, the same layer builds and the agent runs in it.
    assert user.so("trust").returncode == 0
    ok = user.attack("cat /built > /workspace/ran.txt\n", backend="docker")
    assert ok.sandbox_dir is not None, ok.stderr
    assert _workspace_file(ok.sandbox_dir, "ran.txt").strip() == "built", ok.stderr
    # A changed build context is untrusted again, and a remote ADD never builds.
    user.commit({".so/Dockerfile": "FROM so-runner\nADD http://127.0.0.1:9/x /x\n"}, "remote add")
    changed = user.attack("true # changed\n", backend="docker")
    assert changed.returncode != 0 and "changed since you trusted it" in changed.stderr
    assert user.so("trust").returncode == 0
    remote = user.attack("true # remote\n", backend="docker")
    assert remote.returncode != 0 and "fetches from the network" in remote.stderr, remote.stderr
    # RUN has no network: a build step reaching out fails the build.
    user.commit(
        {
            ".so/Dockerfile": "FROM so-runner\nRUN python3 -c "
            "\"import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)\"\n"
        },
        "a build step that reaches out",
    )
    assert user.so("trust").returncode == 0
    offline = user.attack("true # offline\n", backend="docker")
    assert offline.returncode != 0 and "building" in offline.stderr, offline.stderr


@pytest.mark.parametrize("megabytes, killed", [(60, "disk"), (1, None)])
def test_docker_home_counts_in_the_disk_limit(
    tmp_path: Path, docker_ready: str, megabytes: int, killed: str | None
) -> None:
    """$HOME in a Docker sandbox is the container's own layer: writing there counts in
    the disk limit like the workspace (control: a small write is not killed)."""
    user = HostileUser.make(tmp_path)
    config = user.home / ".config" / "so" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text('[limits]\ndisk = "20m"\n')
    script = (
        f"dd if=/dev/urandom of=$HOME/fill bs=1M count={megabytes} 2>/dev/null\n"
        "sleep 4\necho wrote\n"
    )
    out = user.attack(script, backend="docker")
    assert out.sandbox_dir is not None, out.stderr
    record = json.loads((out.sandbox_dir / "iterations" / "1" / "record.json").read_text())
    assert record["killed"] == killed, (record, out.stderr[-1500:])


@pytest.mark.parametrize("megabytes, killed", [(20, "disk"), (2, None)])
def test_bwrap_disk_limit_is_one_total_over_every_writable_place(
    tmp_path: Path, megabytes: int, killed: str | None
) -> None:
    """/tmp, /dev/shm, $HOME and the workspace each take less than the limit but more
    together: one total kills the run (control: small writes everywhere are not)."""
    user = HostileUser.make(tmp_path)
    config = user.home / ".config" / "so" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text('[limits]\ndisk = "50m"\n')
    writes = "".join(
        f"dd if=/dev/urandom of={where}/fill bs=1M count={megabytes} 2>/dev/null\n"
        for where in ("/tmp", "/dev/shm", "$HOME", "/workspace")
    )
    out = user.attack(writes + "sleep 4\necho wrote\n", backend="bwrap")
    assert out.sandbox_dir is not None, out.stderr
    record = json.loads((out.sandbox_dir / "iterations" / "1" / "record.json").read_text())
    assert record["killed"] == killed, (record, out.stderr[-1500:])
    assert not (out.sandbox_dir / "scratch").exists() or not any(
        (out.sandbox_dir / "scratch").iterdir()
    )  # each run's scratch dirs go with it
