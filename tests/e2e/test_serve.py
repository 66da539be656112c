"""`headscope serve`: answers on loopback with the app page, refuses other hosts, stops cleanly."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from headscope.tui.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_answers_on_loopback_and_stops(gpt2_dir) -> None:
    pytest.importorskip("textual_serve")
    path, _ = gpt2_dir
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "headscope.tui.cli.main", "serve", str(path), "--port", str(port),
         "--token", "test-token-0123456789"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        deadline, page = time.monotonic() + 30, None
        # as a browser: the token's URL sets a cookie and redirects to the clean URL
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        while time.monotonic() < deadline and page is None:
            try:
                url = f"http://127.0.0.1:{port}/?token=test-token-0123456789"
                with browser.open(url, timeout=2) as response:
                    page = response.read().decode()
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode()
                time.sleep(0.2)
        assert page is not None, "server did not answer within 30 s"
        assert "headscope" in page and "<html" in page.lower()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("server did not stop on SIGINT")


def test_serve_refuses_non_loopback_without_flag(capsys) -> None:
    assert main(["serve", "--host", "0.0.0.0"]) == 1
    assert "--allow-remote" in capsys.readouterr().err


def test_serve_on_a_port_in_use_is_one_line(capsys) -> None:
    pytest.importorskip("textual_serve")
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port}" in err and "in use" in err and err.count("\n") == 1
