"""What of the host project the sandbox can read: never a hidden file (``exclude`` /
``files.hide``) the user creates after the sandbox exists — between runs or during one —
and never a git object its base commit does not reach (a dangling blob, a stash, another
branch, a once-added ``.env``), whatever git or filesystem trick the agent uses.

Controls: files that existed at creation (an untracked note, an ignored dependency) and
the base's whole history (``git log -p``) are readable inside; files the user adds later,
tracked or not, stay out as before; a tracked file edited in place is restored.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from hostile import HostileUser, Outcome, canary

from helpers import git

pytestmark = pytest.mark.integration

# Everything the agent can think of, written to loot.txt (upper layer: read host-side)
# and to its output. $1 is the round.
ATTACK = r"""
exec > "loot-$ROUND.txt" 2>&1
echo "== round $ROUND"
cat .env .env.local deploy.pem sub/.env node_modules/*.js 2>/dev/null
ls -la . sub 2>/dev/null
find / \( -path /proc -o -path /sys \) -prune -o \( -name '.env*' -o -name '*.pem' \) -print \
  2>/dev/null \
  | while read -r f; do echo "found $f"; cat "$f"; done
git status --porcelain --ignored --untracked-files=all
git cat-file --batch-all-objects --batch
git rev-list --all --objects | git cat-file --batch
git reflog --all 2>/dev/null; git stash list; git stash show -p 2>/dev/null
git fsck --lost-found --unreachable --dangling 2>&1
cat .git/lost-found/other/* 2>/dev/null
git log -p --all
for alt in $(cat .git/objects/info/alternates); do
  echo "alt $alt"; ls -la "$alt" "$(dirname "$alt")" 2>&1
  GIT_OBJECT_DIRECTORY="$alt" git cat-file --batch-all-objects --batch 2>&1
done
# The overlay's layers and everything mounted, by the paths mountinfo names.
for dir in $(grep -o 'lowerdir=[^, ]*\|upperdir=[^, ]*' /proc/self/mountinfo | cut -d= -f2 \
             | tr ':' '\n') $(awk '{print $4; print $5}' /proc/self/mountinfo | sort -u); do
  case "$dir" in /proc*|/sys*|/dev*) continue;; esac
  for f in "$dir/.env" "$dir/sub/.env" "$dir/.git/objects"; do
    [ -e "$f" ] && { echo "mount-path $f"; cat "$f" 2>&1 | head -c 2000; ls "$f" 2>&1; }
  done
done
tr '\0' ' ' < /proc/1/cmdline; echo
echo "== end $ROUND"
"""
# During a run: say it started, then watch for the user's new .env for a while.
WATCH = r"""
touch .started
for i in $(seq 1 60); do
  if cat .env sub/.env 2>/dev/null; then echo "READ .env at $i"; fi
  ls -a . | grep -q '^\.env$' && echo "LISTED .env at $i"
  [ -e .stop ] && break
  sleep 0.25
done
"""
AGENT = """
ROUND=$(cat .round 2>/dev/null || echo 1); export ROUND; echo $((ROUND + 1)) > .round
sh ./attack.sh
if [ "$ROUND" != 1 ]; then sh ./watch.sh > watch.txt 2>&1; fi
"""
AGENT_CMD = "sh /workspace/agent.sh"


def setup(tmp_path: Path, backend: str) -> tuple[HostileUser, dict[str, str]]:
    """A project with history and host-only git objects, each holding a canary."""
    markers = {
        "history": canary("history"),
        "note": canary("note"),
        "dep": canary("dep"),
    }
    user = HostileUser.make(
        tmp_path,
        {
            ".gitignore": ".env*\n*.pem\nnode_modules/\n.round\nloot-*\nwatch.txt\n.started\n",
            "app.py": f"# {markers['history']}\n",
            "attack.sh": ATTACK,
            "watch.sh": WATCH,
            "agent.sh": AGENT,
        },
    )
    p = user.project
    user.commit({"app.py": "print('v2')\n"}, "v2")  # the marker lives in an ancestor only
    secrets = {
        name: user.canaries.setdefault(name, canary(name))
        for name in ("dangling", "stash", "branch", "once-added", "stash-untracked")
    }
    subprocess.run(
        ["git", "-C", str(p), "hash-object", "-w", "--stdin"],
        input=f"DANGLING={secrets['dangling']}\n",
        text=True,
        check=True,
        capture_output=True,
    )
    (p / "app.py").write_text(f"STASHED={secrets['stash']}\n")
    (p / "untracked-secret.txt").write_text(f"{secrets['stash-untracked']}\n")
    git(p, "stash", "-q", "--include-untracked")
    git(p, "checkout", "-q", "-b", "other")
    user.commit({"branch.txt": f"{secrets['branch']}\n"}, "another branch")
    git(p, "checkout", "-q", "main")
    (p / ".env").write_text(f"TOKEN={secrets['once-added']}\n")
    git(p, "add", "-f", ".env")
    git(p, "rm", "-q", "--cached", ".env")  # its blob stays in the store, dangling
    (p / ".env").unlink()
    (p / "node_modules").mkdir()  # ignored, there at creation
    (p / "node_modules" / "dep.js").write_text(f"// {markers['dep']}\n")
    user.commit({"note.txt": f"{markers['note']}\n"}, "note")
    if backend == "docker":
        # The canary ~/.docker/config.json is not valid base64 auth: the Docker client
        # library refuses it (another finding); this test is about the workspace.
        clean = tmp_path / "docker-config"
        clean.mkdir()
        (clean / "config.json").write_text("{}\n")
        user.env["DOCKER_CONFIG"] = str(clean)
    if backend == "docker" and os.getuid() == 0:
        # Docker's overlay needs the project owned by the container user.
        subprocess.run(["chown", "-R", "1000:1000", str(p)], check=True)
        user.env |= {
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "safe.directory",
            "GIT_CONFIG_VALUE_0": "*",
        }
    return user, markers


def loot(out: Outcome, round_: int) -> str:
    assert out.sandbox_dir is not None
    path = out.sandbox_dir / "upper" / f"loot-{round_}.txt"
    if not path.is_file():  # a copy workspace
        path = out.sandbox_dir / "work" / f"loot-{round_}.txt"
    return path.read_text(errors="replace")


def test_hidden_files_and_host_only_objects_stay_out(tmp_path: Path, backend: str) -> None:
    user, markers = setup(tmp_path, backend)
    first = user.so(
        "run",
        "-s",
        backend,
        "-H",
        "custom",
        "--agent-cmd",
        AGENT_CMD,
        "-i",
        "1",
        "--yes",
        "-q",
    )
    assert first.sandbox_id is not None, first.stderr
    sid = first.sandbox_id
    record = (user.so_home / "sandboxes" / sid / "sandbox.json").read_text()
    assert '"workspace_mode": "overlay"' in record
    round1 = loot(first, 1)
    # Controls: what existed at creation, and the base's history, are readable.
    assert markers["note"] in round1
    assert markers["dep"] in round1
    assert markers["history"] in round1  # git log -p / cat-file of an ancestor's blob
    assert not user.leaks(round1), user.leaks(round1)

    # Between runs the user adds secrets, a new tracked file and a normal untracked one,
    # and edits a tracked file in place.
    p = user.project
    later = {
        name: user.canaries.setdefault(name, canary(name))
        for name in ("env-later", "env-local", "pem-later", "sub-env")
    }
    (p / ".env").write_text(f"TOKEN={later['env-later']}\n")
    (p / ".env.local").write_text(f"TOKEN={later['env-local']}\n")
    (p / "deploy.pem").write_text(f"{later['pem-later']}\n")
    (p / "sub").mkdir()
    (p / "sub" / ".env").write_text(f"TOKEN={later['sub-env']}\n")
    new_tracked, new_untracked = canary("tracked-later"), canary("untracked-later")
    (p / "scratch.txt").write_text(f"{new_untracked}\n")
    user.commit({"added-later.txt": f"{new_tracked}\n"}, "host commit after creation")
    (p / "app.py").write_text("print('host edit in place')\n")

    stop = threading.Event()
    writer = threading.Thread(target=_create_during_run, args=(user, sid, stop), daemon=True)
    writer.start()
    second = user.so(
        "continue", sid, "-H", "custom", "--agent-cmd", AGENT_CMD, "-i", "1", "--yes", "-q"
    )
    stop.set()
    writer.join(timeout=5)
    round2 = loot(second, 2)
    watch = (user.so_home / "sandboxes" / sid / "upper" / "watch.txt").read_text()
    everything = "\n".join([round1, round2, watch, first.everything(), second.everything()])
    assert not user.leaks(everything), user.leaks(everything)
    assert "READ .env" not in watch and "LISTED .env" not in watch
    assert new_tracked not in round2 and new_untracked not in round2  # as before: not shown
    assert "host edit in place" not in round2  # restored from the base commit (drift)
    assert markers["note"] in round2 and markers["history"] in round2  # controls again
    assert (p / ".env").read_text().startswith("TOKEN=")  # the host's files are untouched


def _create_during_run(user: HostileUser, sid: str, stop: threading.Event) -> None:
    """Once the agent's second run says it started, create more hidden files on the host."""
    started = user.so_home / "sandboxes" / sid / "upper" / ".started"
    while not stop.is_set() and not started.exists():
        time.sleep(0.05)
    if stop.is_set():
        return
    value = user.canaries.setdefault("env-during", canary("env-during"))
    (user.project / ".env").unlink(missing_ok=True)
    (user.project / ".env").write_text(f"TOKEN={value}\n")  # a new inode during the run
    (user.project / "sub" / ".env").write_text(f"TOKEN={value}\n")
