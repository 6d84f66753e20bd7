"""Helpers of the process tier: run Django code in real subprocesses on the test database."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child process that uses this test run's database."""
    from django.db import connection

    settings = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "example_project")]),
    }
    env.pop("OUTBOX_REQUIRE_POSTGRES", None)
    if connection.vendor == "postgresql":
        user = settings["USER"] or ""
        password = f":{settings['PASSWORD']}" if settings["PASSWORD"] else ""
        host = settings["HOST"] or ""
        if host.startswith("/"):
            from urllib.parse import quote

            host = quote(host, safe="")
        port = f":{settings['PORT']}" if settings["PORT"] else ""
        at = "@" if user or password else ""
        env["DATABASE_URL"] = f"postgres://{user}{password}{at}{host}{port}/{settings['NAME']}"
    else:
        env["DATABASE_URL"] = ""
        env["OUTBOX_TEST_SQLITE"] = str(settings["NAME"])
    env.update(extra)
    return env


@contextlib.contextmanager
def running(
    args: list[str], name: str, log: Path | None = None, **env: str
) -> Iterator[subprocess.Popen]:
    """Run ``python *args`` until the block ends; SIGTERM it, then SIGKILL its group.

    Its output goes to *log* (a temporary file by default), printed if it failed.
    """
    log = log or Path(tempfile.gettempdir()) / f"outbox-test-{name}-{os.getpid()}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env=child_env(**env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        stop(process)
        if process.returncode not in (0, -signal.SIGTERM):
            print(f"--- {name} log ({log}) ---\n{log.read_text()[-4000:]}")


def stop(process: subprocess.Popen, timeout: float = 30) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def wait_until(
    predicate: Callable[[], bool],
    timeout: float,
    describe: Callable[[], Any] = lambda: "",
    interval: float = 0.05,
) -> None:
    """Poll *predicate* until it holds; fail with the last observed state at *timeout*."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout:.0f}s; state: {describe()}")
        time.sleep(interval)


def claim_until_empty(stream: str, start_file: str) -> None:
    """Child process: wait for *start_file*, claim groups until none is left, print them.

    Jobs are captured in memory, so only the claims themselves touch the database.
    """
    import django

    django.setup()
    from django_outbox import transport
    from django_outbox.claim import claim_group

    print("ready", flush=True)
    while not os.path.exists(start_file):
        time.sleep(0.005)
    claimed = []
    with transport.capture():
        while True:
            result = claim_group(stream)
            if not result.claimed_any:
                break
            claimed.append([str(result.group_id), result.size])
    print(json.dumps(claimed), flush=True)
