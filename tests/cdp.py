"""Headless Chromium driven over the Chrome DevTools Protocol, for tests that click through a page.

The system's Chromium (:data:`tests.browser.CHROMIUM`) is started with a DevTools port; the test talks to its
page over a WebSocket (the ``websockets`` package Airflow's API server already depends on): navigate, set or
read cookies, evaluate JavaScript (``element.click()`` in the page), type into a field and click an element as a
person does (key and mouse events, :meth:`Browser.type` and :meth:`Browser.click`), wait for a condition, take a
screenshot. The events the page sends (requests, console and log messages) are kept in :attr:`Browser.events`.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import signal
import subprocess
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

from tests.browser import CHROMIUM

__all__ = ["Browser"]

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars",
         "--remote-debugging-port=0", "--window-size=1400,1100"]


class Browser:
    """One Chromium with one page; use as a context manager."""

    def __init__(self) -> None:
        assert CHROMIUM is not None, "chromium is not installed (run .ci/system.sh)"
        # Chromium's helper processes may still write to the profile as it ends: a leftover file is not an error
        self._profile = tempfile.TemporaryDirectory(prefix="bq-cdp-", ignore_cleanup_errors=True)
        self._process = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={self._profile.name}", "about:blank"],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                         start_new_session=True)
        port = self._port()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            [page] = [t for t in json.load(answer) if t["type"] == "page"]
        self._stack = ExitStack()
        self._socket = self._stack.enter_context(connect(page["webSocketDebuggerUrl"], max_size=64 * 1024 * 1024))
        self._ids = itertools.count(1)
        #: Every event received so far (``{"method": ..., "params": ...}``), oldest first.
        self.events: list[dict[str, Any]] = []
        self.call("Page.enable")
        self.call("Network.enable")
        self.call("Log.enable")  # the browser's own messages, e.g. a content security policy's refusals

    def _port(self) -> int:
        assert self._process.stderr is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self._process.stderr.readline()
            found = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if found:
                return int(found.group(1))
        raise RuntimeError("Chromium did not open its DevTools port")

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one command and return its result (events in between go to :attr:`events`)."""
        ident = next(self._ids)
        self._socket.send(json.dumps({"id": ident, "method": method, "params": params or {}}))
        while True:
            message = json.loads(self._socket.recv(timeout=60))
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            if "method" in message:
                self.events.append(message)

    def cookie(self, url: str, name: str, value: str) -> None:
        self.call("Network.setCookie", {"url": url, "name": name, "value": value})

    def cookies(self, url: str) -> dict[str, str]:
        """The cookies the browser holds for ``url``, by name."""
        return {c["name"]: c["value"] for c in self.call("Network.getCookies", {"urls": [url]})["cookies"]}

    def go(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})
        self.wait("document.readyState === 'complete'")

    def run(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait(self, condition: str, timeout: float = 20) -> Any:
        """Wait until a JavaScript expression is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.run(condition)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{condition} stayed false; the page says: {self.run('document.body.innerText')}")
            time.sleep(0.1)

    def click(self, selector: str) -> None:
        """Click the element ``selector`` finds with the mouse (pressed and released at its centre), as a person
        does: the click lands on whatever is drawn there, so a covered or disabled element does not get it."""
        box = self.wait(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
                        " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
                        " const x = r.x + r.width / 2, y = r.y + r.height / 2;"
                        " return e.contains(document.elementFromPoint(x, y)) ? {x, y} : null; })()")
        at = {"x": box["x"], "y": box["y"]}
        self.call("Input.dispatchMouseEvent", {"type": "mouseMoved", **at})
        self.call("Input.dispatchMouseEvent", {"type": "mousePressed", **at, "button": "left", "buttons": 1,
                                               "clickCount": 1})
        self.call("Input.dispatchMouseEvent", {"type": "mouseReleased", **at, "button": "left", "buttons": 0,
                                               "clickCount": 1})

    def type(self, selector: str, text: str) -> None:
        """Click into the field ``selector`` finds and type ``text`` into it key by key (printable ASCII)."""
        self.click(selector)
        self.wait(f"document.activeElement === document.querySelector({json.dumps(selector)})")
        for char in text:
            assert " " <= char <= "~", f"cannot type {char!r}"
            self.call("Input.dispatchKeyEvent", {"type": "keyDown", "key": char, "text": char})
            self.call("Input.dispatchKeyEvent", {"type": "keyUp", "key": char})

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"})["data"]))

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self._stack.close()
        finally:
            try:
                os.killpg(self._process.pid, signal.SIGKILL)  # the browser and its helper processes
            except ProcessLookupError:
                pass
            self._process.wait(timeout=30)
            self._profile.cleanup()
