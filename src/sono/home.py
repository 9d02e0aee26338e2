"""Where so keeps its state, and whether a runner is alive: stdlib ``os`` only, so that
``so list`` can answer without importing the rest of so (start-up time)."""

from __future__ import annotations

import os
from collections.abc import Mapping

TYPE_CHECKING = False  # importing typing costs `so list` ~5 ms
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any


def home_dir(env: Mapping[str, str] | None = None) -> str:
    """``$SO_HOME``, else the platform's state dir (``~/.local/state/so`` on Linux)."""
    env = os.environ if env is None else env
    if env.get("SO_HOME"):
        return os.path.realpath(os.path.expanduser(env["SO_HOME"]))  # noqa: PTH111 - start-up
    import platformdirs  # lazy: a module of its own, only when SO_HOME is unset

    return str(platformdirs.user_state_dir("so"))


def private_dir(path: str) -> None:
    """``path`` (and missing parents) as a directory only its owner can enter: created 0700,
    and an existing one of ours that others could enter or list is tightened to 0700.
    Sandbox state — the model gateway's socket, upper layers, logs — sits below."""
    os.makedirs(path, mode=0o700, exist_ok=True)  # noqa: PTH103 - start-up
    st = os.lstat(path)
    if st.st_mode & 0o077 and st.st_uid == os.getuid():
        os.chmod(path, 0o700)  # noqa: PTH101 - start-up


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_json_atomic(path: Path, data: Any) -> None:
    """Write to a temp file in the same directory, fsync, then ``os.replace``."""
    import contextlib  # lazy: start-up time
    import json
    import tempfile
    from pathlib import Path

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        Path(tmp).replace(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            Path(tmp).unlink()
        raise
