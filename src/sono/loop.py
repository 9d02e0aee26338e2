"""The Ralph loop: fresh agent process per iteration, stop rules, commit enforcement."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from sono import specs
from sono.errors import SoError
from sono.events import Error, Event, Raw, Usage, dumps
from sono.harnesses.base import Access, AgentOptions, EventParser, Harness
from sono.net import health, scrub
from sono.net.session import NetSession, Offsets
from sono.net.usage import Measured
from sono.sandbox import Sandbox
from sono.state import BLOCKED, DONE, FAILED, RUNNING, STOPPED, IterationRecord, now_iso
from sono.textsafe import one_line
from sono.workspace import SandboxGit

# Documented exit codes (README "Exit codes").
EXIT_DONE = 0
EXIT_ERROR = 1
EXIT_BLOCKED = 4
EXIT_EXHAUSTED = 5
EXIT_NO_PROGRESS = 6
EXIT_BUDGET = 7
EXIT_INTERRUPTED = 130

# Each log an agent run writes (output.log, events.jsonl) stops growing here: the agent's
# output is hostile input, and the host's disk is not the sandbox's to fill.
MAX_LOG_BYTES = 32 * 1024 * 1024
MIN_GIT_S = 10.0

OUTCOME_EXIT = {
    "done": EXIT_DONE,
    "blocked": EXIT_BLOCKED,
    "exhausted": EXIT_EXHAUSTED,
    "no_progress": EXIT_NO_PROGRESS,
    "budget": EXIT_BUDGET,
    "stopped": EXIT_DONE,
    "interrupted": EXIT_INTERRUPTED,
    "error": EXIT_ERROR,
}
OUTCOME_STATUS = {
    "done": DONE,
    "blocked": BLOCKED,
    "exhausted": STOPPED,
    "no_progress": STOPPED,
    "budget": STOPPED,
    "stopped": STOPPED,
    "interrupted": STOPPED,
    "error": FAILED,
}


@dataclass(frozen=True)
class LoopOptions:
    iterations: int
    timeout_s: float
    no_progress_limit: int = 3
    commit_retries: int = 3
    # Preset prompt builder (clean/dup); None = specs/prompt.md from the workspace.
    prompt: Callable[[Sandbox], str] | None = None
    step: bool = False
    cap_by_plan: bool = True
    max_cost: float | None = None  # dollars, summed over this run's iterations
    max_tokens: int | None = None  # input + output tokens, summed over this run
    total_time_s: float | None = None  # wall time of this run (limits.total_time)
    stop_on_kill: bool = False  # a resource limit killed the agent: stop (else go on)


@dataclass
class Tally:
    """Usage of one iteration, summed from the harness's Usage events (bounded: an agent
    prints them), then raised to what the model gateway measured (:meth:`at_least`)."""

    tokens_in: int = 0
    tokens_out: int = 0
    tokens_cached: int = 0
    cost_usd: float | None = None

    def add(self, usage: Usage) -> None:
        usage = usage.bounded()
        self.tokens_in += usage.input_tokens
        self.tokens_out += usage.output_tokens
        self.tokens_cached += usage.cached_tokens
        if usage.cost_usd is not None:
            self.cost_usd = (self.cost_usd or 0.0) + usage.cost_usd

    def at_least(self, seen: Measured) -> Tally:
        """Never less than the gateway's own reading of the upstream's answers; the
        agent's figures count only where they are higher (a model the gateway does not
        meter, say). Cost: the gateway's list-price floor (:data:`sono.net.usage.PRICES`)."""
        cost = self.cost_usd
        if seen.cost_usd > 0:
            cost = max(cost or 0.0, seen.cost_usd)
        return Tally(
            max(self.tokens_in, seen.input_tokens),
            max(self.tokens_out, seen.output_tokens),
            max(self.tokens_cached, seen.cached_tokens),
            cost,
        )


