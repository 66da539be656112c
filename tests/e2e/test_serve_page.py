"""`headscope serve`'s page and its hardening (issue 39 §2 items 3, 5, 9 and the access log and
fonts): a real server on loopback and a real HTTP/websocket client (aiohttp).

- The page's websocket and static URLs come from the request (the Host the browser used),
  not from the bind address: `--host ::1` printed `http://::1:PORT` and its page pointed at
  `ws://::1:PORT`; through a tunnel or as `localhost` the page connected to the wrong place.
- A browser's terminal size is bounded (20000×20000 grew one app to ~2 GB).
- The printed URL's token is URL-encoded (`+ # & %XX` answered 403).
- The token moves to a cookie with a redirect to the clean URL: the access log, the address
  bar and the Referer never hold it.
- The page makes no third-party request (it loaded Google Fonts)."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from urllib.parse import unquote, urlsplit

import pytest

from tests.e2e.test_serve import free_port
from tests.e2e.test_serve_access import _get, _line_with, _start, stop_pid
from tests.e2e.test_serve_processes import REPO, TOKEN, _answers, children, stop, wait_for

pytest.importorskip("textual_serve")
aiohttp = pytest.importorskip("aiohttp")

ODD_TOKEN = "a+b#c&d%41e=f/g?h"  # what `openssl rand -base64` and friends produce


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[int, subprocess.Popen[str]]]:
    port = free_port()
    proc = _start(["serve", "sample_models/attn-only-1l", "--port", str(port), "--token", TOKEN])
    try:
        wait_for(lambda: _answers(port), "the server answers")
        yield port, proc
    finally:
        stop(proc)  # type: ignore[arg-type]
        for pid in children(proc.pid):
            stop_pid(pid)


def cookie(port: int, token: str = TOKEN) -> dict[str, str]:
    return {f"headscope-token-{port}": token}


class Urls(HTMLParser):
    """Every URL the page loads or connects to (src, href, CSS url(), the websocket)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value and name in ("src", "href", "data-session-websocket-url"):
                self.urls.append(value)

    def handle_data(self, data: str) -> None:
        self.urls += re.findall(r"""url\(\s*["']?([^"')]+)""", data)


def page_urls(page: str) -> list[str]:
    parser = Urls()
    parser.feed(page)
    return parser.urls


async def test_the_page_s_urls_come_from_the_address_the_browser_used(server) -> None:
    """As opened through an SSH tunnel on another local port, or as `localhost`."""
    port, _ = server
    for host in (f"localhost:{port}", "localhost:9999", f"127.0.0.1:{port}"):
        status, page, _ = await _get(f"http://127.0.0.1:{port}/", cookies=cookie(port),
                                     headers={"Host": host})
        assert status == 200
        urls = page_urls(page)
        assert f"ws://{host}/ws" in urls, urls
        assert all(urlsplit(u).netloc in ("", host) for u in urls), urls


async def test_the_page_makes_no_third_party_request(server) -> None:
    port, _ = server
    status, page, _ = await _get(f"http://127.0.0.1:{port}/", cookies=cookie(port))
    urls = page_urls(page)
    assert status == 200 and "googleapis" not in page and "gstatic" not in page
    assert all(urlsplit(u).netloc in ("", f"127.0.0.1:{port}") for u in urls
               if not u.startswith("http://www.w3.org/")), urls
    fonts = [u for u in urls if u.endswith(".ttf")]
    assert fonts  # the terminal's font ("Roboto Mono" in textual.js) is served here
    for url in fonts:
        async with aiohttp.ClientSession(cookies=cookie(port)) as session, \
                session.get(f"http://127.0.0.1:{port}{url}") as response:
            assert response.status == 200 and (await response.read())[:4] == b"\x00\x01\x00\x00"


async def test_the_token_moves_to_a_cookie_and_the_address_to_the_clean_url(server) -> None:
    port, _ = server
    async with aiohttp.ClientSession() as session, \
            session.get(f"http://127.0.0.1:{port}/?token={TOKEN}&fontsize=14",
                        allow_redirects=False) as response:
        assert response.status == 303
        assert response.headers["Location"] == "/?fontsize=14"
        set_cookie = response.cookies[f"headscope-token-{port}"]
        assert set_cookie.value == TOKEN and set_cookie["httponly"] and set_cookie["samesite"] == "Strict"
    # the websocket authenticates by the cookie alone, as the page's does
    async with aiohttp.ClientSession(cookies=cookie(port)) as session:
        async with session.get(f"http://127.0.0.1:{port}/") as page:
            assert page.status == 200 and page.headers["Referrer-Policy"] == "no-referrer"
        ws = await session.ws_connect(f"http://127.0.0.1:{port}/ws?width=80&height=24",
                                      headers={"Origin": f"http://127.0.0.1:{port}"})
        await ws.close()


