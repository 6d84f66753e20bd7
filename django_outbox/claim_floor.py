"""The claim floor: claims start above the rows known to be claimed, never below.

On PostgreSQL a claimed row leaves its old version's entry in the buffer's partial
index of unclaimed rows, and a deleted row leaves its entry too, until vacuum removes
them; while any snapshot is held (a long report, an idle transaction, a replication
slot) vacuum can remove none, and no claim can mark them dead. A claim that walks the
index from its oldest end steps over every one of them: its cost grows with the rows
moved since the snapshot was taken. So each stream keeps a *claim floor* in its state
row, and a claim reads only ids above it (``AND id > floor``): it steps over the dead
entries of about the last second, however long the snapshot is held.

Why the floor never passes a row that still has to be claimed. Nothing sets a buffer
row's ``group_id`` back to NULL, so an unclaimed row at or below an id *hi* that a
claim took can appear later only from (a) a transaction that took its id from the
sequence before and commits after (ids are handed out before commit, so rows commit out
of id order), or (b) a claim that had the row locked, so ours skipped it, and then
rolled back. The floor moves to *hi* in two steps, in the run loop, at most every
:data:`ADVANCE_SECONDS` per process and stream:

1. After claims up to *hi*, a later statement takes a *barrier*: the transactions of
   the database that hold a transaction id at that moment. Every transaction that holds
   an id up to *hi* took it before that claim: it is among them, or has no transaction
   id yet (see the safety net).
2. A statement whose snapshot sees every transaction of the barrier ended reads, MVCC
   in the same snapshot, the lowest unclaimed row between the floor and *hi*: a late
   commit, a rolled-back claim, or a row a claim in progress holds (it still reads as
   unclaimed). The floor moves to just below that row, or to *hi*, by compare-and-set
   on the floor it read. The same statement takes the next barrier.

An idle read-only transaction has no transaction id: it holds back vacuum but is in no
barrier, so the floor goes on advancing under it. A transaction of the same database
that has written and stays open (idle in transaction after an INSERT, say) is in every
barrier taken while it is open: the floor stays until it ends, and claims cost meanwhile
what they cost without a floor. Other databases' transactions do not count.

The safety net. A backend preempted between taking its id and being given a
transaction id is invisible to the barrier. Distribute (the schedule) reads the lowest
unclaimed row of the stream with its backlog count, in the same statement, and lowers
the floor below it if the floor passed it: no row waits longer than one distribute
interval. A floor that is wrong the other way (too low) only costs time. SQLite removes
rows physically and keeps no floor.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

from django_outbox.conf import StreamConfig
from django_outbox.db import stream_buffer
from django_outbox.db.base import BufferOps
from django_outbox.db.claim_floor import ClaimFloorSQL

#: A process moves a stream's floor at most this often (one statement each time).
ADVANCE_SECONDS = 1.0


@dataclass
class _Candidate:
    """This process's view of one stream's floor."""

    #: The highest id this process's claims took.
    highest_id: int = 0
    #: A candidate floor waiting for its barrier: (highest id, barrier).
    pending: tuple[int, list[int]] | None = None
    advanced_at: float = -math.inf
    lock: threading.Lock = field(default_factory=threading.Lock)


_candidates: dict[str, _Candidate] = {}
_candidates_lock = threading.Lock()


def _candidate(stream: str) -> _Candidate:
    with _candidates_lock:
        return _candidates.setdefault(stream, _Candidate())


def floor_sql(config: StreamConfig, ops: BufferOps | None = None) -> ClaimFloorSQL | None:
    """The floor statements of the stream, or None where its database keeps no floor."""
    ops = ops or stream_buffer(config)
    return ClaimFloorSQL(ops, config.name) if ops.keeps_claim_floor else None


def claimed(stream: str, highest_id: int | None) -> None:
    """Note that a claim of this process took rows up to *highest_id*."""
    if highest_id is None:
        return
    candidate = _candidate(stream)
    with candidate.lock:
        candidate.highest_id = max(candidate.highest_id, highest_id)


def advance(config: StreamConfig, floor: int, *, force: bool = False) -> int | None:
    """Move the stream's floor as far as is safe; return the floor it is at now.

    *floor* is the floor this process last read. At most one statement, and none when
    the last advance of this process was less than :data:`ADVANCE_SECONDS` ago (unless
    *force*) or there is nothing to move. Returns None when no statement ran.
    """
    sql = floor_sql(config)
    if sql is None or sql.ops.connection.in_atomic_block:
        return None  # the statement needs a transaction of its own
    candidate = _candidate(config.name)
    now = time.monotonic()
    with candidate.lock:
        if not force and now - candidate.advanced_at < ADVANCE_SECONDS:
            return None
        pending, highest = candidate.pending, candidate.highest_id
        if pending is None and highest <= floor:
            return None
        candidate.advanced_at = now
    hi, barrier = pending if pending is not None else (None, None)
    step = sql.advance(hi, barrier)
    if step is None:
        return None
    with candidate.lock:
        if pending is None or step.passed:
            # The next candidate: the highest id claimed before this statement, behind
            # the barrier this statement took.
            candidate.pending = (highest, step.barrier) if highest > step.floor else None
    return step.floor


def lower_if_passed(config: StreamConfig, lowest_id: int | None) -> int | None:
    """Safety net: lower the floor below *lowest_id*, an unclaimed row, if it passed it.

    Returns the lowered floor, or None when nothing had to move.
    """
    sql = floor_sql(config)
    if sql is None or lowest_id is None:
        return None
    return sql.lower(lowest_id)


def forget() -> None:
    """Forget this process's candidates (tests; a new process starts with none)."""
    with _candidates_lock:
        _candidates.clear()
