"""``headscope serve``: textual-serve, with every app process accounted for.

textual-serve starts one app process per browser websocket (through ``sh -c``) and, when
the websocket closes, asks it to quit and waits. An app busy opening a model (torch import,
weights) may not answer for a long time, and stopping the server (Ctrl-C, SIGTERM) does not
stop the apps at all. Here each app runs in its own process group with the shell replaced by
the app (``exec``); a websocket that closes gives it ``GRACE`` seconds to quit, then the
group gets SIGTERM and, if still alive, SIGKILL; the server's shutdown does the same for
every app still running. See docs/internals.md (serve).

Access, as Jupyter does it: any web page the user has open could otherwise reach 127.0.0.1,
drive the explorer and read what it shows, and on a shared machine so could every local
user. So every request (page, websocket, static files, downloads) needs the server's token,
random per start unless ``--token``/``HEADSCOPE_TOKEN`` sets it: in the URL printed at start
(``?token=…``, URL-encoded). The page at that URL answers with the token as an HttpOnly,
SameSite=Strict cookie and a redirect to the clean URL, so the page's own requests and its
websocket carry the cookie, and the token stays out of the address bar, the Referer and the
access log (which also masks any ``token=`` a script sends). Anything else gets 403. The websocket must also come from the page's own origin (a browser always sends
``Origin``), and at most ``max_sessions`` apps run at once (each is a ~250 MB process): the
page says so when the cap is reached. An app that exits before its first frame (a model
that fails to open) shows its error in the browser instead of a blank start tile.

The page (templates/app_index.html) is built from the request, not from the bind address:
the websocket is at the Host the browser used (``[::1]``, ``localhost``, an SSH tunnel's
local port), the static files at relative URLs, and the terminal font is served here (no
Google Fonts). A browser's terminal size is bounded (``MAX_COLUMNS`` × ``MAX_ROWS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import html
import logging
import os
import re
import secrets
import signal
import socket
from asyncio.subprocess import Process
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp_jinja2
from aiohttp import web
from textual_serve import server as _server
from textual_serve.app_service import AppService
from textual_serve.server import Server

from headscope.engine.core.errors import InvalidRequestError
from headscope.tui.base.datatext import printable

GRACE = 2.0  # seconds an app gets to quit by itself after its websocket closed
KILL_AFTER = 2.0  # seconds between SIGTERM and SIGKILL
MAX_SESSIONS = 4  # app processes at once (~250 MB each)
ERROR_TAIL = 4000  # bytes of a failed app's stderr kept to show in the browser
# The largest terminal a browser may ask for, in cells: beyond any real window at any font
# size, and small enough that a session stays within its ~250 MB (20000×20000 grew one app
# to ~2 GB in 20 s, so --max-sessions bounded nothing).
MAX_COLUMNS, MAX_ROWS = 500, 200
TEMPLATES = Path(__file__).resolve().parent / "templates"  # the page, without Google Fonts
# A Host header as browsers send it: a name, an IPv4 or a [bracketed] IPv6 address, a port.
_HOST = re.compile(r"(?:[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")
_TOKEN_IN_URL = re.compile(r"(?<=[?&]token=)[^&\s\"]*")


LIVE: set[Process] = set()  # app processes not yet ended
SOCKETS: dict[Process, Any] = {}  # each live app's "close the browser's websocket"


def terminal_size(width: int, height: int) -> tuple[int, int]:
    """The browser's terminal size, within 1…``MAX_COLUMNS`` × 1…``MAX_ROWS`` cells."""
    return max(1, min(int(width), MAX_COLUMNS)), max(1, min(int(height), MAX_ROWS))


