"""The run loop: how work on a stream starts, continues and ends. One protocol, here.

A *run* is one django-q2 job that processes a group, claims the stream's next group in
the same worker, processes it, and goes on while rows are waiting:

* **Start.** Every documented way to write buffer rows *wakes* the stream when its
  transaction commits (:func:`wake`): ``publish()``/``publish_many()``, ``create()``,
  ``save()`` and ``bulk_create()`` of a buffer model, replayed dead letters. A wake
  with no run in flight claims a group and enqueues a run for it, in one transaction
  (with the ORM broker the job commits with the claim: exactly-once hand-off).
  ``publish()`` on PostgreSQL needs no wake after its commit: its INSERT finds the run
  in flight that takes the row, or queues the stream's wake for a worker, committed
  with the row (:func:`run_woken`; :mod:`django_outbox.streams.sql.wake_guard`).
* **Continue.** After each group the run claims again while its last claim was full
  (more rows are probably waiting) or a commit *wanted* it (a wake that found a run in
  flight raises the stream's ``wanted`` flag instead of starting another run). A full
  claim also starts more runs, up to ``RUNS`` in flight, each with a *reservation*:
  a group row of no rows whose job claims its rows once a worker runs it, so the run
  that fans out pays a row insert per run, not a claim, and the claims happen in
  parallel where the rows are processed. After ``RUN_SECONDS`` a run hands its next
  group to a fresh job, so no worker is held for long (an ordered stream's, a
  reservation: a claimed group waiting for a worker would hold its keys).
* **End.** A run ends when its claim comes back short and nothing wanted it, deciding
  under the stream's state-row lock, which a wake takes too: either the run sees the
  wake's flag, or the wake sees no run in flight and starts one.

Runs in flight are counted by their groups (claimed or running under a live lease),
not by a counter: a run that dies leaves a group whose lease expires, and distribute
(the safety net on the schedule) rescues the group and restarts runs for any backlog.
A quiet stream costs nothing but its schedule.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any, TypeVar

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.functions import Now

from django_outbox.base.oncommit import on_commit_once, registered
from django_outbox.base.routing import connection_for
from django_outbox.base.transient import outlast_outage, retry_transient
from django_outbox.conf import (
    StreamConfig,
    get_stream,
    on_stream_database,
    outbox_settings,
    stream_databases,
)
from django_outbox.exceptions import LeaseLost
from django_outbox.lease.engine import worker_identity
from django_outbox.models.buffer import BufferEvent, OutboxEvent
from django_outbox.models.groups import GroupState, OutboxGroup
from django_outbox.models.state import StreamState
from django_outbox.streams import claim_floor
from django_outbox.streams.attempt import AttemptOutcome, process_group, run_attempt
from django_outbox.streams.budget import admits, claim_limit
from django_outbox.streams.groups import group_leases, queued_lease
from django_outbox.streams.rescue import requeue_due_groups
from django_outbox.streams.sql import stream_buffer
from django_outbox.streams.sql.base import Claimed
from django_outbox.streams.sql.run import (
    ask_wake_guard,
    publishers_done,
    raise_wake_epoch,
    runs_in_flight,
    wake_state,
)
from django_outbox.streams.sql.wake_guard import (
    LONG_TRANSACTION_SECONDS,
    PUBLISHERS_WAIT_SECONDS,
    QUEUED,
    SKIP,
    guarded,
    relied_on_recently,
)
from django_outbox.transport import handoff

__all__ = [
    "run_woken",
    "wait_for_publishers",
    "wake",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: A run hands its next group to a fresh job after this many seconds.
RUN_SECONDS = 5.0
#: While its claims come back full, a run re-reads the stream's state (pause, batch-size
#: override) and checks whether more runs may start at most this often.
RECHECK_SECONDS = 1.0


@dataclass(frozen=True)
class ClaimResult:
    stream: str
    group_id: uuid.UUID | None
    size: int
    limit: int
    highest_id: int | None = None

    @property
    def claimed_any(self) -> bool:
        return self.size > 0

    @property
    def full(self) -> bool:
        """Whether the claim filled its batch, so more rows are probably waiting."""
        return self.size >= self.limit > 0


# -- runtime state ------------------------------------------------------------------


@on_stream_database
def runtime_state(stream: str) -> StreamState:
    """Return the stream's state row, creating it on first use."""
    state, _ = StreamState.objects.get_or_create(stream=stream)
    return state


