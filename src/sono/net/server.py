"""The plumbing of so's host-side servers (the egress proxy and the model gateway).

:class:`UnixServer` listens on a Unix socket bound into the sandbox. Everything the
sandbox sends is hostile input, and these servers run in the host's ``so``: at most
:data:`MAX_CONNECTIONS` connections are served at once per server (more wait in the
kernel's backlog, and beyond it are refused), so a flood cannot use up the process's
descriptors, and a failed accept (out of descriptors) pauses accepting instead of ending
the server. :class:`ServerThread` runs a server on a private event loop in a daemon
thread for the synchronous orchestrator.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import socket
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self

from sono.net.http1 import MAX_HEAD

log = logging.getLogger("sono.net")

MAX_CONNECTIONS = 128
BACKLOG = 256
ACCEPT_PAUSE_S = 0.2  # after a failed accept (EMFILE, ENFILE, ENOBUFS): rest, then go on
CLOSE_GRACE_S = 5.0

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class UnixServer:
    """An asyncio server on a Unix socket (a stale socket file is replaced) serving at
    most :data:`MAX_CONNECTIONS` connections at once (the next ones wait in the backlog);
    each connection's reader is limited to :data:`~sono.net.http1.MAX_HEAD` bytes of
    look-ahead. On :meth:`close` open connections are cancelled and the socket is
    removed."""

    max_connections: int = MAX_CONNECTIONS

    def __init__(self, socket_path: Path | str) -> None:
        self.socket_path = Path(socket_path)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._listener: socket.socket | None = None
        self._acceptor: asyncio.Task[None] | None = None

    async def _listen(self, handle: Handler) -> None:
        if self.socket_path.is_socket():
            self.socket_path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(self.socket_path))
            listener.listen(BACKLOG)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._acceptor = asyncio.create_task(self._accept(listener, handle))

    async def _accept(self, listener: socket.socket, handle: Handler) -> None:
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self.max_connections)
        while True:
            await slots.acquire()
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS, ENOMEM, ECONNABORTED
                slots.release()
                log.warning("%s: accept failed (%s); pausing", self.socket_path.name, exc)
                await asyncio.sleep(ACCEPT_PAUSE_S)
                continue
            task = asyncio.create_task(self._connection(conn, handle))
            self._tasks.add(task)

            def done(task: asyncio.Task[None]) -> None:
                self._tasks.discard(task)
                slots.release()

            task.add_done_callback(done)

    @staticmethod
    async def _connection(conn: socket.socket, handle: Handler) -> None:
        # As asyncio.start_server does it: a protocol with a connected callback is the
        # server side (which StreamWriter.start_tls relies on).
        loop = asyncio.get_running_loop()
        connected: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
        connected = loop.create_future()
        protocol = asyncio.StreamReaderProtocol(
            asyncio.StreamReader(limit=MAX_HEAD, loop=loop),
            lambda reader, writer: connected.set_result((reader, writer)),
            loop=loop,
        )
        try:
            await loop.connect_accepted_socket(lambda: protocol, conn)
        except OSError:
            conn.close()
            return
        reader, writer = await connected
        try:
            await handle(reader, writer)
        except Exception as exc:
            # What the sandbox sent must never make so print a traceback (on the live
            # view's terminal) or keep the connection: one bounded debug line, closed.
            log.debug("connection ended by %s: %.200s", type(exc).__name__, exc)
            writer.transport.abort()

    async def close(self) -> None:
        listener, acceptor = self._listener, self._acceptor
        if listener is None or acceptor is None:
            return
        acceptor.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(acceptor, *self._tasks, return_exceptions=True)
        listener.close()
        self._listener = self._acceptor = None
        self.socket_path.unlink(missing_ok=True)


async def close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()


async def finish_writer(writer: asyncio.StreamWriter) -> None:
    """Close ``writer`` within :data:`CLOSE_GRACE_S` (TLS waits for the peer's
    close_notify), else abort it; abort at once when the current task is being
    cancelled (the server is closing)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        writer.transport.abort()
        return
    try:
        await asyncio.wait_for(close_writer(writer), CLOSE_GRACE_S)
    except TimeoutError:
        writer.transport.abort()


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def append_json_line(path: Path, record: dict[str, object]) -> None:
    """One line, written and flushed at once (readers may tail the file)."""
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")


# --- running on a thread ---------------------------------------------------------------------


class AsyncServer(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...


class ServerThread:
    """Runs an :class:`AsyncServer` on a private event loop in a daemon thread, for the
    synchronous orchestrator: ``with ProxyThread(...) as proxy: ...``."""

    def __init__(self, server: AsyncServer, name: str) -> None:
        self.server = server
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> Self:
        """Returns once the server listens; raises what its ``start()`` raised."""
        if self._thread is not None:
            return self
        ready = threading.Event()
        self._error = None
        thread = threading.Thread(target=self._run, args=(ready,), name=self._name, daemon=True)
        thread.start()
        ready.wait()
        if self._error is not None:
            thread.join()
            raise self._error
        self._thread = thread
        return self

    def stop(self, timeout: float = 10.0) -> None:
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        future = asyncio.run_coroutine_threadsafe(self.server.close(), loop)
        with contextlib.suppress(Exception):
            future.result(timeout)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        self._thread = None

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            try:
                loop.run_until_complete(self.server.start())
            except BaseException as exc:
                self._error = exc
                return
            finally:
                ready.set()
            loop.run_forever()
        finally:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            asyncio.set_event_loop(None)
            loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
