"""pi (``@earendil-works/pi-coding-agent``): ``pi -p --mode json`` with the prompt on stdin.

pi needs Node >= 22.19 while hosts often have Node 20, so ``so agents install pi`` puts
a Node 22 binary (``node-linux-<arch>``) into pi's own prefix and the harness runs pi's
entry script with it: ``[<prefix>/node_modules/.bin/node → real path, <pi cli.js>, …]``.
The prefix is mounted read-only at the same path, so host paths work inside.

Model endpoints (see :mod:`sono.harnesses.pi_config`): :meth:`PiHarness.access` reads
pi's agent directory on the host (``models.json`` providers, ``auth.json`` keys and OAuth
logins, ``settings.json`` default provider, the providers' env variables) into one
upstream per provider. Provisioning writes the agent directory's settings with every
``baseUrl`` at the gateway and every credential a placeholder of the same shape, copies
only an allow-list of the rest (:data:`COPIED_FILES`; :data:`CUSTOM_DIRS`: extensions,
prompts, skills, themes and installed packages, minus symlinks and key-looking files;
nothing else goes inside), and writes a tiny
extension (loaded with ``-e``) that points each routed provider at its gateway route:
pi ignores ``ANTHROPIC_BASE_URL`` for built-in providers, and an extension's ``baseUrl``
outranks ``models.json`` and, re-applied at ``session_start``, any extension the
project brings.

JSON mode shapes (pi 1.6.0, see the package's ``docs/json.md``), one object per line:

- ``{"type":"session","id":…,"cwd":…}`` first; then ``agent_start``, ``turn_start`` …
- ``{"type":"message_end","message":{"role":"assistant","content":[text|thinking|toolCall],
  "usage":{"input","output","cacheRead","cacheWrite","cost":{"total"}},"stopReason",
  "errorMessage"?}}``: the authoritative message, one per model request. ``message_update``
  lines are streaming deltas of the same content and are skipped.
- ``tool_execution_end`` with ``toolCallId``, ``result.content``, ``isError``.
- ``auto_retry_start``/``auto_retry_end`` around retried requests; ``agent_end`` per attempt;
  ``agent_settled`` once at the very end. pi exits 0 even when every request failed.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from sono import agents
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
    summarize,
)
from sono.harnesses import pi_config
from sono.harnesses.base import Access, AgentOptions, EventParser, NpmPackage
from sono.harnesses.homecopy import copy_allowed
from sono.harnesses.jsonread import as_dict as _dict
from sono.harnesses.jsonread import as_int as _int
from sono.harnesses.jsonread import as_num as _num
from sono.harnesses.jsonread import as_str as _str
from sono.harnesses.jsonread import blocks as _blocks
from sono.harnesses.jsonread import parse_line

PI_VERSION = "1.6.0"
NODE_VERSION = "22.23.5"  # pi 1.6.0 declares engines.node >= 22.19.0
# npm publishes Node binaries per platform; a package for another cpu fails to install.
_NODE_ARCH = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}
NODE_PACKAGE = f"node-linux-{_NODE_ARCH.get(platform.machine().lower(), 'x64')}"

ENV_PREFIXES = (
    "PI_",
    "ANTHROPIC_",
    "OPENAI_",
    "AZURE_OPENAI_",
    "GEMINI_",
    "OPENROUTER_",
    "MISTRAL_",
    "GROQ_",
    "XAI_",
    "DEEPSEEK_",
)
# Host paths that mean nothing inside the sandbox (HOME there is a fresh tmpfs).
HOST_PATH_VARS = frozenset({"PI_CODING_AGENT_DIR", "PI_CODING_AGENT_SESSION_DIR", "PI_PACKAGE_DIR"})
# What of the agent directory goes inside besides REWRITTEN: an allow-list, nothing else
# is copied (not transcripts, logs, downloaded host binaries, MCP servers' OAuth tokens,
# pi 0.x's oauth.json, nor a key file a setting reads with ``!cat …``).
COPIED_FILES = (
    "keybindings.json",
    "models-store.json",  # provider catalogs pi refreshed; read as is when offline
    "trust.json",
    "AGENTS.override.md",
    "AGENTS.md",
    "CLAUDE.md",
    "SYSTEM.md",
    "APPEND_SYSTEM.md",
)
# The user's own customisation, and the pi packages installed from npm and git.
CUSTOM_DIRS = ("extensions", "prompts", "commands", "skills", "themes", "npm", "git")
# Written separately, with placeholders for every credential (and never the real ones).
Rewrite = Callable[[dict[str, Any], AgentOptions], dict[str, Any]]
REWRITTEN: dict[str, Rewrite] = {
    "models.json": lambda data, opts: pi_config.sandbox_models(data, opts.endpoints),
    "auth.json": lambda data, opts: pi_config.sandbox_auth(data),
    "settings.json": lambda data, opts: pi_config.sandbox_settings(data),
    "mcp.json": lambda data, opts: pi_config.sandbox_mcp(data),
}

EXTENSION_PATH = ".pi/so/endpoints.js"  # under HOME; pi expands "~/" in -e paths
ROUTES_PATH = ".pi/so/routes.json"  # provider id -> gateway URL, written by provision
EXTENSION_SOURCE = """\
// Written by so: points pi's providers at the model endpoints so was given.
// pi passes each model's baseUrl to the SDK, so ANTHROPIC_BASE_URL alone is ignored.
import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";

