"""so doctor: what works on this host, what does not, and the exact fix."""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from sono import agents, proc
from sono.app.context import Context
from sono.app.policy import backend_choice, backend_settings, limits_of
from sono.backends import BACKENDS, get_backend
from sono.backends.base import Backend
from sono.commands import _common as c
from sono.config import Config, ProjectFile, load_config
from sono.errors import ConfigError, SoError
from sono.harnesses import HARNESSES, available, harness_class
from sono.harnesses.base import AgentOptions
from sono.limits import MECHANISM_LABELS, Limits, format_size
from sono.state import agents_dir, so_home
from sono.textsafe import one_line


def line(ok: bool | None, what: str, detail: str) -> str:
    mark = {True: "ok  ", False: "FAIL", None: "--  "}[ok]
    return f"[{mark}] {what}: {detail}"


def run(args: argparse.Namespace) -> int:
    ctx, project = c.context(args), _project()
    out = [line(True, "so home", str(so_home(c.environ())))]
    config_ok = True
    try:
        cfg = ctx.config(project)
    except ConfigError as exc:  # the doctor reports it, on the built-in defaults
        out.append(line(False, "config", f"{exc} — below: the built-in defaults"))
        cfg = load_config(project=None, env={}, home=Path("/nonexistent"), flags={})
        config_ok = False
    out.append(_limits_set(cfg))
    settings = backend_settings(ctx, cfg)
    selected, why = backend_choice(ctx, cfg, project)
    selected_ok = False
    for name in BACKENDS:
        backend = get_backend(name, settings)
        health = backend.health()
        detail = health.detail + (f" — fix: {health.fix}" if health.fix else "")
        out.append(line(health.ok, f"backend {name}", detail))
        selected_ok = selected_ok or (name == selected and health.ok)
        if health.ok:
            out.append(_workspace(name, backend, cfg.workspace))
            out += _limits(name, backend, cfg)
    out.append(line(selected_ok, "selected sandbox", f"{selected} ({why})"))
    out.append(line(True, "network", _network(cfg)))
    if cfg.project_file is not None:
        out.append(_project_config(cfg.project_file))
    git = shutil.which("git")
    out.append(
        line(
            git is not None,
            "git",
            proc.run([git, "--version"]).stdout.strip() if git else "not found",
        )
    )
    out += _agents()
    models, models_ok = _models(ctx, cfg.harness)
    out += models
    print("\n".join(out))
    return 0 if selected_ok and git and config_ok and models_ok else 1


def _workspace(name: str, backend: Backend, wanted: str) -> str:
    """Can sandboxes on ``name`` be copy-on-write for this project (or a plain repo)?"""
    home = so_home(c.environ())
    project = _project()
    with tempfile.TemporaryDirectory(dir=_mkdir(home), prefix=".doctor-") as tmp:
        probe = project or Path(tmp)
        (probe / ".git").mkdir(exist_ok=True)
        obstacle = backend.overlay_obstacle(probe, home)
        if obstacle and project is None:  # judged on a stand-in repo owned by you
            obstacle = obstacle.replace(str(probe), "a project of yours")
    what = f"workspace on {name}"
    if wanted == "copy":
        return line(None, what, "copy (workspace = copy in config)")
    if obstacle is None:
        return line(True, what, "copy-on-write overlay (creation is O(1) in repo size)")
    if wanted == "overlay":
        return line(False, what, f"workspace = overlay cannot work here: {obstacle}")
    return line(None, what, f"falls back to a full copy: {obstacle}")


def _project_config(pf: ProjectFile) -> str:
    if pf.trusted:
        return line(True, "project config", f"{pf.path}: trusted (so trust), all its keys apply")
    return line(
        None,
        "project config",
        f"{pf.path}: untrusted, sets only keys safe in a project file; "
        "keys that run on your host or widen the policy need `so trust`",
    )


def _network(cfg: Config) -> str:
    allow = ", ".join(cfg.network_allow) or "nothing"
    mode = {
        "allowlist": f"allowlist: the model gateway + {allow}",
        "none": "none: the model gateway only",
        "open": "open: anything but private ranges, metadata and the deny list",
    }[cfg.network_mode]
    return (
        f"{mode}. Sandboxes have no network interface but loopback; so's proxy and model "
        "gateway (host side, over a Unix socket) are the way out, on every backend; API keys "
        "stay on the host"
    )


LIMITS = ("memory", "cpus", "pids", "disk")
# Only to ask a backend which limits it can enforce; never shown as a value.
PROBE = Limits(memory=1 << 30, cpus=1, pids=64, disk=1 << 30)


