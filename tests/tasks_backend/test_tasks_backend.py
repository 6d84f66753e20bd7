"""The django.tasks backend, fast tier: Django's task API against our tables, run inline.

Tasks handed to django-q2 are captured (``handoff.capture``) and run in this process
with the code the cluster runs. Django 6.0+ only (django.tasks).
"""

from __future__ import annotations

import subprocess
import sys
from collections import deque
from datetime import timedelta
from unittest import mock

import pytest

pytest.importorskip("django.tasks", reason="django.tasks exists from Django 6.0 on")

from asgiref.sync import async_to_sync
from django.core.checks import run_checks
from django.db import transaction
from django.db.models.functions import Now
from django.tasks import TaskResultStatus, task_backends
from django.tasks.exceptions import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultMismatch,
)
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.test import override_settings

from django_outbox.base.dialect import database_now
from django_outbox.tasks_backend import checks as backend_checks
from django_outbox.tasks_backend.backend import exception_path
from django_outbox.tasks_backend.models import TaskRecord
from django_outbox.transport import handoff
from django_outbox.unique.dispatch import RUN, dispatch
from tests import taskfuncs
from tests.procs import ROOT, child_env
from tests.taskfuncs import (
    add,
    async_add,
    attempts,
    charge,
    fail,
    outlive_lease,
    record,
    send_email,
    unserializable,
)
from tests.testapp.models import JobEffect

pytestmark = pytest.mark.django_db(transaction=True)

BACKEND = "django_outbox.tasks_backend.OutboxTaskBackend"


def run_all(queue: deque[handoff.Job]) -> list[str]:
    """Run captured chunks, and those they hand on, until none is left; return outcomes."""
    outcomes = []
    while queue:
        job = queue.popleft()
        assert job.func == RUN
        outcomes.extend(job.run())
    return outcomes


def retry_now() -> None:
    """Make every pending task due (what waiting out the backoff would do)."""
    TaskRecord.objects.filter(state="pending").update(process_after=Now())


# -- enqueue and results -----------------------------------------------------------------


def test_enqueue_returns_a_ready_result_that_get_result_and_refresh_follow():
    with handoff.capture() as queue:
        result = add.enqueue(2, 3)
        assert result.status == TaskResultStatus.READY
        assert (result.args, result.kwargs, result.backend) == ([2, 3], {}, "default")
        assert result.enqueued_at is not None and result.started_at is None
        assert result.task.func is add.func and result.worker_ids == [] and result.errors == []
        with pytest.raises(ValueError, match="not finished"):
            _ = result.return_value
        assert add.get_result(result.id).status == TaskResultStatus.READY

        assert run_all(queue) == ["processed"]

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.attempts == 1 and len(result.worker_ids) == 1
    assert result.started_at <= result.finished_at and result.last_attempted_at is not None
    fetched = async_to_sync(add.aget_result)(result.id)
    assert (fetched.status, fetched.return_value) == (TaskResultStatus.SUCCESSFUL, 5)


def test_a_task_enqueued_in_a_rolled_back_transaction_never_existed():
    with handoff.capture() as queue:
        with pytest.raises(RuntimeError), transaction.atomic():
            result = record.enqueue("rolled back")
            assert TaskRecord.objects.filter(pk=result.id).exists()
            raise RuntimeError("roll back")
        assert list(queue) == []
    with pytest.raises(TaskResultDoesNotExist):
        record.get_result(result.id)
    assert not TaskRecord.objects.exists()


def test_the_commit_hands_the_task_to_workers_not_the_enqueue():
    with handoff.capture() as queue:
        with transaction.atomic():
            result = record.enqueue("committed", value=1)
            assert list(queue) == []  # not before the commit
        assert [job.func for job in queue] == [RUN]
        assert run_all(queue) == ["processed"]
    assert list(JobEffect.objects.values_list("label", "value")) == [("committed", 1)]
    assert record.get_result(result.id).return_value is None


def test_aenqueue_joins_the_callers_transaction_and_its_commit_hands_the_task_over():
    """Django's ``aenqueue()`` (thread-sensitive) and ours, ``aenqueue_many()``."""
    with handoff.capture() as queue:
        with pytest.raises(RuntimeError), transaction.atomic():
            async_to_sync(record.aenqueue)("rolled back")
            async_to_sync(record.aenqueue_many)([(("rolled back too",), {})])
            assert TaskRecord.objects.count() == 2
            raise RuntimeError("roll back")
        assert list(queue) == [] and not TaskRecord.objects.exists()

        result = async_to_sync(record.aenqueue)("committed")
        [many] = async_to_sync(record.aenqueue_many)([(("committed too",), {})])
        assert [job.func for job in queue] == [RUN, RUN]  # each commit kicked the dispatch
        run_all(queue)
    assert sorted(JobEffect.objects.values_list("label", flat=True)) == [
        "committed",
        "committed too",
    ]
    statuses = {record.get_result(r.id).status for r in (result, many)}
    assert statuses == {TaskResultStatus.SUCCESSFUL}


