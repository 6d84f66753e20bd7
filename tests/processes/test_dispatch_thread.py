"""DISPATCH_ON_COMMIT = "thread": a commit wakes the process's dispatcher thread, which
hands the kind's dispatch to a worker (one django-q2 task) instead of dispatching in the
committing thread."""

from __future__ import annotations

import multiprocessing
import threading

import pytest
from django.conf import settings
from django.db import connections, transaction
from django.test import override_settings
from django.utils.module_loading import import_string
from django_q.models import OrmQ, Schedule
from django_q.signing import SignedPackage
from django_q.tasks import async_task

from django_outbox.models import JobState
from django_outbox.unique import background, enqueue
from django_outbox.unique.dispatch import RUN, dispatch
from tests.procs import (
    fail_on_queue_failures,
    held,
    in_forked_child,
    log_problems,
    log_tail,
    qcluster,
    wait_until,
)
from tests.uniqueapp.models import JobRun, KeyedJob

pytestmark = pytest.mark.django_db(transaction=True)

LABEL = KeyedJob._meta.label


@pytest.fixture
def thread_mode(monkeypatch):
    """The setting on, and every hand-off recorded with the thread that made it."""
    threads: list[str] = []
    real = background.wake_after_commit

    def recorded(model, **kwargs):
        threads.append(threading.current_thread().name)
        return real(model, **kwargs)

    monkeypatch.setattr(background, "wake_after_commit", recorded)
    outbox = {**settings.DJANGO_OUTBOX, "DISPATCH_ON_COMMIT": "thread"}
    with override_settings(DJANGO_OUTBOX=outbox):
        yield threads
        # The thread's connections closed before the test database goes away.
        assert background.DISPATCHER.idle.wait(30)


def queued() -> list[dict]:
    """The django-q2 tasks waiting in the ORM broker's queue, oldest first."""
    return [SignedPackage.loads(row.payload) for row in OrmQ.objects.order_by("id")]


def work_the_queue() -> None:
    """Run the queued tasks as a worker would, until none is left."""
    while OrmQ.objects.exists():
        row = OrmQ.objects.order_by("id").first()
        task = SignedPackage.loads(row.payload)
        row.delete()
        import_string(task["func"])(*task["args"], **task["kwargs"])


def test_a_commit_hands_its_dispatch_to_a_worker_which_runs_the_jobs(thread_mode):
    with transaction.atomic():
        a, _ = KeyedJob.enqueue(key="a")
        b, _ = KeyedJob.enqueue(key="b")
    wait_until(lambda: OrmQ.objects.exists(), timeout=30)
    assert background.DISPATCHER.idle.wait(30)
    assert thread_mode == ["outbox-dispatch"]  # never the committing thread
    # One task for the kind and no job started in this process: the worker dispatches.
    assert [(t["func"], t["args"]) for t in queued()] == [(RUN, (LABEL, []))]
    assert KeyedJob.objects.filter(state=JobState.PENDING).count() == 2

    work_the_queue()

    assert set(KeyedJob.objects.values_list("state", flat=True)) == {JobState.PROCESSED}
    assert sorted(JobRun.objects.values_list("job_id", flat=True)) == [a.pk, b.pk]


def test_a_burst_of_commits_sends_few_tasks_and_none_at_the_kinds_concurrency(
    thread_mode, monkeypatch
):
    gate = threading.Event()
    real = background.wake_after_commit

    def held(model, **kwargs):  # the thread busy with a first hand-off meanwhile
        gate.wait(30)
        return real(model, **kwargs)

    monkeypatch.setattr(background, "wake_after_commit", held)
    for n in range(20):
        with transaction.atomic():
            KeyedJob.enqueue(key=f"k{n}")
    gate.set()
    assert background.DISPATCHER.idle.wait(30)
    # The kicks that came while the thread was busy cost one more task, not nineteen.
    assert 1 <= OrmQ.objects.count() <= 2
    OrmQ.objects.all().delete()
    monkeypatch.setattr(background, "wake_after_commit", real)
    dispatch(KeyedJob)  # the kind's 4 slots taken, its chunks queued
    chunks, handed = OrmQ.objects.count(), len(thread_mode)

    # On PostgreSQL the INSERT itself finds the kind at its concurrency and needs no
    # kick (the wake guard); a transaction that outlasts the guard's bound still kicks,
    # and that kick reaches the thread on either database.
    monkeypatch.setattr(enqueue, "LONG_TRANSACTION_SECONDS", 0)
    with transaction.atomic():
        KeyedJob.enqueue(key="one-more")
    wait_until(lambda: len(thread_mode) == handed + 1, timeout=30)  # it reached the thread...
    assert background.DISPATCHER.idle.wait(30)
    assert OrmQ.objects.count() == chunks  # ...which sent nothing: no slot is free


