"""The django.tasks backend against django-tasks-db, same machine, same run (Django 6.0+).

Run with ``python3 dev.py bench tasks [N [PAIRS]]`` (``tox -e bench-tasks``: Django 6.1
with django-tasks-db), or ``python -m benchmarks.djtasks [N [PAIRS]]`` where Django 6 is
installed.

* end to end: N no-op tasks for each backend, from the commit of their enqueue (the
  clock starts after the last INSERT, so it counts the commit, not the enqueue calls)
  to the last one done, with two worker processes each: a qcluster of 2 workers for
  ours (the commit kicks the dispatch; chunks of the task kind), two quiet
  ``db_worker --verbosity 0`` processes for django-tasks-db, as its users run them.
  The workers are started and warm before the clock starts. Ours runs with the default
  options (``JOBS_PER_STATEMENT`` 8). PAIRS runs of each (3 by default), alternating;
  each also reports the rate the workers' own timestamps give (first start to last
  finish), which no observer's polling can slow;
* django-tasks-db again as an independent run measures it: N tasks enqueued first, then
  two quiet ``db_worker`` processes (default interval) started on the backlog, PAIRS
  times: its rate by its timestamps, and from the workers' start;
* enqueue, one transaction per task: ``task.enqueue()`` inside ``transaction.atomic()``,
  ``min(N, SINGLE_MAX)`` times, for each backend, no worker running; ours at the
  defaults (the INSERT's own statement queues the kind's wake, a django-q2 task that
  dispatches in a worker, unless the wake it queued last still waits untaken: no
  statement after the commit) and handed to a worker by
  the dispatcher thread (``DISPATCH_ON_COMMIT = "thread"``: one queue row per kind and
  10 ms; the workers, not running here, would dispatch);
* ``enqueue_many``: N tasks in one transaction (ours; django-tasks-db has none).

All of it twice: with Django's default database options (no prepared statements), then
with prepared statements for both backends (``BENCH_PREPARED=1``, a child process).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
django.setup()

from django.db import connection, transaction  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SINGLE_MAX = 2000
#: End-to-end runs of each backend, alternating (the command's second argument).
PAIRS = 3
OURS = "django_outbox_tasks_taskrecord"
THEIRS = "django_tasks_database_dbtaskresult"


def _clear() -> None:
    from django_q.models import OrmQ

    with connection.cursor() as cursor:
        for table in (OURS, THEIRS):
            cursor.execute(f"TRUNCATE {table} RESTART IDENTITY")
    OrmQ.objects.all().delete()


def _wait(done: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"benchmark: {what} did not finish within {timeout:.0f}s")
        time.sleep(0.02)


@contextmanager
def _workers(argv: list[str], count: int, name: str) -> Iterator[None]:
    from benchmarks.run import start_django, stop

    log = ROOT / "artifacts" / f"bench-{name}.log"
    log.parent.mkdir(exist_ok=True)
    with log.open("a") as out:
        processes = [start_django(argv, out) for _ in range(count)]
    try:
        yield
    finally:
        stop(processes)


def ours_end_to_end(n: int) -> dict[str, Any]:
    from benchmarks.djtasks_funcs import outbox_noop
    from benchmarks.run import cluster
    from django_outbox.tasks_backend.models import TaskRecord
    from django_outbox.unique.dispatch import chunk_length

    _clear()
    with cluster():
        with transaction.atomic():
            outbox_noop.enqueue_many([((number,), {}) for number in range(n)])
            begin = time.perf_counter()  # the commit and what follows it
        # Polled by the partial indexes of pending and running rows: a count of the
        # processed ones would scan a growing share of the table 50 times a second.
        waiting = TaskRecord.objects.filter(state__in=["pending", "running"])
        _wait(lambda: not waiting.exists(), 1800, "ours")
        seconds = time.perf_counter() - begin
    assert TaskRecord.objects.filter(state="processed").count() == n
    return {
        "tasks": n,
        "seconds": round(seconds, 3),
        "tasks_per_s": round(n / seconds),
        "tasks_per_s_by_timestamps": _by_timestamps(TaskRecord.objects.all(), n),
        "chunk": chunk_length(TaskRecord.job_options()),
        "jobs_per_statement": TaskRecord.job_options().jobs_per_statement,
    }


def theirs_end_to_end(n: int) -> dict[str, Any]:
    from django_tasks_db.models import DBTaskResult

    from benchmarks.djtasks_funcs import db_noop

    _clear()
    argv = [
        "db_worker",
        "--backend",
        "db",
        "--interval",
        "0.05",
        "--no-startup-delay",
        "--verbosity",
        "0",
    ]
    with _workers(argv, 2, "db-worker"):
        warm = db_noop.enqueue(-1)  # both started: the first task is taken
        _wait(lambda: DBTaskResult.objects.filter(status="SUCCESSFUL").exists(), 120, "warm-up")
        with transaction.atomic():
            for number in range(n):
                db_noop.enqueue(number)
            begin = time.perf_counter()  # the commit and what follows it, as for ours
        # As for ours, polled cheaply: by their partial index of ready rows while any is
        # left (a count of the successful ones would scan a growing share of the table
        # 50 times a second, taking CPU from their workers), then counted to the end.
        ready = DBTaskResult.objects.filter(status="READY")
        _wait(lambda: not ready.exists(), 1800, "django-tasks-db")
        done = DBTaskResult.objects.filter(status="SUCCESSFUL")
        _wait(lambda: done.count() == n + 1, 60, "django-tasks-db's last tasks")
        seconds = time.perf_counter() - begin
    assert warm.id
    return {
        "tasks": n,
        "seconds": round(seconds, 3),
        "tasks_per_s": round(n / seconds),
        "tasks_per_s_by_timestamps": _by_timestamps(DBTaskResult.objects.exclude(id=warm.id), n),
    }


def theirs_from_a_backlog(n: int) -> dict[str, Any]:
    """django-tasks-db as an independent run measures it: *n* tasks enqueued first (one
    transaction), then two quiet ``db_worker`` processes started; the rate by the
    workers' own timestamps (first start to last finish), and by the clock from the
    workers' start (their start-up included)."""
    from django_tasks_db.models import DBTaskResult

    from benchmarks.djtasks_funcs import db_noop

    _clear()
    with transaction.atomic():
        for number in range(n):
            db_noop.enqueue(number)
    argv = ["db_worker", "--backend", "db", "--verbosity", "0"]
    begin = time.perf_counter()
    with _workers(argv, 2, "db-worker-backlog"):
        ready = DBTaskResult.objects.filter(status="READY")
        _wait(lambda: not ready.exists(), 1800, "django-tasks-db from a backlog")
        done = DBTaskResult.objects.filter(status="SUCCESSFUL")
        _wait(lambda: done.count() == n, 60, "django-tasks-db's last tasks")
        seconds = time.perf_counter() - begin
    return {
        "tasks": n,
        "seconds_from_workers_start": round(seconds, 3),
        "tasks_per_s_from_workers_start": round(n / seconds),
        "tasks_per_s_by_timestamps": _by_timestamps(DBTaskResult.objects.all(), n),
    }


