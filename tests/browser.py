"""Headless Chromium for page tests (Playwright driving Debian's /usr/bin/chromium).

Tests that need it skip with a clear message where Chromium is missing, except
under ``CI=true``, where a missing browser is a failure.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
]


def require_chromium() -> str:
    path = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    if not path:
        message = f"Chromium not found at {CHROMIUM} (install the Debian package 'chromium')"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:  # pragma: no cover - playwright is in requirements-dev.txt
        pytest.fail("the playwright package is not installed")
    return path


@contextmanager
def browser_page(**context_options: Any) -> Iterator[Any]:
    """A fresh page in a fresh headless Chromium; records every request URL on ``page.requested``."""
    from playwright.sync_api import sync_playwright

    executable = require_chromium()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=FLAGS, headless=True)
        try:
            context = browser.new_context(**context_options)
            page = context.new_page()
            requested: list[str] = []
            page.on("request", lambda req: requested.append(req.url))
            page.requested = requested  # type: ignore[attr-defined]
            yield page
        finally:
            # Inside sync_playwright an event loop runs in this thread, so the ORM's connections of
            # a test that reads in the block (DJANGO_ALLOW_ASYNC_UNSAFE) are kept in that context,
            # apart from the thread's own: close them here, or they stay open past the test (and
            # the test database cannot be dropped). Only open ones: closing is refused in an async
            # context unless the test allowed it, and only such a test can have opened one.
            for conn in connections.all(initialized_only=True):
                if conn.connection is not None:
                    conn.close()
            browser.close()


def screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def wait_for(page: Any, selector: str, timeout_ms: float = 30_000) -> Any:
    """``page.wait_for_selector`` that, on a timeout, says which page it was on and what that page said."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        return page.wait_for_selector(selector, timeout=timeout_ms)
    except PlaywrightTimeout:
        try:
            text = page.inner_text("body")[:1500]
        except Exception as exc:  # the page may be mid-navigation
            text = f"(body unreadable: {exc})"
        raise AssertionError(f"{selector!r} did not appear on {page.url}; the page said:\n{text}") from None
