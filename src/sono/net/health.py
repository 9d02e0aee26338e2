"""Can the agent reach its model? Watched while an iteration runs, so it fails fast.

An agent whose model is unreachable (a server that is down, a refused credential, a wrong
base URL, a config that points past the gateway) retries for minutes and then reports
something vague. :class:`ModelWatch` reads the gateway's usage log of the running
iteration (:mod:`sono.net.gateway` writes one line per request) and the agent's error
events, and once the model is clearly out of reach — no request of the iteration got an
answer, and the failures say why — it asks the backend to stop the agent (its
:meth:`check` is a backend ``stop`` check) and :meth:`diagnosis` gives the one line the
user reads: the harness, the endpoint it tried, where that endpoint and its credential
were configured, and what to do.

Rate limits (429) and overload (529) are not failures here: they pass with time.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sono.net.upstream import Upstream
from sono.textsafe import one_line

STOP = "model"  # the backend's ``killed`` reason when the watch stopped the agent
POLL_S = 0.5
MAX_READ = 1 << 20  # per poll: more is read at the next one
# How many failures of a kind, with no answered request in the iteration, end it.
ENOUGH = {"auth": 1, "unreachable": 2, "not_found": 2, "server": 3, "elsewhere": 2}
NEUTRAL = frozenset({408, 429, 529})
LAST_WORDS = 1000
# What agents print when they cannot connect at all (the request never reached so).
_CONNECT_RE = re.compile(
    r"ECONNREFUSED|ENOTFOUND|EAI_AGAIN|ETIMEDOUT|Connection ?refused|Unable to connect|"
    r"connection error|error sending request|getaddrinfo|fetch failed|Failed to connect|"
    r"stream disconnected|dns error|Could not resolve",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Failure:
    kind: str  # auth | unreachable | not_found | server | elsewhere
    route: str | None  # the gateway route ("/anthropic"), None: never reached it
    status: int | None
    detail: str  # the gateway's or the upstream's reason, or the agent's own words


class ModelWatch:
    """Watches one iteration. ``usage_log`` from ``offset`` is the gateway's log of this
    iteration; ``upstreams`` what the harness's config named; ``harness`` its name."""

    def __init__(
        self,
        harness: str,
        upstreams: Sequence[Upstream],
        usage_log: Path,
        offset: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        startup: bool = True,
    ) -> None:
        self.harness = harness
        # An agent that exits with an error before any model request did not start (its
        # config, its login): the CLIs say so in their last words. Off for commands that
        # need no model (the custom harness).
        self.startup = startup
        self._last_words = ""
        self.upstreams = {f"/{u.name}": u for u in upstreams}
        self.usage_log = usage_log
        self._offset = offset
        self._partial = b""
        self._clock = clock
        self._next = 0.0
        self.answered = 0
        self.requests = 0
        self._counts: dict[str, int] = {}
        self._last: dict[str, Failure] = {}
        self._agent_errors: list[str] = []
        self.failure: Failure | None = None

    # --- input -------------------------------------------------------------------------

    def saw_line(self, line: str) -> None:
        """A line of the agent's output (its last words explain an early exit)."""
        if line.strip() and not self.requests:
            self._last_words = line.strip()[:LAST_WORDS]

    def saw_error(self, text: str) -> None:
        """An error the agent reported (its parser's ``Error`` events, retry notices)."""
        if text.strip() and not self.requests:
            self._last_words = text.strip()[:LAST_WORDS]
        if _CONNECT_RE.search(text):
            self._agent_errors.append(one_line(text, 200))
            self._count(Failure("elsewhere", None, None, self._agent_errors[0]))

    def check(self) -> str | None:
        """:data:`STOP` once the model is out of reach (polled by the backend)."""
        now = self._clock()
        if self.failure is None and now >= self._next:
            self._next = now + POLL_S
            self.poll()
        return STOP if self.failure is not None else None

    def poll(self) -> None:
        for line in self._new_lines():
            self._record(line)

    # --- output ------------------------------------------------------------------------

    def diagnosis(self, exit_code: int | None = None) -> str | None:
        """The one line for the user when the iteration's model requests all failed (the
        watch stopped the agent, or it gave up by itself), or the agent exited with an
        error (``exit_code``) before asking its model anything; None when the model
        answered."""
        self.poll()
        failure = self.failure or self._worst()
        if failure is None and self.startup and not self.requests and exit_code:
            words = one_line(self._last_words, 300) or "nothing"
            return one_line(
                f"{self.harness} exited {exit_code} before asking its model anything (it "
                f"said: {words}); fix its configuration (`so doctor` shows what so read)",
                600,
            )
        if failure is None or self.answered:
            return None
        if failure.kind == "elsewhere" and self.requests:
            return None  # it did reach the gateway: its own words were about something else
        return describe(self.harness, failure, self.upstreams.get(failure.route or ""))

    # --- internals ---------------------------------------------------------------------

    def _new_lines(self) -> list[dict[str, object]]:
        try:
            with self.usage_log.open("rb") as fh:
                fh.seek(self._offset)
                data = fh.read(MAX_READ)
        except OSError:
            return []
        self._offset += len(data)
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        out = []
        for raw in lines:
            try:
                item = json.loads(raw)
            except ValueError:
                continue
            if isinstance(item, dict):
                out.append(item)
        return out

    def _record(self, item: dict[str, object]) -> None:
        if item.get("suppressed"):
            return
        status = item.get("status")
        status = status if isinstance(status, int) and not isinstance(status, bool) else None
        route = item.get("route") if isinstance(item.get("route"), str) else None
        refused = item.get("refused")
        reason = one_line(str(refused), 300) if refused else ""
        error = one_line(str(item.get("error") or ""), 300)
        self.requests += 1
        if status is not None and 200 <= status < 400:
            self.answered += 1
            return
        if status is None or status in NEUTRAL or route not in self.upstreams:
            return
        if reason and status in (403, 404, 413, 400):
            return  # the gateway refused a request that is not a model call: not the model
        # A model call is a POST; a 404 or 5xx of a side call (GET /models, which many
        # servers lack) says nothing about the model.
        model_call = str(item.get("endpoint") or "POST").startswith("POST")
        if status in (401, 403):
            kind = "auth"
        elif status == 502 and reason:
            kind = "unreachable"
        elif status == 404 and model_call:
            kind = "not_found"
        elif status >= 500 and model_call:
            kind = "server"
        else:
            return
        self._count(Failure(kind, route, status, reason or error))

    def _count(self, failure: Failure) -> None:
        self._counts[failure.kind] = self._counts.get(failure.kind, 0) + 1
        self._last[failure.kind] = failure
        if (
            self.failure is None
            and not self.answered
            and not (failure.kind == "elsewhere" and self.requests)
            and self._counts[failure.kind] >= ENOUGH[failure.kind]
        ):
            self.failure = failure

    def _worst(self) -> Failure | None:
        for kind in ("auth", "unreachable", "not_found", "server", "elsewhere"):
            if kind in self._last:
                return self._last[kind]
        return None


