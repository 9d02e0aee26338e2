"""RLIMIT_NPROC and RLIMIT_FSIZE set inside a sandbox: a command prefix."""

from __future__ import annotations

import shutil

from sono.limits.model import Limits

NPROC_PER_USERNS = (5, 14)  # RLIMIT_NPROC counted per user namespace (ucounts) from here


def _prlimit() -> str | None:
    return shutil.which("prlimit")


# Fallback when util-linux prlimit is missing: argv[1] nproc, argv[2] fsize ("-" = unset),
# argv[3] "--", then the command, exec'd as is.
_PY_RLIMIT = (
    "import os, resource, sys\n"
    "for res, v in ((resource.RLIMIT_NPROC, sys.argv[1]), (resource.RLIMIT_FSIZE, sys.argv[2])):\n"
    "    if v != '-':\n"
    "        resource.setrlimit(res, (int(v), int(v)))\n"
    "os.execvp(sys.argv[4], sys.argv[4:])\n"
)


def rlimit_prefix(limits: Limits, *, nproc: bool, fsize: int | None) -> list[str]:
    """A command prefix (ending in ``--``) that sets RLIMIT_NPROC to ``limits.pids``
    (when ``nproc``) and RLIMIT_FSIZE to ``fsize`` bytes, soft = hard; ``[]`` when
    neither applies. util-linux ``prlimit`` (absolute host path), else ``python3 -c``.

    Put it *inside* the sandbox (after bwrap's command separator): a user namespace
    records its creator's RLIMIT_NPROC as the ceiling for the user's processes in the
    parent namespace, so applied before bwrap it would count all of the user's processes.
    """
    n = limits.pids if nproc else None
    if n is None and fsize is None:
        return []
    tool = _prlimit()
    if tool is not None:
        argv = [tool]
        if n is not None:
            argv.append(f"--nproc={n}:{n}")
        if fsize is not None:
            argv.append(f"--fsize={fsize}:{fsize}")
        return [*argv, "--"]
    return [
        "python3",
        "-c",
        _PY_RLIMIT,
        "-" if n is None else str(n),
        "-" if fsize is None else str(fsize),
        "--",
    ]


# ---------------------------------------------------------------------------- disk watch


# What DiskWatch charges at least for every entry (file, directory, link, whiteout): an
# empty file allocates no block but takes an inode, and a flood of them would exhaust the
