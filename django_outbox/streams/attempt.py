"""One attempt at a group: run it through its stream's bulk handler, then archive and delete it.

The handler receives a :class:`~django_outbox.streams.batch.Batch` and returns ``None`` when
every row is done, or a :class:`~django_outbox.streams.batch.BatchResult` naming the rows that
failed (only those stay in the group for the next attempt). Raising means the whole
group failed.

Every change to a group after its lease is taken is fenced by the attempt number: the
statement only matches a group that is still ``running`` with the attempt this worker
took. A worker that lost its lease changes nothing and gets :class:`LeaseLost`.
"""

from __future__ import annotations

import enum
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models.functions import Now
from django.utils import timezone

from django_outbox.base import tracing
from django_outbox.base.errors import ERROR_LIMIT, clip, describe
from django_outbox.base.routing import connection_for
from django_outbox.base.transient import (
    OUTAGE_RERUNS,
    await_database,
    is_transient,
    outlast_outage,
)
from django_outbox.conf import StreamConfig, get_stream, on_stream_database, stream_database
from django_outbox.exceptions import LeaseLost, PermanentFailure, RetryAfter
from django_outbox.lease import heartbeat
from django_outbox.lease.engine import worker_identity
from django_outbox.models.archive import Outcome
from django_outbox.models.groups import GroupState, OutboxGroup
from django_outbox.signals import (
    group_exhausted,
    group_failed,
    group_processed,
    group_split,
    send_on_commit,
)
from django_outbox.streams import budget, isolate, ordering
from django_outbox.streams.batch import Batch, BatchResult
from django_outbox.streams.groups import arm_retries, group_leases, group_policy
from django_outbox.streams.sql import buffer_ops
from django_outbox.streams.sql.base import Move

logger = logging.getLogger(__name__)

#: How a group's ``last_error`` notes that dead-lettering it failed.
DEAD_LETTERING_FAILED = "Dead-lettering failed"
#: How a group's ``last_error`` begins when its finalize failed (not its handler).
FINALIZE_FAILED = "finalize failed: "


class AttemptOutcome(enum.StrEnum):
    DONE = "done"
    PARTIAL = "partial"
    RETRYING = "retrying"
    EXHAUSTED = "exhausted"
    KEPT = "kept"  # exhausted, but dead-lettering failed: kept for distribute to retry
    SPLIT = "split"  # failed as a whole; split in two halves to isolate the failure
    SKIPPED = "skipped"
    LEASE_LOST = "lease_lost"
    DEFERRED = "deferred"  # back to the queue, attempt unchanged: a pause or the budget
    EMPTY = "empty"  # a run's reservation that found no rows to claim (nothing ran)


@on_stream_database
def take_group_lease(config: StreamConfig, group_id: uuid.UUID) -> int | None:
    """Start attempt n of a queued group and return n, or ``None`` if it is not queued.

    ``None`` means a duplicate delivery, a group already running elsewhere, or a group
    that no longer exists: the job has nothing to do.
    """
    taken = _take(config, group_id)
    return taken[0] if taken else None


def _take(
    config: StreamConfig, group_id: uuid.UUID
) -> tuple[int, uuid.UUID | None, int, int] | None:
    """:func:`take_group_lease`, with the group's sibling (the other half of the split it came
    from, :mod:`django_outbox.streams.isolate`; None for a claimed group), split depth and size
    (0 for a run's reservation, whose rows are claimed once it runs).

    The take checks the stream's pause in the same statement: a queued group of a
    paused stream is not taken but goes back to the queue, due when the pause ends
    (:func:`django_outbox.streams.budget.hold_back`), its attempt unchanged.
    """
    taken = group_leases(config).take_row(
        group_id,
        worker_identity(),
        where={"stream": config.name, "state": GroupState.CLAIMED},
        next_attempt=True,
        returning=("sibling_id", "split_depth", "size"),
        condition=budget.unpaused(config),  # no handler call starts during a pause
    )
    if not taken:
        budget.hold_back(config, group_id)  # paused: due when the pause ends
        return None
    return (taken[0], taken[1], taken[2], taken[3])


