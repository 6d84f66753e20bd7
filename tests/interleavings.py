"""A concurrency harness: the real SQL of the pipeline, in interleavings chosen by a seed.

Each *actor* (a publisher, a worker, the operator with distribute, rescue, pauses and the
clock, the floor's mover, a writer that re-keys ordered rows) is a thread with its own
Django connection, so its own PostgreSQL session. It runs the project's real functions,
and stops at a *gate* before each step: a seeded scheduler picks the next actor among
the ones waiting at a gate, lets it go, and waits until it is at its next gate, has
ended, or is blocked on a lock (``pg_stat_activity.wait_event_type = 'Lock'`` of its
backend: nothing is timed). Every actor that a step unblocked reaches its next gate
before the scheduler picks again, so a seed replays the same interleaving
(``OUTBOX_HARNESS_SEED``), up to the order in which PostgreSQL grants a lock that several
sessions wait for.

What one step is (atomic from the scheduler's view):

* a publisher's INSERT through one path (``publish()``, ``publish_many()``, an ORM
  ``create()``/``bulk_create()``, a raw INSERT with or without an explicit id, a COPY
  with or without ids; the raw paths call ``wake()`` as the docs ask), and its COMMIT or
  ROLLBACK (with the commit's wake, up to the wake's own gates);
* in the run loop and the jobs (gated where the code calls them, so whatever calls them
  is cut at the same places): the wake's read (``wake_now``), ``start_runs``'
  transaction (up to the claim inside it, itself a step), ``claim_group``'s transaction,
  the floor's move (``claim_floor.advance``) and the safety net's lowering, a run's
  decision to go on (``_decide_to_continue``, one transaction), the end's epoch raise
  and each look at the publishers it waits for (``raise_wake_epoch``,
  ``publishers_done``), a state read (``runtime_state``), taking a group's lease
  (``_take``), the handler call, the finalize, a failure's record (``fail_group``) and a
  handler's pause (``budget.pause``), each one transaction;
* rescue (``requeue_due_groups``, one transaction), distribute (its parts as above), a
  pause or resume (``set_paused``), the clock (every lease, retry and pause due now: the
  time a real deployment would wait, in one UPDATE), a re-key of a claimed ordered row.

Checked after every step, from an observer connection (and at each handler call, in
the handler): no buffer row claimed by a group that does not exist; no row handed to the
handler by two deliveries whose leases are both live; no row of an ordered key handed
over while an earlier row of that key (its key when written) is still in the buffer
outside the batch; no handler call starting while a handler's ``RetryAfter`` pause holds
the stream; no session holding more advisory locks than its bound (one wake-guard lock
per stream, one ordered-claim lock per stream). When every actor has ended and the jobs
are drained: no committed row that a claim may take left unclaimed (after the documented
recovery, a clock jump and distribute, when a worker crashed or a handler paused the
stream); then once more after one more claim round.

Time-based knobs are fixed so that nothing depends on the clock: no run waits a bounded
time for publishers, no commit counts as a long transaction, the floor moves on every
call, a run re-reads its state and fans out after every full claim; a worker hands its
run over to a fresh job (``RUN_SECONDS``) when its seeded dice say so.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import random
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from django.db import IntegrityError, connection, connections, transaction
from django.test import override_settings
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from django_outbox import BatchResult, RetryAfter, publish, publish_many
from django_outbox.conf import get_stream
from django_outbox.models import (
    ArchivedEvent,
    GroupState,
    HeldKey,
    OutboxEvent,
    OutboxGroup,
    StreamState,
)
from django_outbox.streams import attempt, budget, claim_floor, distribute, rescue, run, steer
from django_outbox.streams.batch import Batch
from django_outbox.streams.run import wake
from django_outbox.streams.sql import wake_guard
from django_outbox.transport import handoff
from tests.settings import DJANGO_OUTBOX
from tests.testapp.models import OrderedEvent

GENERIC = "hx"
ORDERED = "hx_ordered"
STREAMS = (GENERIC, ORDERED)
GENERIC_TABLE = OutboxEvent._meta.db_table
ORDERED_TABLE = OrderedEvent._meta.db_table

#: How many lines of the step trace a failure shows.
TRACE_LINES = int(os.environ.get("OUTBOX_HARNESS_TRACE_LINES", "150"))

_COMMON = {
    "HANDLER": "tests.interleavings.handler",
    "BATCH_SIZE": 3,
    "RUNS": 2,
    "MAX_ATTEMPTS": 3,
    # Nothing comes due by itself: the clock step makes retries and leases due.
    "BACKOFF_SECONDS": 3600,
    "BACKOFF_MAX_SECONDS": 3600,
    "LEASE_SECONDS": 3600,
    "AUTO_HEARTBEAT": False,  # no heartbeat thread: every session is an actor's
}
STREAM_SETTINGS = {
    GENERIC: _COMMON,
    ORDERED: {**_COMMON, "MODEL": "testapp.OrderedEvent", "ORDER_KEY": "aggregate_id"},
}

#: The ways a publisher writes rows of the generic stream.
SEQUENCE_PATHS = ("publish", "publish_many", "orm_create", "orm_bulk_create", "raw_insert", "copy")
EXPLICIT_ID_PATHS = ("raw_insert_explicit_id", "copy_explicit_id")
ORDERED_PATHS = ("orm_create", "orm_bulk_create", "raw_insert")


# -- what a run found ----------------------------------------------------------------


class Violation(AssertionError):
    """An invariant broken; the subclass says which."""


class RowsStranded(Violation):
    """Committed rows a claim may take are left unclaimed on a quiet stream."""


class DeliveredTwice(Violation):
    """A row handed to the handler by two deliveries whose leases were both live."""


class KeyOvertaken(Violation):
    """A row of an ordered key handed over before an earlier row of its key."""


class CalledWhilePaused(Violation):
    """A handler call started while a handler's RetryAfter pause held the stream."""


