"""microVM backend: the mapping from our spec and policy to microsandbox SDK calls, through a
fake at the SDK seam (no VM boots on this host; tests/integration/test_microvm_loop.py
boots real ones where the host can)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from microsandbox import (
    Image,
    MountConfig,
    Network,
    Patch,
    PullPolicy,
    RootDisk,
    VsockRoute,
)

from sono import proc
from sono.backends import BACKENDS, BackendSettings, choose_auto, get_backend
from sono.backends.base import Mount, NetSpec, SandboxSpec
from sono.backends.microvm import (
    FORWARD_READY,
    Captured,
    MicrovmBackend,
    config_key,
    ensure_vm_image,
    export_argv,
    shell_argv,
)
from sono.backends.microvm_volumes import volume_id
from sono.errors import SoError
from sono.kvm import Support
from sono.limits import Limits

REF = "so-runner:0123456789abcdef"
PVM = "/dev/kvm exists but comes from kvm_pvm (paravirtual KVM without VT-x/AMD-V): ..."


class FakeApi:
    """Records every SDK call; VMs are names with a status."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.vms: dict[str, str] = {}
        self.images: set[str] = set()
        self.created: list[tuple[str, dict[str, Any]]] = []
        self.code: int | None = 0
        self.lines = ["hello", "world"]
        self.hang = False
        self.run_code = 0

    def cli(self) -> str:
        return "/opt/msb"

    def image_exists(self, ref: str) -> bool:
        self.calls.append(("image_exists", ref))
        return ref in self.images

    def load_image(self, archive: Path, tag: str) -> None:
        assert archive.is_file()
        self.calls.append(("load_image", (archive.name, tag)))
        self.images.add(tag)

    def status(self, name: str) -> str | None:
        self.calls.append(("status", name))
        return self.vms.get(name)

    def create(self, name: str, kwargs: Mapping[str, Any]) -> None:
        self.calls.append(("create", name))
        self.created.append((name, dict(kwargs)))
        self.vms[name] = "running"

    def start(self, name: str) -> None:
        self.calls.append(("start", name))
        self.vms[name] = "running"

    def spawn(self, name: str, argv: Sequence[str], *, user: str) -> None:
        self.calls.append(("spawn", (name, list(argv), user)))

    def run(
        self,
        name: str,
        argv: Sequence[str],
        *,
        user: str,
        cwd: str,
        env: Mapping[str, str],
        timeout: float | None = None,
    ) -> Captured:
        self.calls.append(("run", (name, list(argv), user, cwd, dict(env))))
        if list(argv[:2]) in (["test", "-e"], ["rm", "-f"], ["pkill", "-KILL"]):
            return Captured(0, "", "")
        return Captured(self.run_code, "out\n", "err\n")

    def stream(
        self,
        name: str,
        argv: Sequence[str],
        *,
        user: str,
        cwd: str,
        env: Mapping[str, str],
        stdin: bytes | None,
        nproc: int | None,
        on_line: Callable[[str], None],
        should_stop: Callable[[], bool],
    ) -> int | None:
        self.calls.append(
            (
                "stream",
                {
                    "name": name,
                    "argv": list(argv),
                    "user": user,
                    "cwd": cwd,
                    "env": dict(env),
                    "stdin": stdin,
                    "nproc": nproc,
                },
            )
        )
        for line in self.lines:
            on_line(line)
        while self.hang:
            if should_stop():
                return None
            time.sleep(0.01)
        return self.code

    def remove(self, name: str) -> None:
        self.calls.append(("remove", name))
        self.vms.pop(name, None)

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    def runs(self) -> list[list[str]]:
        return [c[1][1] for c in self.calls if c[0] == "run"]


def make_spec(tmp_path: Path, **kw: Any) -> SandboxSpec:
    state = tmp_path / "sandboxes" / "proj-1a2b"
    (state / "work").mkdir(parents=True, exist_ok=True)
    project = tmp_path / "proj"
    project.mkdir(exist_ok=True)
    values: dict[str, Any] = {
        "id": "proj-1a2b",
        "workspace": state / "work",
        "home_seed": state / "home",
        "project": project,
        **kw,
    }
    return SandboxSpec(**values)


def net_spec(tmp_path: Path) -> NetSpec:
    sock = tmp_path / "sandboxes" / "proj-1a2b" / "net" / "sock"
    sock.mkdir(parents=True, exist_ok=True)
    return NetSpec(sock, Path("/srv/forward.py"))


def backend(tmp_path: Path, api: FakeApi, *, ok: bool = True) -> MicrovmBackend:
    return MicrovmBackend(
        api=api,
        support=lambda: Support(ok, "test host" if ok else PVM),
        so_home=tmp_path / "so",
        image=lambda spec: REF,
    )