@on_stream_database
def process_group(
    stream: str,
    group_id: uuid.UUID | str,
    fill: Callable[[uuid.UUID, int], bool] | None = None,
) -> AttemptOutcome:
    """Run one attempt of a queued group: lease, handler, then finalize or record the failure.

    A group of no rows is a run's reservation (:func:`django_outbox.streams.run.start_runs`):
    once leased, *fill* claims rows into it under the lease, or deletes it when none
    wait (or the stream may not claim now); then the outcome is ``EMPTY``.
    """
    config = get_stream(stream)
    group_id = uuid.UUID(str(group_id))
    alias = connection_for(OutboxGroup).alias
    taken = outlast_outage(
        partial(_take, config, group_id),
        alias,
        what=f"taking the lease of group {group_id}",
        wait_seconds=config.outage_seconds,
    )
    if taken is None:
        return AttemptOutcome.SKIPPED
    attempt, sibling, split_depth, size = taken
    if size == 0 and not (fill is not None and fill(group_id, attempt)):
        return AttemptOutcome.EMPTY
    outcome = run_attempt(config, group_id, attempt, split_depth)
    if sibling is not None and outcome is AttemptOutcome.DONE:
        _tell_sibling(config, sibling)
    return outcome


def _tell_sibling(config: StreamConfig, sibling: uuid.UUID) -> None:
    """After a split half was delivered: evidence for its sibling, in a short transaction."""
    alias = connection_for(OutboxGroup).alias

    def tell() -> bool:
        with transaction.atomic(using=alias):
            return isolate.sibling_delivered(config, sibling)

    outlast_outage(
        tell,
        alias,
        what=f"failure isolation of group {sibling}",
        wait_seconds=config.outage_seconds,
    )


@on_stream_database
def run_attempt(
    config: StreamConfig, group_id: uuid.UUID, attempt: int, split_depth: int = 0
) -> AttemptOutcome:
    """Run attempt *attempt* of a group whose lease this worker holds: handler, finalize.

    With OpenTelemetry the attempt runs in a delivery span (:func:`tracing.deliver`).

    The run loop calls it directly for a group it claimed already running (attempt 1);
    :func:`process_group` calls it after taking the lease of a queued group.

    When the attempt fails because our database went away (a restart, a failover: a
    transient error that its quick retries did not outlast), the worker waits for the
    database to answer again and runs the attempt once more under the lease it still
    holds, up to ``OUTAGE_RERUNS`` times; such a failure is not the rows' fault and is
    never split. A ``TRANSACTIONAL`` attempt left nothing behind, so running it again
    keeps its exactly-once effects (if its commit went through before the connection
    died, the lease is gone and the second run changes nothing).
    """
    deferred = _await_budget(config, group_id, attempt) if config.budgeted else None
    if deferred is None:
        deferred = _hold_for_pause(config, group_id, attempt)
    if deferred is not None:
        return deferred
    with tracing.deliver(config.name, group_id, attempt, split_depth) as links:
        outcome = _run_attempt(Batch(config, group_id, attempt, links=links))
        tracing.outcome(links, outcome.value)
    return outcome


def _run_attempt(batch: Batch) -> AttemptOutcome:
    config = batch.config
    alias = connection_for(OutboxGroup).alias
    for rerun in range(OUTAGE_RERUNS + 1):
        try:
            if config.transactional:
                return _run_transactional(batch)
            with _beating(batch) if config.auto_heartbeat else nullcontext():
                result = _call_handler(batch)
            break
        except LeaseLost:
            logger.warning("Lease lost: %s", batch)
            return AttemptOutcome.LEASE_LOST
        except RetryAfter as exc:
            return _pause(batch, exc)
        except Exception as exc:
            cause = (exc.__cause__ or exc) if isinstance(exc, _FinalizeFailed) else exc
            outage = is_transient(cause, alias)
            if outage and rerun < OUTAGE_RERUNS and await_database(alias, config.outage_seconds):
                logger.warning(
                    "%s was interrupted by the database (%s); running it again", batch, cause
                )
                continue
            if isinstance(exc, _FinalizeFailed):
                # The handler's writes rolled back with the finalize: not the rows' fault.
                return fail_group(batch, describe(cause, label=FINALIZE_FAILED), isolate_rows=False)
            permanent = isinstance(exc, PermanentFailure)
            return fail_group(batch, describe(exc), permanent=permanent, isolate_rows=not outage)
    try:
        return finalize(batch, result)
    except LeaseLost:
        logger.warning("Lease lost before finalize: %s", batch)
        return AttemptOutcome.LEASE_LOST
    except DatabaseError as exc:
        # Retried already; the rows are still in the group: count a failed attempt (not
        # the rows' fault: no split).
        return fail_group(batch, describe(exc, label=FINALIZE_FAILED), isolate_rows=False)