class TooManyLocks(Violation):
    """A session held more advisory locks than its bound."""


class OrphanClaim(Violation):
    """A buffer row claimed by a group that does not exist."""


class ActorFailed(Violation):
    """An actor raised, or the interleaving could not go on."""


class WorkerCrash(BaseException):
    """A worker dies in its handler (not an Exception: nothing catches it)."""


class _Stop(BaseException):
    """The scenario is over: an actor parked at a gate unwinds."""


class _Rollback(Exception):
    pass


# -- profiles --------------------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    """What a scenario may do: its actors, the publishers' paths, the handler's dice."""

    name: str
    generic_publishers: int = 2
    ordered_publishers: int = 1
    workers: int = 2
    transactions: int = 3  # per publisher
    paths: tuple[str, ...] = SEQUENCE_PATHS
    #: Whether one transaction may call publish() more than once.
    publishes_per_transaction: int = 1
    sequence_cache: int = 1
    operator_steps: int = 4
    floor_steps: int = 2
    rekeys: int = 0
    #: The handler's outcomes and their weights.
    modes: tuple[tuple[str, int], ...] = (("ok", 14), ("partial", 2), ("raise", 2))
    #: Jobs go through django-q2's queue table, as with the ORM broker in production (a
    #: worker takes a row, runs it, deletes it), instead of the harness's own queue; so
    #: ``publish()`` queues its stream's wake in its INSERT.
    queue_table: bool = False

    def mode(self, rng: random.Random) -> str:
        names, weights = zip(*self.modes, strict=True)
        return rng.choices(names, weights)[0]


CLEAN = Profile("clean", modes=(("ok", 14), ("partial", 2), ("raise", 2), ("crash", 1)))
#: Item 1: a transaction that publishes several rows while runs end.
WAKE_GUARD = replace(
    CLEAN,
    name="wake_guard",
    paths=("publish",),
    publishes_per_transaction=4,
    generic_publishers=3,
    ordered_publishers=0,
)
#: Item 2: rows that commit far out of id order.
FLOOR = replace(
    CLEAN,
    name="floor",
    paths=SEQUENCE_PATHS + EXPLICIT_ID_PATHS,
    modes=(("ok", 1),),
    operator_steps=0,  # distribute's safety net would lower the floor
)
FLOOR_CACHE = replace(FLOOR, name="floor_cache", paths=SEQUENCE_PATHS, sequence_cache=20)
#: Item 3: a handler's RetryAfter with another run in flight.
RETRY_AFTER = replace(
    CLEAN, name="retry_after", workers=3, transactions=4, modes=(("ok", 6), ("retry_after", 1))
)
#: Item 4: an ordered row re-keyed while claimed.
REKEY = replace(CLEAN, name="rekey", rekeys=3, generic_publishers=1, ordered_publishers=2)
EVERYTHING = replace(
    CLEAN,
    name="everything",
    paths=SEQUENCE_PATHS + EXPLICIT_ID_PATHS,
    publishes_per_transaction=4,
    rekeys=2,
    modes=(("ok", 14), ("partial", 2), ("raise", 2), ("crash", 1), ("retry_after", 1)),
)
#: Issue 39: wakes queued by publish()'s INSERT, relied on while untaken, taken by workers
#: while runs start and end.
QUEUED_WAKE = replace(
    CLEAN,
    name="queued_wake",
    paths=("publish", "publish", "orm_create", "raw_insert"),
    publishes_per_transaction=3,
    generic_publishers=3,
    queue_table=True,
)
PROFILES = {
    p.name: p
    for p in (CLEAN, WAKE_GUARD, FLOOR, FLOOR_CACHE, RETRY_AFTER, REKEY, EVERYTHING, QUEUED_WAKE)
}


# -- actors and the scheduler ------------------------------------------------------------

_local = threading.local()


def current_actor() -> Actor | None:
    return getattr(_local, "actor", None)


