"""Execute: run the attempts of a dispatched chunk of jobs, each under its own lease.

The django-q2 task carries a chunk: the ids of its jobs and the attempt number dispatch
gave each. Starting a job matches that attempt (and ``started_at`` NULL: a second
delivery starts nothing) and gives the job a fresh fencing *token*
(:func:`~django_outbox.unique.sql.new_token`, shared by the jobs one statement starts).
Heartbeating, finishing and recording a failure all match only a job still ``running``
under that token, so a worker that lost its lease (a rescue after it stalled, a
duplicate delivery) changes nothing, even when the job runs the same attempt number
again. Every time is the database's.

The jobs run one after another, ``jobs_per_statement`` of them (a *group*) started by
one statement. A job of a chunk that has not started yet (``started_at`` is NULL) has
not used its attempt: when its lease expires (its worker died on an earlier job of the
chunk) or its chunk hands it back (:func:`give_back`), it returns to pending with the
attempt not counted. When a worker dies with a group started, the database cannot tell
which of the group's jobs was running (no statement marks the start of each
``perform()``: that would cost a statement per job): the rescue hands all of them back
with the attempt not counted, and each then runs in a group of its own, where the job
that crashes its worker again loses that attempt (:func:`rescue_expired`). Only the job
that was running ever loses an attempt.

A database that goes away for a while (a restart, a failover, a dropped connection)
costs a chunk nothing: its statements wait for the database to answer again, as the
stream pipeline's do (:func:`~django_outbox.base.transient.outlast_outage`), for up to
the kind's ``outage_seconds`` (half the lease, at most a minute), and then record what
happened; the job it interrupted runs again under its lease.

With OpenTelemetry, each job's ``perform()`` runs in a span of its own, a child of the
span that enqueued it (:meth:`UniqueJob.trace_span`, :mod:`django_outbox.base.tracing`),
also when one statement started its group.
"""

from __future__ import annotations

import enum
import itertools
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, TypeVar, cast

from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import F, JSONField, Q, QuerySet
from django.db.models.functions import Now

from django_outbox.base import tracing
from django_outbox.base.dialect import concrete_field
from django_outbox.base.errors import clip, describe, last_line
from django_outbox.base.jsondata import dumps
from django_outbox.base.transient import (
    OUTAGE_RERUNS,
    await_database,
    is_transient,
    outlast_outage,
)
from django_outbox.exceptions import LeaseLost, PermanentFailure
from django_outbox.lease.engine import LeaseTable, RetryPolicy, worker_identity
from django_outbox.models.unique import UNSTARTED, JobState, get_kind
from django_outbox.unique.options import kind_options
from django_outbox.unique.sql import JobTable, new_token

if TYPE_CHECKING:
    from django_outbox.models.unique import UniqueJob

logger = logging.getLogger(__name__)

T = TypeVar("T")

LEASE_EXPIRED = (
    "The lease of attempt {attempt} expired: its worker died, stalled, or was stopped by "
    "the django-q2 timeout. Call heartbeat() more often than lease_seconds in long jobs."
)
GROUP_LEASE_EXPIRED = (
    "The lease of attempt {attempt} expired in a group of {size} jobs started together: "
    "their worker died, stalled, or was stopped by the django-q2 timeout while running "
    "one of them, and which one is not known. The attempt is not counted; the job runs "
    "again in a group of its own, where a crash counts."
)
#: How :data:`LEASE_EXPIRED` and :data:`GROUP_LEASE_EXPIRED` begin (see :func:`_next_group`).
LEASE_EXPIRED_START = LEASE_EXPIRED.split("{", 1)[0]
SUPERSEDED_NOTE = (
    "Not retried: job #{twin} with the same unique fields was enqueued meanwhile and has "
    "not started; it does the same work."
)


class JobOutcome(enum.StrEnum):
    PROCESSED = "processed"
    RETRYING = "retrying"
    FAILED = "failed"
    SUPERSEDED = "superseded"
    SKIPPED = "skipped"
    LEASE_LOST = "lease_lost"
    #: The database stayed away: the outcome is not recorded, the lease decides.
    INTERRUPTED = "interrupted"


