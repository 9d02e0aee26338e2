"""Every setting's names, declared once: config key, ``Config`` attribute, environment
variables, command-line flags, help text and the commands whose flag takes it.

The CLI generates its settings flags from :data:`OPTIONS` (``sono.cli.flags``) and the
loader (:mod:`sono.config`) reads env vars and names flags in its errors from it; what
values a key takes (parser, default, trust rule) is :func:`sono.config._specs`, keyed by
the same keys — a test checks that the two tables and ``Config`` agree.

Imports nothing: ``so --help`` builds its parser from this table without loading the
config machinery.
"""

from __future__ import annotations

# Which commands take a setting's flag: those it changes, and `so config` / `so doctor`,
# which show what it resolves to. Any other command refuses it (a usage error).
LOOP_COMMANDS: tuple[str, ...] = ("run", "step", "clean", "dup", "continue")
SHOWN = ("config", "doctor")
BUDGET = (*LOOP_COMMANDS, "menu", *SHOWN)  # the menu continues sandboxes
AGENT = (*BUDGET, "plan", "learn")  # what starts an agent
BACKEND = (*LOOP_COMMANDS, "plan", "learn", "demo", *SHOWN)  # what creates a sandbox
POLICY = (*AGENT, "shell")  # what runs processes in a sandbox


class Option:
    """How a user names one setting. ``flags`` empty: no flag (file or env var only);
    ``commands`` None: every command takes the flag."""

    __slots__ = ("argtype", "commands", "env", "field", "flags", "help", "key", "metavar", "repeat")

    def __init__(
        self,
        key: str,
        *,
        field: str | None = None,
        env: tuple[str, ...] = (),
        flags: tuple[str, ...] = (),
        metavar: str | None = None,
        help: str = "",
        commands: tuple[str, ...] | None = None,
        argtype: type[int] | None = None,
        repeat: bool = False,
    ) -> None:
        self.key = key
        self.field = field or key.replace(".", "_")  # the Config attribute
        self.env = env  # later names win when several are set
        self.flags = flags
        self.metavar = metavar
        self.help = help
        self.commands = commands
        self.argtype = argtype  # argparse converts (a usage error, exit 2) before config
        self.repeat = repeat  # repeatable flag; the values are joined with ","

    @property
    def dest(self) -> str:
        """The argparse attribute: the key, a dot made an underscore."""
        return self.key.replace(".", "_")

    @property
    def flag(self) -> str:
        """The long spelling, as errors and ``so config`` name it."""
        return next((f for f in self.flags if f.startswith("--")), self.flags[0])

    def takes(self, command: str) -> bool:
        return bool(self.flags) and (self.commands is None or command in self.commands)


