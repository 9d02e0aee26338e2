"""so demo: a full loop offline — throwaway repo, scripted model, 3 iterations, diff, merge.

The "model" is the scripted server shipped in ``sono.testing``; the agent is the real
``claude`` CLI when it is available (installed via npm when node is present), otherwise
a tiny built-in agent through the ``custom`` harness. Nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import cast

from sono import agents, proc
from sono.app.agent import resolve_agent
from sono.app.policy import backend_for, policy_for
from sono.app.runs import network
from sono.backends.base import Mount
from sono.commands import _common as c
from sono.errors import SoError
from sono.events import Event, Usage
from sono.harnesses import get_harness
from sono.harnesses.base import EventParser, Harness
from sono.loop import Loop, LoopOptions, LoopResult
from sono.review import diff_text, merge
from sono.sandbox import Sandbox, create_sandbox
from sono.state import agents_dir
from sono.testing.model_server import ModelServer
from sono.ui.reporter import PlainReporter
from sono.workspace import inspect_host

# The name the scripted model goes by: no price table (the agent's, so's gateway's) knows it.
OFFLINE_MODEL = "so-scripted"
TESTING_DIR = Path(__file__).resolve().parent.parent / "testing"
MINI_AGENT_DEST = "/run/so/testing"

PROMPT = """You are building a tiny Python greeter, one plan item per iteration.
Read specs/implementation-plan.md, do the first unchecked item, tick it, and commit.
When no item is left unchecked, write `Status: done` in specs/status.md.

<so-script>
bash specs/steps.sh {i}
</so-script>
"""

PLAN = """# Implementation plan

## Pending
- [ ] Add greet() in greet.py
- [ ] Add a test for greet()
- [ ] Document usage in README.md
"""

PLAN_ITEMS = PLAN.count("- [ ]")

STEPS = r"""#!/usr/bin/env bash
# What the scripted model asks the agent to run: one plan item per iteration.
set -euo pipefail
case "$1" in
  1) printf 'def greet(name: str) -> str:\n    return f"Hello, {name}!"\n' > greet.py
     msg="greet: add greet()" ;;
  2) printf 'from greet import greet\n\n\ndef test_greet() -> None:\n' > test_greet.py
     printf '    assert greet("so") == "Hello, so!"\n' >> test_greet.py
     msg="greet: test greet()" ;;
  *) printf '\n## Usage\n\n    python3 -c "from greet import greet; print(greet(%s))"\n' "'you'" \
       >> README.md
     msg="docs: usage" ;;
esac
sed -i '0,/- \[ \]/s//- [x]/' specs/implementation-plan.md
if ! grep -q -- '- \[ \]' specs/implementation-plan.md; then
  echo "Status: done" > specs/status.md