def _beating(batch: Batch) -> AbstractContextManager[None]:
    """The automatic heartbeat of *batch* while its handler runs (``AUTO_HEARTBEAT``)."""

    def beat() -> None:
        with stream_database(batch.config):  # the keeper's thread is on no stream's database
            batch.heartbeat()

    return heartbeat.beating(beat, batch.config.lease_seconds, batch)


def _await_budget(config: StreamConfig, group_id: uuid.UUID, attempt: int) -> AttemptOutcome | None:
    """Wait for the stream's next call slot (:mod:`django_outbox.streams.budget`); None once the
    handler may be called, DEFERRED when the group went back to the queue instead."""
    return _defer_until(
        config, group_id, attempt, partial(budget.take_slot, config, group_id), "rate budget"
    )


def _hold_for_pause(
    config: StreamConfig, group_id: uuid.UUID, attempt: int
) -> AttemptOutcome | None:
    """Check the stream's pause right before the handler call (one read of the state
    row): None when the call may start, DEFERRED when the group went back to the queue,
    due when the pause ends, its attempt not spent.

    The claim and the take check the pause in their own statements; this read closes the
    window between them and the call (a floor move, a fan-out, a budget slot), so no
    handler call of the stream starts once a pause is recorded.
    """
    return _defer_until(config, group_id, attempt, partial(budget.pause_end, config), "pause")


def _defer_until(
    config: StreamConfig,
    group_id: uuid.UUID,
    attempt: int,
    until: Callable[[], datetime | None],
    what: str,
) -> AttemptOutcome | None:
    """Ask *until* (the budget's next slot, the pause's end) whether the handler call
    must wait: None when it may start, else the group goes back to the queue (DEFERRED)."""
    due = outlast_outage(
        until,
        connection_for(OutboxGroup).alias,
        what=f"the {what} of group {group_id} of stream {config.name}",
        wait_seconds=config.outage_seconds,
    )
    if due is None:
        return None
    return _defer(config, group_id, attempt, due)


def _defer(
    config: StreamConfig, group_id: uuid.UUID, attempt: int, until: datetime
) -> AttemptOutcome:
    """Hand the leased group back, due at *until*, its attempt not spent."""
    what = f"group {group_id} of stream {config.name}"
    alias = connection_for(OutboxGroup).alias
    try:
        outlast_outage(
            partial(budget.defer, config, group_id, attempt, until),
            alias,
            what=f"deferring {what}",
            wait_seconds=config.outage_seconds,
        )
    except LeaseLost:
        logger.warning("Lease lost while deferring %s", what)
        return AttemptOutcome.LEASE_LOST
    return AttemptOutcome.DEFERRED


def _pause(batch: Batch, exc: RetryAfter) -> AttemptOutcome:
    """The handler asked to wait: pause the stream, hand the group back (no attempt spent)."""
    logger.warning("%s: the handler asked to pause the stream: %s", batch, exc)
    try:
        outlast_outage(
            partial(budget.pause, batch.config, batch.group_id, batch.attempt, exc),
            connection_for(OutboxGroup).alias,
            what=f"pausing the stream of {batch}",
            wait_seconds=batch.config.outage_seconds,
        )
    except LeaseLost:
        logger.warning("Lease lost while pausing: %s", batch)
        return AttemptOutcome.LEASE_LOST
    return AttemptOutcome.DEFERRED