def create_state_rows(using: str | None = None, **kwargs: object) -> None:
    """Write a state row for every stream of database *using* that has none (after
    ``migrate``): a stream's state lives on its database."""
    manager = StreamState.objects.db_manager(using)
    streams = stream_databases().get(manager.db, [])
    manager.bulk_create([StreamState(stream=name) for name in streams], ignore_conflicts=True)


def effective_batch_size(config: StreamConfig, state: StreamState | None) -> int:
    """The stream's batch size: the operator's override when set, else ``BATCH_SIZE``;
    under a ``ROWS_PER_SECOND`` budget at most one second's rows (:func:`claim_limit`)."""
    if state is not None and state.batch_size_override:
        return claim_limit(config, state.batch_size_override)
    return claim_limit(config, config.batch_size)


# -- claim --------------------------------------------------------------------------


@on_stream_database
def claim_group(
    stream: str,
    *,
    run_here: bool = False,
    state: StreamState | None = None,
    reservation: tuple[uuid.UUID, int] | None = None,
) -> ClaimResult:
    """Claim up to the stream's batch size of unclaimed rows, oldest first, as one group.

    One transaction: the claim statement (``FOR UPDATE SKIP LOCKED`` on PostgreSQL) and
    the group row. With *run_here* the group starts running at attempt 1, leased to
    this worker, which processes it next (:func:`django_outbox.streams.attempt.run_attempt`);
    otherwise it is queued and a run job for it is enqueued in the same transaction.
    A paused stream claims nothing, nor one a handler paused or ahead of its rate
    budget (:func:`django_outbox.streams.budget.admits`). *state* saves reading the state row
    again; its claim floor (:mod:`django_outbox.streams.claim_floor`) is where the claim starts.

    With *reservation* (a reservation's id, and the attempt its run leased: see
    :func:`start_runs`) the rows are claimed into that group, which this worker runs
    next; it is deleted instead when no row waits or the stream may not claim now, and
    nothing is claimed when its lease was lost meanwhile.
    """
    config = get_stream(stream)
    if state is None:
        state = StreamState.objects.filter(stream=stream).first()
    paused = state is not None and state.paused
    # A handler's pause, the budget:
    if paused or not admits(config, state, calls_next=run_here or reservation is not None):
        if reservation is not None:
            _drop_reservation(config, *reservation)
        return ClaimResult(stream, None, 0, 0)
    limit = effective_batch_size(config, state)
    group_id = reservation[0] if reservation is not None else uuid.uuid4()
    ops = stream_buffer(config)
    floor = claim_floor.claim_start(config, state, ops)
    alias = connection_for(config.model_class).alias
    lease = Now() + timedelta(seconds=config.lease_seconds)
    queued = Now() + queued_lease(config)

    def claim_transaction() -> Claimed:
        with transaction.atomic(using=alias):
            claimed = ops.claim(group_id, limit, floor)
            size = claimed.size
            if reservation is not None:
                fenced = group_leases(config).fenced(*reservation)
                if not (fenced.update(size=size) if size else fenced.delete()[0]):
                    raise LeaseLost(group_id, reservation[1], what="reservation")
            elif size and run_here:
                OutboxGroup.objects.create(
                    id=group_id,
                    stream=stream,
                    size=size,
                    state=GroupState.RUNNING,
                    attempt=1,
                    worker=worker_identity(),
                    lease_expires_at=lease,
                )
            elif size:
                OutboxGroup.objects.create(
                    id=group_id,
                    stream=stream,
                    size=size,
                    state=GroupState.CLAIMED,
                    lease_expires_at=queued,
                )
                handoff.enqueue(handoff.RUN, [(stream, str(group_id))], cluster=config.cluster)
        return claimed

    try:
        size, highest_id = outlast_outage(
            claim_transaction,
            alias,
            what=f"claim of stream {stream}",
            wait_seconds=config.outage_seconds,
        )
    except LeaseLost:  # the reservation's lease expired and was taken over: rolled back
        return ClaimResult(stream, None, 0, limit)
    return ClaimResult(stream, group_id if size else None, size, limit, highest_id)