class Actor(threading.Thread):
    """One session: runs *program* in a thread of its own, stopping at each gate."""

    def __init__(self, harness: Harness, name: str, program: Callable[[Actor], None]) -> None:
        super().__init__(name=f"harness-{name}", daemon=True)
        self.harness = harness
        self.actor_name = name
        self.program = program
        self.rng = random.Random(f"{harness.seed}:{name}")
        self.state = "starting"  # parked, running, finished
        self.label = ""
        self.ready: Callable[[], bool] | None = None
        self.released = False
        self.pid: int | None = None

    def gate(self, label: str, ready: Callable[[], bool] | None = None) -> None:
        """Wait here until the scheduler picks this actor (and *ready()* holds)."""
        connection.ensure_connection()
        self.pid = connection.connection.info.backend_pid
        cond = self.harness.cond
        with cond:
            self.state, self.label, self.ready = "parked", label, ready
            cond.notify_all()
            while not self.released:
                if self.harness.stopping:
                    raise _Stop
                cond.wait()
            self.released = False

    def run(self) -> None:
        _local.actor = self
        if not self.harness.profile.queue_table:
            handoff._local.queue = _Broker(self.harness.jobs)
        try:
            self.program(self)
        except _Stop:
            pass
        except BaseException as exc:  # reported by the scheduler
            self.harness.fail(
                ActorFailed(
                    f"{self.actor_name} raised at '{self.label}': "
                    + "".join(traceback.format_exception(exc))
                )
            )
        finally:
            with contextlib.suppress(Exception):
                connections.close_all()
            with self.harness.cond:
                self.state = "finished"
                self.harness.cond.notify_all()


class _Broker:
    """django-q2's ORM broker, as this actor's transport sees it: a job enqueued inside a
    transaction joins the harness's queue when it commits, and never if it rolls back."""

    def __init__(self, jobs: deque) -> None:
        self.jobs = jobs

    def extend(self, jobs: Any) -> None:
        jobs = list(jobs)
        if connection.in_atomic_block:
            transaction.on_commit(lambda: self.jobs.extend(jobs))
        else:
            self.jobs.extend(jobs)


@dataclass
class Delivery:
    group_id: uuid.UUID
    attempt: int
    actor: str