def _by_timestamps(rows: Any, n: int) -> int:
    """The rate the workers' own timestamps give: *n* tasks from the first start to the
    last finish, as the database recorded them (no observer polling in the way)."""
    from django.db.models import Max, Min

    span = rows.aggregate(first=Min("started_at"), last=Max("finished_at"))
    return round(n / (span["last"] - span["first"]).total_seconds())


def _one_transaction_each(task: Any, count: int) -> int:
    begin = time.perf_counter()
    for number in range(count):
        with transaction.atomic():
            task.enqueue(number)
    return round(count / (time.perf_counter() - begin))


def enqueue_rates(n: int, pairs: int = PAIRS) -> dict[str, Any]:
    """Enqueue rates, no worker running, at the default options (ours: what the commit
    does after it included): *pairs* runs of each backend, alternating, then ours with
    the dispatcher thread, then ``enqueue_many``."""
    from django.conf import settings
    from django.test import override_settings
    from django_q.models import OrmQ

    from benchmarks.djtasks_funcs import db_noop, outbox_noop
    from django_outbox.tasks_backend.models import TaskRecord
    from django_outbox.transport import handoff
    from django_outbox.unique.background import DISPATCHER

    single = min(n, SINGLE_MAX)
    ours: list[int] = []
    theirs: list[int] = []
    for _ in range(pairs):
        _clear()
        ours.append(_one_transaction_each(outbox_noop, single))
        # The first INSERT queued the kind's wake (a django-q2 task that dispatches in a
        # worker); the others found it waiting untaken and relied on it.
        assert TaskRecord.objects.filter(state="pending").count() == single
        assert OrmQ.objects.count() == 1
        _clear()
        theirs.append(_one_transaction_each(db_noop, single))
    rates: dict[str, Any] = {
        "ours_one_transaction_each": round(statistics.median(ours)),
        "django_tasks_db_one_transaction_each": round(statistics.median(theirs)),
        "ours_runs": ours,
        "django_tasks_db_runs": theirs,
        "ratio": round(statistics.median(a / b for a, b in zip(ours, theirs, strict=True)), 2),
    }
    _clear()
    outbox = {**settings.DJANGO_OUTBOX, "DISPATCH_ON_COMMIT": "thread"}
    with override_settings(DJANGO_OUTBOX=outbox):
        rates["ours_one_transaction_each_dispatch_thread"] = _one_transaction_each(
            outbox_noop, single
        )
        DISPATCHER.idle.wait(60)
    assert TaskRecord.objects.filter(state="pending").count() == single
    assert OrmQ.objects.exists()  # the hand-offs, for the workers to dispatch
    _clear()
    with handoff.capture():
        begin = time.perf_counter()
        with transaction.atomic():
            created = outbox_noop.enqueue_many([((number,), {}) for number in range(n)])
        rates["ours_enqueue_many"] = round(n / (time.perf_counter() - begin))
    assert len(created) == n
    _clear()
    return {"single_tasks": single, "many_tasks": n, "tasks_per_s": rates}