OPTIONS: tuple[Option, ...] = (
    Option(
        "harness",
        env=("SO_HARNESS",),
        flags=("-H", "--harness"),
        metavar="NAME",
        help="agent: claude, codex, opencode, pi, custom",
        commands=AGENT,
    ),
    Option(
        "iterations",
        env=("SO_ITERATIONS",),
        flags=("-i", "--iterations"),
        metavar="N",
        help="number of iterations (default 10)",
        argtype=int,
        commands=(*BUDGET, "demo"),
    ),
    # SANDBOX is seed A's variable; SO_SANDBOX wins when both are set.
    Option(
        "sandbox",
        env=("SANDBOX", "SO_SANDBOX"),
        flags=("-s", "--sandbox"),
        metavar="NAME",
        help="sandbox: auto (default), bwrap, docker, microvm (env SANDBOX)",
        commands=BACKEND,
    ),
    Option("workspace", env=("SO_WORKSPACE",)),
    Option(
        "model",
        env=("SO_MODEL",),
        flags=("-m", "--model"),
        metavar="NAME",
        help="model override",
        commands=AGENT,
    ),
    Option(
        "effort",
        env=("SO_EFFORT",),
        flags=("-e", "--effort"),
        metavar="LEVEL",
        help="reasoning effort, e.g. low/medium/high",
        commands=AGENT,
    ),
    Option(
        "agent_cmd",
        env=("SO_AGENT_CMD",),
        flags=("--agent-cmd",),
        metavar="'CMD ARGS'",
        help="command line of the custom harness: split like a shell command line but NOT "
        "run by a shell (&&, |, > are plain arguments; wrap them in sh -c '...'); the "
        "prompt arrives on stdin and in $SO_PROMPT_FILE",
        commands=AGENT,
    ),
    Option(
        "iteration_timeout",
        env=("SO_ITERATION_TIMEOUT",),
        flags=("--timeout",),
        metavar="DURATION",
        help="per-iteration timeout, e.g. 30m (default 30m)",
        commands=AGENT,
    ),
    Option("no_progress_limit", env=("SO_NO_PROGRESS_LIMIT",)),
    Option("commit_retries", env=("SO_COMMIT_RETRIES",)),
    Option("exclude", env=("SO_EXCLUDE",)),
    Option("bwrap", env=("SO_BWRAP",)),
    Option("pager"),
    Option("docker_base", env=("SO_DOCKER_BASE",)),
    Option(
        "max_cost",
        env=("SO_MAX_COST",),
        flags=("--max-cost",),
        metavar="USD",
        help="stop the loop once this run cost more dollars",
        commands=BUDGET,
    ),
    Option(
        "network.mode",
        env=("SO_NETWORK",),
        flags=("--network",),
        metavar="MODE",
        help="egress policy: allowlist (default: the model API only), none, open",
        commands=POLICY,
    ),
    Option(
        "network.allow",
        env=("SO_NETWORK_ALLOW",),
        flags=("--allow",),
        metavar="HOST",
        help="also allow HOST (host, .suffix or CIDR; repeatable)",
        repeat=True,
        commands=POLICY,
    ),
    Option(
        "network.deny",
        env=("SO_NETWORK_DENY",),
        flags=("--deny",),
        metavar="HOST",
        help="deny HOST (wins over allow; repeatable)",
        repeat=True,
        commands=POLICY,
    ),
    Option("secrets"),
    Option("files.ro", env=("SO_FILES_RO",)),
    Option("files.rw", env=("SO_FILES_RW",)),
    Option(
        "limits.memory",
        field="memory",
        env=("SO_LIMIT_MEMORY",),
        flags=("--memory",),
        metavar="SIZE",
        help="memory limit per sandbox, e.g. 4g",
        commands=POLICY,
    ),
    Option(
        "limits.cpus",
        field="cpus",
        env=("SO_LIMIT_CPUS",),
        flags=("--cpus",),
        metavar="N",
        help="CPU limit per sandbox, e.g. 2",
        commands=POLICY,
    ),
    Option(
        "limits.pids",
        field="pids",
        env=("SO_LIMIT_PIDS",),
        flags=("--pids",),
        metavar="N",
        help="process limit per sandbox, e.g. 512",
        commands=POLICY,
    ),
    Option("limits.disk", field="disk", env=("SO_LIMIT_DISK",)),
    Option("limits.total_time", field="total_time", env=("SO_LIMIT_TOTAL_TIME",)),
    Option("limits.on_kill", field="on_kill", env=("SO_LIMIT_ON_KILL",)),
    Option("enforce", env=("SO_ENFORCE",)),
    Option(
        "max_tokens",
        env=("SO_MAX_TOKENS",),
        flags=("--max-tokens",),
        metavar="N",
        help="stop the loop once this run used more tokens",
        commands=BUDGET,
    ),
)

BY_KEY: dict[str, Option] = {o.key: o for o in OPTIONS}


def flag_name(key: str) -> str:
    """The flag that sets ``key`` (``iteration_timeout`` -> ``--timeout``); a key without
    a flag (only a caller of ``load_config`` can pass one) is named ``--the-key``."""
    option = BY_KEY.get(key)
    if option is not None and option.flags:
        return option.flag
    return "--" + key.replace("_", "-").replace(".", "-")
