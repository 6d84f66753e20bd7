"""The wake guard: ``publish()`` on PostgreSQL skips its commit's wake while a run is
in flight, and the run waits for it before it ends (:mod:`django_outbox.streams.sql.wake_guard`).

Autocommit tests (``transaction=True``), as an application's requests run: a publisher
on a connection of its own (a thread) against a run in this one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from django_outbox import publish
from django_outbox.models import ArchivedEvent, JobState, OutboxEvent, OutboxGroup, StreamState
from django_outbox.streams import run
from django_outbox.streams.sql import buffer_ops
from django_outbox.streams.sql.wake_guard import LONG_TRANSACTION_SECONDS as LONG_SECONDS
from django_outbox.streams.sql.wake_guard import SKIP, WAKE_AFTER_COMMIT
from django_outbox.streams.steer import set_paused
from django_outbox.transport import handoff
from django_outbox.unique import enqueue
from django_outbox.unique.dispatch import RUN, run_jobs
from django_outbox.unique.execute import JobOutcome
from django_outbox.unique.sql import JobTable
from tests.streams.test_runs import SMALL
from tests.streams.test_runs import run_jobs as run_jobs_of
from tests.uniqueapp.models import ThrottledJob

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

WAIT = 30  # seconds: a bound for a thread's event, never reached when the code is right


def a_run_in_flight() -> handoff.Job:
    """Publish one row so that a run is queued for it (a live claimed group)."""
    with handoff.capture() as jobs, transaction.atomic():
        publish("audit", {"n": 0})
    (job,) = run_jobs_of(jobs)
    assert OutboxGroup.objects.filter(stream="audit").exists()
    return job


def statements_of(queries: CaptureQueriesContext) -> list[str]:
    """The statements *queries* captured, without transaction control."""
    control = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE")
    return [q["sql"] for q in queries if not q["sql"].startswith(control)]


class Publisher(threading.Thread):
    """Publish one event on a connection of its own; commit when told to."""

    def __init__(self, n: int, commit_when: Callable[[], bool], *, capture: bool = True) -> None:
        super().__init__()
        self.n = n
        self.capture = capture  # False: jobs go to django-q2's queue table, as in production
        self.commit_when = commit_when
        self.published = threading.Event()
        self.jobs: list[handoff.Job] = []
        self.after_commit_queries = -1
        self.errors: list[BaseException] = []

    def write(self) -> None:
        publish("audit", {"n": self.n})

    def run(self) -> None:
        try:
            with handoff.capture() if self.capture else nullcontext([]) as jobs:
                with CaptureQueriesContext(connections["default"]) as queries:
                    with transaction.atomic():
                        self.write()
                        self.published.set()
                        assert self.commit_when()
                        inside = len(queries)
                    after = queries.captured_queries[inside:]
                    self.after_commit_queries = sum(q["sql"] != "COMMIT" for q in after)
                self.jobs = list(jobs)
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)
            self.published.set()
        finally:
            connections.close_all()


@pytest.fixture
def patient(monkeypatch) -> None:
    """Bounds no loaded machine reaches: a publisher's transaction here may last as long
    as the run it waits for takes to get there."""
    monkeypatch.setattr(run, "PUBLISHERS_WAIT_SECONDS", 2 * WAIT)
    monkeypatch.setattr(run, "LONG_TRANSACTION_SECONDS", WAIT)
    monkeypatch.setattr(enqueue, "LONG_TRANSACTION_SECONDS", WAIT)


def observe_waiting(monkeypatch, owner: object, name: str) -> threading.Event:
    """An event set once the check *owner.name* (whether the writers that relied on an
    ending run or worker have ended) first finds one still in flight."""
    found = threading.Event()
    done = getattr(owner, name)

    def observed(*args: object) -> bool:
        ended = done(*args)
        if not ended:
            found.set()
        return ended

    monkeypatch.setattr(owner, name, observed)
    return found


@pytest.fixture
def waiting_run(monkeypatch) -> threading.Event:
    """An event set once an ending run has found a publisher still in flight."""
    return observe_waiting(monkeypatch, run, "publishers_done")


@pytest.fixture
def waiting_worker(monkeypatch) -> threading.Event:
    """An event set once a worker whose chunks ended has found an enqueue in flight."""
    return observe_waiting(monkeypatch, JobTable, "enqueuers_done")


@override_settings(**SMALL)
def test_a_publish_while_a_run_is_in_flight_costs_its_insert_and_no_wake(patient):
    a_run_in_flight()

    with handoff.capture() as jobs, CaptureQueriesContext(connection) as queries:
        with transaction.atomic():
            publish("audit", {"n": 1})

    statements = statements_of(queries)
    assert len(statements) == 1 and statements[0].startswith("INSERT"), statements
    assert not jobs  # the run in flight takes the row: no second run, no query


@override_settings(**SMALL)
def test_an_ending_run_waits_for_a_publisher_that_relied_on_it_and_takes_its_row(
    waiting_run, patient
):
    job = a_run_in_flight()
    publisher = Publisher(1, commit_when=lambda: waiting_run.wait(WAIT))
    publisher.start()
    assert publisher.published.wait(WAIT)

    with handoff.capture():
        outcomes = job.run()  # the queued group, then the publisher's row once committed

    publisher.join(WAIT)
    assert not publisher.errors
    assert waiting_run.is_set()  # the run found the publisher in flight and waited
    assert publisher.after_commit_queries == 0 and not publisher.jobs  # it skipped its wake
    assert len(outcomes) == 2
    assert sorted(ArchivedEvent.objects.values_list("data__payload__n", flat=True)) == [0, 1]
    assert not OutboxEvent.objects.exists()


@override_settings(**SMALL)
def test_a_publisher_open_longer_than_the_run_waits_wakes_the_stream_itself(
    waiting_run, monkeypatch
):
    monkeypatch.setattr(run, "PUBLISHERS_WAIT_SECONDS", 0.05)
    monkeypatch.setattr(run, "LONG_TRANSACTION_SECONDS", 0.01)
    job = a_run_in_flight()
    run_ended = threading.Event()
    publisher = Publisher(1, commit_when=lambda: run_ended.wait(WAIT))
    publisher.start()
    assert publisher.published.wait(WAIT)

    with handoff.capture():
        outcomes = job.run()  # gives up waiting: the publisher is a long transaction
    run_ended.set()
    publisher.join(WAIT)

    assert not publisher.errors
    assert waiting_run.is_set() and len(outcomes) == 1
    # The publisher's commit woke the stream: a run is queued for its row.
    (woken,) = run_jobs_of(publisher.jobs)
    with handoff.capture():
        woken.run()
    assert sorted(ArchivedEvent.objects.values_list("data__payload__n", flat=True)) == [0, 1]


@override_settings(**SMALL)
def test_the_guard_lets_no_publisher_skip_outside_read_committed_or_on_a_paused_stream():
    a_run_in_flight()
    ops = buffer_ops(OutboxEvent)

    with transaction.atomic():
        assert ops.insert_event_guarded("audit", "{}")[1] == SKIP
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        assert ops.insert_event_guarded("audit", "{}")[1] == WAKE_AFTER_COMMIT
    set_paused("audit", True)
    with transaction.atomic():
        assert ops.insert_event_guarded("audit", "{}")[1] == WAKE_AFTER_COMMIT
    with transaction.atomic():
        # No state row:
        assert ops.insert_event_guarded("other-stream", "{}")[1] == WAKE_AFTER_COMMIT


@override_settings(**SMALL)
def test_a_run_that_ends_raises_the_epoch_and_publishers_after_it_wake_themselves():
    job = a_run_in_flight()
    before = StreamState.objects.get(stream="audit").wake_epoch
    with handoff.capture():
        assert len(job.run()) == 1
    assert StreamState.objects.get(stream="audit").wake_epoch == before + 1

    with handoff.capture() as jobs, transaction.atomic():
        publish("audit", {"n": 1})
    (woken,) = run_jobs_of(jobs)  # no run in flight: the commit started one
    with handoff.capture():
        assert len(woken.run()) == 1


# -- unique-job kinds: enqueue() against a worker's end --------------------------------


def kind_at_concurrency() -> list[handoff.Job]:
    """Enqueue ThrottledJob up to its concurrency (2): one chunk task per job, queued."""
    with handoff.capture() as jobs:
        for key in ("a", "b"):
            with transaction.atomic():
                ThrottledJob.enqueue(key=key)
    chunks = [job for job in jobs if job.func == RUN]
    assert ThrottledJob.objects.filter(state=JobState.RUNNING).count() == 2
    return chunks


class Enqueuer(Publisher):
    """Enqueue one job on a connection of its own; commit when told to."""

    def write(self) -> None:
        ThrottledJob.enqueue(key=f"k{self.n}")


def test_an_enqueue_while_the_kind_is_at_its_concurrency_costs_its_insert_alone(patient):
    kind_at_concurrency()  # no worker has ended yet: the kind has no state row (epoch 0)

    with handoff.capture() as jobs, CaptureQueriesContext(connection) as queries:
        with transaction.atomic():
            ThrottledJob.enqueue(key="c")

    statements = statements_of(queries)
    assert len(statements) == 1 and statements[0].startswith("INSERT"), statements
    assert not jobs


def test_a_worker_whose_chunks_end_waits_for_an_enqueue_that_relied_on_it(waiting_worker, patient):
    found = waiting_worker
    first, second = kind_at_concurrency()
    with handoff.capture():
        assert run_jobs("uniqueapp.ThrottledJob", []) == []  # the kind's state row
    enqueuer = Enqueuer(1, commit_when=lambda: found.wait(WAIT))
    enqueuer.start()
    assert enqueuer.published.wait(WAIT)

    with handoff.capture() as more:
        outcomes = first.run()  # a; then, once the enqueue committed, k1 in a's slot
        outcomes += second.run()
    assert not more

    enqueuer.join(WAIT)
    assert not enqueuer.errors
    assert found.is_set()  # the worker found the enqueue in flight and waited
    assert enqueuer.after_commit_queries == 0 and not enqueuer.jobs  # it skipped its dispatch
    assert sorted(ThrottledJob.objects.values_list("key", "state")) == [
        ("a", JobState.PROCESSED),
        ("b", JobState.PROCESSED),
        ("k1", JobState.PROCESSED),
    ]


def test_an_enqueue_below_concurrency_queues_its_wake_in_its_own_insert():
    """With the ORM broker on the kind's database, the request's only statement is its
    INSERT, which also queues a django-q2 task that dispatches in a worker."""
    with CaptureQueriesContext(connection) as queries:
        with transaction.atomic():
            _, created = ThrottledJob.enqueue(key="a")

    statements = statements_of(queries)
    assert created and len(statements) == 1, statements
    (row,) = OrmQ.objects.all()
    task = SignedPackage.loads(row.payload)
    assert (task["func"], task["args"]) == (RUN, ("uniqueapp.ThrottledJob", []))
    assert ThrottledJob.objects.get().state == JobState.PENDING

    with handoff.capture():  # the worker that takes the task
        assert run_jobs(*task["args"]) == [JobOutcome.PROCESSED]
    assert ThrottledJob.objects.get().state == JobState.PROCESSED


def test_an_enqueue_that_finds_a_twin_queues_no_wake():
    with transaction.atomic():
        ThrottledJob.enqueue(key="a")
    with transaction.atomic():
        _, created = ThrottledJob.enqueue(key="a")
    assert not created and OrmQ.objects.count() == 1


# -- a burst of enqueues before a worker is free: one wake -----------------------------


def take(row: OrmQ) -> dict:
    """What a worker of the ORM broker does when it takes a queued task: lock it for
    django-q2's retry period (it is no longer waiting), and read its package."""
    OrmQ.objects.filter(id=row.id).update(lock=timezone.now() + timedelta(seconds=60))
    return SignedPackage.loads(row.payload)