@dataclass
class Harness:
    """One scenario: its actors, the shared job queue, what it saw."""

    seed: int
    profile: Profile
    max_steps: int = 4000
    cond: threading.Condition = field(default_factory=threading.Condition)
    jobs: deque = field(default_factory=deque)
    actors: list[Actor] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    stopping: bool = False
    taken: int = 0
    #: Ordered rows written (id -> key when written), of transactions not rolled back.
    keys: dict[int, str] = field(default_factory=dict)
    #: The deliveries under a live lease, by (stream, row id).
    live: dict[tuple[str, int], Delivery] = field(default_factory=dict)
    #: After the actors ended: no more crashes or pauses (the recovery is done).
    calm: bool = False
    crashed: bool = False
    paused_by_handler: bool = False
    low_ids: Iterator[int] | None = None
    counter: Iterator[int] = field(default_factory=itertools.count)

    # -- recording (from actor threads) --

    def fail(self, violation: Violation) -> None:
        with self.cond:
            self.violations.append(violation)

    def note(self, text: str) -> None:
        with self.cond:
            self.trace.append(f"      {text}")

    # -- the scheduler (the test's thread) --

    def add(self, name: str, program: Callable[[Actor], None]) -> None:
        self.actors.append(Actor(self, name, program))

    def start(self) -> None:
        for actor in self.actors:
            actor.state = "running"
            actor.start()
        self.settle()

    def candidates(self) -> list[Actor]:
        return [a for a in self.actors if a.state == "parked" and (a.ready is None or a.ready())]

    def queued(self) -> bool:
        """Whether a committed job waits in django-q2's queue table (``queue_table``)."""
        if not self.profile.queue_table:
            return False
        table = OrmQ._meta.db_table
        return bool(fetch(f"SELECT 1 FROM {table} WHERE lock <= clock_timestamp() LIMIT 1"))

    def step(self, number: int) -> bool:
        """Let one actor take its next step; False when none can."""
        with self.cond:
            found = self.candidates()
            if not found:
                return False
            actor = random.Random(f"{self.seed}/{number}").choice(found)
            self.trace.append(f"{number:4} {actor.actor_name}: {actor.label}")
            actor.released = True
            actor.state = "running"  # from now on: settle() waits for it
            self.cond.notify_all()
        self.settle()
        return True

    def settle(self, timeout: float = 60) -> None:
        """Wait until every actor is at a gate, has ended, or waits for a lock."""
        deadline = time.monotonic() + timeout
        while True:
            with self.cond:
                running = [a for a in self.actors if a.state in ("running", "starting")]
                if not running:
                    return
                self.cond.wait(0.002)
                running = [a for a in self.actors if a.state in ("running", "starting")]
                if not running:
                    return
            pids = {a.pid for a in running if a.pid is not None}
            everyone = {a.pid for a in self.actors if a.pid is not None and a.state != "finished"}
            if pids and len(pids) == len(running) and pids <= lock_waiters(everyone):
                with self.cond:  # none of them moved meanwhile
                    if all(a.state == "running" for a in running):
                        return
            if time.monotonic() > deadline:
                raise ActorFailed(
                    "the interleaving is stuck: "
                    + ", ".join(f"{a.actor_name} at '{a.label}'" for a in running)
                )

    def run(self) -> None:
        """Run the scenario to its end; raise the first violation, with seed and trace."""
        try:
            self.start()
            self.steps()
            self.calm = True
            if self.crashed or self.paused_by_handler:
                self.add("recovery", recovery_program)
                self.actors[-1].state = "running"
                self.actors[-1].start()
                self.settle()
                self.steps()
            self.expect_claimed("once every actor ended and the jobs ran")
            for stream in STREAMS:  # one more claim round
                self.jobs.append(handoff.Job(handoff.RUN, (stream, None)))
            self.steps()
            self.expect_claimed("after one more claim round")
        except Violation as exc:
            report = self.report(exc)
            if os.environ.get("OUTBOX_HARNESS_TRACE_DIR"):
                name = f"{self.profile.name}-{self.seed}.txt"
                with open(os.path.join(os.environ["OUTBOX_HARNESS_TRACE_DIR"], name), "w") as out:
                    out.write(report + "\n\nFull trace:\n" + "\n".join(self.trace))
            raise type(exc)(report) from None
        finally:
            self.stop()

    def steps(self) -> None:
        """Take steps until no actor can; check the invariants after each."""
        self.check()
        for _ in range(self.max_steps):
            if not self.step(self.taken):
                self.check()
                return
            self.taken += 1
            self.check()
        raise ActorFailed(f"no end after {self.max_steps} steps")

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        for actor in self.actors:
            actor.join(30)

    def check(self) -> None:
        with self.cond:
            if self.violations:
                raise self.violations[0]
        pids = {a.pid: a for a in self.actors if a.pid is not None and a.state != "finished"}
        for table in (GENERIC_TABLE, ORDERED_TABLE):
            orphans = fetch(
                f"SELECT id, group_id FROM {table} b WHERE group_id IS NOT NULL AND NOT EXISTS "
                f"(SELECT 1 FROM {OutboxGroup._meta.db_table} g WHERE g.id = b.group_id) "
                "ORDER BY id LIMIT 5"
            )
            if orphans:
                raise OrphanClaim(f"rows claimed by groups that do not exist: {orphans}")
        if pids:
            self.check_locks(pids)

    def check_locks(self, pids: dict[int, Actor]) -> None:
        wake_classes = {
            row[0]: row[1]
            for row in fetch(
                "SELECT hashtext('django_outbox.wake:' || s)::bigint & 4294967295, s "
                "FROM unnest(%s::text[]) s",
                [list(STREAMS)],
            )
        }
        held = fetch(
            "SELECT pid, classid::bigint, count(*) FROM pg_locks WHERE locktype = 'advisory' "
            "AND granted AND pid = ANY(%s) GROUP BY pid, classid",
            [list(pids)],
        )
        total: dict[int, int] = {}
        for pid, classid, count in held:
            total[pid] = total.get(pid, 0) + count
            if classid in wake_classes and count > 1:
                raise TooManyLocks(
                    f"{pids[pid].actor_name} (at '{pids[pid].label}') holds {count} wake-guard "
                    f"locks of stream {wake_classes[classid]} (bound: 1 per stream)"
                )
        for pid, count in total.items():
            if count > 2 * len(STREAMS):
                raise TooManyLocks(f"{pids[pid].actor_name} holds {count} advisory locks")

    def expect_claimed(self, when: str) -> None:
        """No committed row that a claim may take is left unclaimed."""
        for stream in STREAMS:
            state = StreamState.objects.filter(stream=stream).first()
            if state is not None and state.paused:
                continue
            if stream == GENERIC:
                rows = fetch(
                    f"SELECT id FROM {GENERIC_TABLE} WHERE stream = %s AND group_id IS NULL "
                    "ORDER BY id",
                    [stream],
                )
            else:
                rows = fetch(
                    f"SELECT r.id FROM {ORDERED_TABLE} r WHERE r.group_id IS NULL AND "
                    "(r.aggregate_id IS NULL OR (NOT EXISTS (SELECT 1 FROM "
                    f"{ORDERED_TABLE} e WHERE e.aggregate_id = r.aggregate_id AND "
                    "e.group_id IS NOT NULL) AND NOT EXISTS (SELECT 1 FROM "
                    f"{HeldKey._meta.db_table} h WHERE h.stream = %s AND "
                    "h.key = r.aggregate_id))) ORDER BY r.id",
                    [stream],
                )
            if rows:
                floor = state.claim_floor if state is not None else 0
                raise RowsStranded(
                    f"{when}: rows of stream {stream} left unclaimed: "
                    f"{[r[0] for r in rows]} (claim floor {floor})"
                )

    def report(self, exc: Violation) -> str:
        command = (
            f"OUTBOX_HARNESS_PROFILE={self.profile.name} OUTBOX_HARNESS_SEED={self.seed} "
            "pytest --postgres tests/streams/test_interleavings.py -k replay"
        )
        trace = "\n".join(self.trace[-TRACE_LINES:])
        pids = {a.pid for a in self.actors if a.pid is not None and a.state != "finished"}
        waiting = lock_waiters(pids) if pids else set()
        actors = "\n".join(
            f"  {a.actor_name}: {a.state}{' (waits for a lock)' if a.pid in waiting else ''}"
            f" at '{a.label}'"
            for a in self.actors
        )
        return (
            f"{type(exc).__name__} (profile {self.profile.name}, seed {self.seed}):\n{exc}\n\n"
            f"Replay: {command}\n\nActors:\n{actors}\n\n"
            f"Steps (last {TRACE_LINES} of {len(self.trace)}):\n{trace}"
        )

    # -- deliveries (actor threads) --

    def deliver(self, actor: Actor, batch: Batch, ids: list[int]) -> None:
        """A handler call begins: check it against the deliveries live and the order.

        A call whose lease the clock made expire since its claim (a worker stalled for
        longer than its lease, as the clock step models; the group may have been
        rescued meanwhile) is under no live lease: the fenced finalize refuses it, and
        the rescued attempt may run beside it.
        """
        if not fetch(
            f"SELECT 1 FROM {OutboxGroup._meta.db_table} WHERE id = %s AND attempt = %s "
            "AND state = %s AND lease_expires_at > clock_timestamp()",
            [batch.group_id, batch.attempt, GroupState.RUNNING],
        ):
            self.note(f"{actor.actor_name} calls the handler under an expired lease")
            return self.check_order(actor, batch, ids)
        with self.cond:
            for row_id in ids:
                holder = self.live.get((batch.stream, row_id))
                if holder is not None and (holder.group_id, holder.attempt) != (
                    batch.group_id,
                    batch.attempt,
                ):
                    self.violations.append(
                        DeliveredTwice(
                            f"row {row_id} handed in group {batch.group_id} attempt "
                            f"{batch.attempt} by {actor.actor_name} while {holder.actor}'s "
                            f"delivery in group {holder.group_id} attempt {holder.attempt} is live"
                        )
                    )
                self.live[batch.stream, row_id] = Delivery(
                    batch.group_id, batch.attempt, actor.actor_name
                )
        self.check_order(actor, batch, ids)

    def check_order(self, actor: Actor, batch: Batch, ids: list[int]) -> None:
        """No call while a RetryAfter pause holds the stream; no ordered key overtaken."""
        with self.cond:
            keys = dict(self.keys)
        if fetch(
            "SELECT 1 FROM django_outbox_streamstate WHERE stream = %s AND paused_until > now()",
            [batch.stream],
            using=connection,
        ):
            self.fail(
                CalledWhilePaused(
                    f"{actor.actor_name} called the handler of {batch.stream} with rows {ids} "
                    "while a RetryAfter pause holds the stream"
                )
            )
        if batch.stream != ORDERED:
            return
        batch_ids = set(ids)
        for row_id in ids:
            key = keys.get(row_id)
            earlier = [i for i, k in keys.items() if k == key and i < row_id and i not in batch_ids]
            waiting = earlier and fetch(
                f"SELECT id FROM {ORDERED_TABLE} WHERE id = ANY(%s) ORDER BY id",
                [earlier],
                using=connection,
            )
            if waiting:
                self.fail(
                    KeyOvertaken(
                        f"row {row_id} of key {key} handed over (group {batch.group_id}) "
                        f"while earlier rows of its key wait: {[r[0] for r in waiting]}"
                    )
                )

    def delivered(self, group_id: uuid.UUID, attempt_number: int) -> None:
        with self.cond:
            for row, holder in list(self.live.items()):
                if (holder.group_id, holder.attempt) == (group_id, attempt_number):
                    del self.live[row]

    def expire_all(self) -> None:
        with self.cond:
            self.live.clear()


