"""Credentials out of everything the sandbox gets: variables, config objects, files.

Harnesses replace the credentials they model (model keys, logins) with placeholders. This
module is the class-level net under that: whatever else a user's environment, an agent's
config or a copied file holds is checked by **name** (a variable or key named like a
credential: ``*_API_KEY``, ``*_TOKEN``, ``*_KEY``, ``*_PASSWORD``, ``*_PASSPHRASE``,
``apiKey``, ``authorization``…) and by **shape** (a credential inside any text: a
``Bearer``/``Basic`` value, the password of a URL's userinfo, a key or token in a URL's
query, the well-known token formats of the vendors, and every credential value the host
knows of), and replaced by :data:`sono.net.upstream.PLACEHOLDER`. Values that already are
placeholders are left as they are (some CLIs check a placeholder's shape).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sono.net.upstream import PLACEHOLDER

MIN_SECRET = 8  # shorter known values are not looked for inside text
MAX_FILE = 8 << 20  # larger files are left to the name rules of their writers
# Variables that only carry headers (``ANTHROPIC_CUSTOM_HEADERS``, ``OTEL_EXPORTER_OTLP_
# HEADERS``): dropped, a placeholder would not parse as headers.
HEADER_VAR_RE = re.compile(r"_HEADERS?$", re.IGNORECASE)
_NAME_RE = re.compile(
    r"(api_?key|(^|_)key|token|secret|passw(or)?d|(^|_)pass|(^|_)pwd|passphrase|"
    r"credentials?|authorization|(^|_)auth|cookie|private_?key)$"
)
_NOT_SECRET_NAME_RE = re.compile(r"(^|_)(env_key|key_?id|public_?key|max_\w*token|tokens)$")
# Text that is a credential whatever its name.
_SHAPES = (
    re.compile(r"(?i)(\b(?:Bearer|Basic|Token)\s+)([A-Za-z0-9._~+/=-]{8,})"),  # auth schemes
    re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s/:@\"']*:)([^\s@/\"']+)(@)"),  # URL userinfo password
    re.compile(
        r"(?i)([?&](?:api[_-]?key|key|token|access_token|auth|sig|signature|password)=)"
        r"([^&\s\"'#]{6,})"
    ),
    re.compile(
        r"()\b(sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|"
        r"glpat-[A-Za-z0-9_-]{16,}|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|"
        r"AIza[0-9A-Za-z_-]{30,}|hf_[A-Za-z0-9]{30,}|npm_[A-Za-z0-9]{30,})"
    ),
)
_FLAG_RE = re.compile(r"(?i)^--?(api[-_]?key|token|password|passwd|secret|auth|access[-_]token)$")
_FLAG_VALUE_RE = re.compile(
    r"(?i)^(--?(?:api[-_]?key|token|password|secret|access[-_]token)=)(.+)$"
)


def snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).replace("-", "_").lower()


def is_credential_name(name: str) -> bool:
    """A variable or config key named like a credential (``OPENAI_API_KEY``, ``MY_LLM_KEY``,
    ``GITHUB_TOKEN``, ``apiKey``, ``clientSecret``, ``DB_PASSWORD``, ``authorization``)."""
    plain = snake(name)
    return bool(_NAME_RE.search(plain)) and not _NOT_SECRET_NAME_RE.search(plain)


def _placeholder(value: str) -> bool:
    return "placeholder" in value


def scrub_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every known secret and every credential-shaped part replaced."""
    for secret in sorted({s for s in secrets if len(s) >= MIN_SECRET}, key=len, reverse=True):
        text = text.replace(secret, PLACEHOLDER)

    def keep_or_hide(match: re.Match[str]) -> str:
        value = match.group(2)
        if _placeholder(value) or value == PLACEHOLDER:
            return match.group(0)
        tail = match.group(3) if match.re.groups >= 3 else ""
        return f"{match.group(1)}{PLACEHOLDER}{tail}"

    for shape in _SHAPES:
        text = shape.sub(keep_or_hide, text)
    return text


def scrub_env(env: Mapping[str, str], secrets: Iterable[str] = ()) -> dict[str, str]:
    """Variables for the sandbox: credential-named ones (non-empty) a placeholder,
    header-only ones dropped, every other value scrubbed by shape and known value."""
    known = tuple(secrets)
    out: dict[str, str] = {}
    for name, value in env.items():
        if HEADER_VAR_RE.search(name) and value:
            continue
        if value and is_credential_name(name) and not _placeholder(value):
            out[name] = PLACEHOLDER
        else:
            out[name] = scrub_text(value, known)
    return out


def scrub_json(value: Any, secrets: Iterable[str] = (), *, key: str = "") -> Any:
    """A config subtree (an MCP server table, an ``env`` table) for the sandbox: strings
    under credential-named keys and every header value a placeholder, argv flags that take
    a secret (``--token X``, ``--api-key=X``) too, the rest scrubbed by shape."""
    known = tuple(secrets)
    if isinstance(value, Mapping):
        headers = snake(key).endswith("headers")
        out: dict[str, Any] = {}
        for k, v in value.items():
            hidden = isinstance(v, str) and v and not _placeholder(v)
            if hidden and (headers or is_credential_name(str(k))):
                out[k] = PLACEHOLDER
            else:
                out[k] = scrub_json(v, known, key=str(k))
        return out
    if isinstance(value, list):
        items: list[Any] = []
        secret_next = False
        for item in value:
            if isinstance(item, str) and secret_next and not _placeholder(item):
                items.append(PLACEHOLDER)
            elif isinstance(item, str) and (m := _FLAG_VALUE_RE.match(item)):
                items.append(m.group(1) + PLACEHOLDER)
            else:
                items.append(scrub_json(item, known, key=key))
            secret_next = isinstance(item, str) and bool(_FLAG_RE.match(item))
        return items
    if isinstance(value, str):
        return scrub_text(value, known)
    return value


def scrub_tree(root: Path, secrets: Iterable[str] = ()) -> list[str]:
    """Every regular file below ``root`` (the sandbox's home seed) scrubbed in place by
    shape and known value; returns the files it changed (relative). Links are never
    followed; files over :data:`MAX_FILE` only get the known values replaced."""
    known = tuple(s for s in set(secrets) if len(s) >= MIN_SECRET)
    changed: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not Path(dirpath, d).is_symlink()]
        for name in filenames:
            path = Path(dirpath, name)
            with contextlib.suppress(OSError):
                if path.is_symlink() or not path.is_file():
                    continue
                data = path.read_bytes()
                new = _scrub_bytes(data, known)
                if new != data:
                    path.write_bytes(new)
                    changed.append(str(path.relative_to(root)))
    return changed


def _scrub_bytes(data: bytes, known: tuple[str, ...]) -> bytes:
    if len(data) <= MAX_FILE:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            return scrub_text(text, known).encode("utf-8")
    for secret in sorted(known, key=len, reverse=True):
        data = data.replace(secret.encode(), PLACEHOLDER.encode())
    return data