def test_get_result_refuses_unknown_ids_and_results_of_another_task():
    with handoff.capture():
        email = send_email.enqueue("a@example.com")
    for bad in ("12345678", "not a number", ""):
        with pytest.raises(TaskResultDoesNotExist):
            add.get_result(bad)
    with pytest.raises(TaskResultMismatch):
        add.get_result(email.id)


def test_queue_names_and_priorities_are_kept_and_checked():
    with handoff.capture():
        email = send_email.enqueue("a@example.com")
    task = send_email.get_result(email.id).task
    assert (task.queue_name, task.priority) == ("emails", 10)
    with pytest.raises(InvalidTask, match="Queue 'nowhere' is not valid"):
        add.using(queue_name="nowhere").enqueue(1, 2)


def test_higher_priority_tasks_start_first():
    with handoff.capture() as queue:
        with transaction.atomic():
            low = add.using(priority=-5).enqueue(1, 1)
            plain = add.enqueue(2, 2)
            high = add.using(priority=50).enqueue(3, 3)
        ids = [pk for job in queue for pk, _ in job.args[1]]
    assert ids == [int(high.id), int(plain.id), int(low.id)]


def test_run_after_defers_the_task():
    later = database_now() + timedelta(hours=1)
    with handoff.capture() as queue:
        result = add.using(run_after=later).enqueue(1, 2)
        run_all(queue)
        assert dispatch(TaskRecord).dispatched == 0
        assert add.get_result(result.id).status == TaskResultStatus.READY
        assert add.get_result(result.id).task.run_after == later

        TaskRecord.objects.filter(pk=result.id).update(process_after=Now())
        dispatch(TaskRecord)
        assert run_all(queue) == ["processed"]
    assert add.get_result(result.id).return_value == 3


def test_arguments_that_are_not_json_are_refused_and_nothing_is_written():
    with pytest.raises(TypeError, match="must be JSON-serializable"):
        add.enqueue({1, 2}, 3)
    assert not TaskRecord.objects.exists()


def test_an_async_task_runs():
    with handoff.capture() as queue:
        result = async_add.enqueue(1, 2)
        run_all(queue)
    assert async_add.get_result(result.id).return_value == 3


# -- failures ------------------------------------------------------------------------


def test_a_failing_task_is_retried_with_backoff_then_kept_failed_with_its_error():
    with handoff.capture() as queue:
        result = fail.enqueue("boom")
        assert run_all(queue) == ["retrying"]
        result.refresh()
        assert result.status == TaskResultStatus.READY  # waiting for its retry
        [error] = result.errors
        assert error.exception_class_path == "tests.taskfuncs.TaskBoom"
        assert error.exception_class is taskfuncs.TaskBoom
        assert "TaskBoom: boom" in error.traceback
        row = TaskRecord.objects.get(pk=result.id)
        assert row.process_after > database_now()  # the backoff

        for _ in range(2):
            retry_now()
            dispatch(TaskRecord)
            run_all(queue)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 3 and result.finished_at is not None
    assert result.errors[0].exception_class_path == "tests.taskfuncs.TaskBoom"
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value
    assert JobEffect.objects.filter(label="fail").count() == 3  # each attempt ran


def test_the_context_counts_attempts():
    with handoff.capture() as queue:
        result = attempts.enqueue("ctx")
        run_all(queue)
        retry_now()
        dispatch(TaskRecord)
        run_all(queue)
    result.refresh()
    assert result.return_value == {"attempt": 2, "id": result.id}
    assert list(JobEffect.objects.order_by("pk").values_list("value", flat=True)) == [1, 2]
    assert result.errors == []  # the last attempt's error only: it succeeded


def test_a_return_value_that_is_not_json_fails_the_task_at_once():
    with handoff.capture() as queue:
        result = unserializable.enqueue()
        assert run_all(queue) == ["failed"]
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1
    assert "cannot store as JSON" in result.errors[0].traceback


