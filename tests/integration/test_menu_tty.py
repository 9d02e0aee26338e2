"""Terminal flows for real: the review TUI in tmux (diff → reset → merge), and the commands
that talk to a person through a pseudo-terminal (step, plan)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import shlex
import stat
import subprocess
import termios
import time
from pathlib import Path

import pytest

from helpers import SO, git, make_repo, so

pytestmark = pytest.mark.integration

AGENT = """#!/bin/bash
cat > /dev/null
echo "line $SO_ITERATION" >> notes.txt
git add -A && git commit -qm "note $SO_ITERATION"
"""


def _controlling_terminal() -> None:
    """A new session whose controlling terminal is the pty, as in a real terminal: Ctrl-C
    then raises SIGINT in the foreground process group."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.master, slave = pty.openpty()
        env = {**os.environ, "PAGER": "cat", "TERM": "dumb", "NO_COLOR": "1"}
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            preexec_fn=_controlling_terminal,  # noqa: PLW1509 - no threads run in these tests
        )
        os.close(slave)
        self.screen = ""

    def expect(self, text: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while text not in self.screen:
            left = deadline - time.monotonic()
            assert left > 0, f"never saw {text!r}; screen:\n{self.screen[-2000:]}"
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    self.screen += os.read(self.master, 65536).decode(errors="replace")
                except OSError:
                    break
        assert text in self.screen, self.screen[-2000:]
        seen, self.screen = self.screen, self.screen[self.screen.index(text) + len(text) :]
        return seen

    def send(self, line: str) -> None:
        os.write(self.master, (line + "\n").encode())


class Tmux:
    """A full-screen app in a detached tmux session on a private server: keys in, screen out."""

    def __init__(self, tmp: Path, command: list[str], cwd: Path, size: tuple[int, int]) -> None:
        self.socket = tmp / "tmux.sock"
        self.status = tmp / "exit-status"
        shell = f"{shlex.join(command)}; echo $? > {shlex.quote(str(self.status))}"
        width, height = size
        self._tmux("new-session", "-d", "-s", "so", "-x", str(width), "-y", str(height))
        self._tmux("send-keys", "-t", "so", f"cd {shlex.quote(str(cwd))} && {shell}", "Enter")

    def _tmux(self, *args: str) -> str:
        out = subprocess.run(
            ["tmux", "-S", str(self.socket), *args],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, "TERM": "xterm-256color"},
        )
        return out.stdout

    def keys(self, *keys: str) -> None:
        for key in keys:  # one at a time, as a person types: each may open a screen
            self._tmux("send-keys", "-t", "so", key)
            time.sleep(0.2)

    def expect(self, text: str, timeout: float = 30) -> str:
        """Wait until ``text`` is on screen (whitespace-normalised: dialogs wrap lines)."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self._tmux("capture-pane", "-p", "-t", "so")
            if text in " ".join(screen.split()):
                return screen
            assert time.monotonic() < deadline, f"never saw {text!r}; screen:\n{screen}"
            time.sleep(0.2)

    def exit_code(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while not self.status.is_file():
            assert time.monotonic() < deadline, "the app did not exit"
            time.sleep(0.2)
        return int(self.status.read_text())

    def close(self) -> None:
        subprocess.run(["tmux", "-S", str(self.socket), "kill-server"], check=False)


def test_menu_diff_reset_merge(tmp_path: Path, claude_env: dict[str, str]) -> None:
    """The review TUI end to end: a real loop's sandbox (the real claude CLI against the
    scripted model server), then diff → reset → merge by keys in tmux."""
    step = 'echo "line {i}" >> notes.txt && git add -A && git commit -qm "note {i}"'
    prompt = f"Write a note.\n<so-script>{step}</so-script>\n"
    repo = make_repo(tmp_path / "proj", {"README.md": "# p\n", "specs/prompt.md": prompt})
    out = so("run", "-H", "claude", "-i", "2", "--yes", cwd=repo, env=claude_env)
    assert out.returncode == 5, out.stderr
    [rec] = json.loads(so("list", "--json", cwd=repo).stdout)
    sid = rec["id"]

    term = Tmux(tmp_path, [SO, "menu"], cwd=repo, size=(100, 30))
    try:
        term.expect(f"{sid} ■ stopped")
        term.expect("d diff s shell r reset c continue m merge x delete l logs q quit")
        term.keys("d")
        term.expect("+line 2")
        term.expect("2 note 2")  # the timeline: one entry per iteration
        term.keys("Escape")
        term.expect("d diff s shell")
        term.keys("r")
        term.expect("iter-1 note 1")
        term.keys("Down", "Enter")  # iter-2, [iter-1], base, commits…
        term.expect(f"reset {sid} to iter-1?")
        term.keys("y")
        term.expect("reset to iter-1")
        term.keys("m")
        term.expect(f"merge {sid} into")
        term.keys("y")
        term.expect("staged, not committed")
        term.keys("Escape")
        term.expect("no sandboxes yet")
        term.keys("q")
        assert term.exit_code() == 0
    finally:
        term.close()
    assert git(repo, "diff", "--cached").count("+line") == 1  # iteration 2 was reset away
    assert json.loads(so("list", "--json", cwd=repo).stdout) == []


def test_step_asks_between_iterations(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "proj", {"README.md": "# p\n", "specs/prompt.md": "go\n"})
    script = tmp_path / "agent.sh"
    script.write_text(AGENT)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    term = Terminal([SO, "step", "-H", "custom", "--agent-cmd", str(script), "-i", "3"], repo)
    term.expect(
        "iteration 1 done: [c]ontinue, show [d]iff, [e]dit next prompt, "
        "[r]eset this iteration, [s]top?"
    )
    term.send("d")
    assert "+line 1" in term.expect("[s]top?")
    term.send("c")
    term.expect("iteration 2 done")
    term.send("s")
    term.expect("stopped by you")
    term.expect("> ")  # without --yes on a terminal, the run ends in the review menu
    term.send("q")
    assert term.proc.wait(timeout=30) == 0
    [rec] = json.loads(so("list", "--json", cwd=repo).stdout)
    assert rec["iterations"] == 2 and rec["status"] == "stopped"


def test_ctrl_d_at_every_prompt_stops_or_quits(tmp_path: Path) -> None:
    """End of input (Ctrl-D) answers stop at the step prompt and quit in the menu: exit 0,
    never a crash, the sandbox stopped — not failed."""
    repo = make_repo(tmp_path / "proj", {"README.md": "# p\n", "specs/prompt.md": "go\n"})
    script = tmp_path / "agent.sh"
    script.write_text(AGENT)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    term = Terminal([SO, "step", "-H", "custom", "--agent-cmd", str(script), "-i", "3"], repo)
    term.expect("[s]top?")
    os.write(term.master, b"\x04")  # Ctrl-D at the step prompt: stop
    term.expect("stopped by you")
    term.expect("> ")
    os.write(term.master, b"\x04")  # Ctrl-D in the review menu: quit
    assert term.proc.wait(timeout=30) == 0
    assert "unexpected error" not in term.screen
    [rec] = json.loads(so("list", "--json", cwd=repo).stdout)
    assert rec["iterations"] == 1 and rec["status"] == "stopped"
    menu = Terminal([SO, "menu"], repo)
    menu.expect("q to quit")
    os.write(menu.master, b"\x04")
    assert menu.proc.wait(timeout=30) == 0


def test_plan_hands_the_terminal_to_the_agent(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "proj")
    script = tmp_path / "planner.sh"
    script.write_text(
        '#!/bin/bash\necho "planner got: ${SO_PROMPT:0:22}"\nread -r answer\n'
        'echo "answer was $answer"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    term = Terminal([SO, "plan", "-H", "custom", "--agent-cmd", str(script)], repo)
    term.expect("planner got: Interview me to plan")
    term.send("more tests")
    term.expect("answer was more tests")
    assert term.proc.wait(timeout=30) == 0
    assert (repo / "specs" / "implementation-plan.md").is_file()


def test_ctrl_c_in_plan_goes_to_the_agent_and_so_returns(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "proj")
    script = tmp_path / "planner.sh"
    script.write_text(
        "#!/bin/bash\ntrap 'echo agent-got-sigint; exit 0' INT\n"
        "echo planner-ready\nwhile true; do sleep 0.1; done\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    term = Terminal([SO, "plan", "-H", "custom", "--agent-cmd", str(script)], repo)
    term.expect("planner-ready")
    os.write(term.master, b"\x03")
    term.expect("agent-got-sigint")
    assert term.proc.wait(timeout=30) == 0  # so itself was not killed by the Ctrl-C
