"""A stream's rate budget and pauses: how many handler calls may start, and when.

Two limits share one column of the stream's state row, ``next_call_at``: no handler call
of the stream starts before it.

* **The budget** (``CALLS_PER_SECOND``). Before each handler call, a worker reserves
  the stream's next slot in one statement (:func:`~django_outbox.streams.sql.budget.reserve_call`):
  the slot starts at ``next_call_at`` or now, whichever is later, and moves
  ``next_call_at`` one interval (``1 / CALLS_PER_SECOND``) on. The row lock orders the
  reservations of every worker of every cluster, and the database's clock times them:
  calls start at least one interval apart, whatever the number of workers. A slot at
  most ``WAIT_SECONDS`` away is waited for (the pacing of a stream at its budget);
  a worker never waits longer: it hands its group back to the queue, due at the
  stream's next slot (the attempt unchanged), and its run ends.
  With ``ROWS_PER_SECOND`` the reservation is weighted by the group's rows: the slot
  moves ``next_call_at`` on by the group's size over ``ROWS_PER_SECOND`` (or the calls'
  interval, whichever is longer). A group is never held back by its own weight, only
  the calls after it: a group larger than one second's rows goes at its slot, and the
  next call waits for all of it. Claims of such a stream take at most one second's
  rows (:func:`claim_limit`).
* **A pause** (:class:`~django_outbox.exceptions.RetryAfter` from a handler: a 429).
  The group goes back to the queue with its attempt unchanged, due when the pause
  ends; the stream's ``paused_until`` and ``next_call_at`` move to the pause's end; its
  queued groups wait for it too. No handler call of the stream starts meanwhile: each
  is preceded by a read of the pause right before the handler is called
  (:func:`pause_end`, from ``attempt.run_attempt``), and by a check in the statement
  that hands the worker its group (:func:`unpaused`): the claim of
  a run's next group (a paused stream's claim takes nothing), the take of a queued
  group's lease (refused: the group goes back to the queue, due when the pause ends,
  :func:`hold_back`), and for a budgeted stream the slot's reservation, read again
  after a wait for the slot (:func:`take_slot`). No run, reservation or rescue starts
  during a pause (:func:`admits`). An operator's pause (``paused``) holds the same way.

A stream without a budget reads one thing more per call: the pause, one primary-key
read of the state row right before the handler; the claim's and the take's checks are
a condition inside those statements.
"""

from __future__ import annotations

import math
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Exists, Q, Subquery
from django.db.models.functions import Coalesce, Greatest, Now
from django.utils import timezone

from django_outbox.base.dialect import database_now
from django_outbox.base.errors import clip
from django_outbox.base.routing import connection_for
from django_outbox.conf import StreamConfig
from django_outbox.exceptions import RetryAfter
from django_outbox.models.groups import GroupState, OutboxGroup
from django_outbox.models.state import StreamState
from django_outbox.streams.groups import arm_retries, group_leases
from django_outbox.streams.sql import budget as budget_sql
from django_outbox.streams.sql.base import unpaused as unpaused_sql

#: A worker waits at most this long for its stream's next call slot.
WAIT_SECONDS = 1.0


def admits(config: StreamConfig, state: StreamState | None, *, calls_next: bool = False) -> bool:
    """Whether a claim of the stream may start now: not paused, not ahead of its budget.

    Called before every claim with the state row the caller holds, and before runs
    start (a fan-out, distribute; *calls_next* there: only the pause); a stream without
    a pause on that row costs nothing when it has no budget, or when the claimer calls
    the handler next (*calls_next*: the run loop), whose reservation
    (:func:`take_slot`) keeps the budget. Otherwise one read of the row, in the
    database's clock: the stream is held while paused, or while its next call slot is
    more than half of ``WAIT_SECONDS`` away. A pause that has passed is cleared. The
    claim statement checks the pause itself (:func:`unpaused`): a row read before the
    pause began cannot let a claim through.
    """
    unbudgeted = not config.budgeted or calls_next
    if state is None or (unbudgeted and state.paused_until is None):
        return True
    horizon = Now() + timedelta(seconds=WAIT_SECONDS / 2)
    held = Q(paused_until__gt=Now())
    if config.budgeted:
        held |= Q(next_call_at__gt=horizon)
    if StreamState.objects.filter(held, stream=config.name).exists():
        return False
    if state.paused_until is not None:
        StreamState.objects.filter(stream=config.name, paused_until__lte=Now()).update(
            paused_until=None
        )
        state.paused_until = None
    return True


def unpaused(config: StreamConfig) -> tuple[str, list[Any]]:
    """The condition, for a statement on the stream's tables, that the stream is not
    paused (by an operator, or by a handler's pause until it ends)."""
    return unpaused_sql(connection_for(StreamState), config.name)


def _pauses(stream: str) -> Any:
    """The stream's state row while it is paused: by an operator, or by a handler's
    pause that has not ended (in the database's clock)."""
    return StreamState.objects.filter(Q(paused=True) | Q(paused_until__gt=Now()), stream=stream)


def pause_end(config: StreamConfig) -> datetime | None:
    """When the stream's pause ends (now for an operator's pause, which ends when it is
    resumed), or None when it is not paused. One read of the state row."""
    until = Greatest(Coalesce("paused_until", Now()), Now())
    return _pauses(config.name).annotate(until=until).values_list("until", flat=True).first()


