"""Attacks the way they really happen: a user whose shell environment and home are full of
canary secrets runs the real ``so`` CLI; the agent (the ``custom`` harness) is a hostile
script committed to the project; afterwards the test looks for canaries anywhere the
agent could have left them, and at what the host ran or showed.

Every attack test pairs the attack with a control (the same read or action on something
harmless succeeds), so a blocked attack proves the defence and not a typo.

Use::

    user = HostileUser.make(tmp_path)
    result = user.attack(ATTACK_SCRIPT, backend="bwrap")
    assert not user.leaks(result.everything())
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pty
import secrets
import select
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from helpers import SO, git, make_repo

CANARY_ENV_NAMES = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "OPENAI_API_KEY",
    "CODEX_API_KEY",
    "GEMINI_API_KEY",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "GITLAB_TOKEN",
    "NPM_TOKEN",
    "HF_TOKEN",
    "DATABASE_URL",
    "SSH_AUTH_SOCK",
)
# Files in the host home a real user has, each holding a canary.
CANARY_FILES = {
    ".ssh/id_ed25519": "-----BEGIN OPENSSH PRIVATE KEY-----\n{canary}\n",
    ".ssh/config": "Host *\n  IdentityFile ~/.ssh/id_ed25519 # {canary}\n",
    ".aws/credentials": "[default]\naws_secret_access_key = {canary}\n",
    ".netrc": "machine github.com login u password {canary}\n",
    ".config/gh/hosts.yml": "github.com:\n    oauth_token: {canary}\n",
    ".docker/config.json": '{{"auths": {{"r.example": {{"auth": "{canary}"}}}}}}\n',
    # (not valid base64 on purpose: a malformed config must not break so either)
    ".git-credentials": "https://u:{canary}@github.com\n",
    ".npmrc": "//registry.npmjs.org/:_authToken={canary}\n",
}


def canary(label: str) -> str:
    return f"CANARY{secrets.token_hex(8)}{label.replace('_', '').replace('/', '')[:12]}"


@dataclass(frozen=True)
class Outcome:
    """One `so` command: its output, and what the sandbox left host-side."""

    returncode: int
    stdout: str
    stderr: str
    sandbox_id: str | None
    sandbox_dir: Path | None

    def sandbox_bytes(self) -> str:
        """Every file so keeps for the sandbox (logs, records, upper layer, git dir)."""
        if self.sandbox_dir is None or not self.sandbox_dir.is_dir():
            return ""
        parts = []
        for path in self.sandbox_dir.rglob("*"):
            with contextlib.suppress(OSError):
                if path.is_file() and not path.is_symlink() and path.stat().st_size < 50_000_000:
                    parts.append(path.read_bytes().decode(errors="replace"))
        return "\n".join(parts)

    def everything(self) -> str:
        return "\n".join([self.stdout, self.stderr, self.sandbox_bytes()])


@dataclass
class HostileUser:
    """A user's machine: a home with canary credentials, a shell environment with canary
    tokens, a project whose committed ``attack.sh`` is the agent."""

    root: Path
    home: Path
    so_home: Path
    project: Path
    env: dict[str, str]
    canaries: dict[str, str] = field(default_factory=dict)

    @classmethod
    def make(cls, tmp_path: Path, files: Mapping[str, str] | None = None) -> HostileUser:
        home = Path(os.environ["HOME"])  # conftest's isolated home
        so_home = Path(os.environ["SO_HOME"])
        canaries: dict[str, str] = {}
        for rel, template in CANARY_FILES.items():
            value = canaries.setdefault(f"~/{rel}", canary(rel))
            path = home / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(template.format(canary=value))
            path.chmod(0o600)
        env = {k: v for k, v in os.environ.items() if k not in CANARY_ENV_NAMES}
        for name in CANARY_ENV_NAMES:
            env[name] = canaries.setdefault(f"${name}", canary(name))
        project = make_repo(
            tmp_path / "project",
            {
                "README.md": "# project\n",
                "specs/prompt.md": "Do the next item.\n",
                "specs/implementation-plan.md": "- [ ] one\n- [ ] two\n",
                **(files or {}),
            },
        )
        return cls(tmp_path, home, so_home, project, env, canaries)

    def leaks(self, text: str) -> list[str]:
        """The canaries (by where they live on the host) found in ``text``."""
        return [where for where, value in self.canaries.items() if value in text]

    def commit(self, files: Mapping[str, str], message: str = "host change") -> None:
        for rel, text in files.items():
            path = self.project / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        git(self.project, "add", "-A")
        git(self.project, "commit", "-q", "-m", message)

    def so(
        self,
        *args: str,
        timeout: float = 300,
        stdin: str = "",
        env: Mapping[str, str] | None = None,
    ) -> Outcome:
        """The real `so` CLI in the project, with the user's environment."""
        before = self._ids()
        out = subprocess.run(
            [SO, *args],
            cwd=self.project,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            input=stdin,
            check=False,
        )
        new = sorted(self._ids() - before)
        sid = new[0] if new else (args[1] if len(args) > 1 and args[1] in before else None)
        where = self.so_home / "sandboxes" / sid if sid else None
        return Outcome(out.returncode, out.stdout, out.stderr, sid, where)

    def attack(
        self, script: str, *, backend: str, iterations: int = 1, extra: tuple[str, ...] = ()
    ) -> Outcome:
        """Commit ``script`` as the project's ``attack.sh`` and run it as the agent."""
        self.commit({"attack.sh": script}, "the agent")
        return self.so(
            "run",
            "-s",
            backend,
            "-H",
            "custom",
            "--agent-cmd",
            "bash /workspace/attack.sh",
            "-i",
            str(iterations),
            "--yes",
            "-q",
            *extra,
        )

    def sandbox_id(self) -> str:
        listed = json.loads(self.so("list", "--json").stdout)
        assert listed, "no sandbox was created"
        return str(listed[-1]["id"])

    def _ids(self) -> set[str]:
        root = self.so_home / "sandboxes"
        return {p.name for p in root.iterdir()} if root.is_dir() else set()


