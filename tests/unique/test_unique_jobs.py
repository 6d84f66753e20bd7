"""Unique jobs, fast tier: enqueue, dispatch, execute and fencing, inline (no cluster).

Jobs handed to django-q2 are captured (``handoff.capture``) and run in this process
with the same code the cluster runs.
"""

from __future__ import annotations

import dataclasses
import math
import re
import threading
from collections import deque
from datetime import UTC, timedelta

import pytest
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, connection, connections, models, transaction
from django.db.models import F
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext, isolate_apps
from django.utils.dateparse import parse_datetime

from django_outbox.base.dialect import database_now, dialect_of
from django_outbox.base.durations import MAX_DURATION
from django_outbox.base.jsondata import MAX_DEPTH
from django_outbox.exceptions import DurationError, JobError, LeaseLost
from django_outbox.models import JobState, UniqueJob
from django_outbox.transport import handoff
from django_outbox.unique.dispatch import RUN, chunk_length, dispatch, dispatch_after_commit
from django_outbox.unique.execute import (
    Heartbeat,
    JobOutcome,
    execute_chunk,
    execute_job,
    finish,
    give_back,
    retry_or_fail,
    take_job_lease,
)
from django_outbox.unique.sql import JobTable, new_token
from tests.procs import wait_until
from tests.uniqueapp.models import (
    BeatingJob,
    JobRun,
    KeyedJob,
    OrderedJob,
    PriorityJob,
    ReadyJob,
    ThrottledJob,
)

pytestmark = pytest.mark.django_db(transaction=True)


def run_all(queue: deque[handoff.Job]) -> list[str]:
    """Run captured jobs, and the jobs they enqueue, until none is left; return outcomes."""
    outcomes = []
    while queue:
        job = queue.popleft()
        assert job.func == RUN
        outcomes.extend(job.run())  # a chunk: the outcome of each of its jobs
    return outcomes


def started(queue: deque[handoff.Job]) -> list[tuple[str, int, int]]:
    """The (kind, id, attempt) of every job handed to django-q2, chunk after chunk."""
    return [(job.args[0], pk, attempt) for job in queue for pk, attempt in job.args[1]]


# -- enqueue ---------------------------------------------------------------------------


def test_enqueue_creates_a_pending_job_then_returns_it_while_it_is_pending():
    with handoff.capture(), transaction.atomic():
        first, created = KeyedJob.enqueue(key="a", note="first")
        again, created_again = KeyedJob.enqueue(key="a", note="second")
        other, created_other = KeyedJob.enqueue(key="b")

    assert (created, created_again, created_other) == (True, False, True)
    assert again.pk == first.pk and again.note == "first"
    assert other.pk != first.pk
    assert first.state == JobState.PENDING and first.attempt == 0
    assert first.created_at is not None and first.process_after is not None
    assert KeyedJob.objects.count() == 2


def enqueue_while_performing(monkeypatch, model, **fields) -> list:
    """Make the next ``perform()`` of *model* enqueue a job of *fields* first (its own
    transaction, as a request would while the job runs); the list gets ``(job, created)``."""
    made: list = []
    perform = model.perform

    def performing(self, heartbeat):
        if not made:
            made.append(model.enqueue(**fields))
        return perform(self, heartbeat)

    monkeypatch.setattr(model, "perform", performing)
    return made


# -- unique until a worker starts the job ----------------------------------------------


def test_a_dispatched_job_absorbs_every_enqueue_of_its_key_until_a_worker_starts_it():
    with handoff.capture() as queue:
        job, _ = KeyedJob.enqueue(key="a", note="first")  # its commit dispatches it
        assert started(queue) == [("uniqueapp.KeyedJob", job.pk, 1)]
        again = [KeyedJob.enqueue(key="a", note=f"call {n}") for n in range(5)]
        assert again == [(job, False)] * 5
        assert again[0][0].note == "first" and again[0][0].state == JobState.RUNNING
        assert started(queue) == [("uniqueapp.KeyedJob", job.pk, 1)]  # nothing more

        assert take_job_lease(KeyedJob, job.pk, 1, "worker")  # a worker starts it
        newer, created = KeyedJob.enqueue(key="a")

    assert created and newer.pk != job.pk
    assert dict(KeyedJob.objects.values_list("pk", "state")) == {
        job.pk: JobState.RUNNING,
        newer.pk: JobState.PENDING,
    }


def test_enqueue_many_skips_keys_whose_job_is_dispatched_and_not_started():
    with handoff.capture() as queue:
        job, _ = KeyedJob.enqueue(key="a")
        created = KeyedJob.enqueue_many([{"key": "a"}, {"key": "b"}])
        assert [created_job.key for created_job in created] == ["b"]
        queue.clear()
        take_job_lease(KeyedJob, job.pk, 1, "worker")
        assert [j.key for j in KeyedJob.enqueue_many([{"key": "a"}, {"key": "b"}])] == ["a"]


def test_a_job_started_in_a_group_frees_its_key_with_the_group(kind_options, monkeypatch):
    """With ``jobs_per_statement`` > 1, one statement starts the group's jobs: each frees
    its key then, also a job that waits for its turn behind another."""
    kind_options(KeyedJob, jobs_per_statement=2)
    seen = []
    perform = KeyedJob.perform

    def performing(self, heartbeat):
        if self.key == "a":  # while the first job runs, the second is started, waiting
            seen.append(KeyedJob.enqueue(key="b")[1])
        return perform(self, heartbeat)

    with handoff.capture() as queue:
        with transaction.atomic():
            KeyedJob.enqueue(key="a")
            KeyedJob.enqueue(key="b")
        [chunk] = queue
        queue.clear()
        monkeypatch.setattr(KeyedJob, "perform", performing)
        # The chunk, then the new job of "b" (dispatched after the chunk, kept by it).
        assert chunk.run() == [JobOutcome.PROCESSED.value] * 3

    assert seen == [True]  # a new job: the waiting one had left the key's window
    assert KeyedJob.objects.filter(key="b").count() == 2


def test_a_dispatched_job_whose_lease_expired_unstarted_returns_to_pending_holding_its_key():
    with handoff.capture() as queue:
        job, _ = KeyedJob.enqueue(key="a")
        queue.clear()  # its worker lost the task before starting it
        KeyedJob.objects.filter(pk=job.pk).update(lease_expires_at=Now() - timedelta(seconds=1))
        assert KeyedJob.enqueue(key="a") == (job, False)  # still absorbs, lease or not

        result = dispatch(KeyedJob)  # rescued (attempt not counted) and dispatched again
        assert (result.rescued, result.dispatched) == (1, 1)
        assert KeyedJob.enqueue(key="a") == (job, False)
        assert started(queue) == [("uniqueapp.KeyedJob", job.pk, 1)]
        assert run_all(queue) == [JobOutcome.PROCESSED.value]

    assert list(KeyedJob.objects.values_list("pk", "state")) == [(job.pk, JobState.PROCESSED)]


