"""The claim floor: claims start above the rows known to be claimed, never below.

On PostgreSQL a claimed row leaves its old version's entry in the buffer's partial
index of unclaimed rows, and a deleted row leaves its entry too, until vacuum removes
them; while any snapshot is held (a long report, an idle transaction, a replication
slot) vacuum can remove none, and no claim can mark them dead. A claim that walks the
index from its oldest end steps over every one of them: its cost grows with the rows
moved since the snapshot was taken. So each stream keeps a *claim floor* in its state
row, and a claim reads only ids above it: it steps over the dead entries of the last
few seconds, however long the snapshot is held.

Why the floor never passes a row that still has to be claimed. Nothing sets a buffer
row's ``group_id`` back to NULL, so an unclaimed row at or below an id *hi* that a
claim took can appear later only from (a) a transaction that writes it after that claim
(its id taken before, from the sequence: rows commit out of id order; or later, below
*hi*: a sequence with a ``CACHE``, an explicit id, a restarted identity; ``COPY``, which
takes ids as rows arrive and a transaction id only when it flushes them), or (b) a
claim that had the row locked, so ours skipped it, and then rolled back. The floor does
not rely on the order of ids. It moves to *hi* in three steps, in the run loop, each a
statement of its own at most every :data:`ADVANCE_SECONDS` per process and stream:

1. *Publish*: the state row's ``floor_pending`` becomes *hi*, and commits.
2. *Barrier*: a later statement takes the transactions of the database that hold a
   transaction id at that moment, into ``floor_barrier``.
3. *Move*: under the stream's floor lock, taken exclusively without waiting (no move
   when a writer holds it), a statement whose snapshot sees every transaction of the
   barrier ended reads, MVCC in the same snapshot, the lowest unclaimed row between the
   floor and *hi*: a late commit, a rolled-back claim, or a row a claim in progress
   holds (it still reads as unclaimed). The floor moves to just below that row, or to
   *hi*, by compare-and-set on the row it read.

Every statement that inserts buffer rows, whatever wrote it (the ORM, ``publish()``,
raw SQL, ``COPY``, a publish trigger), runs the buffer's statement trigger after its
rows are written, so its transaction holds a transaction id by then. The trigger reads
the floor and the pending id: when its lowest row is above both (rows in id order:
the common case) nothing more. Otherwise it takes the stream's floor lock *shared*
(one lock per stream per transaction, however many statements) and reads the floor
again; a row at or below it is recorded as a *hole* (:class:`~django_outbox.models.
FloorHole`, committed with the rows), and a claim starts below the lowest hole. Why no
row is passed: a writer that held its transaction id when the barrier was taken is in
the barrier, and the move waits for it; one that took it later ran its trigger after
the pending id committed, saw it, and either holds the lock (no move until it ends:
then the move's snapshot sees its rows) or found the floor already moved (a hole). A
transaction that is not READ COMMITTED reads an old snapshot: its trigger records a
hole for every statement, reading nothing.

The move deletes the holes whose rows are all claimed. Where there were holes, it sets
the pending id to the highest id the caller claimed since, even below the floor: when
the caller claimed only rows below it (the identity was restarted, a sequence set
back), the next move lowers the floor to them, so the later rows are above it again
and write no hole.

An idle read-only transaction has no transaction id: it holds back vacuum but is in no
barrier, so the floor goes on advancing under it. A transaction of the same database
that has written and stays open (idle in transaction after an INSERT, say) is in every
barrier taken while it is open, and a writer at or below the pending id holds the lock
until it ends: the floor stays until it ends, and claims cost meanwhile what they cost
without a floor. Other databases' transactions do not count.

A buffer table without the trigger (a stream's own table before ``migrate`` put it
there) has no floor: its claims start at the index's oldest end, and
``outbox_status`` says so. Distribute (the schedule) still reads the lowest unclaimed
row of the stream with its backlog count and lowers the floor below it if the floor
passed it: a second line, which the trigger leaves nothing to do. A floor that is wrong
the other way (too low) only costs time. SQLite removes rows physically and keeps no
floor.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

from django.db import connections, transaction

from django_outbox.conf import StreamConfig, outbox_settings, stream_databases
from django_outbox.models.state import StreamState
from django_outbox.streams.sql import stream_buffer
from django_outbox.streams.sql.base import BufferOps
from django_outbox.streams.sql.claim_floor import (
    ClaimFloorSQL,
    FloorStep,
    functions_found,
    trigger_statements,
)

#: A process moves a stream's floor at most this often (two statements each time).
ADVANCE_SECONDS = 1.0
#: A process looks again this often whether a stream's buffer table carries the trigger.
TRIGGER_RECHECK_SECONDS = 60.0


@dataclass
class _Candidate:
    """This process's view of one stream's floor."""

    #: The highest id this process's claims took since it last published one.
    highest_id: int = 0
    advanced_at: float = -math.inf
    #: Whether the buffer table carries the trigger, and when that was read.
    triggered: bool = False
    triggered_at: float = -math.inf
    lock: threading.Lock = field(default_factory=threading.Lock)


_candidates: dict[str, _Candidate] = {}
_candidates_lock = threading.Lock()


def _candidate(stream: str) -> _Candidate:
    with _candidates_lock:
        return _candidates.setdefault(stream, _Candidate())


def floor_sql(config: StreamConfig, ops: BufferOps | None = None) -> ClaimFloorSQL | None:
    """The floor statements of the stream, or None where it keeps no floor: its database
    keeps none (SQLite), or its buffer table lacks the trigger (:func:`off_reason`)."""
    ops = ops or stream_buffer(config)
    if not ops.keeps_claim_floor:
        return None
    sql = ClaimFloorSQL(ops, config.name)
    candidate = _candidate(config.name)
    now = time.monotonic()
    if now - candidate.triggered_at >= TRIGGER_RECHECK_SECONDS:
        triggered = sql.trigger_found()
        with candidate.lock:
            candidate.triggered, candidate.triggered_at = triggered, now
    return sql if candidate.triggered else None


def off_reason(config: StreamConfig) -> str:
    """Why the stream keeps no floor on a database that keeps one, or "" (on, or SQLite)."""
    ops = stream_buffer(config)
    if not ops.keeps_claim_floor or floor_sql(config, ops) is not None:
        return ""
    return (
        f"the buffer table {ops.model._meta.db_table} has no claim floor trigger: claims "
        "start at the oldest index entry (slower under a held snapshot); run migrate"
    )


def claim_start(config: StreamConfig, state: StreamState | None, ops: BufferOps) -> int:
    """The floor a claim of the stream over *ops* starts above: the state row's, or 0
    where the stream keeps none (the claim reads the holes itself)."""
    if state is None or state.claim_floor <= 0 or floor_sql(config, ops) is None:
        return 0
    return state.claim_floor


def claimed(stream: str, highest_id: int | None) -> None:
    """Note that a claim of this process took rows up to *highest_id*."""
    if highest_id is None:
        return
    candidate = _candidate(stream)
    with candidate.lock:
        candidate.highest_id = max(candidate.highest_id, highest_id)


def advance(config: StreamConfig, state: StreamState, *, force: bool = False) -> FloorStep | None:
    """Take one step of the stream's floor, as far as is safe; return where it is now.

    *state* is the state row this process last read: no statement when it shows nothing
    pending and this process claimed nothing since it last published. At most one
    transaction (two statements), and none when the last advance of this process was
    less than :data:`ADVANCE_SECONDS` ago (unless *force*). Returns None when nothing
    ran; else *state* holds the floor's columns as the step left them.
    """
    sql = floor_sql(config)
    if sql is None or sql.ops.connection.in_atomic_block:
        return None  # the statements need a transaction of their own
    candidate = _candidate(config.name)
    now = time.monotonic()
    with candidate.lock:
        if not force and now - candidate.advanced_at < ADVANCE_SECONDS:
            return None
        highest = candidate.highest_id
        idle = state.floor_barrier is None and state.floor_pending == state.claim_floor
        if highest <= 0 and idle:
            return None
        candidate.advanced_at = now
    with transaction.atomic(using=sql.ops.connection.alias):
        step = sql.advance(highest)
    if step is None:
        return None
    if step.published:
        with candidate.lock:
            if candidate.highest_id <= highest:
                candidate.highest_id = 0
    state.claim_floor, state.floor_pending = step.floor, step.pending
    state.floor_barrier = [] if step.barrier else None
    return step


def lower_if_passed(config: StreamConfig, lowest_id: int | None) -> int | None:
    """Second line: lower the floor below *lowest_id*, an unclaimed row, if it passed it.

    Returns the lowered floor, or None when nothing had to move.
    """
    ops = stream_buffer(config)
    if not ops.keeps_claim_floor or lowest_id is None:
        return None
    return ClaimFloorSQL(ops, config.name).lower(lowest_id)


def install_triggers(using: str) -> int:
    """Put the floor's trigger on the buffer tables of database *using*'s streams that
    lack it (after ``migrate``; the generic buffer's comes with its migration); return
    how many. PostgreSQL only, and only on tables that exist."""
    connection = connections[using]
    if not functions_found(connection):
        return 0  # not PostgreSQL, or django_outbox not migrated that far
    installed = 0
    with connection.cursor() as cursor:
        tables = set(connection.introspection.table_names(cursor))
    streams = outbox_settings().streams
    for name in stream_databases().get(using, []):
        config = streams[name]
        if config.is_generic:
            continue
        table = config.model_class._meta.db_table
        ops = stream_buffer(config)
        if table not in tables or ClaimFloorSQL(ops, name).trigger_found():
            continue
        with transaction.atomic(using=using), connection.cursor() as cursor:
            for statement in trigger_statements(connection, table, name):
                cursor.execute(statement)
        installed += 1
    with _candidates_lock:
        for candidate in _candidates.values():
            candidate.triggered_at = -math.inf  # look again
    return installed


def forget() -> None:
    """Forget this process's candidates (tests; a new process starts with none)."""
    with _candidates_lock:
        _candidates.clear()