def test_enqueues_while_the_wake_waits_untaken_rely_on_it_and_queue_no_other():
    """Every enqueue below concurrency is still one statement; the first queues the
    kind's wake, the next ones find it waiting and queue nothing; the worker that takes
    it runs them all."""
    with transaction.atomic():
        ThrottledJob.enqueue(key="a")
    for key in ("b", "c"):
        with CaptureQueriesContext(connection) as queries:
            with transaction.atomic():
                _, created = ThrottledJob.enqueue(key=key)
        assert created and len(statements_of(queries)) == 1, statements_of(queries)
        after = queries.captured_queries[[q["sql"] for q in queries].index("COMMIT") + 1 :]
        assert not after  # nothing after the commit: the queued wake will dispatch them
    (row,) = OrmQ.objects.all()
    task = take(row)

    assert run_all(task["args"]) == [JobOutcome.PROCESSED] * 3
    assert set(ThrottledJob.objects.values_list("state", flat=True)) == {JobState.PROCESSED}


def run_all(args: tuple) -> list[JobOutcome]:
    """Run the task a worker took, and the chunks it hands to other workers."""
    with handoff.capture() as handed:
        outcomes = run_jobs(*args)
    for job in handed:
        assert job.func == RUN
        outcomes += run_all(job.args)
    return outcomes