def test_a_failed_attempt_waiting_for_its_retry_absorbs_enqueues_of_its_key():
    with handoff.capture() as queue:
        job, _ = KeyedJob.enqueue(key="a", fail_attempts=1)
        assert run_all(queue) == [JobOutcome.RETRYING.value]
        assert KeyedJob.enqueue(key="a") == (job, False)
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.PENDING, 1)


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="SQLite serializes writers: no race to lose"
)
def test_an_enqueue_racing_a_dispatch_of_its_key_never_makes_a_second_job():
    """The unique index decides, not a check: an enqueue whose INSERT meets the key of a
    job that a concurrent dispatch is starting waits for it, then returns that job."""
    with handoff.capture():
        with transaction.atomic():
            job, _ = KeyedJob.enqueue(key="a", process_after=timedelta(hours=1))
    KeyedJob.objects.filter(pk=job.pk).update(process_after=Now())
    holding, release = threading.Event(), threading.Event()
    enqueued: list = []

    def dispatcher():
        try:
            with transaction.atomic():
                assert JobTable(KeyedJob).start_next(10) == [(job.pk, 1)]
                holding.set()
                release.wait(30)  # the dispatch has not committed yet
        finally:
            connections.close_all()

    def enqueuer():
        try:
            with handoff.capture():
                enqueued.append(KeyedJob.enqueue(key="a"))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=dispatcher), threading.Thread(target=enqueuer)]
    threads[0].start()
    assert holding.wait(30)
    threads[1].start()
    wait_until(lambda: waiting_on_a_lock(connection), timeout=30)  # the INSERT waits
    release.set()
    for thread in threads:
        thread.join(30)

    assert [(found.pk, created) for found, created in enqueued] == [(job.pk, False)]
    assert list(KeyedJob.objects.values_list("pk", "state", "started_at")) == [
        (job.pk, JobState.RUNNING, None)
    ]


def waiting_on_a_lock(conn) -> bool:
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0] > 0


def test_enqueue_takes_process_after_as_a_delay_from_the_database_clock():
    before = database_now()
    with handoff.capture() as queue:
        job, _ = KeyedJob.enqueue(key="later", process_after=timedelta(hours=1))
    after = database_now()

    assert not queue, "a job held back must not be dispatched"
    assert before + timedelta(hours=1) <= job.process_after <= after + timedelta(hours=1)


def test_enqueue_rejects_managed_fields_and_naive_datetimes():
    with pytest.raises(JobError) as managed:
        KeyedJob.enqueue(key="a", state="running")
    with pytest.raises(JobError) as naive:
        KeyedJob.enqueue(key="a", process_after=database_now().replace(tzinfo=None))

    assert str(managed.value) == (
        "uniqueapp.KeyedJob.enqueue() got state: these fields are managed by django_outbox. "
        "Pass only the kind's own fields (and process_after)."
    )
    assert str(naive.value).startswith(
        "uniqueapp.KeyedJob.enqueue(process_after=...) takes an aware datetime or a timedelta"
    )
    assert not KeyedJob.objects.exists()


def test_enqueue_with_a_delay_in_the_past_makes_the_job_ready_now():
    before = database_now()
    with handoff.capture():
        job, created = KeyedJob.enqueue(key="late", process_after=timedelta(seconds=-5))
    after = database_now()

    assert created
    assert before <= job.process_after <= after


@pytest.mark.parametrize(
    "delay", [MAX_DURATION + timedelta(days=1), timedelta.max], ids=["101 years", "max"]
)
def test_enqueue_refuses_a_delay_beyond_a_hundred_years(delay):
    with pytest.raises(DurationError) as error:
        KeyedJob.enqueue(key="never", process_after=delay)

    assert str(error.value).startswith(
        "uniqueapp.KeyedJob.enqueue(process_after=...) must be between 0 seconds and 36500 days"
    )
    assert not KeyedJob.objects.exists()


def test_the_database_clock_moves_back_by_a_negative_number_of_seconds(vendor):
    connection = connections["default"]
    expression, params = dialect_of(connection).seconds_from_now(-3600.5)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {expression}", params)
        value = cursor.fetchone()[0]
    moved = parse_datetime(value).replace(tzinfo=UTC) if isinstance(value, str) else value

    assert moved is not None
    assert abs(database_now() - timedelta(seconds=3600.5) - moved) < timedelta(minutes=1)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"key": "nul\x00"}, "the value of key cannot be stored: it holds a NUL character"),
        (
            {"key": "\ud800"},
            "the value of key cannot be stored: it holds a NUL character or a lone",
        ),
        (
            {"key": "nan", "work_seconds": math.nan},
            "the value of work_seconds cannot be stored: it is NaN",
        ),
    ],
    ids=["nul", "surrogate", "nan"],
)
def test_enqueue_refuses_values_a_supported_database_cannot_store(fields, reason):
    with pytest.raises(JobError, match=re.escape(f"uniqueapp.KeyedJob.enqueue(): {reason}")):
        KeyedJob.enqueue(**fields)
    assert not KeyedJob.objects.exists()


def test_enqueue_refuses_a_json_field_nested_deeper_than_the_bound():
    with isolate_apps("tests.uniqueapp"):

        class FeedJob(UniqueJob):
            feed = models.JSONField(encoder=DjangoJSONEncoder)

            class Meta:
                app_label = "uniqueapp"

            def perform(self, heartbeat):
                pass

        deep: object = 1
        for _ in range(MAX_DEPTH + 1):
            deep = [deep]
        with pytest.raises(JobError, match=rf"the value of feed cannot be stored: .*{MAX_DEPTH}"):
            FeedJob.enqueue(feed=deep)
        with pytest.raises(JobError, match=r"the value of feed cannot be stored: .*NUL"):
            FeedJob.enqueue(feed={"note": "\x00"})


def test_a_rolled_back_enqueue_leaves_nothing_and_dispatches_nothing():
    with handoff.capture() as queue:
        with pytest.raises(RuntimeError), transaction.atomic():
            KeyedJob.enqueue(key="a")
            raise RuntimeError("rollback")
    assert not queue and not KeyedJob.objects.exists()


