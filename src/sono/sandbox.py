"""A sandbox = registry record + backend + workspace, and the operations on it."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sono import overlay
from sono.backends import BackendSettings, get_backend
from sono.backends.base import Backend, Mount, NetSpec, SandboxSpec
from sono.errors import SoError
from sono.gitobjects import reachable_objects
from sono.layout import forwarder_path, slug
from sono.limits import Limits
from sono.net.policy import NetworkPolicy
from sono.overlay import Drift, Overlay
from sono.state import CREATED, SandboxRecord, Store, now_iso
from sono.vault import Vault, host_objects, seed, take_head
from sono.workspace import (
    SANDBOX_IDENTITY,
    HostRepo,
    SandboxGit,
    alternates,
    create_overlay_workspace,
    create_workspace,
    read_workspace_file,
    removed_on_failure,
)

if TYPE_CHECKING:
    from sono.net.secrets import Secret

WORKSPACE_MODES = ("auto", "overlay", "copy")

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


@dataclass(frozen=True)
class RunPolicy:
    """How a sandbox's processes run this time — the agent's, a human's shell, so's own
    git: resource limits, extra host paths (``files.ro`` / ``files.rw`` as mounts), the
    network policy and secrets its proxy applies, the backend's settings. Built once
    from the config by :func:`sono.app.policy.policy_for`; a sandbox holds one for life."""

    limits: Limits | None = None
    files: tuple[Mount, ...] = ()
    network: NetworkPolicy = field(default_factory=lambda: NetworkPolicy("allowlist"))
    secrets: tuple[Secret, ...] = ()
    backend: BackendSettings = field(default_factory=BackendSettings)


@dataclass
class _Latest:
    record: SandboxRecord


@dataclass(frozen=True)
class Sandbox:
    """One sandbox as this process uses it: its backend and run policy are fixed for the
    object's life; its registry record is state and follows :meth:`save`."""

    store: Store
    backend: Backend
    policy: RunPolicy
    _latest: _Latest = field(repr=False, compare=False)

    @classmethod
    def of(
        cls, record: SandboxRecord, store: Store, backend: Backend, policy: RunPolicy | None = None
    ) -> Sandbox:
        return cls(store, backend, policy or RunPolicy(), _Latest(record))

    @property
    def record(self) -> SandboxRecord:
        return self._latest.record

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
    def overlay(self) -> Overlay | None:
        if self.record.workspace_mode != "overlay":
            return None
        return Overlay.under(self.dir, Path(self.record.project))

    @property
    def git_dir(self) -> Path:
        """Host path of the sandbox repo's git dir (bound at ``<workspace>/.git``)."""
        ov = self.overlay
        return ov.gitdir if ov else self.work / ".git"

    @property
    def net_dir(self) -> Path:
        return self.dir / "net"

    @property
    def spec(self) -> SandboxSpec:
        mounts = tuple(Mount(Path(src), dest) for src, dest in self.record.mounts)
        mounts += self.policy.files
        net = None
        if self.record.network == "policy":
            net = NetSpec(self.net_dir / "sock", forwarder_path())
        return SandboxSpec(
            id=self.record.id,
            workspace=self.work,
            home_seed=self.home_seed,
            mounts=mounts,
            project=Path(self.record.project),
            overlay=self.overlay,
            net=net,
            limits=self.policy.limits,
        )

    def describe_workspace(self) -> str:
        ov = self.overlay
        if ov is None:
            return f"workspace {self.work} (a copy)"
        return f"workspace: copy-on-write over {ov.project} (changes in {ov.upper})"

    def read_file(self, rel: str) -> str | None:
        """A file as the sandbox sees it, read host-side without following links."""
        ov = self.overlay
        return overlay.read_file(ov, rel) if ov else read_workspace_file(self.work, rel)

    def write_file(self, rel: str, text: str) -> None:
        """Write through the sandbox (a mounted overlay must see the change)."""
        self.backend.run(
            spec=self.spec, argv=["sh", "-c", 'printf "%s" "$1" > "$2"', "so", text, rel]
        )

    def fix_drift(self) -> Drift:
        """Undo what the host changed under a copy-on-write workspace since the snapshot:
        tracked files come back from the base commit, new files are hidden, ignored ones
        are reported. A copy has no drift by construction. First, as at every review,
        no file the sandbox wrote keeps a setuid or setgid bit."""
        overlay.strip_setid(self.spec.agent_writable)
        ov = self.overlay
        if ov is None:
            return Drift()
        drift = overlay.scan_drift(ov, base=self.record.base_commit, known=self.record.drift)
        if not drift:
            return drift
        base = self.record.base_commit
        self.backend.refresh(spec=self.spec)
        for chunk in _chunks(drift.restore):
            self.backend.run(
                spec=self.spec,
                argv=["git", "restore", f"--source={base}", "--worktree", "--", *chunk],
                check=False,
            )
        for chunk in _chunks(drift.hide):
            self.backend.run(spec=self.spec, argv=["rm", "-rf", "--", *chunk], check=False)
        known = dict.fromkeys([*self.record.drift, *drift.restore, *drift.hide, *drift.ignored])
        self.save(drift=tuple(known))
        return drift

    @property
    def vault(self) -> Vault:
        """so's own copy of the sandbox's recorded commits (see :mod:`sono.vault`)."""
        return Vault(self.dir / "vault.git")

    @property
    def tip(self) -> str:
        """The commit under review: what ``so diff`` shows and ``so merge`` merges.
        A sandbox from before the vault has none recorded: its HEAD is taken now."""
        return self.record.tip or self.take()

    def take(self) -> str:
        """Take the sandbox's HEAD into the vault as verified data and record it as the
        commit under review (after an iteration, a shell, a reset)."""
        vault, rec = self.vault, self.record
        if not vault.exists():
            vault.create(host_objects(Path(rec.project)))
        known = [c for c in (rec.base_commit, rec.tip) if c and vault.has_commit(c)]
        tip = take_head(
            vault,
            run_inside=lambda argv: self.git.script(argv, check=False),
            git_dir=self.git_dir,
            base=rec.base_commit,
            exclude=known or [rec.host_head],
            scratch=self.dir / "tmp",
        )
        vault.keep("tip", tip)
        if tip != rec.tip:  # the count follows (a commit in `so shell`, a reset)
            self.save(tip=tip, commits=vault.count(rec.base_commit, tip))
        return tip

    def record_iteration(self, n: int, start: str | None = None) -> str:
        """Take HEAD as the commit at the end of iteration ``n`` (on so's timeline), which
        began at ``start`` (a recorded commit; default: the end of ``n - 1``)."""
        tip = self.take()
        self.mark_iteration(n, tip, start)
        return tip

    def mark_iteration(self, n: int, end: str, start: str | None) -> None:
        self.vault.keep(f"iter/{n}", end)
        if start is not None:
            self.vault.keep(f"from/{n}", start)

    def iteration_start(self, n: int) -> str:
        """Where iteration ``n`` started (after a reset: not where ``n - 1`` ended)."""
        found = self.vault.git("rev-parse", "-q", "--verify", f"refs/so/from/{n}", check=False)
        start = found.stdout.strip()
        return start if found.returncode == 0 and start else self.iteration_commit(n - 1)

    def iteration_commit(self, n: int) -> str:
        """The commit recorded at the end of iteration ``n`` (0: the base)."""
        if n <= 0:
            return self.record.base_commit
        found = self.vault.git("rev-parse", "-q", "--verify", f"refs/so/iter/{n}", check=False)
        commit = found.stdout.strip()
        if found.returncode != 0 or not commit:
            raise SoError(
                f"'iter-{n}' is not a commit or iteration of sandbox {self.record.id} "
                f"(no commit recorded for it); see `so diff {self.record.id} --stat`"
            )
        return commit

    def shell(self, argv: Sequence[str] = ()) -> int:
        """Attach the terminal to a shell inside; what the human committed there becomes
        the commit under review."""
        with contextlib.suppress(SoError):
            self.fix_drift()  # host edits since the last run: restored or hidden first
        code = self.backend.shell(spec=self.spec, argv=argv)
        try:
            self.take()
        except SoError as exc:
            import sys

            print(f"so: {exc}", file=sys.stderr)
        return code

    @property
    def git(self) -> SandboxGit:
        return SandboxGit(self.backend, self.spec)

    def save(self, **changes: object) -> SandboxRecord:
        self._latest.record = self.store.update(self.record, **changes)
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


