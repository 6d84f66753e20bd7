"""Commit-to-archive latency at a steady inflow, and what an idle minute costs.

Publisher processes commit at a fixed pace into a running cluster, each transaction
writing rows of the ``orders`` stream (a custom buffer with every option at its
default) with the plain ORM, as application code does. Nothing else moves the rows:
each commit wakes the stream. Latency is the database's own clock, from the row's
``created_at`` to its archive row's ``archived_at``.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import statistics
import time
from decimal import Decimal
from typing import Any

from django.db import connection

ORDERS = "orders"
OUR_TABLES = (
    "benchmarks_orderevent",
    "django_outbox_outboxevent",
    "django_outbox_outboxgroup",
    "django_outbox_streamstate",
    "django_outbox_archivedevent",
)


def _publisher(rate: float, rows_per_commit: int, seconds: float, start_at: float, out) -> None:
    """One publisher process: a commit every 1/rate seconds, on a fixed schedule."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    import django

    django.setup()
    from django.db import transaction

    from benchmarks.models import OrderEvent

    commits = 0
    interval = 1.0 / rate
    while time.time() < start_at:
        time.sleep(0.001)
    while True:
        due = start_at + commits * interval
        now = time.time()
        if due - start_at >= seconds or now - start_at >= seconds:
            break  # the schedule is done, or its time is up (a publisher behind it stops)
        if due > now:
            time.sleep(due - now)  # the inflow's pace
        with transaction.atomic():
            if rows_per_commit == 1:
                OrderEvent.objects.create(order_ref=commits, amount=Decimal("9.99"))
            else:
                OrderEvent.objects.bulk_create(
                    OrderEvent(order_ref=commits * rows_per_commit + n, amount=Decimal("9.99"))
                    for n in range(rows_per_commit)
                )
        commits += 1
    out.put(commits * rows_per_commit)


def _unclaimed() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM benchmarks_orderevent WHERE group_id IS NULL")
        return int(cursor.fetchone()[0])


def steady_latency(
    events_per_s: float, rows_per_commit: int, seconds: float, publishers: int = 2
) -> dict[str, Any]:
    """Publish *events_per_s* for *seconds* (commits of *rows_per_commit* rows) into the
    running cluster; return latency percentiles and the peak backlog."""
    from benchmarks.run import wait_until
    from django_outbox.models import ArchivedEvent

    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    start_at = time.time() + 3.0  # the children import Django meanwhile
    commit_rate = events_per_s / rows_per_commit / publishers
    children = [
        context.Process(
            target=_publisher, args=(commit_rate, rows_per_commit, seconds, start_at, out)
        )
        for _ in range(publishers)
    ]
    for child in children:
        child.start()
    peak = 0
    while time.time() < start_at + seconds:
        peak = max(peak, _unclaimed())
        time.sleep(0.1)  # sampling period of the backlog
    written = 0
    for _ in children:
        try:
            written += out.get(timeout=120)
        except queue.Empty:
            states = [(child.pid, child.exitcode) for child in children]
            raise SystemExit(
                f"benchmark: a publisher did not report within 120 s of its end "
                f"(pid, exit code: {states}; a non-zero code is its crash, printed above)"
            ) from None
    for child in children:
        child.join()
    archived = ArchivedEvent.objects.filter(stream=ORDERS)
    wait_until(lambda: archived.count() >= written, 300, "every order archived")
    latencies = sorted(
        (archived_at - created_at).total_seconds()
        for created_at, archived_at in archived.values_list("created_at", "archived_at")
    )

    def pct(p: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(len(latencies) * p))], 3)

    achieved = written / seconds
    return {
        "target_events_per_s": round(events_per_s),
        "achieved_events_per_s": round(achieved),
        "rows_per_commit": rows_per_commit,
        "seconds": seconds,
        "events": written,
        "p50_s": round(statistics.median(latencies), 3),
        "p95_s": pct(0.95),
        "p99_s": pct(0.99),
        "max_s": round(latencies[-1], 3),
        "peak_backlog_rows": peak,
        "peak_backlog_s_of_inflow": round(peak / achieved, 3) if achieved else None,
    }


def table_activity() -> dict[str, int]:
    """Scans and row writes on the library's tables so far (pg_stat_user_tables)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT COALESCE(SUM(seq_scan + COALESCE(idx_scan, 0)), 0), "
            "COALESCE(SUM(n_tup_ins + n_tup_upd + n_tup_del), 0) "
            "FROM pg_stat_user_tables WHERE relname = ANY(%s)",
            [list(OUR_TABLES)],
        )
        scans, writes = cursor.fetchone()
    return {"scans": int(scans), "rows_written": int(writes)}


def idle_minute(seconds: float = 60.0) -> dict[str, Any]:
    """What *seconds* of a running cluster with nothing to do costs on our tables."""
    from benchmarks.run import settle_stats
    from django_outbox.models import OutboxGroup

    groups_before = OutboxGroup.objects.count()
    settle_stats()
    before = table_activity()
    time.sleep(seconds)  # the idle period being measured
    settle_stats()
    after = table_activity()
    return {
        "seconds": seconds,
        "scans_of_our_tables": after["scans"] - before["scans"],
        "rows_written_to_our_tables": after["rows_written"] - before["rows_written"],
        "groups_claimed": OutboxGroup.objects.count() - groups_before,
    }