def test_enqueue_many_creates_jobs_in_bulk_and_skips_keys_already_pending():
    with handoff.capture() as queue:
        pending, _ = KeyedJob.enqueue(key="a", process_after=timedelta(hours=1))
        with transaction.atomic():
            created = KeyedJob.enqueue_many(
                [{"key": "a"}, {"key": "b", "note": "first"}, {"key": "b"}, {"key": "c"}]
            )
            assert not queue, "dispatch waits for the commit"
        assert [(job.key, job.note, job.state) for job in created] == [
            ("b", "first", JobState.PENDING),
            ("c", "", JobState.PENDING),
        ]
        assert started(queue) == [
            ("uniqueapp.KeyedJob", created[0].pk, 1),
            ("uniqueapp.KeyedJob", created[1].pk, 1),
        ]
    assert KeyedJob.objects.count() == 3
    assert KeyedJob.objects.get(pk=pending.pk).state == JobState.PENDING  # untouched


def test_enqueue_many_checks_every_item_before_writing_and_rolls_back_with_the_caller():
    with handoff.capture() as queue:
        with pytest.raises(JobError, match=r"KeyedJob.enqueue_many\(\) got state"):
            KeyedJob.enqueue_many([{"key": "a"}, {"key": "b", "state": "running"}])
        with pytest.raises(RuntimeError), transaction.atomic():
            KeyedJob.enqueue_many([{"key": f"k{n}"} for n in range(2500)])
            assert KeyedJob.objects.count() == 2500
            raise RuntimeError("rollback")
    assert not queue and not KeyedJob.objects.exists()


def test_enqueue_many_takes_process_after_for_every_job():
    with handoff.capture() as queue:
        created = KeyedJob.enqueue_many(
            [{"key": "a"}, {"key": "b"}], process_after=timedelta(hours=1)
        )
    assert not queue
    later = database_now() + timedelta(minutes=59)
    jobs = KeyedJob.objects.filter(pk__in=[job.pk for job in created])
    assert len(jobs) == 2 and all(job.process_after > later for job in jobs)


def test_the_pending_index_rejects_a_second_pending_job_written_around_enqueue():
    KeyedJob.objects.create(key="a")
    with pytest.raises(IntegrityError), transaction.atomic():
        KeyedJob.objects.create(key="a")


# -- dispatch --------------------------------------------------------------------------


def test_dispatch_after_commit_starts_the_job_with_attempt_one_and_a_lease():
    with handoff.capture() as queue:
        with transaction.atomic():
            job, _ = KeyedJob.enqueue(key="a")
            assert not queue, "nothing is dispatched before the commit"
    job.refresh_from_db()

    assert started(queue) == [("uniqueapp.KeyedJob", job.pk, 1)]
    assert (job.state, job.attempt, job.started_at) == (JobState.RUNNING, 1, None)
    assert job.lease_expires_at > database_now()


def test_dispatch_honours_the_concurrency_limit():
    with handoff.capture() as queue:
        with transaction.atomic():
            for n in range(5):
                ThrottledJob.enqueue(key=f"k{n}")
        assert len(queue) == 2
        assert dispatch(ThrottledJob).dispatched == 0
    assert ThrottledJob.objects.filter(state=JobState.RUNNING).count() == 2


def test_finishing_a_job_frees_its_slot_and_dispatches_the_next():
    with handoff.capture() as queue:
        with transaction.atomic():
            jobs = [ThrottledJob.enqueue(key=f"k{n}")[0] for n in range(5)]
        outcomes = run_all(queue)

    assert outcomes == [JobOutcome.PROCESSED.value] * 5
    # Each ran once; the worker that finished a job ran the next one it dispatched.
    assert sorted(JobRun.objects.values_list("job_id", flat=True)) == [job.pk for job in jobs]
    assert set(ThrottledJob.objects.values_list("state", flat=True)) == {JobState.PROCESSED}


# -- chunks ----------------------------------------------------------------------------


@pytest.fixture
def kind_options():
    """Override a kind's effective options for one test: ``kind_options(Kind, option=…)``."""
    changed = []

    def override(model, **options):
        changed.append((model, model.__dict__.get("_kind_options")))
        model._kind_options = dataclasses.replace(model.job_options(), **options)

    yield override
    for model, declared in reversed(changed):
        model._kind_options = declared


def test_dispatch_hands_ready_jobs_over_in_chunks_spread_over_the_workers(settings):
    # KeyedJob: concurrency 4; the test cluster has 2 workers: chunks of 2.
    assert settings.Q_CLUSTER["workers"] == 2
    assert chunk_length(KeyedJob.job_options()) == 2
    with handoff.capture() as queue:
        with transaction.atomic():
            jobs = [KeyedJob.enqueue(key=f"k{n}")[0] for n in range(5)]
    assert [job.args for job in queue] == [
        ("uniqueapp.KeyedJob", [(jobs[0].pk, 1), (jobs[1].pk, 1)]),
        ("uniqueapp.KeyedJob", [(jobs[2].pk, 1), (jobs[3].pk, 1)]),
    ]
    assert KeyedJob.objects.get(pk=jobs[4].pk).state == JobState.PENDING


def test_chunk_size_caps_the_jobs_of_one_task(kind_options):
    kind_options(KeyedJob, concurrency=10, chunk_size=3)
    with handoff.capture() as queue:
        with transaction.atomic():
            for n in range(10):
                KeyedJob.enqueue(key=f"k{n}")
    assert [len(job.args[1]) for job in queue] == [3, 3, 3, 1]


def test_each_job_of_a_chunk_has_its_own_attempt_and_outcome():
    with handoff.capture() as queue:
        with transaction.atomic():
            first, _ = KeyedJob.enqueue(key="a")
            failing, _ = KeyedJob.enqueue(key="b", fail_attempts=1)
        assert len(queue) == 1
        assert queue[0].run() == [JobOutcome.PROCESSED.value, JobOutcome.RETRYING.value]
    first.refresh_from_db()
    failing.refresh_from_db()
    assert (first.state, first.attempt, first.last_error) == (JobState.PROCESSED, 1, "")
    assert (failing.state, failing.attempt) == (JobState.PENDING, 1)
    assert "planned failure of attempt 1" in failing.last_error


# -- several jobs per statement (jobs_per_statement) -------------------------------------


def step_statements(queries: CaptureQueriesContext) -> int:
    """How many of the captured statements started or finished jobs (JobTable.steps)."""
    return sum("started_at = CASE" in query["sql"] for query in queries.captured_queries)


def dispatched_chunk(count: int, **fields) -> tuple[list[KeyedJob], list[tuple[int, int]]]:
    """*count* keyed jobs enqueued and dispatched as one chunk: (jobs, the chunk)."""
    with handoff.capture() as queue:
        with transaction.atomic():
            jobs = [KeyedJob.enqueue(key=f"k{n}", **fields)[0] for n in range(count)]
    assert len(queue) == 1
    return jobs, [(pk, attempt) for pk, attempt in queue[0].args[1]]


