"""Flags: settings flags generated from :data:`sono.settings.OPTIONS`, and every flag of a
command accepted before the command too (``so --allow-dirty run`` = ``so run --allow-dirty``).

Each command's own flags are hand-written (``sono.cli.main``) through :class:`CommandFlags`,
which adds them to the command's parser and mirrors them onto the top-level parser. Every
optional's default is ``SUPPRESS`` on both sides — a later position never erases an
earlier one — and :meth:`Flags.finish` fills in the defaults after parsing, once the
command is known, refusing a flag given before a command that does not take it.
"""

from __future__ import annotations

import argparse

from sono.settings import OPTIONS, Option

TYPE_CHECKING = False  # importing typing costs start-up time
if TYPE_CHECKING:
    from typing import Any

GLOBAL_FLAGS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("-v", "--verbose"), "log every command"),
    (("-y", "--yes"), "never prompt (CI, scripts)"),
)


def flags_of(args: argparse.Namespace) -> dict[str, object]:
    """The settings the user passed as flags: config key -> value (a repeated flag's values
    joined with ","). Attributes a caller set by hand (``harness`` on ``so continue``) count."""
    found: dict[str, object] = {}
    for option in OPTIONS:
        value = getattr(args, option.dest, None) if option.flags else None
        if value is not None:
            found[option.key] = ",".join(value) if isinstance(value, list) else value
    return found


def _setting_kwargs(option: Option) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"dest": option.dest, "metavar": option.metavar, "help": option.help}
    if option.repeat:
        kwargs["action"] = "append"
    if option.argtype is not None:
        kwargs["type"] = option.argtype
    return kwargs


class Flags:
    """Which command takes which flag (by argparse dest), with the defaults to fill in."""

    def __init__(self, top: argparse.ArgumentParser) -> None:
        self.top = top
        self.taken: dict[str, dict[str, object]] = {}  # command -> dest -> default
        self.spelling: dict[str, str] = {}  # dest -> the flag as errors name it
        self.dests: dict[str, str] = {}  # option string -> dest, of every command
        self.parsers: dict[str, argparse.ArgumentParser] = {}  # command -> its parser
        for option in OPTIONS:
            if option.flags:
                kwargs = _setting_kwargs(option)
                if option.commands is not None:
                    kwargs["help"] += f" ({', '.join(option.commands)})"
                self._add_top(top, option.flags, kwargs)
        for names, help_text in GLOBAL_FLAGS:
            self._add_top(top, names, {"action": "store_true", "help": help_text})

    def command(self, name: str, parser: argparse.ArgumentParser) -> CommandFlags:
        """The adder for command ``name``'s flags, with the settings and global flags it takes."""
        self.taken[name] = {}
        self.parsers[name] = parser
        flags = CommandFlags(self, name, parser, self.top)
        for option in OPTIONS:
            if option.takes(name):
                flags.add_argument(*option.flags, **_setting_kwargs(option))
        for names, help_text in GLOBAL_FLAGS:
            flags.add_argument(*names, action="store_true", help=help_text)
        return flags

    def _add_top(
        self, top: argparse.ArgumentParser | Any, names: tuple[str, ...], kwargs: dict[str, Any]
    ) -> None:
        if names[0] not in self.dests:
            action = top.add_argument(*names, **{**kwargs, "default": argparse.SUPPRESS})
            self.dests.update(dict.fromkeys(names, action.dest))
            self.spelling[action.dest] = max(names, key=len)

    def finish(self, args: argparse.Namespace, extra: list[str]) -> None:
        """Refuse a flag given to a command that does not take it, before or after it (exit
        2, naming the flag and the commands that do), and any other unknown argument; give
        every flag the command takes its default."""
        command = args.command or "menu"
        parser = self.parsers.get(command, self.top)
        taken = self.taken[command]
        given = sorted(set(vars(args)) - set(taken) - {"command"})
        given += [self.dests[a.split("=")[0]] for a in extra if a.split("=")[0] in self.dests]
        for dest in given:
            takers = [name for name, dests in self.taken.items() if dest in dests]
            parser.error(
                f"{self.spelling[dest]} is not an option of so {command} "
                f"(only of: {', '.join(takers)})"
            )
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        for dest, default in taken.items():
            if not hasattr(args, dest):
                setattr(args, dest, default)


class CommandFlags:
    """``add_argument`` for one command: on its parser, and (optionals) on the top level."""

    def __init__(
        self,
        flags: Flags,
        command: str,
        target: argparse.ArgumentParser | Any,
        top: argparse.ArgumentParser | Any,
    ) -> None:
        self._flags = flags
        self._command = command
        self._target = target
        self._top = top

    def add_argument(self, *names: str, **kwargs: Any) -> None:
        taken = self._flags.taken[self._command]
        if not names[0].startswith("-"):  # a positional: only after the command
            action = self._target.add_argument(*names, **kwargs)
            taken[action.dest] = action.default
            return
        implied = False if kwargs.get("action") == "store_true" else None
        default = kwargs.pop("default", implied)
        action = self._target.add_argument(*names, default=argparse.SUPPRESS, **kwargs)
        taken[action.dest] = default
        self._flags._add_top(self._top, names, {**kwargs, "help": argparse.SUPPRESS})

    def add_mutually_exclusive_group(self) -> CommandFlags:
        return CommandFlags(
            self._flags,
            self._command,
            self._target.add_mutually_exclusive_group(),
            self._top.add_mutually_exclusive_group(),
        )