class _FinalizeFailed(Exception):
    """The finalize of a ``TRANSACTIONAL`` attempt failed (its cause is the error)."""


def _call_handler(batch: Batch) -> BatchResult | None:
    result = batch.config.handler_func()(batch)
    if isinstance(result, RetryAfter):
        raise result
    if result is not None and not isinstance(result, BatchResult):
        raise TypeError(
            f"The handler of stream {batch.stream!r} returned {type(result).__name__}; "
            "return None when every row is done or a BatchResult naming the failed rows."
        )
    if result is not None and result.failed:
        return BatchResult(_checked_failures(batch, result.failed))
    return result


def _checked_failures(batch: Batch, failed: Any) -> dict[int, str]:
    """The failures of a BatchResult by row id; a ValueError names what is wrong.

    Raised inside the attempt, the error makes the attempt a failed one, recorded on the
    group like any handler error.
    """
    where = f"The handler of stream {batch.stream!r} returned a BatchResult whose failed"
    if not isinstance(failed, Mapping):
        raise ValueError(f"{where} is a {type(failed).__name__}, not a dict of row id to error.")
    checked: dict[int, str] = {}
    bad: list[Any] = []
    for key, error in failed.items():
        try:
            if isinstance(key, bool) or not isinstance(key, (int, str)):
                raise ValueError
            checked[int(key)] = str(error)
        except ValueError:
            bad.append(key)
    strangers = sorted(set(checked) - set(batch.ids))
    if bad or strangers:
        named = ", ".join(repr(key) for key in [*bad, *strangers][:10])
        raise ValueError(
            f"{where} names {len(bad) + len(strangers)} key(s) that are not ids of the "
            f"group's rows: {named}. Name failed rows by their id (batch.ids, row['id'])."
        )
    return checked


def _run_transactional(batch: Batch) -> AttemptOutcome:
    """Run the handler inside the finalize transaction (exactly-once database writes).

    Raises what the handler raised, or :class:`_FinalizeFailed` when the finalize did;
    either way the transaction rolled back and the rows are still in the group.
    """
    with transaction.atomic(using=connection_for(OutboxGroup).alias):
        _lock_fenced(batch)
        result = _call_handler(batch)
        try:
            return _finalize_fenced(batch, result, locked=True)
        except LeaseLost:
            raise
        except Exception as exc:
            raise _FinalizeFailed(exc) from exc


def _lock_fenced(batch: Batch) -> None:
    group_leases(batch.config).lock(batch.group_id, batch.attempt)


def finalize(batch: Batch, result: BatchResult | None) -> AttemptOutcome:
    """Archive and delete the done rows; keep failed rows for a retry. One transaction.

    A transient database error (deadlock, serialization failure, dropped connection)
    runs the transaction again, a bounded number of times.
    """
    alias = connection_for(OutboxGroup).alias

    def finalize_transaction() -> AttemptOutcome:
        with transaction.atomic(using=alias):
            return _finalize_fenced(batch, result, locked=False)

    return outlast_outage(
        finalize_transaction,
        alias,
        what=f"finalize of {batch}",
        wait_seconds=batch.config.outage_seconds,
    )