def test_a_group_of_jobs_starts_in_one_statement_and_the_next_records_their_success(
    kind_options,
):
    kind_options(KeyedJob, concurrency=20, chunk_size=10, jobs_per_statement=4)
    jobs, chunk = dispatched_chunk(10)
    with CaptureQueriesContext(connection) as queries:
        outcomes = execute_chunk(KeyedJob, chunk)
    assert outcomes == [JobOutcome.PROCESSED] * 10
    # Groups of 4, 4 and 2: three statements start them, the last one records the end
    # (one job at a time: eleven).
    assert step_statements(queries) == 4
    assert sorted(JobRun.objects.values_list("job_id", flat=True)) == [job.pk for job in jobs]
    done = KeyedJob.objects.filter(state=JobState.PROCESSED, attempt=1, lease_expires_at=None)
    assert done.count() == 10


def test_a_failure_in_a_group_is_recorded_at_once_and_costs_the_others_nothing(kind_options):
    kind_options(KeyedJob, concurrency=20, chunk_size=10, jobs_per_statement=4)
    jobs, chunk = dispatched_chunk(4)
    KeyedJob.objects.filter(pk=jobs[1].pk).update(fail_attempts=1)
    assert execute_chunk(KeyedJob, chunk) == [
        JobOutcome.PROCESSED,
        JobOutcome.RETRYING,
        JobOutcome.PROCESSED,
        JobOutcome.PROCESSED,
    ]
    states = dict(KeyedJob.objects.values_list("pk", "state"))
    assert [states[job.pk] for job in jobs] == [
        JobState.PROCESSED,
        JobState.PENDING,
        JobState.PROCESSED,
        JobState.PROCESSED,
    ]
    assert "planned failure of attempt 1" in KeyedJob.objects.get(pk=jobs[1].pk).last_error


class WorkerDied(BaseException):
    """A worker's death as its chunk sees it: nothing after it runs, nothing is recorded."""


def expire_leases() -> None:
    KeyedJob.objects.filter(state=JobState.RUNNING).update(
        lease_expires_at=Now() - timedelta(seconds=1)
    )


def run_until_a_worker_dies(queue: deque[handoff.Job]) -> None:
    """Run the captured chunks (and those they enqueue) until one kills its worker."""
    while queue:
        try:
            queue.popleft().run()
        except WorkerDied:
            return
    pytest.fail("no worker died")


def test_a_crash_in_a_group_at_the_default_size_costs_only_the_running_job_an_attempt(
    kind_options, monkeypatch
):
    """A worker dies while a group of 8 (the default) is started: jobs before the one
    it ran succeeded (not recorded yet), jobs after it had not begun. The database
    cannot tell them apart: none loses an attempt, and each runs alone next time; the
    job that kills its worker again, alone, loses that attempt."""
    kind_options(KeyedJob, concurrency=20, chunk_size=10)
    assert KeyedJob.job_options().jobs_per_statement == 8
    jobs, chunk = dispatched_chunk(10)
    culprit = jobs[2].pk
    perform = KeyedJob.perform

    def dies_on_its_first_attempt(self, heartbeat):
        if self.pk == culprit and self.attempt == 1:
            raise WorkerDied
        return perform(self, heartbeat)

    monkeypatch.setattr(KeyedJob, "perform", dies_on_its_first_attempt)
    with pytest.raises(WorkerDied):
        execute_chunk(KeyedJob, chunk)
    assert KeyedJob.objects.filter(state=JobState.RUNNING, started_at__isnull=False).count() == 8

    expire_leases()
    with handoff.capture() as queue:
        assert (
            dispatch(KeyedJob).rescued,
            KeyedJob.objects.filter(state=JobState.FAILED).count(),
        ) == (
            10,
            0,
        )
        # No job lost an attempt: each runs attempt 1 again.
        assert sorted(started(queue)) == sorted(("uniqueapp.KeyedJob", pk, 1) for pk, _ in chunk)
        grouped = KeyedJob.objects.get(pk=culprit).last_error
        assert grouped.startswith("The lease of attempt 1 expired in a group of 8 jobs")
        run_until_a_worker_dies(queue)  # the culprit again, alone this time

        expire_leases()
        queue.clear()  # the dead worker's later chunks, if any: their jobs are rescued
        assert dispatch(KeyedJob).rescued >= 1
        assert ("uniqueapp.KeyedJob", culprit, 2) in started(queue)  # that crash counted
        run_all(queue)
    done = dict(KeyedJob.objects.filter(state=JobState.PROCESSED).values_list("pk", "attempt"))
    assert done == {job.pk: 2 if job.pk == culprit else 1 for job in jobs}
    # Every run of a job other than the culprit was attempt 1.
    others = JobRun.objects.exclude(job_id=culprit)
    assert set(others.values_list("attempt", flat=True)) == {1}


def test_a_stalled_worker_cannot_finish_or_renew_its_group_run_again_by_another(
    kind_options, monkeypatch
):
    """A group rescued while its worker stalled goes back with its attempt not counted,
    so its jobs run the same attempt numbers again: only the token tells the stalled run
    from the new one. The stalled worker, waking up, records nothing."""
    kind_options(KeyedJob, concurrency=20, chunk_size=10)
    jobs, chunk = dispatched_chunk(2)
    ids = {job.pk for job in jobs}
    table = JobTable(KeyedJob)
    perform = KeyedJob.perform
    fresh = new_token()

    def stall_while_the_group_is_rescued_and_started_again(self, heartbeat):
        if self.pk == jobs[0].pk and not KeyedJob.objects.filter(worker="fresh-host:1").exists():
            stale = KeyedJob.objects.get(pk=self.pk).token
            expire_leases()
            with handoff.capture() as queue:
                assert dispatch(KeyedJob).rescued == 2
            [again] = queue
            assert sorted(again.args[1]) == sorted(chunk)  # the same (id, attempt) pairs
            assert table.steps([], again.args[1], "fresh-host:1", token=fresh)[1] == ids
            # The stalled worker's heartbeat, and its renewal of its mate, change nothing.
            with pytest.raises(LeaseLost):
                heartbeat()
            assert table.renew([(jobs[1].pk, stale)]) == set()
        return perform(self, heartbeat)

    monkeypatch.setattr(KeyedJob, "perform", stall_while_the_group_is_rescued_and_started_again)
    assert execute_chunk(KeyedJob, chunk) == [JobOutcome.LEASE_LOST, JobOutcome.LEASE_LOST]
    rows = KeyedJob.objects.filter(pk__in=ids).values_list("state", "attempt", "token", "worker")
    assert set(rows) == {(JobState.RUNNING, 1, fresh, "fresh-host:1")}
    assert finish(KeyedJob, jobs[0].pk, fresh) is JobOutcome.PROCESSED


