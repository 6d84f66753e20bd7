"""Operations figures: a metrics scrape and pruning against a one-million-row archive."""

from __future__ import annotations

import statistics
import time
from typing import Any

from django.db import connection


def fill_archive(rows: int, stream: str = "bench", *, hours: int = 1440) -> None:
    """*rows* archived rows spread over the last *hours*, 5 % of them dead letters."""
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE django_outbox_archivedevent RESTART IDENTITY")
        cursor.execute(
            "INSERT INTO django_outbox_archivedevent "
            "(stream, event_id, group_id, data, created_at, archived_at, outcome, attempts, "
            "error) SELECT %s, n, NULL, jsonb_build_object('id', n), now(), "
            "now() - (n %% %s) * interval '1 hour' - interval '1 second', "
            "CASE WHEN n %% 20 = 0 THEN 'failed' ELSE 'done' END, 1, '' "
            "FROM generate_series(1, %s) n",
            [stream, hours, rows],
        )
        cursor.execute("VACUUM ANALYZE django_outbox_archivedevent")


def scrape_latency(samples: int = 7) -> dict[str, Any]:
    """Median time of one metrics scrape (every query of the collector), in ms."""
    from django_outbox.metrics import render

    timings = []
    for _ in range(samples):
        started = time.perf_counter()
        body, _ = render()
        timings.append(time.perf_counter() - started)
        assert body
    return {
        "samples": samples,
        "median_ms": round(statistics.median(timings) * 1000, 1),
        "max_ms": round(max(timings) * 1000, 1),
    }


def archive_rows() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM django_outbox_archivedevent")
        return int(cursor.fetchone()[0])


def prune_rate() -> dict[str, Any]:
    """Prune the archive filled by :func:`fill_archive` (done after 30 days, failed 90)."""
    from django_outbox.archive.prune import prune_all

    before = archive_rows()
    started = time.perf_counter()
    results = prune_all()
    seconds = time.perf_counter() - started
    deleted = sum(result.rows for result in results)
    assert before - archive_rows() == deleted
    return {
        "archive_rows_before": before,
        "deleted": deleted,
        "seconds": round(seconds, 2),
        "rows_per_s": round(deleted / seconds) if seconds else 0,
    }
