"""Shared fixtures. Every test runs with HOME, XDG dirs and SO_HOME in a temp dir, so
nothing can touch the real home; agent CLIs are cached per session in .cache/agents."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from helpers import AGENTS_CACHE, make_repo
from sono import agents
from sono.harnesses import harness_class
from sono.harnesses.claude import ClaudeHarness
from sono.testing.model_server import ModelServer


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    real_home = Path.home()
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    monkeypatch.setenv("SO_HOME", str(tmp_path / "so-home"))
    monkeypatch.setenv("SO_AGENTS_DIR", str(AGENTS_CACHE))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in (
        "SO_HARNESS",
        "SO_ITERATIONS",
        "SO_SANDBOX",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_AUTH_TOKEN",
        "CLAUDE_CODE_OAUTH_TOKEN",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "CODEX_API_KEY",
        "SO_EFFORT",
        "SO_MODEL",
        "SO_MAX_COST",
        "SO_MAX_TOKENS",
    ):
        monkeypatch.delenv(var, raising=False)
    # Unit and most integration tests pin bwrap; Docker parity tests ask for `backend`.
    monkeypatch.setenv("SANDBOX", "bwrap")
    before = _snapshot(real_home)
    yield home
    _remove_containers(tmp_path / "so-home")
    assert _snapshot(real_home) == before, "a test wrote to the real home directory"


def _remove_containers(so_home: Path) -> None:
    """Docker sandboxes a test left behind (it did not merge or rm them) must not pile up."""
    root = so_home / "sandboxes"
    ids = [p.name for p in root.iterdir()] if root.is_dir() else []
    if not ids:
        return
    try:
        import docker

        client = docker.from_env(timeout=10)
        for sandbox_id in ids:
            for c in client.containers.list(
                all=True, filters={"label": f"so.sandbox={sandbox_id}"}
            ):
                c.remove(force=True)
    except Exception:  # no engine: nothing of ours to clean
        return


def _snapshot(home: Path) -> set[str]:
    watched = [
        home / ".config" / "so",
        home / ".local" / "state" / "so",
        home / ".claude",
        home / ".codex",
        home / ".pi",
        home / ".config" / "opencode",
    ]
    return {str(p) for w in watched if w.exists() for p in w.rglob("*")}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "project")


# --- integration: the real claude CLI (pinned, installed once) and the model server ---


@pytest.fixture(scope="session")
def installed_agent() -> Callable[[str], Path]:
    """``installed_agent("codex")`` → the pinned CLI in the test agents cache, installed
    with npm on first use (CI must run these tests: never skipped for a missing CLI)."""

    def install(name: str) -> Path:
        pkg = harness_class(name).npm
        assert pkg is not None, name
        return agents.install(name, pkg, AGENTS_CACHE)

    return install


@pytest.fixture(scope="session")
def claude_bin() -> Path:
    """CI must run these tests, so a missing CLI is installed, never skipped."""
    pkg = ClaudeHarness.npm
    assert pkg is not None
    path = agents.installed_bin(AGENTS_CACHE, "claude", pkg)
    if not path.exists():
        agents.install("claude", pkg, AGENTS_CACHE)
    return path


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    with ModelServer() as server:
        yield server


@pytest.fixture
def claude_env(claude_bin: Path, model_server: ModelServer) -> dict[str, str]:
    return {
        "ANTHROPIC_BASE_URL": model_server.url,
        "ANTHROPIC_API_KEY": "sk-test-placeholder",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }


@pytest.fixture(scope="session")
def docker_ready() -> str:
    """A Docker engine and the offline base image (`so image bootstrap`); scripts/test.sh
    prepares both. Skipped, with the reason shown, where no engine can answer."""
    from sono.backends.docker import DockerBackend
    from sono.errors import SoError
    from sono.images import BOOTSTRAP_REPO, DEFAULT_SUITE

    backend = DockerBackend()
    try:
        images = backend.images()
    except SoError as exc:
        pytest.skip(f"Docker parity tests need an engine: {exc}")
    base = f"{BOOTSTRAP_REPO}:{DEFAULT_SUITE}"
    if not images.exists(base):
        pytest.skip(f"Docker parity tests need the offline base image {base}: so image bootstrap")
    images.ensure(backend.runner_spec(), lambda line: None)
    return base


@pytest.fixture(params=["bwrap", "docker"])
def backend(request: pytest.FixtureRequest) -> str:
    """Run a scenario on each backend (parity)."""
    if request.param == "docker":
        request.getfixturevalue("docker_ready")
    return str(request.param)