export default function (pi) {
  let routes = {};
  try {
    routes = JSON.parse(readFileSync(join(homedir(), ".pi", "so", "routes.json"), "utf8"));
  } catch {}
  const apply = () => {
    for (const [provider, baseUrl] of Object.entries(routes)) {
      pi.registerProvider(provider, { baseUrl });
    }
  };
  apply();
  // Again once every extension has loaded: a project's extension must not re-point them.
  pi.on("session_start", apply);
}
"""


def bundled_node(executable: str) -> str | None:
    """The Node installed next to pi in its prefix (``NpmPackage.extra``), if any."""
    node = agents.bundled_node(Path(executable))
    return str(node) if node else None


def pi_command(executable: str | None, node: str | None) -> list[str]:
    """How to start pi: with the bundled Node when there is one, never the host's."""
    if executable is None:
        return ["pi"]
    return [node, executable] if node else [executable]


def pi_flags(opts: AgentOptions) -> list[str]:
    args: list[str] = []
    if opts.endpoints:
        args += ["-e", f"~/{EXTENSION_PATH}"]
    if opts.model:
        args += ["--model", opts.model]
    if opts.effort:
        args += ["--thinking", opts.effort]
    return args


class PiHarness:
    name: ClassVar[str] = "pi"
    efforts: ClassVar[tuple[str, ...]] = (
        "off",
        "minimal",
        "low",
        "medium",
        "high",
        "xhigh",
        "max",
    )
    npm: ClassVar[NpmPackage | None] = NpmPackage(
        "@earendil-works/pi-coding-agent",
        PI_VERSION,
        "pi",
        extra=(f"{NODE_PACKAGE}@{NODE_VERSION}",),
    )

    def executable_name(self, opts: AgentOptions) -> str | None:
        return "pi"

    def _command(self, opts: AgentOptions) -> list[str]:
        node = bundled_node(opts.executable) if opts.executable else None
        return pi_command(opts.executable, node)

    def unattended_argv(self, opts: AgentOptions) -> list[str]:
        return [*self._command(opts), "-p", "--mode", "json", *pi_flags(opts)]

    def interactive_argv(self, opts: AgentOptions, prompt: str | None) -> list[str]:
        # "--" so a prompt starting with "-" is a message, not an option.
        tail = ["--", prompt] if prompt else []
        return [*self._command(opts), *pi_flags(opts), *tail]

    def env(self, host_env: Mapping[str, str], opts: AgentOptions) -> dict[str, str]:
        env = {
            k: v
            for k, v in host_env.items()
            if k.startswith(ENV_PREFIXES) and k not in HOST_PATH_VARS
        }
        # An Anthropic OAuth token from the env keeps its mark inside, so pi still sends
        # it as a bearer token with Claude Code's headers (the gateway puts the real one).
        if env.get("ANTHROPIC_OAUTH_TOKEN"):
            env["ANTHROPIC_OAUTH_TOKEN"] = pi_config.placeholder_access("anthropic")
        # Each iteration is a fresh process: no catalog refresh, version check or telemetry.
        env.setdefault("PI_OFFLINE", "1")
        env.setdefault("PI_SKIP_VERSION_CHECK", "1")
        env.setdefault("PI_TELEMETRY", "0")
        return env

    def access(self, host_env: Mapping[str, str], host_home: Path) -> Access:
        cfg = pi_config.PiConfig.load(pi_config.agent_dir(host_env, host_home))
        upstreams = pi_config.read_upstreams(cfg, host_env, host_home)
        # The project's .pi is read from the working directory, as pi does.
        notes = pi_config.config_notes(cfg, host_home, upstreams)
        notes += pi_config.project_notes(Path.cwd())
        refusal = pi_config.default_refusal(cfg, host_home, upstreams)
        return Access(tuple(upstreams), tuple(notes), refusal)

    def provision(self, *, home_seed: Path, host_home: Path, opts: AgentOptions) -> list[str]:
        copied: list[str] = []
        # provision gets no env: the host's PI_CODING_AGENT_DIR is read from the process.
        src = pi_config.agent_dir(os.environ, host_home)
        cfg = pi_config.PiConfig.load(src)
        if src.is_dir():
            dest = home_seed / ".pi" / "agent"
            copy_allowed(src, dest, COPIED_FILES, CUSTOM_DIRS)
            for name, rewrite in REWRITTEN.items():
                if (src / name).is_file():
                    data = pi_config.read_json(src / name)
                    pi_config.write_private(dest / name, rewrite(data, opts))
            copied.append("~/.pi/agent")
        extension = home_seed / EXTENSION_PATH
        extension.parent.mkdir(parents=True, exist_ok=True)
        extension.write_text(EXTENSION_SOURCE)
        routes = pi_config.routes(cfg, opts.endpoints)
        (home_seed / ROUTES_PATH).write_text(json.dumps(routes, indent=2))
        return copied

    def parser(self) -> EventParser:
        return PiJsonParser()


