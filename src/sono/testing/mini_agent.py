"""A tiny Anthropic-API agent with one Bash tool, for ``so demo`` without the real CLI.

``python -m sono.testing.mini_agent`` reads the prompt from stdin (or ``$SO_PROMPT_FILE``
when stdin is empty), talks to ``$ANTHROPIC_BASE_URL/v1/messages``, runs each requested
command with ``bash -c`` in the current directory and prints its progress in Claude Code's
``stream-json`` shapes, so :class:`sono.harnesses.claude_stream.ClaudeStreamParser` reads it.

Stdlib only and no imports from :mod:`sono`: it must run inside a sandbox from a bare
interpreter. Exit 0 on success, 1 on an API error (or no prompt).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_TURNS = 50
COMMAND_TIMEOUT_S = 600
REQUEST_TIMEOUT_S = 900  # longer than any scripted server sleep we test against
MAX_OUTPUT_CHARS = 30_000
DEFAULT_MODEL = "so-mini"
BASH_TOOL: dict[str, Any] = {
    "name": "Bash",
    "description": "Run a shell command in the working directory; returns stdout and stderr.",
    "input_schema": {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The command to run."},
            "description": {"type": "string", "description": "What it does, in a few words."},
        },
        "required": ["command"],
    },
}


class ApiError(Exception):
    """The model API failed; the message is what the user sees."""


@dataclass(frozen=True)
class Config:
    base_url: str
    api_key: str
    model: str


@dataclass
class Totals:
    """Usage summed over turns, for the final ``result`` line."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    turns: int = 0
    started: float = field(default_factory=time.monotonic)

    def add(self, usage: object) -> None:
        if not isinstance(usage, dict):
            return
        for key in (
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
        ):
            value = usage.get(key)
            if isinstance(value, int):
                setattr(self, key, getattr(self, key) + value)

    def usage_json(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "output_tokens": self.output_tokens,
        }


def emit(obj: dict[str, Any]) -> None:
    """One stream-json line, flushed at once so watchers see progress live."""
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def read_prompt() -> str:
    text = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    if text.strip():
        return text
    path = os.environ.get("SO_PROMPT_FILE")
    return Path(path).read_text(encoding="utf-8") if path else ""


def config_from_env() -> Config:
    base = os.environ.get("ANTHROPIC_BASE_URL", "").rstrip("/")
    if not base:
        raise ApiError("ANTHROPIC_BASE_URL is not set")
    return Config(
        base_url=base,
        api_key=os.environ.get("ANTHROPIC_API_KEY") or "sk-placeholder",
        model=os.environ.get("ANTHROPIC_MODEL") or DEFAULT_MODEL,
    )