def test_options_tune_the_task_kind():
    tasks = {"default": {"BACKEND": BACKEND, "OPTIONS": {"MAX_ATTEMPTS": 1}}}
    with override_settings(TASKS=tasks):
        assert TaskRecord.job_options().max_attempts == 1
        with handoff.capture() as queue:
            result = fail.enqueue("once")
            assert run_all(queue) == ["failed"]
        assert fail.get_result(result.id).status == TaskResultStatus.FAILED
    assert TaskRecord.job_options().max_attempts == 3


def test_the_lease_of_a_long_task_is_kept_while_it_runs():
    tasks = {"default": {"BACKEND": BACKEND, "OPTIONS": {"LEASE_SECONDS": 1}}}
    with override_settings(TASKS=tasks), handoff.capture() as queue:
        result = outlive_lease.enqueue(1.5)
        assert run_all(queue) == ["processed"]
    assert outlive_lease.get_result(result.id).return_value is True


# -- uniqueness and idempotency ----------------------------------------------------------


def test_a_unique_key_holds_one_pending_task_per_task_and_key():
    with handoff.capture() as queue:
        with transaction.atomic():  # pending: the commit starts them
            first = add.using(unique_key="k").enqueue(1, 2)
            again = add.using(unique_key="k").enqueue(5, 5)
            other_task = record.using(unique_key="k").enqueue("other")
        assert again.id == first.id and again.args == [1, 2]
        assert other_task.id != first.id
        run_all(queue)
        after = add.using(unique_key="k").enqueue(7, 7)
    assert after.id != first.id


def test_a_unique_key_absorbs_enqueues_until_a_worker_starts_the_task():
    """Each call commits on its own, and each commit dispatches: the task handed to the
    workers, not started yet, still answers every call of its key."""
    with handoff.capture() as queue:
        results = [record.using(unique_key="u1").enqueue("unique-1") for _ in range(50)]
        first = results[0]
        assert {result.id for result in results} == {first.id}
        assert [job.args[1] for job in queue] == [[(int(first.id), 1)]]  # dispatched once
        fetched = record.get_result(first.id)
        assert (fetched.status, fetched.started_at) == (TaskResultStatus.READY, None)
        assert TaskRecord.objects.get().state == "running"  # dispatched, leased

        assert run_all(queue) == ["processed"]
        after = record.using(unique_key="u1").enqueue("unique-1")
        assert after.id != first.id
    assert JobEffect.objects.filter(label="unique-1").count() == 1
    assert record.get_result(first.id).status == TaskResultStatus.SUCCESSFUL


def test_a_task_started_by_a_worker_reads_running_and_frees_its_unique_key():
    from django_outbox.unique.execute import take_job_lease

    with handoff.capture() as queue:
        first = record.using(unique_key="u1").enqueue("unique-1")
        queue.clear()
        again = record.using(unique_key="u1").enqueue("unique-1")
        assert (again.id, again.status) == (first.id, TaskResultStatus.READY)
        assert take_job_lease(TaskRecord, int(first.id), 1, "worker")  # a worker starts it
        assert record.get_result(first.id).status == TaskResultStatus.RUNNING
        newer = record.using(unique_key="u1").enqueue("unique-1")
    assert newer.id != first.id
    assert record.get_result(newer.id).status == TaskResultStatus.READY


def test_a_unique_key_dispatched_by_the_schedule_absorbs_the_next_enqueue():
    """No dispatch after the commit (the kind at its concurrency, or no commit hook): the
    scheduled dispatch hands the task over, and it still holds its key."""
    later = database_now() + timedelta(hours=1)
    with handoff.capture() as queue:
        first = record.using(unique_key="u1", run_after=later).enqueue("unique-1")
        assert not queue  # not due: its commit dispatched nothing
        TaskRecord.objects.update(process_after=Now())
        assert dispatch(TaskRecord).dispatched == 1  # what the schedule does
        again = record.using(unique_key="u1").enqueue("unique-1")
        assert again.id == first.id and again.status == TaskResultStatus.READY
        assert run_all(queue) == ["processed"]
    assert JobEffect.objects.filter(label="unique-1").count() == 1


def test_an_idempotency_key_commits_the_effect_once():
    with handoff.capture() as queue:
        one = charge.using(idempotency_key="order-1").enqueue("order-1")
        two = charge.using(idempotency_key="order-1").enqueue("order-1")
        run_all(queue)
    assert JobEffect.objects.filter(label="charge").count() == 1
    one.refresh()
    two.refresh()
    assert one.return_value == two.return_value == {"charge": JobEffect.objects.get().pk}