def test_a_failed_hand_off_is_logged_and_the_next_kick_hands_over(thread_mode, monkeypatch, caplog):
    real = background.wake_after_commit
    calls = []

    def fails_once(model, **kwargs):
        calls.append(model)
        if len(calls) == 1:
            raise RuntimeError("database went away")
        return real(model, **kwargs)

    monkeypatch.setattr(background, "wake_after_commit", fails_once)
    with transaction.atomic():
        KeyedJob.enqueue(key="a")
    wait_until(lambda: "after a commit failed" in caplog.text, timeout=30)
    assert not OrmQ.objects.exists()  # left to the schedule
    with transaction.atomic():
        KeyedJob.enqueue(key="b")
    wait_until(lambda: OrmQ.objects.exists(), timeout=30)
    work_the_queue()
    assert set(KeyedJob.objects.values_list("state", flat=True)) == {JobState.PROCESSED}


def test_at_exit_the_kinds_still_wanted_are_handed_over_by_the_exiting_thread():
    with transaction.atomic():
        KeyedJob.objects.create(key="a")  # pending, no kick
    dispatcher = background.Dispatcher()
    dispatcher.wanted[LABEL] = None  # asked, its thread never ran
    dispatcher.flush()
    assert [(t["func"], t["args"]) for t in queued()] == [(RUN, (LABEL, []))]
    work_the_queue()
    assert KeyedJob.objects.get(key="a").state == JobState.PROCESSED


def test_a_forked_child_starts_afresh_though_a_thread_held_the_lock_at_the_fork(thread_mode):
    dispatcher = background.DISPATCHER

    def child() -> dict:
        inherited = list(dispatcher.wanted)
        dispatcher.kick(LABEL)  # the parent's lock stays held in here: a fresh one
        return {"inherited": inherited, "idle": dispatcher.idle.wait(30)}

    def parent_kick_in_progress() -> None:
        dispatcher.wanted["parents.Kind"] = None

    with held(dispatcher.lock, parent_kick_in_progress):
        try:
            result = in_forked_child(child)
        finally:
            dispatcher.wanted.pop("parents.Kind", None)

    assert result == {"inherited": [], "idle": True}  # the parent's kind is the parent's
    # The child's own thread handed its kick over.
    assert [(t["func"], t["args"]) for t in queued()] == [(RUN, (LABEL, []))]


def _enqueue_and_end() -> None:
    with transaction.atomic():
        KeyedJob.enqueue(key="a")


# A multi-threaded process forks its workers, as django-q2's cluster does (Python 3.12+ warns).
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_multiprocessing_child_hands_its_kinds_over_when_it_ends(thread_mode, monkeypatch):
    """``atexit`` does not run at the end of a ``multiprocessing`` child (a django-q2
    worker): the kinds it still wants are handed over all the same."""
    monkeypatch.setattr(background, "GATHER_SECONDS", 3600)  # only the exit hands over
    connections.close_all()  # the child connects on its own
    child = multiprocessing.get_context("fork").Process(target=_enqueue_and_end)
    child.start()
    child.join(60)
    assert child.exitcode == 0

    assert [(t["func"], t["args"]) for t in queued()] == [(RUN, (LABEL, []))]
    work_the_queue()
    assert KeyedJob.objects.get(key="a").state == JobState.PROCESSED


@pytest.mark.process
def test_a_kick_pending_when_a_worker_recycles_is_handed_over_at_once():
    """A qcluster whose workers recycle after each task: a task enqueues a job; its kick
    is still in the dispatcher thread when the worker ends, and reaches the cluster
    without a schedule (there is none)."""
    env = {"OUTBOX_TEST_DISPATCH_ON_COMMIT": "thread", "OUTBOX_TEST_Q_RECYCLE": "1"}
    with qcluster("recycling", **env) as cluster:
        async_task("tests.uniqueapp.workers.enqueue_and_recycle", "recycled")
        wait_until(
            lambda: KeyedJob.objects.filter(key="recycled", state=JobState.PROCESSED).exists(),
            timeout=60,
            describe=lambda: list(KeyedJob.objects.values_list("key", "state")),
            watch=[cluster],
            check=fail_on_queue_failures,
        )
        assert "stopped doing work" in log_tail(cluster)  # the worker recycled, as asked
    assert not Schedule.objects.exists()
    assert log_problems(cluster) == []


def test_chunks_a_worker_handed_on_hold_their_keys_until_started(thread_mode):
    """The worker that takes the commit's wake dispatches: it keeps one chunk and hands
    the others to the broker, where they wait, dispatched and not started."""
    with transaction.atomic():
        jobs = {key: KeyedJob.enqueue(key=key)[0] for key in "abcd"}
    wait_until(lambda: OrmQ.objects.exists(), timeout=30)
    assert background.DISPATCHER.idle.wait(30)
    wake = OrmQ.objects.order_by("id").first()
    task = SignedPackage.loads(wake.payload)
    wake.delete()
    import_string(task["func"])(*task["args"], **task["kwargs"])  # runs a and b
    waiting = [pk for t in queued() for pk, _ in t["args"][1]]
    assert waiting == [jobs["c"].pk, jobs["d"].pk]

    with transaction.atomic():
        again, created = KeyedJob.enqueue(key="c")
    assert (again.pk, created) == (jobs["c"].pk, False)
    assert background.DISPATCHER.idle.wait(30)
    work_the_queue()

    assert sorted(JobRun.objects.values_list("key", flat=True)) == ["a", "b", "c", "d"]
    assert KeyedJob.objects.count() == 4
