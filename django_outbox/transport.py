"""Hand jobs to django-q2, in bulk where the broker allows it.

Jobs are named by dotted path with JSON-safe arguments. With django-q2's ORM broker on
the same database as our tables, the jobs are inserted inside the caller's transaction,
so a claim and its process job commit together. With any other broker they are sent
after the transaction commits (a job that is lost there is rescued from our tables).

:func:`capture` swaps django-q2 for an in-memory queue: ``outbox_run`` and tests use it
to run the pipeline inline, with the same code paths.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import router, transaction
from django.utils import timezone

DISTRIBUTE = "django_outbox.tasks.distribute"
CLAIM = "django_outbox.tasks.claim"
PROCESS = "django_outbox.tasks.process"


@dataclass(frozen=True)
class Job:
    func: str
    args: tuple[Any, ...]
    cluster: str | None = None

    def run(self) -> Any:
        from django.utils.module_loading import import_string

        return import_string(self.func)(*self.args)


_local = threading.local()


@contextlib.contextmanager
def capture() -> Iterator[deque[Job]]:
    """Collect enqueued jobs in a deque instead of sending them to django-q2."""
    previous = getattr(_local, "queue", None)
    _local.queue = queue = deque()
    try:
        yield queue
    finally:
        _local.queue = previous


def enqueue(func: str, args_list: Sequence[tuple[Any, ...]], *, cluster: str | None = None) -> int:
    """Enqueue one job per argument tuple; return how many were enqueued."""
    if not args_list:
        return 0
    jobs = [Job(func, tuple(args), cluster) for args in args_list]
    captured = getattr(_local, "queue", None)
    if captured is not None:
        captured.extend(jobs)
        return len(jobs)
    alias = _orm_broker_alias()
    if alias is not None and alias == _our_alias() and not _sync_mode():
        _bulk_insert_orm(jobs, alias)
    else:
        transaction.on_commit(lambda: _send(jobs), using=_our_alias())
    return len(jobs)


def _our_alias() -> str:
    from django_outbox.models import OutboxGroup

    return router.db_for_write(OutboxGroup)


def _orm_broker_alias() -> str | None:
    from django_q.conf import Conf

    if Conf.ORM and not (Conf.BROKER_CLASS or Conf.IRON_MQ or Conf.SQS or Conf.MONGO):
        return Conf.ORM
    return None


def _sync_mode() -> bool:
    from django_q.conf import Conf

    return bool(Conf.SYNC)


def _package(job: Job) -> str:
    """Build and sign a task package the way ``django_q.tasks.async_task`` does."""
    from django_q.conf import Conf
    from django_q.humanhash import uuid
    from django_q.signals import pre_enqueue
    from django_q.signing import SignedPackage

    name, task_id = uuid()
    task: dict[str, Any] = {
        "id": task_id,
        "name": name,
        "func": job.func,
        "args": job.args,
        "kwargs": {},
        "save": False,
        "started": timezone.now(),
    }
    if job.cluster:
        task["cluster"] = job.cluster
    if Conf.CACHED:
        task["cached"] = Conf.CACHED
    if Conf.ACK_FAILURES:
        task["ack_failure"] = Conf.ACK_FAILURES
    pre_enqueue.send(sender="django_q", task=task)
    return SignedPackage.dumps(task)


def _bulk_insert_orm(jobs: list[Job], alias: str) -> None:
    from django_q.conf import Conf
    from django_q.models import OrmQ

    now = timezone.now()
    OrmQ.objects.using(alias).bulk_create(
        [
            OrmQ(key=job.cluster or Conf.CLUSTER_NAME, payload=_package(job), lock=now)
            for job in jobs
        ]
    )


def _send(jobs: list[Job]) -> None:
    from django_q.tasks import async_task

    for job in jobs:
        async_task(job.func, *job.args, cluster=job.cluster, save=False)