def leases(model: type[UniqueJob]) -> LeaseTable:
    """The lease engine over the kind's table, fenced by the jobs' tokens."""
    return LeaseTable(
        model,
        what=model._meta.label,
        lease_seconds=kind_options(model).lease_seconds,
        fence="token",
    )


def policy(model: type[UniqueJob]) -> RetryPolicy:
    options = kind_options(model)
    return RetryPolicy(options.max_attempts, options.backoff_seconds, options.backoff_max_seconds)


def fenced(model: type[UniqueJob], job_id: int, token: int) -> QuerySet:
    """The job, only while it is running under the given token."""
    return leases(model).fenced(job_id, token)


class Heartbeat:
    """Passed to ``perform()``: call it to extend the lease; it raises when the lease is lost.

    It also extends the leases of the jobs started with this one (*mates*, (id, token)
    pairs) that are still the worker's, so that a long job does not let them expire
    while they wait for their turn or for their success to be recorded.
    """

    def __init__(
        self,
        model: type[UniqueJob],
        job_id: int,
        attempt: int,
        token: int,
        mates: Sequence[tuple[int, int]] = (),
    ) -> None:
        self.model = model
        self.job_id = job_id
        self.attempt = attempt
        self.token = token
        self.mates = mates
        self.renewed_at: float | None = None  # when a call last extended the leases

    def __call__(self) -> None:
        """Extend the lease by ``lease_seconds`` from now; raise :class:`LeaseLost` if gone."""
        table = leases(self.model)
        if not table.update(self.job_id, self.token, lease_expires_at=Now() + table.lease):
            raise table.lost(self.job_id, self.attempt)
        if self.mates:
            JobTable(self.model).renew(self.mates)
        self.renewed_at = time.monotonic()


def take_job_lease(model: type[UniqueJob], job_id: int, attempt: int, worker: str) -> int | None:
    """Start attempt *attempt* of a dispatched job: renew its lease, stamp the start;
    return the job's new fencing token (None: not started).

    Fenced by the attempt and by ``started_at IS NULL``, so a second delivery of the same
    django-q2 task (or a task of a lost attempt) takes nothing.
    """
    token = new_token()
    return token if JobTable(model).step(None, (job_id, attempt), worker, token=token)[1] else None


def execute_job(label: str, job_id: int, attempt: int) -> JobOutcome:
    """Run attempt *attempt* of one job: take the lease, ``perform()``, record the outcome."""
    return execute_chunk(get_kind(label), [(job_id, attempt)])[0]


def execute_chunk(
    model: type[UniqueJob], chunk: Sequence[tuple[int, int]], *, deadline: float = math.inf
) -> list[JobOutcome]:
    """Run a chunk's jobs, (id, attempt) pairs, one after another; always returns.

    Each job is performed and its outcome recorded on its own. The statements are
    shared: one starts the next ``jobs_per_statement`` jobs (8 by default) and marks the
    previous ones that succeeded processed (:meth:`JobTable.steps`); a failure is
    recorded at once. The chunk's rows are read once. Once the monotonic *deadline* has
    passed, the jobs not started yet are handed back (:func:`give_back`) for dispatch to
    start again, so one task never holds a worker for long.

    The database going away (a restart, a failover, a dropped connection) costs the
    chunk nothing: each statement waits for it to answer again, up to the kind's
    :attr:`~KindOptions.outage_seconds`, and then records what happened; a job whose
    ``perform()`` it interrupted runs again under its lease, up to ``OUTAGE_RERUNS``
    times. A database that stays away longer ends the chunk: every job whose outcome is
    not recorded is :attr:`JobOutcome.INTERRUPTED`, those not started are handed back
    if the database answers by then, and the others are left to their lease.
    """
    run = _ChunkRun(model, chunk, deadline)
    try:
        run.run()
    except DatabaseError as exc:
        run.interrupted(exc)
    return [outcome for outcome in run.outcomes if outcome is not None]


