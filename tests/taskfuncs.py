"""``django.tasks`` tasks of the tests (Django 6.0+ only: import it from those tests)."""

from __future__ import annotations

from django.tasks import task

from tests.testapp.models import JobEffect


class TaskBoom(Exception):
    pass


@task
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="emails", priority=10)
def send_email(to: str) -> dict:
    JobEffect.objects.create(label="email", value=to)
    return {"sent": to}


@task
def record(label: str, value: object = None) -> None:
    JobEffect.objects.create(label=label, value=value)


@task
def fail(message: str) -> None:
    JobEffect.objects.create(label="fail", value=message)
    raise TaskBoom(message)


@task(takes_context=True)
def attempts(context, label: str) -> dict:
    """Fails on its first attempt; returns what its context says."""
    JobEffect.objects.create(label=label, value=context.attempt)
    if context.attempt == 1:
        raise ValueError("first attempt fails")
    return {"attempt": context.attempt, "id": context.task_result.id}


@task
def unserializable() -> object:
    return {1, 2}


@task
async def async_add(a: int, b: int) -> int:
    return a + b


@task
def charge(order: str) -> dict:
    effect = JobEffect.objects.create(label="charge", value=order)
    return {"charge": effect.pk}


@task
def outlive_lease(seconds: float) -> bool:
    """Run longer than the lease; return whether the lease is still held at the end."""
    import time

    from django_outbox.base.dialect import database_now
    from django_outbox.tasks_backend.models import TaskRecord

    time.sleep(seconds)  # the task's work: longer than lease_seconds
    running = TaskRecord.objects.get(task_path=f"{__name__}.outlive_lease", state="running")
    return running.lease_expires_at > database_now()


def _charge_long(order: str) -> dict:
    effect = JobEffect.objects.create(label="charge-long", value=order)
    return {"charge": effect.pk}


#: A task whose path (``tests.taskfuncs.`` and this name) has 230 characters: as a task's
#: path may, and longer than an idempotency scope once ``django.tasks:`` comes before it.
LONG_NAME = "charge_" + "x" * 207
_charge_long.__name__ = _charge_long.__qualname__ = LONG_NAME
globals()[LONG_NAME] = charge_long = task(_charge_long)
