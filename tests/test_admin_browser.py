"""The admin in a real browser: log in, open the dashboard, pause a stream, see it paused.

Chromium comes from Debian's package (``python3 dev.py test`` installs it when it can),
driven by the ``playwright`` package; nothing is downloaded by Playwright itself. The
dashboard's screenshot is saved to ``artifacts/admin-dashboard.png``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connection, connections

from django_outbox import publish_many
from django_outbox.models import StreamState
from tests import procs
from tests.conftest import InlineRunner

pytestmark = [pytest.mark.django_db(transaction=True)]

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


@pytest.fixture
def admin_server():
    """A live server for this test only, stopped before the test database is dropped."""
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.test.testcases import LiveServerThread

    thread = LiveServerThread("localhost", StaticFilesHandler, port=0)
    thread.daemon = True
    thread.start()
    thread.is_ready.wait()
    if thread.error:
        raise thread.error
    try:
        yield f"http://localhost:{thread.port}"
    finally:
        thread.terminate()
        if connection.vendor == "postgresql":
            # Request threads close their connection once the browser's socket closes.
            procs.wait_until(lambda: other_sessions() == 0, timeout=30, describe=other_sessions)


def other_sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


@pytest.fixture
def browser_page():
    executable = next((shutil.which(name) for name in BROWSERS if shutil.which(name)), None)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if executable is None or sync_playwright is None:
        pytest.skip(
            "BROWSER NOT AVAILABLE: no chromium on PATH (Debian package 'chromium') or no "
            "'playwright' package; the real-browser admin test did not run."
        )
    # Playwright's sync API runs an event loop in this thread; the ORM calls of the test
    # and of the live server stay synchronous.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, args=["--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        try:
            yield page
        finally:
            browser.close()
            # Inside Playwright's context the ORM used a connection of its own: close it.
            connections.close_all()
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


def test_an_operator_pauses_a_stream_and_the_dashboard_shows_it(admin_server, browser_page):
    User.objects.create_superuser("operator", "ops@example.com", "a-long-password-1")
    runner = InlineRunner()
    with runner.capturing():  # the commit's wake queues a run here, not in django-q2
        publish_many("audit", [{"n": n} for n in range(300)])
    runner.distribute("audit")  # the run and the safety net: all archived, the chart has a bar
    with runner.capturing():  # the wake claims one group of 10; its run stays queued
        publish_many("audit", [{"n": n} for n in range(42)])
    page = browser_page

    page.goto(f"{admin_server}/admin/login/?next=/admin/django_outbox/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "a-long-password-1")
    page.click("input[type=submit]")
    page.click("text=Outbox dashboard")
    audit_state = page.locator("#stream-audit td[data-state]")
    assert audit_state.inner_text() == "running"
    assert page.locator("#stream-audit td").nth(2).inner_text() == "32"  # unclaimed rows
    assert page.locator("#stream-audit td").nth(4).inner_text() == "1"  # the claimed group
    assert page.locator("#stream-audit td").nth(7).inner_text() == "300"

    page.goto(f"{admin_server}/admin/django_outbox/streamstate/")
    page.check("input[name=_selected_action][value=audit]")
    page.select_option("select[name=action]", "pause")
    page.click("button[name=index]")
    assert "1 stream(s) paused: audit." in page.locator("ul.messagelist").inner_text()

    page.goto(f"{admin_server}/admin/django_outbox/streamstate/dashboard/")
    assert page.locator("#stream-audit td[data-state]").inner_text() == "paused"
    assert StreamState.objects.get(stream="audit").paused
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "admin-dashboard.png"), full_page=True)
    assert (ARTIFACTS / "admin-dashboard.png").stat().st_size > 10_000