def fetch(sql: str, params: Any = (), *, using: Any = None) -> list[tuple[Any, ...]]:
    with (using or connection).cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def lock_waiters(pids: set[int]) -> set[int]:
    """The sessions of *pids* that wait for a lock another of *pids* holds.

    A session that waits for a lock nobody of *pids* holds (autovacuum's, or one just
    released: the waiter's wait event is cleared only once it runs again) is moving.
    """
    rows = fetch(
        "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s) AND wait_event_type = 'Lock' "
        "AND pg_blocking_pids(pid) <@ %s::int[] AND cardinality(pg_blocking_pids(pid)) > 0",
        [list(pids), list(pids)],
    )
    return {row[0] for row in rows}


# -- the handler ---------------------------------------------------------------------------


def handler(batch: Batch) -> BatchResult | None:
    """The harness streams' handler: checks the call, stops at a gate, then does what
    the actor's dice say (done, a row failed, the group failed, a RetryAfter, a crash)."""
    actor = current_actor()
    if actor is None:
        return None
    harness = actor.harness
    ids = [row["id"] for row in batch.rows("id")]
    harness.deliver(actor, batch, ids)
    mode = harness.profile.mode(actor.rng)
    if harness.calm and mode in ("retry_after", "crash"):
        mode = "ok"
    actor.gate(f"handler of {batch.stream} rows {ids} attempt {batch.attempt}: {mode}")
    if mode == "partial":
        return BatchResult({actor.rng.choice(ids): "rejected"})
    if mode == "raise":
        raise RuntimeError("the service failed")
    if mode == "retry_after":
        harness.paused_by_handler = True
        raise RetryAfter(3600, "429 Too Many Requests")
    if mode == "crash":
        harness.crashed = True
        raise WorkerCrash
    return None


# -- the gates in the project's functions --------------------------------------------------


def _subject(args: tuple[Any, ...]) -> str:
    first = args[0] if args else ""
    for name in ("stream", "name"):
        if hasattr(first, name) and isinstance(getattr(first, name), str):
            return getattr(first, name)
    return str(first)


