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

import logging
import os
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.tasks import TaskContext, TaskResultStatus, task_backends
from django.tasks.signals import task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json

from django_outbox.exceptions import LeaseLost, PermanentFailure
from django_outbox.idempotency import function_scope, idempotent
from django_outbox.lease import describe, worker_identity
from django_outbox.tasks_backend.backend import OutboxTaskBackend, errors_of, load_task

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from django_outbox.tasks_backend.models import TaskRecord

logger = logging.getLogger(__name__)

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
        with KEEPER.keep(heartbeat, record.job_options().lease_seconds):
            value = _call(task.call, args, record)
    except Exception as exc:
        options = record.job_options()
        if isinstance(exc, PermanentFailure) or record.attempt >= options.max_attempts:
            object.__setattr__(result, "status", TaskResultStatus.FAILED)
            object.__setattr__(result, "finished_at", timezone.now())
            result.errors.append(errors_of(describe(exc)))
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


class _LeaseKeeper:
    """One thread per worker process that heartbeats the task running now, once it has
    run a third of ``lease_seconds`` since its start or its last heartbeat.

    The task's thread only sets and clears :attr:`current` (no lock, no wake-up: a
    task costs nothing here); the keeper looks every ``POLL_SECONDS`` at most, and
    every sixth of the lease for short leases. It starts on first use, after the fork.
    """

    POLL_SECONDS = 0.25

    def __init__(self) -> None:
        self.forget()

    def forget(self) -> None:
        """Start afresh: no task, no thread (a new process, a forked child: the parent's
        task is not the child's, and a thread of the parent may have held the lock)."""
        self.current: tuple[Callable[[], None], float, float] | None = None
        self.pid = 0
        self.starting = threading.Lock()

    @contextmanager
    def keep(self, heartbeat: Callable[[], None], lease_seconds: float) -> Iterator[None]:
        if self.pid != os.getpid():
            with self.starting:
                if self.pid != os.getpid():
                    threading.Thread(
                        target=self._run, name="outbox-task-lease", daemon=True
                    ).start()
                    self.pid = os.getpid()
        self.current = (heartbeat, time.monotonic(), lease_seconds / 3)
        try:
            yield
        finally:
            self.current = None

    def _run(self) -> None:
        beaten: tuple[object, float] | None = None  # (the task, its last heartbeat)
        poll = self.POLL_SECONDS
        while True:
            time.sleep(poll)
            current = self.current
            if current is None:
                continue
            heartbeat, started, every = current
            poll = min(self.POLL_SECONDS, every / 2)
            last = beaten[1] if beaten is not None and beaten[0] is current else started
            if time.monotonic() - last < every:
                continue
            try:
                heartbeat()
            except LeaseLost:
                pass  # the engine finds out when it records the outcome, fenced by the attempt
            except Exception:
                logger.warning("Heartbeat of a running task failed.", exc_info=True)
            finally:
                connections.close_all()  # this thread's own: not held between heartbeats
            beaten = (current, time.monotonic())


KEEPER = _LeaseKeeper()
os.register_at_fork(after_in_child=KEEPER.forget)
