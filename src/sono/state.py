"""All state lives under one home (``SO_HOME``): the sandbox registry and iteration records.

Layout::

    $SO_HOME/sandboxes/<id>/sandbox.json        the registry entry (atomic writes)
    $SO_HOME/sandboxes/<id>/work/               the sandbox's copy of the project
    $SO_HOME/sandboxes/<id>/home/               credentials copied into the sandbox HOME
    $SO_HOME/sandboxes/<id>/iterations/<n>/     prompt.md, output.log, events.jsonl, record.json
    $SO_HOME/agents/                            agent CLIs installed by ``so agents install``
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sono.errors import SoError
from sono.home import home_dir, pid_alive, private_dir, write_json_atomic

RUNNING = "running"
CREATED = "created"
DONE = "done"
BLOCKED = "blocked"
STOPPED = "stopped"
FAILED = "failed"


def so_home(env: Mapping[str, str] | None = None) -> Path:
    return Path(home_dir(env))


def agents_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("SO_AGENTS_DIR"):
        return Path(env["SO_AGENTS_DIR"]).expanduser().resolve()
    return so_home(env) / "agents"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class SandboxRecord:
    """One registry entry. Frozen: updates go through ``dataclasses.replace`` + ``save``."""

    id: str
    project: str
    project_name: str
    host_branch: str
    host_head: str  # host HEAD commit when the sandbox was created
    base_commit: str  # the sandbox's base (== host_head unless --allow-dirty snapshotted)
    harness: str
    backend: str
    created: str
    workspace: str
    status: str = CREATED
    iterations: int = 0
    commits: int = 0
    model: str | None = None
    effort: str | None = None
    agent_cmd: str | None = None
    last_error: str | None = None
    stop_reason: str | None = None
    runner_pid: int | None = None
    updated: str = field(default_factory=now_iso)
    mounts: tuple[tuple[str, str], ...] = ()  # extra read-only (src, dest) mounts
    workspace_mode: str = "copy"  # "overlay": copy-on-write over the project
    network: str = "host"  # "policy": no network but so's proxy and model gateway
    drift: tuple[str, ...] = ()  # host paths that changed under the overlay (reported)
    # The commit under review: taken from the sandbox into so's vault and verified there
    # after every iteration, shell and reset. Diff and merge use it, never a sandbox ref.
    tip: str = ""

    @property
    def branch(self) -> str:
        return f"so/{self.id}"

    @property
    def base_ref(self) -> str:
        return f"refs/so/{self.id}/base"

    def iter_ref(self, n: int) -> str:
        return f"refs/so/{self.id}/iter/{n}"

    def live_status(self) -> str:
        """``running`` only while the runner process is alive (kill -9 leaves it stale)."""
        if self.status == RUNNING and not _pid_alive(self.runner_pid):
            return STOPPED
        return self.status

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["mounts"] = [list(m) for m in self.mounts]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SandboxRecord:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["mounts"] = tuple(tuple(m) for m in values.get("mounts", ()))
        values["drift"] = tuple(values.get("drift", ()))
        return cls(**values)


def _pid_alive(pid: int | None) -> bool:
    return pid_alive(pid)


@dataclass(frozen=True)
class IterationRecord:
    n: int
    started: str
    duration_s: float
    exit_code: int | None
    timed_out: bool
    head_before: str
    head_after: str
    commits: tuple[str, ...]
    commit_retries: int
    auto_committed: bool
    status_after: str  # what specs/status.md said afterwards (pending/done/blocked)
    events: int
    interrupted: bool = False
    files_changed: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_cached: int = 0
    cost_usd: float | None = None
    # The network: attempts the policy denied ({time, host, port, reason}) and what the
    # model gateway saw (requests, tokens) in this iteration.
    killed: str | None = None  # a resource limit that ended the agent run
    log_bytes_dropped: int = 0  # agent output beyond the logs' budget, not written
    net_denied: tuple[dict[str, Any], ...] = ()
    gateway_requests: int = 0
    gateway_tokens_in: int = 0
    gateway_tokens_out: int = 0

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["commits"] = list(self.commits)
        data["net_denied"] = list(self.net_denied)
        return data


class Store:
    """The registry under one ``SO_HOME``."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.root = home / "sandboxes"

    def dir(self, sandbox_id: str) -> Path:
        return self.root / sandbox_id

    def make_dir(self, sandbox_id: str) -> Path:
        """A new sandbox's dir, which must not exist yet; it, ``sandboxes/`` and (when so
        makes it) ``SO_HOME`` are 0700: no other user reaches what lies below."""
        if not self.home.exists():
            private_dir(str(self.home))
        private_dir(str(self.root))
        path = self.dir(sandbox_id)
        path.mkdir(mode=0o700)
        path.chmod(0o700)  # whatever the umask
        return path

    def iteration_dir(self, sandbox_id: str, n: int) -> Path:
        return self.dir(sandbox_id) / "iterations" / str(n)

    def save(self, record: SandboxRecord) -> SandboxRecord:
        record = dataclasses.replace(record, updated=now_iso())
        private_dir(str(self.root))  # sandboxes made before were 0755
        private_dir(str(self.dir(record.id)))
        write_json_atomic(self.dir(record.id) / "sandbox.json", record.to_json())
        return record

    def update(self, record: SandboxRecord, **changes: Any) -> SandboxRecord:
        return self.save(dataclasses.replace(record, **changes))

    def load(self, sandbox_id: str) -> SandboxRecord:
        path = self.dir(sandbox_id) / "sandbox.json"
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                raise TypeError(f"a JSON {type(data).__name__}, not an object")
            return SandboxRecord.from_json(data)
        except FileNotFoundError:
            raise SoError(f"no sandbox {sandbox_id!r}; `so list` shows the existing ones") from None
        except (ValueError, TypeError) as exc:
            raise SoError(
                f"{path}: unreadable sandbox record ({exc}); `so rm {sandbox_id}`"
            ) from exc

    def all(self) -> list[SandboxRecord]:
        records = []
        for entry in self._entries():
            with contextlib.suppress(SoError):
                records.append(self.load(entry))
        return sorted(records, key=lambda r: r.created)

    def _entries(self) -> Iterator[str]:
        if not self.root.is_dir():
            return
        for child in self.root.iterdir():
            if (child / "sandbox.json").is_file():
                yield child.name

    def resolve(self, ref: str) -> SandboxRecord:
        """Accept a full id or a unique prefix of one."""
        if (self.dir(ref) / "sandbox.json").is_file():
            return self.load(ref)
        matches = [e for e in self._entries() if e.startswith(ref)]
        if len(matches) == 1:
            return self.load(matches[0])
        if not matches:
            raise SoError(f"no sandbox {ref!r}; `so list` shows the existing ones")
        raise SoError(
            f"{ref!r} matches several sandboxes ({', '.join(sorted(matches))}); be precise"
        )

    def write_iteration(self, sandbox_id: str, record: IterationRecord) -> None:
        write_json_atomic(
            self.iteration_dir(sandbox_id, record.n) / "record.json", record.to_json()
        )

    def iterations(self, sandbox_id: str) -> list[dict[str, Any]]:
        base = self.dir(sandbox_id) / "iterations"
        if not base.is_dir():
            return []
        out = []
        for child in sorted(base.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0):
            rec = child / "record.json"
            if rec.is_file():
                out.append(json.loads(rec.read_text()))
        return out
