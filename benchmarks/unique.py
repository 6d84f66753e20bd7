"""Unique-job dispatch rate on PostgreSQL: ``measure_dispatch(n)``.

Two figures for N ready jobs of the ``BenchJob`` kind (one key each):

* dispatch only: ``dispatch()`` called until every job was started, in waves of
  ``WAVE`` jobs (the kind's concurrency, raised for this measure). Each dispatch is
  what the schedule or a kick runs: the per-kind lock, the rescue scan, the bounded
  running count, one statement starting the wave, and the bulk hand-off of one
  django-q2 task per job into the ORM broker's queue table. Between waves the started
  jobs are marked processed and the queue emptied, off the clock;
* end to end: a real qcluster (2 workers, ORM broker) runs ``min(n, END_TO_END_MAX)``
  jobs from the enqueue's kick to the last one processed, each finished job
  dispatching the next (concurrency 8), no schedule.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from django.db import connection, transaction

WAVE = 1000
END_TO_END_MAX = 2000
TABLE = "benchmarks_benchjob"


def _fill(n: int) -> None:
    """Insert *n* ready jobs with one statement, off the clock."""
    from django_q.models import OrmQ

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLE} RESTART IDENTITY")
        cursor.execute(
            f"INSERT INTO {TABLE} (key, state, attempt, process_after, created_at, last_error, "
            "worker) SELECT g, 'pending', 0, statement_timestamp(), statement_timestamp(), '', '' "
            "FROM generate_series(1, %s) AS g",
            [n],
        )
        cursor.execute(f"VACUUM ANALYZE {TABLE}")
    OrmQ.objects.all().delete()


def measure_dispatch_only(n: int) -> dict[str, Any]:
    """Time ``dispatch()`` alone over *n* ready jobs, in waves of ``WAVE``."""
    from django_q.models import OrmQ

    from benchmarks.models import BenchJob
    from django_outbox.models import JobState
    from django_outbox.unique.dispatch import dispatch
    from django_outbox.unique.options import kind_options

    _fill(n)
    declared = kind_options(BenchJob)
    BenchJob._kind_options = dataclasses.replace(declared, concurrency=WAVE)
    seconds = 0.0
    dispatches = started = 0
    try:
        while started < n:
            begin = time.perf_counter()
            result = dispatch(BenchJob)
            seconds += time.perf_counter() - begin
            dispatches += 1
            assert result.dispatched > 0, "dispatch started nothing"
            started += result.dispatched
            with transaction.atomic():  # the wave's jobs finish at once, off the clock
                BenchJob.objects.filter(state=JobState.RUNNING).update(
                    state=JobState.PROCESSED, lease_expires_at=None
                )
                OrmQ.objects.all().delete()
    finally:
        BenchJob._kind_options = declared
    assert started == n == BenchJob.objects.filter(state=JobState.PROCESSED).count()
    return {
        "jobs": n,
        "wave": WAVE,
        "dispatches": dispatches,
        "seconds": round(seconds, 3),
        "jobs_per_s": round(n / seconds),
        "ms_per_dispatch": round(seconds / dispatches * 1000, 2),
    }


def measure_end_to_end(n: int) -> dict[str, Any]:
    """Time *n* jobs through a real qcluster, from the enqueue's kick to the last one done."""
    from benchmarks.models import BenchJob
    from benchmarks.run import cluster, wait_until
    from django_outbox.models import JobState

    _fill(0)
    with cluster():
        begin = time.perf_counter()
        with transaction.atomic():
            BenchJob.objects.bulk_create([BenchJob(key=key) for key in range(1, n + 1)])
            BenchJob.enqueue(key=0)  # one real enqueue: its commit kicks the dispatch
        wait_until(
            lambda: BenchJob.objects.filter(state=JobState.PROCESSED).count() == n + 1,
            1800,
            "unique-job run",
        )
        seconds = time.perf_counter() - begin
    return {
        "jobs": n + 1,
        "seconds": round(seconds, 3),
        "jobs_per_s": round((n + 1) / seconds),
        "concurrency": BenchJob.job_options().concurrency,
    }


def measure_dispatch(n: int) -> dict[str, Any]:
    """Dispatch rate (jobs/s) of *n* ready jobs: dispatch only, and end to end."""
    if connection.vendor != "postgresql":
        raise SystemExit("The unique-job benchmark needs PostgreSQL: set BENCH_DATABASE_URL.")
    return {
        "dispatch_only": measure_dispatch_only(n),
        "end_to_end": measure_end_to_end(min(n, END_TO_END_MAX)),
    }


if __name__ == "__main__":
    import json
    import os
    import sys

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    print(json.dumps(measure_dispatch(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000), indent=2))