def describe(harness: str, failure: Failure, upstream: Upstream | None) -> str:
    """``<harness> cannot use its model: <what happened at which endpoint, configured
    where>; <the fix>`` — one line, never a credential's value."""
    if failure.kind == "elsewhere":
        return one_line(
            f"{harness} never reached so's model gateway (it said: {failure.detail}); its "
            "configuration inside the sandbox points elsewhere — `so doctor` shows the "
            "endpoints so read from its config; check the agent's own settings in the project",
            500,
        )
    missing = renew = ""
    where = "its configuration"
    if upstream is None:
        at, cred = f"the gateway route {failure.route}", "its credential"
    else:
        where = upstream.source
        at = f"{upstream.shown_url} (configured in {upstream.source})"
        credential = upstream.credential
        cred = f"the {credential.kind} from {credential.source}"
        if credential.kind == "none":
            missing = f"no credential was sent ({credential.source})"
        hint = getattr(credential.value, "login_hint", None)  # an OAuth login's own way
        renew = f": {hint}" if isinstance(hint, str) and hint else ""
    detail = _UNREACHABLE_RE.sub("", failure.detail)
    said = f": {detail}" if detail else ""
    doctor = "(`so doctor` shows what so read)"
    if failure.kind == "auth" and missing:
        text = f"{failure.status} from {at}{said} — {missing}: configure one {doctor}"
    elif failure.kind == "auth":
        text = f"{failure.status} from {at}{said} — {cred} was refused; renew it{renew} {doctor}"
    elif failure.kind == "unreachable":
        text = (
            f"{at} is unreachable ({detail}); is the model server up? "
            f"Else fix the endpoint in {where}"
        )
    elif failure.kind == "not_found":
        text = f"{failure.status} from {at}{said}; check the base URL in {where}"
    else:
        text = f"{failure.status} from {at}{said}; the server keeps failing: try again later"
    return one_line(f"{harness} cannot use its model: {text}", 600)


_UNREACHABLE_RE = re.compile(r"^upstream \S+ unreachable: ")