def _drop_reservation(config: StreamConfig, group_id: uuid.UUID, attempt: int) -> None:
    """Delete a reservation whose run may not claim (paused, the budget): nothing ran."""
    alias = connection_for(OutboxGroup).alias
    retry_transient(
        lambda: group_leases(config).fenced(group_id, attempt).delete(),
        alias,
        what=f"drop of reservation {group_id}",
    )


# -- start --------------------------------------------------------------------------


@on_stream_database
def start_runs(
    stream: str,
    runs: int = 1,
    *,
    only_if_idle: bool = False,
    announce: bool = True,
    reserve: bool = False,
) -> int:
    """Start up to *runs* runs of *stream*, keeping at most ``RUNS`` in flight.

    Under the stream's state-row lock: count the runs in flight, then claim a group and
    enqueue a run for it while there is room and rows to claim. With *reserve* (a full
    claim's fan-out, distribute, a resume) each run gets a reservation instead: a
    queued group of no rows, which counts as a run in flight and whose job claims its
    rows when it runs (:func:`django_outbox.streams.attempt.process_group`). A paused stream
    (by an operator, or by a handler's pause until it ends) starts nothing. When a run in
    flight stands in the way (none may start, or *only_if_idle* and one is in flight),
    raise the stream's ``wanted`` flag (unless not *announce*): that run claims again
    before it ends. Returns the number of runs started.
    """
    config = get_stream(stream)
    alias = connection_for(StreamState).alias

    def locked() -> int:
        with transaction.atomic(using=alias):
            state, _ = StreamState.objects.select_for_update().get_or_create(stream=stream)
            if state.paused or not admits(config, state, calls_next=True):
                return 0  # paused: by an operator, or a handler's pause not yet over
            in_flight = runs_in_flight(stream)
            room = 0 if only_if_idle and in_flight else max(config.runs - in_flight, 0)
            if room and not handoff.in_transaction_hand_off(alias):
                # A broker that can lose jobs: queued groups whose job did not start
                # within HANDOFF_SECONDS are no longer in flight; hand them over again.
                requeue_due_groups(config, lost_only=True)
            started = 0
            drained = False
            if reserve:
                started = _reserve_runs(config, min(runs, room))
            while not reserve and started < min(runs, room):
                if not claim_group(stream, state=state).claimed_any:
                    drained = True
                    break
                started += 1
            if announce and in_flight and started < runs and not drained and not state.wanted:
                StreamState.objects.filter(stream=stream).update(wanted=True)
            return started

    return retry_transient(locked, alias, what=f"start of a run of stream {stream}")


def _reserve_runs(config: StreamConfig, count: int) -> int:
    """Enqueue *count* runs of the stream, each with a reservation: a queued group of no
    rows (one INSERT for them all in the caller's transaction, their jobs with it where
    the broker allows). Returns *count*."""
    if count <= 0:
        return 0
    reservations = OutboxGroup.objects.bulk_create(
        OutboxGroup(
            stream=config.name,
            size=0,
            state=GroupState.CLAIMED,
            lease_expires_at=Now() + queued_lease(config),
        )
        for _ in range(count)
    )
    handoff.enqueue(
        handoff.RUN,
        [(config.name, str(reservation.id)) for reservation in reservations],
        cluster=config.cluster,
    )
    return count


@on_stream_database
def wake_now(stream: str) -> bool:
    """Make sure a run of *stream* will claim the rows committed so far.

    One read decides in the common cases: a paused stream, or a run in flight that is
    already wanted again, need nothing more. Otherwise :func:`start_runs` starts a run
    if none is in flight, or raises ``wanted`` for the one in flight. Returns whether
    a run was started.
    """
    found = wake_state(stream)
    if found is not None:
        paused, wanted, busy = found
        if paused or (busy and wanted):
            return False
    return start_runs(stream, 1, only_if_idle=True) > 0


