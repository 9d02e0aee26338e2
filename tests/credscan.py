"""Look for real credentials inside a running sandbox, from the agent's own seat.

A test gives each real credential a marker (:func:`real_token`) that no placeholder
contains, and puts :func:`scan_step` into the project's ``<so-script>``: the scripted model
server has the agent run it as a tool call while the agent is alive, so the scan sees what
the agent could — every readable file (its home, the workspace, /tmp, /etc, /run; not the
host's read-only system dirs such as /usr and /opt, or the CLIs' installed packages) and
every process's ``/proc/*/environ`` and ``/proc/*/cmdline``. The marker is never written out
whole in the step (it is glued together by the shell), so the prompt that carries the step
cannot be a hit itself. The step writes what it found to ``credscan.txt`` in the workspace
and commits it; :func:`findings` reads it back.
"""

from __future__ import annotations

import secrets

MARKER = "SOREALCRED"  # only real credentials carry it; placeholders never do
RESULT = "credscan.txt"


def real_token(prefix: str = "sk-") -> str:
    """A credential value that :func:`scan_step` recognises anywhere."""
    return f"{prefix}{MARKER}{secrets.token_hex(8)}"


def scan_step(commit: bool = True) -> str:
    """Shell for a ``<so-script>`` step: scan, write :data:`RESULT`, commit it."""
    half = len(MARKER) // 2
    script = (
        f'needle="{MARKER[:half]}""{MARKER[half:]}"; '
        f"out={RESULT}; : > $out; "
        # files: everything readable but the kernel's pseudo file systems, the host's
        # read-only system dirs and installed packages (the agent CLIs' node_modules)
        "find / \\( -path /proc -o -path /sys -o -path /dev -o -path /usr -o -path /opt "
        "-o -path /lib -o -path /lib64 -o -path /bin -o -path /sbin "
        "-o -name node_modules \\) -prune "
        '-o -type f -print0 2>/dev/null | xargs -0 grep -lsF -e "$needle" 2>/dev/null '
        '| grep -v "/$out$" | sed "s/^/file /" >> $out; '
        # processes: environment and command line of every process we can see
        "for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do "
        'tr "\\0" "\\n" < "$f" 2>/dev/null | grep -qF -e "$needle" && echo "proc $f" >> $out; '
        "done; "
        'echo "scanned $(ls -d /proc/[0-9]* | wc -l) processes" >> $out'
    )
    if commit:
        script += f"; git add {RESULT} && git commit -q -m 'credential scan'"
    return script


def findings(text: str) -> list[str]:
    """The hits in a :data:`RESULT` file (the trailing count line is not one)."""
    return [line for line in text.splitlines() if line and not line.startswith("scanned ")]