def created(api: FakeApi) -> dict[str, Any]:
    assert api.created, api.calls
    return api.created[-1][1]


# --- create: what the VM is made of --------------------------------------------------


def test_create_maps_the_spec_onto_one_detached_vm(tmp_path: Path) -> None:
    api = FakeApi()
    tools = Mount(Path("/opt/agents/claude"), "/opt/agents/claude")
    data = Mount(tmp_path / "data", "/data", writable=True)
    spec = make_spec(tmp_path, mounts=(tools, data), net=net_spec(tmp_path))
    backend(tmp_path, api).create(spec=spec)
    assert api.created[0][0] == "so-proj-1a2b"
    kw = created(api)
    assert kw["image"] == Image.oci(REF) and kw["pull_policy"] == PullPolicy.NEVER
    assert kw["detached"] is True and kw["replace"] is True
    assert kw["user"] == "1000:1000" and kw["workdir"] == "/workspace"
    assert kw["memory"] == 4096 and kw["cpus"] == 2  # defaults without limits
    volumes: dict[str, MountConfig] = kw["volumes"]
    home = tmp_path / "so" / "volumes" / volume_id(spec.project or Path())
    assert volumes["/workspace"].bind == str(spec.workspace)
    assert not volumes["/workspace"].readonly
    assert volumes["/home/agent"].bind == str(home)
    assert volumes["/home/agent/.so"].bind == str(spec.home_seed / ".so")
    assert volumes["/home/agent/.so"].readonly
    assert volumes["/opt/agents/claude"].readonly and not volumes["/data"].readonly
    assert volumes["/run/so/net"].readonly
    for mount in volumes.values():  # uid 1000 sees its files as its own
        assert (mount.override_uid, mount.override_gid) == (1000, 1000)
        mount._to_dict()  # valid for the SDK
    assert not any(".ssh" in str(m.bind) or "docker.sock" in str(m.bind) for m in volumes.values())
    sock = spec.net.socket_dir if spec.net else Path()
    assert kw["vsock"] == [
        VsockRoute.stream(str(sock / "p" / "gateway.sock"), 3129),
        VsockRoute.stream(str(sock / "p" / "proxy.sock"), 3128),
    ]
    # No interface out: so's proxy and gateway are the way out, as on bwrap and Docker.
    assert kw["network"] == Network.none()
    assert "secrets" not in kw
    spawned = [c[1] for c in api.calls if c[0] == "spawn"]
    assert len(spawned) == 1
    _, argv, user = spawned[0]
    assert user == "0:0" and argv[:2] == ["python3", "-c"]
    assert argv[3:] == [FORWARD_READY, "3128=3128", "3129=3129"]
    assert ["test", "-e", FORWARD_READY] in api.runs()
    assert (spec.home_seed / ".so").is_dir() and home.is_dir()


def test_limits_map_to_vm_resources(tmp_path: Path) -> None:
    api = FakeApi()
    limits = Limits(memory=2 << 30, cpus=1.5, pids=100, disk=5 << 30)
    spec = make_spec(tmp_path, limits=limits)
    b = backend(tmp_path, api)
    b.create(spec=spec)
    kw = created(api)
    assert kw["memory"] == 2048 and kw["cpus"] == 1
    assert kw["image"] == Image.oci(REF, root_disk=RootDisk.managed(5120))
    b.exec(spec=spec, argv=["true"], env={}, stdin_text=None, timeout=None, on_line=print)
    stream = next(c[1] for c in api.calls if c[0] == "stream")
    assert stream["nproc"] == 100
    plan = b.plan_limits(limits)
    assert {k: e.mechanism for k, e in plan.items()} == {
        "memory": "microvm",
        "cpus": "microvm",
        "pids": "rlimit",
        "disk": "watchdog",
    }
    assert "rounded down" in plan["cpus"].detail and "5120 MiB" in plan["disk"].detail


def test_a_lone_file_is_copied_in_read_only(tmp_path: Path) -> None:
    script = tmp_path / "bin" / "agent.sh"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    api = FakeApi()
    spec = make_spec(tmp_path, mounts=(Mount(script, str(script)),))
    b = backend(tmp_path, api)
    b.create(spec=spec)
    kw = created(api)
    assert str(script) not in kw["volumes"]
    assert kw["patches"] == [Patch.copy_file(str(script), str(script), mode=0o555, replace=True)]
    first = config_key(kw)
    script.write_text("#!/bin/sh\necho changed\n")
    assert config_key(kw) != first  # copied at boot only: a change needs a new VM
    writable = make_spec(tmp_path, mounts=(Mount(script, "/data/x", writable=True),))
    with pytest.raises(SoError, match="shares directories, not single files"):
        b.create(spec=writable)


