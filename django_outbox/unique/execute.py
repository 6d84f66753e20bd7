"""Execute: run one attempt of a dispatched job under its lease.

The django-q2 task carries the job's id and the attempt number dispatch gave it. The
attempt is the fencing token: taking the lease, heartbeating, finishing and recording a
failure all match only a job still ``running`` that attempt, so a worker that lost its
lease (a rescue after it stalled, a duplicate delivery) changes nothing. Every time is
the database's.
"""

from __future__ import annotations

import enum
import logging
from datetime import timedelta
from typing import TYPE_CHECKING

from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.db.models.functions import Now

from django_outbox.db.transient import retry_transient
from django_outbox.exceptions import LeaseLost, PermanentFailure
from django_outbox.lease import LeaseTable, RetryPolicy, clip, describe, last_line, worker_identity
from django_outbox.models.unique import JobState, get_kind
from django_outbox.unique.options import kind_options

if TYPE_CHECKING:
    from django_outbox.models.unique import UniqueJob

logger = logging.getLogger("django_outbox")

LEASE_EXPIRED = (
    "The lease of attempt {attempt} expired: its worker died, stalled, or was stopped by "
    "the django-q2 timeout. Call heartbeat() more often than lease_seconds in long jobs."
)
SUPERSEDED_NOTE = (
    "Not retried: job #{twin} with the same unique fields was enqueued meanwhile and is "
    "pending; it does the same work."
)


class JobOutcome(enum.StrEnum):
    PROCESSED = "processed"
    RETRYING = "retrying"
    FAILED = "failed"
    SUPERSEDED = "superseded"
    SKIPPED = "skipped"
    LEASE_LOST = "lease_lost"


def leases(model: type[UniqueJob]) -> LeaseTable:
    """The lease engine over the kind's table."""
    return LeaseTable(
        model, what=model._meta.label, lease_seconds=kind_options(model).lease_seconds
    )


def policy(model: type[UniqueJob]) -> RetryPolicy:
    options = kind_options(model)
    return RetryPolicy(options.max_attempts, options.backoff_seconds, options.backoff_max_seconds)


def fenced(model: type[UniqueJob], job_id: int, attempt: int) -> QuerySet:
    """The job, only while it is running the given attempt."""
    return leases(model).fenced(job_id, attempt)


class Heartbeat:
    """Passed to ``perform()``: call it to extend the lease; it raises when the lease is lost."""

    def __init__(self, model: type[UniqueJob], job_id: int, attempt: int) -> None:
        self.model = model
        self.job_id = job_id
        self.attempt = attempt
        self.leases = leases(model)

    def __call__(self) -> None:
        """Extend the lease by ``lease_seconds`` from now; raise :class:`LeaseLost` if gone."""
        self.leases.heartbeat(self.job_id, self.attempt)


def take_lease(model: type[UniqueJob], job_id: int, attempt: int, worker: str) -> bool:
    """Start attempt *attempt* of a dispatched job: renew its lease, stamp the start.

    Fenced by the attempt and by ``started_at IS NULL``, so a second delivery of the same
    django-q2 task (or a task of a lost attempt) takes nothing.
    """
    where = {"attempt": attempt, "state": JobState.RUNNING, "started_at": None}
    return leases(model).take(job_id, worker, where=where, stamp=("started_at",)) is not None


def execute_job(label: str, job_id: int, attempt: int) -> JobOutcome:
    """Run attempt *attempt* of a job: take the lease, ``perform()``, record the outcome.

    Always returns. :func:`django_outbox.unique.dispatch.run_job` dispatches the kind
    again afterwards, since the job's slot is free.
    """
    model = get_kind(label)
    if not take_lease(model, job_id, attempt, worker_identity()):
        logger.info("%s #%s attempt %s is not ours to run; skipped.", label, job_id, attempt)
        return JobOutcome.SKIPPED
    job = leases(model).objects().get(pk=job_id)
    try:
        job.perform(Heartbeat(model, job_id, attempt))
    except LeaseLost:
        logger.warning("%s #%s lost its lease during attempt %s.", label, job_id, attempt)
        outcome = JobOutcome.LEASE_LOST
    except Exception as exc:
        outcome = retry_or_fail(
            model, job_id, attempt, describe(exc), permanent=isinstance(exc, PermanentFailure)
        )
    else:
        outcome = finish(model, job_id, attempt)
    return outcome


