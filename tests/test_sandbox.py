"""A sandbox: its record, its fixed backend and run policy, and the spec every exec uses."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fakes import HostBackend, fake_sandbox
from helpers import make_repo
from sono.backends.base import Mount
from sono.errors import SoError
from sono.layout import slug
from sono.limits import Limits
from sono.sandbox import RunPolicy, Sandbox, choose_workspace, new_id, open_sandbox
from sono.state import Store


def test_policy_is_fixed_and_the_record_follows_save(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "proj", {"a.txt": "a\n"})
    sb = fake_sandbox(tmp_path, repo)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sb.policy = RunPolicy()  # type: ignore[misc]
    saved = sb.save(stop_reason="checked")
    assert sb.record is saved and sb.record.stop_reason == "checked"
    assert sb.store.load(sb.record.id).stop_reason == "checked"


def test_spec_carries_the_policys_limits_and_files(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "proj", {"a.txt": "a\n"})
    plain = fake_sandbox(tmp_path, repo)
    data = tmp_path / "data"
    data.mkdir()
    policy = RunPolicy(limits=Limits(pids=33), files=(Mount(data, "/data", writable=True),))
    sb = Sandbox.of(plain.record, plain.store, plain.backend, policy)
    spec = sb.spec
    assert spec.limits == Limits(pids=33)
    assert Mount(data, "/data", writable=True) in spec.mounts
    assert plain.spec.limits is None
    assert Mount(data, "/data", writable=True) not in plain.spec.mounts


def test_open_sandbox_takes_the_backend_settings_of_the_policy(tmp_path: Path) -> None:
    from sono.backends import BackendSettings
    from sono.backends.bwrap import BwrapBackend

    repo = make_repo(tmp_path / "proj", {"a.txt": "a\n"})
    sb = fake_sandbox(tmp_path, repo)
    store = Store(tmp_path / "so")
    store.update(sb.record, backend="bwrap")
    mine = tmp_path / "my-bwrap"  # an old one: the backend names it when it refuses it
    mine.write_text("#!/bin/sh\necho 'bubblewrap 0.4.0'\n")
    mine.chmod(0o755)
    policy = RunPolicy(backend=BackendSettings(bwrap=str(mine)))
    opened = open_sandbox(store, sb.record.id[:6], policy)
    assert isinstance(opened.backend, BwrapBackend) and opened.policy is policy
    with pytest.raises(SoError, match=r"configured bwrap .*my-bwrap is older"):
        opened.backend.binary()


def test_unknown_iteration_is_a_clear_error(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "proj", {"a.txt": "a\n"})
    sb = fake_sandbox(tmp_path, repo)
    assert sb.iteration_commit(0) == sb.record.base_commit
    with pytest.raises(SoError, match="'iter-3' is not a commit or iteration"):
        sb.iteration_commit(3)


def test_workspace_choice(tmp_path: Path) -> None:
    backend = HostBackend()
    assert choose_workspace("copy", backend, tmp_path, tmp_path) == ("copy", None)
    with pytest.raises(SoError, match="workspace must be one of"):
        choose_workspace("cow", backend, tmp_path, tmp_path)


def test_ids_are_slugs_of_the_project_name(tmp_path: Path) -> None:
    assert slug("My Project!") == "my-project"
    assert slug("***") == "project"
    sid = new_id(Store(tmp_path / "so"), "My Project")
    assert sid.startswith("my-project-") and len(sid) == len("my-project-") + 4
