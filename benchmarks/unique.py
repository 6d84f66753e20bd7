"""Unique-job dispatch rate on PostgreSQL: ``measure_dispatch(n)``.

Two figures for N ready jobs of the ``BenchJob`` kind (one key each):

* dispatch only: ``dispatch()`` called until every job was started, in waves of
  ``WAVE`` jobs (the kind's concurrency, raised for this measure). Each dispatch is
  what the schedule or a kick runs: the per-kind lock, the rescue scan, the bounded
  running count, one statement starting the wave, and the bulk hand-off of one
  django-q2 task per job into the ORM broker's queue table. Between waves the started
  jobs are marked processed and the queue emptied, off the clock;
* end to end: a real qcluster (2 workers, ORM broker) runs ``min(n, END_TO_END_MAX)``
  jobs from the enqueue's kick to the last one processed, no schedule, for two kinds:
  ``BenchJob`` (concurrency 8: chunks of 4) and ``WideBenchJob`` (concurrency 200:
  chunks of 50). Each finished chunk dispatches the next and runs one itself;
* django-q2 alone, in the same run, with the same cluster: ``min(n, DJANGO_Q2_MAX)``
  no-op tasks, one per job (``async_task(..., save=False)``), from the commit of their
  enqueue to the last one acknowledged.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from django.db import connection, transaction

WAVE = 1000
END_TO_END_MAX = 20_000
DJANGO_Q2_MAX = 2000
TABLE = "benchmarks_benchjob"


def _fill(n: int, table: str = TABLE) -> None:
    """Insert *n* ready jobs with one statement, off the clock."""
    from django_q.models import OrmQ

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {table} RESTART IDENTITY")
        cursor.execute(
            f"INSERT INTO {table} (key, state, attempt, process_after, created_at, last_error, "
            "worker) SELECT g, 'pending', 0, statement_timestamp(), statement_timestamp(), '', '' "
            "FROM generate_series(1, %s) AS g",
            [n],
        )
        cursor.execute(f"VACUUM ANALYZE {table}")
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


def measure_end_to_end(n: int, model: Any = None) -> dict[str, Any]:
    """Time *n* jobs through a real qcluster, from the enqueue's kick to the last one done."""
    from benchmarks.models import BenchJob
    from benchmarks.run import cluster, wait_until
    from django_outbox.models import JobState
    from django_outbox.unique.dispatch import chunk_length

    model = model or BenchJob
    _fill(0, model._meta.db_table)
    with cluster():
        begin = time.perf_counter()
        with transaction.atomic():
            model.objects.bulk_create([model(key=key) for key in range(1, n + 1)], batch_size=5000)
            model.enqueue(key=0)  # one real enqueue: its commit kicks the dispatch
        wait_until(
            lambda: model.objects.filter(state=JobState.PROCESSED).count() == n + 1,
            1800,
            "unique-job run",
        )
        seconds = time.perf_counter() - begin
    options = model.job_options()
    return {
        "jobs": n + 1,
        "seconds": round(seconds, 3),
        "jobs_per_s": round((n + 1) / seconds),
        "concurrency": options.concurrency,
        "chunk": chunk_length(options),
    }


def measure_django_q2(n: int, *, save: bool) -> dict[str, Any]:
    """Time *n* no-op django-q2 tasks, one per job, from their enqueue's commit to the last
    one acknowledged (the ORM broker deletes a task's row when it is done). With *save*
    (django-q2's default) each task stores its result, as each unique job stores its
    outcome; without, nothing is kept."""
    from django_q.models import OrmQ, Task
    from django_q.tasks import async_task

    from benchmarks.run import cluster, wait_until

    OrmQ.objects.all().delete()
    Task.objects.all().delete()
    with cluster():
        with transaction.atomic():
            for number in range(n):
                async_task("benchmarks.tasks.noop", number, save=save)
        begin = time.perf_counter()
        # The monitor saves a task's result before it acknowledges the task.
        wait_until(lambda: not OrmQ.objects.exists(), 1800, "django-q2 run")
        seconds = time.perf_counter() - begin
    assert Task.objects.exists() is save
    return {"jobs": n, "seconds": round(seconds, 3), "jobs_per_s": round(n / seconds), "save": save}


def measure_enqueue(n: int) -> dict[str, Any]:
    """Enqueue rates off the cluster (dispatch captured, not run): ``enqueue`` with one
    transaction per job (``min(n, DJANGO_Q2_MAX)`` jobs, each dispatch starting its
    job), and ``enqueue_many`` of *n* jobs in one transaction."""
    from benchmarks.models import WideBenchJob
    from django_outbox.transport import handoff
    from django_outbox.unique.options import kind_options

    table = WideBenchJob._meta.db_table
    single = min(n, DJANGO_Q2_MAX)
    _fill(0, table)
    # Every enqueue's dispatch starts its job, as with an idle worker pool: at its
    # concurrency the kind would skip those dispatches.
    declared = kind_options(WideBenchJob)
    WideBenchJob._kind_options = dataclasses.replace(declared, concurrency=10 * single)
    try:
        with handoff.capture():
            begin = time.perf_counter()
            for key in range(single):
                with transaction.atomic():
                    WideBenchJob.enqueue(key=key)
            single_seconds = time.perf_counter() - begin
    finally:
        WideBenchJob._kind_options = declared
    _fill(0, table)
    with handoff.capture():
        begin = time.perf_counter()
        with transaction.atomic():
            created = WideBenchJob.enqueue_many({"key": key} for key in range(n))
        many_seconds = time.perf_counter() - begin
    assert len(created) == n
    _fill(0, table)
    return {
        "enqueue_one_transaction_each": {
            "jobs": single,
            "jobs_per_s": round(single / single_seconds),
        },
        "enqueue_many": {"jobs": n, "jobs_per_s": round(n / many_seconds)},
    }


def measure_dispatch(n: int) -> dict[str, Any]:
    """Dispatch rate (jobs/s) of *n* ready jobs: dispatch only, and end to end."""
    if connection.vendor != "postgresql":
        raise SystemExit("The unique-job benchmark needs PostgreSQL: set BENCH_DATABASE_URL.")
    from benchmarks.models import WideBenchJob

    django_q2 = measure_django_q2(min(n, DJANGO_Q2_MAX), save=True)
    django_q2_unsaved = measure_django_q2(min(n, DJANGO_Q2_MAX), save=False)
    end_to_end = measure_end_to_end(min(n, END_TO_END_MAX))
    wide = measure_end_to_end(min(n, END_TO_END_MAX), WideBenchJob)
    return {
        "enqueue": measure_enqueue(n),
        "dispatch_only": measure_dispatch_only(n),
        "django_q2_one_task_per_job": django_q2,
        "django_q2_one_task_per_job_unsaved": django_q2_unsaved,
        "end_to_end": end_to_end,
        "end_to_end_wide": wide,
        "wide_vs_django_q2": round(wide["jobs_per_s"] / django_q2["jobs_per_s"], 1),
        "wide_vs_django_q2_unsaved": round(wide["jobs_per_s"] / django_q2_unsaved["jobs_per_s"], 1),
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
