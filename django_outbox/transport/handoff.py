"""Hand jobs to django-q2, in bulk where the broker allows it.

Jobs are named by dotted path with JSON-safe arguments. With django-q2's ORM broker on
the same database as our tables, the jobs are inserted inside the caller's transaction,
so a claimed group and its run job commit together (exactly-once hand-off). With any other
broker the pipeline's jobs are sent after the transaction commits (a job that is lost
there is rescued from our tables), while staged jobs are sent *before* it commits
(``send_now``): a crash in between sends them again, never loses them.

:func:`capture` swaps django-q2 for an in-memory queue: ``outbox_run`` and tests use it
to run the pipeline inline, with the same code paths.

A job may be due later (``not_before``): a retry handed over when its backoff ends. The
ORM broker delivers such a job at that time (its queue row is locked until then, the
broker's own way of holding a row back); other brokers, django-q2's sync mode and
:func:`capture` (unless asked) drop it, and the schedule's distribute takes the work
when it is due, as before.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import uuid4

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string
from django_q.brokers import get_broker
from django_q.conf import Conf
from django_q.humanhash import uuid
from django_q.models import OrmQ
from django_q.signals import pre_enqueue
from django_q.signing import SignedPackage
from django_q.tasks import async_task

from django_outbox.base.routing import connection_for
from django_outbox.models.groups import OutboxGroup

DISTRIBUTE = "django_outbox.tasks.distribute"
RUN = "django_outbox.tasks.run"
RETRY = "django_outbox.tasks.retry"
WAKE = "django_outbox.tasks.wake"


@dataclass(frozen=True)
class Job:
    """One django-q2 task: a dotted path, JSON arguments and django-q2 options.

    ``save`` False keeps the pipeline's own jobs out of django-q2's result table; None
    leaves the decision to django-q2 (``save_limit``), as ``async_task`` does.
    ``options`` carries further django-q2 task options (timeout, group, hook, task_name…).
    ``not_before``: not delivered before then (see the module's doc).
    """

    func: str
    args: tuple[Any, ...]
    cluster: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    save: bool | None = False
    not_before: datetime | None = None

    def run(self) -> Any:

        return import_string(self.func)(*self.args, **self.kwargs)


_local = threading.local()


@contextlib.contextmanager
def capture(*, delayed: bool = False) -> Iterator[deque[Job]]:
    """Collect enqueued jobs in a deque instead of sending them to django-q2; jobs due
    later (``not_before``) too when *delayed*, else they are dropped."""
    previous = getattr(_local, "queue", None), getattr(_local, "delayed", False)
    _local.queue = queue = deque[Job]()
    _local.delayed = delayed
    try:
        yield queue
    finally:
        _local.queue, _local.delayed = previous


def enqueue(func: str, args_list: Sequence[tuple[Any, ...]], *, cluster: str | None = None) -> int:
    """Enqueue one job per argument tuple; return how many were enqueued."""
    if not args_list:
        return 0
    return submit([Job(func, tuple(args), cluster) for args in args_list])


def submit(jobs: Sequence[Job], *, alias: str | None = None, send_now: bool = False) -> int:
    """Hand *jobs* to django-q2 as part of the current transaction on *alias*.

    Inside the transaction with the ORM broker on *alias*; otherwise after the commit, or
    right now when *send_now* (the caller then re-sends after a crash, at least once).
    """
    if not jobs:
        return 0
    jobs = list(jobs)
    alias = alias or _our_alias()
    captured = getattr(_local, "queue", None)
    later = [job for job in jobs if job.not_before is not None]
    if later:
        jobs = [job for job in jobs if job.not_before is None]
        if captured is not None:
            if getattr(_local, "delayed", False):
                captured.extend(later)
        else:
            _hold_back(later, alias)
    if not jobs:
        return 0
    if captured is not None:
        captured.extend(jobs)
    elif in_transaction_hand_off(alias):
        _bulk_insert_orm(jobs, alias)
    elif send_now:
        _send(jobs)
    else:
        transaction.on_commit(lambda: _send(jobs), using=alias)
    return len(jobs)


def in_transaction_hand_off(alias: str | None = None) -> bool:
    """Whether jobs handed over on *alias* commit with it (exactly-once hand-off)."""
    if getattr(_local, "queue", None) is not None:
        return True
    broker_alias = _orm_broker_alias()
    return broker_alias is not None and broker_alias == (alias or _our_alias()) and not _sync_mode()


def queue_row(job: Job, alias: str) -> tuple[str, str] | None:
    """The cluster key and the signed package of *job*, for a statement on *alias* to
    insert into django-q2's queue table in the caller's transaction (exactly-once
    hand-off); None when jobs on *alias* are not handed over that way (another broker,
    django-q2's sync mode, or :func:`capture`).

    The same package is offered to this thread's statements for the same job for up to
    :data:`PACKAGE_REUSE_SECONDS` after it was signed, whether a statement declined it
    (the job was not needed after all) or queued it: signing is most of what queueing
    the job costs the caller's request. The jobs offered this way are wakes, which take
    their work from the tables when they run and are not saved in django-q2's results
    (``save=False``), so two rows of one package run as two wakes; a wake that fails
    is recorded under its package's task id, the failures of one package under one.
    """
    if getattr(_local, "queue", None) is not None or not in_transaction_hand_off(alias):
        return None
    offered: dict[tuple[str, str, str | None], tuple[float, tuple[str, str]]]
    offered = _local.__dict__.setdefault("offered", {})
    key = _offer_key(job)
    now = time.monotonic()
    found = offered.get(key)
    if found is None or now - found[0] >= PACKAGE_REUSE_SECONDS:
        found = offered[key] = (now, (job.cluster or Conf.CLUSTER_NAME, _package(job)))
    return found[1]


#: How long a package :func:`queue_row` signed is offered again for the same job.
PACKAGE_REUSE_SECONDS = 60.0


def _offer_key(job: Job) -> tuple[str, str, str | None]:
    return job.func, repr(job.args), job.cluster


def cluster_options(cluster: str | None) -> dict[str, Any] | None:
    """The ``Q_CLUSTER`` options a cluster runs with (its ``ALT_CLUSTERS`` entry over the
    defaults); None when *cluster* names a cluster the settings do not define.

    Read from the settings, not from django-q2's ``Conf`` (fixed when django-q2 is
    imported), so the system checks see ``override_settings``.
    """

    q_cluster = getattr(settings, "Q_CLUSTER", {})
    if not isinstance(q_cluster, dict):
        return None
    options = {k: v for k, v in q_cluster.items() if k != "ALT_CLUSTERS"}
    if cluster and cluster not in (q_cluster.get("name"), q_cluster.get("cluster_name")):
        alt = (q_cluster.get("ALT_CLUSTERS") or {}).get(cluster)
        if not isinstance(alt, dict):
            return None
        options.update(alt)
    return options


def _our_alias() -> str:

    return connection_for(OutboxGroup).alias  # the stream's database, while on a stream


def _orm_broker_alias() -> str | None:

    if Conf.ORM and not (Conf.BROKER_CLASS or Conf.IRON_MQ or Conf.SQS or Conf.MONGO):
        return Conf.ORM
    return None


def _sync_mode() -> bool:

    return bool(Conf.SYNC)


def _package(job: Job) -> str:
    """Build and sign a task package the way ``django_q.tasks.async_task`` does."""

    name = job.options.get("task_name")
    if name:
        task_id = uuid4().hex  # (the humanized name django-q2 would derive is not needed)
    else:
        name, task_id = uuid()
    task: dict[str, Any] = {
        **job.options,
        "id": task_id,
        "name": name,
        "func": job.func,
        "args": job.args,
        "kwargs": job.kwargs,
        "started": timezone.now(),
    }
    task.pop("task_name", None)
    if job.save is not None:
        task["save"] = job.save
    if job.cluster:
        task["cluster"] = job.cluster
    if Conf.CACHED:
        task["cached"] = Conf.CACHED
    if Conf.ACK_FAILURES:
        task["ack_failure"] = Conf.ACK_FAILURES
    pre_enqueue.send(sender="django_q", task=task)
    return SignedPackage.dumps(task)


def _bulk_insert_orm(jobs: list[Job], alias: str) -> None:

    now = timezone.now()
    OrmQ.objects.using(alias).bulk_create(
        [
            OrmQ(
                key=job.cluster or Conf.CLUSTER_NAME,
                payload=_package(job),
                lock=max(job.not_before or now, now),  # the broker takes rows locked until now
            )
            for job in jobs
        ]
    )


def _hold_back(jobs: list[Job], alias: str) -> None:
    """Hand over *jobs* due later: with the ORM broker, queue rows locked until they are
    due (in the caller's transaction on the broker's database, else after its commit);
    with another broker or in sync mode they are dropped (see the module's doc)."""
    broker_alias = _orm_broker_alias()
    if broker_alias is None or _sync_mode():
        return
    if broker_alias == alias:
        _bulk_insert_orm(jobs, alias)
    else:
        transaction.on_commit(lambda: _bulk_insert_orm(jobs, broker_alias), using=alias)


def _send(jobs: list[Job]) -> None:
    """Push *jobs* to their brokers: one round trip per cluster where the broker allows."""

    if _sync_mode():
        for job in jobs:
            options = {**job.options, "cluster": job.cluster}
            if job.save is not None:
                options["save"] = job.save
            async_task(job.func, *job.args, q_options=options, **job.kwargs)
        return
    by_cluster: dict[str | None, list[str]] = defaultdict(list)
    for job in jobs:
        by_cluster[job.cluster or Conf.CLUSTER_NAME].append(_package(job))
    for cluster, packages in by_cluster.items():
        broker = _broker(cluster)
        push_many = _bulk_push(broker)
        if push_many is not None:
            push_many(packages)
        else:
            for package in packages:
                broker.enqueue(package)


_brokers: dict[tuple[int, str | None], Any] = {}
_brokers_lock = threading.Lock()


def _broker(cluster: str | None) -> Any:
    """The cluster's broker, one per process: ``get_broker()`` builds a new client (with
    Redis, a new connection: about 3.6 ms, against 0.2 ms for a push on an open one).
    Keyed by the process id, so a forked worker opens its own; at most one per cluster
    the settings name and process. A client whose connection broke reconnects on its
    next push (redis-py), and a push that fails still raises to the caller, as before."""
    key = (os.getpid(), cluster)
    with _brokers_lock:
        broker = _brokers.get(key)
        if broker is None:
            broker = _brokers[key] = get_broker(cluster)
    return broker


def _bulk_push(broker: Any) -> Any:
    """A one-round-trip push for brokers that have one (Redis: RPUSH takes many values)."""
    try:
        from django_q.brokers.redis_broker import Redis
    except ImportError:  # the redis client is not installed: no Redis broker either
        return None
    if isinstance(broker, Redis):
        return lambda packages: broker.connection.rpush(broker.list_key, *packages)
    return None
