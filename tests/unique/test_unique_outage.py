"""Unique jobs outlast a dropped connection and a database that is away for a while.

PostgreSQL: another session terminates the worker's connection (``pg_terminate_backend``,
as a failover or a restarted pooler does) in the middle of a chunk; for an outage longer
than the quick retries, the worker's new connections are refused for a number of tries
(as while a server restarts). The chunk's statements wait for the database and then
record what happened; nothing is left running for a lease, nothing raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from django.db import OperationalError, connection
from django.db.models.functions import Now

from django_outbox import tasks
from django_outbox.models import JobState
from django_outbox.transport import handoff
from django_outbox.unique.dispatch import dispatch
from django_outbox.unique.execute import JobOutcome, execute_chunk
from django_outbox.unique.sql import JobTable
from tests.uniqueapp.models import JobRun, KeyedJob

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def terminate_worker_connection() -> None:
    """Another session terminates this process's connection."""
    params = {
        key: value
        for key, value in connection.get_connection_params().items()
        if key in ("dbname", "user", "password", "host", "port")
    }
    with psycopg.connect(**params, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [connection.connection.info.backend_pid])


class Outage:
    """The database going away for the worker: :meth:`start` drops its connection, and
    the next *refusals* attempts to connect are refused (``None``: until :meth:`end`)."""

    def __init__(self, refusals: int | None) -> None:
        self.refusals = refusals
        self.started = False
        self.refused = 0

    def start(self) -> None:
        self.started = True
        terminate_worker_connection()

    def end(self) -> None:
        self.refusals = 0

    def connect(self, real, *args, **kwargs):
        if self.started and (self.refusals is None or self.refused < self.refusals):
            self.refused += 1
            raise psycopg.OperationalError("connection refused: the database is restarting")
        return real(*args, **kwargs)


@contextlib.contextmanager
def database_away(monkeypatch, refusals: int | None) -> Iterator[Outage]:
    """An :class:`Outage` of the worker's connection (from its :meth:`~Outage.start`)."""
    outage = Outage(refusals)
    real = connection.get_new_connection
    monkeypatch.setattr(
        connection, "get_new_connection", lambda *a, **k: outage.connect(real, *a, **k)
    )
    yield outage


def dispatched_chunk(count: int, **fields) -> tuple[list[KeyedJob], list[tuple[int, int]]]:
    """*count* keyed jobs enqueued and dispatched as one chunk: (jobs, the chunk)."""
    with handoff.capture() as queue:
        jobs = KeyedJob.enqueue_many([{"key": f"k{n}", **fields} for n in range(count)])
    assert len(queue) == 1, "one chunk"
    return jobs, [(pk, attempt) for pk, attempt in queue[0].args[1]]


@pytest.fixture
def chunk_of_three():
    """Keyed jobs A, B, C dispatched as one chunk (chunks of 3)."""
    options = KeyedJob.__dict__.get("_kind_options")
    KeyedJob._kind_options = dataclasses.replace(
        KeyedJob.job_options(), concurrency=6, chunk_size=3
    )
    try:
        with handoff.capture():  # the dispatches after each chunk: none run here
            yield dispatched_chunk(3)
    finally:
        KeyedJob._kind_options = options


def after_perform_of(job, monkeypatch, then) -> None:
    """Call *then()* right after *job*'s perform() returned or raised."""
    perform = KeyedJob.perform

    def perform_then(self, heartbeat):
        try:
            return perform(self, heartbeat)
        finally:
            if self.pk == job.pk:
                then()

    monkeypatch.setattr(KeyedJob, "perform", perform_then)


def runs() -> list[tuple[int, int]]:
    return sorted(JobRun.objects.values_list("job_id", "attempt"))


def states() -> dict[int, tuple[str, int]]:
    return {job.pk: (job.state, job.attempt) for job in KeyedJob.objects.all()}


def test_a_connection_dropped_while_a_job_runs_costs_the_chunk_nothing(chunk_of_three, monkeypatch):
    """The connection of the worker is terminated while job A of chunk A, B, C runs: the
    statement that records A and starts B reconnects; every job runs once and is
    processed, attempt 1."""
    jobs, chunk = chunk_of_three
    after_perform_of(jobs[0], monkeypatch, terminate_worker_connection)

    assert execute_chunk(KeyedJob, chunk) == [JobOutcome.PROCESSED] * 3

    assert runs() == [(job.pk, 1) for job in jobs]
    assert set(states().values()) == {(JobState.PROCESSED, 1)}


def test_a_chunk_waits_for_a_database_that_is_away_longer_than_the_quick_retries(
    chunk_of_three, monkeypatch
):
    """After A ran, the database goes away: its connection dropped, six new ones refused
    (the quick retries take three). The worker waits for it, then records A and runs B
    and C."""
    jobs, chunk = chunk_of_three
    with database_away(monkeypatch, refusals=6) as outage:
        after_perform_of(jobs[0], monkeypatch, outage.start)
        assert execute_chunk(KeyedJob, chunk) == [JobOutcome.PROCESSED] * 3
    assert outage.refused == 6
    assert runs() == [(job.pk, 1) for job in jobs]
    assert set(states().values()) == {(JobState.PROCESSED, 1)}


def test_a_failed_attempt_is_recorded_once_the_database_answers_again(chunk_of_three, monkeypatch):
    jobs, chunk = chunk_of_three
    KeyedJob.objects.filter(pk=jobs[0].pk).update(fail_attempts=1)
    with database_away(monkeypatch, refusals=6) as outage:
        after_perform_of(jobs[0], monkeypatch, outage.start)
        assert execute_chunk(KeyedJob, chunk) == [
            JobOutcome.RETRYING,
            JobOutcome.PROCESSED,
            JobOutcome.PROCESSED,
        ]
    assert outage.refused == 6
    failed = KeyedJob.objects.get(pk=jobs[0].pk)
    assert (failed.state, failed.attempt) == (JobState.PENDING, 1)
    assert "planned failure of attempt 1" in failed.last_error