def wake(stream: str, *, using: str | None = None, guarded_since: float | None = None) -> None:
    """Wake *stream* once the current transaction on *using* commits.

    ``publish()``, ``publish_many()`` and every ORM write of buffer rows call this; call
    it yourself after writing buffer rows another way (raw SQL, a ``PublishTrigger``).
    Within one transaction the stream is woken once, whatever the number of calls; a
    rolled-back transaction wakes nothing; outside a transaction it wakes at once.

    *guarded_since* (``publish()`` on PostgreSQL) says that the row's INSERT found a run
    in flight and took the wake guard's lock at that ``time.monotonic()``: the run waits
    for this commit before it ends, so the commit needs no wake, unless every row of
    the transaction was guarded and the transaction outlasted
    :data:`~django_outbox.streams.sql.wake_guard.LONG_TRANSACTION_SECONDS`
    (:mod:`django_outbox.streams.sql.wake_guard`).
    """
    alias = using or get_stream(stream).alias
    on_commit_once(
        _wake_key(stream),
        partial(_wake_after_commit, stream),
        using=alias,
        item=guarded_since,
    )


def guard_asked(stream: str, connection: BaseDatabaseWrapper) -> bool:
    """Whether the current transaction on *connection* asked the wake guard for (or
    woke) *stream* already: its answer covers the transaction's later writes of the
    stream, which then ask nothing (:mod:`django_outbox.streams.sql.wake_guard`).

    The record is the commit's wake, which a savepoint rolled back drops with the
    statement's lock or queued wake (False outside a transaction)."""
    return connection.in_atomic_block and registered(_wake_key(stream), using=connection.alias)


def _wake_key(stream: str) -> tuple[str, str]:
    return ("django_outbox.wake", stream)


def wake_job(config: StreamConfig) -> handoff.Job:
    """The stream's wake, for a statement to queue when no run is in flight."""
    return handoff.Job(
        handoff.WAKE,
        (config.name,),
        config.cluster,
        options={"task_name": f"django_outbox wake {config.name}"},
    )


def wake_guarded(
    config: StreamConfig, using: str, ask: Callable[[tuple[str, str] | None], tuple[T, int]]
) -> T:
    """Wake the stream by the wake guard's answer to a statement on *using*; return what
    the statement returned beside it.

    *ask* runs the statement that asks the guard (``publish()``'s INSERT, or a statement
    of its own after ORM writes), offered the stream's wake to queue (a cluster key and
    a signed package, or None where jobs are not queued in the transaction); it returns
    its result and the answer (:mod:`django_outbox.streams.sql.wake_guard`). The
    commit's wake is then covered for good by the wake the statement queued, covered
    by a run (or a queued wake) in flight since the statement, or not. The caller asks
    once per transaction and stream (:func:`guard_asked`).
    """
    started = time.monotonic()
    result, answer = ask(handoff.queue_row(wake_job(config), using))
    since = started if answer == SKIP else QUEUED if answer > 0 else None
    wake(config.name, using=using, guarded_since=since)
    return result


def _wake_after_commit(stream: str, guarded_since: list[float | None]) -> bool:
    """The commit's wake: none when a run in flight waits for every row it wrote (the
    common case on PostgreSQL, decided without reading the stream's configuration)."""
    if relied_on_recently(guarded_since, LONG_TRANSACTION_SECONDS):
        return False
    return wake_now(stream)


# -- run ----------------------------------------------------------------------------