class AppProcess(AppService):
    """One app process, in its own process group, stopped for sure."""

    async def set_terminal_size(self, width: int, height: int) -> None:
        await super().set_terminal_size(*terminal_size(width, height))

    async def _open_app_process(self, width: int = 80, height: int = 24) -> Process:
        width, height = terminal_size(width, height)
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
        self._spoke = False  # the app has sent a frame (it started)
        self._stderr_tail = bytearray()
        if process.stderr is not None:  # what it says, kept for the browser if it fails
            process.stderr = _Tee(process.stderr, self._stderr_tail)  # type: ignore[assignment]
        LIVE.add(process)
        SOCKETS[process] = self.remote_close
        return process

    async def on_data(self, payload: bytes) -> None:
        self._spoke = True
        await super().on_data(payload)

    async def on_meta(self, data: bytes) -> None:
        self._spoke = True
        await super().on_meta(data)

    async def run(self) -> None:
        await super().run()
        process = self._process
        if getattr(self, "_spoke", True) or process is None:
            return
        # It ended before its first frame; textual-serve stopped reading its stderr when
        # stdout closed, so the rest of what it said is read here.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), timeout=GRACE)
        if process.returncode is None:
            return
        if isinstance(process.stderr, _Tee):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(process.stderr.read_rest(), timeout=1.0)
        await self._show_failure()

    async def _show_failure(self) -> None:
        """The app ended before its first frame: its error, in the browser's terminal."""
        said = bytes(self._stderr_tail).decode("utf-8", "replace").strip() or "(no message)"
        lines = [line for line in said.splitlines() if line.strip()][-20:]
        text = ("\x1b[2J\x1b[H\x1b[1;31mheadscope: the explorer could not start\x1b[0m\r\n\r\n"
                + "\r\n".join(printable(line) for line in lines)  # data, not terminal codes
                + "\r\n\r\n(close this tab; the server keeps running)\r\n")
        with contextlib.suppress(Exception):
            await self.remote_write_bytes(text.encode("utf-8"))

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


class _Tee:
    """An app's stderr stream that also keeps the last ``ERROR_TAIL`` bytes it gave."""

    def __init__(self, stream: asyncio.StreamReader, tail: bytearray) -> None:
        self._stream, self._tail = stream, tail

    async def read(self, n: int = -1) -> bytes:
        data = await self._stream.read(n)
        self._tail += data
        del self._tail[:-ERROR_TAIL]
        return data

    async def read_rest(self) -> None:
        while await self.read(1 << 12):
            pass


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
    """textual-serve's server behind a token, an Origin check and a cap on sessions; its page
    built from the request (the address the browser used), with no third-party request."""

    def __init__(self, command: str, *, host: str, port: int, title: str, token: str,
                 max_sessions: int = MAX_SESSIONS) -> None:
        super().__init__(command, host=host, port=port, title=title,
                         public_url=f"http://{url_host(host)}:{port}", templates_path=TEMPLATES)
        self.token = token
        self.max_sessions = max_sessions
        self.sessions = 0
        self.cookie = f"headscope-token-{port}"  # cookies are per host, not per port

    @property
    def url(self) -> str:
        """The address to open, with the token (URL-encoded: ``+ # & %`` would change it)."""
        return f"{self.public_url}/?token={quote(self.token, safe='')}"

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self._guard)
        app.on_response_prepare.append(_no_referrer)
        return app

    @aiohttp_jinja2.template("app_index.html")
    async def handle_index(self, request: web.Request) -> dict[str, Any]:
        """The page, its URLs from the request: the websocket at the address the browser used
        (its Host: ``[::1]``, ``localhost``, a tunnel's local port, the machine's name for
        ``0.0.0.0``), the static files relative to it. textual-serve builds both from the
        bind address (``ws://0.0.0.0``, ``ws://::1:8000``), and then the explorer never starts."""
        host = request.host if _HOST.fullmatch(request.host or "") else f"{url_host(self.host)}:{self.port}"
        scheme = "wss" if request.secure else "ws"
        size = request.query.get("fontsize", "16")
        return {
            "font_size": int(size) if size.isascii() and size.isdigit() and 0 < int(size) <= 64 else 16,
            "app_websocket_url": f"{scheme}://{host}/ws",
            "config": {"static": {"url": "/static/"}},
            "application": {"name": self.title},
        }

    def _has_token(self, request: web.Request) -> tuple[bool, bool]:
        """(authorised, by the URL's token): the URL's ``token`` or the page's cookie."""
        given = request.query.get("token")
        if given is not None and hmac.compare_digest(given.encode(), self.token.encode()):
            return True, True
        cookie = request.cookies.get(self.cookie)
        return cookie is not None and hmac.compare_digest(cookie.encode(), self.token.encode()), False

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        authorised, by_url = self._has_token(request)
        if not authorised:
            return _page(403, "This headscope server needs its token",
                         "Open the address <code>headscope serve</code> printed when it started "
                         "(it ends in <code>?token=…</code>).")
        if request.path == "/ws":
            origin = request.headers.get("Origin")
            if origin is not None and not same_origin(origin, request.host):
                return _page(403, "Cross-origin websocket refused",
                             "Only the explorer's own page may connect to it.")
            if self.sessions >= self.max_sessions:
                return _page(503, "Too many sessions", self._cap_text())
        elif request.path == "/" and self.sessions >= self.max_sessions:
            return _page(503, "Too many sessions", self._cap_text())
        if by_url and request.path == "/" and request.method == "GET":
            # The token moves to a cookie and the address bar to the clean URL, so the token
            # stays out of the history, of the Referer and of every later log line.
            rest = [(k, v) for k, v in request.query.items() if k != "token"]
            redirect = web.Response(status=303, headers={"Location": str(request.rel_url.with_query(rest))})
            redirect.set_cookie(self.cookie, self.token, httponly=True, samesite="Strict")
            return redirect
        return await handler(request)

    def _cap_text(self) -> str:
        return (f"{self.sessions} explorer sessions are open, the most this server runs at once "
                f"(each is a process of ~250 MB; <code>--max-sessions</code> sets it). Close a "
                "tab that shows headscope, wait a few seconds, then reload this page.")

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        self.sessions += 1
        try:
            return await super().handle_websocket(request)
        finally:
            self.sessions -= 1

    async def on_startup(self, app: Any) -> None:
        # Not textual-serve's banner: it renders the command (a path) as Rich markup.
        print(f"headscope serve: open {self.url}", flush=True)
        print("(the token in the address is the key to this server; Ctrl+C stops it)", flush=True)

    async def on_shutdown(self, app: Any) -> None:
        # The browsers' websockets are closed too: an app that died before it was ready
        # leaves its websocket handler waiting on the browser, and aiohttp's shutdown would
        # wait for that handler (seen: 23 s after Ctrl-C on an app still opening its model).
        closers = [SOCKETS[p] for p in list(LIVE) if p in SOCKETS]
        await asyncio.gather(*(end_process(p) for p in list(LIVE)))
        for close in closers:
            with contextlib.suppress(Exception):
                await close()