def test_an_enqueue_after_the_wake_was_taken_queues_a_wake_of_its_own():
    with transaction.atomic():
        ThrottledJob.enqueue(key="a")
    take(OrmQ.objects.get())  # taken: its worker may have dispatched already
    with transaction.atomic():
        ThrottledJob.enqueue(key="b")
    assert OrmQ.objects.count() == 2
    # Each row is a dispatch of the kind, whichever worker takes it (one package, signed
    # once and offered again for a while: signing is most of what queueing costs).
    tasks = [SignedPackage.loads(row.payload) for row in OrmQ.objects.all()]
    assert [(task["func"], task["args"][0]) for task in tasks] == [
        (RUN, ThrottledJob._meta.label)
    ] * 2
    OrmQ.objects.all().delete()  # both done (acknowledged): gone from the queue
    with transaction.atomic():
        ThrottledJob.enqueue(key="c")
    assert OrmQ.objects.count() == 1


def test_the_worker_that_took_the_wake_waits_for_an_enqueue_that_relied_on_it(
    waiting_worker, patient
):
    """An enqueue found the wake untaken and relied on it; the worker took the wake and
    dispatched before that enqueue committed. Its end waits for the enqueue and runs its
    job (without the wait the job would be left to the schedule)."""
    found = waiting_worker
    with transaction.atomic():
        ThrottledJob.enqueue(key="a")
    enqueuer = Enqueuer(1, commit_when=lambda: found.wait(WAIT), capture=False)
    enqueuer.start()
    assert enqueuer.published.wait(WAIT)  # inserted, relying on the untaken wake
    task = take(OrmQ.objects.get())

    outcomes = run_all(task["args"])  # a; then, once the enqueue committed, k1
    enqueuer.join(WAIT)
    assert not enqueuer.errors
    assert found.is_set()  # the worker found the enqueue in flight and waited
    assert enqueuer.after_commit_queries == 0
    assert OrmQ.objects.count() == 1  # no other wake queued
    assert outcomes == [JobOutcome.PROCESSED] * 2
    assert sorted(ThrottledJob.objects.values_list("key", "state")) == [
        ("a", JobState.PROCESSED),
        ("k1", JobState.PROCESSED),
    ]


