"""`headscope serve` in a real browser (issue #29): headless Chromium driven over the DevTools
protocol. The page is refused without the token and loads with it, a key press changes the
explorer's view, and closing the tab ends the app process.

Needs a ``chromium`` binary (Debian's package; `.ci/run` installs it); skipped only when
there is none. The terminal is drawn on a canvas (xterm.js's WebGL renderer), so what the
explorer shows is read from the websocket frames the page receives (``Network`` events):
the terminal output the app sent to the browser.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.e2e.test_serve import free_port
from tests.e2e.test_serve_processes import REPO, TOKEN, _answers, alive, children, stop, wait_for

pytest.importorskip("textual_serve")
aiohttp = pytest.importorskip("aiohttp")

CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"),
                             "/usr/bin/chromium") if p and os.access(p, os.X_OK)), None)
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium; "
                       ".ci/run installs it)"),
    pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc"),
]
LIMIT = 90.0  # every wait is bounded by this (seconds)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,800", "--remote-debugging-port=0"]


class DevTools:
    """One flat DevTools session: commands to the browser or to an attached page."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.ws:
            data = json.loads(message.data)
            if "id" in data and data["id"] in self.pending:
                self.pending.pop(data["id"]).set_result(data)
            else:
                self.events.append(data)

    async def send(self, method: str, session: str | None = None, **params: Any) -> Any:
        self.next_id += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = future
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        await self.ws.send_str(json.dumps(message))
        reply = await asyncio.wait_for(future, LIMIT)
        assert "error" not in reply, (method, reply)
        return reply["result"]

    async def evaluate(self, session: str, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", session, expression=expression,
                                 returnByValue=True)
        return result["result"].get("value")

    def received(self) -> str:
        """Everything the page's websockets received so far, as text (the terminal stream)."""
        out = []
        for event in self.events:
            if event.get("method") == "Network.webSocketFrameReceived":
                frame = event["params"]["response"]
                data = frame["payloadData"]
                out.append(base64.b64decode(data).decode("utf-8", "replace")
                           if frame["opcode"] == 2 else data)
        return "".join(out)


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[DevTools]:
    profile = tempfile.mkdtemp(prefix="headscope-chromium-")
    proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        url = await asyncio.to_thread(_devtools_url, proc)
        async with aiohttp.ClientSession() as http, http.ws_connect(url, max_msg_size=0) as ws:
            tools = DevTools(ws)
            try:
                yield tools
            finally:
                tools.reader.cancel()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        shutil.rmtree(profile, ignore_errors=True)


def _devtools_url(proc: subprocess.Popen[str]) -> str:
    assert proc.stderr is not None
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        found = re.search(r"DevTools listening on (ws://\S+)", line)
        if found:
            return found.group(1)
    pytest.fail("chromium did not start its DevTools endpoint")


async def until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline:
        if await condition():
            return
        await asyncio.sleep(0.2)
    pytest.fail(f"never happened within {LIMIT:.0f} s: {what}")


async def press(tools: DevTools, session: str, key: str) -> None:
    for kind in ("keyDown", "keyUp"):
        params: dict[str, Any] = {"type": kind, "key": key, "code": f"Digit{key}",
                                  "windowsVirtualKeyCode": ord(key)}
        if kind == "keyDown":
            params["text"] = key
        await tools.send("Input.dispatchKeyEvent", session, **params)


@pytest.mark.timeout(300)
async def test_the_explorer_in_a_real_browser() -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "headscope.tui.cli.main", "serve", "sample_models/attn-only-1l",
         "--port", str(port), "--token", TOKEN], cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    apps: set[int] = set()
    try:
        wait_for(lambda: _answers(port), "the server answers")
        async with chromium() as tools:
            targets = await tools.send("Target.getTargets")
            page = next(t for t in targets["targetInfos"] if t["type"] == "page")
            attached = await tools.send("Target.attachToTarget", targetId=page["targetId"],
                                        flatten=True)
            session = attached["sessionId"]
            for domain in ("Page.enable", "Network.enable", "Runtime.enable"):
                await tools.send(domain, session)

            # without the token: refused, and no app started
            await tools.send("Page.navigate", session, url=f"http://127.0.0.1:{port}/")
            await until(lambda: tools.evaluate(session, "document.readyState == 'complete' && "
                                               "document.body.innerText"), "the refusal page")
            text = await tools.evaluate(session, "document.body.innerText")
            assert "403" in text and "token" in text
            assert not children(server.pid)

            # with it, opened as `localhost` (not the bind address: the page's websocket
            # used to point at 127.0.0.1, another origin, and the explorer never started):
            # the explorer, drawn in the page
            origin = f"localhost:{port}"
            first = len(tools.events)
            await tools.send("Page.navigate", session, url=f"http://{origin}/?token={TOKEN}")
            await until(lambda: tools.evaluate(
                session, "document.body.classList.contains('-first-byte')"), "the app's first frame")
            apps = children(server.pid)
            assert len(apps) == 1
            # the token went to a cookie: the address bar holds the clean URL; and the page
            # asked nothing of any other host (Google Fonts, before)
            assert await tools.evaluate(session, "window.location.href") == f"http://{origin}/"
            asked = [e["params"]["request"]["url"] if "request" in e["params"] else e["params"]["url"]
                     for e in tools.events[first:]
                     if e.get("method") in ("Network.requestWillBeSent", "Network.webSocketCreated")]
            # (the refusal page's late favicon request may land after `first`: same server, as
            # 127.0.0.1; on a busy box it did)
            hosts = {urlsplit(u).netloc for u in asked if not u.startswith("data:")}
            assert origin in hosts and hosts <= {origin, f"127.0.0.1:{port}"}, asked
            await until(lambda: _async("token QK" in tools.received()), "the QK tab on screen")
            await asyncio.sleep(1.0)  # let the first screen settle

            # a key press changes the view: 6 = the Summary tab, with its ablation hint
            marker = "zero-ablate every head"
            assert marker not in tools.received()
            await tools.evaluate(session, "document.querySelector('.xterm-helper-textarea').focus()")
            await press(tools, session, "6")
            await until(lambda: _async(marker in tools.received()), "the Summary tab after 6")

            # closing the tab ends the app process
            await tools.send("Target.closeTarget", targetId=page["targetId"])
            deadline = time.monotonic() + LIMIT
            while time.monotonic() < deadline and any(alive(p) for p in apps):
                await asyncio.sleep(0.2)
            assert not any(alive(p) for p in apps), "the app outlived its tab"
            assert server.poll() is None
    finally:
        stop(server)  # type: ignore[arg-type]
        for pid in apps:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


async def _async(value: Any) -> Any:
    return value
