"""DISPATCH_ON_COMMIT = "thread": a commit wakes the process's dispatcher thread instead
of dispatching in the committing thread."""

from __future__ import annotations

import threading

import pytest
from django.conf import settings
from django.db import transaction
from django.test import override_settings

from django_outbox.models import JobState
from django_outbox.unique import background
from tests.procs import wait_until
from tests.uniqueapp.models import KeyedJob

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def thread_mode(monkeypatch):
    """The setting on, and every dispatch recorded with the thread that ran it."""
    threads: list[str] = []
    real = background.dispatch_after_commit

    def recorded(model, **kwargs):
        threads.append(threading.current_thread().name)
        return real(model, **kwargs)

    monkeypatch.setattr(background, "dispatch_after_commit", recorded)
    outbox = {**settings.DJANGO_OUTBOX, "DISPATCH_ON_COMMIT": "thread"}
    with override_settings(DJANGO_OUTBOX=outbox):
        yield threads
        # The thread's connections closed before the test database goes away.
        assert background.DISPATCHER.idle.wait(30)


def started() -> bool:
    return not KeyedJob.objects.filter(state=JobState.PENDING).exists()


def test_the_dispatcher_thread_starts_what_a_commit_enqueued(thread_mode):
    with transaction.atomic():
        KeyedJob.enqueue(key="a")
        KeyedJob.enqueue(key="b")
    wait_until(started, timeout=30)
    assert set(thread_mode) == {"outbox-dispatch"}  # never the committing thread
    assert KeyedJob.objects.filter(state=JobState.RUNNING).count() == 2


def test_a_burst_of_commits_is_served_up_to_the_kinds_concurrency(thread_mode):
    slots = KeyedJob.job_options().concurrency
    for n in range(slots + 5):
        with transaction.atomic():
            KeyedJob.enqueue(key=f"k{n}")
    wait_until(lambda: KeyedJob.objects.filter(state=JobState.RUNNING).count() == slots, 30)
    assert KeyedJob.objects.filter(state=JobState.PENDING).count() == 5
    assert 1 <= len(thread_mode) <= slots + 5


def test_a_failed_dispatch_is_logged_and_the_next_kick_dispatches(thread_mode, monkeypatch, caplog):
    real = background.dispatch_after_commit
    calls = []

    def fails_once(model, **kwargs):
        calls.append(model)
        if len(calls) == 1:
            raise RuntimeError("database went away")
        return real(model, **kwargs)

    monkeypatch.setattr(background, "dispatch_after_commit", fails_once)
    with transaction.atomic():
        KeyedJob.enqueue(key="a")
    wait_until(lambda: calls, timeout=30)
    wait_until(lambda: "after a commit failed" in caplog.text, timeout=30)
    assert KeyedJob.objects.get(key="a").state == JobState.PENDING  # left to the schedule
    with transaction.atomic():
        KeyedJob.enqueue(key="b")
    wait_until(started, timeout=30)


def test_at_exit_the_kinds_still_wanted_are_dispatched_in_the_exiting_thread():
    with transaction.atomic():
        KeyedJob.objects.create(key="a")  # pending, no kick
    dispatcher = background.Dispatcher()
    dispatcher.wanted[KeyedJob._meta.label] = None  # asked, its thread never ran
    dispatcher.pid = background.os.getpid()
    dispatcher.flush()
    assert KeyedJob.objects.get(key="a").state == JobState.RUNNING