class _Run:
    """One run's loop; keeps the stream's state row for up to ``RECHECK_SECONDS``."""

    def __init__(
        self,
        config: StreamConfig,
        budget: float,
        first: tuple[ClaimResult, StreamState] | None = None,
    ) -> None:
        self.config = config
        self.first = first  # a claim made before the loop, and the state it read
        self.stream = config.name
        self.deadline = time.monotonic() + budget
        self.state: StreamState | None = None
        self.state_read_at = -math.inf
        self.fanned_out_at = -math.inf

    def next_group(self, *, full: bool) -> ClaimResult | None:
        """Claim this run's next group, or return None when the run ends here."""
        now = time.monotonic()
        if self.first is not None:
            (claim, first_state), self.first = self.first, None
            self.state, self.state_read_at = first_state, now
            return self._took(claim, first_state, now)
        state: StreamState | None
        if full and self.state is not None and now - self.state_read_at < RECHECK_SECONDS:
            state = self.state
        elif full:
            state = self._read_state()
        else:
            state = self._decide_to_continue()
            if state is None:
                return self._last_claim()
        if state.paused:
            # The run ends, unless the stream was resumed before its last claim: then
            # that claim's group is this run's to process.
            return self._last_claim()
        if now >= self.deadline:
            try:
                if self._hand_off(state):
                    return None  # handed to a fresh job
                return self._last_claim()
            except Exception:
                # The broker refused the job (Redis restarting, say): this run goes on
                # itself; a group queued for the lost job is handed over again later.
                logger.warning("Could not hand the run of %s over; it goes on", self.stream)
                self.deadline = now + RUN_SECONDS
        return self._took(claim_group(self.stream, run_here=True, state=state), state, now)

    def _took(self, claim: ClaimResult, state: StreamState, now: float) -> ClaimResult | None:
        """After this run's claim: the floor's step, then more runs after a full claim,
        or the run's end after an empty one."""
        self._advance_floor(claim, state)
        if not claim.claimed_any:
            return self._last_claim()
        self._fan_out(claim, now)
        return claim

    def _hand_off(self, state: StreamState) -> bool:
        """Hand the run's next group to a fresh job (past ``RUN_SECONDS``); whether one
        was started.

        An ordered stream's fresh job gets a reservation and claims its rows when a
        worker runs it: a group claimed now would hold its keys while its job waits for
        a worker, and the runs meanwhile, finding those keys in flight, would claim
        short groups of the few keys left (issue 39).
        """
        if self.config.ordered:
            return start_runs(self.stream, 1, announce=False, reserve=True) > 0
        return claim_group(self.stream, state=state).claimed_any

    def fill(self, group_id: uuid.UUID, attempt: int) -> bool:
        """Claim the rows of a reservation this run leased (attempt *attempt*) into it;
        False when it was dropped instead (no row waits, paused, the budget).

        A reserved run is one of a fan-out (or of distribute) that started the runs the
        backlog called for: it fans out again only after ``RECHECK_SECONDS``, so its
        start costs no look at the runs in flight.
        """
        state = self._read_state()
        self.fanned_out_at = time.monotonic()
        claim = claim_group(
            self.stream, run_here=True, state=state, reservation=(group_id, attempt)
        )
        self._advance_floor(claim, state)
        return claim.claimed_any

    def _fan_out(self, claim: ClaimResult, now: float) -> None:
        """After a full claim, start more runs (reservations), up to ``RUNS`` in flight,
        at most once per ``RECHECK_SECONDS``."""
        if not claim.full or now - self.fanned_out_at < RECHECK_SECONDS:
            return
        self.fanned_out_at = now
        try:
            start_runs(self.stream, self.config.runs - 1, announce=False, reserve=True)
        except Exception:
            # More runs only help (the broker may be down): this run holds its claimed
            # group and goes on.
            logger.warning("Could not start more runs of %s", self.stream, exc_info=True)

    def _last_claim(self) -> ClaimResult | None:
        """The run is ending: wait for the publishers that relied on it, claim once more.

        ``publish()`` and the ORM's writes of buffer rows on PostgreSQL skip their wake
        while a run is in flight (:mod:`django_outbox.streams.sql.wake_guard`).
        Raising the epoch makes later publishers wake the stream themselves; the ones
        that skipped under the old epoch are waited for (at most
        ``PUBLISHERS_WAIT_SECONDS``), and one more claim takes what they committed.
        Returns that claim when it took rows (the run goes on).
        """
        epoch = self._outlasting(partial(raise_wake_epoch, self.stream), "a run's end")
        if epoch is None:
            return None
        wait_for_publishers(partial(publishers_done, self.stream, epoch), self.stream)
        state = self._read_state()
        if state.paused:
            return None
        claim = claim_group(self.stream, run_here=True, state=state)
        self._advance_floor(claim, state)
        return claim if claim.claimed_any else None

    def _outlasting(self, fn: Any, what: str) -> Any:
        """Run the step *fn* again once the database answers, if it went away meanwhile."""
        alias = connection_for(StreamState).alias
        return outlast_outage(
            fn,
            alias,
            what=f"{what} of stream {self.stream}",
            wait_seconds=self.config.outage_seconds,
        )

    def _advance_floor(self, claim: ClaimResult, state: StreamState) -> None:
        """Take a step of the stream's claim floor after this claim (at most once a
        second); *state* holds the floor as the step left it."""
        claim_floor.claimed(self.stream, claim.highest_id)
        self._outlasting(partial(claim_floor.advance, self.config, state), "a claim floor's move")

    def _read_state(self) -> StreamState:
        self.state = self._outlasting(partial(runtime_state, self.stream), "a run's state read")
        self.state_read_at = time.monotonic()
        return self.state

    def _decide_to_continue(self) -> StreamState | None:
        """After a short claim: lower ``wanted`` and go on, or end. Under the row lock.

        The flag is lowered in its own transaction, committed before the next claim
        starts: a wake that still read it raised has committed its rows before that
        claim's snapshot. A run that fanned out and ends drops, in the same transaction,
        the reservations no worker has taken.
        """
        alias = connection_for(StreamState).alias

        def decide() -> StreamState | None:
            with transaction.atomic(using=alias):
                state, _ = StreamState.objects.select_for_update().get_or_create(stream=self.stream)
                if state.paused or not state.wanted:
                    if self.fanned_out_at > -math.inf:
                        # The run ends: the reservations no worker has taken would find
                        # nothing. Dropped under the lock a wake takes (a wake after this
                        # sees no run in flight and starts one) and before the end's epoch
                        # raise (a publisher that relied on them is waited for).
                        _drop_unstarted_reservations(self.stream)
                    return None
                StreamState.objects.filter(stream=self.stream).update(wanted=False)
            return state

        state = self._outlasting(decide, "a run's decision to go on")
        if state is None:
            return None
        state.wanted = False
        self.state = state
        self.state_read_at = time.monotonic()
        return state