def test_a_heartbeat_extends_the_leases_of_the_jobs_started_with_it(kind_options):
    kind_options(KeyedJob, concurrency=20, chunk_size=10, jobs_per_statement=3)
    _, chunk = dispatched_chunk(3)
    token = new_token()
    JobTable(KeyedJob).steps([], chunk, "host:1", token=token)
    KeyedJob.objects.update(lease_expires_at=Now() - timedelta(seconds=1))
    first, *mates = [pk for pk, _ in chunk]
    Heartbeat(KeyedJob, first, 1, token, [(pk, token) for pk in mates])()
    expired = KeyedJob.objects.filter(lease_expires_at__lte=Now())
    assert not expired.exists()


def test_a_job_of_a_group_that_lost_its_lease_while_waiting_is_not_run(kind_options, monkeypatch):
    """Before a job that waited in its group for a while (here: always), the worker makes
    sure its lease is still the worker's; one rescued meanwhile is left to its new
    attempt."""
    kind_options(KeyedJob, concurrency=20, chunk_size=10, jobs_per_statement=3, lease_seconds=0)
    jobs, chunk = dispatched_chunk(3)
    perform = KeyedJob.perform

    def rescue_the_second(self, heartbeat):
        if self.pk == jobs[0].pk:  # as if a dispatch had rescued the second job meanwhile
            token = KeyedJob.objects.get(pk=jobs[1].pk).token
            retry_or_fail(KeyedJob, jobs[1].pk, chunk[1][1], "expired", token=token, delay=0)
        return perform(self, heartbeat)

    monkeypatch.setattr(KeyedJob, "perform", rescue_the_second)
    assert execute_chunk(KeyedJob, chunk) == [
        JobOutcome.PROCESSED,
        JobOutcome.LEASE_LOST,
        JobOutcome.PROCESSED,
    ]
    ran = set(JobRun.objects.values_list("job_id", flat=True))
    assert ran == {jobs[0].pk, jobs[2].pk}
    assert KeyedJob.objects.get(pk=jobs[1].pk).state == JobState.PENDING


@pytest.mark.parametrize("mate", ["fails", "loses its lease"])
def test_a_job_left_alone_in_its_group_is_checked_after_a_long_wait(
    mate, kind_options, monkeypatch
):
    """The first job of a pair runs long (here: longer than a third of the lease, always)
    and then fails or loses its lease; meanwhile the second's lease expired and a
    dispatch started it again as attempt 2. Left alone in its group, the second is
    checked all the same: attempt 1 is not run beside attempt 2."""
    kind_options(KeyedJob, concurrency=20, chunk_size=10, jobs_per_statement=2, lease_seconds=0)
    jobs, chunk = dispatched_chunk(2)
    perform = KeyedJob.perform

    def rescue_the_second_then_stop(self, heartbeat):
        if self.pk == jobs[0].pk:
            # As a dispatch does once the lease expired: back to pending, started again.
            token = KeyedJob.objects.get(pk=jobs[1].pk).token
            retry_or_fail(KeyedJob, jobs[1].pk, chunk[1][1], "expired", token=token, delay=0)
            assert JobTable(KeyedJob).start_one(jobs[1].pk) == (jobs[1].pk, 2)
            if mate == "fails":
                raise RuntimeError("the first job failed")
            KeyedJob.objects.filter(pk=self.pk).update(state=JobState.PENDING)
            heartbeat()  # raises LeaseLost
        return perform(self, heartbeat)

    monkeypatch.setattr(KeyedJob, "perform", rescue_the_second_then_stop)
    first = JobOutcome.RETRYING if mate == "fails" else JobOutcome.LEASE_LOST
    assert execute_chunk(KeyedJob, chunk) == [first, JobOutcome.LEASE_LOST]
    assert not JobRun.objects.filter(job_id=jobs[1].pk).exists(), "attempt 1 ran beside 2"
    second = KeyedJob.objects.get(pk=jobs[1].pk)
    assert (second.state, second.attempt) == (JobState.RUNNING, 2)


def test_a_worker_that_dies_mid_chunk_loses_only_the_attempt_it_was_running():
    with handoff.capture() as queue:
        with transaction.atomic():
            running, _ = KeyedJob.enqueue(key="a")
            waiting, _ = KeyedJob.enqueue(key="b")
        [chunk] = queue
        queue.clear()
        assert take_job_lease(KeyedJob, running.pk, 1, "worker that dies")  # then it dies
        KeyedJob.objects.update(lease_expires_at=Now() - timedelta(seconds=1))

        result = dispatch(KeyedJob)
        assert (result.rescued, result.exhausted, result.dispatched) == (2, 0, 2)
        assert started(queue) == [
            ("uniqueapp.KeyedJob", running.pk, 2),  # its lost attempt counts
            ("uniqueapp.KeyedJob", waiting.pk, 1),  # never started: attempt 1 again
        ]
        assert run_all(queue) == [JobOutcome.PROCESSED.value] * 2
        # The dead worker's chunk, delivered again, finds nothing to run.
        assert chunk.run() == [JobOutcome.SKIPPED.value] * 2
    assert sorted(JobRun.objects.values_list("job_id", "attempt")) == [
        (running.pk, 2),
        (waiting.pk, 1),
    ]


def test_a_chunk_past_its_deadline_hands_its_unstarted_jobs_back(kind_options):
    kind_options(KeyedJob, jobs_per_statement=1)  # the deadline is looked at between groups
    with handoff.capture() as queue:
        with transaction.atomic():
            jobs = [KeyedJob.enqueue(key=f"k{n}")[0] for n in range(2)]
        [chunk] = queue
        queue.clear()
        pairs = chunk.args[1]
        outcomes = execute_chunk(KeyedJob, pairs, deadline=-math.inf)
        assert outcomes == [JobOutcome.PROCESSED]  # the first job always runs
        handed_back = KeyedJob.objects.get(pk=jobs[1].pk)
        assert (handed_back.state, handed_back.attempt) == (JobState.PENDING, 0)
        assert handed_back.process_after <= database_now()
        assert dispatch(KeyedJob).dispatched == 1
        assert started(queue) == [("uniqueapp.KeyedJob", jobs[1].pk, 1)]