def _finalize_fenced(batch: Batch, result: BatchResult | None, *, locked: bool) -> AttemptOutcome:
    """Finalize inside the caller's transaction; raise LeaseLost if the lease is gone.

    When every row is done, deleting the group row, fenced by attempt and state, is the
    fence itself; otherwise the group row is locked first (unless *locked* already).
    """
    config = batch.config
    failures = result.failed if result else {}
    failed = {str(pk): clip(err) for pk, err in failures.items()}
    # An ordered stream keeps, with each failed row, the later rows of its key.
    behind = ordering.held_behind(config, batch.group_id, {int(pk) for pk in failures})
    failed.update((str(pk), why) for pk, why in behind.items())
    table = group_leases(config)
    ops = buffer_ops(batch.model, alias=batch.config.alias)
    move = Move(
        config.name,
        Outcome.DONE,
        batch.attempt,
        keep_ids=tuple(int(pk) for pk in failed),
        archive=config.archive,
    )
    if failed:
        if not locked:
            _lock_fenced(batch)
        done = ops.archive_group(batch.group_id, move)
    else:
        fence = table.fenced(batch.group_id, batch.attempt)
        if (fenced := ops.archive_group_fenced(batch.group_id, move, fence)) is None:
            raise table.lost(batch.group_id, batch.attempt)
        done = fenced
    if done:
        send_on_commit(
            group_processed,
            config.name,
            group_id=batch.group_id,
            attempt=batch.attempt,
            rows=done,
            duration=time.monotonic() - batch.started,
        )
    if not failed:
        return AttemptOutcome.DONE
    buffer = batch.model._default_manager.using(batch.config.alias)
    remaining = buffer.filter(group_id=batch.group_id).count()
    if remaining == 0:
        # The failed rows were deleted meanwhile (by the handler, say): nothing to retry.
        OutboxGroup.objects.filter(id=batch.group_id).delete()
        return AttemptOutcome.DONE
    summary = f"{remaining} of the group's rows failed"
    outcome = _record_failure(batch, summary, row_errors=failed, size=remaining)
    return AttemptOutcome.PARTIAL if outcome is AttemptOutcome.RETRYING else outcome


def fail_group(
    batch: Batch, error: str, *, permanent: bool = False, isolate_rows: bool = True
) -> AttemptOutcome:
    """Record that the handler failed the whole group: split, retry later or exhaust.

    With the stream's ``ISOLATE_FAILURES`` (and *isolate_rows*) the group may be split
    in two halves instead (:mod:`django_outbox.streams.isolate`). A *permanent* failure
    (:class:`PermanentFailure`) skips the remaining attempts.
    """
    alias = connection_for(OutboxGroup).alias

    def failure_transaction() -> AttemptOutcome:
        with transaction.atomic(using=alias):
            _lock_fenced(batch)
            if isolate_rows and _split(batch, error, permanent=permanent):
                return AttemptOutcome.SPLIT
            return _record_failure(batch, error, permanent=permanent)

    try:
        return outlast_outage(
            failure_transaction,
            alias,
            what=f"failure record of {batch}",
            wait_seconds=batch.config.outage_seconds,
        )
    except LeaseLost:
        logger.warning("Lease lost while recording a failure: %s", batch)
        return AttemptOutcome.LEASE_LOST


def _split(batch: Batch, error: str, *, permanent: bool) -> bool:
    """Split the locked group if failure isolation says so; whether it was split."""
    config = batch.config
    if not config.isolate_failures:
        return False
    group = OutboxGroup.objects.filter(id=batch.group_id).values(*isolate.FIELDS).get()
    if not isolate.should_split(config, group, batch.attempt, permanent=permanent):
        return False
    rows = isolate.split_group(
        config, batch.group_id, clip(error), group["split_depth"], batch.attempt
    )
    if rows:
        send_on_commit(
            group_split,
            config.name,
            group_id=batch.group_id,
            attempt=batch.attempt,
            rows=rows,
            depth=group["split_depth"] + 1,
            error=error,
        )
    return rows > 0


def _record_failure(
    batch: Batch,
    error: str,
    *,
    row_errors: Mapping[str, str] | None = None,
    size: int | None = None,
    permanent: bool = False,
) -> AttemptOutcome:
    config = batch.config
    retry = group_policy(config)
    if retry.exhausted(batch.attempt, permanent=permanent):
        rows = exhaust_group(
            config, batch.group_id, batch.attempt, error, row_errors=row_errors, batch=batch
        )
        return AttemptOutcome.KEPT if rows is None else AttemptOutcome.EXHAUSTED
    delay = retry.retry_in(batch.attempt)
    changes: dict[str, Any] = {
        "state": GroupState.RETRYING,
        "next_attempt_at": Now() + timedelta(seconds=delay),
        "lease_expires_at": None,
        "last_error": clip(error),
        "row_errors": dict(row_errors) if row_errors else None,
    }
    if size is not None:
        changes["size"] = size
    group_leases(config).update(batch.group_id, batch.attempt, **changes)
    arm_retries(config, [batch.group_id], timezone.now() + timedelta(seconds=delay))
    send_on_commit(
        group_failed,
        config.name,
        group_id=batch.group_id,
        attempt=batch.attempt,
        rows=size if size is not None else OutboxGroup.objects.get(id=batch.group_id).size,
        duration=time.monotonic() - batch.started,
        error=error,
        retry_in=delay,
    )
    return AttemptOutcome.RETRYING


