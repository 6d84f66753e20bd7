"""The ``django.tasks`` backend: tasks as rows of :class:`~.models.TaskRecord`.

* :meth:`OutboxTaskBackend.enqueue` inserts the row in the caller's transaction, on the
  database the router picks for writing task records, and returns its ``TaskResult``
  at once; the commit hands the task to django-q2 workers (a rollback drops it).
* :meth:`OutboxTaskBackend.get_result` reads status, return value, errors and workers
  back from the row.
* :class:`OutboxTask` (the backend's ``task_class``) adds per-call ``unique_key`` and
  ``idempotency_key`` to ``Task.using()``, and ``enqueue_many()``.

Models are imported inside the methods: a backend is created by ``@task`` at import
time of the project's modules, possibly before the app registry is ready.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from asgiref.sync import sync_to_async
from django.core.checks import CheckMessage
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils.json import normalize_json
from django.utils.module_loading import import_string

from django_outbox.exceptions import LeaseLost
from django_outbox.tasks_backend.options import TASK_KIND

if TYPE_CHECKING:
    from django_outbox.tasks_backend.models import TaskRecord

__all__ = [
    "OutboxTask",
    "OutboxTaskBackend",
]

#: Job stages (``models.unique.STAGES``) as Django's task statuses: a dispatched task
#: that no worker started yet is still READY (and still absorbs enqueues of its key).
STATUS = {
    "pending": TaskResultStatus.READY,
    "dispatched": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "processed": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
}
KEY_MAX = 255
_QUEUE_MAX = 100
#: The exception line that ends a Python traceback: ``module.Class: message``.
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxTask(Task):
    """A ``Task`` with per-call keys; ``@task`` makes these when our backend is its backend.

    * ``unique_key``: until a worker starts a task of the same function and key
      (READY, dispatched or not), enqueuing returns that task's result instead of a
      new one; one runs at a time per key.
    * ``idempotency_key``: the task runs inside an idempotency guard (scope: the task's
      path): once an attempt committed, later runs with that key return its result.
    """

    unique_key: str | None = None
    idempotency_key: str | None = None

    def using(
        self,
        *,
        unique_key: str | None = None,
        idempotency_key: str | None = None,
        **changes: Any,
    ) -> OutboxTask:
        """``Task.using()``, and the keys of the calls of the returned task."""
        task = cast(OutboxTask, Task.using(self, **changes))  # a replace(): the same class
        keys: dict[str, Any] = {"unique_key": unique_key, "idempotency_key": idempotency_key}
        keys = {name: value for name, value in keys.items() if value is not None}
        return replace(task, **keys) if keys else task

    def enqueue_many(
        self, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]
    ) -> list[TaskResult]:
        """Enqueue one task per ``(args, kwargs)`` pair, in bulk (see the backend's)."""
        backend = cast("OutboxTaskBackend", self.get_backend())
        return backend.enqueue_many(self, calls)

    async def aenqueue_many(
        self, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]
    ) -> list[TaskResult]:
        """:meth:`enqueue_many` from async code, as Django's ``aenqueue()`` runs
        ``enqueue()``: ``sync_to_async(thread_sensitive=True)``."""
        return await sync_to_async(self.enqueue_many, thread_sensitive=True)(calls)