def test_an_idempotency_key_guards_a_task_whose_path_is_longer_than_a_scope():
    path = taskfuncs.charge_long.module_path
    assert 200 < len(path) <= 255
    with handoff.capture() as queue:
        one = taskfuncs.charge_long.using(idempotency_key="order-1").enqueue("order-1")
        two = taskfuncs.charge_long.using(idempotency_key="order-1").enqueue("order-1")
        assert run_all(queue) == ["processed", "processed"]
    assert JobEffect.objects.filter(label="charge-long").count() == 1
    one.refresh()
    two.refresh()
    assert one.return_value == two.return_value == {"charge": JobEffect.objects.get().pk}


def test_keys_are_checked():
    with pytest.raises(InvalidTask, match="unique_key must be a string of 1 to 255"):
        add.using(unique_key="x" * 256)
    with pytest.raises(InvalidTask, match="idempotency_key must be"):
        add.using(idempotency_key="")


# -- enqueue_many ----------------------------------------------------------------------


def test_enqueue_many_inserts_in_bulk_and_kicks_once():
    with handoff.capture() as queue:
        with transaction.atomic():
            results = add.enqueue_many([((n, n), {}) for n in range(2500)])
        assert len(results) == 2500 and len({r.id for r in results}) == 2500
        assert all(r.status == TaskResultStatus.READY for r in results)
        assert results[7].args == [7, 7]
        run_all(queue)
    assert TaskRecord.objects.filter(state="processed").count() == 2500
    assert add.get_result(results[7].id).return_value == 14


def test_enqueue_many_with_a_unique_key_creates_one():
    with handoff.capture():
        results = add.using(unique_key="once").enqueue_many([((1, 1), {}), ((2, 2), {})])
    assert len(results) == 1 and TaskRecord.objects.count() == 1


# -- signals -------------------------------------------------------------------------


def test_django_task_signals_are_sent():
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((task_result.id, task_result.status))

    for signal in (task_enqueued, task_started, task_finished):
        signal.connect(receiver, weak=False)
    try:
        with handoff.capture() as queue:
            result = add.enqueue(1, 1)
            run_all(queue)
    finally:
        for signal in (task_enqueued, task_started, task_finished):
            signal.disconnect(receiver)
    assert seen == [
        (result.id, TaskResultStatus.READY),
        (result.id, TaskResultStatus.RUNNING),
        (result.id, TaskResultStatus.SUCCESSFUL),
    ]


# -- checks and errors -----------------------------------------------------------------


def test_the_backend_says_what_it_supports():
    backend = task_backends["default"]
    assert (
        backend.supports_defer,
        backend.supports_async_task,
        backend.supports_get_result,
        backend.supports_priority,
    ) == (True, True, True, True)
    assert backend.check() == []


def ids(alias: str = "default") -> list[tuple[str, str]]:
    return [(m.id, m.msg) for m in backend_checks.check_backend(alias)]


def test_e085_options_are_checked():
    options = {"MAX_ATTEMPTS": 0, "SPEED": 3, "BACKOFF_SECONDS": 10, "BACKOFF_MAX_SECONDS": 5}
    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "OPTIONS": options}}):
        assert ids() == [
            ("django_outbox.E085", "TASKS['default']['OPTIONS'] has unknown options: SPEED."),
            (
                "django_outbox.E085",
                "TASKS['default']['OPTIONS']['MAX_ATTEMPTS'] must be a positive integer, not 0.",
            ),
            (
                "django_outbox.E085",
                "TASKS['default']['OPTIONS']['BACKOFF_MAX_SECONDS'] (5) is below "
                "BACKOFF_SECONDS (10).",
            ),
        ]


def test_e086_aliases_share_the_options():
    tasks = {
        "default": {"BACKEND": BACKEND, "OPTIONS": {"MAX_ATTEMPTS": 2}},
        "other": {"BACKEND": BACKEND, "OPTIONS": {"MAX_ATTEMPTS": 4}},
    }
    with override_settings(TASKS=tasks):
        assert ids("default") == []
        assert ids("other") == [
            (
                "django_outbox.E086",
                "TASKS['other']['OPTIONS']['MAX_ATTEMPTS'] is 4, but TASKS['default'] sets "
                "it to 2.",
            )
        ]


