"""A child process of tests/processes/test_wake_guard_bound.py, run against a server of its own.

One transaction publishes and enqueues *count* times while a thread raises the stream's
and the kind's wake epochs as fast as it can (every run ending), with a run in flight
and the kind at its concurrency all along: every enqueue asks the kind's wake guard, and
the first publish the stream's (whose answer covers the later ones). A second thread
opens a fresh connection to the server every few milliseconds and reads the advisory
locks the transaction holds. The result (JSON) goes to *out*.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from typing import Any


def main(url: str, out: str, count: int) -> None:
    import django

    django.setup()
    import psycopg
    from django.db import connection, connections, transaction
    from django.utils import timezone

    from django_outbox import publish
    from django_outbox.models import GroupState, JobState, OutboxGroup, StreamState
    from django_outbox.streams import run
    from django_outbox.unique.sql import JobTable
    from tests.uniqueapp.models import ThrottledJob

    later = timezone.now() + timedelta(hours=1)
    StreamState.objects.get_or_create(stream="audit")
    # A run in flight (a live claimed group) and the kind at its concurrency (2 running).
    OutboxGroup.objects.create(
        stream="audit", size=0, state=GroupState.CLAIMED, lease_expires_at=later
    )
    for key in ("running-a", "running-b"):
        ThrottledJob.objects.create(key=key, state=JobState.RUNNING, lease_expires_at=later)

    stop = threading.Event()
    result: dict[str, Any] = {"raises": 0, "probes": 0, "probe_errors": [], "max_locks": 0}
    pid_ready = threading.Event()
    pid: list[int] = []

    def end_runs() -> None:
        table = JobTable(ThrottledJob)
        try:
            while not stop.is_set():
                run.raise_wake_epoch("audit")
                table.raise_wake_epoch()
                result["raises"] += 1
        finally:
            connections.close_all()

    def probe() -> None:
        pid_ready.wait()
        while not stop.is_set():
            try:
                with psycopg.connect(url, connect_timeout=10) as fresh:
                    (locks,) = fresh.execute(
                        "SELECT count(*) FROM pg_locks WHERE pid = %s AND locktype = 'advisory'",
                        [pid[0]],
                    ).fetchone()
                result["max_locks"] = max(result["max_locks"], locks)
                result["probes"] += 1
            except Exception as exc:  # the result reports it
                result["probe_errors"].append(str(exc).splitlines()[0])
            stop.wait(0.02)

    threads = [threading.Thread(target=end_runs), threading.Thread(target=probe)]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pid.append(cursor.fetchone()[0])
            pid_ready.set()
            for n in range(count):
                publish("audit", {"n": n})
                ThrottledJob.enqueue(key=f"k{n}")
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_locks "
                    "WHERE pid = pg_backend_pid() AND locktype = 'advisory'"
                )
                result["locks_at_commit"] = cursor.fetchone()[0]
        result["error"] = None
    except Exception as exc:  # the result reports it
        result["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    finally:
        pid_ready.set()
        result["seconds"] = round(time.monotonic() - started, 1)
        stop.set()
        for thread in threads:
            thread.join()
    with open(out, "w") as f:
        json.dump(result, f)
