"""Config → run policy: limits checked against the backend, files as mounts, the network
policy and secrets — built once, used by every process in the sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from fakes import HostBackend
from helpers import make_repo
from sono.app.context import Context
from sono.app.policy import enforceable_limits, extra_files, policy_for
from sono.app.sandboxes import open_sandbox
from sono.backends.bwrap import BwrapBackend
from sono.config import Config, load_config
from sono.errors import SoError
from sono.sandbox import create_sandbox
from sono.state import Store
from sono.workspace import inspect_host


def cfg(tmp_path: Path, **env: str) -> Config:
    return load_config(project=None, env=env, home=tmp_path, flags={})


def ctx(tmp_path: Path, notes: list[str] | None = None, **env: str) -> Context:
    sink = notes.append if notes is not None else (lambda _line: None)
    return Context(env={"SO_HOME": str(tmp_path / "so"), **env}, home=tmp_path, notice=sink)


def test_unenforceable_limits_fail_closed(tmp_path: Path) -> None:
    with pytest.raises(SoError, match=r"limits.memory .* cannot be enforced on fake here"):
        enforceable_limits(ctx(tmp_path), cfg(tmp_path, SO_LIMIT_MEMORY="1g"), HostBackend())


def test_best_effort_downgrades_with_a_warning(tmp_path: Path) -> None:
    notes: list[str] = []
    config = cfg(tmp_path, SO_LIMIT_MEMORY="1g", SO_ENFORCE="best-effort")
    limits = enforceable_limits(ctx(tmp_path, notes), config, HostBackend())
    assert limits is not None and limits.memory == 1 << 30
    assert any("limits.memory is not enforced on fake here" in n for n in notes)


def test_no_limits_no_check(tmp_path: Path) -> None:
    assert enforceable_limits(ctx(tmp_path), cfg(tmp_path), HostBackend()) is None


def test_bwrap_enforces_limits_here(tmp_path: Path) -> None:
    limits = enforceable_limits(ctx(tmp_path), cfg(tmp_path, SO_LIMIT_PIDS="64"), BwrapBackend())
    assert limits is not None and limits.pids == 64


def test_policy_to_run_refuses_what_it_cannot_enforce_a_review_policy_leaves_it_out(
    tmp_path: Path,
) -> None:
    config = cfg(tmp_path, SO_LIMIT_MEMORY="1g", SO_LIMIT_PIDS="64")
    with pytest.raises(SoError, match="cannot be enforced"):
        policy_for(ctx(tmp_path), config, HostBackend())
    review = policy_for(ctx(tmp_path), config, HostBackend(), run=False)
    assert review.limits is None  # the fake backend enforces none of them
    bwrap = policy_for(ctx(tmp_path), config, BwrapBackend(), run=False)
    assert bwrap.limits is not None and bwrap.limits.pids == 64


def test_policy_carries_files_network_secrets_and_backend_settings(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    config = load_config(
        project=None,
        env={},
        home=tmp_path,
        flags={"network.mode": "open", "network.deny": "evil.example", "bwrap": "/usr/bin/bwrap"},
    )
    config = Config(**{**config.__dict__, "files_ro": (str(data),)})
    policy = policy_for(ctx(tmp_path), config, HostBackend())
    assert [(m.src, m.dest, m.writable) for m in policy.files] == [(data, str(data), False)]
    assert policy.network.mode == "open" and policy.network.deny == ("evil.example",)
    assert policy.backend.bwrap == "/usr/bin/bwrap"


def test_a_missing_files_path_is_an_error_to_run_and_left_out_for_a_review(
    tmp_path: Path,
) -> None:
    config = cfg(tmp_path)
    config = Config(**{**config.__dict__, "files_rw": (str(tmp_path / "nope"),)})
    with pytest.raises(SoError, match=r"files.rw: .*nope does not exist"):
        extra_files(config)
    assert extra_files(config, strict=False) == ()


def test_open_sandbox_applies_the_projects_policy_to_every_exec(tmp_path: Path) -> None:
    """A sandbox opened to run gets its limits and files from its project's config; its
    spec — what every backend exec (agent, shell, so's git) uses — carries them."""
    repo = make_repo(tmp_path / "proj", {"a.txt": "a\n"})
    data = tmp_path / "data"
    data.mkdir()
    env = {"SO_HOME": str(tmp_path / "so"), "SO_LIMIT_PIDS": "77"}
    sb = create_sandbox(
        store=Store(tmp_path / "so"),
        host=inspect_host(repo),
        harness="custom",
        backend_name="bwrap",
        backend=BwrapBackend(),
        exclude=(),
        allow_dirty=False,
        model=None,
        effort=None,
    )
    ctx_run = Context(env=env, home=tmp_path, flags={"files.ro": str(data)})
    opened = open_sandbox(ctx_run, sb.record.id, run=True)
    spec = opened.sandbox.spec
    assert spec.limits is not None and spec.limits.pids == 77
    assert any(m.src == data and not m.writable for m in spec.mounts)
    assert opened.config.pids == 77
