"""Entry point: parse, freeze options, dispatch to ``sono.commands.<name>``, handle errors.

Every flag is accepted before or after the subcommand (``so -i 3 run`` and
``so run -i 3`` both work, as in the seed; ``so --allow-dirty run`` too): see
:mod:`sono.cli.flags`. Settings flags are generated from :mod:`sono.settings`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence

from sono import __version__
from sono.errors import SoError

TYPE_CHECKING = False  # importing typing costs start-up time (`so list`)
if TYPE_CHECKING:
    import argparse
    from typing import TextIO

    from sono.cli.flags import CommandFlags, Flags

EPILOG = """examples:
  so plan                      write specs/ templates, then plan with the agent
  so run -i 5                  run the loop for up to 5 iterations in a sandbox
  so run -H custom --agent-cmd 'my-agent --flag' --yes
  so list                      review sandboxes; so diff ID; so merge ID
  so demo                      a full offline loop on a throwaway repo
"""

# name → (help, examples)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": (
        "run the agent loop in a new sandbox",
        "so run\n  so run -H claude -i 5 --yes\n  so run --allow-dirty -s bwrap",
    ),
    "step": ("run with a human in the loop between iterations", "so step -i 3"),
    "plan": (
        "write specs/ templates and plan interactively with the agent",
        "so plan\n  so plan --no-agent",
    ),
    "clean": ("loop: fix one code smell per iteration", "so clean -i 3"),
    "dup": ("loop: remove one duplicate (jscpd report) per iteration", "so dup -i 3"),
    "learn": ("interactive teaching session on this repository", "so learn"),
    "menu": ("review menu (default when no command is given)", "so menu"),
    "list": ("list sandboxes", "so list\n  so list --json"),
    "diff": (
        "show a sandbox's changes (whole run or one iteration)",
        "so diff ID\n  so diff ID --iter 2\n  so diff ID --stat",
    ),
    "shell": (
        "open a shell inside the sandbox (same policy as the agent)",
        "so shell ID\n  so shell ID -- git log --oneline",
    ),
    "reset": (
        "reset the sandbox to a commit or iteration",
        "so reset ID iter-2\n  so reset ID base\n  so reset ID 1a2b3c4",
    ),
    "continue": ("run more iterations in an existing sandbox", "so continue ID -i 3"),
    "merge": (
        "squash-merge a sandbox into the host's current branch",
        "so merge ID\n  so merge ID --commit --yes",
    ),
    "rm": ("remove sandboxes", "so rm ID\n  so rm --all --yes\n  so rm --older-than 7d"),
    "doctor": ("check this host: bwrap, git, agent CLIs, credentials", "so doctor"),
    "config": ("show each setting and where it came from", "so config\n  so config --json"),
    "trust": (
        "trust this exact content of the project's .so/config.toml (its keys that run on "
        "your host or widen the sandbox policy apply only then)",
        "so trust --show      # what the file sets that needs trust, and its status\n"
        "  so trust             # after reviewing .so/config.toml\n  so trust --revoke",
    ),
    "demo": ("run a full loop offline on a throwaway repo", "so demo\n  so demo --agent builtin"),
    "agents": (
        "install or list agent CLIs at pinned versions",
        "so agents install claude\n  so agents list",
    ),
    "image": (
        "the Docker runner image: build, list, rm; bootstrap an offline base image",
        "so image bootstrap      # offline base from debootstrap (docker import)\n"
        "  so image build\n  so image list\n  so image rm so-runner:1a2b3c4d5e6f7a8b",
    ),
    "volume": (
        "the agent's persistent home per project: list, reset (used by -s microvm; "
        "bwrap and Docker do not use volumes yet)",
        "so volume list\n  so volume list --json\n  so volume reset NAME --yes",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    return _build()[0]


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """argv -> the namespace: every flag before or after the command, defaults filled in."""
    parser, flags = _build()
    args, extra = parser.parse_known_args(argv)
    flags.finish(args, extra)
    return args


def _build() -> tuple[argparse.ArgumentParser, Flags]:
    import argparse  # here, not at the top: `so list` answers without it
    import shutil

    from sono.cli.flags import Flags

    width = shutil.get_terminal_size().columns - 2

    class Formatter(argparse.RawDescriptionHelpFormatter):
        # argparse makes a formatter for every add_argument, and each asks the terminal
        # for its size: ask once (start-up time).
        def __init__(self, prog: str) -> None:
            super().__init__(prog, width=width)

    parser = argparse.ArgumentParser(
        prog="so",
        description="so: run coding agents in sandboxes, loop them over a spec, "
        "review and merge their work. Every flag works before or after the command.",
        epilog=EPILOG,
        formatter_class=Formatter,
    )
    parser.add_argument("--version", action="version", version=f"so {__version__}")
    flags = Flags(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, examples) in COMMANDS.items():
        p = sub.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=f"examples:\n  {examples}",
            formatter_class=Formatter,
        )
        _command_flags(name, flags.command(name, p))
    return parser, flags


def _command_flags(name: str, p: CommandFlags) -> None:
    """Each command's own flags (settings flags come from sono.settings)."""
    import argparse

    if name in ("run", "step", "clean", "dup"):
        p.add_argument(
            "--allow-dirty",
            action="store_true",
            help="snapshot uncommitted host changes into the sandbox's base commit",
        )
    if name in ("run", "step", "clean", "dup", "continue"):
        p.add_argument(
            "--json", action="store_true", help="normalized events and the summary as JSON lines"
        )
        p.add_argument("-q", "--quiet", action="store_true", help="only per-iteration summaries")
    if name in ("list", "config"):
        p.add_argument("--json", action="store_true", help="machine-readable output")
    if name in ("diff", "shell", "reset", "continue", "merge"):
        p.add_argument("id", help="sandbox id (or a unique prefix)")
    if name == "diff":
        p.add_argument("--iter", type=int, help="only the changes of iteration N")
        p.add_argument("--stat", action="store_true", help="diffstat only")
    if name == "shell":
        p.add_argument(
            "cmd", nargs=argparse.REMAINDER, help="command to run instead of a shell (after --)"
        )
    if name == "reset":
        p.add_argument("rev", help="iter-N, base, or a commit")
    if name == "merge":
        p.add_argument(
            "--commit",
            action="store_true",
            help="commit the squashed change (default: staged only)",
        )
        p.add_argument("--keep", action="store_true", help="keep the sandbox after merging")
    _more_flags(name, p)