class _ChunkRun:
    """One run of a chunk (:func:`execute_chunk`) and what it has done so far."""

    def __init__(
        self, model: type[UniqueJob], chunk: Sequence[tuple[int, int]], deadline: float
    ) -> None:
        self.model = model
        self.label = model._meta.label
        self.table = JobTable(model)
        self.worker = worker_identity()
        self.chunk = chunk
        self.deadline = deadline
        self.rows: dict[int, UniqueJob] = {}
        #: In the chunk's order; None: performed, not recorded yet (see :attr:`done`).
        self.outcomes: list[JobOutcome | None] = []
        #: Of the jobs performed, marked processed by the next statement: outcome slot ->
        #: (id, token, result).
        self.done: dict[int, tuple[int, int, object]] = {}
        #: ``chunk[:started]`` went through a statement that started them (or handed
        #: them back); the others are not started.
        self.started = 0
        self.handed_back = 0  # at the deadline
        #: The jobs of the group still this worker's: (id, token) pairs.
        self.ours: list[tuple[int, int]] = []
        self.renewed = 0.0  # when the group's leases were last extended (monotonic)

    def run(self) -> None:
        table, chunk = self.table, self.chunk
        manager = self.model._default_manager.using(table.alias)
        pks = [pk for pk, _ in chunk]
        self.rows = self._outlasting(partial(manager.in_bulk, pks), "the read of a chunk")
        renew_after = table.options.lease_seconds / 3
        while self.started < len(chunk):
            if self.started and time.monotonic() >= self.deadline:
                give_back(self.model, chunk[self.started :], why="ran out of time")
                self.handed_back = len(chunk) - self.started
                self.started = len(chunk)
                break
            group = _next_group(chunk, self.started, table.options.jobs_per_statement, self.rows)
            token = new_token()
            finished, started = self._steps(group, token)
            self.started += len(group)
            self.renewed = time.monotonic()  # the group's leases were extended just now
            self.ours = [(pk, token) for pk, _ in group if pk in started and pk in self.rows]
            self._record_done(finished)
            for job_id, attempt in group:
                if (job_id, token) not in self.ours:
                    logger.info(
                        "%s #%s attempt %s is not ours to run; skipped.",
                        self.label,
                        job_id,
                        attempt,
                    )
                    self.outcomes.append(JobOutcome.SKIPPED)
                elif time.monotonic() - self.renewed >= renew_after and not self._still_ours(
                    job_id
                ):
                    # It waited long in its group (a long job before it, which may have
                    # failed or lost its lease since): its lease was lost meanwhile.
                    logger.warning(
                        "%s #%s lost its lease while waiting in its group; not run.",
                        self.label,
                        job_id,
                    )
                    self.outcomes.append(JobOutcome.LEASE_LOST)
                else:
                    self._perform(self.rows[job_id], attempt, token)
        if self.done:
            self._record_done(self._steps([], 0)[0])

    def _perform(self, job: UniqueJob, attempt: int, token: int) -> None:
        """Perform *job* (attempt *attempt*, under *token*) and record a failure; a
        success is recorded by the next statement (:attr:`done`)."""
        job_id, alias = job.pk, self.table.alias
        job.attempt, job.token = attempt, token
        for rerun in range(OUTAGE_RERUNS + 1):
            mates = [pair for pair in self.ours if pair != (job_id, token)]
            beat = Heartbeat(self.model, job_id, attempt, token, mates)
            try:
                name, attributes = job.trace_span()
                with tracing.continued(name, job.trace_context, attributes):
                    returned = job.perform(beat)
                result = stored_result(self.table, returned)
            except LeaseLost:
                logger.warning(
                    "%s #%s lost its lease during attempt %s.", self.label, job_id, attempt
                )
                self.outcomes.append(JobOutcome.LEASE_LOST)
            except Exception as exc:
                if rerun < OUTAGE_RERUNS and is_transient(exc, alias):
                    # Interrupted by the database (gone away, a dropped connection): not
                    # the job's fault. Run it again once the database answers, if its
                    # lease is still ours (a DatabaseError ends the chunk otherwise).
                    if not await_database(alias, self.table.options.outage_seconds):
                        raise
                    if self._still_ours(job_id):
                        logger.warning(
                            "%s #%s attempt %s was interrupted by the database (%s); "
                            "running it again.",
                            self.label,
                            job_id,
                            attempt,
                            exc,
                        )
                        continue
                    logger.warning(
                        "%s #%s lost its lease while the database was away.", self.label, job_id
                    )
                    self.outcomes.append(JobOutcome.LEASE_LOST)
                    return
                error, permanent = describe(exc), isinstance(exc, PermanentFailure)
                self.outcomes.append(
                    retry_or_fail(
                        self.model, job_id, attempt, error, token=token, permanent=permanent
                    )
                )
            else:
                self.done[len(self.outcomes)] = (job_id, token, result)
                self.outcomes.append(None)
                return
            finally:
                self.renewed = max(self.renewed, beat.renewed_at or self.renewed)
            self.ours.remove((job_id, token))
            return

    def _still_ours(self, job_id: int) -> bool:
        """Extend the leases of the group's jobs still this worker's; whether *job_id*'s
        is one of them."""
        kept = self._outlasting(partial(self.table.renew, self.ours), "a lease check")
        self.renewed = time.monotonic()
        self.ours = [pair for pair in self.ours if pair[0] in kept]
        return job_id in kept

    def _steps(self, starts: Sequence[tuple[int, int]], token: int) -> tuple[set[int], set[int]]:
        """:meth:`JobTable.steps`: record the jobs :attr:`done`, start *starts* under
        *token*; when the database went away meanwhile, again once it answers
        (*resumed*: the first try may have committed)."""
        finishes, tries = list(self.done.values()), itertools.count()

        def step() -> tuple[set[int], set[int]]:
            resumed = next(tries) > 0
            return self.table.steps(finishes, starts, self.worker, token=token, resumed=resumed)

        return self._outlasting(step, "a step")

    def _record_done(self, finished: set[int]) -> None:
        for at, (pk, token, _) in self.done.items():
            self.outcomes[at] = (
                JobOutcome.PROCESSED if pk in finished else _late(self.model, pk, token)
            )
        self.done.clear()

    def _outlasting(self, fn: Callable[[], T], what: str) -> T:
        return outlast_outage(
            fn,
            self.table.alias,
            what=f"{what} of {self.label} jobs",
            wait_seconds=self.table.options.outage_seconds,
        )

    def interrupted(self, exc: DatabaseError) -> None:
        """The database stayed away longer than the kind's ``outage_seconds``: end the
        chunk. Every job not recorded is INTERRUPTED; those not started yet are handed
        back (if the database answers now), the others are left to their lease."""
        missing = len(self.chunk) - self.handed_back - len(self.outcomes)
        logger.error(
            "%s: the database stayed away; %s job(s) of a chunk are left to their lease "
            "or handed back unstarted: %s",
            self.label,
            missing + len(self.done),
            exc,
        )
        for at in self.done:
            self.outcomes[at] = JobOutcome.INTERRUPTED
        self.done.clear()
        self.outcomes += [JobOutcome.INTERRUPTED] * missing
        try:
            give_back(
                self.model,
                self.chunk[self.started :],
                why="lost the database before starting it",
                wait_seconds=0,
            )
        except DatabaseError:
            pass  # left to their lease: a dispatch hands them back, their attempt not counted


