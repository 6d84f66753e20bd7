"""Dispatch: rescue expired leases, then start the next ready jobs of a kind on django-q2.

One short transaction per kind: a per-kind lock (so the free concurrency slots are
counted once), the rescue of jobs whose worker died, a bounded count of running jobs,
and one statement that marks the next ready jobs running (attempt n + 1, a fresh lease)
with ``SKIP LOCKED``. Each started job is handed to django-q2 in the same transaction
(with the ORM broker on this database, the hand-off commits with it).

Dispatch runs on a django-q2 schedule per kind, right after an enqueue commits, and
right after a job finishes (its slot is free), so a backlog moves at worker speed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db import IntegrityError, transaction

from django_outbox import transport
from django_outbox.db.transient import retry_transient
from django_outbox.db.unique import JobTable
from django_outbox.models.unique import all_kinds, get_kind
from django_outbox.unique.execute import JobOutcome, execute_job, rescue_expired

if TYPE_CHECKING:
    from django_outbox.models.unique import UniqueJob

logger = logging.getLogger("django_outbox")

RUN = "django_outbox.tasks.run_unique_job"
DISPATCH = "django_outbox.tasks.dispatch_unique"
#: Expired leases rescued per dispatch at most (crashes are rare; the rest next time).
RESCUE_LIMIT = 100


@dataclass(frozen=True)
class DispatchResult:
    kind: str
    running: int = 0
    dispatched: int = 0
    rescued: int = 0
    exhausted: int = 0


def dispatch(model: type[UniqueJob]) -> DispatchResult:
    """Rescue the kind's expired leases and start as many ready jobs as slots are free."""
    table = JobTable(model)

    def dispatch_transaction() -> DispatchResult:
        with transaction.atomic(using=table.alias):
            table.lock_dispatch()
            rescued, exhausted = rescue_expired(model, RESCUE_LIMIT)
            concurrency = table.options.concurrency
            running = table.count_running(concurrency)
            started = _start(table, concurrency - running) if running < concurrency else []
            transport.enqueue(
                RUN,
                [(model._meta.label, pk, attempt) for pk, attempt in started],
                cluster=table.options.cluster,
            )
            return DispatchResult(
                model._meta.label, running + len(started), len(started), rescued, exhausted
            )

    result = retry_transient(
        dispatch_transaction, table.alias, what=f"dispatch of {model._meta.label}"
    )
    if result.dispatched or result.rescued:
        logger.info(
            "Dispatched %s job(s) of %s (%s rescued, %s exhausted).",
            result.dispatched,
            result.kind,
            result.rescued,
            result.exhausted,
        )
    return result


def dispatch_all() -> list[DispatchResult]:
    """Dispatch every kind of the installed apps."""
    return [dispatch(model) for model in all_kinds()]


def _start(table: JobTable, slots: int) -> list[tuple[int, int]]:
    """Start up to *slots* jobs in one statement; one by one if the index objects.

    The unique-while-executing index is the final guard: should a job of a running key
    slip through the query, the statement fails, and the fallback starts the jobs one at
    a time, each in a savepoint, skipping the one the index rejects.
    """
    try:
        with transaction.atomic(using=table.alias):
            return table.start_next(slots)
    except IntegrityError:
        logger.warning(
            "Dispatch of %s hit its running-jobs index; starting jobs one by one.",
            table.model._meta.label,
        )
    started = []
    for pk in table.next_ready_ids(slots):
        try:
            with transaction.atomic(using=table.alias):
                job = table.start_one(pk)
        except IntegrityError:
            continue  # a job of the same key is running: it waits for the next dispatch
        if job is not None:
            started.append(job)
    return started


def run_job(label: str, job_id: int, attempt: int) -> JobOutcome:
    """Run one attempt of a job (:func:`execute_job`), then dispatch its kind again: the
    job's slot is free. A failed dispatch leaves the kind to its schedule."""
    outcome = execute_job(label, job_id, attempt)
    try:
        dispatch(get_kind(label))
    except Exception:  # the outcome is recorded; the schedule dispatches later
        logger.warning(
            "Dispatch of %s after a job finished failed; its schedule will dispatch.",
            label,
            exc_info=True,
        )
    return outcome