def test_a_job_interrupted_by_the_database_runs_again_under_its_lease(chunk_of_three, monkeypatch):
    """The connection drops as A starts, so A's own writes fail: not A's fault. A runs
    again, same attempt, once the database answers; it loses no attempt."""
    jobs, chunk = chunk_of_three
    perform = KeyedJob.perform
    dropped = []

    def drop_first(self, heartbeat):
        if self.pk == jobs[0].pk and not dropped:
            dropped.append(1)
            terminate_worker_connection()
        return perform(self, heartbeat)

    monkeypatch.setattr(KeyedJob, "perform", drop_first)
    assert execute_chunk(KeyedJob, chunk) == [JobOutcome.PROCESSED] * 3
    assert runs() == [(job.pk, 1) for job in jobs]
    assert set(states().values()) == {(JobState.PROCESSED, 1)}


@pytest.mark.parametrize("per_statement", [1, 8], ids=["one-per-statement", "default"])
def test_a_step_whose_commit_went_through_is_recognized_when_run_again(
    chunk_of_three, monkeypatch, per_statement
):
    """The first statement after A ran commits, but its answer is lost with the
    connection. One job per statement: it records A and starts B; run again, it finds A
    processed and B started with its token: A is not reported late, B runs (it is not
    left running for its lease). At the default (8), the three were started together
    and it records all three; run again, it finds them processed under their token."""
    jobs, chunk = chunk_of_three
    KeyedJob._kind_options = dataclasses.replace(
        KeyedJob.job_options(), jobs_per_statement=per_statement
    )
    real = JobTable._rows
    lost = []

    def answer_lost(self, sql, params):
        rows = real(self, sql, params)
        if "started_at = CASE" in sql and JobRun.objects.exists() and not lost:
            lost.append(rows)
            terminate_worker_connection()
            raise OperationalError("server closed the connection unexpectedly")
        return rows

    monkeypatch.setattr(JobTable, "_rows", answer_lost)
    assert execute_chunk(KeyedJob, chunk) == [JobOutcome.PROCESSED] * 3
    recorded = [jobs[0].pk, jobs[1].pk] if per_statement == 1 else [job.pk for job in jobs]
    assert sorted(row[0] for row in lost[0]) == recorded, "it had committed"
    assert runs() == [(job.pk, 1) for job in jobs]
    assert set(states().values()) == {(JobState.PROCESSED, 1)}


def test_a_database_away_for_longer_than_the_wait_ends_the_chunk_and_the_task_returns(
    chunk_of_three, monkeypatch
):
    """One job per statement; away for longer than the kind's outage_seconds (half its
    5 s lease): the task function returns; A (performed, not recorded) is left to its
    lease; B and C were never started: a dispatch hands them back with their attempt
    not counted."""
    jobs, chunk = chunk_of_three
    KeyedJob._kind_options = dataclasses.replace(KeyedJob.job_options(), jobs_per_statement=1)
    with database_away(monkeypatch, refusals=None) as outage:
        after_perform_of(jobs[0], monkeypatch, outage.start)
        outcomes = tasks.run_unique_jobs("uniqueapp.KeyedJob", [list(pair) for pair in chunk])
        assert outcomes == [JobOutcome.INTERRUPTED.value] * 3
        outage.end()
    rows = {job.pk: job for job in KeyedJob.objects.all()}
    a, b, c = (rows[job.pk] for job in jobs)
    assert (a.state, a.attempt) == (JobState.RUNNING, 1) and a.started_at is not None
    for job in (b, c):
        assert (job.state, job.attempt, job.started_at) == (JobState.RUNNING, 1, None)
    assert runs() == [(jobs[0].pk, 1)]

    KeyedJob.objects.update(lease_expires_at=Now() - timedelta(seconds=1))
    with handoff.capture() as queue:
        dispatch(KeyedJob)
    restarted = sorted(pair for job in queue for pair in job.args[1])
    assert restarted == [(jobs[0].pk, 2), (jobs[1].pk, 1), (jobs[2].pk, 1)]


def test_a_database_away_longer_than_the_wait_at_the_default_costs_the_group_nothing(
    chunk_of_three, monkeypatch
):
    """At the default (8 per statement), A, B and C were started together; the database
    goes away after A ran, for longer than the wait: the chunk ends, the three are left
    to their leases, and the rescue hands all three back with their attempt not counted
    (which one was running is not known), each to run alone next."""
    jobs, chunk = chunk_of_three
    assert KeyedJob.job_options().jobs_per_statement == 8
    with database_away(monkeypatch, refusals=None) as outage:
        after_perform_of(jobs[0], monkeypatch, outage.start)
        outcomes = tasks.run_unique_jobs("uniqueapp.KeyedJob", [list(pair) for pair in chunk])
        assert outcomes == [JobOutcome.INTERRUPTED.value] * 3
        outage.end()
    started = KeyedJob.objects.filter(state=JobState.RUNNING, started_at__isnull=False)
    assert started.count() == 3
    KeyedJob.objects.update(lease_expires_at=Now() - timedelta(seconds=1))
    with handoff.capture() as queue:
        dispatch(KeyedJob)
    restarted = sorted(pair for job in queue for pair in job.args[1])
    assert restarted == [(job.pk, 1) for job in jobs]