def call_api(cfg: Config, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": cfg.model, "max_tokens": 4096, "tools": [BASH_TOOL], "messages": messages}
    request = urllib.request.Request(  # noqa: S310 - the URL is the operator's own endpoint
        cfg.base_url + "/v1/messages",
        data=json.dumps(body).encode(),
        headers={
            "content-type": "application/json",
            "x-api-key": cfg.api_key,
            "anthropic-version": "2023-06-01",
        },
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:  # noqa: S310
            reply = json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise ApiError(f"{err.code} {_error_detail(err)}") from err
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise ApiError(f"cannot reach {cfg.base_url}: {err}") from err
    if not isinstance(reply, dict) or not isinstance(reply.get("content"), list):
        raise ApiError("malformed response: no content list")
    return reply


def _error_detail(err: urllib.error.HTTPError) -> str:
    try:
        error = json.loads(err.read()).get("error", {})
        return str(error.get("message") or error)
    except (ValueError, AttributeError, OSError):
        return str(err.reason)


def run_command(command: str) -> tuple[str, bool]:
    """Run one tool call; returns (output, is_error) like Claude's Bash tool."""
    try:
        done = subprocess.run(
            ["bash", "-c", command],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"Command timed out after {COMMAND_TIMEOUT_S}s", True
    output = (done.stdout + done.stderr).rstrip("\n")
    if done.returncode != 0:
        output = f"Exit code {done.returncode}\n{output}".rstrip("\n")
    if len(output) > MAX_OUTPUT_CHARS:
        output = output[:MAX_OUTPUT_CHARS] + "\n[output truncated]"
    return output, done.returncode != 0


class MiniAgent:
    def __init__(self, cfg: Config, session_id: str | None = None) -> None:
        self.cfg = cfg
        self.session_id = session_id or str(uuid.uuid4())
        self.totals = Totals()

    def run(self, prompt: str) -> int:
        self._emit_init()
        messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        try:
            final = self._loop(messages)
        except ApiError as err:
            message = f"API Error: {err}"
            print(f"mini_agent: {message}", file=sys.stderr)
            self._emit_result(message, is_error=True, subtype="success")
            return 1
        if final is None:
            self._emit_result("", is_error=True, subtype="error_max_turns")
            return 1
        self._emit_result(final, is_error=False, subtype="success")
        return 0

    def _loop(self, messages: list[dict[str, Any]]) -> str | None:
        """Talk until end of turn; returns the final text, or None at the turn cap."""
        for _ in range(MAX_TURNS):
            reply = call_api(self.cfg, messages)
            self.totals.turns += 1
            self.totals.add(reply.get("usage"))
            content = [b for b in reply["content"] if isinstance(b, dict)]
            self._emit_assistant(reply, content)
            messages.append({"role": "assistant", "content": content})
            calls = [b for b in content if b.get("type") == "tool_use"]
            if not calls:
                return "\n".join(str(b.get("text", "")) for b in content if b.get("type") == "text")
            results = [self._tool_result(call) for call in calls]
            self._emit({"type": "user", "message": {"role": "user", "content": results}})
            messages.append({"role": "user", "content": results})
        return None

    def _tool_result(self, call: dict[str, Any]) -> dict[str, Any]:
        tool_input = call.get("input")
        command = tool_input.get("command") if isinstance(tool_input, dict) else None
        if call.get("name") != "Bash" or not isinstance(command, str):
            output, is_error = f"Unsupported tool call: {call.get('name')}", True
        else:
            output, is_error = run_command(command)
        return {
            "type": "tool_result",
            "tool_use_id": call.get("id", ""),
            "content": output,
            "is_error": is_error,
        }

    # --- stream-json output (the shapes Claude Code 2.x prints) ---

    def _emit(self, obj: dict[str, Any]) -> None:
        emit({**obj, "parent_tool_use_id": None, "session_id": self.session_id})

    def _emit_init(self) -> None:
        emit(
            {
                "type": "system",
                "subtype": "init",
                "cwd": str(Path.cwd()),
                "session_id": self.session_id,
                "tools": ["Bash"],
                "model": self.cfg.model,
                "permissionMode": "bypassPermissions",
                "apiKeySource": "ANTHROPIC_API_KEY",
            }
        )

    def _emit_assistant(self, reply: dict[str, Any], content: list[dict[str, Any]]) -> None:
        # Like Claude Code: one assistant line per content block.
        base = {k: v for k, v in reply.items() if k != "content"}
        for block in content:
            self._emit({"type": "assistant", "message": {**base, "content": [block]}})

    def _emit_result(self, text: str, *, is_error: bool, subtype: str) -> None:
        elapsed_ms = int((time.monotonic() - self.totals.started) * 1000)
        emit(
            {
                "type": "result",
                "subtype": subtype,
                "is_error": is_error,
                "duration_ms": elapsed_ms,
                "num_turns": self.totals.turns,
                "result": text,
                "session_id": self.session_id,
                "total_cost_usd": 0,
                "usage": self.totals.usage_json(),
            }
        )


def main() -> int:
    try:
        prompt = read_prompt()
        cfg = config_from_env()
    except (OSError, ApiError) as err:
        print(f"mini_agent: {err}", file=sys.stderr)
        return 1
    if not prompt.strip():
        print(
            "mini_agent: no prompt on stdin and $SO_PROMPT_FILE is unset or empty", file=sys.stderr
        )
        return 1
    return MiniAgent(cfg).run(prompt)


if __name__ == "__main__":
    sys.exit(main())