def _next_group(
    chunk: Sequence[tuple[int, int]], index: int, size: int, rows: dict[int, UniqueJob]
) -> list[tuple[int, int]]:
    """The jobs that one statement starts: up to *size* from *index* on. A job whose last
    attempt ended with its lease lost (its worker died, maybe because of it) runs in a
    group of its own, so that a crash it causes again costs no other job an attempt."""
    group: list[tuple[int, int]] = []
    for pair in chunk[index:]:
        job = rows.get(pair[0])
        alone = size > 1 and job is not None and job.last_error.startswith(LEASE_EXPIRED_START)
        if alone and group:
            break
        group.append(pair)
        if alone or len(group) >= size:
            break
    return group


def stored_result(table: JobTable, returned: object) -> object:
    """*returned* as the kind's ``result_field`` stores it (None without one).

    A value that is not JSON raises :class:`PermanentFailure`: the attempt fails, since
    running it again would return the same kind of value.
    """
    name = table.options.result_field
    if name is None:
        return None
    field = cast(JSONField, concrete_field(table.model, name))  # a check says it is one
    try:
        dumps(returned, cls=field.encoder)
        return field.get_db_prep_save(returned, table.connection)
    except (TypeError, ValueError) as exc:
        raise PermanentFailure(
            f"perform() returned a value {name} cannot store as JSON: {exc}"
        ) from exc