def wait_for_publishers(done: Callable[[], bool], name: str) -> bool:
    """Wait until *done()*: every publisher (or enqueue) that skipped its wake under the
    old epoch of the stream (or kind) *name* has ended.

    Polls the guard's lock without queueing on it (a queued exclusive request would
    hold up the publishers behind it), from 0.5 ms up to 50 ms apart, for at most
    ``PUBLISHERS_WAIT_SECONDS``; a publisher still open then wakes the stream after its
    own commit (its transaction is a long one). Returns whether they all ended.
    """
    deadline = time.monotonic() + PUBLISHERS_WAIT_SECONDS
    pause = 0.0005
    while not done():
        if time.monotonic() >= deadline:
            logger.info(
                "A transaction that wrote to %s is still open after %.0fs; it wakes the "
                "work itself when it commits",
                name,
                PUBLISHERS_WAIT_SECONDS,
            )
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    return True


@on_stream_database
def run_stream(
    stream: str,
    group_id: uuid.UUID | str | None = None,
    *,
    budget: float = RUN_SECONDS,
    first: tuple[ClaimResult, StreamState] | None = None,
) -> list[AttemptOutcome]:
    """Run the stream's loop: process *group_id* (if given), then claim and process on;
    *first*: the loop's first claim, made already (:func:`run_woken`).

    Returns the outcome of each group this job processed. A duplicate delivery of a job
    whose group is running elsewhere or done does nothing. A group handed back to the
    queue (a handler's pause, the stream's rate budget) ends the run.
    """
    config = get_stream(stream)
    loop = _Run(config, budget, first)
    outcomes: list[AttemptOutcome] = []
    if group_id is not None:
        outcome = process_group(stream, group_id, fill=loop.fill)
        if outcome is AttemptOutcome.SKIPPED:
            return []
        if outcome is not AttemptOutcome.EMPTY:  # an empty reservation: the loop ends it
            outcomes.append(outcome)
    full = True  # a queued group's size is not known here; a short claim ends the run
    while outcomes[-1:] != [AttemptOutcome.DEFERRED]:  # a pause or the budget ends the run
        claim = loop.next_group(full=full)
        if claim is None or claim.group_id is None:
            break
        outcomes.append(run_attempt(config, claim.group_id, 1))
        # An ordered stream's short claim may have left keys that this group blocked:
        # claim again, until a claim finds nothing (django_outbox.streams.ordering).
        full = claim.full or config.ordered
    return outcomes


