"""A sandbox = registry record + backend + workspace, and the operations on it."""

from __future__ import annotations

import re
import secrets
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sono.backends import BackendSettings, get_backend
from sono.backends.base import Backend, Mount, SandboxSpec
from sono.state import CREATED, SandboxRecord, Store, now_iso
from sono.workspace import (
    SANDBOX_IDENTITY,
    HostRepo,
    SandboxGit,
    alternates,
    create_workspace,
    removed_on_failure,
)

GITCONFIG = """[user]
\tname = {name}
\temail = {email}
[init]
\tdefaultBranch = main
[safe]
\tdirectory = *
[core]
\tpager = cat
[advice]
\tdetachedHead = false
"""


@dataclass
class Sandbox:
    record: SandboxRecord
    store: Store
    backend: Backend

    @property
    def dir(self) -> Path:
        return self.store.dir(self.record.id)

    @property
    def work(self) -> Path:
        return Path(self.record.workspace)

    @property
    def home_seed(self) -> Path:
        return self.dir / "home"

    @property
    def spec(self) -> SandboxSpec:
        mounts = tuple(Mount(Path(src), dest) for src, dest in self.record.mounts)
        return SandboxSpec(
            id=self.record.id,
            workspace=self.work,
            home_seed=self.home_seed,
            mounts=mounts,
            project=Path(self.record.project),
        )

    @property
    def git(self) -> SandboxGit:
        return SandboxGit(self.backend, self.spec)

    def save(self, **changes: object) -> SandboxRecord:
        self.record = self.store.update(self.record, **changes)
        return self.record

    def with_mounts(self, extra: Sequence[Mount]) -> None:
        """Remember extra read-only mounts (an agent CLI found at run time)."""
        known = list(self.record.mounts)
        for m in extra:
            pair = (str(m.src), m.dest)
            if pair not in known:
                known.append(pair)
        if tuple(known) != self.record.mounts:
            self.save(mounts=tuple(known))


def slug(name: str) -> str:
    text = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return (text or "project")[:24].rstrip("-")


def new_id(store: Store, project_name: str) -> str:
    while True:
        candidate = f"{slug(project_name)}-{secrets.token_hex(2)}"
        if not store.dir(candidate).exists():
            return candidate


def create_sandbox(
    *,
    store: Store,
    host: HostRepo,
    harness: str,
    backend_name: str,
    backend: Backend,
    exclude: Sequence[str],
    allow_dirty: bool,
    model: str | None,
    effort: str | None,
    mounts: Sequence[Mount] = (),
    agent_cmd: str | None = None,
) -> Sandbox:
    sandbox_id = new_id(store, host.root.name)
    root = store.dir(sandbox_id)
    root.mkdir(parents=True)
    with removed_on_failure(root):
        work = root / "work"
        base = create_workspace(
            host, work, sandbox_id=sandbox_id, exclude=exclude, allow_dirty=allow_dirty
        )
        home = root / "home"
        home.mkdir()
        name, email = SANDBOX_IDENTITY
        (home / ".gitconfig").write_text(GITCONFIG.format(name=name, email=email))
        all_mounts = [(str(p), str(p)) for p in alternates(work)]
        all_mounts += [(str(m.src), m.dest) for m in mounts]
        record = SandboxRecord(
            id=sandbox_id,
            project=str(host.root),
            project_name=host.root.name,
            host_branch=host.branch,
            host_head=host.head,
            base_commit=base,
            harness=harness,
            backend=backend_name,
            created=now_iso(),
            workspace=str(work),
            status=CREATED,
            model=model,
            effort=effort,
            agent_cmd=agent_cmd,
            mounts=tuple(dict.fromkeys(all_mounts)),
        )
        sandbox = Sandbox(store.save(record), store, backend)
        backend.create(spec=sandbox.spec)
        return sandbox


def open_sandbox(store: Store, ref: str, settings: BackendSettings | None = None) -> Sandbox:
    record = store.resolve(ref)
    return Sandbox(record, store, get_backend(record.backend, settings))


def remove_sandbox(sandbox: Sandbox) -> None:
    sandbox.backend.destroy(spec=sandbox.spec)
    shutil.rmtree(sandbox.dir, ignore_errors=True)
