"""The codex harness: argv, env, provisioning, and CodexJsonParser on real codex 0.171 output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers import make_repo, so
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
from sono.harnesses.codex import CodexHarness
from sono.harnesses.codex_json import CodexJsonParser, unwrap_shell

FIXTURE = Path(__file__).parent.parent / "fixtures" / "codex" / "exec_commit.jsonl"
EXEC = [
    "/x/codex",
    "exec",
    "--json",
    "--dangerously-bypass-approvals-and-sandbox",
    "--skip-git-repo-check",
]
NO_UPDATE = ["-c", "check_for_update_on_startup=false"]

# Real lines from codex 0.171.0: an apply_patch through its exec tool, a server answering
# HTTP 400, and a server that was unreachable.
PATCH_STARTED = (
    '{"type":"item.started","item":{"id":"item_2","type":"file_change","changes":'
    '[{"path":"/tmp/cx/w/notes.txt","kind":"add"}],"status":"in_progress"}}'
)
PATCH_DONE = PATCH_STARTED.replace("item.started", "item.completed").replace(
    "in_progress", "completed"
)
HTTP_400 = '{"error":{"message":"nope","type":"invalid_request_error"}}'
ERROR_400 = json.dumps({"type": "error", "message": HTTP_400})
FAILED_400 = json.dumps({"type": "turn.failed", "error": {"message": HTTP_400}})
RECONNECT = (
    '{"type":"error","message":"Reconnecting... 5/5 (stream disconnected before completion: '
    'failed to lookup address information: Name does not resolve)"}'
)
FAILED_CMD = (
    '{"type":"item.completed","item":{"id":"item_1","type":"command_execution","command":'
    '"/bin/bash -lc \'echo start; sleep 35; echo after; exit 3\'","aggregated_output":'
    '"start\\nafter\\n","exit_code":3,"status":"failed"}}'
)


def opts(**kw: Any) -> AgentOptions:
    return AgentOptions(executable="/x/codex", **kw)


# --- argv --------------------------------------------------------------------------------


def test_unattended_argv_matches_the_seed_and_reads_stdin() -> None:
    assert CodexHarness().unattended_argv(opts()) == [*EXEC, *NO_UPDATE, "-"]


def test_model_and_effort_flags() -> None:
    argv = CodexHarness().unattended_argv(opts(model="gpt-5.5", effort="high"))
    assert argv == [
        *EXEC,
        "-m",
        "gpt-5.5",
        "-c",
        'model_reasoning_effort="high"',
        *NO_UPDATE,
        "-",
    ]


def test_endpoint_pins_the_users_provider_to_the_gateway() -> None:
    argv = CodexHarness().unattended_argv(opts(endpoints={"fake": "http://127.0.0.1:9/fake"}))
    flags = [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]
    assert flags == [
        "check_for_update_on_startup=false",
        'model_provider="fake"',
        'model_providers.fake.base_url="http://127.0.0.1:9/fake"',
    ]
    assert argv[-1] == "-"


def test_openai_endpoint_sets_codexs_base_urls() -> None:
    argv = CodexHarness().unattended_argv(opts(endpoints={"openai": "http://gw/openai"}))
    flags = [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]
    assert flags[1:] == [
        'model_provider="openai"',
        'openai_base_url="http://gw/openai"',
        'chatgpt_base_url="http://gw/openai"',
        "features.enable_request_compression=false",
    ]


def test_oss_endpoint_goes_through_codexs_own_variable() -> None:
    endpoint = AgentOptions(endpoints={"ollama": "http://gw/ollama"})
    argv = CodexHarness().unattended_argv(endpoint)
    assert 'model_provider="ollama"' in argv
    assert CodexHarness().env({}, endpoint) == {"CODEX_OSS_BASE_URL": "http://gw/ollama"}


def test_interactive_argv_passes_prompt_and_never_bypasses() -> None:
    argv = CodexHarness().interactive_argv(opts(model="o3"), "Plan with me")
    assert argv == ["/x/codex", "-m", "o3", *NO_UPDATE, "Plan with me"]
    assert CodexHarness().interactive_argv(AgentOptions(), None) == ["codex", *NO_UPDATE]
    assert not any("dangerously" in a for a in argv)


# --- env, provisioning, efforts -------------------------------------------------------------


def test_env_forwards_only_codexs_key_variables() -> None:
    host = {
        "OPENAI_API_KEY": "k",
        "CODEX_API_KEY": "c",
        "OPENAI_BASE_URL": "http://x",
        "ANTHROPIC_API_KEY": "no",
        "AWS_SECRET_ACCESS_KEY": "no",
        "GITHUB_TOKEN": "no",
    }
    env = CodexHarness().env(host, AgentOptions())
    assert env == {"OPENAI_API_KEY": "k", "CODEX_API_KEY": "c"}


def test_provision_copies_auth_and_config_only(tmp_path: Path) -> None:
    codex = tmp_path / "host" / ".codex"
    for sub in ("sessions/2026/01", "log"):
        (codex / sub).mkdir(parents=True)
    (codex / "auth.json").write_text('{"OPENAI_API_KEY": "k"}')
    (codex / "config.toml").write_text('model = "o3"\n')
    (codex / "sessions" / "2026" / "01" / "rollout.jsonl").write_text("secret transcript")
    (codex / "log" / "codex-tui.log").write_text("log")
    (codex / "history.jsonl").write_text("prompt history")
    seed = tmp_path / "seed"
    seed.mkdir()
    copied = CodexHarness().provision(
        home_seed=seed, host_home=tmp_path / "host", opts=AgentOptions()
    )
    assert copied == ["~/.codex/auth.json", "~/.codex/config.toml"]
    assert sorted(p.name for p in (seed / ".codex").iterdir()) == ["auth.json", "config.toml"]
    # Without a gateway (a sandbox on the host's network) the files are copied as they are.
    assert (seed / ".codex" / "auth.json").read_text() == '{"OPENAI_API_KEY": "k"}'


def test_provision_without_codex_dir(tmp_path: Path) -> None:
    (tmp_path / "seed").mkdir()
    assert (
        CodexHarness().provision(
            home_seed=tmp_path / "seed", host_home=tmp_path, opts=AgentOptions()
        )
        == []
    )
    assert not (tmp_path / "seed" / ".codex").exists()


def test_efforts_are_what_codex_sends_on() -> None:
    assert CodexHarness.efforts == (
        "none",
        "minimal",
        "low",
        "medium",
        "high",
        "xhigh",
        "max",
        "ultra",
    )


def test_unknown_effort_is_refused_before_anything_runs(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "project", {"specs/prompt.md": "Do it.\n"})
    out = so("run", "-H", "codex", "-e", "huge", "--yes", cwd=repo)
    assert out.returncode == 1
    assert "effort 'huge' is not valid for codex; choose one of none, minimal" in out.stderr


def test_registry_and_pin() -> None:
    harness = get_harness("codex")
    assert harness.name == "codex" and harness.executable_name(AgentOptions()) == "codex"
    assert harness.npm is not None
    assert (harness.npm.name, harness.npm.version, harness.npm.bin) == (
        "@openai/codex",
        "0.171.0",
        "codex",
    )


# --- parser -----------------------------------------------------------------------------------


def parse(lines: list[str]) -> list[Event]:
    parser = CodexJsonParser()
    return [event for line in lines for event in parser.feed(line)]


def test_recorded_run_maps_to_normalized_events() -> None:
    events = parse(FIXTURE.read_text().splitlines())
    assert not [e for e in events if isinstance(e, Raw | Error)]
    assert [type(e) for e in events] == [
        SessionStarted,
        Thinking,
        Text,
        ToolCall,
        ToolResult,
        Thinking,
        Text,
        Usage,
        Result,
    ]
    assert events[0] == SessionStarted(session_id="01a22c52-5936-7ce0-b530-dfeaef8b9819")
    call, result = events[3], events[4]
    assert isinstance(call, ToolCall) and isinstance(result, ToolResult)
    assert call.name == "shell" and call.summary.startswith('n=1 echo "item $n"')
    assert result == ToolResult(call_id=call.call_id, ok=True, summary="")
    # input_tokens in codex includes the cached share; Usage keeps them apart.
    assert events[7] == Usage(input_tokens=30654 - 15438, output_tokens=361, cached_tokens=15438)
    assert events[8] == Result(ok=True, text="Iteration done.", num_turns=2)


def test_failed_command_is_a_failed_result_with_its_output() -> None:
    [call, result] = parse([FAILED_CMD])  # completed without a started line: call + result
    assert call == ToolCall(
        name="shell", summary="echo start; sleep 35; echo after; exit 3", call_id="item_1"
    )
    assert result == ToolResult(call_id="item_1", ok=False, summary="start after")


def test_file_change_reports_paths_once() -> None:
    events = parse([PATCH_STARTED, PATCH_DONE])
    assert events == [
        ToolCall(name="apply_patch", summary="/tmp/cx/w/notes.txt", call_id="item_2"),
        FileChanged(path="/tmp/cx/w/notes.txt"),
        ToolResult(call_id="item_2", ok=True, summary="completed"),
    ]


def test_api_error_is_reported_once_and_fails_the_run() -> None:
    events = parse([ERROR_400, FAILED_400])
    assert events == [Error(message=HTTP_400), Result(ok=False, text=HTTP_400, num_turns=1)]


def test_reconnects_surface_as_errors() -> None:
    [event] = parse([RECONNECT])
    assert isinstance(event, Error) and event.message.startswith("Reconnecting... 5/5")


def test_mcp_web_search_and_todo_items() -> None:
    mcp = {
        "id": "item_5",
        "type": "mcp_tool_call",
        "server": "fs",
        "tool": "read_file",
        "arguments": {"path": "/a"},
        "result": None,
        "error": {"message": "File not found"},
        "status": "failed",
    }
    search = {"id": "item_6", "type": "web_search", "query": "rust async"}
    todo = {"id": "item_7", "type": "todo_list", "items": [{"text": "a", "completed": False}]}
    lines = [json.dumps({"type": "item.completed", "item": i}) for i in (mcp, search, todo)]
    events = parse(lines)
    assert events[0] == ToolCall(name="fs.read_file", summary="/a", call_id="item_5")
    assert events[1] == ToolResult(call_id="item_5", ok=False, summary="File not found")
    assert events[2] == ToolCall(name="web_search", summary="rust async", call_id="item_6")
    assert events[4] == ToolCall(name="todo_list", summary="a", call_id="item_7")
    assert parse([json.dumps({"type": "item.updated", "item": todo})])[0].kind == "tool_call"


def test_error_items_and_unknown_items() -> None:
    item_error = {"type": "item.completed", "item": {"id": "i", "type": "error", "message": "m"}}
    unknown = {"type": "item.completed", "item": {"id": "i", "type": "collab_call"}}
    assert parse([json.dumps(item_error)]) == [Error(message="m")]
    assert parse([json.dumps(unknown)]) == [Raw(line=json.dumps(unknown))]


def test_unwrap_shell() -> None:
    assert unwrap_shell("/bin/bash -lc 'git status'") == "git status"
    assert unwrap_shell("bash -c 'a; b'") == "a; b"
    assert unwrap_shell("python -c 'x'") == "python -c 'x'"
    assert unwrap_shell("echo 'unbalanced") == "echo 'unbalanced"


@pytest.mark.parametrize(
    "line",
    [
        "WARNING: proceeding, even though we could not create PATH aliases",
        "{",
        '{"type":"item.completed","item":{"id":"item_2","type":"command_execu',
        "[1, 2]",
        "null",
        '"text"',
        '{"type": 5}',
        '{"type":"item.completed","item":"x"}',
        '{"type":"item.completed","item":{"type":"command_execution","exit_code":NaN}}',
        '{"type":"item.completed","item":{"type":"file_change","changes":[1,{"path":2}]}}',
        '{"type":"turn.completed","usage":{"input_tokens":"many","output_tokens":1e999}}',
        '{"type":"turn.failed","error":[1]}',
        '{"type":"thread.started","thread_id":{"a":1}}',
        '{"type":"item.completed","item":{"type":"mcp_tool_call","arguments":{"x":NaN}}}',
        '{"type":"item.completed","item":{"type":"todo_list","items":7}}',
        "\x00\ufffd",
    ],
)
def test_garbage_and_truncated_lines_never_raise(line: str) -> None:
    events = CodexJsonParser().feed(line)
    assert all(isinstance(e, Event) for e in events)


def test_every_prefix_of_the_recording_parses() -> None:
    for raw in FIXTURE.read_text().splitlines():
        parser = CodexJsonParser()
        for end in range(0, len(raw), 7):
            parser.feed(raw[:end])


def test_non_string_input_is_raw() -> None:
    assert CodexJsonParser().feed(None) == [Raw(line="None")]  # type: ignore[arg-type]
