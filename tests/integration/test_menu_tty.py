"""The numbered review menu driven through a real pseudo-terminal: diff → reset → merge."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
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


def test_menu_diff_reset_merge(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "proj", {"README.md": "# p\n", "specs/prompt.md": "go\n"})
    script = tmp_path / "agent.sh"
    script.write_text(AGENT)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    out = so("run", "-H", "custom", "--agent-cmd", str(script), "-i", "2", "--yes", cwd=repo)
    assert out.returncode == 5, out.stderr
    [rec] = json.loads(so("list", "--json", cwd=repo).stdout)

    term = Terminal([SO, "menu"], cwd=repo)
    assert rec["id"] in term.expect("sandbox number or id")
    term.send("1")
    term.expect("[d]iff")
    term.send("d")
    assert "+line 2" in term.expect("[d]iff")
    term.send("r")
    term.expect("reset to")
    term.send("iter-1")
    term.expect("[y/N]")
    term.send("y")
    term.expect("[d]iff")
    term.send("m")
    term.expect("[y/N]")
    term.send("y")
    term.expect("merged")
    term.expect("no sandboxes yet")
    assert term.proc.wait(timeout=30) == 0
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