@on_stream_database
def run_woken(stream: str) -> list[AttemptOutcome]:
    """Run *stream* in this worker: the wake a ``publish()`` queued in its own INSERT
    because no run was in flight (:mod:`django_outbox.streams.sql.wake_guard`).

    As :func:`wake_now` decides, under the stream's state-row lock: a paused stream (or
    one ahead of its rate budget) starts nothing; a run in flight meanwhile gets the
    stream's ``wanted`` flag and takes the rows; else this worker claims and runs the
    loop itself. Its run ends as every run does, waiting for the publishers that relied
    on it (or on this wake, while it waited untaken) and claiming once more; so an empty
    first claim, the rows' transaction not yet visible here, still ends that way.
    """
    config = get_stream(stream)
    alias = connection_for(StreamState).alias

    def decide() -> tuple[ClaimResult, StreamState] | None:
        with transaction.atomic(using=alias):
            state, _ = StreamState.objects.select_for_update().get_or_create(stream=stream)
            if state.paused or not admits(config, state, calls_next=True):
                return None
            if runs_in_flight(stream):
                if not state.wanted:
                    StreamState.objects.filter(stream=stream).update(wanted=True)
                return None
            return claim_group(stream, run_here=True, state=state), state

    first = retry_transient(decide, alias, what=f"wake of stream {stream}")
    return [] if first is None else run_stream(stream, first=first)


def _drop_unstarted_reservations(stream: str) -> int:
    """Delete the stream's reservations whose run has not started (queued, no rows)."""
    queued = OutboxGroup.objects.filter(stream=stream, state=GroupState.CLAIMED, size=0)
    return queued.delete()[0]


# -- wake on every ORM write of buffer rows ------------------------------------------


def _streams_of(model: type[Any], rows: Any, using: str) -> set[str]:
    if model is OutboxEvent:
        configured = outbox_settings().streams
        return {row.stream for row in rows if row.stream in configured}
    streams = outbox_settings().streams_by_model.get(model._meta.label_lower, ())
    if len(streams) > 1:  # one stream of the model on each database: the one written to
        return {name for name in streams if get_stream(name).alias == using}
    return set(streams)


def _wake_on_save(
    sender: type[Any], instance: Any, created: bool, using: str, **kwargs: Any
) -> None:
    if created and isinstance(instance, BufferEvent):
        for stream in _streams_of(sender, [instance], using):
            _wake_on_write(stream, using)


def _wake_on_bulk_create(sender: type[Any], objs: list[Any], using: str, **kwargs: Any) -> None:
    for stream in _streams_of(sender, objs, using):
        _wake_on_write(stream, using)


def _wake_on_write(stream: str, using: str) -> None:
    """The wake of buffer rows the ORM wrote on *using*.

    In a transaction on the stream's PostgreSQL database, the stream's first write asks
    the wake guard in a statement of its own, as ``publish()`` does in its INSERT: a run
    in flight takes the rows, or the statement queues the stream's wake (django-q2's
    ORM broker), so the commit needs no wake; the transaction's later writes add
    nothing (the first one's answer covers them all: a queued wake commits with them,
    and an ending run waits for the transaction's end). Otherwise (autocommit, SQLite,
    another database) the commit wakes the stream.
    """
    config = get_stream(stream)
    connection = connections[using]
    if not (connection.in_atomic_block and config.alias == using and guarded(connection)):
        wake(stream, using=using)
        return
    if guard_asked(stream, connection):
        return
    wake_guarded(config, using, lambda row: (None, ask_wake_guard(connection, stream, row)))