def give_back(
    model: type[UniqueJob],
    jobs: Sequence[tuple[int, int]],
    *,
    why: str,
    wait_seconds: float | None = None,
) -> int:
    """Return dispatched jobs that no worker started to pending, their attempt not counted.

    Fenced like a start (the attempt, ``running``, ``started_at`` NULL): a job a worker
    took meanwhile is left to it. An unstarted job held its unique key all along (every
    enqueue of the key returned it), so no twin can be pending beside it. Returns how
    many jobs went back to pending. When the database goes away meanwhile,
    waits up to *wait_seconds* for it (the kind's ``outage_seconds`` by default).
    """
    if not jobs:
        return 0
    table = leases(model)
    alias = table.alias

    def unstarted(pairs: Sequence[tuple[int, int]]) -> QuerySet:
        match = Q()
        for job_id, attempt in pairs:
            match |= Q(pk=job_id, attempt=attempt)
        return table.objects().filter(match, state=JobState.RUNNING, started_at=None)

    def back(query: QuerySet) -> int:
        return query.update(
            state=JobState.PENDING,
            attempt=F("attempt") - 1,
            process_after=Now(),
            lease_expires_at=None,
            worker="",
        )

    returned = outlast_outage(
        lambda: back(unstarted(jobs)),
        alias,
        what=f"hand-back of {model._meta.label} jobs",
        wait_seconds=kind_options(model).outage_seconds if wait_seconds is None else wait_seconds,
    )
    if returned:
        logger.info(
            "%s job(s) of %s handed back unstarted: their worker %s.",
            returned,
            model._meta.label,
            why,
        )
    return returned


def finish(model: type[UniqueJob], job_id: int, token: int) -> JobOutcome:
    """Mark the job processed, fenced by its token."""
    finished, _ = JobTable(model).step((job_id, token), None, "")
    return JobOutcome.PROCESSED if finished else _late(model, job_id, token)


def _late(model: type[UniqueJob], job_id: int, token: int) -> JobOutcome:
    logger.warning(
        "%s #%s finished its run (token %s) after losing its lease; not marked processed.",
        model._meta.label,
        job_id,
        token,
    )
    return JobOutcome.LEASE_LOST