def test_a_job_handed_back_kept_its_key_and_goes_back_to_pending():
    with handoff.capture() as queue:
        job, _ = KeyedJob.enqueue(key="a")
        assert KeyedJob.enqueue(key="a") == (job, False)
        queue.clear()
        assert give_back(KeyedJob, [(job.pk, 1)], why="ran out of time") == 1
        assert KeyedJob.enqueue(key="a") == (job, False)
    job.refresh_from_db()
    assert (job.state, job.attempt, job.last_error) == (JobState.PENDING, 0, "")


def test_a_priority_field_starts_the_highest_priority_ready_job_first():
    with handoff.capture() as queue:
        with transaction.atomic():
            low, _ = PriorityJob.enqueue(key="low", priority=-5)
            first_high, _ = PriorityJob.enqueue(key="high-1", priority=10)
            middle, _ = PriorityJob.enqueue(key="middle")
            second_high, _ = PriorityJob.enqueue(key="high-2", priority=10)
            later, _ = PriorityJob.enqueue(
                key="later", priority=99, process_after=timedelta(hours=1)
            )
        assert run_all(queue) == [JobOutcome.PROCESSED.value] * 4
    ran = list(JobRun.objects.order_by("id").values_list("job_id", flat=True))
    # Highest first; equal priorities in creation order; a job not due waits whatever its
    # priority.
    assert ran == [first_high.pk, second_high.pk, middle.pk, low.pk]
    assert PriorityJob.objects.get(pk=later.pk).state == JobState.PENDING


def plan_nodes(node: dict) -> set[str]:
    return {node["Node Type"]}.union(*(plan_nodes(child) for child in node.get("Plans", ())))


def test_dispatch_reads_a_backlog_in_index_order_without_planner_statistics(vendor):
    """Picking the next jobs of a big backlog reads the first entries of the kind's
    index: no sort of every pending job, whatever the planner's statistics say (a fresh
    table has none; the planner then takes a backlog for a few rows)."""
    if vendor != "postgresql":
        pytest.skip("PostgreSQL plans (SQLite serializes dispatchers and has no such knob)")
    from django_outbox.archive.sql.tune import explain

    with handoff.capture():
        with transaction.atomic():
            PriorityJob.enqueue_many({"key": f"k{n}", "priority": n % 7} for n in range(5000))
    table = JobTable(PriorityJob)
    select, params = table.next_ready_sql()
    with transaction.atomic():
        table.lock_dispatch()  # the dispatch is its own transaction
        plan = plan_nodes(explain(connection, select, [*params, 10]))
    assert "Sort" not in plan and "Bitmap Heap Scan" not in plan, plan
    assert "Index Scan" in plan, plan
    # Inside a caller's transaction the caller's settings are left alone.
    with transaction.atomic(), transaction.atomic():
        table.lock_dispatch()
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('enable_sort')")
            assert cursor.fetchone()[0] == "on"


def test_counting_running_jobs_reads_the_running_index_whatever_the_statistics(vendor):
    """The count of running jobs (every dispatch, and every commit that asks for one)
    walks the running jobs' index, never the whole table: not even when the statistics
    were taken while most of the table was running and it has since finished."""
    if vendor != "postgresql":
        pytest.skip("PostgreSQL plans (SQLite has no planner statistics to go stale)")
    from django_outbox.archive.sql.tune import explain

    with handoff.capture():
        with transaction.atomic():
            PriorityJob.enqueue_many({"key": f"k{n}", "priority": 0} for n in range(5000))
    table = JobTable(PriorityJob)
    with transaction.atomic():
        table.start_next(5000)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {table.table}")  # statistics: nearly every row running
    PriorityJob.objects.filter(pk__gt=PriorityJob.objects.order_by("pk")[10].pk).update(
        state=JobState.PROCESSED
    )
    sql, params = table.running_sql(500)
    plan = plan_nodes(explain(connection, sql, params))
    assert "Seq Scan" not in plan, plan
    assert table.count_running(500) == 11


def test_a_job_of_a_running_key_waits_until_that_key_is_free(monkeypatch):
    made = enqueue_while_performing(monkeypatch, KeyedJob, key="a")
    with handoff.capture() as queue:
        running, _ = KeyedJob.enqueue(key="a")
        [chunk] = queue
        queue.clear()
        # The job enqueues a job of its key while it runs: that one waits for the key,
        # then the chunk's worker dispatches and runs it.
        assert chunk.run() == [JobOutcome.PROCESSED.value] * 2
        [(waiting, created)] = made
        assert created

    first, second = JobRun.objects.order_by("id")
    assert (first.job_id, second.job_id) == (running.pk, waiting.pk)
    assert first.ended_at <= second.started_at


def test_the_running_index_is_the_final_guard_of_a_key():
    with handoff.capture(), transaction.atomic():
        first, _ = OrderedJob.enqueue(key="a", seq=1)
        second, _ = OrderedJob.enqueue(key="a", seq=2)
    assert OrderedJob.objects.get(pk=first.pk).state == JobState.RUNNING

    with pytest.raises(IntegrityError), transaction.atomic():
        JobTable(OrderedJob).start_one(second.pk)


def test_dispatch_falls_back_to_one_by_one_when_the_running_index_objects(monkeypatch):
    """A query that forgot the running keys: the index rejects the job, the others start."""
    with handoff.capture(), transaction.atomic():
        OrderedJob.enqueue(key="a", seq=1, process_after=timedelta(hours=1))
        blocked, _ = OrderedJob.enqueue(key="a", seq=2, process_after=timedelta(hours=1))
        free, _ = OrderedJob.enqueue(key="b", seq=1, process_after=timedelta(hours=1))
    OrderedJob.objects.filter(seq=1, key="a").update(state=JobState.RUNNING, attempt=1)
    OrderedJob.objects.update(process_after=Now())

    def careless(self):
        return (
            "SELECT j.id FROM uniqueapp_orderedjob AS j WHERE j.state = %s ORDER BY j.id LIMIT %s",
            ["pending"],
        )

    monkeypatch.setattr(JobTable, "next_ready_sql", careless)
    with handoff.capture() as queue:
        result = dispatch(OrderedJob)

    assert result.dispatched == 1
    assert started(queue) == [("uniqueapp.OrderedJob", free.pk, 1)]
    assert OrderedJob.objects.get(pk=blocked.pk).state == JobState.PENDING


def test_created_ordering_holds_later_jobs_behind_an_older_job_that_is_not_ready():
    with handoff.capture() as queue:
        with transaction.atomic():
            old, _ = OrderedJob.enqueue(key="a", seq=1, process_after=timedelta(hours=1))
            OrderedJob.enqueue(key="a", seq=2)
            other, _ = OrderedJob.enqueue(key="b", seq=1)
    assert started(queue) == [("uniqueapp.OrderedJob", other.pk, 1)]

    OrderedJob.objects.filter(pk=old.pk).update(process_after=Now())
    with handoff.capture() as queue:
        dispatch(OrderedJob)
        assert started(queue) == [("uniqueapp.OrderedJob", old.pk, 1)]
        run_all(queue)
    assert list(JobRun.objects.filter(key="a").order_by("id").values_list("seq", flat=True)) == [
        1,
        2,
    ]