# -- the bound: one guard lock per stream and kind per transaction ---------------------


def guard_locks() -> int:
    """The advisory locks this connection's transaction holds."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'"
        )
        return cursor.fetchone()[0]


def elsewhere(fn: Callable[[], object]) -> None:
    """Run *fn* on a connection of its own (another session), to its end."""
    errors: list[BaseException] = []

    def body() -> None:
        try:
            fn()
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive() and not errors, errors


@override_settings(**SMALL)
def test_a_transaction_holds_one_guard_lock_per_stream_however_often_runs_end(patient):
    """Its first publish asks the guard; the answer covers the later ones, which ask
    nothing: the run that ends at the first one's epoch waits for the transaction's end,
    whatever it writes meanwhile and however often the epoch moves on."""
    a_run_in_flight()
    epochs: list[int | None] = []

    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        publish("audit", {"n": 1})
        for n in range(5):
            elsewhere(lambda: epochs.append(run.raise_wake_epoch("audit")))  # runs end
            publish("audit", {"n": n + 2})
        assert guard_locks() == 1
        ended_first = epochs[0]
        assert ended_first is not None
        done: list[bool] = []
        elsewhere(lambda: done.append(run.publishers_done("audit", ended_first)))
        assert done == [False]  # the run ending at that epoch still waits for us
    asked = [sql for sql in statements_of(queries) if "django_outbox_publish_wake" in sql]
    assert len(asked) == 1
    assert run.publishers_done("audit", ended_first)


def test_a_transaction_holds_one_guard_lock_per_kind_however_often_workers_end(patient):
    kind_at_concurrency()

    with transaction.atomic():
        for n in range(5):
            ThrottledJob.enqueue(key=f"c{n}")
            # A worker's chunks end elsewhere.
            elsewhere(lambda: JobTable(ThrottledJob).raise_wake_epoch())
        assert guard_locks() == 1


@override_settings(**SMALL)
def test_a_transaction_older_than_the_long_bound_takes_no_guard_lock():
    a_run_in_flight()
    ops = buffer_ops(OutboxEvent)

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")  # the transaction starts here (now())
            deadline = time.monotonic() + WAIT
            while True:  # until it is older than the bound, in the database's clock
                cursor.execute(
                    "SELECT clock_timestamp() - now() > %s", [timedelta(seconds=LONG_SECONDS)]
                )
                if cursor.fetchone()[0] or time.monotonic() > deadline:
                    break
        # It wakes after commit:
        assert ops.insert_event_guarded("audit", "{}")[1] == WAKE_AFTER_COMMIT
        ThrottledJob.enqueue(key="late")
        assert guard_locks() == 0


# -- an idle stream: publish() queues the stream's wake in its own INSERT --------------


def queued_wakes() -> list[dict]:
    """The packages of the stream wakes waiting in django-q2's queue table."""
    tasks = [SignedPackage.loads(row.payload) for row in OrmQ.objects.order_by("id")]
    return [task for task in tasks if task["func"] == handoff.WAKE]