def test_the_access_log_never_records_the_token() -> None:
    port = free_port()
    proc = _start(["serve", "sample_models/attn-only-1l", "--port", str(port), "--token", TOKEN])
    try:
        wait_for(lambda: _answers(port), "the server answers")
        assert asyncio.run(_get(f"http://127.0.0.1:{port}/?token={TOKEN}"))[0] == 200
        assert asyncio.run(_get(f"http://127.0.0.1:{port}/static/css/xterm.css?token={TOKEN}"))[0] == 200
    finally:
        stop(proc)  # type: ignore[arg-type]
    log = proc.stdout.read()  # type: ignore[union-attr]
    assert "GET /?token=… HTTP" in " ".join(log.split())  # the requests were logged
    assert [line for line in log.splitlines() if TOKEN in line] == [
        f"headscope serve: open http://127.0.0.1:{port}/?token={TOKEN}"]  # the banner only


def test_a_token_with_url_characters_is_printed_url_encoded() -> None:
    port = free_port()
    proc = _start(["serve", "sample_models/attn-only-1l", "--port", str(port), "--token", ODD_TOKEN])
    try:
        line = _line_with(proc, "token=", limit=60.0)
        url = re.search(r"http://\S+", line).group(0)  # type: ignore[union-attr]
        assert unquote(url.split("?token=", 1)[1]) == ODD_TOKEN
        assert not set(url.split("?token=", 1)[1]) & set("+#&/?=")
        wait_for(lambda: _answers(port), "the server answers")
        assert asyncio.run(_get(url))[0] == 200
    finally:
        stop(proc)  # type: ignore[arg-type]


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_ipv6_loopback_prints_a_url_and_serves_a_page_that_connects() -> None:
    port = free_port()
    proc = _start(["serve", "sample_models/attn-only-1l", "--host", "::1", "--port", str(port),
                   "--token", TOKEN])
    try:
        line = _line_with(proc, "token=", limit=60.0)
        assert f"open http://[::1]:{port}/?token={TOKEN}" in line, line
        wait_for(lambda: _answers_v6(port), "the server answers on ::1")
        status, page, _ = asyncio.run(_get(f"http://[::1]:{port}/?token={TOKEN}"))
        assert status == 200 and f'data-session-websocket-url="ws://[::1]:{port}/ws"' in page
    finally:
        stop(proc)  # type: ignore[arg-type]


def _answers_v6(port: int) -> bool:
    try:
        with socket.create_connection(("::1", port), timeout=1):
            return True
    except OSError:
        return False


async def test_a_browser_s_terminal_size_is_bounded() -> None:
    """The app is started with at most MAX_COLUMNS × MAX_ROWS, however large the request."""
    from headscope.tui.cli.serve import MAX_COLUMNS, MAX_ROWS

    port = free_port()
    telling = (f"{sys.executable} -c \"import os, sys; sys.stderr.write('size ' + "
               "os.environ['COLUMNS'] + 'x' + os.environ['ROWS'] + ' end' + chr(10)); sys.exit(1)\"")
    code = ("import sys; from headscope.tui.cli.serve import serve; "
            f"serve(sys.argv[1], host='127.0.0.1', port={port}, title='t', token={TOKEN!r})")
    proc = subprocess.Popen([sys.executable, "-c", code, telling], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _answers(port), "the server answers")
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(
                f"http://127.0.0.1:{port}/ws?token={TOKEN}&width=20000&height=20000")
            shown = b""
            while b" end" not in shown:
                message = await asyncio.wait_for(ws.receive(), timeout=30)
                assert message.type == aiohttp.WSMsgType.BINARY, message
                shown += message.data
            await ws.close()
        assert f"size {MAX_COLUMNS}x{MAX_ROWS} end" in shown.decode()
    finally:
        stop(proc)  # type: ignore[arg-type]


async def test_a_resize_is_bounded_too() -> None:
    from headscope.tui.cli.serve import MAX_COLUMNS, MAX_ROWS, AppProcess

    sent: list[dict[str, object]] = []
    app = AppProcess.__new__(AppProcess)

    async def send_meta(data: dict[str, object]) -> bool:
        sent.append(data)
        return True

    app.send_meta = send_meta  # type: ignore[method-assign]
    await app.set_terminal_size(20000, 20000)
    await app.set_terminal_size(-5, 0)
    await app.set_terminal_size(120, 40)
    assert [(m["width"], m["height"]) for m in sent] == [(MAX_COLUMNS, MAX_ROWS), (1, 1), (120, 40)]


def test_the_printed_address_is_a_url_for_every_bind_address() -> None:
    """`--host ::1` printed `http://::1:PORT` (not a URL); `0.0.0.0` is no address to open."""
    from headscope.tui.cli.serve import HeadscopeServer, url_host

    assert url_host("::1") == "[::1]" and url_host("127.0.0.1") == "127.0.0.1"
    assert url_host("0.0.0.0") == url_host("::") == socket.gethostname()
    served = HeadscopeServer("true", host="::1", port=8123, title="t", token=ODD_TOKEN)
    assert served.url == "http://[::1]:8123/?token=a%2Bb%23c%26d%2541e%3Df%2Fg%3Fh"
    assert urlsplit(served.url).hostname == "::1" and urlsplit(served.url).port == 8123