async def _no_referrer(request: web.Request, response: web.StreamResponse) -> None:
    """No page of the server sends a Referer (a link followed from the explorer)."""
    response.headers.setdefault("Referrer-Policy", "no-referrer")


class RedactToken(logging.Filter):
    """The access log's ``?token=…`` (the first request's, or a script's) as ``token=…``."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = _TOKEN_IN_URL.sub("…", str(record.msg))
        if record.args:
            record.args = tuple(_TOKEN_IN_URL.sub("…", a) if isinstance(a, str) else a
                                for a in record.args)  # type: ignore[union-attr]
        return True


def url_host(host: str) -> str:
    """``host`` as a URL writes it: an IPv6 address in brackets (``http://[::1]:8000``), and
    this machine's name for a wildcard bind (``0.0.0.0`` is no address to open)."""
    if host in ("0.0.0.0", "::", ""):
        return socket.gethostname()
    return f"[{host}]" if ":" in host else host


def same_origin(origin: str, host: str) -> bool:
    """Whether the ``Origin`` of a request is the server's own (``http://`` + its Host)."""
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


def _page(status: int, title: str, body: str) -> web.Response:
    """A small HTML page for a refusal (``title`` plain text, ``body`` trusted HTML)."""
    text = (f"<!DOCTYPE html><html><head><title>headscope: {html.escape(title)}</title></head>"
            f"<body style='background:#0c181f;color:#eee;font-family:monospace;padding:2em'>"
            f"<h1>{status}: {html.escape(title)}</h1><p>{body}</p></body></html>")
    return web.Response(status=status, text=text, content_type="text/html")


def new_token() -> str:
    """A random token (Jupyter's strength: 192 bits)."""
    return secrets.token_urlsafe(24)


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


def serve(command: str, *, host: str, port: int, title: str, token: str | None = None,
          max_sessions: int = MAX_SESSIONS) -> None:
    """Serve ``command`` (one app per browser tab) until Ctrl-C / SIGTERM; ``token``:
    the key every request needs (random if None)."""
    check_port(host, port)
    logging.getLogger("aiohttp.access").addFilter(RedactToken())
    _server.AppService = AppProcess  # type: ignore[misc]  # the server builds AppService by name
    try:
        HeadscopeServer(command, host=host, port=port, title=title, token=token or new_token(),
                        max_sessions=max_sessions).serve()
    except OSError as err:  # taken between the check and the bind
        reason = (err.strerror or str(err)).lower()
        raise InvalidRequestError(None, f"cannot serve on {host}:{port}: {reason}") from None
