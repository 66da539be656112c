"""`headscope serve` is reachable only with its token (issue #29): a real server on 127.0.0.1
and a real HTTP/websocket client (aiohttp). Without the token every request is refused (403),
a websocket from another origin is refused, the sessions are capped with a page that says
so, and an app that cannot start shows its error in the browser. The same in a real browser:
tests/e2e/test_serve_browser.py."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from headscope.tui.cli.main import main
from tests.e2e.test_serve import free_port
from tests.e2e.test_serve_processes import REPO, TOKEN, _answers, alive, children, stop, wait_for

pytest.importorskip("textual_serve")
aiohttp = pytest.importorskip("aiohttp")


def _start(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "headscope.tui.cli.main", *argv], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[int, subprocess.Popen[str]]]:
    """One server, at most one session, with a known token."""
    port = free_port()
    proc = _start(["serve", "sample_models/attn-only-1l", "--port", str(port), "--token", TOKEN,
                   "--max-sessions", "1"])
    try:
        wait_for(lambda: _answers(port), "the server answers")
        yield port, proc
    finally:
        stop(proc)  # type: ignore[arg-type]
        for pid in children(proc.pid):
            stop_pid(pid)


def stop_pid(pid: int) -> None:
    import os
    import signal

    if alive(pid):
        os.kill(pid, signal.SIGKILL)


async def _get(url: str, **kwargs: object) -> tuple[int, str, object]:
    """GET ``url`` as a browser does: redirects followed, cookies kept (also for an IP host,
    which aiohttp's default jar refuses and browsers do not)."""
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as session, session.get(url, **kwargs) as response:
        return response.status, await response.text(), response.cookies


async def test_every_request_needs_the_token(server) -> None:
    port, _ = server
    base = f"http://127.0.0.1:{port}"
    for url in (f"{base}/", f"{base}/?token=wrong-token-0123456789", f"{base}/static/js/textual.js",
                f"{base}/download/x"):
        status, text, _ = await _get(url)
        assert status == 403, url
        assert "token" in text
    status, page, _ = await _get(f"{base}/?token={TOKEN}")
    assert status == 200 and "textual-terminal" in page
    status, _, cookies = await _get(f"{base}/?token={TOKEN}", allow_redirects=False)
    cookie = cookies[f"headscope-token-{port}"]  # type: ignore[index]
    assert cookie.value == TOKEN and cookie["httponly"] and cookie["samesite"] == "Strict"
    status, _, _ = await _get(f"{base}/static/js/textual.js",
                              cookies={f"headscope-token-{port}": TOKEN})
    assert status == 200  # the page's own requests carry the cookie


async def test_a_websocket_needs_the_token_and_the_page_s_origin(server) -> None:
    port, _ = server
    ws_url = f"http://127.0.0.1:{port}/ws"
    async with aiohttp.ClientSession() as session:
        for url, headers in ((f"{ws_url}?width=80&height=24", {}),
                             (f"{ws_url}?token={TOKEN}", {"Origin": "http://evil.example"}),
                             (f"{ws_url}?token={TOKEN}", {"Origin": f"http://127.0.0.1:{port + 1}"})):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await session.ws_connect(url, headers=headers)
            assert refused.value.status == 403


async def test_sessions_are_capped_with_a_message_in_the_page(server) -> None:
    port, proc = server
    before = children(proc.pid)
    async with aiohttp.ClientSession() as session:
        ws = await session.ws_connect(f"http://127.0.0.1:{port}/ws?token={TOKEN}&width=80&height=24",
                                      headers={"Origin": f"http://127.0.0.1:{port}"})
        try:
            status, page, _ = await _get(f"http://127.0.0.1:{port}/?token={TOKEN}")
            assert status == 503 and "Too many sessions" in page and "--max-sessions" in page
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await session.ws_connect(f"http://127.0.0.1:{port}/ws?token={TOKEN}")
            assert refused.value.status == 503
            assert len(children(proc.pid) - before) == 1  # one app process, not two
        finally:
            await ws.close()
    for _ in range(100):  # the slot frees when the session ends
        status, _, _ = await _get(f"http://127.0.0.1:{port}/?token={TOKEN}")
        if status == 200:
            break
        await asyncio.sleep(0.1)
    assert status == 200


def test_a_random_token_is_printed_in_the_url() -> None:
    port = free_port()
    proc = _start(["serve", "sample_models/attn-only-1l", "--port", str(port)])
    try:
        line = _line_with(proc, "token=", limit=60.0)
        found = re.search(r"(http://127\.0\.0\.1:\d+/\?token=([A-Za-z0-9_-]{32}))", line)
        assert found, line
        wait_for(lambda: _answers(port), "the server answers")
        assert asyncio.run(_get(found.group(1)))[0] == 200
        assert asyncio.run(_get(f"http://127.0.0.1:{port}/"))[0] == 403
    finally:
        stop(proc)  # type: ignore[arg-type]


def _line_with(proc: subprocess.Popen[str], text: str, limit: float) -> str:
    """The first line of ``proc``'s output holding ``text`` (read within ``limit`` seconds)."""
    import selectors
    import time

    assert proc.stdout is not None
    deadline = time.monotonic() + limit
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(timeout=deadline - time.monotonic()):
                line = proc.stdout.readline()
                if not line or text in line:
                    return line
    return ""


async def test_an_app_that_fails_to_start_shows_its_error_in_the_browser() -> None:
    """Before: the start tile again, with no message; only the server's log said why."""
    port = free_port()
    failing = (f"{sys.executable} -c \"import sys; sys.stderr.write('headscope: m.safetensors: "
               "\\x1b[31mbroken header\\n'); sys.exit(1)\"")
    code = ("import sys; from headscope.tui.cli.serve import serve; "
            f"serve(sys.argv[1], host='127.0.0.1', port={port}, title='t', token={TOKEN!r})")
    proc = subprocess.Popen([sys.executable, "-c", code, failing], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _answers(port), "the server answers")
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(f"http://127.0.0.1:{port}/ws?token={TOKEN}")
            shown = b""
            while b"broken header" not in shown:
                message = await asyncio.wait_for(ws.receive(), timeout=30)
                assert message.type == aiohttp.WSMsgType.BINARY, message
                shown += message.data
            await ws.close()
        text = shown.decode()
        assert "could not start" in text and "m.safetensors: ␛[31mbroken header" in text
    finally:
        stop(proc)  # type: ignore[arg-type]


def test_serve_checks_the_path_before_serving(capsys, tmp_path: Path) -> None:
    assert main(["serve", str(tmp_path / "nonexistent"), "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nonexistent: no such file or directory" in err
    (tmp_path / "empty").mkdir()
    assert main(["serve", str(tmp_path / "empty"), "--port", str(free_port())]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_allow_remote_needs_a_chosen_token(capsys, monkeypatch) -> None:
    monkeypatch.delenv("HEADSCOPE_TOKEN", raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--allow-remote"]) == 1
    err = capsys.readouterr().err
    assert "--token" in err and "HEADSCOPE_TOKEN" in err and err.count("\n") == 1
    assert main(["serve", "--host", "0.0.0.0", "--allow-remote", "--token", "short"]) == 1
    assert "at least 8" in capsys.readouterr().err
    monkeypatch.setenv("HEADSCOPE_TOKEN", "bad token with spaces")
    assert main(["serve", "--host", "0.0.0.0", "--allow-remote"]) == 1
    assert "without spaces" in capsys.readouterr().err
