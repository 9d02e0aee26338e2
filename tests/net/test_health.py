"""ModelWatch: when an iteration's model is out of reach, and the line that says why."""

from __future__ import annotations

import json
from pathlib import Path

from sono.net.health import STOP, ModelWatch
from sono.net.upstream import Credential, Upstream

UPSTREAM = Upstream(
    "anthropic",
    "anthropic",
    "http://127.0.0.1:9",
    "~/.claude/settings.json env.ANTHROPIC_BASE_URL",
    Credential("OAuth login", "~/.claude/.credentials.json", "bearer", "tok"),
)


def _watch(tmp_path: Path) -> tuple[ModelWatch, Path]:
    log = tmp_path / "usage.jsonl"
    log.write_text('{"route": "/anthropic", "status": 200}\n')  # an earlier iteration's
    return ModelWatch("claude", [UPSTREAM], log, log.stat().st_size, clock=lambda: 0.0), log


def _add(log: Path, **line: object) -> None:
    with log.open("a") as fh:
        fh.write(json.dumps({"route": "/anthropic", **line}) + "\n")


def test_an_unreachable_upstream_stops_the_agent_with_where_it_was_configured(
    tmp_path: Path,
) -> None:
    watch, log = _watch(tmp_path)
    assert watch.check() is None
    reason = "upstream 127.0.0.1:9 unreachable: [Errno 111] Connection refused"
    _add(log, status=502, refused=reason)
    watch.poll()
    assert watch.failure is None  # one failure may be a blip
    _add(log, status=502, refused=reason)
    watch.poll()
    assert watch.check() == STOP
    line = watch.diagnosis()
    assert line is not None and "\n" not in line
    assert line == (
        "claude cannot use its model: http://127.0.0.1:9 (configured in "
        "~/.claude/settings.json env.ANTHROPIC_BASE_URL) is unreachable ([Errno 111] "
        "Connection refused); is the model server up? Else fix the endpoint in "
        "~/.claude/settings.json env.ANTHROPIC_BASE_URL"
    )


def test_a_refused_credential_stops_at_once_and_shows_the_upstreams_words(tmp_path: Path) -> None:
    watch, log = _watch(tmp_path)
    _add(log, status=401, error="invalid x-api-key")
    watch.poll()
    assert watch.failure is not None and watch.failure.kind == "auth"
    line = watch.diagnosis() or ""
    assert line.startswith("claude cannot use its model: 401 from http://127.0.0.1:9 (")
    assert ": invalid x-api-key — the OAuth login from ~/.claude/.credentials.json was " in line
    assert "refused; renew it" in line and "tok" not in line.replace("token", "")


def test_a_missing_credential_is_named_not_called_refused(tmp_path: Path) -> None:
    from sono.net.upstream import Credential

    bare = Upstream(
        "pi-fake",
        "openai",
        "http://127.0.0.1:9/v1",
        "~/.pi/agent/models.json [providers.fake]",
        Credential("none", "models.json [providers.fake].apiKey names $KEY, which is not set"),
    )
    log = tmp_path / "usage.jsonl"
    watch = ModelWatch("pi", [bare], log, 0, clock=lambda: 0.0)
    log.write_text('{"route": "/pi-fake", "status": 401}\n')
    line = watch.diagnosis() or ""
    assert "— no credential was sent (models.json [providers.fake].apiKey names $KEY, " in line
    assert "which is not set): configure one" in line and "refused" not in line


def test_an_answer_in_the_iteration_means_the_model_is_reachable(tmp_path: Path) -> None:
    watch, log = _watch(tmp_path)
    _add(log, status=200)
    _add(log, status=502, refused="upstream x unreachable")
    _add(log, status=502, refused="upstream x unreachable")
    _add(log, status=401)
    watch.poll()
    assert watch.check() is None and watch.diagnosis() is None


def test_rate_limits_and_the_gateways_own_refusals_are_not_model_failures(
    tmp_path: Path,
) -> None:
    watch, log = _watch(tmp_path)
    for _ in range(5):
        _add(log, status=429)
        _add(log, status=529)
        _add(log, status=403, refused="not a canonical API path: GET /anthropic/../x")
        _add(log, status=404, refused="not a anthropic model API endpoint: GET /anthropic/x")
    watch.poll()
    assert watch.check() is None and watch.diagnosis() is None


def test_a_credential_the_host_cannot_renew_is_an_auth_failure(tmp_path: Path) -> None:
    watch, log = _watch(tmp_path)
    _add(log, status=401, refused="~/.claude/.credentials.json: the login expired; log in again")
    assert watch.check() == STOP
    assert "the login expired; log in again" in (watch.diagnosis() or "")


def test_an_agent_that_never_reaches_the_gateway_is_stopped(tmp_path: Path) -> None:
    watch, _log = _watch(tmp_path)
    watch.saw_error("API Error: Unable to connect to API (ConnectionRefused)")
    assert watch.check() is None
    watch.saw_error("API retry 2/10: Connection error.")
    assert watch.check() == STOP
    line = watch.diagnosis() or ""
    assert line.startswith("claude never reached so's model gateway (it said: API Error: Unable")


def test_connection_words_after_gateway_traffic_are_not_a_wrong_endpoint(tmp_path: Path) -> None:
    watch, log = _watch(tmp_path)
    _add(log, status=200)
    watch.poll()
    watch.saw_error("ECONNREFUSED 127.0.0.1:5432 (the app's database)")
    watch.saw_error("ECONNREFUSED 127.0.0.1:5432 (the app's database)")
    assert watch.check() is None and watch.diagnosis() is None


def test_a_line_still_being_written_is_read_once_complete(tmp_path: Path) -> None:
    watch, log = _watch(tmp_path)
    with log.open("a") as fh:
        fh.write('{"route": "/anthropic", "status": 4')
    watch.poll()
    with log.open("a") as fh:
        fh.write("01}\n")
    watch.poll()
    assert watch.failure is not None and watch.failure.status == 401


def test_an_agent_that_exits_before_asking_its_model_says_why(tmp_path: Path) -> None:
    watch, _log = _watch(tmp_path)
    watch.saw_line('{"type":"thread.started"}')
    watch.saw_line(
        "Error loading config.toml: model_providers.fake: provider name must not be empty"
    )
    watch.saw_line("")
    line = watch.diagnosis(1) or ""
    assert line == (
        "claude exited 1 before asking its model anything (it said: Error loading config.toml: "
        "model_providers.fake: provider name must not be empty); fix its configuration "
        "(`so doctor` shows what so read)"
    )
    assert watch.diagnosis(0) is None  # a clean exit is the agent's business
    quiet = ModelWatch("custom", [UPSTREAM], tmp_path / "none.jsonl", 0, startup=False)
    quiet.saw_line("boom")
    assert quiet.diagnosis(7) is None  # a custom command may need no model at all


def test_side_calls_that_a_server_lacks_are_not_model_failures(tmp_path: Path) -> None:
    watch, log = _watch(tmp_path)
    for _ in range(3):
        _add(log, status=404, endpoint="GET /models", error="no route for /v1/models")
        _add(log, status=500, endpoint="GET /models/x")
    watch.poll()
    assert watch.check() is None and watch.diagnosis() is None
    _add(log, status=404, endpoint="POST /v1/messages")
    _add(log, status=404, endpoint="POST /v1/messages")
    watch.poll()
    assert watch.check() == STOP