def run_woken_all(args: tuple) -> list[str]:
    """Run the wake a worker took, and the runs it hands to other workers."""
    with handoff.capture() as handed:
        outcomes = [outcome.value for outcome in run.run_woken(*args)]
    for job in handed:
        assert job.func == handoff.RUN
        outcomes += [outcome.value for outcome in job.run()]
    return outcomes


@override_settings(**SMALL)
def test_a_publish_on_an_idle_stream_queues_its_wake_in_its_own_insert():
    """With the ORM broker on the stream's database, the request's only statement is its
    INSERT, which also queues the stream's wake; nothing runs after the commit."""
    with CaptureQueriesContext(connection) as queries:
        with transaction.atomic():
            publish("audit", {"n": 1})

    statements = statements_of(queries)
    assert len(statements) == 1 and statements[0].startswith("INSERT"), statements
    after = queries.captured_queries[[q["sql"] for q in queries].index("COMMIT") + 1 :]
    assert not after
    (task,) = queued_wakes()
    assert task["args"] == ("audit",)
    assert not OutboxGroup.objects.exists()  # nothing claimed in the request

    take(OrmQ.objects.get())  # a worker takes it
    assert run_woken_all(task["args"]) == ["done"]
    assert list(ArchivedEvent.objects.values_list("data__payload__n", flat=True)) == [1]


@override_settings(**SMALL)
def test_a_rolled_back_publish_queues_no_wake():
    with pytest.raises(RuntimeError), transaction.atomic():
        publish("audit", {"n": 1})
        raise RuntimeError("the request failed")
    assert not OrmQ.objects.exists() and not OutboxEvent.objects.exists()


@override_settings(**SMALL)
def test_a_savepoint_rolled_back_takes_the_guards_answer_with_it():
    """The wake the first publish queued goes with its savepoint, and so does the
    record that the transaction asked: the next publish asks again and queues one."""
    with transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            publish("audit", {"n": 0})
            raise RuntimeError
        publish("audit", {"n": 1})
    (task,) = queued_wakes()

    take(OrmQ.objects.get())
    assert run_woken_all(task["args"]) == ["done"]
    assert list(ArchivedEvent.objects.values_list("data__payload__n", flat=True)) == [1]


@override_settings(**SMALL)
def test_publishes_while_the_wake_waits_untaken_rely_on_it_and_queue_no_other():
    with transaction.atomic():
        publish("audit", {"n": 0})
    for n in (1, 2):
        with CaptureQueriesContext(connection) as queries:
            with transaction.atomic():
                publish("audit", {"n": n})
        assert len(statements_of(queries)) == 1, statements_of(queries)
        after = queries.captured_queries[[q["sql"] for q in queries].index("COMMIT") + 1 :]
        assert not after  # the queued wake will take the row
    (task,) = queued_wakes()

    take(OrmQ.objects.get())
    assert run_woken_all(task["args"]) == ["done"]  # one group of the three rows
    assert sorted(ArchivedEvent.objects.values_list("data__payload__n", flat=True)) == [0, 1, 2]


@override_settings(**SMALL)
def test_a_publish_after_the_wake_was_taken_queues_a_wake_of_its_own():
    with transaction.atomic():
        publish("audit", {"n": 0})
    take(OrmQ.objects.get())  # taken: its worker may have run the stream already
    with transaction.atomic():
        publish("audit", {"n": 1})
    # Two rows, each the stream's wake for whichever worker takes it (one package, signed
    # once and offered again for a while: signing is most of what queueing costs).
    assert [task["args"] for task in queued_wakes()] == [("audit",)] * 2