def measure(n: int, pairs: int = PAIRS) -> dict[str, Any]:
    """*pairs* end-to-end runs of each backend, alternating, and the enqueue rates; the
    ratios are the medians of the pairs'."""
    if connection.vendor != "postgresql":
        raise SystemExit("The django.tasks benchmark needs PostgreSQL: set BENCH_DATABASE_URL.")
    runs = [(ours_end_to_end(n), theirs_end_to_end(n)) for _ in range(pairs)]
    # The same n tasks, as an independent run measures django-tasks-db: a backlog first,
    # then its workers (default polling interval), to reconcile the two ways.
    backlog = [theirs_from_a_backlog(n) for _ in range(pairs)]
    ratios = sorted(ours["tasks_per_s"] / theirs["tasks_per_s"] for ours, theirs in runs)
    stamped = sorted(
        ours["tasks_per_s_by_timestamps"] / theirs["tasks_per_s_by_timestamps"]
        for ours, theirs in runs
    )
    return {
        "django": django.get_version(),
        "end_to_end": [{"ours": ours, "django_tasks_db": theirs} for ours, theirs in runs],
        "end_to_end_ratio": round(statistics.median(ratios), 1),
        "end_to_end_ratios": [round(r, 1) for r in ratios],
        "end_to_end_ratio_by_timestamps": round(statistics.median(stamped), 1),
        "django_tasks_db_from_a_backlog": backlog,
        "enqueue": enqueue_rates(n, pairs),
    }


def both_passes(n: int, pairs: int = PAIRS) -> dict[str, Any]:
    """This process's pass with Django's default database options, then a pass in a
    child process with prepared statements (``BENCH_PREPARED=1``), for both backends."""
    from django.conf import settings

    report = {"default_options": measure(n, pairs)}
    if settings.PREPARED_STATEMENTS:
        return {"prepared_statements": report["default_options"]}
    child = subprocess.run(
        [sys.executable, "-m", "benchmarks.djtasks", str(n), str(pairs)],
        env={**os.environ, "BENCH_PREPARED": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    if child.returncode != 0:
        raise SystemExit(f"benchmark: the prepared-statements pass failed:\n{child.stderr}")
    return {**report, **json.loads(child.stdout)}


if __name__ == "__main__":
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    report = both_passes(
        int(sys.argv[1]) if len(sys.argv) > 1 else 20_000,
        int(sys.argv[2]) if len(sys.argv) > 2 else PAIRS,
    )
    if "default_options" in report:  # the parent: the report of both passes
        out = ROOT / "artifacts" / "bench-tasks.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