def _gated(label: str, func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def gated(*args: Any, **kwargs: Any) -> Any:
        actor = current_actor()
        if actor is not None:
            actor.gate(f"{label} {_subject(args)}")
        return func(*args, **kwargs)

    return gated


def _tracked(func: Callable[..., Any]) -> Callable[..., Any]:
    """run_attempt: a delivery ends when its attempt returns (not when its worker dies)."""

    @functools.wraps(func)
    def tracked(config: Any, group_id: uuid.UUID, attempt_number: int, *a: Any, **k: Any) -> Any:
        actor = current_actor()
        try:
            outcome = func(config, group_id, attempt_number, *a, **k)
        except WorkerCrash:
            raise
        except BaseException:
            if actor is not None:
                actor.harness.delivered(group_id, attempt_number)
            raise
        if actor is not None:
            actor.harness.delivered(group_id, attempt_number)
            actor.harness.note(f"{actor.actor_name}: group {group_id} attempt -> {outcome}")
        return outcome

    return tracked


GATES: list[tuple[Any, str, str]] = [
    (run, "wake_now", "wake"),
    (run, "start_runs", "start runs"),
    (run, "claim_group", "claim"),
    (run, "runtime_state", "read state"),
    (run, "raise_wake_epoch", "raise the wake epoch"),
    (run, "publishers_done", "look at the publishers"),
    (run, "requeue_due_groups", "rescue"),
    (run, "_drop_unstarted_reservations", "drop reservations"),
    (run._Run, "_decide_to_continue", "decide to go on"),
    (rescue, "requeue_due_groups", "rescue"),
    (claim_floor, "advance", "advance the floor"),
    (claim_floor, "lower_if_passed", "lower the floor"),
    (attempt, "_take", "take the lease"),
    (attempt, "finalize", "finalize"),
    (attempt, "fail_group", "record the failure"),
    (budget, "pause", "pause (RetryAfter)"),
]


@contextlib.contextmanager
def gates() -> Iterator[None]:
    """Put the gates in the project's functions, and fix its time-based knobs."""
    saved: list[tuple[Any, str, Any]] = []

    def put(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, value)

    try:
        for owner, name, label in GATES:
            put(owner, name, _gated(label, owner.__dict__[name]))
        put(attempt, "run_attempt", _tracked(attempt.run_attempt))
        put(run, "run_attempt", _tracked(run.run_attempt))
        put(run, "PUBLISHERS_WAIT_SECONDS", 1e6)
        put(run, "LONG_TRANSACTION_SECONDS", 1e6)
        define_guard(long_seconds=1e6)  # the database's side of the same bound
        put(run, "RECHECK_SECONDS", 0.0)
        put(claim_floor, "ADVANCE_SECONDS", 0.0)
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)
        define_guard()


def define_guard(**bound: float) -> None:
    """(Re)define the wake guard's functions, with the *bound* given or the default."""
    with connection.cursor() as cursor:
        for sql in wake_guard.statements(**bound):
            cursor.execute(sql)


# -- the actors' programs ----------------------------------------------------------------


def _payload(harness: Harness, actor: Actor) -> dict[str, Any]:
    return {"n": next(harness.counter), "by": actor.actor_name}


def _raw_insert(table: str, columns: list[str], values: list[Any], casts: list[str]) -> int:
    placeholders = ", ".join(f"%s{cast}" for cast in casts)
    row = fetch(
        f"INSERT INTO {table} (created_at, {', '.join(columns)}) "
        f"VALUES (now(), {placeholders}) RETURNING id",
        values,
    )
    return row[0][0]


def _copy(table: str, columns: list[str], rows: list[list[Any]]) -> None:
    with connection.cursor() as cursor:
        with cursor.cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)


def insert_generic(harness: Harness, actor: Actor, path: str) -> None:
    """Write one or two rows of the generic stream through *path*."""
    payloads = [_payload(harness, actor) for _ in range(actor.rng.randint(1, 2))]
    if path == "publish":
        publish(GENERIC, payloads[0])
    elif path == "publish_many":
        publish_many(GENERIC, payloads)
    elif path == "orm_create":
        OutboxEvent.objects.create(stream=GENERIC, payload=payloads[0])
    elif path == "orm_bulk_create":
        OutboxEvent.objects.bulk_create([OutboxEvent(stream=GENERIC, payload=p) for p in payloads])
    elif path == "raw_insert":
        _raw_insert(
            GENERIC_TABLE,
            ["stream", "payload"],
            [GENERIC, json.dumps(payloads[0])],
            ["", "::jsonb"],
        )
        wake(GENERIC)
    elif path == "raw_insert_explicit_id":
        _raw_insert(
            GENERIC_TABLE,
            ["id", "stream", "payload"],
            [next(harness.low_ids), GENERIC, json.dumps(payloads[0])],
            ["", "", "::jsonb"],
        )
        wake(GENERIC)
    elif path in ("copy", "copy_explicit_id"):
        now = time.strftime("%Y-%m-%d %H:%M:%S+00", time.gmtime())
        if path == "copy":
            rows = [[now, GENERIC, json.dumps(p)] for p in payloads]
            _copy(GENERIC_TABLE, ["created_at", "stream", "payload"], rows)
        else:
            rows = [[next(harness.low_ids), now, GENERIC, json.dumps(p)] for p in payloads]
            _copy(GENERIC_TABLE, ["id", "created_at", "stream", "payload"], rows)
        wake(GENERIC)
    else:  # pragma: no cover
        raise ValueError(path)


