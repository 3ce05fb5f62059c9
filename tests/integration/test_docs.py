"""The documentation site builds with ``mkdocs build --strict``, and a person finds a key through its search
(headless Chromium, driven over the DevTools protocol)."""

import functools
import http.server
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
import websocket

from helpers import REPO

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The site built with --strict (a broken link or a page outside the nav fails it), served on localhost."""
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "docs/mkdocs.yml"), "-d", str(out)],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


class Browser:
    """Headless Chromium, one page, driven over the DevTools protocol."""

    def __init__(self, profile: Path) -> None:
        binary = shutil.which("chromium")
        # CI installs it and must run this; elsewhere it skips with how to get it
        if not binary:
            message = "no chromium: apt-get install chromium (Debian's; .ci/run installs it)"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
        self.process = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
            stderr=subprocess.PIPE,
            text=True,
        )
        for line in self.process.stderr:
            listening = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if listening:
                break
        pages = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{listening[1]}/json/list").read())
        page = next(p for p in pages if p["type"] == "page")
        # no Origin header: Chromium refuses DevTools connections from origins it was not told to allow
        self.socket = websocket.create_connection(page["webSocketDebuggerUrl"], suppress_origin=True)
        self.ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> Any:
        sent = next(self.ids)
        self.socket.send(json.dumps({"id": sent, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == sent:
                return message.get("result")

    def js(self, expression: str) -> Any:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"never true: {expression}")

    def close(self) -> None:
        self.socket.close()
        self.process.terminate()
        self.process.wait(timeout=30)


def test_the_site_shows_the_reference_and_its_search_finds_a_key(site: str, tmp_path: Path) -> None:
    browser = Browser(tmp_path / "profile")
    try:
        browser.call("Page.navigate", url=f"{site}/reference/grpo/")
        browser.wait_for("document.readyState === 'complete'")
        assert browser.js("document.title") == "grpo - posttrain"
        assert browser.js("document.body.innerText.includes('training.num_generations_eval')")
        browser.js("document.querySelector('.md-search__input').focus()")
        # typed, as a person would
        browser.call("Input.insertText", text="num_generations_eval")
        found = browser.wait_for("[...document.querySelectorAll('.md-search-result__item a')].map(a => a.href)")
        assert f"{site}/reference/grpo/" in found, found
    finally:
        browser.close()
