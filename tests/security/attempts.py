"""The escape attempts, as data: what an agent inside a sandbox tries, and a control.

Every :class:`Attempt` is a shell command run INSIDE the sandbox as the agent (an agent run:
the network forwarder is up, the proxy variables are set) that must FAIL, and a control
command of the same kind that must SUCCEED there, so that a blocked attack proves the
policy and not a typo. Commands follow one exit convention: 0 means the step succeeded
(the attack got through), anything else that it failed; ``probe.py`` (copied into the
sandbox's home) implements the steps the shell cannot do alone.

Commands are :meth:`str.format` templates over the suite's context (host paths, ports,
pids...): see ``test_escape.py``. ``{mark}`` is a path unique to the attempt
(``/so-sec-<id>``): no host-side server may ever see it in a request (the control uses
``{mark}-control``).

Some attempts are judged host-side (``check``): the command inside plants or writes
something, and a function in ``test_escape.py`` says whether the host was affected. Writes to
host paths are judged that way: a host path may exist inside as the sandbox's own (bwrap's
private /tmp holds the parents of read-only mounts such as the host's git objects).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Group = Literal["host files", "git", "network", "secrets", "processes", "privilege", "resources"]
GROUPS: tuple[Group, ...] = (
    "host files",
    "git",
    "network",
    "secrets",
    "processes",
    "privilege",
    "resources",
)
BACKENDS = ("bwrap", "docker")
Policy = Literal["allowlist", "open"]

P = "python3 /home/agent/probe.py"
UNSET_PROXY = "env -u http_proxy -u https_proxy -u HTTP_PROXY -u HTTPS_PROXY"
VIA_PROXY_OK = P + " http http://{host_ip}:{http_port}{mark}-control --marker ALLOWED-SERVER"
CONNECT_OK = P + " connect {host_ip}:{http_port} --path {mark}-control --marker ALLOWED-SERVER"
GET_OK = P + " proxy-get http://{host_ip}:{http_port}{mark}-control --marker ALLOWED-SERVER"
GATEWAY_OK = P + ' gateway POST /anthropic/v1/messages --body \'{{"model":"m"}}\' --marker UPSTREAM'
WRITE_PROC_OK = "echo so-probe > /proc/$$/comm"


@dataclass(frozen=True)
class Attempt:
    """One escape attempt.

    ``policy``: the network policy during the run — ``allowlist`` (the default config:
    only ``{host_ip}/32`` allowed) or ``open`` (everything public allowed, plus
    ``{host_ip}/32``, with ``.blocked.test`` deny-listed): the harder test for address
    spellings, since the allowlist alone would reject them by name.
    ``denied``: ``"host:port"`` template that must appear in the proxy's deny log.
    ``check``/``control_check``: host-side judges (names of functions in the test module)
    replacing the exit-status rule for the attack / the control.
    ``reach``: host-side servers that may see ``{mark}`` (the gateway's upstream, say).
    ``holes``: backend -> what is broken, for an attack known to get through: the test
    becomes a strict xfail (``raises=Escaped``), so the fix turns it into a failure that
    says to drop the entry. None are open now; docs/security.md lists the ones fixed.
    """

    id: str
    group: Group
    title: str
    attack: str
    control: str
    backends: tuple[str, ...] = BACKENDS
    policy: Policy = "allowlist"
    denied: str | None = None
    check: str | None = None
    control_check: str | None = None
    reach: tuple[str, ...] = ()
    holes: dict[str, str] = field(default_factory=dict)
    timeout: float = 30.0


# Swap specs/prompt.md between a regular file and a symlink, forever (until killed).
RACER = "\n".join(
    [
        "import os, sys",
        'os.chdir("/workspace/specs")',
        "while True:",
        "    try:",
        '        os.symlink(sys.argv[1], ".l")',
        '        os.rename(".l", "prompt.md")',
        '        open(".r", "w").write("x")',
        '        os.rename(".r", "prompt.md")',
        "    except OSError:",
        "        pass",
    ]
)


# Everything in a repo's own config that makes git run a program; each touches {pwned}
# (a host path: it exists only if the host ran it) and /tmp/so-hook-ran (inside).
HOOK = "#!/bin/sh\\ntouch {pwned} 2>/dev/null; touch /tmp/so-hook-ran; exit 0\\n"
PLANT_GIT = " && ".join(
    [
        "mkdir -p .git/h",
        f"printf '{HOOK}' > .git/h/pre-commit",
        "chmod +x .git/h/pre-commit",
        "for h in post-commit post-checkout post-merge reference-transaction pre-push "
        "post-rewrite pre-auto-gc; do cp .git/h/pre-commit .git/h/$h; done",
        "cp .git/h/* .git/hooks/ 2>/dev/null || mkdir -p .git/hooks && cp .git/h/* .git/hooks/",
        "git config core.hooksPath .git/h",
        "git config core.fsmonitor .git/h/pre-commit",
        "git config diff.so.textconv .git/h/pre-commit",
        "git config diff.external .git/h/pre-commit",
        "git config core.pager .git/h/pre-commit",
        "mkdir -p .git/info && echo '* diff=so' > .git/info/attributes",
    ]
)


def _write_back(path: str) -> str:
    """Write a file's own value back: proves write access and changes nothing."""
    return f'v=$(cat {path}) && printf "%s\\n" "$v" > {path}'


def _shown(port: str) -> str:
    return {"{loop_port}": "<host service>", "{http_port}": "<allowed port>"}.get(port, port)


def _spelling(name: str, host: str, port: str, what: str) -> Attempt:
    return Attempt(
        f"net-spell-{name}",
        "network",
        f"CONNECT {host}:{_shown(port)} ({what}) through the proxy",
        f"{P} connect {host}:{port} --path {{mark}}",
        CONNECT_OK,
        policy="open",
        denied=f"{host.strip('[]')}:{port}",
    )


def _metadata(name: str, host: str, what: str) -> Attempt:
    return Attempt(
        f"net-meta-{name}",
        "network",
        f"GET http://{host}/ ({what}) through the proxy",
        f"{P} proxy-get http://{host}{{mark}}",
        GET_OK,
        policy="open",
        denied=f"{host.strip('[]')}:80",
    )


HOST_FILES = [
    Attempt(
        "hf-ssh-key",
        "host files",
        "read the host's ~/.ssh/id_ed25519 by its host path",
        "cat {ssh_key}",
        "cat /home/agent/.gitconfig",
    ),
    Attempt(
        "hf-host-home",
        "host files",
        "list the host home directory",
        "ls -A {host_home} | grep .",
        "ls -A /home/agent | grep .",
    ),
    Attempt(
        "hf-root-home",
        "host files",
        "list /root",
        "ls -A /root | grep .",
        "ls -A /workspace | grep .",
    ),
    Attempt(
        "hf-shadow",
        "host files",
        "read /etc/shadow",
        "cat /etc/shadow",
        "cat /etc/passwd",
    ),
    Attempt(
        "hf-ssl-private",
        "host files",
        "list the host's /etc/ssl/private (root only, mounted read-only)",
        "ls -A /etc/ssl/private >/dev/null",
        "ls -A /etc/ssl/certs >/dev/null",
    ),
    Attempt(
        "hf-other-upper",
        "host files",
        "read another sandbox's workspace (its upper dir under SO_HOME)",
        "cat {other_work}/secret.txt",
        "cat /workspace/README.md",
    ),
    Attempt(
        "hf-other-record",
        "host files",
        "read another sandbox's sandbox.json",
        "cat {other_json}",
        "cat /workspace/.git/HEAD",
    ),
    Attempt(
        "hf-so-home",
        "host files",
        "list SO_HOME/sandboxes",
        "ls {so_home}/sandboxes | grep .",
        "ls /workspace/.git | grep .",
    ),
    Attempt(
        "hf-write-usr",
        "host files",
        "create a file in /usr",
        "touch /usr/so-escape",
        "touch /workspace/so-ok && rm /workspace/so-ok",
    ),
    Attempt(
        "hf-write-etc",
        "host files",
        "create a file in /etc, append to /etc/passwd",
        "touch /etc/so-escape || echo 'x:x:0:0::/:/bin/sh' >> /etc/passwd",
        "touch /tmp/so-ok",
    ),
    Attempt(
        "hf-write-root",
        "host files",
        "create a file in /",
        "touch /so-escape",
        "mkdir -p /tmp/d && touch /tmp/d/f",
    ),
    Attempt(
        "hf-write-project",
        "host files",
        "write the host project by its host path",
        "echo pwned > {project}/README.md || touch {project}/so-escape",
        "echo ok > /workspace/so-ok.txt && rm /workspace/so-ok.txt",
        check="project_changed",
    ),
    Attempt(
        "hf-symlink",
        "host files",
        "symlink in the workspace to the host key, then read it",
        "ln -sf {ssh_key} /workspace/key-link && cat /workspace/key-link",
        "ln -sf README.md /workspace/readme-link && cat /workspace/readme-link",
    ),
    Attempt(
        "hf-symlink-host-read",
        "host files",
        "specs/prompt.md -> host key: does so's host-side read (the next prompt) follow it?",
        "mkdir -p specs && ln -sf {ssh_key} specs/prompt.md",
        "mkdir -p specs && rm -f specs/prompt.md && echo SO-CONTROL-PROMPT > specs/prompt.md",
        check="host_read",
        control_check="host_read",
    ),
    Attempt(
        "hf-dir-symlink-host-read",
        "host files",
        "specs -> host ~/.ssh (a directory link): does a host-side read of specs/... follow it?",
        "rm -rf specs && ln -sfn {host_home}/.ssh specs",
        "rm -rf specs && mkdir specs && echo SO-CONTROL-PROMPT > specs/prompt.md",
        check="host_read_dir",
        control_check="host_read",
    ),
    Attempt(
        "hf-race-host-read",
        "host files",
        "a background process flips specs/prompt.md between a file and a link to the host "
        "key while so reads it host-side (check-then-open race)",
        "mkdir -p specs && setsid python3 -c '" + RACER + "' {ssh_key} {racer} "
        "</dev/null >/dev/null 2>&1 &",
        "mkdir -p specs && rm -f specs/prompt.md && echo SO-CONTROL-PROMPT > specs/prompt.md",
        check="host_read_race",
        control_check="host_read",
    ),
    Attempt(
        "hf-race-host-read-env",
        "host files",
        "a background process flips specs/prompt.md between a file and a link to the host "
        "key while so reads it host-side (check-then-open race), the racer started with env -i",
        "mkdir -p specs && env -i setsid python3 -c '" + RACER + "' {ssh_key} {racer} "
        "</dev/null >/dev/null 2>&1 &",
        "mkdir -p specs && rm -f specs/prompt.md && echo SO-CONTROL-PROMPT > specs/prompt.md",
        check="host_read_race",
        control_check="host_read",
    ),
    Attempt(
        "hf-net-dir-symlink",
        "host files",
        "replace /run/so/net/p/gateway.sock with a symlink to a host socket: a second so "
        "process for this sandbox (so shell during a run) chmods the target 0666",
        "rm -f /run/so/net/p/gateway.sock && ln -s {victim_sock} /run/so/net/p/gateway.sock",
        GATEWAY_OK,
        check="net_dir_symlink",
    ),
]

GIT = [
    Attempt(
        "git-host-config",
        "git",
        "edit the host repo's .git/config by its host path",
        "git config --file {project}/.git/config core.hooksPath /tmp/evil",
        "git config so.test yes && git config --get so.test",
        check="project_changed",
    ),
    Attempt(
        "git-host-hook",
        "git",
        "install a hook in the host repo's .git/hooks",
        "printf '#!/bin/sh\\ntouch /tmp/pwned\\n' > {project}/.git/hooks/post-checkout",
        "mkdir -p .git/hooks && printf '#!/bin/sh\\n' > .git/hooks/so-test "
        "&& rm .git/hooks/so-test",
        check="project_changed",
    ),
    Attempt(
        "git-host-objects",
        "git",
        "write a file into the host object store (mounted read-only at its host path)",
        "touch {objects}/so-escape || touch $(ls -d {objects}/?? | head -1)/so-escape",
        "echo so-object | git hash-object -w --stdin",
        check="project_changed",
    ),
    Attempt(
        "git-host-objects-git",
        "git",
        "git hash-object -w with GIT_OBJECT_DIRECTORY at the host store",
        "echo so-evil | GIT_OBJECT_DIRECTORY={objects} git hash-object -w --stdin",
        "git commit -q --allow-empty -m so-control",
        check="project_changed",
    ),
    Attempt(
        "git-host-push",
        "git",
        "git push into the host repo by its path",
        "git push -q {project} HEAD:refs/heads/so-evil",
        "git init -q --bare /tmp/b.git && git push -q /tmp/b.git HEAD:refs/heads/x",
        check="project_changed",
    ),
    Attempt(
        "git-config-on-host",
        "git",
        "plant hooks, core.hooksPath, core.fsmonitor and a textconv driver in the sandbox's "
        "own .git: does so's host-side review (so diff: drift check, diff) run them?",
        PLANT_GIT,
        "git commit -q --allow-empty -m so-hook && test -e /tmp/so-hook-ran",
        check="hook_ran_on_host",
    ),
    Attempt(
        "git-unmask",
        "git",
        "unmount the sandbox git dir to reach the host .git under the overlay",
        "umount /workspace/.git; grep -rqs {git_marker} /workspace/.git/config",
        "grep -q '\\[core\\]' /workspace/.git/config",
    ),
]

NETWORK = [
    Attempt(
        "net-direct-tcp",
        "network",
        "TCP straight to the allowed host IP, proxy variables unset",
        f"{UNSET_PROXY} {P} tcp {{host_ip}} {{http_port}}",
        VIA_PROXY_OK,
    ),
    Attempt(
        "net-no-proxy",
        "network",
        "GET the allowed host with NO_PROXY set (bypass the proxy)",
        f"NO_PROXY={{host_ip}} no_proxy={{host_ip}} {P} http http://{{host_ip}}:{{http_port}}{{mark}}",
        VIA_PROXY_OK,
    ),
    Attempt(
        "net-dns",
        "network",
        "resolve a public name (getaddrinfo)",
        f"{P} dns example.com",
        f"{P} dns localhost",
    ),
    Attempt(
        "net-udp-dns",
        "network",
        "UDP DNS query to 8.8.8.8:53",
        f"{P} udp 8.8.8.8 53",
        f"{P} udp-self",
    ),
    Attempt(
        "net-ipv6-host",
        "network",
        "TCP to the host's IPv6 address (fd00::2)",
        f"{P} tcp fd00::2 {{v6_port}}",
        f"{P} tcp 127.0.0.1 3128",
    ),
    Attempt(
        "net-ipv6-loopback",
        "network",
        "TCP to a host service on [::1]",
        f"{P} tcp ::1 {{loop6_port}}",
        f"{P} tcp 127.0.0.1 3129",
    ),
    Attempt(
        "net-raw",
        "network",
        "open a SOCK_RAW socket",
        f"{P} raw",
        f"{P} udp-self",
    ),
    Attempt(
        "net-packet",
        "network",
        "open an AF_PACKET socket",
        f"{P} packet",
        f"{P} udp-self",
    ),
    Attempt(
        "net-loopback-direct",
        "network",
        "TCP to a host service bound to 127.0.0.1",
        f"{P} tcp 127.0.0.1 {{loop_port}}",
        f"{P} tcp 127.0.0.1 3128",
    ),
    Attempt(
        "net-abstract-unix",
        "network",
        "connect to a host abstract Unix socket",
        f"{P} unix @{{abstract}}",
        f"{P} unix-own @so-probe-control",
    ),
    Attempt(
        "net-loopback-connect",
        "network",
        "CONNECT 127.0.0.1:<host service> through the proxy",
        f"{P} connect 127.0.0.1:{{loop_port}} --path {{mark}}",
        CONNECT_OK,
        denied="127.0.0.1:{loop_port}",
    ),
    Attempt(
        "net-loopback-get",
        "network",
        "GET http://127.0.0.1:<host service>/ through the proxy",
        f"{P} proxy-get http://127.0.0.1:{{loop_port}}{{mark}}",
        GET_OK,
        denied="127.0.0.1:{loop_port}",
    ),
    Attempt(
        "net-localhost-open",
        "network",
        "CONNECT localhost:<host service> through the proxy",
        f"{P} connect localhost:{{loop_port}} --path {{mark}}",
        CONNECT_OK,
        policy="open",
        denied="localhost:{loop_port}",
    ),
    Attempt(
        "net-metadata",
        "network",
        "GET http://169.254.169.254/ (cloud metadata) through the proxy",
        f"{P} proxy-get http://169.254.169.254{{mark}}",
        GET_OK,
        denied="169.254.169.254:80",
    ),
    Attempt(
        "net-metadata-name",
        "network",
        "GET http://metadata.google.internal/ through the proxy",
        f"{P} proxy-get http://metadata.google.internal{{mark}}",
        GET_OK,
        policy="open",
        denied="metadata.google.internal:80",
    ),
    _metadata("open", "169.254.169.254", "the metadata IP"),
    _metadata("int", "2852039166", "integer"),
    _metadata("octal", "0251.0376.0251.0376", "octal"),
    _metadata("mapped", "[::ffff:169.254.169.254]", "IPv4-mapped IPv6"),
    _metadata("dot", "169.254.169.254.", "trailing dot"),
    _spelling("int", "2130706433", "{loop_port}", "127.0.0.1 as an integer"),
    _spelling("octal", "0177.0.0.1", "{loop_port}", "octal"),
    _spelling("hex", "0x7f000001", "{loop_port}", "hex"),
    _spelling("short", "127.1", "{loop_port}", "short form"),
    _spelling("mapped", "[::ffff:127.0.0.1]", "{loop_port}", "IPv4-mapped IPv6"),
    _spelling("zero", "0.0.0.0", "{loop_port}", "0.0.0.0 reaches the host"),
    _spelling("bridge", "172.17.0.1", "{http_port}", "the docker0 bridge address"),
    Attempt(
        "net-denied-name",
        "network",
        "CONNECT a hostname that is not on the allowlist",
        f"{P} connect denied.example.com:443",
        CONNECT_OK,
        denied="denied.example.com:443",
    ),
    Attempt(
        "net-deny-listed",
        "network",
        "CONNECT a deny-listed name",
        f"{P} connect evil.blocked.test:443",
        CONNECT_OK,
        policy="open",
        denied="evil.blocked.test:443",
    ),
    Attempt(
        "net-host-header",
        "network",
        "absolute-form GET to the allowed host whose Host header names 127.0.0.1",
        f"{P} proxy-get http://{{host_ip}}:{{http_port}}{{mark}} --host 127.0.0.1:{{loop_port}}",
        GET_OK,
    ),
    Attempt(
        "net-connect-host-header",
        "network",
        "CONNECT to the allowed host with a Host header naming the metadata IP",
        f"{P} connect {{host_ip}}:{{http_port}} --host 169.254.169.254:80 --path {{mark}}",
        CONNECT_OK,
    ),
    Attempt(
        "net-origin-form",
        "network",
        "use the proxy as a web server: origin-form GET with Host: 127.0.0.1",
        f"{P} proxy-get http://127.0.0.1:{{loop_port}}{{mark}} --origin 1",
        GET_OK,
    ),
    Attempt(
        "net-gw-absolute",
        "network",
        "absolute-form request to the model gateway (use it as a proxy)",
        f"{P} gateway GET http://{{host_ip}}:{{http_port}}{{mark}} --marker ALLOWED-SERVER",
        GATEWAY_OK,
    ),
    Attempt(
        "net-gw-connect",
        "network",
        "CONNECT through the model gateway",
        f"{P} gateway CONNECT {{host_ip}}:{{http_port}} --marker ALLOWED-SERVER",
        GATEWAY_OK,
    ),
    Attempt(
        "net-gw-prefix",
        "network",
        "gateway path outside the route prefixes",
        f"{P} gateway GET {{mark}}",
        GATEWAY_OK,
    ),
    Attempt(
        "net-gw-host",
        "network",
        "gateway request whose Host header names the allowed host (must reach only the "
        "configured upstream)",
        f"{P} gateway GET /anthropic{{mark}} --host {{host_ip}}:{{http_port}} "
        "--marker ALLOWED-SERVER",
        GATEWAY_OK,
        reach=("upstream",),
    ),
]

SECRETS = [
    Attempt(
        "sec-env",
        "secrets",
        "find the real API key in the environment",
        f"{P} findkey {{rev_key}} env",
        f"{P} findkey {{rev_placeholder}} env",
    ),
    Attempt(
        "sec-proc",
        "secrets",
        "find the real API key in any readable /proc/*/environ or cmdline",
        f"{P} findkey {{rev_key}} proc",
        f"{P} findkey {{rev_placeholder}} proc",
    ),
    Attempt(
        "sec-ps",
        "secrets",
        "find the real API key in ps argv",
        f"{P} findkey {{rev_key}} ps",
        f"{P} findkey {{rev_probe}} ps",
    ),
    Attempt(
        "sec-files",
        "secrets",
        "after a model request, find the real key in any file under /home/agent, "
        "/workspace, /run/so, /tmp",
        f"{GATEWAY_OK} >/dev/null; "
        f"{P} findkey {{rev_key}} files:/home/agent files:/workspace files:/run/so files:/tmp",
        f"{P} findkey {{rev_project_marker}} files:/workspace",
    ),
    Attempt(
        "sec-logs",
        "secrets",
        "read the host-side network logs (usage.jsonl, denied.jsonl)",
        "cat {net_dir}/usage.jsonl || cat {net_dir}/denied.jsonl || "
        "cat /run/so/net/usage.jsonl || cat /run/so/net/denied.jsonl || "
        "cat /run/so/usage.jsonl || cat /run/so/denied.jsonl",
        "test -d /run/so/net/p",  # the socket dir is there; the logs are not
    ),
]

PROCESSES = [
    Attempt(
        "proc-kill0",
        "processes",
        "kill -0 the pytest process (host pid)",
        "kill -0 {host_pid}",
        "sleep 30 & p=$!; kill -0 $p; r=$?; kill $p; exit $r",
    ),
    Attempt(
        "proc-procfs",
        "processes",
        "/proc/<host pid> exists",
        "test -e /proc/{host_pid} || test -e /proc/{victim_pid}/cmdline",
        "test -e /proc/$$/cmdline",
    ),
    Attempt(
        "proc-ps",
        "processes",
        "ps -e shows a host process",
        "ps -eo args | grep -E '^{victim_re}$'",
        "ps -eo args | grep -E '^[p]s -eo args'",
    ),
    Attempt(
        "proc-signal",
        "processes",
        "SIGTERM a host process",
        "kill -TERM {victim_pid}",
        "sleep 30 & kill -TERM $!",
        check="victim_dead",
    ),
    Attempt(
        "proc-kill-all",
        "processes",
        "kill -9 -1 (every process the agent may signal)",
        "kill -9 -1",
        "sleep 30 & kill -9 $!",
        check="victim_dead",
    ),
    Attempt(
        "proc-ptrace",
        "processes",
        "PTRACE_ATTACH a host pid",
        f"{P} ptrace {{victim_pid}}",
        f"{P} ptrace-child",
    ),
    Attempt(
        "proc-strace",
        "processes",
        "strace -p a host pid",
        "timeout 3 strace -o /dev/null -p {victim_pid}; test $? -eq 124",
        "strace -o /dev/null true",
        backends=("bwrap",),  # no strace in the runner image
    ),
    Attempt(
        "proc-outlive",
        "processes",
        "leave a process running after the agent run ends",
        "setsid {stray} </dev/null >/dev/null 2>&1 &",
        "sleep 30 & p=$!; kill -0 $p && kill $p",
        check="stray_alive",
    ),
    Attempt(
        "proc-outlive-env",
        "processes",
        "leave a process running after the run, started with a clean environment (env -i)",
        "env -i setsid {stray} </dev/null >/dev/null 2>&1 &",
        "sleep 30 & p=$!; kill -0 $p && kill $p",
        check="stray_alive",
    ),
]

PRIVILEGE = [
    Attempt(
        "priv-su",
        "privilege",
        "su to root (setuid helper)",
        "su root -c true </dev/null",
        'test "$(id -u)" = 1000',
    ),
    Attempt(
        "priv-setuid",
        "privilege",
        "setuid(0)",
        f"{P} setuid 0",
        f"{P} setuid 1000",
    ),
    Attempt(
        "priv-caps",
        "privilege",
        "hold any capability (effective, permitted, bounding, ambient)",
        f"{P} caps",
        "grep -q '^CapEff:' /proc/self/status",
    ),
    Attempt(
        "priv-nnp",
        "privilege",
        "setuid bits take effect (no_new_privs off)",
        "grep -Eq '^NoNewPrivs:[[:space:]]+0' /proc/self/status",
        "grep -q '^NoNewPrivs:' /proc/self/status",
    ),
    Attempt(
        "priv-mount-helper",
        "privilege",
        "mount -t tmpfs (setuid mount)",
        "mkdir -p /tmp/m && mount -t tmpfs none /tmp/m",
        "mkdir -p /tmp/m && touch /tmp/m/f",
    ),
    Attempt(
        "priv-mount",
        "privilege",
        "mount(2) a tmpfs",
        f"{P} mount /tmp/m2",
        "mkdir -p /tmp/m2 && touch /tmp/m2/f",
    ),
    Attempt(
        "priv-userns",
        "privilege",
        "unshare -U (create a user namespace)",
        "unshare -U true",
        "unshare --version >/dev/null",
    ),
    Attempt(
        "priv-userns-root",
        "privilege",
        "unshare -r (root in a new user namespace)",
        "unshare -r id -u",
        "unshare --version >/dev/null",
    ),
    Attempt(
        "priv-unshare-mnt",
        "privilege",
        "unshare(CLONE_NEWNS) without a user namespace",
        f"{P} unshare mount",
        "unshare --version >/dev/null",
    ),
    Attempt(
        "priv-mknod",
        "privilege",
        "mknod a block device",
        "mknod /tmp/sda b 8 0",
        "mknod /tmp/fifo p",
    ),
    Attempt(
        "priv-docker-sock",
        "privilege",
        "connect to the Docker / containerd socket",
        f"{P} unix /var/run/docker.sock || {P} unix /run/docker.sock || "
        f"{P} unix /run/containerd/containerd.sock",
        f"{P} unix-own /tmp/so-probe-control.sock",
    ),
    Attempt(
        "priv-dev-mem",
        "privilege",
        "read /dev/mem, /dev/kmem, /dev/port",
        "head -c1 /dev/mem >/dev/null || head -c1 /dev/kmem >/dev/null || "
        "head -c1 /dev/port >/dev/null",
        "head -c1 /dev/urandom >/dev/null",
    ),
    Attempt(
        "priv-block-dev",
        "privilege",
        "read a block device (the host disk)",
        "for d in /dev/vda /dev/sda /dev/nvme0n1 /dev/xvda /dev/dm-0 /dev/loop0; do "
        "head -c1 $d >/dev/null 2>&1 && exit 0; done; exit 1",
        "head -c1 /dev/zero >/dev/null",
    ),
    Attempt(
        "priv-proc-sys",
        "privilege",
        "write a host sysctl (fs.protected_symlinks, its own value back: no change)",
        _write_back("/proc/sys/fs/protected_symlinks"),
        WRITE_PROC_OK,
    ),
    Attempt(
        "priv-core-pattern",
        "privilege",
        "write kernel.core_pattern (its own value back: no change; a pipe there runs a "
        "program as host root on the next crash)",
        _write_back("/proc/sys/kernel/core_pattern"),
        WRITE_PROC_OK,
    ),
    Attempt(
        "priv-sysrq",
        "privilege",
        "open /proc/sysrq-trigger for writing (nothing written)",
        ": > /proc/sysrq-trigger",
        WRITE_PROC_OK,
    ),
    Attempt(
        "priv-cgroup",
        "privilege",
        "write the cgroup tree (move out, release_agent)",
        "echo $$ > /sys/fs/cgroup/cgroup.procs || echo $$ > /sys/fs/cgroup/memory/cgroup.procs "
        "|| echo /tmp/x > /sys/fs/cgroup/memory/release_agent || mkdir /sys/fs/cgroup/pids/so",
        "cat /proc/self/cgroup",
    ),
    Attempt(
        "priv-chroot",
        "privilege",
        "chroot",
        f"{P} chroot /tmp",
        "chroot --version >/dev/null",
    ),
]

FORK_BOMB = (
    ": {tag}; f() {{ f | f & }}; f 2>/dev/null; sleep 3; "
    'n=$(ls -d /proc/[0-9]* | wc -l); echo "$n processes"; test "$n" -gt 200'
)
MEMORY_HOG = (
    "python3 -c 'b = bytearray(2 << 30); b[::4096] = b\"x\" * len(b[::4096]); print(len(b))'"
)
DISK_FILL = (
    ": {tag}; head -c 1G /dev/zero > /workspace/so-fill; "
    "s=$(stat -c %s /workspace/so-fill); rm -f /workspace/so-fill; "
    'echo "$s bytes"; test "$s" -ge 1073741824'
)

# Fill the pids limit with sleepers that stay (a bomb that does not churn).
PIDS_FILL = ": {tag}; i=0; while [ $i -lt 100 ]; do {fill} & i=$((i+1)); done 2>/dev/null; wait"

RESOURCES = [
    Attempt(
        "res-pids-fill",
        "resources",
        "fill pids=64 with sleeping processes: is everything killed when the run is?",
        PIDS_FILL,
        "for i in $(seq 16); do sleep 0.5 & done; wait",
        check="leftovers",
        timeout=60,
    ),
    Attempt(
        "res-fork-bomb",
        "resources",
        "fork bomb under pids=64 (success: more than 200 processes)",
        FORK_BOMB,
        "for i in $(seq 16); do sleep 0.5 & done; wait",
        timeout=60,
    ),
    Attempt(
        "res-memory",
        "resources",
        "touch 2 GiB under memory=256 MiB",
        MEMORY_HOG,
        "python3 -c 'b = bytearray(32 << 20); print(len(b))'",
        timeout=60,
    ),
    Attempt(
        "res-disk",
        "resources",
        "write 1 GiB into the workspace under disk=50 MiB",
        DISK_FILL,
        "head -c 8M /dev/zero > /workspace/so-fill && rm /workspace/so-fill",
        timeout=60,
    ),
]

ATTEMPTS: list[Attempt] = [*HOST_FILES, *GIT, *NETWORK, *SECRETS, *PROCESSES, *PRIVILEGE]
ALL: list[Attempt] = [*ATTEMPTS, *RESOURCES]

assert len({a.id for a in ALL}) == len(ALL), "attempt ids must be unique"