def insert_ordered(harness: Harness, actor: Actor, path: str, key: str) -> list[int]:
    """Write one or two rows of *key* on the ordered stream through *path*; their ids."""
    count = actor.rng.randint(1, 2)
    if path == "orm_create":
        ids = [OrderedEvent.objects.create(aggregate_id=key).id for _ in range(count)]
    elif path == "orm_bulk_create":
        rows = OrderedEvent.objects.bulk_create(
            [OrderedEvent(aggregate_id=key) for _ in range(count)]
        )
        ids = [row.id for row in rows]
    else:
        ids = [
            _raw_insert(ORDERED_TABLE, ["aggregate_id", "seq"], [key, 0], ["", ""])
            for _ in range(count)
        ]
        wake(ORDERED)
    return ids


def publisher_program(ordered: bool) -> Callable[[Actor], None]:
    """A publisher: a few transactions of one to three writes, most committed."""

    def program(actor: Actor) -> None:
        harness, profile, rng = actor.harness, actor.harness.profile, actor.rng
        keys = [f"{actor.actor_name}.{i}" for i in range(2)]
        for _ in range(profile.transactions):
            roll_back = rng.random() < 0.1
            written: list[int] = []
            try:
                with transaction.atomic():
                    publishes = 0
                    for _ in range(rng.randint(1, 3)):
                        if ordered:
                            path, key = rng.choice(ORDERED_PATHS), rng.choice(keys)
                            actor.gate(f"insert {key} via {path}")
                            ids = insert_ordered(harness, actor, path, key)
                            written.extend(ids)
                            with harness.cond:
                                harness.keys.update(dict.fromkeys(ids, key))
                            continue
                        paths = [
                            p
                            for p in profile.paths
                            if p != "publish" or publishes < profile.publishes_per_transaction
                        ]
                        if not paths:
                            break
                        path = rng.choice(paths)
                        if path == "publish" and profile.publishes_per_transaction > 1:
                            # the item-1 trigger: several guarded inserts in a row
                            for _ in range(profile.publishes_per_transaction):
                                actor.gate("insert via publish")
                                insert_generic(harness, actor, path)
                            publishes = profile.publishes_per_transaction
                            continue
                        publishes += path == "publish"
                        actor.gate(f"insert via {path}")
                        insert_generic(harness, actor, path)
                    actor.gate("roll back" if roll_back else "commit")
                    if roll_back:
                        raise _Rollback
            except _Rollback:
                with harness.cond:
                    for row_id in written:
                        harness.keys.pop(row_id, None)

    return program


def worker_program(actor: Actor) -> None:
    """A worker: runs the jobs the pipeline enqueued, as a django-q2 worker would."""
    harness = actor.harness
    while True:
        actor.gate("take a job", ready=lambda: bool(harness.jobs) or harness.queued())
        job = harness.jobs.popleft() if harness.jobs else take_queued()
        if job is None:
            continue  # another worker took the row first
        harness.note(f"{actor.actor_name} runs job {job.func.rpartition('.')[2]}{job.args}")
        try:
            if job.func == handoff.RUN:
                stream, group_id = job.args
                hand_over = actor.rng.random() < 0.1
                run.run_stream(stream, group_id, budget=0.0 if hand_over else 1e6)
            elif job.func == handoff.WAKE:
                run.run_woken(*job.args)
            else:
                job.run()
        except WorkerCrash:
            harness.note(f"{actor.actor_name} crashed")


def take_queued() -> handoff.Job | None:
    """Take the oldest job waiting in django-q2's queue table, as the ORM broker's worker
    does (the row is acknowledged, deleted, at once: a crashed worker's job is not
    delivered again here; the recovery's distribute covers its work)."""
    rows = fetch(
        f"DELETE FROM {OrmQ._meta.db_table} WHERE id = (SELECT id FROM {OrmQ._meta.db_table} "
        "WHERE lock <= clock_timestamp() ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) "
        "RETURNING payload"
    )
    if not rows:
        return None
    task = SignedPackage.loads(rows[0][0])
    return handoff.Job(task["func"], tuple(task["args"]), kwargs=task.get("kwargs") or {})


def time_passes() -> None:
    """Every lease, retry and pause is due now: what waiting would bring."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {OutboxGroup._meta.db_table} SET "
            "lease_expires_at = CASE WHEN lease_expires_at IS NULL THEN NULL "
            "ELSE now() - interval '1 second' END, "
            "next_attempt_at = CASE WHEN next_attempt_at IS NULL THEN NULL "
            "ELSE now() - interval '1 second' END WHERE stream = ANY(%s)",
            [list(STREAMS)],
        )
        cursor.execute(
            f"UPDATE {StreamState._meta.db_table} SET "
            "paused_until = CASE WHEN paused_until IS NULL THEN NULL "
            "ELSE now() - interval '1 second' END, "
            "next_call_at = CASE WHEN next_call_at IS NULL THEN NULL "
            "ELSE now() - interval '1 second' END WHERE stream = ANY(%s)",
            [list(STREAMS)],
        )


def operator_program(actor: Actor) -> None:
    """Distribute, rescue, the clock, a pause and its resume, at seeded moments."""
    harness, rng = actor.harness, actor.rng
    paused: set[str] = set()
    for _ in range(harness.profile.operator_steps):
        stream = rng.choice(STREAMS)
        op = rng.choice(["distribute", "rescue", "clock", "pause"])
        if op == "pause" and stream in paused:
            op = "resume"
        actor.gate(f"operator: {op} {stream}")
        if op == "distribute":
            distribute.distribute_stream(stream)
        elif op == "rescue":
            rescue.requeue_due_groups(get_stream(stream))
        elif op == "clock":
            time_passes()
            harness.expire_all()
        elif op == "pause":
            steer.set_paused(stream, True)
            paused.add(stream)
        else:
            steer.set_paused(stream, False)
            paused.discard(stream)
    for stream in sorted(paused):
        actor.gate(f"operator: resume {stream}")
        steer.set_paused(stream, False)


def floor_program(actor: Actor) -> None:
    """The floor's move, as a run loop of another process makes it."""
    for _ in range(actor.harness.profile.floor_steps):
        stream = actor.rng.choice(STREAMS)
        actor.gate(f"floor mover: advance {stream}")
        state = StreamState.objects.get(stream=stream)
        claim_floor.advance(get_stream(stream), state, force=True)


