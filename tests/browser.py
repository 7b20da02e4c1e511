"""A headless Chromium driven over the DevTools protocol (CDP), for tests and screenshots of the
Prefect UI: real mouse clicks and typed text (Input.* events, as a user's), no extra dependency
(the `websockets` client Prefect already installs).

    with Chromium() as browser:
        page = browser.open("http://127.0.0.1:4200/deployments")
        page.wait_for("document.body.innerText.includes('dp-release')")
        page.click_text("Run")
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from patience import PATIENCE_S

CHROMIUM = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium") if p and os.path.exists(p)), None)


class BrowserError(AssertionError):
    """The page did not reach the state a test waited for (the message says which, and what it shows)."""


class Page:
    """One tab: evaluate JavaScript, wait for a condition, click and type like a user."""

    def __init__(self, ws_url: str) -> None:
        from websockets.sync.client import connect

        self.ws = connect(ws_url, max_size=None, open_timeout=PATIENCE_S)
        self.ids = itertools.count(1)

    def send(self, method: str, timeout: float = PATIENCE_S, **params) -> dict:
        msg_id = next(self.ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            reply = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"JavaScript failed: {result['exceptionDetails'].get('exception', {}).get('description')}")
        return result.get("result", {}).get("value")

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def text(self) -> str:
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def wait_for(self, condition: str, timeout: float = PATIENCE_S, what: str | None = None):
        """Wait until the JavaScript `condition` is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(condition)
            except BrowserError:
                value = None
            if value:
                return value
            time.sleep(0.25)
        raise BrowserError(f"timed out waiting for {what or condition}; the page shows:\n{self.text()[:2000]}")

    def wait_for_text(self, text: str, timeout: float = PATIENCE_S) -> None:
        self.wait_for(f"document.body && document.body.innerText.includes({json.dumps(text)})", timeout,
                      what=f"the text {text!r}")

    def _center(self, finder: str, what: str) -> tuple[float, float]:
        box = self.wait_for(f"(() => {{ const el = {finder}; if (!el) return null; el.scrollIntoView({{block: 'center'}});"
                            "const r = el.getBoundingClientRect(); return r.width ? [r.x + r.width / 2, r.y + r.height / 2]"
                            " : null; })()", what=what)
        return box[0], box[1]

    def click(self, finder: str, what: str | None = None) -> None:
        """Click (mouse down and up, as a user) the element the JavaScript expression `finder` returns."""
        x, y = self._center(finder, what or finder)
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def click_text(self, text: str, tag: str = "*", exact: bool = True) -> None:
        """Click the last visible element of `tag` whose own text is `text` (a button, a tab, a label)."""
        self.click(by_text(text, tag, exact), what=f"a {tag} reading {text!r}")

    def type_into(self, finder: str, text: str, what: str | None = None, clear: bool = True) -> None:
        """Focus a field by clicking it, clear it, and type `text` (real input events)."""
        self.click(finder, what)
        if clear:
            self.evaluate(f"(() => {{ const el = {finder}; el.select && el.select(); }})()")
            self.send("Input.dispatchKeyEvent", type="keyDown", key="Backspace", code="Backspace",
                      windowsVirtualKeyCode=8)
            self.send("Input.dispatchKeyEvent", type="keyUp", key="Backspace", code="Backspace",
                      windowsVirtualKeyCode=8)
        self.send("Input.insertText", text=text)

    def screenshot(self, path: Path, full_page: bool = False) -> Path:
        params = {"format": "png"}
        if full_page:
            size = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": size[0], "height": min(size[1], 4000), "scale": 1})
        data = self.send("Page.captureScreenshot", **params)["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def close(self) -> None:
        self.ws.close()


def by_text(text: str, tag: str = "*", exact: bool = True) -> str:
    """A JavaScript expression for the last visible `tag` element whose text is (or contains) `text`."""
    test = f"e.innerText.trim() === {json.dumps(text)}" if exact else f"e.innerText.includes({json.dumps(text)})"
    return (f"[...document.querySelectorAll({json.dumps(tag)})].filter(e => e.offsetParent !== null && {test})"
            ".pop()")


def in_field(label: str, selector: str = "input, textarea", text: str | None = None) -> str:
    """A JavaScript expression for an element inside the form field labelled `label` (a Prefect
    schema-form property: the label's closest `.group`): the first matching `selector`, or the
    first whose text is `text` (a toggle such as "str", a method of a choice)."""
    match = ".filter(e => e.offsetParent !== null)" + (
        "" if text is None else f".filter(e => e.innerText.trim() === {json.dumps(text)})")
    return (f"(() => {{ const l = [...document.querySelectorAll('label')].filter(e => e.offsetParent !== null && "
            f"e.innerText.trim().replace(/\\s*\\(Optional\\)$/, '') === {json.dumps(label)}).pop();"
            f"const box = l && (l.closest('.group') || l.parentElement);"
            f"return box ? [...box.querySelectorAll({json.dumps(selector)})]{match}[0] : null; }})()")


class Chromium:
    """A headless Chromium of its own (a private profile), stopped on exit."""

    def __init__(self, width: int = 1280, height: int = 1000) -> None:
        if CHROMIUM is None:
            raise RuntimeError("chromium is not installed (apt-get install -y chromium)")
        self.width, self.height = width, height
        self.profile = Path(tempfile.mkdtemp(prefix="dprelease-chromium-"))
        self.proc: subprocess.Popen | None = None
        self.pages: list[Page] = []

    def __enter__(self) -> Chromium:
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={self.profile}", "--remote-debugging-port=0", f"--window-size={self.width},{self.height}",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + PATIENCE_S
        while not (port_file.exists() and len(port_file.read_text().split()) >= 2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("chromium did not start its DevTools endpoint")
            time.sleep(0.1)
        self.port = int(port_file.read_text().split()[0])
        return self

    def open(self, url: str) -> Page:
        import httpx

        target = httpx.put(f"http://127.0.0.1:{self.port}/json/new?{url}", timeout=PATIENCE_S).json()
        page = Page(target["webSocketDebuggerUrl"])
        page.send("Page.enable")
        page.send("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height, deviceScaleFactor=1,
                  mobile=False)
        self.pages.append(page)
        return page

    def __exit__(self, *exc) -> None:
        for page in self.pages:
            try:
                page.close()
            except Exception:  # noqa: BLE001 - the browser is going away anyway
                pass
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(PATIENCE_S)
        shutil.rmtree(self.profile, ignore_errors=True)
