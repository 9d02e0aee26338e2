"""Loop rules with real git and a fake backend at the seam (commands run on the host)."""

from __future__ import annotations

import dataclasses
import io
import stat
from pathlib import Path
from typing import Any

import pytest

from fakes import fake_sandbox
from helpers import git, make_repo
from sono.events import MAX_USAGE_COST, MAX_USAGE_TOKENS, Usage
from sono.harnesses.base import AgentOptions
from sono.harnesses.custom import CustomHarness
from sono.loop import Loop, LoopOptions, LoopResult, Tally
from sono.net.policy import NetworkPolicy
from sono.net.session import NetSession
from sono.net.usage import Measured
from sono.sandbox import Sandbox
from sono.state import Store
from sono.ui.reporter import PlainReporter

PLAN2 = "- [ ] one\n- [ ] two\n"


def agent_script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "agent.sh"
    path.write_text("#!/bin/bash\nset -e\nprompt=$(cat)\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def sandbox_for(tmp_path: Path, files: dict[str, str]) -> Sandbox:
    repo = make_repo(tmp_path / "proj", files)
    return fake_sandbox(tmp_path, repo)


def run_loop(
    tmp_path: Path,
    body: str,
    *,
    files: dict[str, str] | None = None,
    iterations: int = 5,
    net: NetSession | None = None,
    **opts: Any,
) -> tuple[Sandbox, LoopResult]:
    files = files or {"specs/prompt.md": "Do it.\n", "specs/implementation-plan.md": PLAN2}
    sb = sandbox_for(tmp_path, files)
    agent = AgentOptions(agent_cmd=agent_script(tmp_path, body))
    options = dataclasses.replace(LoopOptions(iterations=iterations, timeout_s=60), **opts)
    loop = Loop(
        sb,
        harness=CustomHarness(),
        agent=agent,
        opts=options,
        reporter=PlainReporter(io.StringIO()),
        env={},
        host_home=tmp_path / "host-home",
        net=net,
    )
    return sb, loop.run()


COMMIT_ONE = (
    'echo "$SO_ITERATION" > "f$SO_ITERATION"; git add -A; git commit -qm "item $SO_ITERATION"\n'
)


def test_iterations_capped_by_unchecked_plan_items(tmp_path: Path) -> None:
    sb, result = run_loop(tmp_path, COMMIT_ONE, iterations=5)
    assert result.planned == 2
    assert [r.n for r in result.iterations] == [1, 2]
    assert result.outcome == "exhausted" and result.exit_code == 5
    for n in (1, 2):
        assert git(sb.work, "rev-parse", f"refs/so/{sb.record.id}/iter/{n}")
    assert sb.record.commits == 2 and sb.record.iterations == 2


def test_iterations_flag_wins_when_smaller(tmp_path: Path) -> None:
    _, result = run_loop(tmp_path, COMMIT_ONE, iterations=1)
    assert result.planned == 1 and len(result.iterations) == 1


def test_stops_when_status_done(tmp_path: Path) -> None:
    body = COMMIT_ONE + 'echo "Status: done" > specs/status.md; git add -A; git commit -qm done\n'
    sb, result = run_loop(tmp_path, body)
    assert result.outcome == "done" and result.exit_code == 0
    assert len(result.iterations) == 1
    assert sb.record.status == "done"


def test_stops_when_status_blocked(tmp_path: Path) -> None:
    body = (
        'printf "Status: blocked\\nneed creds\\n" > specs/status.md; git add -A; git commit -qm b\n'
    )
    sb, result = run_loop(tmp_path, body)
    assert result.outcome == "blocked" and result.exit_code == 4
    assert sb.record.status == "blocked"


def test_no_progress_stops_after_k_idle_iterations(tmp_path: Path) -> None:
    files = {"specs/prompt.md": "x\n"}
    _, result = run_loop(tmp_path, "echo idle\n", files=files, iterations=10, no_progress_limit=2)
    assert result.outcome == "no_progress" and result.exit_code == 6
    assert len(result.iterations) == 2


def test_dirty_tree_reprompts_agent_until_it_commits(tmp_path: Path) -> None:
    body = (
        'if grep -q "uncommitted changes" <<<"$prompt"; then git add -A; git commit -qm fix;'
        " else date > work.txt; fi\n"
    )
    sb, result = run_loop(tmp_path, body, iterations=1)
    rec = result.iterations[0]
    assert rec.commit_retries == 1 and not rec.auto_committed
    assert git(sb.work, "log", "-1", "--format=%s") == "fix"
    assert (sb.store.iteration_dir(sb.record.id, 1) / "prompt.commit-1.md").is_file()


def test_agent_that_never_commits_is_committed_by_so(tmp_path: Path) -> None:
    sb, result = run_loop(tmp_path, "date >> work.txt\n", iterations=1)
    rec = result.iterations[0]
    assert rec.commit_retries == 3 and rec.auto_committed
    assert git(sb.work, "log", "-1", "--format=%s") == "so: uncommitted changes after iteration 1"
    assert git(sb.work, "status", "--porcelain") == ""


def test_prompt_has_spec_recent_commits_and_iteration(tmp_path: Path) -> None:
    body = 'printf "%s" "$prompt" > "$HOME/../seen-$SO_ITERATION"\n' + COMMIT_ONE
    sb, _ = run_loop(tmp_path, body, iterations=2)
    first = (sb.home_seed.parent / "seen-1").read_text()
    second = (sb.home_seed.parent / "seen-2").read_text()
    assert first.startswith("Do it.") and first.rstrip().endswith("Iteration 1/2.")
    assert "Recent commits" not in first
    assert "item 1" in second and second.rstrip().endswith("Iteration 2/2.")
    stored = (sb.store.iteration_dir(sb.record.id, 2) / "prompt.md").read_text()
    assert stored.rstrip("\n") == second  # $(cat) drops the final newline


def test_timeout_kills_the_agent_tree(tmp_path: Path) -> None:
    marker = tmp_path / "survivor"
    body = f"(sleep 3; touch {marker}) & sleep 30\n"
    _, result = run_loop(tmp_path, body, iterations=1, timeout_s=1, commit_retries=0)
    rec = result.iterations[0]
    assert rec.timed_out and rec.exit_code is None
    import time

    time.sleep(3.5)
    assert not marker.exists(), "a child of the agent survived the timeout"


def test_records_and_events_are_stored(tmp_path: Path) -> None:
    sb, _ = run_loop(tmp_path, 'echo "working on it"\n' + COMMIT_ONE, iterations=1)
    it = sb.store.iteration_dir(sb.record.id, 1)
    assert "working on it" in (it / "output.log").read_text()
    assert '"kind": "text"' in (it / "events.jsonl").read_text()
    rec = sb.store.iterations(sb.record.id)[0]
    assert rec["exit_code"] == 0 and len(rec["commits"]) == 1


@pytest.mark.parametrize("status", ["running"])
def test_registry_status_is_not_left_running(tmp_path: Path, status: str) -> None:
    sb, _ = run_loop(tmp_path, COMMIT_ONE, iterations=1)
    assert Store(tmp_path / "so").load(sb.record.id).status != status


USAGE_LINE = (
    'echo \'{"type":"result","subtype":"success","is_error":false,"num_turns":1,'
    '"result":"ok","total_cost_usd":0.75,"usage":{"input_tokens":1000,"output_tokens":200}}\'\n'
)


def test_budget_stops_the_loop_and_is_recorded(tmp_path: Path) -> None:
    sb, result = run_loop(tmp_path, USAGE_LINE + COMMIT_ONE, iterations=2, max_cost=0.5)
    assert result.outcome == "budget" and result.exit_code == 7
    assert len(result.iterations) == 1
    rec = result.iterations[0]
    assert (rec.tokens_in, rec.tokens_out, rec.cost_usd) == (1000, 200, 0.75)
    assert "cost budget exceeded" in (sb.record.stop_reason or "")


def test_token_budget(tmp_path: Path) -> None:
    _, result = run_loop(tmp_path, USAGE_LINE + COMMIT_ONE, iterations=2, max_tokens=5000)
    assert result.outcome == "exhausted" and len(result.iterations) == 2
    _, result = run_loop(tmp_path / "b", USAGE_LINE + COMMIT_ONE, iterations=2, max_tokens=1100)
    assert result.outcome == "budget" and "token budget" in result.message


# An agent that lies about its usage: negative tokens, negative cost.
FAKE_USAGE_LINE = (
    'echo \'{"type":"result","subtype":"success","is_error":false,"num_turns":1,'
    '"result":"ok","total_cost_usd":-5,"usage":{"input_tokens":-1000000,"output_tokens":-1}}\'\n'
)


def metered(tmp_path: Path) -> tuple[NetSession, str]:
    """A network session whose gateway log the agent script appends to, standing in for
    the gateway measuring 3000 tokens in and 1000 out of claude-sonnet-4-5 per iteration."""
    net = NetSession(tmp_path / "net", NetworkPolicy(mode="none"), ())
    net.dir.mkdir()
    line = (
        '{"route": "/anthropic", "model": "claude-sonnet-4-5", "status": 200, '
        '"input_tokens": 2000, "output_tokens": 1000, "cache_read_tokens": 500, '
        '"cache_write_tokens": 1000, "refused": null}'
    )
    return net, f"echo '{line}' >> {net.usage_log}\n"


def test_the_budget_counts_what_the_gateway_measured(tmp_path: Path) -> None:
    net, gateway = metered(tmp_path)
    body = gateway + FAKE_USAGE_LINE + COMMIT_ONE
    sb, result = run_loop(tmp_path / "a", body, iterations=2, net=net, max_tokens=3500)
    assert result.outcome == "budget" and result.exit_code == 7
    [rec] = result.iterations
    assert (rec.tokens_in, rec.tokens_out, rec.tokens_cached) == (3000, 1000, 500)
    # 2000 x $3 + 1000 writes x $3.75 + 500 reads x $0.30 + 1000 x $15, per million
    assert rec.cost_usd == pytest.approx(0.0249)
    assert "token budget exceeded: 4000 > --max-tokens 3500" in (sb.record.stop_reason or "")


def test_a_budget_above_the_measured_use_does_not_trip(tmp_path: Path) -> None:
    net, gateway = metered(tmp_path)
    body = gateway + FAKE_USAGE_LINE + COMMIT_ONE
    _, result = run_loop(tmp_path / "a", body, iterations=2, net=net, max_tokens=8001)
    assert result.outcome == "exhausted" and len(result.iterations) == 2


def test_the_cost_budget_counts_the_measured_tokens_at_list_price(tmp_path: Path) -> None:
    net, gateway = metered(tmp_path)
    body = gateway + FAKE_USAGE_LINE + COMMIT_ONE
    _, result = run_loop(tmp_path / "a", body, iterations=2, net=net, max_cost=0.04)
    assert result.outcome == "budget" and len(result.iterations) == 2
    assert "cost budget exceeded: $0.0498" in result.message


def test_the_agents_figures_count_where_higher(tmp_path: Path) -> None:
    """Usage the gateway did not see (another model route, say) still counts."""
    net, gateway = metered(tmp_path)
    _, result = run_loop(tmp_path / "a", gateway + USAGE_LINE + COMMIT_ONE, iterations=1, net=net)
    rec = result.iterations[0]
    assert (rec.tokens_in, rec.tokens_out, rec.cost_usd) == (3000, 1000, 0.75)


@pytest.mark.parametrize(
    ("claimed", "expected"),
    [
        (-5, 0),
        (float("nan"), 0),
        (float("inf"), 0),
        (float("-inf"), 0),
        (10**30, MAX_USAGE_TOKENS),
        (True, 0),
        (7.9, 7),
        (12, 12),
    ],
)
def test_reported_usage_is_bounded(claimed: Any, expected: int) -> None:
    tally = Tally()
    tally.add(Usage(input_tokens=claimed, output_tokens=claimed, cached_tokens=claimed))
    assert (tally.tokens_in, tally.tokens_out, tally.tokens_cached) == (expected,) * 3


@pytest.mark.parametrize(
    ("claimed", "expected"),
    [(-1.0, 0.0), (float("nan"), 0.0), (float("inf"), 0.0), (1e300, MAX_USAGE_COST), (0.5, 0.5)],
)
def test_reported_cost_is_bounded(claimed: float, expected: float) -> None:
    tally = Tally()
    tally.add(Usage(cost_usd=claimed))
    tally.add(Usage(cost_usd=None))
    assert tally.cost_usd == expected


def test_at_least_takes_the_measured_floor() -> None:
    tally = Tally(tokens_in=10, tokens_out=500, tokens_cached=0, cost_usd=None)
    seen = Measured(
        requests=2, input_tokens=100, output_tokens=50, cached_tokens=7, cost_usd=0.25, metered=True
    )
    assert tally.at_least(seen) == Tally(100, 500, 7, 0.25)
    assert Tally(1, 1, 1, None).at_least(Measured()) == Tally(1, 1, 1, None)


def test_files_changed_counted(tmp_path: Path) -> None:
    body = "echo a > a.txt; echo b > b.txt; git add -A; git commit -qm two\n"
    _, result = run_loop(tmp_path, body, iterations=1)
    assert result.iterations[0].files_changed == 2


def test_a_crashing_parser_keeps_lines_raw(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sono.harnesses.custom import CustomParser

    def boom(self: CustomParser, line: str) -> list[object]:
        raise RuntimeError("parser bug")

    monkeypatch.setattr(CustomParser, "feed", boom)
    sb, result = run_loop(tmp_path, 'echo "hello"\n' + COMMIT_ONE, iterations=1)
    assert result.iterations[0].commits
    events = (sb.store.iteration_dir(sb.record.id, 1) / "events.jsonl").read_text()
    assert '"kind": "raw"' in events and "hello" in events


def test_step_decision_replaces_the_next_prompt_once(tmp_path: Path) -> None:
    from sono.loop import StepDecision

    files = {
        "specs/prompt.md": "Base.\n",
        "specs/implementation-plan.md": "- [ ] a\n- [ ] b\n- [ ] c\n",
    }
    sb = sandbox_for(tmp_path, files)
    decisions = iter([StepDecision(prompt="Edited.\n"), StepDecision()])
    loop = Loop(
        sb,
        harness=CustomHarness(),
        agent=AgentOptions(agent_cmd=agent_script(tmp_path, COMMIT_ONE)),
        opts=LoopOptions(iterations=3, timeout_s=60, step=True),
        reporter=PlainReporter(io.StringIO()),
        env={},
        host_home=tmp_path / "h",
        step_hook=lambda _sb, _rec: next(decisions),
    )
    result = loop.run()
    prompts = [
        (sb.store.iteration_dir(sb.record.id, n) / "prompt.md").read_text() for n in (1, 2, 3)
    ]
    assert len(result.iterations) == 3
    assert prompts[0].startswith("Base.") and prompts[1].startswith("Edited.")
    assert prompts[2].startswith("Base.")
    assert all("Do NOT commit" in p for p in prompts)


def test_step_stop_ends_the_loop(tmp_path: Path) -> None:
    from sono.loop import StepDecision

    sb = sandbox_for(tmp_path, {"specs/prompt.md": "x\n"})
    loop = Loop(
        sb,
        harness=CustomHarness(),
        agent=AgentOptions(agent_cmd=agent_script(tmp_path, COMMIT_ONE)),
        opts=LoopOptions(iterations=3, timeout_s=60, step=True),
        reporter=PlainReporter(io.StringIO()),
        env={},
        host_home=tmp_path / "h",
        step_hook=lambda _sb, _rec: StepDecision(stop=True),
    )
    result = loop.run()
    assert result.outcome == "stopped" and result.exit_code == 0 and len(result.iterations) == 1


def test_capped_log_stops_at_its_budget_with_one_marker_and_counts_the_rest() -> None:
    from sono.loop import CappedLog

    buf = io.StringIO()
    log = CappedLog(buf, limit=10)
    for line in ("abcd", "efgh", "ijkl", "mn"):
        log.write(line)
    assert buf.getvalue() == "abcd\nefgh\n[so: log budget of 10 bytes reached; the rest dropped]\n"
    assert (log.written, log.dropped) == (10, 8)


def test_a_usage_log_too_long_to_read_stops_a_budgeted_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the gateway's log of an iteration is longer than so reads, the budget cannot
    be held: with --max-tokens the loop stops instead of counting less."""
    from sono.net import session as net_session

    monkeypatch.setattr(net_session, "MAX_LOG_READ", 4096)
    net, _ = metered(tmp_path)
    flood = f"for i in $(seq 600); do echo '{{\"status\": 404}}' >> {net.usage_log}; done\n"
    sb, result = run_loop(
        tmp_path / "a", flood + COMMIT_ONE, iterations=3, net=net, max_tokens=10**9
    )
    assert result.outcome == "budget" and len(result.iterations) == 1
    assert "cannot be held" in (sb.record.stop_reason or "")
    # Without a budget the run goes on (the note says the usage is counted in part).
    _, free = run_loop(tmp_path / "b", flood + COMMIT_ONE, iterations=2, net=net)
    assert free.outcome == "exhausted" and len(free.iterations) == 2