def test_e084_a_plain_check_reports_a_backend_whose_app_is_not_installed():
    """As a project that forgot the app runs it: ``manage.py check`` in a fresh process,
    where nothing imports ``django.tasks`` (so Django's task checks are not registered)."""
    done = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        env=child_env(OUTBOX_TEST_NO_TASKS_APP="1"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 1
    [line] = [line for line in done.stderr.splitlines() if "django_outbox.E084" in line]
    assert line.endswith(
        "(django_outbox.E084) TASKS['default'] uses OutboxTaskBackend, but "
        "django_outbox.tasks_backend is not in INSTALLED_APPS."
    )
    assert 'HINT: Add "django_outbox.tasks_backend" to INSTALLED_APPS' in done.stderr


def test_e084_comes_once_when_djangos_task_checks_run_too():
    with mock.patch.object(backend_checks.apps, "is_installed", return_value=False):
        messages = [m.id for m in run_checks() if m.id == "django_outbox.E084"]
        assert messages == ["django_outbox.E084"]
        assert ids() == []  # a path into our package: django_outbox's own check reports it


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (
            'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: no',
            "builtins.ValueError",
        ),
        (
            'Traceback (most recent call last):\n  File "x"\n    y()\nshop.Declined: card\nmore',
            "shop.Declined",
        ),
        (
            "Traceback (most recent call last):\n  File \"a\"\nKeyError: 'k'\n\nDuring handling "
            "of the above exception, another exception occurred:\n\nTraceback (most recent "
            'call last):\n  File "b"\nshop.Failed',
            "shop.Failed",
        ),
        ("The lease of attempt 1 expired: its worker died", "django_outbox.exceptions.LeaseLost"),
    ],
)
def test_exception_path_reads_the_last_exception_of_a_traceback(text, path):
    assert exception_path(text) == path


# -- operations ------------------------------------------------------------------------


def test_tasks_are_counted_in_the_metrics_and_listed_in_the_admin(admin_client):
    from django.urls import reverse

    from django_outbox.metrics import render

    with handoff.capture() as queue:
        with transaction.atomic():
            add.enqueue(1, 1)
            add.enqueue(2, 2)
        run_all(queue)
        failed = fail.using(queue_name="emails").enqueue("for the admin")
    metrics = render()[0].decode()
    assert (
        'django_outbox_unique_jobs{kind="django_outbox_tasks.TaskRecord",state="processed"} 2.0'
        in metrics
    )
    changelist = admin_client.get(reverse("admin:django_outbox_tasks_taskrecord_changelist"))
    assert changelist.status_code == 200
    assert "tests.taskfuncs.fail" in changelist.content.decode()
    # Dispatched by its commit, not started: READY, as get_result says.
    assert TaskRecord.objects.get(pk=failed.id).state == "running"
    assert failed.status == TaskResultStatus.READY
    dispatched = admin_client.get(
        reverse("admin:django_outbox_tasks_taskrecord_changelist"), {"stage": "dispatched"}
    )
    assert dispatched.status_code == 200
    assert 'class="field-status">Ready<' in dispatched.content.decode()
    assert "tests.taskfuncs.add" not in dispatched.content.decode()
    detail = admin_client.get(
        reverse("admin:django_outbox_tasks_taskrecord_change", args=[failed.id])
    )
    assert detail.status_code == 200
    dashboard = admin_client.get(reverse("admin:django_outbox_dashboard"))
    assert "django_outbox_tasks.TaskRecord" in dashboard.content.decode()


# -- the example project -----------------------------------------------------------------


def test_the_example_view_enqueues_its_task_in_its_transaction(client):
    from blogs.models import Blog, Post

    blog = Blog.objects.create(name="Blog")
    with handoff.capture() as queue:
        response = client.post(f"/blogs/{blog.pk}/posts/", {"title": "Hello"})
        assert response.status_code == 201
        post, task_id = response.json()["post"], response.json()["task"]
        assert client.get(f"/tasks/{task_id}/").json()["status"] == "READY"
        run_all(queue)
    assert client.get(f"/tasks/{task_id}/").json() == {
        "status": "SUCCESSFUL",
        "attempts": 1,
        "return_value": {"post": post, "notified": True},
    }
    assert Post.objects.get(pk=post).followers_notified_at is not None
    assert client.get("/tasks/999999/").status_code == 404


def test_a_post_that_rolls_back_takes_its_task_with_it():
    from blogs.models import Blog, Post
    from blogs.services import publish_and_notify

    blog = Blog.objects.create(name="Blog")
    with handoff.capture() as queue:
        with pytest.raises(RuntimeError), transaction.atomic():
            publish_and_notify(blog, "never")
            raise RuntimeError("the request failed after publishing")
        assert list(queue) == []
    assert not Post.objects.exists() and not TaskRecord.objects.exists()
