"""Shared helpers for the benchmark scripts in ``bench/`` (not a benchmark itself).

Every script: works in a private temp dir (``SO_HOME`` and ``XDG_CONFIG_HOME`` inside it, so
neither the user's sandboxes nor their config are touched), measures its baseline in the same
run, interleaving the cases round-robin so that drift hits all of them alike, reports medians,
and cleans up on success, error, Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType

try:
    import sono  # noqa: F401  (only checks that the package is importable)
except ImportError:  # pragma: no cover - a usage error, not a bug
    sys.exit(
        "bench: the `sono` package is not importable by this interpreter; run the scripts "
        "with the Python where so is installed, e.g. `.venv/bin/python bench/run_all.py`"
    )

IDENT = ("-c", "user.name=bench", "-c", "user.email=bench@example.invalid")
# Environment variables of the user's that would change what `so` does.
_SO_ENV_PREFIXES = ("SO_", "SANDBOX")


def say(message: str) -> None:
    """Progress on stderr; stdout carries only the markdown report."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples)


def timed_ms(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def interleaved(
    cases: Mapping[str, Callable[[], object]],
    runs: int,
    *,
    after: Callable[[str], None] | None = None,
    warmup: int = 0,
) -> dict[str, list[float]]:
    """Run every case ``runs`` times, round-robin with a rotating start (a b c, b c a,
    c a b, …) so that no case always runs first, and return the samples in ms per case.
    ``after(name)`` runs untimed after each sample (cleanup); ``warmup`` untimed rounds
    come first."""
    names = list(cases)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_no in range(warmup + runs):
        shift = round_no % len(names)
        for name in names[shift:] + names[:shift]:
            ms = timed_ms(cases[name])
            if after is not None:
                after(name)
            if round_no >= warmup:
                samples[name].append(ms)
    return samples


def run(
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """A checked subprocess; output is captured (and shown only when it fails)."""
    done = subprocess.run(
        list(argv),
        cwd=cwd,
        env=dict(env) if env is not None else None,
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        detail = (done.stderr or b"").decode(errors="replace").strip()[-2000:]
        raise RuntimeError(f"command failed ({done.returncode}): {' '.join(argv)}\n{detail}")
    return done


def git(repo: Path, *args: str) -> str:
    return run(["git", *IDENT, "-C", str(repo), *args]).stdout.decode().strip()


def write_file(path: Path, data: bytes) -> None:
    """Cheaper than Path.write_bytes for tens of thousands of small files."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def rm_rf(path: Path) -> None:
    """``rm -rf`` (faster than shutil.rmtree on 100k files); never raises."""
    if path.exists() or path.is_symlink():
        subprocess.run(["rm", "-rf", "--", str(path)], check=False)
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def bench_env(name: str) -> Iterator[Path]:
    """A private temp dir for one benchmark: ``SO_HOME``, ``XDG_CONFIG_HOME`` and child
    Pythons' bytecode cache point inside it, the user's git config is ignored; the dir is
    removed at the end whatever happens (SIGTERM behaves like Ctrl-C)."""
    previous_handler = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    saved = dict(os.environ)
    root = Path(tempfile.mkdtemp(prefix=f"so-bench-{name}-")).resolve()
    try:
        for key in list(os.environ):
            if key.startswith(_SO_ENV_PREFIXES):
                del os.environ[key]
        # Child Pythons cache bytecode as an installed `so` does (pip compiles it), but in
        # the temp dir: nothing is written next to the sources, even without
        # PYTHONDONTWRITEBYTECODE.
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
        # The user's git config (signing, hooks, fsmonitor…) must not change the figures.
        os.environ["GIT_CONFIG_GLOBAL"] = os.devnull
        os.environ["GIT_CONFIG_NOSYSTEM"] = "1"
        os.environ["SO_HOME"] = str(root / "so-home")
        os.environ["XDG_CONFIG_HOME"] = str(root / "config")
        (root / "config").mkdir()
        yield root
    finally:
        os.environ.clear()
        os.environ.update(saved)
        rm_rf(root)
        signal.signal(signal.SIGTERM, previous_handler)


def main_guard(body: Callable[[], None]) -> None:
    """Run a benchmark's ``main``; Ctrl-C exits 130 after its cleanup has run."""
    try:
        body()
    except KeyboardInterrupt:
        say("interrupted; everything the benchmark created has been removed")
        sys.exit(130)


def table(
    header: Sequence[str], rows: Sequence[Sequence[str]], *, right: Sequence[int] = ()
) -> str:
    """A markdown table; columns listed in ``right`` are right-aligned."""
    align = ["---:" if i in right else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def ratio(value: float, baseline: float) -> str:
    return f"{value / baseline:.2f}×" if baseline > 0 else "n/a"


def verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def so_command() -> list[str]:
    """The `so` console script of this interpreter (same venv), or an equivalent."""
    script = Path(sys.executable).parent / "so"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-c", "from sono.cli.main import entry; entry()"]
