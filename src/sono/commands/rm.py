"""so rm ID… | --all | --older-than 7d: remove sandboxes (workspace, records, backend state)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

from sono.commands import _common as c
from sono.config import parse_duration
from sono.errors import SoError
from sono.sandbox import open_sandbox, remove_sandbox
from sono.state import SandboxRecord


def select(args: argparse.Namespace, records: list[SandboxRecord]) -> list[SandboxRecord]:
    if args.ids:
        store = c.store()
        return [store.resolve(i) for i in args.ids]
    if args.older_than:
        try:
            cutoff = datetime.now(UTC) - timedelta(seconds=parse_duration(args.older_than))
        except ValueError:
            raise SoError(f"--older-than {args.older_than!r}: use e.g. 7d, 12h, 30m") from None
        return [r for r in records if datetime.fromisoformat(r.created) < cutoff]
    if args.all:
        return records
    raise SoError("name the sandboxes to remove (so rm ID), or use --all / --older-than 7d")


def run(args: argparse.Namespace) -> int:
    store = c.store()
    chosen = select(args, store.all())
    if not chosen:
        print("so: nothing to remove")
        return 0
    running = [r.id for r in chosen if r.live_status() == "running"]
    if running:
        raise SoError(f"sandbox {', '.join(running)} is running; stop it first (Ctrl-C)")
    if (args.all or args.older_than) and not c.confirm(args, f"remove {len(chosen)} sandbox(es)?"):
        return 1
    for rec in chosen:
        remove_sandbox(open_sandbox(store, rec.id))  # removal runs nothing inside
        print(f"so: removed {rec.id}")
    return 0