def test_a_sandbox_without_project_gets_its_own_home(tmp_path: Path) -> None:
    api = FakeApi()
    spec = make_spec(tmp_path, project=None)
    backend(tmp_path, api).create(spec=spec)
    assert created(api)["volumes"]["/home/agent"].bind == str(spec.writable_dir / "vm-home")


# --- exec, run, shell -------------------------------------------------------------------


def test_exec_streams_as_the_agent_with_fresh_credentials(tmp_path: Path) -> None:
    api = FakeApi()
    spec = make_spec(tmp_path, net=net_spec(tmp_path), env={"SO_X": "1"})
    b = backend(tmp_path, api)
    b.create(spec=spec)
    (spec.home_seed / ".claude").mkdir()
    (spec.home_seed / ".claude" / "token.json").write_text("{}")
    (spec.home_seed / ".so" / "prompt.md").write_text("do it")
    api.code = 3
    lines: list[str] = []
    result = b.exec(
        spec=spec,
        argv=["agent", "-p"],
        env={"K": "v"},
        stdin_text="prompt",
        timeout=None,
        on_line=lines.append,
    )
    assert result.returncode == 3 and not result.timed_out and result.killed is None
    assert lines == ["hello", "world"]
    call = next(c[1] for c in api.calls if c[0] == "stream")
    assert call["name"] == "so-proj-1a2b" and call["argv"] == ["agent", "-p"]
    assert call["user"] == "1000:1000" and call["cwd"] == "/workspace"
    assert call["stdin"] == b"prompt"
    env = call["env"]
    assert env["HOME"] == "/home/agent" and env["K"] == "v" and env["SO_X"] == "1"
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:3128"
    home = tmp_path / "so" / "volumes" / volume_id(spec.project or Path())
    assert (home / ".claude" / "token.json").read_text() == "{}"
    assert not (home / ".so" / "prompt.md").exists()  # the sandbox's own, mounted read-only
    assert api.names().count("create") == 1  # one VM per sandbox, exec per iteration


def test_exec_timeout_kills_the_agent(tmp_path: Path) -> None:
    api = FakeApi()
    spec = make_spec(tmp_path)
    b = backend(tmp_path, api)
    b.create(spec=spec)
    api.hang = True
    result = b.exec(
        spec=spec, argv=["sleep", "9"], env={}, stdin_text=None, timeout=0.05, on_line=print
    )
    assert result.timed_out and result.returncode is None
    kill = [c[1] for c in api.calls if c[0] == "run" and c[1][1][0] == "pkill"]
    assert kill and kill[-1][1] == ["pkill", "-KILL", "-u", "1000"] and kill[-1][2] == "0:0"


def test_run_captures_and_checks(tmp_path: Path) -> None:
    api = FakeApi()
    spec = make_spec(tmp_path)
    b = backend(tmp_path, api)
    b.create(spec=spec)
    done = b.run(spec=spec, argv=["git", "status"])
    assert (done.returncode, done.stdout, done.stderr) == (0, "out\n", "err\n")
    api.run_code = 2
    with pytest.raises(proc.CommandError):
        b.run(spec=spec, argv=["false"])
    assert b.run(spec=spec, argv=["false"], check=False).returncode == 2


def test_shell_execs_msb_into_the_vm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    api = FakeApi()
    spec = make_spec(tmp_path)
    b = backend(tmp_path, api)
    b.create(spec=spec)
    seen: list[list[str]] = []

    def interactive(argv: Sequence[str], **kw: object) -> int:
        seen.append(list(argv))
        return 0

    monkeypatch.setattr(proc, "interactive", interactive)
    assert b.shell(spec=spec, argv=["git", "log"]) == 0
    argv = seen[0]
    assert argv[:7] == [
        "/opt/msb",
        "exec",
        "--no-tty",
        "--user",
        "1000:1000",
        "--workdir",
        "/workspace",
    ]
    assert argv[-4:] == ["so-proj-1a2b", "--", "git", "log"]
    assert "HOME=/home/agent" in argv
    plain = shell_argv("msb", spec, {}, [], tty=True)
    assert plain == [
        "msb",
        "exec",
        "--tty",
        "--user",
        "1000:1000",
        "--workdir",
        "/workspace",
        "so-proj-1a2b",
        "--",
        "bash",
        "--norc",
        "-i",
    ]


# --- lifecycle: start, recreate, destroy ------------------------------------------------


