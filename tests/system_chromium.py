"""The machine's Chromium, as Playwright launches it for the browser tests and the guide's
screenshots: headless, no network of its own (no browser download, no updates, no sync), and
waits bounded only by PATIENCE_S (a loaded machine is slow, never a failure)."""

from __future__ import annotations

import os
import shutil

from patience import PATIENCE_S

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
INSTALLED = os.path.exists(CHROMIUM)
NOT_INSTALLED = "chromium is not installed (apt-get install -y chromium); CI installs it (.ci/run)"
#: Playwright's `browser_type.launch` arguments (pytest-playwright's browser_type_launch_args)
LAUNCH_ARGS = {"executable_path": CHROMIUM, "headless": True,
               "args": ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
                        "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]}
#: Playwright's timeouts are in milliseconds: every wait of a page is bounded by the suite's patience
PATIENCE_MS = PATIENCE_S * 1000


def new_context(browser, width: int, height: int):
    """A fresh browser profile (cookies, storage) with a `width` x `height` window, whose waits
    (clicks, navigations, conditions) last up to PATIENCE_MS."""
    context = browser.new_context(viewport={"width": width, "height": height})
    context.set_default_timeout(PATIENCE_MS)
    return context
