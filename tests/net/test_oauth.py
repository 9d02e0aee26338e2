"""FileToken: a subscription login used and refreshed on the host, against a real local
token endpoint; the host CLI's login file stays valid."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sono.net.oauth import FileToken, Refresher, Tokens
from sono.net.upstream import CredentialError


class Format:
    """A login file shaped like Claude Code's: ``{"login": {access, refresh, expiresAt ms}}``."""

    def read(self, data: Mapping[str, Any]) -> Tokens | None:
        login = data.get("login")
        if not isinstance(login, dict) or not login.get("access"):
            return None
        return Tokens(login["access"], login.get("refresh"), login["expiresAt"] / 1000)

    def write(self, data: Mapping[str, Any], tokens: Tokens) -> dict[str, Any]:
        out = dict(data)
        out["login"] = {
            **data["login"],
            "access": tokens.access,
            "refresh": tokens.refresh,
            "expiresAt": int((tokens.expires_at or 0) * 1000),
        }
        return out


class TokenEndpoint:
    def __init__(self, status: int = 200) -> None:
        self.seen: list[dict[str, Any]] = []
        self.status = status
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.seen.append(body)
                answer = json.dumps(
                    {"access_token": "access-2", "refresh_token": "refresh-2", "expires_in": 3600}
                ).encode()
                self.send_response(owner.status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/token"

    def __enter__(self) -> TokenEndpoint:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()


@pytest.fixture
def endpoint() -> Iterator[TokenEndpoint]:
    with TokenEndpoint() as ep:
        yield ep


def _login(path: Path, *, expires_ms: int, extra: dict[str, Any] | None = None) -> None:
    data = {"login": {"access": "access-1", "refresh": "refresh-1", "expiresAt": expires_ms}}
    path.write_text(json.dumps({**data, **(extra or {})}))
    path.chmod(0o600)


def _token(path: Path, url: str, now: float) -> FileToken:
    refresher = Refresher(url, lambda r: {"grant_type": "refresh_token", "refresh_token": r})
    return FileToken(
        path,
        Format(),
        refresher,
        label="~/.x/login.json",
        login_hint="log in again with x",
        clock=lambda: now,
    )


def test_a_valid_token_is_read_from_the_file_without_refreshing(
    tmp_path: Path, endpoint: TokenEndpoint
) -> None:
    path = tmp_path / "login.json"
    _login(path, expires_ms=10_000_000)
    assert _token(path, endpoint.url, now=1000.0).token() == "access-1"
    assert endpoint.seen == []


def test_an_expiring_token_is_refreshed_on_the_host_and_written_back(
    tmp_path: Path, endpoint: TokenEndpoint
) -> None:
    path = tmp_path / "login.json"
    _login(path, expires_ms=1_100_000, extra={"other": "kept"})  # 100 s left: refresh
    token = _token(path, endpoint.url, now=1000.0)
    assert token.token() == "access-2"
    assert endpoint.seen == [{"grant_type": "refresh_token", "refresh_token": "refresh-1"}]
    saved = json.loads(path.read_text())
    assert saved["login"]["access"] == "access-2" and saved["login"]["refresh"] == "refresh-2"
    assert saved["other"] == "kept" and path.stat().st_mode & 0o777 == 0o600
    assert token.token() == "access-2" and len(endpoint.seen) == 1  # not again


def test_a_login_the_host_cli_refreshed_is_read_again(
    tmp_path: Path, endpoint: TokenEndpoint
) -> None:
    path = tmp_path / "login.json"
    _login(path, expires_ms=10_000_000)
    token = _token(path, endpoint.url, now=1000.0)
    assert token.token() == "access-1"
    path.write_text(
        json.dumps({"login": {"access": "access-new", "refresh": "r", "expiresAt": 20_000_000}})
    )
    assert token.token() == "access-new" and endpoint.seen == []


def test_a_refused_refresh_says_where_the_login_is_and_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "login.json"
    _login(path, expires_ms=0)
    with TokenEndpoint(status=400) as ep, pytest.raises(CredentialError) as err:
        _token(path, ep.url, now=1000.0).token()
    message = str(err.value)
    assert message == "~/.x/login.json: the token refresh was refused (400); log in again with x"
    assert "refresh-1" not in message
    assert json.loads(path.read_text())["login"]["access"] == "access-1"  # untouched


def test_a_missing_or_empty_login_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "login.json"
    with pytest.raises(CredentialError, match="the login file is gone; log in again"):
        _token(path, "http://127.0.0.1:9/", now=0).token()
    path.write_text("{}")
    with pytest.raises(CredentialError, match="holds no login"):
        _token(path, "http://127.0.0.1:9/", now=0).token()


def test_two_so_processes_refresh_a_login_once(tmp_path: Path, endpoint: TokenEndpoint) -> None:
    path = tmp_path / "login.json"
    _login(path, expires_ms=1_100_000)
    first, second = _token(path, endpoint.url, 1000.0), _token(path, endpoint.url, 1000.0)
    results: list[str] = []
    threads = [
        threading.Thread(target=lambda t=t: results.append(t.token())) for t in (first, second)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == ["access-2", "access-2"]
    assert len(endpoint.seen) == 1  # the second waited and read what the first wrote


def test_a_linked_login_file_stays_a_link_to_the_refreshed_file(
    tmp_path: Path, endpoint: TokenEndpoint
) -> None:
    real = tmp_path / "dotfiles" / "login.json"
    real.parent.mkdir()
    _login(real, expires_ms=0)
    link = tmp_path / "login.json"
    link.symlink_to(real)
    assert _token(link, endpoint.url, now=1000.0).token() == "access-2"
    assert link.is_symlink()
    assert json.loads(real.read_text())["login"]["refresh"] == "refresh-2"