class OutboxTaskBackend(BaseTaskBackend):
    """Tasks stored in django_outbox's task table and run in chunks by django-q2 workers."""

    task_class = OutboxTask
    task_kind = TASK_KIND  # the unique-job kind that holds the tasks
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        if len(task.module_path) > KEY_MAX:
            raise InvalidTask(f"The task's path is longer than {KEY_MAX} characters.")
        if len(task.queue_name) > _QUEUE_MAX:
            raise InvalidTask(f"queue_name is longer than {_QUEUE_MAX} characters.")
        for name in ("unique_key", "idempotency_key"):
            value = getattr(task, name, None)
            if value is not None and not (isinstance(value, str) and 0 < len(value) <= KEY_MAX):
                raise InvalidTask(
                    f"{name} must be a string of 1 to {KEY_MAX} characters, not {value!r}."
                )

    # -- enqueue ---------------------------------------------------------------------

    def enqueue(self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]) -> TaskResult:
        """Insert the task in the caller's transaction; return its result (READY).

        With a ``unique_key`` that has a task no worker started yet, that task's result
        is returned and nothing is inserted.
        """
        from django_outbox.base.routing import connection_for
        from django_outbox.tasks_backend.models import TaskRecord
        from django_outbox.unique.enqueue import created_or_unstarted

        self.validate_task(task)
        key = {"task_path": task.module_path, "unique_key": getattr(task, "unique_key", None)}
        found, created = created_or_unstarted(
            TaskRecord,
            lambda: next(iter(self._insert(task, [(args, kwargs)])), None),
            key,
            connection_for(TaskRecord).alias,
        )
        if created:
            return cast(TaskResult, found)
        return self.result_of(cast("TaskRecord", found), task)

    def enqueue_many(
        self, task: Task, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]
    ) -> list[TaskResult]:
        """Enqueue *task* once per ``(args, kwargs)`` pair, in statements of 1,000 rows.

        Returns the results of the tasks created, in order: with a ``unique_key`` (the
        task's keys apply to every call) at most one is created, none while a task of
        that key waits to start. Every call is checked before anything is written.
        """
        self.validate_task(task)
        return self._insert(task, calls)

    def _insert(
        self, task: Task, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]
    ) -> list[TaskResult]:
        """Insert one row per call (the shared columns sent once per statement); send
        ``task_enqueued`` and return the results of the rows created."""
        from django_outbox.tasks_backend.models import TaskRecord
        from django_outbox.unique.enqueue import insert_many, storable
        from django_outbox.unique.sql import JobTable

        table = JobTable(TaskRecord)
        common = storable(
            table,
            [
                ("task_path", task.module_path),
                ("backend", self.alias),
                ("queue_name", task.queue_name),
                ("priority", task.priority),
                ("takes_context", task.takes_context),
                ("unique_key", getattr(task, "unique_key", None)),
                ("idempotency_key", getattr(task, "idempotency_key", None) or ""),
                ("worker_ids", ""),
            ],
        )
        arguments = [self._arguments(task, args, kwargs) for args, kwargs in calls]
        rows = [storable(table, (("args", args), ("kwargs", kwargs))) for args, kwargs in arguments]
        created = insert_many(
            TaskRecord,
            rows,
            process_after=task.run_after,
            returning=("id", "created_at"),
            common=common,
        )
        if len(created) < len(arguments):  # a unique key: the first call, or none
            arguments = arguments[: len(created)]
        results = []
        for (pk, created_at), (args, kwargs) in zip(created, arguments, strict=True):
            result: TaskResult[Any, Any] = TaskResult(
                task=task,
                id=str(pk),
                status=TaskResultStatus.READY,
                enqueued_at=created_at,
                started_at=None,
                finished_at=None,
                last_attempted_at=None,
                args=args,
                kwargs=kwargs,
                backend=self.alias,
                errors=[],
                worker_ids=[],
            )
            task_enqueued.send(type(self), task_result=result)
            results.append(result)
        return results

    @staticmethod
    def _arguments(
        task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        """The call's arguments as JSON (normalized as Django does)."""
        try:
            return (
                cast(list[Any], normalize_json(list(args))),
                cast(dict[str, Any], normalize_json(dict(kwargs))),
            )
        except TypeError as exc:
            raise TypeError(
                f"The arguments of task {task.module_path} must be JSON-serializable: {exc}"
            ) from exc

    # -- results ---------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result as its row says now; ``TaskResultDoesNotExist`` if none
        (or the row belongs to another backend alias, or was pruned)."""
        from django_outbox.base.routing import connection_for
        from django_outbox.tasks_backend.models import TaskRecord

        try:
            pk = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        alias = connection_for(TaskRecord).alias
        record = TaskRecord._default_manager.using(alias).filter(pk=pk, backend=self.alias).first()
        if record is None:
            raise TaskResultDoesNotExist(result_id)
        return self.result_of(record)

    def result_of(self, record: TaskRecord, task: Task | None = None) -> TaskResult:
        """The ``TaskResult`` of a row (*task*: the task it was enqueued from, if known)."""
        task = task or load_task(record.task_path)
        run_after = record.process_after if record.process_after != record.created_at else None
        kept: dict[str, Any] = {
            "priority": record.priority,
            "queue_name": record.queue_name,
            "backend": record.backend,
            "run_after": run_after,
        }
        if any(getattr(task, name) != value for name, value in kept.items()):
            task = replace(task, **kept)  # validated again: only when something differs
        from django_outbox.models.unique import stage_of

        status = STATUS[stage_of(record)]
        result: TaskResult[Any, Any] = TaskResult(
            task=task,
            id=str(record.pk),
            status=status,
            enqueued_at=record.created_at,
            started_at=record.started_at,
            finished_at=record.finished_at,
            last_attempted_at=record.started_at,
            args=record.args,
            kwargs=record.kwargs,
            backend=record.backend,
            errors=[task_error(record.last_error)] if record.last_error else [],
            worker_ids=record.worker_ids.splitlines(),
        )
        if status is TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", record.return_value)
        return result

    # -- checks ----------------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        from django_outbox.tasks_backend.checks import check_backend

        return [*super().check(**kwargs), *check_backend(self.alias)]


def load_task(path: str) -> Task:
    """The ``Task`` object at *path* (``@task`` puts it at its function's module path)."""
    try:
        task = import_string(path)
    except ImportError as exc:
        raise LookupError(f"The task {path} cannot be imported: {exc}") from exc
    if not isinstance(task, Task):
        raise LookupError(
            f"{path} is {type(task).__name__}, not a Task: decorate the function with @task."
        )
    return task


def task_error(text: str) -> TaskError:
    """A stored error (a traceback, or a note of ours) as Django's ``TaskError``."""
    return TaskError(exception_class_path=exception_path(text), traceback=text)


def exception_path(text: str) -> str:
    """The dotted path of the exception class a stored traceback ends with.

    Python writes ``module.Class: message`` after the frames (builtins and ``__main__``
    without the module). A note of ours, not a traceback (a lease that expired with its
    worker), counts as :class:`~django_outbox.exceptions.LeaseLost`.
    """
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    for line in lines[starts[-1] + 1 :] if starts else []:
        if line and not line[0].isspace():
            match = _EXCEPTION_LINE.match(line)
            if match:
                name = match.group(1)
                return name if "." in name else f"builtins.{name}"
            break
    return f"{LeaseLost.__module__}.{LeaseLost.__qualname__}"
