"""The in-container supervisor's decision (what to kill) as data, and its run/reap modes
on this host's /proc with processes of our own."""

from __future__ import annotations

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
