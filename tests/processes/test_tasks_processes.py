"""The django.tasks backend through a real qcluster: Django's task API end to end.

Enqueued in the test process (some transactions roll back), run by a qcluster's workers,
read back with ``get_result``. Where a test needs the dispatch schedule (a retry or a
deferred task that is due), it plays it by calling ``dispatch`` in a loop.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

pytest.importorskip("django.tasks", reason="django.tasks exists from Django 6.0 on")

from django.db import transaction
from django.db.models.functions import Now
from django.tasks import TaskResultStatus

from django_outbox.base.dialect import database_now
from django_outbox.tasks_backend.models import TaskRecord
from django_outbox.unique.dispatch import dispatch
from tests import procs
from tests.taskfuncs import add, fail, record
from tests.testapp.models import JobEffect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]


def play_schedule() -> None:
    """What the dispatch schedule does once a backoff or a run_after has passed."""
    TaskRecord.objects.filter(state="pending", attempt__gt=0).update(process_after=Now())
    dispatch(TaskRecord)


def finished(*results) -> bool:
    for result in results:
        result.refresh()
    return all(result.is_finished for result in results)


def test_tasks_run_through_a_cluster_and_report_their_outcome():
    committed = []
    for n in range(300):
        try:
            with transaction.atomic():
                result = record.enqueue(f"task-{n}", n)
                if n % 4 == 0:
                    raise RuntimeError("rolled back on purpose")
        except RuntimeError:
            continue
        committed.append(result)
    many = add.enqueue_many([((n, 1), {}) for n in range(500)])
    later = database_now() + timedelta(seconds=2)
    deferred = add.using(run_after=later).enqueue(20, 22)
    failing = fail.enqueue("boom")

    with procs.qcluster("tasks-cluster") as cluster:
        procs.wait_until(
            lambda: (play_schedule(), finished(deferred, failing, *committed[-5:], many[-1]))[1],
            timeout=180,
            interval=0.2,
            describe=lambda: Counter(TaskRecord.objects.values_list("state", flat=True)),
            watch=[cluster],
        )
        procs.wait_until(
            lambda: not TaskRecord.objects.exclude(state__in=["processed", "failed"]).exists(),
            timeout=120,
            describe=lambda: Counter(TaskRecord.objects.values_list("state", flat=True)),
            watch=[cluster],
        )
    unexpected = [line for line in procs.log_problems(cluster) if "boom" not in line]
    assert unexpected == []

    effects = Counter(JobEffect.objects.exclude(label="fail").values_list("label", flat=True))
    assert set(effects) == {r.args[0] for r in committed}  # nothing rolled back ran
    assert set(effects.values()) == {1}  # nothing committed ran twice
    for result in committed[:20]:
        result.refresh()
        assert (result.status, result.attempts) == (TaskResultStatus.SUCCESSFUL, 1)
        assert result.worker_ids[0] and result.finished_at >= result.started_at
    assert [add.get_result(r.id).return_value for r in many] == [n + 1 for n in range(500)]

    assert deferred.status == TaskResultStatus.SUCCESSFUL and deferred.return_value == 42
    assert deferred.started_at >= later  # not before run_after

    assert failing.status == TaskResultStatus.FAILED and failing.attempts == 3
    assert failing.errors[0].exception_class_path == "tests.taskfuncs.TaskBoom"
    assert JobEffect.objects.filter(label="fail").count() == 3