def over_budget(records: Sequence[IterationRecord], opts: LoopOptions) -> str | None:
    """The stop reason when this run's usage exceeds --max-cost / --max-tokens."""
    tokens = sum(r.tokens_in + r.tokens_out for r in records)
    cost = sum(r.cost_usd or 0.0 for r in records)
    if opts.max_tokens is not None and tokens > opts.max_tokens:
        return f"token budget exceeded: {tokens} > --max-tokens {opts.max_tokens}"
    if opts.max_cost is not None and cost > opts.max_cost:
        return f"cost budget exceeded: ${cost:.4f} > --max-cost ${opts.max_cost:.2f}"
    return None


@dataclass(frozen=True)
class LoopResult:
    outcome: str
    iterations: tuple[IterationRecord, ...]
    planned: int
    message: str

    @property
    def exit_code(self) -> int:
        return OUTCOME_EXIT[self.outcome]


@dataclass(frozen=True)
class _Start:
    head: str
    at: str
    t0: float


class Reporter(Protocol):
    def iteration_started(self, i: int, n: int, sandbox_id: str) -> None: ...
    def event(self, event: Event) -> None: ...
    def run_ended(self, result: LoopResult) -> None: ...
    def iteration_ended(self, record: IterationRecord, n: int) -> None: ...
    def note(self, message: str) -> None: ...