def test_ready_ordering_serves_the_first_ready_job_of_a_key_and_skips_unready_ones():
    now = database_now()
    with handoff.capture() as queue:
        with transaction.atomic():
            ReadyJob.enqueue(key="a", seq=1, process_after=timedelta(hours=1))
            ReadyJob.enqueue(key="a", seq=2, process_after=now - timedelta(seconds=1))
            ReadyJob.enqueue(key="a", seq=3, process_after=now - timedelta(seconds=2))
        run_all(queue)

    assert list(JobRun.objects.order_by("id").values_list("seq", flat=True)) == [3, 2]
    assert ReadyJob.objects.get(seq=1).state == JobState.PENDING


def test_created_ordering_runs_jobs_of_a_key_in_creation_order_whatever_their_readiness():
    now = database_now()
    with handoff.capture() as queue:
        with transaction.atomic():
            for seq in (1, 2, 3):
                OrderedJob.enqueue(key="a", seq=seq, process_after=now - timedelta(seconds=seq))
        run_all(queue)

    assert list(JobRun.objects.order_by("id").values_list("seq", flat=True)) == [1, 2, 3]


# -- execution and fencing -------------------------------------------------------------


def test_a_failed_attempt_is_retried_after_a_backoff_then_fails_for_good():
    with handoff.capture() as queue:
        job, _ = KeyedJob.enqueue(key="a", fail_attempts=10)
        assert run_all(queue) == [JobOutcome.RETRYING.value]
        job.refresh_from_db()
        assert job.state == JobState.PENDING and job.attempt == 1
        assert "planned failure of attempt 1" in job.last_error
        lower = database_now() + timedelta(seconds=0.8 * 1 - 0.2)
        assert job.process_after >= lower, "the retry waits for the backoff"
        assert dispatch(KeyedJob).dispatched == 0, "not before its process_after"

        for _ in (2, 3):
            KeyedJob.objects.filter(pk=job.pk).update(process_after=Now())
            dispatch(KeyedJob)
            run_all(queue)
    job.refresh_from_db()

    assert (job.state, job.attempt) == (JobState.FAILED, 3)
    assert "planned failure of attempt 3" in job.last_error
    assert job.finished_at is not None and job.lease_expires_at is None
    assert list(JobRun.objects.values_list("attempt", flat=True).order_by("id")) == [1, 2, 3]


def test_the_backoff_grows_with_each_attempt_up_to_its_cap():
    job = KeyedJob.objects.create(key="a")
    delays = []
    for attempt in (1, 2):
        KeyedJob.objects.filter(pk=job.pk).update(
            state=JobState.RUNNING, attempt=attempt, token=attempt
        )
        before = database_now()
        assert retry_or_fail(KeyedJob, job.pk, attempt, "boom", token=attempt) is (
            JobOutcome.RETRYING
        )
        job.refresh_from_db()
        delays.append((job.process_after - before).total_seconds())

    # base 1 s, cap 2 s, jitter [0.8 d, d]: attempt 1 waits 0.8-1 s, attempt 2 1.6-2 s.
    assert 0.75 <= delays[0] <= 1.1 and 1.55 <= delays[1] <= 2.1


def test_a_success_marks_the_job_processed_and_keeps_its_times():
    with handoff.capture() as queue:
        job, _ = KeyedJob.enqueue(key="a")
        assert run_all(queue) == [JobOutcome.PROCESSED.value]
    job.refresh_from_db()
    assert (job.state, job.attempt, job.last_error) == (JobState.PROCESSED, 1, "")
    assert job.started_at <= job.finished_at and job.lease_expires_at is None
    assert job.worker


def test_a_second_delivery_of_the_same_attempt_is_skipped():
    with handoff.capture() as queue:
        KeyedJob.enqueue(key="a")
    label, [(pk, attempt)] = queue[0].args
    assert take_job_lease(KeyedJob, pk, attempt, "first worker")

    with handoff.capture():
        assert execute_job(label, pk, attempt) is JobOutcome.SKIPPED
    assert not JobRun.objects.exists()


def test_a_task_of_an_older_attempt_is_skipped():
    with handoff.capture():
        job, _ = KeyedJob.enqueue(key="a")
    KeyedJob.objects.filter(pk=job.pk).update(attempt=F("attempt") + 1)  # a rescue happened
    with handoff.capture():
        assert execute_job("uniqueapp.KeyedJob", job.pk, 1) is JobOutcome.SKIPPED


def test_heartbeat_extends_the_lease_and_raises_once_the_attempt_is_gone():
    with handoff.capture():
        job, _ = BeatingJob.enqueue(key="a")
    token = take_job_lease(BeatingJob, job.pk, 1, "worker")
    BeatingJob.objects.filter(pk=job.pk).update(lease_expires_at=Now())
    beat = Heartbeat(BeatingJob, job.pk, 1, token)

    beat()
    job.refresh_from_db()
    assert job.lease_expires_at > database_now() + timedelta(seconds=1)

    BeatingJob.objects.filter(pk=job.pk).update(token=token + 1)  # taken over
    with pytest.raises(LeaseLost) as lost:
        beat()
    assert lost.value.key == job.pk
    assert str(lost.value) == (
        f"Lease of uniqueapp.BeatingJob {job.pk} (attempt 1) is lost: another worker took it "
        "over or it was finalized. This worker must stop without side effects."
    )


def test_a_stale_worker_can_neither_finish_nor_fail_the_job():
    with handoff.capture():
        job, _ = KeyedJob.enqueue(key="a")
    token = take_job_lease(KeyedJob, job.pk, 1, "stale worker")
    KeyedJob.objects.filter(pk=job.pk).update(attempt=2, token=token + 1)  # taken over

    assert finish(KeyedJob, job.pk, token) is JobOutcome.LEASE_LOST
    assert retry_or_fail(KeyedJob, job.pk, 1, "late error", token=token) is JobOutcome.LEASE_LOST
    job.refresh_from_db()
    assert (job.state, job.attempt, job.last_error) == (JobState.RUNNING, 2, "")


def test_an_expired_lease_is_rescued_and_counts_as_an_attempt():
    with handoff.capture() as queue:
        job, _ = KeyedJob.enqueue(key="a")
        queue.clear()  # the worker died running it
        KeyedJob.objects.filter(pk=job.pk).update(
            started_at=Now(), lease_expires_at=Now() - timedelta(seconds=1)
        )
        result = dispatch(KeyedJob)
        assert (result.rescued, result.dispatched) == (1, 1)
        assert started(queue) == [("uniqueapp.KeyedJob", job.pk, 2)]
        assert run_all(queue) == [JobOutcome.PROCESSED.value]
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.PROCESSED, 2)


