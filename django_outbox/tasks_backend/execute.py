"""Running one task record: the job engine calls :func:`perform` under the row's lease.

The task is called with the stored arguments (and its ``TaskContext`` when it takes
one); what it returns is normalized to JSON and stored by the engine in the statement
that marks the row processed. An exception fails the attempt: the engine retries it
with backoff or, on the last attempt, keeps it failed for an operator. Django's
``task_started`` signal is sent before the call, ``task_finished`` after a success or
after the last attempt failed.

The engine extends a job's lease only when the job calls ``heartbeat()``; task
functions know nothing of it, so one thread per worker process does it for them every
third of ``lease_seconds`` while a task runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.tasks import TaskContext, TaskResultStatus, task_backends
from django.tasks.signals import task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json

from django_outbox.base.errors import describe
from django_outbox.exceptions import PermanentFailure
from django_outbox.jobs.idempotency import function_scope, idempotent
from django_outbox.lease.engine import worker_identity
from django_outbox.lease.heartbeat import beating
from django_outbox.tasks_backend.backend import OutboxTaskBackend, load_task, task_error

if TYPE_CHECKING:
    from collections.abc import Callable

    from django_outbox.tasks_backend.models import TaskRecord


#: The scope of the idempotency keys of tasks: ``django.tasks:`` and the task's path
#: (hashed when the two are longer than a scope may be).
IDEMPOTENCY_PREFIX = "django.tasks"


def perform(record: TaskRecord, heartbeat: Callable[[], None]) -> Any:
    """Call the record's task; return its return value (JSON)."""
    try:
        task = load_task(record.task_path)
    except LookupError as exc:
        raise PermanentFailure(str(exc)) from exc
    backend = _backend(record.backend)
    sender = type(backend)
    now = timezone.now()
    # One TaskResult, changed in place as the attempt goes on (as Django's own
    # ImmediateBackend does): building and replacing frozen results costs more than the
    # engine's bookkeeping of the attempt.
    result = backend.result_of(record, task)
    for name, value in (
        ("status", TaskResultStatus.RUNNING),
        ("started_at", now),
        ("last_attempted_at", now),
        ("finished_at", None),
        ("errors", []),
        ("worker_ids", [*result.worker_ids, worker_identity()]),
    ):
        object.__setattr__(result, name, value)
    task_started.send(sender, task_result=result)
    args = [TaskContext(task_result=result), *record.args] if task.takes_context else record.args
    try:
        with beating(heartbeat, record.job_options().lease_seconds, record):
            value = _call(task.call, args, record)
    except Exception as exc:
        options = record.job_options()
        if isinstance(exc, PermanentFailure) or record.attempt >= options.max_attempts:
            object.__setattr__(result, "status", TaskResultStatus.FAILED)
            object.__setattr__(result, "finished_at", timezone.now())
            result.errors.append(task_error(describe(exc)))
            task_finished.send(sender, task_result=result)
        raise
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "_return_value", value)
    task_finished.send(sender, task_result=result)
    return value


def _call(call: Callable[..., Any], args: list[Any], record: TaskRecord) -> Any:
    if not record.idempotency_key:
        return _json(call(*args, **record.kwargs))
    scope = function_scope(record.task_path, IDEMPOTENCY_PREFIX)
    with idempotent(record.idempotency_key, scope=scope) as guard:
        if not guard.done:
            guard.result = _json(call(*args, **record.kwargs))
        return guard.result


def _json(value: Any) -> Any:
    """The return value as Django normalizes it; one that is not JSON fails for good."""
    try:
        return normalize_json(value)
    except TypeError as exc:
        raise PermanentFailure(f"The task returned a value it cannot store as JSON: {exc}") from exc


def _backend(alias: str) -> OutboxTaskBackend:
    """The backend of the row's alias (our class if the alias is gone from TASKS)."""
    try:
        backend = task_backends[alias]
    except Exception:  # InvalidTaskBackend: the alias was removed since the enqueue
        return OutboxTaskBackend(alias, {"QUEUES": []})
    return backend if isinstance(backend, OutboxTaskBackend) else OutboxTaskBackend(alias, {})