class Terminated(KeyboardInterrupt):
    """so was told to stop by a signal (SIGTERM: kill, ``timeout``, a CI cancel, a
    service manager; SIGHUP: the terminal closed): handled like Ctrl-C — the agent
    stopped, the iteration recorded, the sandbox kept — with exit code 128 + signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signal = signal.Signals(signum).name
        self.exit_code = 128 + signum

    def __str__(self) -> str:
        return f"so was terminated ({self.signal})"


def interruption(exc: KeyboardInterrupt) -> str:
    """The stop reason: ``interrupted (Ctrl-C)`` or ``so was terminated (SIGTERM)``."""
    return str(exc) if isinstance(exc, Terminated) else "interrupted (Ctrl-C)"


def interrupted_exit(exc: KeyboardInterrupt) -> int:
    return exc.exit_code if isinstance(exc, Terminated) else EXIT_INTERRUPTED


@contextlib.contextmanager
def terminated_as_exit() -> Iterator[None]:
    """While the block runs in the main thread, SIGTERM and SIGHUP raise
    :class:`Terminated` (so the agent's process group is stopped and the run recorded)
    instead of ending the process where it stands."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum: int, _frame: object) -> None:
        raise Terminated(signum)

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


# Between iterations in step mode: returns "continue" or "stop".
@dataclass(frozen=True)
class StepDecision:
    """What the human chose between iterations in step mode."""

    stop: bool = False
    prompt: str | None = None  # replaces the base prompt for the next iteration only


StepHook = Callable[[Sandbox, IterationRecord], StepDecision]


class Loop:
    def __init__(
        self,
        sandbox: Sandbox,
        *,
        harness: Harness,
        agent: AgentOptions,
        opts: LoopOptions,
        reporter: Reporter,
        env: dict[str, str],
        step_hook: StepHook | None = None,
        host_home: Path | None = None,
        net: NetSession | None = None,
        access: Access | None = None,
        secrets: tuple[str, ...] = (),
    ) -> None:
        self.sb = sandbox
        self.harness = harness
        self.agent = agent
        self.opts = opts
        self.reporter = reporter
        self.env = env
        self.step_hook = step_hook
        self.host_home = host_home or Path.home()
        self._tally = Tally()
        self._next_prompt: str | None = None
        self._killed: str | None = None
        self._model_failed: str | None = None  # the iteration's model was out of reach: why
        self._log_dropped = 0  # bytes of agent output not logged (the logs' budget)
        self._started = time.monotonic()
        self._ended: tuple[str, list[str], list[str], int] | None = None  # after_if_clean
        self._unmeasured: str | None = None  # a budget cannot be held: why
        self.net = net
        self.access = access or Access()  # what the harness read of its config (diagnosis)
        self._secrets = secrets  # every credential value the host knows: never inside

    def planned_iterations(self) -> int:
        if not self.opts.cap_by_plan or self.opts.prompt is not None:
            return self.opts.iterations
        plan = self.sb.read_file(specs.PLAN)
        return specs.cap_iterations(self.opts.iterations, plan)

    def run(self) -> LoopResult:
        """The iterations until a stop rule; whatever ends the run (a rule, Ctrl-C, an
        error, SIGTERM/SIGHUP) is in the sandbox's record."""
        with terminated_as_exit():
            return self._run()

    def _run(self) -> LoopResult:
        planned = self.planned_iterations()
        first = self.sb.record.iterations + 1
        records: list[IterationRecord] = []
        idle = 0
        self.sb.save(status=RUNNING, runner_pid=os.getpid(), stop_reason=None, last_error=None)
        started = self._started = time.monotonic()
        outcome, message = "exhausted", f"ran {planned} iteration(s) without status done"
        try:
            self.sb.take()  # the starting point: whatever the human left (shell, reset, specs)
            for offset in range(planned):
                rec = self.iteration(first + offset, offset + 1, planned)
                records.append(rec)
                idle = 0 if rec.commits else idle + 1
                if rec.status_after in (specs.DONE, specs.BLOCKED):
                    outcome = "done" if rec.status_after == specs.DONE else "blocked"
                    message = f"{specs.STATUS} says {rec.status_after}"
                    break
                budget = (
                    over_budget(records, self.opts) or self._over_time(started) or self._unmeasured
                )
                if budget:
                    outcome, message = "budget", budget
                    break
                if self._model_failed and not rec.commits:
                    outcome, message = "error", f"iteration {rec.n}: {self._model_failed}"
                    break
                if rec.killed and self.opts.stop_on_kill:
                    outcome = "error"
                    message = f"iteration {rec.n}: the {rec.killed} limit killed the agent"
                    break
                if idle >= self.opts.no_progress_limit:
                    outcome = "no_progress"
                    message = f"{idle} iteration(s) in a row without a new commit"
                    break
                if self.step_hook and offset + 1 < planned:
                    decision = self.step_hook(self.sb, rec)
                    if decision.stop:
                        outcome, message = "stopped", "stopped by you between iterations"
                        break
                    self._next_prompt = decision.prompt
        except KeyboardInterrupt as exc:
            self.reporter.note("interrupted: stopping the agent")  # also ends a live view
            self._finish("interrupted", interruption(exc))
            raise
        except BaseException as exc:  # whatever ends the run, the record says why
            self._finish_after(exc)
            raise
        self._finish(outcome, message)
        result = LoopResult(outcome, tuple(records), planned, message)
        self.reporter.run_ended(result)
        return result

    def _finish_after(self, exc: BaseException) -> None:
        """A run ended by an exception (an error, SystemExit, a failing reporter): never
        left ``running`` with a dead runner. Recording must not hide the exception."""
        outcome, message = "error", one_line(f"{type(exc).__name__}: {exc}", 300)
        try:
            self._finish(outcome, message)
        except Exception:  # the vault or git failed too: the status at least
            with contextlib.suppress(Exception):
                status = OUTCOME_STATUS[outcome]
                self.sb.save(status=status, stop_reason=message, runner_pid=None)

    def _over_time(self, started: float) -> str | None:
        limit = self.opts.total_time_s
        if limit is not None and time.monotonic() - started > limit:
            return f"total time exceeded: limits.total_time is {limit:.0f}s"
        return None

    def _finish(self, outcome: str, message: str) -> None:
        keep = self.sb.record.last_error  # e.g. a timeout in the last iteration
        last_error = message if outcome in ("error", "no_progress") else keep
        self.sb.save(
            status=OUTCOME_STATUS[outcome],
            stop_reason=message,
            runner_pid=None,
            last_error=last_error,
            commits=self._count_commits(),
        )

    def _count_commits(self) -> int:
        return self.sb.vault.count(self.sb.record.base_commit, self.sb.tip)

    def _git(self) -> SandboxGit:
        """so's git in the sandbox, each command within the iteration timeout and what is
        left of the total time (at least :data:`MIN_GIT_S`, to record what happened)."""
        budget = self.opts.timeout_s
        if self.opts.total_time_s is not None:
            left = self.opts.total_time_s - (time.monotonic() - self._started)
            budget = min(budget, left)
        return self.sb.git.within(max(budget, MIN_GIT_S))

    def iteration(self, n: int, i: int, planned: int) -> IterationRecord:
        """One fresh agent process, then commit enforcement, refs and records."""
        self.reporter.iteration_started(i, planned, self.sb.record.id)
        drift = self.sb.fix_drift()
        if drift:
            self.reporter.note(f"the host changed under the sandbox: {drift.summary()}")
        _, recent = self._git().before(self.sb.record.base_ref)
        start = _Start(self.sb.tip, now_iso(), time.monotonic())
        net_start = self.net.offsets() if self.net else None
        self._tally = Tally()
        self._killed = None
        self._model_failed = None
        self._log_dropped = 0
        prompt = self.prompt(i, planned, recent)
        try:
            exit_code, timed_out, events = self.run_agent(n, prompt, "agent")
        except KeyboardInterrupt as exc:
            # The agent tree is already dead; keep what it did on the timeline.
            self._close(
                n,
                start,
                exit_code=None,
                timed_out=False,
                commit_retries=0,
                auto_committed=False,
                events=0,
                interrupted=True,
            )
            self.sb.save(last_error=f"iteration {n} {interruption(exc)}")
            raise
        retries, auto = self._enforce_commit(n, i, start)
        rec = self._close(
            n,
            start,
            exit_code=exit_code,
            timed_out=timed_out,
            commit_retries=retries,
            auto_committed=auto,
            events=events,
            killed=self._killed,
            log_bytes_dropped=self._log_dropped,
            **self._network(n, net_start),
        )
        self.sb.save(last_error=self._agent_error(rec))
        self.reporter.iteration_ended(rec, planned)
        return rec

    def _network(self, n: int, start: Offsets | None) -> dict[str, Any]:
        """The iteration's network record; the usage the budget counts is never less than
        what the gateway measured (so --max-tokens and --max-cost hold whatever the agent
        prints)."""
        if self.net is None or start is None:
            return {}
        log = self.net.since(start)
        if log.denied:
            shown = ", ".join(sorted({f"{d.get('host')}:{d.get('port')}" for d in log.denied}))
            total = sum(int(d.get("count") or 1) for d in log.denied)
            self.reporter.note(
                f"iteration {n}: the network policy denied {total} attempt(s): {one_line(shown)}"
            )
        if log.refused and not self._model_failed:  # else the diagnosis said it better
            self.reporter.note(
                f"iteration {n}: the model gateway refused {log.refused} request(s): "
                f"{one_line(log.refused_reasons[0] if log.refused_reasons else '')}"
            )
        if log.incomplete:
            what = (
                f"iteration {n}: the model gateway's usage log grew past what so reads; "
                "its usage is counted only in part"
            )
            self.reporter.note(what)
            if self.opts.max_tokens is not None or self.opts.max_cost is not None:
                self._unmeasured = f"{what}: --max-tokens/--max-cost cannot be held, stopping"
        self._settle(n, log.measured)
        return {
            "net_denied": tuple(log.denied),
            "gateway_requests": log.requests,
            "gateway_tokens_in": log.tokens_in,
            "gateway_tokens_out": log.tokens_out,
        }

    def _settle(self, n: int, seen: Measured) -> None:
        """Raise the iteration's usage to what the gateway measured; say so when the
        agent reported less."""
        claimed = self._tally.tokens_in + self._tally.tokens_out
        measured = seen.input_tokens + seen.output_tokens
        if seen.metered and claimed < measured and claimed:
            self.reporter.note(
                f"iteration {n}: the agent reported {claimed} tokens, the model gateway "
                f"measured {measured}; the budget counts {measured}"
            )
        self._tally = self._tally.at_least(seen)

    def _enforce_commit(self, n: int, i: int, start: _Start) -> tuple[int, bool]:
        """Re-prompt the agent to commit a dirty tree; commit what is still left."""
        git = self._git()
        retries = 0
        if self._killed == "disk":
            return 0, False  # committing what filled the disk would store it twice
        rec_ = self.sb.record
        self._ended = git.after_if_clean(rec_.iter_ref(n), start.head, rec_.base_ref)
        if self._ended is not None:
            return 0, False  # clean: the iteration's refs are already set
        if not self.opts.step and not self._killed and not self._model_failed:
            while git.dirty() and retries < self.opts.commit_retries:
                retries += 1
                self.reporter.note(
                    f"tree is dirty after iteration {i}: asking the agent "
                    f"to commit ({retries}/{self.opts.commit_retries})"
                )
                self.run_agent(n, specs.COMMIT_REMINDER, f"commit-{retries}")
        if not git.dirty():
            return retries, False
        git.commit_all(f"so: uncommitted changes after iteration {n}")
        self.reporter.note(f"committed the agent's leftover changes (iteration {n})")
        return retries, True

    def _close(self, n: int, start: _Start, **fields: Any) -> IterationRecord:
        """Tag the iteration's end, store its record and update the registry."""
        rec_ = self.sb.record
        ended, self._ended = self._ended, None
        if ended is None:  # the sandbox's own iteration ref, for humans in `so shell`
            with contextlib.suppress(SoError):
                self._git().after(rec_.iter_ref(n), start.head, rec_.base_ref)
        head, changed, commits, total = self._recorded(n, start.head)
        status = specs.parse_status(self.sb.read_file(specs.STATUS))
        rec = IterationRecord(
            n=n,
            started=start.at,
            duration_s=round(time.monotonic() - start.t0, 3),
            head_before=start.head,
            head_after=head,
            commits=tuple(commits),
            status_after=status,
            files_changed=len(changed),
            tokens_in=self._tally.tokens_in,
            tokens_out=self._tally.tokens_out,
            tokens_cached=self._tally.tokens_cached,
            cost_usd=self._tally.cost_usd,
            **fields,
        )
        self.sb.store.write_iteration(self.sb.record.id, rec)
        self.sb.save(iterations=n, commits=total)
        return rec

    def _recorded(self, n: int, since: str) -> tuple[str, list[str], list[str], int]:
        """The iteration as the host records it: the sandbox's HEAD taken into the vault
        (verified data), then files and commits counted there — never numbers or refs
        the agent could have staged. An unreadable HEAD keeps the previous commit."""
        vault = self.sb.vault
        try:
            head = self.sb.take()
        except SoError as exc:
            self.reporter.note(f"iteration {n}: {exc}; the previous commit stays under review")
            head = since
        self.sb.mark_iteration(n, head, since)
        base = self.sb.record.base_commit
        listed = vault.git("rev-list", "--reverse", f"{since}..{head}").stdout.split()
        return head, vault.changed(since, head), listed, vault.count(base, head)

    def _agent_error(self, rec: IterationRecord) -> str | None:
        if self._model_failed:
            return f"iteration {rec.n}: {self._model_failed}"
        if rec.killed:
            return f"the {rec.killed} limit killed the agent in iteration {rec.n}"
        if rec.timed_out:
            return f"iteration {rec.n} timed out after {self.opts.timeout_s:.0f}s; agent killed"
        if rec.exit_code not in (0, None):
            return f"agent exited with {rec.exit_code} in iteration {rec.n}"
        return None

    def prompt(self, i: int, planned: int, recent: list[str]) -> str:
        if self._next_prompt is not None:
            base, self._next_prompt = self._next_prompt, None
        elif self.opts.prompt is not None:
            base = self.opts.prompt(self.sb)
        else:
            base = self.sb.read_file(specs.PROMPT) or ""
        return specs.compose_prompt(base, recent, i, planned, step=self.opts.step)

    def _model_watch(self) -> health.ModelWatch | None:
        """Watches this agent run's model requests at the gateway (fail fast)."""
        if self.net is None:
            return None
        start = self.net.offsets().usage
        return health.ModelWatch(
            self.harness.name,
            self.access.upstreams,
            self.net.usage_log,
            start,
            startup=self.harness.npm is not None,  # a packaged agent CLI: it needs its model
        )

    def run_agent(self, n: int, prompt: str, name: str) -> tuple[int | None, bool, int]:
        """Run the agent once; store prompt, raw output and events. Returns
        (exit code, timed out, number of events)."""
        out_dir = self.sb.store.iteration_dir(self.sb.record.id, n)
        out_dir.mkdir(parents=True, exist_ok=True)
        suffix = "" if name == "agent" else f".{name}"
        (out_dir / f"prompt{suffix}.md").write_text(prompt)
        self.harness.provision(
            home_seed=self.sb.home_seed, host_home=self.host_home, opts=self.agent
        )
        # Whatever the harness copied, nothing shaped like a credential goes in.
        scrub.scrub_tree(self.sb.home_seed, self._secrets)
        prompt_file = self.sb.home_seed / ".so" / "prompt.md"
        prompt_file.parent.mkdir(exist_ok=True)
        prompt_file.write_text(prompt)
        env = {
            **self.env,
            "SO_PROMPT_FILE": f"{self.sb.spec.home}/.so/prompt.md",
            "SO_ITERATION": str(n),
        }
        parser = self.harness.parser()
        count = 0
        watch = self._model_watch()
        with (
            (out_dir / f"output{suffix}.log").open("w", encoding="utf-8") as raw_fh,
            (out_dir / f"events{suffix}.jsonl").open("a", encoding="utf-8") as ev_fh,
        ):
            raw, ev_out = CappedLog(raw_fh), CappedLog(ev_fh)

            def on_line(line: str) -> None:
                nonlocal count
                raw.write(line)
                if watch is not None:
                    watch.saw_line(line)
                for event in _parse(parser, line):
                    count += 1
                    if isinstance(event, Usage):
                        self._tally.add(event)
                    elif isinstance(event, Error) and watch is not None:
                        watch.saw_error(event.message)
                    ev_out.write(dumps(event))
                    self.reporter.event(event)

            result = self.sb.backend.exec(
                spec=self.sb.spec,
                argv=self.harness.unattended_argv(self.agent),
                env=env,
                stdin_text=prompt,
                timeout=self.opts.timeout_s,
                on_line=on_line,
                stop=watch.check if watch is not None else None,
            )
        dropped = raw.dropped + ev_out.dropped
        if dropped:
            self._log_dropped += dropped
            self.reporter.note(
                f"iteration {n}: the agent's output passed the {MAX_LOG_BYTES >> 20} MiB log "
                f"budget; {dropped} bytes were not logged"
            )
        if result.timed_out:
            self.reporter.note(
                f"iteration {n}: agent timed out after {self.opts.timeout_s:.0f}s;"
                " its whole process tree was killed"
            )
        code = None if result.timed_out or result.killed else result.returncode
        diagnosis = watch.diagnosis(code) if watch is not None else None
        if diagnosis:
            self._model_failed = diagnosis
            stopped = "; the agent was stopped" if result.killed == health.STOP else ""
            self.reporter.note(f"iteration {n}: {diagnosis}{stopped}")
        elif result.killed == health.STOP:  # stopped, then an answer came after all
            self.reporter.note(f"iteration {n}: the agent was stopped: its model was unreachable")
        if result.killed and result.killed != health.STOP:
            self._killed = result.killed
            self.reporter.note(
                f"iteration {n}: the {result.killed} limit was hit; the agent and its "
                "whole process tree were killed"
            )
        return result.returncode, result.timed_out, count


class CappedLog:
    """A line log that stops at ``limit`` bytes: one marker line, then only a count of
    what was dropped (``dropped``)."""

    def __init__(self, fh: IO[str], limit: int = MAX_LOG_BYTES) -> None:
        self.fh = fh
        self.limit = limit
        self.written = 0
        self.dropped = 0

    def write(self, line: str) -> None:
        size = len(line.encode(errors="replace")) + 1
        if self.dropped or self.written + size > self.limit:
            if not self.dropped:
                self.fh.write(f"[so: log budget of {self.limit} bytes reached; the rest dropped]\n")
                self.fh.flush()
            self.dropped += size
            return
        self.written += size
        self.fh.write(line + "\n")
        self.fh.flush()


def _parse(parser: EventParser, line: str) -> list[Event]:
    """A parser bug must never cost the user an iteration: keep the line raw instead.
    Usage reports come out bounded (shown, stored and summed so)."""
    try:
        events = parser.feed(line)
    except Exception:  # any parser failure degrades to a raw line
        return [Raw(line=line)]
    return [e.bounded() if isinstance(e, Usage) else e for e in events]