def rekey_program(actor: Actor) -> None:
    """An application that changes the key of an ordered row (one claimed, if any)."""
    for n in range(actor.harness.profile.rekeys):
        actor.gate("re-key a claimed ordered row")
        claimed = list(
            OrderedEvent.objects.filter(group_id__isnull=False)
            .order_by("id")
            .values_list("id", flat=True)
        )
        if claimed:
            row_id = actor.rng.choice(claimed)
            try:
                OrderedEvent.objects.filter(id=row_id).update(aggregate_id=f"rekeyed.{n}")
            except IntegrityError as exc:  # the guard refuses (GuardOrderKey's trigger)
                assert "ORDER_KEY" in str(exc), exc
                actor.harness.note(f"re-key of row {row_id} refused: it is in a group")
            else:
                actor.harness.note(f"re-keyed row {row_id}")


def recovery_program(actor: Actor) -> None:
    """After a crash or a pause: the time passes, distribute runs (the schedule)."""
    actor.gate("recovery: time passes")
    time_passes()
    actor.harness.expire_all()
    for stream in STREAMS:
        actor.gate(f"recovery: distribute {stream}")
        distribute.distribute_stream(stream)


# -- a scenario ----------------------------------------------------------------------------


def harness_settings() -> override_settings:
    return override_settings(DJANGO_OUTBOX={**DJANGO_OUTBOX, "STREAMS": dict(STREAM_SETTINGS)})


def reset() -> None:
    """Start a scenario on empty tables (of the harness's streams)."""
    streams = list(STREAMS)
    OutboxEvent.objects.filter(stream__in=streams).delete()
    OrderedEvent.objects.all().delete()
    OutboxGroup.objects.filter(stream__in=streams).delete()
    ArchivedEvent.objects.filter(stream__in=streams).delete()
    HeldKey.objects.filter(stream__in=streams).delete()
    OrmQ.objects.all().delete()
    StreamState.objects.filter(stream__in=streams).delete()
    StreamState.objects.bulk_create([StreamState(stream=s) for s in streams])
    claim_floor.forget()


@contextlib.contextmanager
def sequence_cache(cache: int) -> Iterator[int]:
    """Give the generic buffer's sequence *cache*; yield the first of 1,000 ids kept
    below the scenario's sequence ids (the explicit "low" ids)."""
    seq = fetch("SELECT pg_get_serial_sequence(%s, 'id')", [GENERIC_TABLE])[0][0]
    first = fetch("SELECT nextval(%s)", [seq])[0][0]
    fetch("SELECT setval(%s, %s)", [seq, first + 1000])
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER SEQUENCE {seq} CACHE {int(cache)}")
    try:
        yield first
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER SEQUENCE {seq} CACHE 1")


def run_scenario(profile: Profile, seed: int) -> Harness:
    """Run one seeded scenario of *profile*; raise the first violation it finds."""
    harness = Harness(seed, profile)
    reset()
    with sequence_cache(profile.sequence_cache) as low:
        harness.low_ids = itertools.count(low)
        for n in range(profile.generic_publishers):
            harness.add(f"P{n}", publisher_program(ordered=False))
        for n in range(profile.ordered_publishers):
            harness.add(f"O{n}", publisher_program(ordered=True))
        for n in range(profile.workers):
            harness.add(f"W{n}", worker_program)
        if profile.operator_steps:
            harness.add("D", operator_program)
        if profile.floor_steps:
            harness.add("F", floor_program)
        if profile.rekeys:
            harness.add("K", rekey_program)
        harness.run()
    return harness


def seeds() -> list[int]:
    """The seeds of a run: ``OUTBOX_HARNESS_SEED`` alone, else ``OUTBOX_HARNESS_RUNS``
    of them from ``OUTBOX_HARNESS_FIRST`` (0)."""
    if os.environ.get("OUTBOX_HARNESS_SEED"):
        return [int(os.environ["OUTBOX_HARNESS_SEED"])]
    first = int(os.environ.get("OUTBOX_HARNESS_FIRST", "0"))
    return list(range(first, first + runs_wanted()))


def runs_wanted(default: int = 0) -> int:
    return int(os.environ.get("OUTBOX_HARNESS_RUNS", default))
