"""``headscope serve``: textual-serve, with every app process accounted for.

textual-serve starts one app process per browser websocket (through ``sh -c``) and, when
the websocket closes, asks it to quit and waits. An app busy opening a model (torch import,
weights) may not answer for a long time, and stopping the server (Ctrl-C, SIGTERM) does not
stop the apps at all. Here each app runs in its own process group with the shell replaced by
the app (``exec``); a websocket that closes gives it ``GRACE`` seconds to quit, then the
group gets SIGTERM and, if still alive, SIGKILL; the server's shutdown does the same for
every app still running. See docs/internals.md (serve).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from asyncio.subprocess import Process
from typing import Any

from textual_serve import server as _server
from textual_serve.app_service import AppService
from textual_serve.server import Server

from headscope.engine.core.errors import InvalidRequestError

GRACE = 2.0  # seconds an app gets to quit by itself after its websocket closed
KILL_AFTER = 2.0  # seconds between SIGTERM and SIGKILL


LIVE: set[Process] = set()  # app processes not yet ended
SOCKETS: dict[Process, Any] = {}  # each live app's "close the browser's websocket"


class AppProcess(AppService):
    """One app process, in its own process group, stopped for sure."""

    async def _open_app_process(self, width: int = 80, height: int = 24) -> Process:
        environment = self._build_environment(width=width, height=height)
        self._process = process = await asyncio.create_subprocess_shell(
            "exec " + self.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=environment,
            start_new_session=True,
        )
        assert process.stdin is not None
        self._stdin = process.stdin
        LIVE.add(process)
        SOCKETS[process] = self.remote_close
        return process

    async def stop(self) -> None:
        process = self._process
        try:
            await asyncio.wait_for(super().stop(), timeout=GRACE)
        except (TimeoutError, ConnectionError, RuntimeError):
            pass
        finally:
            if process is not None:
                await end_process(process)
                if self._task is not None:
                    self._task.cancel()
                    self._task = None


async def end_process(process: Process) -> None:
    """SIGTERM the process's group, then SIGKILL it if it has not exited."""
    for sig, wait in ((signal.SIGTERM, KILL_AFTER), (signal.SIGKILL, KILL_AFTER)):
        if process.returncode is not None:
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), timeout=wait)
    LIVE.discard(process)
    SOCKETS.pop(process, None)


class HeadscopeServer(Server):
    async def on_shutdown(self, app: Any) -> None:
        # The browsers' websockets are closed too: an app that died before it was ready
        # leaves its websocket handler waiting on the browser, and aiohttp's shutdown would
        # wait for that handler (seen: 23 s after Ctrl-C on an app still opening its model).
        closers = [SOCKETS[p] for p in list(LIVE) if p in SOCKETS]
        await asyncio.gather(*(end_process(p) for p in list(LIVE)))
        for close in closers:
            with contextlib.suppress(Exception):
                await close()


def check_port(host: str, port: int) -> None:
    """A one-line error now if ``host:port`` cannot be bound (in use, not an address of this
    machine), instead of aiohttp's traceback after the banner. Bound the way aiohttp binds
    (``SO_REUSEADDR``), then released."""
    where = f"{host}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as err:
        reason = (err.strerror or str(err)).lower()
        raise InvalidRequestError(None, f"cannot serve on {where}: {reason}") from None


def serve(command: str, *, host: str, port: int, title: str) -> None:
    """Serve ``command`` (one app per browser tab) until Ctrl-C / SIGTERM."""
    check_port(host, port)
    _server.AppService = AppProcess  # type: ignore[misc]  # the server builds AppService by name
    try:
        HeadscopeServer(command, host=host, port=port, title=title).serve()
    except OSError as err:  # taken between the check and the bind
        reason = (err.strerror or str(err)).lower()
        raise InvalidRequestError(None, f"cannot serve on {host}:{port}: {reason}") from None
