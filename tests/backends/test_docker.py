"""Docker backend: pure builders, the auto choice, and the real engine."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from sono.backends import BackendSettings, choose_auto
from sono.backends.base import Mount, SandboxSpec
from sono.backends.docker import (
    DockerBackend,
    container_config,
    exec_env,
    home_archive,
    mounts_key,
    reaper,
    supervised,
    terminal_name,
)
from sono.errors import SoError
from sono.images import Images, RunnerSpec, content_hash
from sono.limits import Limits
from sono.overlay import Overlay


def spec(tmp_path: Path, **kw: object) -> SandboxSpec:
    return SandboxSpec(id="p-1", workspace=tmp_path / "work", home_seed=tmp_path / "home", **kw)  # type: ignore[arg-type]


def test_container_config_overlay_volume(tmp_path: Path) -> None:
    ov = Overlay.under(tmp_path / "sb", tmp_path / "project")
    s = spec(tmp_path, overlay=ov)
    config = container_config(s, "so-runner:abc", gpus=False)
    mounts = {m["Target"]: m for m in config["mounts"]}
    volume = mounts["/workspace"]
    assert volume["Type"] == "volume" and volume["Source"] == "so-p-1"
    options = volume["VolumeOptions"]["DriverConfig"]["Options"]
    o = f"{ov.mount_options()},nosuid,nodev"  # what the agent marks setuid works nowhere
    assert options == {"type": "overlay", "device": "overlay", "o": o}
    assert mounts["/workspace/.git"]["Source"] == str(ov.gitdir)
    assert mounts_key(s, "img") != mounts_key(spec(tmp_path), "img")


def test_container_config_policy(tmp_path: Path) -> None:
    s = spec(tmp_path, mounts=(Mount(Path("/host/objects"), "/host/objects"),))
    config = container_config(s, "so-runner:abc", gpus=False)
    mounts = {m["Target"]: m for m in config["mounts"]}
    assert mounts["/workspace"]["Source"] == str(tmp_path / "work")
    assert not mounts["/workspace"]["ReadOnly"]
    assert mounts["/host/objects"]["ReadOnly"]
    sources = [m["Source"] for m in config["mounts"]]
    assert not any("docker.sock" in src or src.endswith(".ssh") for src in sources)
    assert config["labels"]["so.sandbox"] == "p-1"
    assert config["cap_drop"] == ["ALL"] and "no-new-privileges" in config["security_opt"]
    assert config["network_mode"] == "host" and config["init"] is True
    assert "device_requests" not in config
    assert "device_requests" in container_config(s, "img", gpus=True)


def test_container_config_keeps_only_the_supervisors_capabilities(tmp_path: Path) -> None:
    config = container_config(spec(tmp_path), "img", gpus=False)
    assert config["cap_drop"] == ["ALL"]
    assert sorted(config["cap_add"]) == ["KILL", "SETGID", "SETPCAP", "SETUID"]
    assert not any("seccomp" in opt or "apparmor" in opt for opt in config["security_opt"])


def test_every_writable_tmpfs_is_sized_with_an_inode_cap(tmp_path: Path) -> None:
    plain = container_config(spec(tmp_path), "img", gpus=False)["tmpfs"]
    assert set(plain) == {"/dev/shm"}
    limited = container_config(spec(tmp_path, limits=Limits(disk=1 << 30)), "img", gpus=False)
    assert set(limited["tmpfs"]) == {"/dev/shm", "/tmp"}
    for options in limited["tmpfs"].values():
        assert "size=" in options and "nr_inodes=" in options and "nosuid" in options
    assert f"size={1 << 30}" in limited["tmpfs"]["/tmp"]


def test_commands_run_under_the_root_supervisor_from_the_image() -> None:
    argv = supervised(1000, 1001, "ab" * 8, "/workspace", ["git", "status"])
    assert argv[:4] == ["/usr/bin/python3", "-I", "-S", "-c"]
    assert argv[5:] == ["run", "1000", "1001", "ab" * 8, "/workspace", "git", "status"]
    assert reaper()[5:] == ["reap"] and reaper("cd" * 8)[5:] == ["reap", "--end", "cd" * 8]


def test_terminal_name_takes_only_a_name() -> None:
    assert terminal_name("xterm-256color") == "xterm-256color"
    assert terminal_name("screen.xterm+x") == "screen.xterm+x"
    for bad in (None, "", "x\x1b]0;t\x07", "a b", "x" * 65, "CANARY=$(id)"):
        assert terminal_name(bad) == "xterm"


def test_mounts_key_changes_with_mounts_and_image(tmp_path: Path) -> None:
    a = spec(tmp_path)
    b = spec(tmp_path, mounts=(Mount(Path("/x"), "/x"),))
    assert mounts_key(a, "i1") != mounts_key(b, "i1")
    assert mounts_key(a, "i1") != mounts_key(a, "i2")
    assert mounts_key(a, "i1") == mounts_key(spec(tmp_path), "i1")


def test_exec_env(tmp_path: Path) -> None:
    env = exec_env(spec(tmp_path), {"FOO": "1"})
    assert env["HOME"] == "/home/agent" and env["FOO"] == "1" and env["SO_SANDBOX_ID"] == "p-1"


def test_home_archive_is_owned_by_the_agent(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    (seed / ".claude").mkdir(parents=True)
    (seed / ".claude" / "creds.json").write_text("{}")
    (seed / ".gitconfig").write_text("[user]\n")
    (seed / "link").symlink_to("/etc/shadow")
    with tarfile.open(fileobj=io.BytesIO(home_archive(seed, 1234, 99))) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert set(members) == {".claude", ".claude/creds.json", ".gitconfig"}
    assert all((m.uid, m.gid) == (1234, 99) for m in members.values())


def test_content_hash_is_order_and_boundary_sensitive() -> None:
    assert content_hash("ab", "c") != content_hash("a", "bc")
    assert content_hash("a", "b") == content_hash("a", "b")


def test_no_engine_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(SoError, match="no Docker engine answers at unix:///nonexistent"):
        DockerBackend().client()
    health = DockerBackend().health()
    assert not health.ok and "bwrap" in health.fix
    name, why = choose_auto(BackendSettings())
    assert name == "bwrap" and "no Docker engine" in why


# --- the real engine --------------------------------------------------------------------


@pytest.mark.integration
def test_auto_picks_docker_when_the_image_is_buildable(docker_ready: str) -> None:
    name, why = choose_auto(BackendSettings())
    assert name == "docker", why


@pytest.mark.integration
def test_runner_image_is_content_hashed(docker_ready: str) -> None:
    backend = DockerBackend()
    images = backend.images()
    spec_a = RunnerSpec(base=docker_ready, uid=1000, gid=1000)
    spec_b = RunnerSpec(base=docker_ready, uid=1001, gid=1001)
    assert images.runner_tag(spec_a) == images.runner_tag(spec_a)
    assert images.runner_tag(spec_a) != images.runner_tag(spec_b)
    built = images.ensure(backend.runner_spec(), lambda line: None)
    lines: list[str] = []
    assert images.ensure(backend.runner_spec(), lines.append) == built
    assert lines == []  # present: nothing rebuilt


@pytest.mark.integration
def test_project_dockerfile_is_layered_on_top(docker_ready: str, tmp_path: Path) -> None:
    project = tmp_path / "proj"
    (project / ".so").mkdir(parents=True)
    (project / ".so" / "Dockerfile").write_text(
        "FROM so-runner\nRUN echo layered > /etc/so-project-marker\n"
    )
    from sono.trust import TrustStore, context_digest

    TrustStore.default(os.environ).trust(  # the user reviewed .so/ and ran `so trust`
        project, None, file=project / ".so" / "Dockerfile", context=context_digest(project / ".so")
    )
    backend = DockerBackend(project=project)
    images = Images(backend.client())
    tag = images.ensure(backend.runner_spec(), lambda line: None)
    assert tag.startswith("so-project-proj:")
    out = backend.client().containers.run(tag, ["cat", "/etc/so-project-marker"], remove=True)
    assert out.decode().strip() == "layered"
    images.remove(tag)


@pytest.mark.integration
def test_container_removed_behind_our_back_is_recreated(docker_ready: str, tmp_path: Path) -> None:
    import json

    from helpers import make_repo, so

    repo = make_repo(tmp_path / "proj", {"README.md": "# p\n", "specs/prompt.md": "go\n"})
    agent = tmp_path / "agent.sh"
    agent.write_text(
        '#!/bin/sh\ncat >/dev/null\necho "$SO_ITERATION" > "n$SO_ITERATION"\n'
        'git add -A && git commit -qm "n $SO_ITERATION"\n'
    )
    agent.chmod(0o755)  # the container user (uid 1000 when the host is root) runs it
    first = so(
        "run",
        "-s",
        "docker",
        "-H",
        "custom",
        "--agent-cmd",
        str(agent),
        "-i",
        "1",
        "--yes",
        "--json",
        cwd=repo,
    )
    sid = json.loads(first.stdout.splitlines()[-1])["id"]
    client = DockerBackend().client()
    client.containers.get(f"so-{sid}").remove(force=True)
    again = so("continue", sid, "-i", "1", "--yes", "--json", cwd=repo)
    assert json.loads(again.stdout.splitlines()[-1])["iterations"][0]["commits"], again.stdout
    inside = so("shell", sid, "--", "sh", "-c", "ls n*; id -un", cwd=repo)
    assert inside.stdout.split() == ["n1", "n2", "agent"]
    assert so("rm", sid, cwd=repo).returncode == 0
    assert not client.containers.list(all=True, filters={"label": f"so.sandbox={sid}"})


def test_the_agent_can_reach_paths_mounted_under_root_home(docker_ready: str) -> None:
    """As root, SO_HOME is /root/.local/state/so: the git objects a sandbox borrows are
    mounted at that path, so the agent's uid must be able to pass through the image's
    /root (traverse, not list) — else every Docker run as root failed with "the sandbox's
    HEAD is not a commit"."""
    import subprocess

    backend = DockerBackend()
    image = backend.images().ensure(backend.runner_spec(), lambda _line: None)
    probe = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--user", f"{backend.uid}:{backend.gid}",
         image, "sh", "-c", "stat -c %a /root; ls /root >/dev/null 2>&1 && echo listed || :"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert probe.stdout.split() == ["711"]
