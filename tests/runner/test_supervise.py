"""The in-container supervisor's decision (what to kill) as data, and its run/reap modes
on this host's /proc with processes of our own."""

from __future__ import annotations

from pathlib import Path

from sono.runner.supervise import Proc, main, targets

ROOT = False
AGENT = True


def proc(parent: int, agent: bool = AGENT, start: int = 1, zombie: int = 0) -> Proc:
    return (parent, start, agent, zombie)


# init (1) ← sleep (2); an open shell (10, parent outside) ← its child (11);
# a run's root parent (20) ← the agent (21) ← its child (22); an orphan (30) ← its child (31).
TABLE = {
    1: proc(0, ROOT),
    2: proc(1, ROOT),
    10: proc(0),
    11: proc(10),
    20: proc(0, ROOT),
    21: proc(20),
    22: proc(21),
    30: proc(1),
    31: proc(30),
    40: proc(1, ROOT),  # the forwarder: root, never a target
}


def test_orphans_die_shells_and_other_commands_stay() -> None:
    assert targets(TABLE, ending=set(), me=99) == {30, 31}


def test_an_ending_command_loses_its_whole_tree() -> None:
    assert targets(TABLE, ending={20}, me=99) == {21, 22, 30, 31}


def test_a_broken_chain_is_an_orphan_and_zombies_are_left_to_init() -> None:
    table = {**TABLE, 50: proc(49), 51: proc(1, zombie=1)}
    assert targets(table, ending=set(), me=99) == {30, 31, 50}


def test_a_root_looking_agent_process_is_still_the_agent() -> None:
    # Non-dumpable: /proc/PID is root's, but its uid fields say it is the agent's.
    table = {1: proc(0, ROOT), 60: proc(1, AGENT)}
    assert targets(table, ending=set(), me=99) == {60}


def test_a_parent_cycle_does_not_hang() -> None:
    table = {70: proc(71), 71: proc(70)}
    assert targets(table, ending=set(), me=99) == {70, 71}


def test_bad_arguments_are_refused() -> None:
    assert main(["run", "1000", "1000", "not-a-token", "/", "true"]) == 2
    assert main([]) == 2


def test_a_zombie_leader_with_live_threads_is_a_live_process() -> None:
    """A daemon whose main thread left with exit() (not exit_group) reads as state Z while
    its other threads run on: it must be a target, not a zombie left to init."""
    import subprocess
    import sys
    import time

    from sono.runner.supervise import read_proc

    code = (
        "import ctypes, os, sys, threading, time\n"
        "threading.Thread(target=lambda: time.sleep(60), daemon=False).start()\n"
        "print(os.getpid(), flush=True)\n"
        "ctypes.CDLL(None).syscall(60, 0)\n"  # SYS_exit: this thread only
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        pid = int(child.stdout.readline())
        for _ in range(100):  # until the leader has left
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.02)
        entry = read_proc(pid)
        assert entry is not None and entry[3] == 0  # not a zombie: it still runs
    finally:
        child.kill()
        child.wait()
    # Control: a whole dead group (the process ended, not yet reaped) is a zombie.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    for _ in range(100):
        if Path(f"/proc/{dead.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.02)
    entry = read_proc(dead.pid)
    dead.wait()
    assert entry is not None and entry[3] == 1
