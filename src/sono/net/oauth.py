"""Subscription logins (OAuth) used from the host: the sandbox never holds the tokens.

An agent CLI logged in with a subscription keeps an access token, a refresh token and the
access token's expiry in a file under the user's home (``~/.claude/.credentials.json``,
``~/.codex/auth.json``, ``~/.local/share/opencode/auth.json``, ``~/.pi/agent/auth.json``).
:class:`FileToken` is the gateway's credential for such a login: it reads the host's file
when asked (again whenever the file changed — the host CLI may have refreshed it), and
when the access token is about to expire it refreshes it **on the host**, with the real
refresh token, at the vendor's token endpoint, and writes the new tokens back into the
same file the way the CLI does (atomically, mode 0600), so the host CLI stays logged in.
The formats differ per CLI: a :class:`TokenFormat` reads and writes one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sono.net.upstream import CredentialError

REFRESH_MARGIN_S = 300.0  # refresh this long before the access token expires
REFRESH_TIMEOUT_S = 30.0
MAX_FILE = 1 << 20


@dataclass(frozen=True)
class Tokens:
    access: str = field(repr=False)
    refresh: str | None = field(default=None, repr=False)
    expires_at: float | None = None  # epoch seconds; None: not known (never refreshed)
    # Other tokens a refresh answered with (``id_token``), for formats that keep them.
    extra: Mapping[str, str] = field(default_factory=dict, repr=False)


def tokens_of(access: object, refresh: object, expires_ms: object) -> Tokens | None:
    """Tokens from a login file's fields as most CLIs keep them (the expiry in epoch
    milliseconds); None without an access token."""
    if not isinstance(access, str) or not access:
        return None
    expires = expires_ms / 1000 if isinstance(expires_ms, int | float) and expires_ms > 0 else None
    return Tokens(access, refresh if isinstance(refresh, str) and refresh else None, expires)


class TokenFormat(Protocol):
    """One CLI's credential file."""

    def read(self, data: Mapping[str, Any]) -> Tokens | None:
        """The tokens in the parsed file, or None when it holds no login."""

    def write(self, data: Mapping[str, Any], tokens: Tokens) -> dict[str, Any]:
        """The file's content with ``tokens`` in place of the old ones."""


@dataclass(frozen=True)
class Refresher:
    """How the vendor refreshes a token: POST ``url`` with ``body(refresh_token)`` (sent
    as JSON, or form-encoded with ``form``); the answer's ``access_token``,
    ``refresh_token`` (kept when absent) and ``expires_in``."""

    url: str
    body: Callable[[str], dict[str, str]]
    form: bool = False

    def refresh(self, old: Tokens) -> Tokens:
        if not old.refresh:
            raise CredentialError("the login has no refresh token")
        fields = self.body(old.refresh)
        if self.form:
            data, kind = (
                urllib.parse.urlencode(fields).encode(),
                "application/x-www-form-urlencoded",
            )
        else:
            data, kind = json.dumps(fields).encode(), "application/json"
        request = urllib.request.Request(  # noqa: S310  a fixed https vendor endpoint
            self.url, data=data, method="POST", headers={"Content-Type": kind}
        )
        try:
            with urllib.request.urlopen(request, timeout=REFRESH_TIMEOUT_S) as answer:  # noqa: S310
                reply = json.loads(answer.read(MAX_FILE))
        except urllib.error.HTTPError as exc:
            raise CredentialError(f"the token refresh was refused ({exc.code})") from None
        except (OSError, ValueError) as exc:
            raise CredentialError(f"the token refresh failed: {exc}") from None
        access = reply.get("access_token") if isinstance(reply, dict) else None
        if not isinstance(access, str) or not access:
            raise CredentialError("the token refresh answered without an access token")
        refresh = reply.get("refresh_token")
        expires_in = reply.get("expires_in")
        extra = {
            k: v
            for k, v in reply.items()
            if k.endswith("_token")
            and k not in ("access_token", "refresh_token")
            and isinstance(v, str)
        }
        return Tokens(
            access,
            refresh if isinstance(refresh, str) and refresh else old.refresh,
            time.time() + expires_in if isinstance(expires_in, int | float) else None,
            extra,
        )


class FileToken:
    """A :class:`sono.net.upstream.TokenSource` over a host CLI's credential file."""

    def __init__(
        self,
        path: Path,
        fmt: TokenFormat,
        refresher: Refresher | None,
        *,
        label: str,
        login_hint: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.fmt = fmt
        self.refresher = refresher
        self.label = label  # "~/.claude/.credentials.json", for messages
        self.login_hint = login_hint  # "run `claude` on the host and /login"
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: tuple[int, int] | None = None
        self._tokens: Tokens | None = None

    def _due(self, tokens: Tokens) -> bool:
        expires = tokens.expires_at
        return expires is not None and expires - REFRESH_MARGIN_S < self._clock()

    def token(self) -> str:
        with self._lock:
            tokens = self._load()
            if not self._due(tokens):
                return tokens.access
            # One refresh at a time across so processes (a refresh token may be spent by
            # its first use): whoever waited reads what the other wrote.
            with self._file_lock():
                self._seen = None
                tokens = self._load()
                if not self._due(tokens):
                    return tokens.access
                if self.refresher is None or not tokens.refresh:
                    raise self._error("the login expired")
                try:
                    tokens = self.refresher.refresh(tokens)
                except CredentialError as exc:
                    raise self._error(str(exc)) from None
                self._store(tokens)
            return tokens.access

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        lock = self.path.parent / f".{self.path.name}.so-lock"
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError:
            yield  # a read-only home: no other so can write it either
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def known(self) -> tuple[str, ...]:
        """The tokens the file holds now (no refresh, no error): for scrubbing."""
        with self._lock:
            try:
                tokens = self._load()
            except CredentialError:
                return ()
            return tuple(t for t in (tokens.access, tokens.refresh, *tokens.extra.values()) if t)

    def _error(self, why: str) -> CredentialError:
        return CredentialError(f"{self.label}: {why}; {self.login_hint}")

    def _load(self) -> Tokens:
        try:
            st = self.path.stat()
        except OSError:
            raise self._error("the login file is gone") from None
        seen = (st.st_mtime_ns, st.st_size)
        if self._tokens is None or seen != self._seen:
            tokens = self.fmt.read(self._data())
            if tokens is None:
                raise self._error("the file holds no login")
            self._tokens, self._seen = tokens, seen
        return self._tokens

    def _data(self) -> dict[str, Any]:
        try:
            with self.path.open("rb") as fh:
                data = json.loads(fh.read(MAX_FILE))
        except (OSError, ValueError):
            raise self._error("the login file cannot be read") from None
        if not isinstance(data, dict):
            raise self._error("the login file is not a JSON object")
        return data

    def _store(self, tokens: Tokens) -> None:
        """Write the refreshed tokens back as the CLI would: the old refresh token may be
        spent now, so the host CLI must get the new one."""
        data = self.fmt.write(self._data(), tokens)
        target = self.path.resolve()  # a linked login file (dotfile managers) stays linked
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=".so-refresh-")
        tmp = Path(name)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh, indent=2)
            tmp.chmod(0o600)
            tmp.replace(target)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise self._error("the refreshed login could not be saved") from None
        st = self.path.stat()
        # As the format reads it back (it may know the expiry from the token itself).
        self._tokens = self.fmt.read(data) or tokens
        self._seen = (st.st_mtime_ns, st.st_size)