fi
git add -A
git commit -q -m "$msg" -m "What: plan item $1. Why: the demo plan asks for it."
"""


def make_repo(parent: Path) -> Path:
    repo = parent / "greeter"
    (repo / "specs").mkdir(parents=True)
    (repo / "README.md").write_text("# greeter\n\nA demo project for `so`.\n")
    (repo / "specs" / "prompt.md").write_text(PROMPT)
    (repo / "specs" / "implementation-plan.md").write_text(PLAN)
    (repo / "specs" / "status.md").write_text("Status: pending\n")
    (repo / "specs" / "steps.sh").write_text(STEPS)
    (repo / ".env").write_text("DEMO_SECRET=never-enters-the-sandbox\n")
    (repo / ".gitignore").write_text(".env\n")
    ident = ["-c", "user.name=so demo", "-c", "user.email=demo@so.invalid"]
    proc.run(["git", "init", "-q", "-b", "main", str(repo)])
    proc.run(["git", "-C", str(repo), "add", "-A"])
    proc.run(["git", *ident, "-C", str(repo), "commit", "-q", "-m", "greeter: initial spec"])
    return repo


def choose_agent(wanted: str) -> str:
    if wanted != "auto":
        return wanted
    claude = get_harness("claude")
    target = agents_dir(c.environ())
    if agents.locate("claude", claude.npm, target) is not None:
        return "claude"
    if claude.npm is not None and shutil.which("npm"):
        print(
            f"so demo: installing {claude.npm.name}@{claude.npm.version} via npm …", file=sys.stderr
        )
        try:
            agents.install("claude", claude.npm, target)
            return "claude"
        except SoError as exc:
            print(
                f"so demo: could not install claude ({exc}); using the built-in agent",
                file=sys.stderr,
            )
    return "builtin"


def run(args: argparse.Namespace) -> int:
    which = choose_agent(args.agent)
    parent = Path(tempfile.mkdtemp(prefix="so-demo-"))
    repo = make_repo(parent)
    fake_home = parent / "home"  # the demo never copies your real credentials
    fake_home.mkdir()
    flags = argparse.Namespace(
        **{
            **vars(args),
            # -i and -s are the user's to choose; the plan has three items.
            "iterations": getattr(args, "iterations", None) or PLAN_ITEMS,
            "sandbox": getattr(args, "sandbox", None) or "bwrap",
            "harness": "claude" if which == "claude" else "custom",
            "model": OFFLINE_MODEL,
        }
    )
    extra: tuple[Mount, ...] = ()
    if which == "builtin":
        python = Path(sys.executable).resolve()
        flags.agent_cmd = f"{python} {MINI_AGENT_DEST}/mini_agent.py"
        extra = (Mount(TESTING_DIR, MINI_AGENT_DEST),)
    ctx = c.context(flags)
    cfg = ctx.config(repo)
    agent = resolve_agent(ctx, cfg, extra_mounts=extra)
    backend = backend_for(ctx, cfg).backend
    if which == "builtin" and backend.name != "bwrap":
        raise SoError(
            f"the built-in demo agent runs on this host's Python, which a {backend.name} "
            "sandbox cannot run; use -s bwrap, or --agent claude for this backend"
        )
    host = inspect_host(repo)
    sandbox = create_sandbox(
        store=ctx.store,
        host=host,
        harness=agent.harness.name,
        backend_name=backend.name,
        backend=backend,
        exclude=cfg.exclude,
        allow_dirty=False,
        model=None,
        effort=None,
        mounts=agent.mounts,
        policy=policy_for(ctx, cfg, backend),
    )
    label = "the real claude CLI" if which == "claude" else "the built-in scripted agent"
    with ModelServer() as server:
        print(
            f"so demo: repo {repo}\nso demo: agent = {label} ({agent.description})\n"
            f"so demo: model = scripted server at {server.url} (offline: costs nothing)\n"
            f"so demo: sandbox {sandbox.record.id} ({backend.name})",
            file=sys.stderr,
        )
        model_env = {"ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "sk-so-demo-key"}
        with network(sandbox, agent, model_env, fake_home) as netted:
            env = {
                **netted.env,
                **{k: v for k, v in netted.host_env.items() if k.startswith("ANTHROPIC_")},
                # claude's background requests by this name too, never a priced one
                "ANTHROPIC_SMALL_FAST_MODEL": OFFLINE_MODEL,
                "ANTHROPIC_DEFAULT_HAIKU_MODEL": OFFLINE_MODEL,
                "DISABLE_AUTOUPDATER": "1",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            }
            opts = LoopOptions(iterations=cfg.iterations, timeout_s=300, no_progress_limit=2)
            loop = Loop(
                sandbox,
                harness=unpriced(netted.agent.harness),
                agent=netted.agent.options,
                opts=opts,
                reporter=PlainReporter(),
                env=env,
                host_home=fake_home,
                net=netted.session,
                access=netted.access,
            )
            result = loop.run()
    return report(sandbox, result, repo, label)


def unpriced(harness: Harness) -> Harness:
    # A stand-in with every attribute of the harness's (its ClassVars read through
    # __getattr__, which a Protocol check does not follow).
    return cast("Harness", Unpriced(harness))


class Unpriced:
    """A harness whose usage reports carry no dollar figure: an agent prices tokens by the
    model's list price (claude does, whatever the endpoint), but the demo's model is a
    local scripted server that costs nothing. Everything else is the harness's own."""

    def __init__(self, harness: Harness) -> None:
        self._harness = harness

    def __getattr__(self, name: str) -> object:
        return getattr(self._harness, name)

    def parser(self) -> EventParser:
        return UnpricedParser(self._harness.parser())


class UnpricedParser:
    def __init__(self, parser: EventParser) -> None:
        self._parser = parser

    def feed(self, line: str) -> list[Event]:
        return [
            dataclasses.replace(e, cost_usd=None) if isinstance(e, Usage) else e
            for e in self._parser.feed(line)
        ]


def report(sandbox: Sandbox, result: LoopResult, repo: Path, label: str) -> int:
    print(f"\nso demo: loop ended: {result.outcome} ({result.message})")
    for rec in result.iterations:
        print(f"\n=== iteration {rec.n}: {len(rec.commits)} commit(s) ===")
        print(
            diff_text(
                sandbox,
                iteration=rec.n,
                stat=False,
                color=sys.stdout.isatty() and not os.environ.get("NO_COLOR"),
            )
        )
    if result.outcome != "done":
        sid = sandbox.record.id
        print(
            f"so demo: the loop ended before the plan was done ({len(result.iterations)} of "
            f"{PLAN_ITEMS} items; {result.outcome}); its work stays in sandbox {sid}: "
            f"so diff {sid}, so rm {sid}"
        )
        return result.exit_code
    merged = merge(sandbox, commit=False, keep=False)
    status = proc.run(["git", "-C", str(repo), "status", "--short"]).stdout
    print(
        f"so demo: merged {merged.commits} commit(s) into {repo} (branch main), staged:\n"
        f"{status}\nso demo: done — agent used: {label}. "
        f"Look around: cd {repo} && git diff --cached"
    )
    return 0