def retry_or_fail(
    model: type[UniqueJob],
    job_id: int,
    attempt: int,
    error: str,
    *,
    token: int,
    delay: float | None = None,
    permanent: bool = False,
    counted: bool = True,
) -> JobOutcome:
    """Record a failed or lost attempt: back to pending after a backoff, or failed.

    Fenced by the run's *token*. Failed when *permanent* or when it was the last attempt.
    A job whose key got a new job while it ran cannot go back to pending (the unique
    index holds one job per key not started): it is failed with a note naming the new
    job, which does the same work. *delay* overrides the backoff (0 for a rescued job).
    Not *counted*, the attempt goes back unspent (``attempt - 1``: the next dispatch
    runs the same attempt number again) and never exhausts the job.
    """
    table, retry = leases(model), policy(model)
    alias = table.alias
    error = clip(error)

    def failure_transaction() -> JobOutcome:
        with transaction.atomic(using=alias):
            job = table.fenced(job_id, token)
            if counted and retry.exhausted(attempt, permanent=permanent):
                return _fail(job, error)
            wait = retry.retry_in(attempt) if delay is None else delay
            unspent = {} if counted else {"attempt": F("attempt") - 1, "worker": ""}
            try:
                with transaction.atomic(using=alias):
                    retried = job.update(
                        state=JobState.PENDING,
                        process_after=Now() + timedelta(seconds=wait) if wait else Now(),
                        lease_expires_at=None,
                        last_error=error,
                        **unspent,
                    )
            except IntegrityError:
                twin = _unstarted_twin(model, job_id, alias)
                outcome = _fail(job, f"{error}\n\n{SUPERSEDED_NOTE.format(twin=twin)}")
                return JobOutcome.SUPERSEDED if outcome is JobOutcome.FAILED else outcome
            return JobOutcome.RETRYING if retried else JobOutcome.LEASE_LOST

    outcome = outlast_outage(
        failure_transaction,
        alias,
        what=f"failure of {model._meta.label} #{job_id}",
        wait_seconds=kind_options(model).outage_seconds,
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


def _unstarted_twin(model: type[UniqueJob], job_id: int, alias: str) -> int | None:
    """The job of the same unique key that no worker started yet (the one holding it)."""
    manager = model._default_manager.using(alias)
    names = [concrete_field(model, name).attname for name in kind_options(model).unique_fields]
    key = manager.filter(pk=job_id).values(*names).first() or {}
    twins = manager.filter(UNSTARTED, **key).exclude(pk=job_id)
    return twins.values_list("pk", flat=True).first()


def rescue_expired(model: type[UniqueJob], limit: int) -> tuple[int, int]:
    """Give jobs whose lease expired back to pending, or fail them on their last attempt.

    Runs inside the dispatch transaction. The lost attempt of a job that ran alone in its
    group (the only one its statement started, or the only one of them still running)
    counts: a job that keeps killing its worker ends up failed after ``max_attempts``.
    The jobs of a group of several, started together under one token, go back with
    their attempt not counted: the database cannot tell which of them was running, so
    none is charged, and each then runs in a group of its own (:func:`_next_group`),
    where a crash counts. A job that was waiting in its chunk, not started, goes back
    with its attempt not counted (:func:`give_back`). Returns (rescued, exhausted).
    """
    table = leases(model)
    rows = table.expired(limit, fields=("started_at", "token"))
    started = [row for row in rows if row["started_at"] is not None]
    tokens = {row["token"] for row in started}
    if tokens:
        # The rest of each crashed group (their leases expired together), beyond *limit*.
        seen = {row["pk"] for row in rows}
        started += [
            row
            for row in table.expired(limit, fields=("started_at", "token"), token__in=tokens)
            if row["pk"] not in seen and row["started_at"] is not None
        ]
    groups = Counter(row["token"] for row in started)
    rescued = exhausted = 0
    for row in started:
        pk, attempt, token = row["pk"], row["attempt"], row["token"]
        size = groups[token]
        if size > 1:
            error = GROUP_LEASE_EXPIRED.format(attempt=attempt, size=size)
            outcome = retry_or_fail(model, pk, attempt, error, token=token, delay=0, counted=False)
        else:
            error = LEASE_EXPIRED.format(attempt=attempt)
            outcome = retry_or_fail(model, pk, attempt, error, token=token, delay=0)
        if outcome is JobOutcome.RETRYING:
            rescued += 1
        elif outcome in (JobOutcome.FAILED, JobOutcome.SUPERSEDED):
            exhausted += 1
    unstarted = [(row["pk"], row["attempt"]) for row in rows if row["started_at"] is None]
    rescued += give_back(model, unstarted, why="died, stalled or lost the task before starting it")
    return rescued, exhausted