def _more_flags(name: str, p: CommandFlags) -> None:
    if name == "rm":
        p.add_argument("ids", nargs="*", help="sandbox ids")
        p.add_argument("--all", action="store_true", help="remove every sandbox")
        p.add_argument("--older-than", help="remove sandboxes older than e.g. 7d, 12h")
    if name == "plan":
        p.add_argument("--no-agent", action="store_true", help="only write the templates")
    if name == "demo":
        p.add_argument(
            "--agent",
            choices=("auto", "claude", "builtin"),
            default="auto",
            help="claude CLI (installed via npm if needed) or the built-in scripted agent",
        )
    if name == "image":
        p.add_argument("action", choices=("build", "list", "rm", "bootstrap"))
        p.add_argument("ref", nargs="*", help="images to remove (rm)")
        p.add_argument("--suite", default="bookworm", help="Debian suite for bootstrap")
        p.add_argument("--mirror", help="Debian mirror for bootstrap (default: debootstrap's)")
        p.add_argument("--json", action="store_true", help="machine-readable list")
    if name == "volume":
        p.add_argument("action", choices=("list", "reset"))
        p.add_argument("name", nargs="?", help="volume id or a unique prefix (reset)")
        p.add_argument("--json", action="store_true", help="machine-readable list")
    if name == "trust":
        what = p.add_mutually_exclusive_group()
        what.add_argument("--show", action="store_true", help="status and the keys needing trust")
        what.add_argument("--revoke", action="store_true", help="forget the trusted content")
    if name == "agents":
        p.add_argument("action", choices=("install", "list"))
        p.add_argument("names", nargs="*", help="claude, jscpd")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if getattr(args, "verbose", False):
        import logging  # lazy: start-up time matters for `so list`

        logging.basicConfig(level=logging.DEBUG, format="so: %(message)s")
        for noisy in ("docker", "urllib3", "asyncio"):  # so's own commands, not a client's
            logging.getLogger(noisy).setLevel(logging.WARNING)
    command = args.command or "menu"
    import importlib

    module = importlib.import_module(f"sono.commands.{command}")
    try:
        code: int = module.run(args)
    except SoError as exc:
        if getattr(args, "json", False):  # the JSON reader gets the error as JSON too
            import json

            print(json.dumps({"kind": "error", "message": str(exc), "exit_code": exc.exit_code}))
        return _error(exc)
    except KeyboardInterrupt:
        print("so: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `so doctor | head`: the reader has all it wanted
        return _pipe_closed()
    except OSError as exc:  # the machine said no: a path, a permission, a full disk
        where = f"{exc.filename}: " if exc.filename else ""
        what = exc.strerror or str(exc)
        return _error(SoError(f"{where}{what} (check SO_HOME and the paths in your config)"))
    except Exception:
        import tempfile
        import traceback
        from pathlib import Path

        log = Path(tempfile.gettempdir()) / f"so-crash-{os.getpid()}.log"
        log.write_text(traceback.format_exc())
        from sono.textsafe import one_line

        crash = one_line(repr(sys.exc_info()[1]), 400)
        print(f"so: unexpected error ({crash}); traceback in {log}", file=sys.stderr)
        return 3
    return code


FAST = {("list",): False, ("list", "--json"): True}  # argv → --json, answered without argparse


class ReaderMayLeave:
    """stdout or stderr whose reader may go away (`so run --json | head -1`): from then on
    its writes go nowhere instead of raising — a loop is never stopped, nor its exit code
    changed, by a closed pipe of its own output."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._left()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._left()

    def _left(self) -> None:
        self.gone = True
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


def entry() -> None:
    sys.stdout = ReaderMayLeave(sys.stdout)
    sys.stderr = ReaderMayLeave(sys.stderr)
    try:
        code = _dispatch()
        sys.stdout.flush()  # a closed pipe shows here, not as a warning at exit
    except BrokenPipeError:  # `so config | head -1`, `so --help | head`
        code = _pipe_closed()
    sys.exit(code)


def _error(exc: SoError) -> int:
    from sono.textsafe import for_terminal  # an error may quote the sandbox's output

    print(f"so: error: {for_terminal(str(exc))}", file=sys.stderr)
    return exc.exit_code


def _dispatch() -> int:
    as_json = FAST.get(tuple(sys.argv[1:]))
    if as_json is None:
        return main()
    from sono.commands.list import check_config, config_files, fast

    if config_files(os.environ):  # rare: only then is the TOML read (a broken file fails)
        try:
            check_config()
        except SoError as exc:
            return _error(exc)
    return fast(as_json)


def _pipe_closed() -> int:
    """Quiet exit 0 when stdout's reader went away: later writes (and the flush at exit)
    go to /dev/null instead of raising again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