def _limits_set(cfg: Config) -> str:
    """The limits this config sets (and where from), or that it sets none."""
    limits = limits_of(cfg)
    if limits is None:
        return line(
            None,
            "limits set",
            "none (a sandbox may use what the host has; set --memory/--cpus/--pids or "
            "limits.memory/cpus/pids/disk in config)",
        )
    shown = ", ".join(
        f"{key} {_shown(key, value)} ({cfg.sources[f'limits.{key}'].source})"
        for key in LIMITS
        if (value := getattr(limits, key)) is not None
    )
    return line(True, "limits set", shown)


def _shown(key: str, value: float) -> str:
    return format_size(int(value)) if key in ("memory", "disk") else f"{value:g}"


def _limits(name: str, backend: Backend, cfg: Config) -> list[str]:
    """Per limit: the value set and how this backend enforces it, or "none set" and
    whether this backend could enforce it."""
    limits = limits_of(cfg)
    planned = backend.plan_limits(limits) if limits is not None else {}
    able = backend.plan_limits(PROBE)
    out = []
    for key in LIMITS:
        what = f"limit {key} on {name}"
        if key in planned:
            e = planned[key]
            if e.mechanism == "none":
                out.append(line(False, what, f"{e.value} set, but not enforceable ({e.detail})"))
            else:
                label = MECHANISM_LABELS[e.mechanism]
                out.append(line(True, what, f"{e.value} set, enforced by {label} ({e.detail})"))
        elif key in able and able[key].mechanism != "none":
            label = MECHANISM_LABELS[able[key].mechanism]
            out.append(line(True, what, f"none set; {name} can enforce one ({label})"))
        else:
            why = f" ({able[key].detail})" if key in able else ""
            out.append(line(None, what, f"none set; {name} cannot enforce one here{why}"))
    return out


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _project() -> Path | None:
    try:
        from sono.workspace import inspect_host

        return inspect_host(Path.cwd()).root
    except SoError:
        return None


def _agents() -> list[str]:
    out = []
    for name in HARNESSES:
        if name not in available():
            out.append(line(None, f"harness {name}", "not supported yet"))
            continue
        cls = harness_class(name)
        harness = cls()
        exe = harness.executable_name(AgentOptions(agent_cmd="true"))
        if cls.npm is None or exe is None:
            out.append(line(None, f"harness {name}", "uses --agent-cmd"))
            continue
        found = agents.locate(exe, cls.npm, agents_dir(c.environ()))
        if found is None:
            out.append(
                line(False, f"harness {name}", f"{exe} not found — fix: so agents install {name}")
            )
        else:
            out.append(
                line(
                    True,
                    f"harness {name}",
                    f"{agents.version(found.path)} ({found.path}, {found.source})",
                )
            )
    out.append(
        line(
            shutil.which("npm") is not None,
            "npm",
            "present (so agents install works)"
            if shutil.which("npm")
            else "not found: install Node.js to let so install agent CLIs",
        )
    )
    return out


def _models(ctx: Context, selected: str) -> tuple[list[str], bool]:
    """Per harness, what its own configuration on this host makes it use: each model
    endpoint (served inside through the gateway) and the kind of credential, each with
    where it was configured — never a value; False when the selected harness's setup
    cannot run."""
    out = []
    ok = True
    for name in available():
        harness = harness_class(name)()
        what = f"{name} model" + (" (selected)" if name == selected else "")
        try:
            access = harness.access(ctx.env, ctx.home)
        except (SoError, OSError, ValueError) as exc:
            # A harness you do not use is no failure of this setup: shown, not failed.
            failed = False if name == selected else None
            out.append(
                line(failed, what, f"its configuration cannot be read: {one_line(str(exc))}")
            )
            ok = ok and name != selected
            continue
        if access.refusal:
            out.append(
                line(False if name == selected else None, what, one_line(access.refusal, 500))
            )
            ok = ok and name != selected
        for up in access.upstreams:
            cred = up.credential
            detail = (
                f"{up.shown_url} (from {up.source}) as /{up.name}; credential: {cred.kind}"
                + ("" if cred.source == "none configured" else f" (from {cred.source})")
                + (f"; +{len(up.headers)} header(s)" if up.headers else "")
            )
            out.append(line(True if cred.kind != "none" else None, what, detail))
        out += [line(None, what, one_line(note, 500)) for note in access.notes]
    return out, ok
