"""`headscope serve` leaves no app process behind: a real server on 127.0.0.1 and a real
websocket client (aiohttp), with the app processes found in /proc as the server's children."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_serve import free_port

REPO = Path(__file__).resolve().parents[2]
pytest.importorskip("textual_serve")
aiohttp = pytest.importorskip("aiohttp")
pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")


def children(pid: int) -> set[int]:
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(entry.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(condition, what: str, limit: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    pytest.fail(f"never happened within {limit:.0f} s: {what}")


TOKEN = "test-token-0123456789"


def start_server(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "headscope.tui.cli.main", "serve", "sample_models/attn-only-2l",
         "--port", str(port), "--token", TOKEN],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: _answers(port), "the server answers")
    return proc


def _answers(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


async def open_app(port: int, server: int) -> tuple[object, object, set[int]]:
    session = aiohttp.ClientSession()
    ws = await session.ws_connect(f"http://127.0.0.1:{port}/ws?token={TOKEN}&width=100&height=30")
    for _ in range(600):
        apps = children(server)
        if apps:
            return session, ws, apps
        await asyncio.sleep(0.1)
    pytest.fail("no app process started for the websocket")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


async def test_closing_the_websocket_ends_the_app() -> None:
    port = free_port()
    server = start_server(port)
    try:
        session, ws, apps = await open_app(port, server.pid)
        await asyncio.sleep(0.5)  # the app is still opening the model
        await ws.close()  # type: ignore[attr-defined]
        await session.close()  # type: ignore[attr-defined]
        for _ in range(300):
            if not any(alive(p) for p in apps):
                break
            await asyncio.sleep(0.1)
        assert not any(alive(p) for p in apps), "the app outlived its websocket"
        assert server.poll() is None  # the server itself keeps serving
    finally:
        stop(server)


async def test_stopping_the_server_ends_every_app() -> None:
    port = free_port()
    server = start_server(port)
    apps: set[int] = set()
    try:
        session, _ws, apps = await open_app(port, server.pid)
        server.send_signal(signal.SIGTERM)
        await asyncio.to_thread(server.wait, 30)
        for _ in range(100):
            if not any(alive(p) for p in apps):
                break
            await asyncio.sleep(0.1)
        assert not any(alive(p) for p in apps), "an app survived the server"
        await session.close()  # type: ignore[attr-defined]
    finally:
        stop(server)
        for pid in apps:  # never leave one behind, even when the test fails
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


STUBBORN = (f"{sys.executable} -c \"import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)\"")


def start_stubborn_server(port: int) -> subprocess.Popen[bytes]:
    """The serve machinery around an app that answers neither quit nor SIGTERM (as an app
    stuck opening a model does not answer quit)."""
    code = ("import sys; from headscope.tui.cli.serve import serve; "
            f"serve(sys.argv[1], host='127.0.0.1', port={port}, title='t', token={TOKEN!r})")
    proc = subprocess.Popen([sys.executable, "-c", code, STUBBORN], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: _answers(port), "the server answers")
    return proc


async def test_an_app_that_does_not_quit_is_ended_when_its_websocket_closes() -> None:
    port = free_port()
    server = start_stubborn_server(port)
    apps: set[int] = set()
    try:
        session, ws, apps = await open_app(port, server.pid)
        await ws.close()  # type: ignore[attr-defined]
        await session.close()  # type: ignore[attr-defined]
        for _ in range(300):
            if not any(alive(p) for p in apps):
                break
            await asyncio.sleep(0.1)
        assert not any(alive(p) for p in apps), "the stuck app outlived its websocket"
    finally:
        stop(server)
        for pid in apps:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


async def test_an_app_that_does_not_quit_is_ended_with_the_server() -> None:
    port = free_port()
    server = start_stubborn_server(port)
    apps: set[int] = set()
    try:
        session, _ws, apps = await open_app(port, server.pid)
        server.send_signal(signal.SIGINT)
        await asyncio.to_thread(server.wait, 30)
        assert not any(alive(p) for p in apps), "the stuck app survived the server"
        await session.close()  # type: ignore[attr-defined]
    finally:
        stop(server)
        for pid in apps:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