def test_stopped_vm_is_started_vanished_or_changed_one_recreated(tmp_path: Path) -> None:
    api = FakeApi()
    spec = make_spec(tmp_path, net=net_spec(tmp_path))
    backend(tmp_path, api).create(spec=spec)
    api.vms["so-proj-1a2b"] = "stopped"
    api.calls.clear()
    backend(tmp_path, api).run(spec=spec, argv=["true"])  # a later so process
    assert "start" in api.names() and "create" not in api.names() and "spawn" in api.names()
    api.vms.clear()
    api.calls.clear()
    backend(tmp_path, api).run(spec=spec, argv=["true"])
    assert "create" in api.names()
    api.calls.clear()
    limited = make_spec(tmp_path, net=spec.net, limits=Limits(memory=1 << 30))
    backend(tmp_path, api).run(spec=limited, argv=["true"])
    assert api.names()[:3] == ["status", "remove", "create"]


def test_destroy_removes_the_vm(tmp_path: Path) -> None:
    api = FakeApi()
    spec = make_spec(tmp_path)
    b = backend(tmp_path, api)
    b.create(spec=spec)
    assert (spec.writable_dir / "microvm.json").is_file()
    b.destroy(spec=spec)
    assert ("remove", "so-proj-1a2b") in api.calls
    assert not (spec.writable_dir / "microvm.json").exists()


# --- fail fast where no VM can boot ----------------------------------------------------


def test_every_operation_fails_fast_with_the_reason(tmp_path: Path) -> None:
    api = FakeApi()
    spec = make_spec(tmp_path)
    b = backend(tmp_path, api, ok=False)
    operations: list[Callable[[], object]] = [
        lambda: b.create(spec=spec),
        lambda: b.exec(spec=spec, argv=["x"], env={}, stdin_text=None, timeout=None, on_line=print),
        lambda: b.run(spec=spec, argv=["x"]),
        lambda: b.shell(spec=spec),
    ]
    for operation in operations:
        start = time.monotonic()
        with pytest.raises(
            SoError, match="cannot boot a microVM here: /dev/kvm exists but comes from kvm_pvm"
        ):
            operation()
        assert time.monotonic() - start < 1
    b.destroy(spec=spec)  # nothing of ours can exist here: so rm still works
    assert api.calls == []
    health = b.health()
    assert not health.ok and "kvm_pvm" in health.detail and "-s docker" in health.fix


def test_without_an_api_the_sdk_is_never_touched_on_a_non_booting_host(tmp_path: Path) -> None:
    b = MicrovmBackend(support=lambda: Support(False, PVM), so_home=tmp_path)
    with pytest.raises(SoError, match="kvm_pvm"):
        b.create(spec=make_spec(tmp_path))
    assert b._api is None


def test_get_backend_builds_it_from_the_settings() -> None:
    b = get_backend("microvm", BackendSettings(docker_base="debian:stable-slim"))
    assert isinstance(b, MicrovmBackend) and b._base == "debian:stable-slim"


# --- image: Docker build → microsandbox, no registry -----------------------------------


def test_image_is_exported_from_docker_and_loaded_once(tmp_path: Path) -> None:
    api = FakeApi()
    ran: list[list[str]] = []

    def docker(argv: Sequence[str]) -> None:
        ran.append(list(argv))
        Path(argv[3]).write_bytes(b"tar")

    progress: list[str] = []
    ref = ensure_vm_image(api, REF, tmp_path / "cache", progress.append, run=docker)
    archive = tmp_path / "cache" / "so-runner_0123456789abcdef.tar"
    assert ref == REF
    assert ran == [["docker", "save", "--output", str(archive), REF]]
    assert ("load_image", (archive.name, REF)) in api.calls and not archive.exists()
    ensure_vm_image(api, REF, tmp_path / "cache", progress.append, run=docker)
    assert len(ran) == 1  # the content-hashed tag is already there
    assert export_argv("so-project-x:1", Path("/c/x.tar")) == [
        "docker",
        "save",
        "--output",
        "/c/x.tar",
        "so-project-x:1",
    ]


# --- policy answers and registration ----------------------------------------------------


def test_workspace_is_always_a_copy(tmp_path: Path) -> None:
    b = backend(tmp_path, FakeApi())
    obstacle = b.overlay_obstacle(tmp_path, tmp_path)
    assert obstacle is not None and "virtiofs" in obstacle
    assert b.overlay_owner() is None
    b.refresh(spec=make_spec(tmp_path))


def test_registered_and_never_chosen_by_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "microvm" in BACKENDS
    import sono.kvm

    monkeypatch.setattr(sono.kvm, "boot_support", lambda *a, **k: Support(True, "kvm_intel"))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert choose_auto(BackendSettings())[0] == "bwrap"


def test_config_key_follows_what_needs_a_new_vm(tmp_path: Path) -> None:
    api = FakeApi()
    b = backend(tmp_path, api)
    b.create(spec=make_spec(tmp_path))
    first = config_key(created(api))
    b.create(spec=make_spec(tmp_path))
    assert config_key(created(api)) == first
    b.create(spec=make_spec(tmp_path, limits=Limits(cpus=4)))
    assert config_key(created(api)) != first