def _chunks(paths: Sequence[str], size: int = 500) -> list[list[str]]:
    return [list(paths[i : i + size]) for i in range(0, len(paths), size)]


def choose_workspace(
    wanted: str, backend: Backend, project: Path, home: Path
) -> tuple[str, str | None]:
    """``(mode, notice)``: ``auto`` takes the overlay where the backend can mount one and
    falls back to a copy with a one-line notice; ``overlay`` insists (error otherwise)."""
    if wanted not in WORKSPACE_MODES:
        raise SoError(f"workspace must be one of {', '.join(WORKSPACE_MODES)}, not {wanted!r}")
    if wanted == "copy":
        return "copy", None
    obstacle = backend.overlay_obstacle(project, home)
    if obstacle is None:
        return "overlay", None
    if wanted == "overlay":
        raise SoError(
            f"workspace = overlay is not possible on {backend.name} here: {obstacle}; "
            "set workspace = auto (or copy)"
        )
    return "copy", f"copying the project instead of a copy-on-write overlay: {obstacle}"


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
    workspace: str = "copy",
    notice: Callable[[str], None] | None = None,
    policy: RunPolicy | None = None,
) -> Sandbox:
    mode, why = choose_workspace(workspace, backend, host.root, store.root)
    if why and notice:
        notice(why)
    sandbox_id = new_id(store, host.root.name)
    root = store.make_dir(sandbox_id)
    with removed_on_failure(root):
        work = root / "work"
        objects = reachable_objects(store.home / "objects", host.root, host.head)
        if mode == "overlay":
            ov = Overlay.under(root, host.root)
            owner = backend.overlay_owner()
            base = create_overlay_workspace(
                host,
                ov,
                sandbox_id=sandbox_id,
                exclude=exclude,
                allow_dirty=allow_dirty,
                objects=objects,
                owner=owner,
            )
            gitdir, work = ov.gitdir, ov.upper
        else:
            base = create_workspace(
                host,
                work,
                sandbox_id=sandbox_id,
                exclude=exclude,
                allow_dirty=allow_dirty,
                objects=objects,
            )
            gitdir = work / ".git"
        seed(Vault(root / "vault.git"), host.root, gitdir, f"refs/so/{sandbox_id}/base", host.head)
        home = root / "home"
        home.mkdir()
        name, email = SANDBOX_IDENTITY
        (home / ".gitconfig").write_text(GITCONFIG.format(name=name, email=email))
        all_mounts = [(str(p), str(p)) for p in alternates(gitdir)]
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
            workspace_mode=mode,
            network="policy",
            tip=base,
        )
        sandbox = Sandbox.of(store.save(record), store, backend, policy)
        (sandbox.net_dir / "sock").mkdir(parents=True)
        backend.create(spec=sandbox.spec)
        return sandbox


def open_sandbox(store: Store, ref: str, policy: RunPolicy | None = None) -> Sandbox:
    """The sandbox ``ref`` names (an id or a unique prefix), on its own backend, run
    under ``policy`` (default: no limits, no extra files, the default network policy)."""
    record = store.resolve(ref)
    policy = policy or RunPolicy()
    return Sandbox.of(record, store, get_backend(record.backend, policy.backend), policy)


def remove_sandbox(sandbox: Sandbox) -> None:
    sandbox.backend.destroy(spec=sandbox.spec)
    overlay.remove_tree(sandbox.dir)
