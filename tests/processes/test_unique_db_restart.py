"""Process tier: unique jobs and tasks outlast database restarts, with no operator.

A throwaway PostgreSQL (its own server, so that restarting it disturbs nothing else) is
restarted twice (fast shutdown: every session terminated, connections refused for 3 s)
while a real qcluster of two workers runs a backlog of unique jobs at the default
options (a 300 s lease, chunks of 5, concurrency 10) and, where Django has
``django.tasks``, a backlog of tasks of the backend at its defaults. No dispatch
schedule runs and the test dispatches nothing: the workers go on by themselves.

Then: every job and task is processed in its first attempt, within 60 s of the
database's second return (one left running for its lease would wait 300 s); a job ran
twice only if it was in flight at a restart (at most the chunks in flight: a worker's
chunk per worker per restart); every django-q2 task returned.

The restarts come once a third, then two thirds of the backlog were worked off. The
test runs 2,000 jobs and 1,000 tasks to stay short; ``OUTBOX_TEST_OUTAGE_JOBS`` and
``OUTBOX_TEST_OUTAGE_TASKS`` set other numbers (20,000 tasks and no jobs: the run of the
guarantee's statement).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections import Counter

import psycopg
import pytest
from django.conf import settings

from django_outbox.unique.options import DEFAULTS
from tests.outage import fresh_rows, restartable_postgres
from tests.procs import ROOT, child_env, qcluster, wait_until
from tests.testapp.models import JobEffect
from tests.uniqueapp.models import JobRun, KeyedJob

pytestmark = [pytest.mark.process, pytest.mark.postgres]

JOBS = int(os.environ.get("OUTBOX_TEST_OUTAGE_JOBS", 2000))
TASKS = (
    int(os.environ.get("OUTBOX_TEST_OUTAGE_TASKS", JOBS // 2)) if settings.TASKS_AVAILABLE else 0
)
OUTAGE_SECONDS = 3.0
#: The restarts come after 1 and 2 steps of the backlog: early, so that work is left
#: after each to see it move again (on a quiet machine the workers finish hundreds of
#: jobs while the server shuts down; a third of the backlog per step left none).
STEP = (JOBS + TASKS) // 6
#: KeyedJob at the defaults of every option execution and dispatch read.
DEFAULT_OPTIONS = {
    name: DEFAULTS[name]
    for name in (
        "concurrency",
        "chunk_size",
        "jobs_per_statement",
        "lease_seconds",
        "max_attempts",
        "backoff_seconds",
        "backoff_max_seconds",
    )
}
WORKERS = settings.Q_CLUSTER["workers"]
#: A restart may repeat the jobs of the chunks in flight: one chunk per worker.
CHUNK = min(DEFAULT_OPTIONS["chunk_size"], math.ceil(DEFAULT_OPTIONS["concurrency"] / WORKERS))
DUPLICATES_BOUND = 2 * WORKERS * CHUNK
#: The jobs in flight at a restart are processed within this long of the return (one
#: left to its lease would wait 300 s).
RETURN_SECONDS = 60.0


def test_unique_jobs_and_tasks_outlast_two_database_restarts_with_no_operator():
    with restartable_postgres() as server:
        with psycopg.connect(server.conninfo("postgres"), autocommit=True) as admin:
            admin.execute("CREATE DATABASE outbox_jobs_outage")
            # The test jobs record each run in a row of their own: without waiting for
            # the disk (a fast shutdown still flushes every commit), so that the run
            # measures the job engine, not the disk of a busy machine.
            admin.execute("ALTER SYSTEM SET synchronous_commit = off")
            admin.execute("SELECT pg_reload_conf()")
        env = {
            "DATABASE_URL": server.url("outbox_jobs_outage"),
            "OUTBOX_TEST_KIND_OPTIONS": json.dumps({KeyedJob._meta.label: DEFAULT_OPTIONS}),
        }
        django = [sys.executable, "-m", "django"]
        subprocess.run([*django, "migrate", "-v", "0"], cwd=ROOT, env=child_env(**env), check=True)
        preload = f"from tests.outage import enqueue_backlog; enqueue_backlog({JOBS}, {TASKS})"
        subprocess.run([sys.executable, "-c", preload], cwd=ROOT, env=child_env(**env), check=True)

        db = Jobs(server.conninfo("outbox_jobs_outage"))
        assert db.processed() < JOBS + TASKS
        recoveries, settled = [], []
        with qcluster("jobs-outage-cluster", **env) as cluster:
            for restart in (1, 2):
                # Restart while work is flowing.
                wait_until(lambda r=restart: db.processed() >= r * STEP, 600, watch=[cluster])
                server.stop()
                time.sleep(OUTAGE_SECONDS)  # the outage itself: connections refused
                server.start()
                back = time.monotonic()
                in_flight = db.running()  # nothing changed while the database was away
                base = db.processed()
                wait_until(lambda b=base: db.processed() > b, 60, 0.01, watch=[cluster])
                recoveries.append(time.monotonic() - back)
                wait_until(
                    lambda jobs=in_flight: not db.running() & jobs,
                    RETURN_SECONDS - (time.monotonic() - back),
                    0.1,
                    describe=db.describe,
                    watch=[cluster],
                )
                settled.append((len(in_flight), time.monotonic() - back))
            wait_until(db.finished, 600, 0.2, describe=db.describe, watch=[cluster])
            drained = time.monotonic() - back

        assert db.states() == {("processed", 1): JOBS + TASKS}, "one attempt each"
        performed = db.performances()
        assert set(performed) == {f"k{n}" for n in range(JOBS)} | {f"t{n}" for n in range(TASKS)}
        duplicates = sum(count - 1 for count in performed.values())
        assert duplicates <= DUPLICATES_BOUND
        assert db.failed_queue_tasks() == [], "a django-q2 task raised"
        assert all(seconds < 10 for seconds in recoveries), recoveries
        print(
            f"\n{JOBS:,} jobs and {TASKS:,} tasks; after each restart: moving again in "
            f"{', '.join(f'{s:.2f} s' for s in recoveries)}, the jobs in flight processed in "
            f"{', '.join(f'{s:.1f} s ({n})' for n, s in settled)}; all processed "
            f"{drained:.1f} s after the second; performed twice: {duplicates} "
            f"(bound {DUPLICATES_BOUND})"
        )


class Jobs:
    """Reads of the throwaway database, each on a fresh connection (it restarts)."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.tables = [KeyedJob._meta.db_table]
        if TASKS:
            from django_outbox.tasks_backend.models import TaskRecord

            self.tables.append(TaskRecord._meta.db_table)

    def rows(self, sql: str, *params: object) -> list[tuple]:
        return fresh_rows(self.conninfo, sql, *params)

    def _union(self, columns: str) -> str:
        return " UNION ALL ".join(f"SELECT {columns} FROM {table}" for table in self.tables)

    def running(self) -> set[tuple[str, int]]:
        """The running jobs and tasks: (table, id)."""
        union = " UNION ALL ".join(
            f"SELECT '{table}', id FROM {table} WHERE state = 'running'" for table in self.tables
        )
        return set(self.rows(union))

    def processed(self) -> int:
        return self.rows(
            f"SELECT count(*) FROM ({self._union('state')}) j WHERE state = 'processed'"
        )[0][0]

    def finished(self) -> bool:
        return self.processed() == JOBS + TASKS

    def states(self) -> dict[tuple[str, int], int]:
        rows = self.rows(
            f"SELECT state, attempt, count(*) FROM ({self._union('state, attempt')}) j "
            "GROUP BY state, attempt"
        )
        return {(state, attempt): count for state, attempt, count in rows}

    def describe(self) -> str:
        """The states, the running jobs and the queue of django-q2 (a failing test's)."""
        running = self.rows(
            f"SELECT id, attempt, started_at IS NOT NULL, worker, lease_expires_at - now() "
            f"FROM {KeyedJob._meta.db_table} WHERE state = 'running' ORDER BY id LIMIT 20"
        )
        queue = self.rows("SELECT id, lock - now(), left(payload, 0) FROM django_q_ormq")
        return f"{self.states()}; running: {running}; django-q2 queue: {queue}"

    def performances(self) -> Counter:
        """How many times each job (its key) and each task (its label) was performed."""
        rows = self.rows(
            f"SELECT key, count(*) FROM {JobRun._meta.db_table} GROUP BY key "
            f"UNION ALL SELECT label, count(*) FROM {JobEffect._meta.db_table} GROUP BY label"
        )
        return Counter(dict(rows))

    def failed_queue_tasks(self) -> list[tuple]:
        return self.rows("SELECT func, result FROM django_q_task WHERE NOT success LIMIT 5")