def test_dispatches_after_commits_look_for_expired_leases_once_a_second(monkeypatch):
    from django_outbox.unique import dispatch as dispatching

    with handoff.capture() as queue:
        job, _ = KeyedJob.enqueue(key="a")
        queue.clear()  # the worker died running it
        KeyedJob.objects.filter(pk=job.pk).update(
            started_at=Now(), lease_expires_at=Now() - timedelta(seconds=1)
        )
        dispatch(KeyedJob)  # this process just looked (and rescued the job)
        KeyedJob.objects.filter(pk=job.pk).update(
            started_at=Now(), lease_expires_at=Now() - timedelta(seconds=1)
        )
        queue.clear()
        # Within the second, a dispatch after a commit does not look again...
        assert dispatch_after_commit(KeyedJob).rescued == 0
        # ...once the second has passed, it does; a scheduled dispatch always does.
        monkeypatch.setattr(dispatching, "RESCUE_EVERY_SECONDS", 0.0)
        assert dispatch_after_commit(KeyedJob).rescued == 1
        KeyedJob.objects.filter(pk=job.pk).update(
            started_at=Now(), lease_expires_at=Now() - timedelta(seconds=1)
        )
        monkeypatch.setattr(dispatching, "RESCUE_EVERY_SECONDS", 3600.0)
        result = dispatch(KeyedJob)  # its third attempt's lease: failed for good
        assert (result.rescued, result.exhausted) == (0, 1)


def test_an_expired_lease_on_the_last_attempt_fails_the_job():
    with handoff.capture() as queue:
        job, _ = KeyedJob.enqueue(key="a")
        queue.clear()
        KeyedJob.objects.filter(pk=job.pk).update(
            attempt=3, started_at=Now(), lease_expires_at=Now() - timedelta(seconds=1)
        )
        result = dispatch(KeyedJob)
    job.refresh_from_db()
    assert (result.rescued, result.exhausted, result.dispatched) == (0, 1, 0)
    assert (job.state, job.attempt) == (JobState.FAILED, 3)
    assert job.last_error.startswith("The lease of attempt 3 expired")


def test_a_failed_job_whose_key_got_a_new_job_while_it_ran_yields_to_it(monkeypatch):
    made = enqueue_while_performing(monkeypatch, KeyedJob, key="a")
    with handoff.capture() as queue:
        job, _ = KeyedJob.enqueue(key="a", fail_attempts=1)
        outcomes = run_all(queue)

    [(twin, created)] = made
    assert created
    assert outcomes == [JobOutcome.SUPERSEDED.value, JobOutcome.PROCESSED.value]
    job.refresh_from_db()
    twin.refresh_from_db()
    assert job.state == JobState.FAILED
    assert job.last_error.endswith(
        f"Not retried: job #{twin.pk} with the same unique fields was enqueued meanwhile and "
        "has not started; it does the same work."
    )
    assert twin.state == JobState.PROCESSED


def test_a_permanent_failure_skips_the_remaining_attempts(monkeypatch):
    from django_outbox import PermanentFailure

    def refuse(self, heartbeat):
        raise PermanentFailure("the blog is gone")

    monkeypatch.setattr(KeyedJob, "perform", refuse)
    with handoff.capture() as queue:
        job, _ = KeyedJob.enqueue(key="a")
        assert run_all(queue) == [JobOutcome.FAILED.value]
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.FAILED, 1)
    assert "the blog is gone" in job.last_error


# -- pruning ---------------------------------------------------------------------------


def test_prunable_returns_finished_jobs_older_than_the_retention_only():
    old_done = KeyedJob.objects.create(key="a", state=JobState.PROCESSED)
    old_failed = KeyedJob.objects.create(key="b", state=JobState.FAILED)
    recent = KeyedJob.objects.create(key="c", state=JobState.PROCESSED)
    pending = KeyedJob.objects.create(key="d")
    KeyedJob.objects.filter(pk__in=[old_done.pk, old_failed.pk]).update(
        finished_at=Now() - timedelta(days=7, minutes=1)
    )
    KeyedJob.objects.filter(pk=recent.pk).update(finished_at=Now() - timedelta(days=6))
    KeyedJob.objects.filter(pk=pending.pk).update(created_at=Now() - timedelta(days=30))

    assert set(KeyedJob.prunable().values_list("pk", flat=True)) == {old_done.pk, old_failed.pk}
    KeyedJob.prunable().delete()
    assert set(KeyedJob.objects.values_list("pk", flat=True)) == {recent.pk, pending.pk}


def test_the_schedule_task_dispatches_one_kind_by_its_label_or_every_kind():
    from django_outbox import tasks

    with handoff.capture() as queue:
        job, _ = KeyedJob.enqueue(key="a", process_after=timedelta(hours=1))
        KeyedJob.objects.filter(pk=job.pk).update(process_after=Now())
        assert tasks.dispatch_unique("uniqueapp.keyedjob") == [
            {
                "kind": "uniqueapp.KeyedJob",
                "running": 1,
                "dispatched": 1,
                "rescued": 0,
                "exhausted": 0,
                "chunks": 1,
            }
        ]
        everything = tasks.dispatch_unique()
    assert started(queue) == [("uniqueapp.KeyedJob", job.pk, 1)]
    assert {result["kind"] for result in everything} >= {
        "blogs.RebuildBlogFeed",
        "uniqueapp.KeyedJob",
        "uniqueapp.BeatingJob",
    }


def test_a_commit_leaves_a_kind_at_its_concurrency_to_the_chunks_that_hold_it():
    slots = KeyedJob.job_options().concurrency
    with handoff.capture() as queue:
        with transaction.atomic():
            for n in range(slots):
                KeyedJob.enqueue(key=f"k{n}")
        assert KeyedJob.objects.filter(state=JobState.RUNNING).count() == slots
        with CaptureQueriesContext(connections["default"]) as queries:
            with transaction.atomic():
                late, _ = KeyedJob.enqueue(key="late")
        # One count after the commit, no dispatch transaction: nothing could start.
        assert not [q for q in queries.captured_queries if "WITH next AS" in q["sql"]]
        assert KeyedJob.objects.get(pk=late.pk).state == JobState.PENDING
        run_all(queue)  # the chunks end, and dispatch: the late job runs
    assert KeyedJob.objects.get(pk=late.pk).state == JobState.PROCESSED