def finish(model: type[UniqueJob], job_id: int, attempt: int) -> JobOutcome:
    """Mark the job processed, fenced by its attempt."""
    done = fenced(model, job_id, attempt).update(
        state=JobState.PROCESSED, finished_at=Now(), lease_expires_at=None, last_error=""
    )
    if not done:
        logger.warning(
            "%s #%s finished attempt %s after losing its lease; not marked processed.",
            model._meta.label,
            job_id,
            attempt,
        )
        return JobOutcome.LEASE_LOST
    return JobOutcome.PROCESSED


def retry_or_fail(
    model: type[UniqueJob],
    job_id: int,
    attempt: int,
    error: str,
    *,
    delay: float | None = None,
    permanent: bool = False,
) -> JobOutcome:
    """Record a failed or lost attempt: back to pending after a backoff, or failed.

    Failed when *permanent* or when it was the last attempt. A job whose key got a new
    pending job while it ran cannot go back to pending (the unique index holds one
    pending job per key): it is failed with a note naming the pending job, which does
    the same work. *delay* overrides the backoff (0 for a rescued job).
    """
    table, retry = leases(model), policy(model)
    alias = table.alias
    error = clip(error)

    def failure_transaction() -> JobOutcome:
        with transaction.atomic(using=alias):
            job = table.fenced(job_id, attempt)
            if retry.exhausted(attempt, permanent=permanent):
                return _fail(job, error)
            wait = retry.retry_in(attempt) if delay is None else delay
            try:
                with transaction.atomic(using=alias):
                    retried = job.update(
                        state=JobState.PENDING,
                        process_after=Now() + timedelta(seconds=wait) if wait else Now(),
                        lease_expires_at=None,
                        last_error=error,
                    )
            except IntegrityError:
                twin = _pending_twin(model, job_id, alias)
                outcome = _fail(job, f"{error}\n\n{SUPERSEDED_NOTE.format(twin=twin)}")
                return JobOutcome.SUPERSEDED if outcome is JobOutcome.FAILED else outcome
            return JobOutcome.RETRYING if retried else JobOutcome.LEASE_LOST

    outcome = retry_transient(
        failure_transaction, alias, what=f"failure of {model._meta.label} #{job_id}"
    )
    log = logger.error if outcome in (JobOutcome.FAILED, JobOutcome.SUPERSEDED) else logger.warning
    log(
        "%s #%s attempt %s of %s failed (%s): %s",
        model._meta.label,
        job_id,
        attempt,
        retry.max_attempts,
        outcome.value,
        last_line(error),
    )
    return outcome


def _fail(job: QuerySet, error: str) -> JobOutcome:
    failed = job.update(
        state=JobState.FAILED, finished_at=Now(), lease_expires_at=None, last_error=error
    )
    return JobOutcome.FAILED if failed else JobOutcome.LEASE_LOST


def _pending_twin(model: type[UniqueJob], job_id: int, alias: str) -> int | None:
    manager = model._default_manager.using(alias)
    names = [model._meta.get_field(name).attname for name in kind_options(model).unique_fields]
    key = manager.filter(pk=job_id).values(*names).first() or {}
    return manager.filter(state=JobState.PENDING, **key).values_list("pk", flat=True).first()


def rescue_expired(model: type[UniqueJob], limit: int) -> tuple[int, int]:
    """Give jobs whose lease expired back to pending, or fail them on their last attempt.

    Runs inside the dispatch transaction. The lost attempt counts: a job that keeps
    killing its worker ends up failed after ``max_attempts``. Returns (rescued,
    exhausted).
    """
    rescued = exhausted = 0
    for row in leases(model).expired(limit):
        pk, attempt = row["pk"], row["attempt"]
        outcome = retry_or_fail(model, pk, attempt, LEASE_EXPIRED.format(attempt=attempt), delay=0)
        if outcome is JobOutcome.RETRYING:
            rescued += 1
        elif outcome in (JobOutcome.FAILED, JobOutcome.SUPERSEDED):
            exhausted += 1
    return rescued, exhausted