# --- the parser ---------------------------------------------------------------------

# Tools whose ``path`` argument names the file they write.
FILE_TOOLS = frozenset({"edit", "write"})
FAILED_STOPS = frozenset({"error", "aborted"})
# Known lines that carry nothing the normalized events need (deltas, bookkeeping).
QUIET = frozenset(
    {
        "agent_start",
        "agent_end",
        "turn_start",
        "turn_end",
        "message_start",
        "message_update",
        "tool_execution_start",
        "tool_execution_update",
        "queue_update",
        "entry_appended",
        "session_info_changed",
        "thinking_level_changed",
        "compaction_start",
        "summarization_retry_scheduled",
        "summarization_retry_attempt_start",
        "summarization_retry_finished",
    }
)


class PiJsonParser:
    """Turns ``pi --mode json`` lines into :mod:`sono.events`; never raises."""

    def __init__(self) -> None:
        self._errors: set[str] = set()
        self._paths: dict[str, str] = {}  # tool call id → file an edit/write targets
        self._turns = 0
        self._text = ""
        self._stop = ""
        self._handlers: dict[str, Callable[[dict[str, Any]], list[Event]]] = {
            "session": _session,
            "message_end": self._message_end,
            "tool_execution_end": self._tool_end,
            "auto_retry_start": _retry_start,
            "auto_retry_end": _retry_end,
            "compaction_end": _compaction_end,
            "extension_error": _extension_error,
            "agent_settled": self._settled,
        }

    def feed(self, line: str) -> list[Event]:
        return self._dedupe_errors(parse_line(line, self._dispatch))

    def _dispatch(self, obj: dict[str, Any]) -> list[Event] | None:
        kind = obj.get("type")
        if not isinstance(kind, str):
            return None
        if kind in QUIET:
            return []
        handler = self._handlers.get(kind)
        return handler(obj) if handler else None

    def _dedupe_errors(self, events: list[Event]) -> list[Event]:
        """pi repeats a failed request's error on every retry and at the end; say it once."""
        kept: list[Event] = []
        for event in events:
            if isinstance(event, Error):
                if event.message in self._errors:
                    continue
                self._errors.add(event.message)
            kept.append(event)
        return kept

    def _message_end(self, obj: dict[str, Any]) -> list[Event]:
        message = _dict(obj.get("message"))
        if message.get("role") != "assistant":
            return []  # user prompt, system prompt and tool results echo what we know
        events: list[Event] = []
        texts: list[str] = []
        for block in _blocks(message.get("content")):
            events.extend(self._block(block, texts))
        events.extend(_usage(_dict(message.get("usage"))))
        stop = _str(message.get("stopReason"))
        if stop in FAILED_STOPS:
            events.append(Error(message=_str(message.get("errorMessage")) or f"request {stop}"))
        self._turns += 1
        self._stop = stop
        self._text = "\n".join(texts) or self._text
        return events

    def _block(self, block: dict[str, Any], texts: list[str]) -> list[Event]:
        kind = block.get("type")
        if kind == "text":
            text = _str(block.get("text"))
            texts.append(text)
            return [Text(text=text)] if text else []
        if kind == "thinking":
            redacted = block.get("redacted") is True
            return [Thinking(text="[redacted]" if redacted else _str(block.get("thinking")))]
        if kind == "toolCall":
            return self._tool_call(block)
        return [Raw(line=json.dumps(block, ensure_ascii=False))]

    def _tool_call(self, block: dict[str, Any]) -> list[Event]:
        name, call_id = _str(block.get("name")), _str(block.get("id"))
        args = block.get("arguments")
        path = _dict(args).get("path")
        if name in FILE_TOOLS and isinstance(path, str) and path:
            self._paths[call_id] = path
        return [ToolCall(name=name, summary=summarize(args), call_id=call_id)]

    def _tool_end(self, obj: dict[str, Any]) -> list[Event]:
        call_id = _str(obj.get("toolCallId"))
        ok = obj.get("isError") is not True
        result = _dict(obj.get("result"))
        events: list[Event] = [
            ToolResult(call_id=call_id, ok=ok, summary=summarize(_text_of(result.get("content"))))
        ]
        path = self._paths.pop(call_id, None)
        if ok and path:
            events.append(FileChanged(path=path))  # only edits that actually happened
        return events

    def _settled(self, obj: dict[str, Any]) -> list[Event]:
        aborted = obj.get("aborted") is True
        ok = not aborted and self._turns > 0 and self._stop not in FAILED_STOPS
        events: list[Event] = [Error(message="pi run aborted")] if aborted else []
        return [*events, Result(ok=ok, text=self._text, num_turns=self._turns)]