@dataclass(frozen=True)
class PtyResult:
    returncode: int
    output: bytes


def run_in_pty(
    argv: list[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    keys: bytes = b"",
    timeout: float = 120,
    size: tuple[int, int] = (24, 80),
) -> PtyResult:
    """Run ``argv`` on a fresh pseudo-terminal as its session leader (a real terminal:
    job control, TIOCSTI target), type ``keys``, and collect everything it prints."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        with contextlib.suppress(Exception):
            import fcntl
            import struct
            import termios

            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", size[0], size[1], 0, 0))
        os.chdir(cwd)
        os.execve(argv[0], argv, dict(env))
    if keys:
        os.write(fd, keys)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if fd in ready:
                try:
                    data = os.read(fd, 65536)
                except OSError as exc:
                    if exc.errno != errno.EIO:
                        raise
                    data = b""  # the child closed the terminal: collect its exit below
                if not data:
                    _, status = os.waitpid(pid, 0)
                    return PtyResult(os.waitstatus_to_exitcode(status), b"".join(chunks))
                chunks.append(data)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                with contextlib.suppress(OSError):
                    while select.select([fd], [], [], 0.2)[0]:
                        data = os.read(fd, 65536)
                        if not data:
                            break
                        chunks.append(data)
                return PtyResult(os.waitstatus_to_exitcode(status), b"".join(chunks))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        return PtyResult(-9, b"".join(chunks))
    finally:
        os.close(fd)


@contextlib.contextmanager
def canary_process_env(user: HostileUser) -> Iterator[None]:
    """The user's canary environment in this process too (for in-process code paths)."""
    saved = dict(os.environ)
    os.environ.update({k: v for k, v in user.env.items() if k.isupper()})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
