"""Config → how sandboxes run: the backend to create them on, and the one
:class:`~sono.sandbox.RunPolicy` every process in a sandbox runs under."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from sono.app.context import Context
from sono.backends import BackendSettings, choose_auto, get_backend
from sono.backends.base import Backend, Mount
from sono.config import Config
from sono.errors import SoError
from sono.limits import Limits
from sono.net.policy import NetworkPolicy
from sono.sandbox import RunPolicy


def backend_settings(ctx: Context, cfg: Config | None = None) -> BackendSettings:
    if cfg is None:
        return BackendSettings(progress=ctx.notice)
    return BackendSettings(bwrap=cfg.bwrap, docker_base=cfg.docker_base, progress=ctx.notice)


@dataclass(frozen=True)
class ChosenBackend:
    backend: Backend
    why: str


def backend_for(ctx: Context, cfg: Config, project: Path | None = None) -> ChosenBackend:
    """The backend to create sandboxes on, checked to work here, and why it was chosen
    (``auto``: with ``project``, the one that gives it the better workspace)."""
    settings = backend_settings(ctx, cfg)
    name, why = backend_choice(ctx, cfg, project)
    backend = get_backend(name, settings)
    health = backend.health()
    if not health.ok:
        raise SoError(f"{health.detail}; fix: {health.fix}")
    return ChosenBackend(backend, why)


def backend_choice(ctx: Context, cfg: Config, project: Path | None) -> tuple[str, str]:
    """``(backend, why)`` as ``so run`` in ``project`` would choose (``so doctor`` says
    the same)."""
    if cfg.sandbox != "auto":
        return cfg.sandbox, f"-s/SANDBOX/config: {cfg.sandbox}"
    judged = project if cfg.workspace != "copy" else None
    return choose_auto(backend_settings(ctx, cfg), judged, ctx.store.root)


def policy_for(ctx: Context, cfg: Config, backend: Backend, *, run: bool = True) -> RunPolicy:
    """The run policy of ``cfg`` on ``backend``. ``run``: for processes a person or agent
    runs (the loop, a shell) — a limit this backend cannot enforce here is an error
    (unless ``enforce = "best-effort"``) and a missing ``files.ro/rw`` path too; without
    it (so's own git for a review) those are left out quietly."""
    return RunPolicy(
        limits=enforceable_limits(ctx, cfg, backend) if run else _enforced(cfg, backend),
        files=extra_files(cfg, strict=run),
        network=network_policy(cfg),
        secrets=cfg.secrets,
        backend=backend_settings(ctx, cfg),
    )


def network_policy(cfg: Config) -> NetworkPolicy:
    return NetworkPolicy(mode=cfg.network_mode, allow=cfg.network_allow, deny=cfg.network_deny)


def extra_files(cfg: Config, *, strict: bool = True) -> tuple[Mount, ...]:
    """``files.ro`` / ``files.rw`` as mounts at the same path inside; a missing path is
    an error (a typo must not silently run without the data), or left out (``strict``
    off)."""
    mounts = []
    for key, paths, writable in (
        ("files.ro", cfg.files_ro, False),
        ("files.rw", cfg.files_rw, True),
    ):
        for raw in paths:
            path = Path(raw)
            if not path.exists():
                if not strict:
                    continue
                raise SoError(f"{key}: {path} does not exist; create it or remove it from {key}")
            mounts.append(Mount(path.resolve(), str(path), writable=writable))
    return tuple(mounts)


def limits_of(cfg: Config) -> Limits | None:
    limits = Limits(memory=cfg.memory, cpus=cfg.cpus, pids=cfg.pids, disk=cfg.disk)
    return limits if limits.any() else None


def enforceable_limits(ctx: Context, cfg: Config, backend: Backend) -> Limits | None:
    """The configured limits, after checking that this backend can enforce each of them
    here: fail closed (an error) unless ``enforce = "best-effort"`` downgrades it."""
    limits = limits_of(cfg)
    if limits is None:
        return None
    weak = [e for e in backend.plan_limits(limits).values() if e.mechanism == "none"]
    if weak and cfg.enforce == "strict":
        what = "; ".join(f"limits.{e.limit} ({e.detail})" for e in weak)
        raise SoError(
            f"{what} cannot be enforced on {backend.name} here; use another sandbox "
            '(so doctor shows what each enforces), drop the limit, or set enforce = "best-effort"'
        )
    for e in weak:
        ctx.notice(
            f"warning: limits.{e.limit} is not enforced on {backend.name} here "
            f"({e.detail}); running anyway (enforce = best-effort)"
        )
    return limits


def _enforced(cfg: Config, backend: Backend) -> Limits | None:
    """The configured limits, as far as ``backend`` enforces them (never an error)."""
    limits = limits_of(cfg)
    if limits is None:
        return None
    weak = [e.limit for e in backend.plan_limits(limits).values() if e.mechanism == "none"]
    kept = dataclasses.replace(limits, **{name: None for name in weak if hasattr(limits, name)})
    return kept if kept.any() else None