def _session(obj: dict[str, Any]) -> list[Event]:
    return [SessionStarted(session_id=_str(obj.get("id")))]


def _retry_start(obj: dict[str, Any]) -> list[Event]:
    # Retries back off for seconds: surface them, or a run looks hung.
    delay = _num(obj.get("delayMs")) or 0.0
    message = (
        f"API retry {obj.get('attempt')}/{obj.get('maxAttempts')} in {delay / 1000:g}s: "
        f"{_str(obj.get('errorMessage'))}"
    )
    return [Error(message=message.strip())]


def _retry_end(obj: dict[str, Any]) -> list[Event]:
    if obj.get("success") is True:
        return []
    return [Error(message=_str(obj.get("finalError")) or "request failed after retries")]


def _compaction_end(obj: dict[str, Any]) -> list[Event]:
    error = _str(obj.get("errorMessage"))
    return [Error(message=f"compaction failed: {error}")] if error else []


def _extension_error(obj: dict[str, Any]) -> list[Event]:
    where = _str(obj.get("extensionPath"))
    return [Error(message=f"extension {where}: {_str(obj.get('error'))}")]


def _usage(usage: dict[str, Any]) -> list[Event]:
    """One Usage per model request; the loop sums them. Failed requests report zeros."""
    cost = _dict(usage.get("cost"))
    event = Usage(
        # Cache writes are billed as fresh input; cache reads are the "cached" share.
        input_tokens=_int(usage.get("input")) + _int(usage.get("cacheWrite")),
        output_tokens=_int(usage.get("output")),
        cached_tokens=_int(usage.get("cacheRead")),
        cost_usd=_num(cost.get("total")),
    )
    empty = not (event.input_tokens or event.output_tokens or event.cached_tokens)
    return [] if empty and not event.cost_usd else [event]


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(_str(b.get("text")) for b in _blocks(content) if b.get("type") == "text")