def hold_back(config: StreamConfig, group_id: uuid.UUID) -> bool:
    """A queued group whose lease the stream's pause refused: back to the queue, due
    when the pause ends, its attempt unchanged (a run's reservation, which holds no
    rows, is dropped); whether it was."""
    until = _pauses(config.name).values("paused_until")[:1]
    queued = OutboxGroup.objects.filter(
        id=group_id, stream=config.name, state=GroupState.CLAIMED
    ).filter(Exists(_pauses(config.name)))
    if queued.filter(size=0).delete()[0]:
        return True
    held = queued.update(
        state=GroupState.RETRYING,
        next_attempt_at=Greatest(Coalesce(Subquery(until), Now()), Now()),
        lease_expires_at=None,
        updated_at=Now(),
    )
    if held:
        arm_retries(config, [group_id], pause_end(config) or timezone.now())
    return bool(held)


def claim_limit(config: StreamConfig, batch_size: int) -> int:
    """The most rows a claim of the stream takes: its batch size, and with
    ``ROWS_PER_SECOND`` at most one second's rows (at least one row).

    A handler call then never carries more rows than the service accepts in a second;
    a group claimed larger (before the budget was set or lowered) still goes.
    """
    if config.rows_per_second is None:
        return batch_size
    return max(1, min(batch_size, math.floor(config.rows_per_second)))


def take_slot(config: StreamConfig, group_id: uuid.UUID | None = None) -> datetime | None:
    """Wait for the stream's next call slot; None once the call may start.

    The slot is weighted by the rows of group *group_id* under ``ROWS_PER_SECOND``.
    When the slot is further than ``WAIT_SECONDS`` away, reserve nothing and return when
    the stream may call next: the caller hands its group back (:func:`defer_group`).
    A pause moves the slots past its end; one that began while this worker waited for
    its slot is read once the wait is over, and its end returned the same way.
    Nothing to do for a stream without a budget.
    """
    if not config.budgeted:
        return None
    calls, rows = config.calls_per_second, config.rows_per_second
    interval = 1.0 / calls if calls is not None else 0.0
    per_row = 1.0 / rows if rows is not None else 0.0
    for _ in range(2):
        wait = budget_sql.reserve_call(
            config.name,
            interval,
            WAIT_SECONDS,
            group_id=group_id if rows is not None else None,
            seconds_per_row=per_row,
        )
        if wait is not None:
            if wait > 0:
                time.sleep(wait)  # at most WAIT_SECONDS: the stream's pace
                return pause_end(config)  # a pause that began meanwhile holds the call
            return None
        found = StreamState.objects.filter(stream=config.name).values_list(
            "next_call_at", flat=True
        )
        if not found:
            StreamState.objects.get_or_create(stream=config.name)
            continue  # the stream's first call: reserve on its new state row
        return found[0]
    return None  # pragma: no cover - the row was created just before


def defer_group(
    config: StreamConfig, group_id: uuid.UUID, attempt: int, until: Any, error: str = ""
) -> None:
    """Hand a running group back to the queue, due at *until*, its attempt unchanged.

    Inside the caller's transaction; raises
    :class:`~django_outbox.exceptions.LeaseLost` when the attempt is no longer this
    worker's. A retry is handed over for *until* (:func:`arm_retries`).
    """
    changes: dict[str, Any] = {
        "state": GroupState.RETRYING,
        "attempt": attempt - 1,  # taking the group again counts this attempt once more
        "next_attempt_at": until,
        "lease_expires_at": None,
        "updated_at": Now(),
    }
    if error:
        changes["last_error"] = clip(error)
    leases = group_leases(config)
    if not leases.fenced(group_id, attempt).update(**changes):
        raise leases.lost(group_id, attempt)
    arm_retries(config, [group_id], until)


def pause(config: StreamConfig, group_id: uuid.UUID, attempt: int, exc: RetryAfter) -> None:
    """A handler raised :class:`RetryAfter`: pause the stream, hand its group back.

    One transaction: the stream's ``paused_until`` and ``next_call_at`` move to the
    pause's end (never earlier than a pause already set), the group goes back to the
    queue due then, with its attempt unchanged, and so do the stream's queued groups;
    groups waiting for a retry wait at least as long.
    """
    stream = config.name
    alias = connection_for(StreamState).alias
    with transaction.atomic(using=alias):
        until = database_now(alias) + timedelta(seconds=exc.seconds)
        StreamState.objects.get_or_create(stream=stream)
        StreamState.objects.filter(stream=stream).update(
            paused_until=Greatest(Coalesce("paused_until", until), until),
            next_call_at=Greatest(Coalesce("next_call_at", until), until),
            updated_at=Now(),
        )
        defer_group(config, group_id, attempt, until, f"RetryAfter: {exc}")
        groups = OutboxGroup.objects.filter(stream=stream)
        queued = list(groups.filter(state=GroupState.CLAIMED).values_list("id", flat=True))
        groups.filter(id__in=queued, state=GroupState.CLAIMED).update(
            state=GroupState.RETRYING, next_attempt_at=until, lease_expires_at=None
        )
        arm_retries(config, queued, until)
        groups.filter(state=GroupState.RETRYING, next_attempt_at__lt=until).update(
            next_attempt_at=until
        )


def defer(config: StreamConfig, group_id: uuid.UUID, attempt: int, until: datetime) -> None:
    """The stream is ahead of its budget: hand the group back, due at its next slot."""
    with transaction.atomic(using=connection_for(OutboxGroup).alias):
        defer_group(config, group_id, attempt, until)