@override_settings(**SMALL)
def test_a_wake_taken_while_a_run_is_in_flight_leaves_the_rows_to_that_run():
    with transaction.atomic():
        publish("audit", {"n": 0})
    (task,) = queued_wakes()
    job = a_run_in_flight()  # another process's run started meanwhile (captured)

    take(OrmQ.objects.get())
    assert run.run_woken(*task["args"]) == []  # no second run: the one in flight goes on
    assert StreamState.objects.get(stream="audit").wanted
    with handoff.capture():
        assert len(job.run()) == 1  # the group of both rows
    assert sorted(ArchivedEvent.objects.values_list("data__payload__n", flat=True)) == [0, 0]


@override_settings(**SMALL)
def test_the_worker_that_took_the_wake_waits_for_a_publisher_that_relied_on_it(
    waiting_run, patient
):
    """A publisher found the wake untaken and relied on it; the worker took the wake and
    ran before that publisher committed. Its run's end waits for the publisher and takes
    its row (without the wait the row would be left to the schedule)."""
    with transaction.atomic():
        publish("audit", {"n": 0})
    publisher = Publisher(1, commit_when=lambda: waiting_run.wait(WAIT), capture=False)
    publisher.start()
    assert publisher.published.wait(WAIT)  # inserted, relying on the untaken wake
    (task,) = queued_wakes()
    take(OrmQ.objects.get())

    outcomes = run_woken_all(task["args"])  # n=0; then, once committed, n=1
    publisher.join(WAIT)
    assert not publisher.errors
    assert waiting_run.is_set()  # the run found the publisher in flight and waited
    assert publisher.after_commit_queries == 0
    assert len(queued_wakes()) == 1  # no other wake queued
    assert outcomes == ["done", "done"]
    assert sorted(ArchivedEvent.objects.values_list("data__payload__n", flat=True)) == [0, 1]


# -- rows the ORM writes: the first write of a transaction asks the guard --------------


@override_settings(**SMALL)
def test_orm_writes_on_an_idle_stream_queue_one_wake_and_nothing_runs_after_commit():
    """create() and bulk_create() of buffer rows in a transaction: the stream's first
    write asks the guard in one statement (it queues the wake), the others add nothing."""
    with CaptureQueriesContext(connection) as queries:
        with transaction.atomic():
            OutboxEvent.objects.create(stream="audit", payload={"n": 0})
            OutboxEvent.objects.create(stream="audit", payload={"n": 1})
            OutboxEvent.objects.bulk_create([OutboxEvent(stream="audit", payload={"n": 2})])

    statements = statements_of(queries)
    assert [s.split()[0] for s in statements] == ["INSERT", "SELECT", "INSERT", "INSERT"]
    after = queries.captured_queries[[q["sql"] for q in queries].index("COMMIT") + 1 :]
    assert not after
    (task,) = queued_wakes()
    take(OrmQ.objects.get())
    assert run_woken_all(task["args"]) == ["done"]
    assert sorted(ArchivedEvent.objects.values_list("data__payload__n", flat=True)) == [0, 1, 2]


@override_settings(**SMALL)
def test_an_orm_write_while_a_run_is_in_flight_skips_its_wake(waiting_run, patient):
    job = a_run_in_flight()

    class Writer(Publisher):
        def write(self) -> None:
            OutboxEvent.objects.create(stream="audit", payload={"n": self.n})

    writer = Writer(1, commit_when=lambda: waiting_run.wait(WAIT), capture=False)
    writer.start()
    assert writer.published.wait(WAIT)
    with handoff.capture():
        outcomes = job.run()  # the queued group, then the writer's row once committed
    writer.join(WAIT)

    assert not writer.errors
    assert writer.after_commit_queries == 0 and not queued_wakes()
    assert len(outcomes) == 2
    assert sorted(ArchivedEvent.objects.values_list("data__payload__n", flat=True)) == [0, 1]


@override_settings(**SMALL)
def test_an_orm_write_in_autocommit_wakes_the_stream_at_once():
    with handoff.capture() as jobs:
        OutboxEvent.objects.create(stream="audit", payload={"n": 0})
    (job,) = run_jobs_of(jobs)  # the commit's wake claimed a group and queued its run
    with handoff.capture():
        assert len(job.run()) == 1


@override_settings(**SMALL)
def test_a_transaction_queues_one_wake_per_stream_however_many_times_it_publishes(patient):
    """Even when the process's last wake was taken meanwhile (so its later publishes
    could not rely on it), the wake the transaction queued covers its later rows."""
    with transaction.atomic():
        for n in range(5):
            publish("audit", {"n": n})
            OrmQ.objects.update(lock=timezone.now() + timedelta(seconds=60))  # taken
    assert len(queued_wakes()) == 1
    assert guard_locks() == 0