def exhaust_group(
    config: StreamConfig,
    group_id: uuid.UUID,
    attempt: int,
    error: str,
    *,
    row_errors: Mapping[str, str] | None = None,
    batch: Batch | None = None,
) -> int | None:
    """Dead-letter a group: run ``ON_EXHAUSTED``, archive its rows as failed, delete it.

    Runs inside the caller's transaction, which holds the group. The hook gets the
    batch (its rows are still in the buffer) and the error, inside a savepoint: if it
    cannot be imported or raises, its own writes are rolled back, the error is logged,
    and the rows are dead-lettered all the same. The rows are archived even when the
    stream's ``ARCHIVE`` is off: a dead letter is kept for an operator to replay.
    Returns the number of rows dead-lettered.

    The whole of it runs in a savepoint of its own: when dead-lettering itself fails
    (a buffer column the archive cannot hold, say), that one group is kept with its rows
    in state ``dead_lettering``, the error is recorded on it, distribute tries again
    after ``BACKOFF_MAX_SECONDS``, and the caller carries on with its other groups.
    Returns ``None`` then. Transient database errors are raised for the caller's retry.
    """
    alias = connection_for(OutboxGroup).alias
    try:
        with transaction.atomic(using=alias):
            _run_on_exhausted(config, batch or Batch(config, group_id, attempt), error)
            ordering.hold_keys(config, group_id, clip(error))
            rows = buffer_ops(config.model_class, alias=config.alias).archive_group(
                group_id,
                Move(config.name, Outcome.FAILED, attempt, clip(error), row_errors=row_errors),
            )
            OutboxGroup.objects.filter(id=group_id).delete()
    except Exception as exc:
        if is_transient(exc, alias):
            raise
        _keep_undead(config, group_id, error, row_errors, exc)
        return None
    send_on_commit(
        group_exhausted, config.name, group_id=group_id, attempt=attempt, rows=rows, error=error
    )
    return rows


def _keep_undead(
    config: StreamConfig,
    group_id: uuid.UUID,
    error: str,
    row_errors: Mapping[str, str] | None,
    exc: Exception,
) -> None:
    """Keep a group whose dead-lettering failed, its rows and both errors, for later."""
    logger.error(
        "Dead-lettering group %s of stream %s failed; the group and its rows are kept "
        "(state dead_lettering) and distribute tries again in %s s",
        group_id,
        config.name,
        config.backoff_max_seconds,
        exc_info=exc,
        extra={"stream": config.name, "group_id": str(group_id)},
    )
    half = ERROR_LIMIT // 2
    failed = describe(exc, half - 2, label=f"{DEAD_LETTERING_FAILED}: ")
    reason = f"{clip(group_error(error), half)}\n\n{failed}"
    changes: dict[str, Any] = {
        "state": GroupState.DEAD_LETTERING,
        "lease_expires_at": None,
        "next_attempt_at": Now() + timedelta(seconds=config.backoff_max_seconds),
        "last_error": reason,
        "updated_at": Now(),
    }
    if row_errors:
        changes["row_errors"] = dict(row_errors)
    OutboxGroup.objects.filter(id=group_id).update(**changes)


def group_error(last_error: str) -> str:
    """The group's own error in *last_error*, without a failed dead-lettering's note."""
    return last_error.split(f"\n\n{DEAD_LETTERING_FAILED}: ", 1)[0]


def _run_on_exhausted(config: StreamConfig, batch: Batch, error: str) -> None:
    try:
        hook = config.on_exhausted_func()
        if hook is None:
            return
        with transaction.atomic(using=connection_for(OutboxGroup).alias):
            hook(batch, error)
    except Exception:
        logger.exception(
            "ON_EXHAUSTED hook of stream %s failed for group %s; dead-lettering anyway",
            config.name,
            batch.group_id,
        )
