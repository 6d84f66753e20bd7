"""The wake guard: how ``publish()`` on PostgreSQL costs its INSERT and nothing more.

A commit that wrote buffer rows must make sure a run will claim them (:mod:`django_outbox.
streams.run`). After its commit the wake reads the stream's state, and starts a run when
none is in flight: one round trip or more in the request for every transaction. On
PostgreSQL, ``publish()`` instead asks the database in its own INSERT statement, through
the function below, and the answer is one of three:

* **A run is in flight** (and the stream not paused): the function takes a
  transaction-scoped *shared* advisory lock named by the stream and its ``wake_epoch``,
  and the publisher skips the wake. A run that is about to end raises the epoch, then
  waits until it can take that lock *exclusively* (every publisher that relied on it has
  committed or rolled back), and claims once more. Either the run sees the publisher's
  row, or the publisher read the new epoch and wakes the stream itself.
* **None is, and django-q2's ORM broker is on the stream's database**: the same
  statement queues the stream's wake, a ``django_outbox.tasks.wake`` task committed (or
  rolled back) with the row, and the worker that takes it runs the stream. Unless the
  wake this process queued last still waits untaken: the publisher relies on it as on a
  run in flight (the lock above), since the worker that takes it runs the stream and its
  run's end waits the same way; so a burst of publishes on an idle stream queues one
  wake per process, not one per commit.
* Otherwise (another broker, django-q2's sync mode, a paused stream): wake after commit.

A run waits for publishers at most :data:`PUBLISHERS_WAIT_SECONDS`; a publisher whose
transaction outlasts :data:`LONG_TRANSACTION_SECONDS` (shorter) wakes the stream after
its commit, as if it had not skipped (a queued wake needs no such bound: it commits with
the rows). The function answers "wake after commit" in a transaction that is not READ
COMMITTED (its reads would not see the epoch move).

A transaction asks once per stream: its first write of the stream asks, and the
answer covers the transaction's later writes of it, which ask nothing
(:func:`django_outbox.streams.run.wake_guarded`). A queued wake commits with all of
them; a lock taken at epoch *E* makes the run that ends at *E* wait for the
transaction's end before its last claim, whatever the transaction writes meanwhile
(under the time bound above); and a commit told to wake wakes for them all. So a
transaction holds at most one guard lock per stream and queues at most one wake,
whatever the number of its publishes and however often runs end meanwhile. A
transaction older than :data:`LONG_TRANSACTION_SECONDS` (the database's clock) takes
none: its commit wakes the stream anyway, so a run never waits for a long transaction
that has not already relied on it.

The same guard serves unique-job kinds and the ``django.tasks`` backend: an
``enqueue()`` whose INSERT finds the kind at its concurrency (every chunk in flight
dispatches when it ends) skips the dispatch after its commit; a worker whose chunks
have ended raises the kind's epoch (``KindState``), waits for those enqueues, and
dispatches once more. Below its concurrency, with django-q2's ORM broker on the kind's
database, the INSERT queues the kind's wake itself (a ``run_unique_jobs`` task for a
worker to dispatch, committed with the job), unless the wake this process queued last
still waits untaken, as for streams.
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

__all__ = [
    "LONG_TRANSACTION_SECONDS",
    "PUBLISHERS_WAIT_SECONDS",
]

#: An ending run waits this long at most for the publishers that relied on it.
PUBLISHERS_WAIT_SECONDS = 2.0
#: A publisher whose transaction lasted longer than this wakes the stream after its
#: commit even when the guard let it skip (the run may have stopped waiting for it).
LONG_TRANSACTION_SECONDS = 1.0

FUNCTION = "django_outbox_publish_wake"
#: The function of the same guard before it could queue a wake (dropped by migration 0002).
OLD_FUNCTION = "django_outbox_wake_skip"

#: The advisory lock's keys: the stream's hash and the epoch (modulo 2**31).
LOCK_KEYS = "hashtext('django_outbox.wake:' || {stream}), mod({epoch}, 2147483647)::int4"

_FUNCTION_KEYS = LOCK_KEYS.format(stream="p_stream", epoch="v_epoch")

#: The transaction-local setting that records the epoch whose lock a transaction holds
#: for a kind: its name ends with the MD5 of the kind's name. (A kind's guard is asked
#: by every ``enqueue()``; a stream's only by a transaction's first write of it.)
HELD_SETTING = "'django_outbox.wake_' || md5({name})"

#: The guard takes no lock in a transaction older than this (in the database's clock):
#: such a transaction wakes after its commit anyway (:func:`relied_on_recently`).
#: (The bound is written into the functions when they are created: :func:`statements`.)
_LONG = "@long_seconds@"
_YOUNG = f"clock_timestamp() - now() <= interval '{_LONG} seconds'"

#: What the guard's functions answer besides the id of a wake they queued (> 0): skip
#: the wake after commit (a run in flight, or a queued wake not yet taken, takes the
#: row), or wake after commit.
SKIP, WAKE_AFTER_COMMIT = 0, -1

#: Whether the wake this process queued last (``p_last_wake``, ``p_last_digest``) still
#: waits in django-q2's queue untaken (a taken row is locked until later; the digest: an
#: id a reset sequence gave another row is not that wake).
_LAST_WAKE_WAITS = """EXISTS (SELECT 1 FROM django_q_ormq q
                       WHERE q.id = p_last_wake AND q.lock <= statement_timestamp()
                       AND md5(q.payload) = p_last_digest)"""

#: Queue the wake offered (``p_key``, ``p_payload``) and answer its id, or answer "wake
#: after commit" where none is offered (another broker).
_QUEUE_OFFERED_WAKE = f"""IF p_payload IS NULL THEN
        RETURN {WAKE_AFTER_COMMIT};
    END IF;
    INSERT INTO django_q_ormq (key, payload, lock)
        VALUES (p_key, p_payload, statement_timestamp()) RETURNING id INTO v_id;"""

#: The function asks once per stream and transaction: the caller's later writes of the
#: stream in that transaction do not ask (:func:`django_outbox.streams.run.wake_guarded`),
#: the first answer covers them all. That bounds the locks to one per stream and
#: transaction, and the wakes queued to one. (A savepoint rolled back takes its
#: statement's lock and queued wake with it, and the caller's record of the answer.)
#:
#: One statement reads what decides: the transaction's isolation and age (the database's
#: clock), the stream's state and whether a run is in flight; each is a condition of
#: the read, so that a call that finds no row wakes after commit. The function's other
#: steps run only when they answer: the last wake's row when no run is in flight, the
#: lock and the epoch's second read when something is relied on, the queue row when
#: nothing is.
#:
#: ``p_last_wake``/``p_last_digest``: the id and the payload's MD5 of the stream's wake
#: this process queued last (:func:`last_queued`); while it waits in django-q2's queue
#: untaken, the worker that takes it runs the stream and its run's end waits for this
#: publish, as any run's end does. ``p_key``/``p_payload``: the cluster key and signed
#: package of a wake to queue when nothing in flight will take the row (the ORM broker
#: on this database), else NULL: then the answer is to wake after commit.
_CREATE = f"""
CREATE OR REPLACE FUNCTION {FUNCTION}(
    p_stream text, p_last_wake bigint, p_last_digest text, p_key text, p_payload text
) RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_epoch bigint;
    v_relied boolean;
    v_id bigint;
BEGIN
    SELECT s.wake_epoch, EXISTS (
            SELECT 1 FROM django_outbox_outboxgroup g
            WHERE g.stream = p_stream AND g.state IN ('claimed', 'running')
            AND g.lease_expires_at > now())
      INTO v_epoch, v_relied
      FROM django_outbox_streamstate s
     WHERE s.stream = p_stream AND NOT s.paused
       AND current_setting('transaction_isolation') = 'read committed' AND {_YOUNG};
    IF NOT FOUND THEN
        RETURN {WAKE_AFTER_COMMIT};
    END IF;
    IF NOT v_relied AND p_last_wake IS NOT NULL THEN  -- (django-q2's table is read only then)
        v_relied := {_LAST_WAKE_WAITS};
    END IF;
    IF v_relied THEN
        PERFORM pg_advisory_xact_lock_shared({_FUNCTION_KEYS});
        IF (SELECT s.wake_epoch FROM django_outbox_streamstate s
            WHERE s.stream = p_stream) = v_epoch THEN
            RETURN {SKIP};
        END IF;
    END IF;
    {_QUEUE_OFFERED_WAKE}
    RETURN v_id;
END
$$;
"""

JOB_FUNCTION = "django_outbox_job_wake"

#: A kind's lock keys: the kind's hash and the epoch (modulo 2**31).
JOB_LOCK_KEYS = "hashtext('django_outbox.dispatch:' || {kind}), mod({epoch}, 2147483647)::int4"

_JOB_FUNCTION_KEYS = JOB_LOCK_KEYS.format(kind="p_kind", epoch="v_epoch")

#: ``p_table`` is the kind's quoted table name (from its model, never from input).
#: ``p_last_wake``/``p_last_digest``: the id and the payload's MD5 of the wake of the kind
#: this process queued last; while it waits in django-q2's queue untaken, the worker
#: that takes it dispatches and its end waits for this enqueue, as any worker's end
#: does (the digest: an id a reset sequence gave another row is not that wake).
#: ``p_key``/``p_payload``: the cluster key and signed package of a wake to queue (the
#: ORM broker on this database), else NULL. Each check reads after the epoch: a worker
#: that raised it before could not have waited for this enqueue.
_CREATE_JOB = f"""
CREATE OR REPLACE FUNCTION {JOB_FUNCTION}(
    p_kind text, p_table text, p_concurrency integer,
    p_last_wake bigint, p_last_digest text, p_key text, p_payload text
) RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_epoch bigint;
    v_running integer;
    v_relied boolean := false;
    v_id bigint;
    v_name text := {HELD_SETTING.format(name="p_kind")};
    v_held text := current_setting(v_name, true);
BEGIN
    IF current_setting('transaction_isolation') = 'read committed'
       AND (coalesce(v_held, '') <> '' OR {_YOUNG}) THEN
        -- No state row yet: epoch 0, the one a worker's first end raises.
        v_epoch := coalesce(
            (SELECT k.wake_epoch FROM django_outbox_kindstate k WHERE k.kind = p_kind), 0);
        IF p_last_wake IS NOT NULL THEN  -- (django-q2's table is read only then)
            v_relied := {_LAST_WAKE_WAITS};
        END IF;
        IF NOT v_relied THEN
            EXECUTE format('SELECT count(*) FROM (SELECT 1 FROM %s WHERE state = %L '
                           'ORDER BY lease_expires_at LIMIT %s) r',
                           p_table, 'running', p_concurrency)
               INTO v_running;
            v_relied := v_running >= p_concurrency;
        END IF;
        IF v_relied AND coalesce(v_held, '') <> '' THEN
            -- The transaction holds this kind's lock: it still covers this enqueue
            -- while the epoch has not moved; no second lock either way.
            v_relied := v_held::bigint = v_epoch;
        ELSIF v_relied THEN
            PERFORM pg_advisory_xact_lock_shared({_JOB_FUNCTION_KEYS}),
                    set_config(v_name, v_epoch::text, true);
            v_relied := coalesce((SELECT k.wake_epoch FROM django_outbox_kindstate k
                                  WHERE k.kind = p_kind), 0) = v_epoch;
        END IF;
        IF v_relied THEN
            RETURN {SKIP};
        END IF;
    END IF;
    {_QUEUE_OFFERED_WAKE}
    RETURN v_id;
END
$$;
"""
_DROP = (
    f"DROP FUNCTION IF EXISTS {FUNCTION}(text, bigint, text, text, text); "
    f"DROP FUNCTION IF EXISTS {OLD_FUNCTION}(text);"
)
_DROP_JOB = (
    f"DROP FUNCTION IF EXISTS {JOB_FUNCTION}(text, text, integer, bigint, text, text, text);"
)


def statements(long_seconds: float = LONG_TRANSACTION_SECONDS) -> list[str]:
    """The statements that (re)define the guard's functions, of streams and of unique-job
    kinds, with *long_seconds* as the age after which a transaction takes no lock (the
    tests' interleaving harness, whose transactions last as long as its steps, widens
    it as it widens :data:`LONG_TRANSACTION_SECONDS`); and drop the streams' earlier
    function (which could not queue a wake) where an earlier install left it."""
    return [
        *(sql.replace(_LONG, str(float(long_seconds))) for sql in (_CREATE, _CREATE_JOB)),
        f"DROP FUNCTION IF EXISTS {OLD_FUNCTION}(text);",
    ]


def create_functions(schema_editor: BaseDatabaseSchemaEditor) -> None:
    """Install the guard's functions (PostgreSQL only; elsewhere nothing to do)."""
    if schema_editor.connection.vendor == "postgresql":
        for sql in statements():
            schema_editor.execute(sql, params=None)


def drop_functions(schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_DROP_JOB, params=None)
        schema_editor.execute(_DROP, params=None)


#: The wake of a stream or kind this process queued last, by (database alias, stream or
#: kind, cluster key): its queue row's id and the MD5 of its package. Later inserts rely
#: on it under the guard instead of queueing another while no worker has taken it. A
#: value from a transaction that rolled back, or a task taken since, is simply not found.
_QUEUED_WAKES: dict[tuple[str, str, str], tuple[int, str]] = {}


def last_queued(key: tuple[str, str, str]) -> tuple[int | None, str | None]:
    """The id and package digest of the wake queued last for *key*, or (None, None)."""
    return _QUEUED_WAKES.get(key, (None, None))


def remember_queued(key: tuple[str, str, str], wake_id: int, package: str) -> None:
    """A statement queued the wake *package* for *key* as queue row *wake_id*."""
    _QUEUED_WAKES[key] = (wake_id, hashlib.md5(package.encode(), usedforsecurity=False).hexdigest())


def stream_call(
    alias: str, stream: str, wake: tuple[str, str] | None
) -> tuple[str, list[Any], tuple[str, str, str]]:
    """The call of the streams' function for a statement on *alias* (its SQL and
    parameters), offering *wake* (a cluster key and a signed package, or None), and the
    key under which :func:`answered` remembers a wake it queued."""
    key = (alias, stream, wake[0] if wake else "")
    last_id, last_digest = last_queued(key)
    return (
        f"{FUNCTION}(%s, %s::bigint, %s::text, %s::text, %s::text)",
        [stream, last_id, last_digest, *(wake or (None, None))],
        key,
    )


def answered(key: tuple[str, str, str], answer: int, wake: tuple[str, str] | None) -> int:
    """The function's *answer*, after remembering the wake it queued (an id > 0)."""
    if answer > 0 and wake is not None:
        remember_queued(key, answer, wake[1])
    return answer


#: The ``guarded_since`` of a write whose statement queued the stream's wake: it commits
#: with the row, so the commit needs no wake, however long the transaction
#: (:func:`relied_on_recently` takes the earliest of a transaction's writes).
QUEUED = math.inf


def relied_on_recently(guarded_since: list[float | None], long_seconds: float) -> bool:
    """Whether a commit may skip its wake: every write of it was guarded (a ``time.
    monotonic()`` when its INSERT took the lock, :data:`QUEUED` when it queued the wake,
    None for an unguarded write) and the earliest is at most *long_seconds* old (a
    worker in flight still waits for it)."""
    if not guarded_since or None in guarded_since:
        return False
    return time.monotonic() - min(s for s in guarded_since if s is not None) <= long_seconds


def guarded(connection: BaseDatabaseWrapper) -> bool:
    """Whether inserts on *connection* ask the guard (PostgreSQL)."""
    return connection.vendor == "postgresql"


def publishers_done(
    connection: BaseDatabaseWrapper, stream: str, epoch: int, *, keys: str = LOCK_KEYS
) -> bool:
    """Whether no transaction still holds the guard's lock of *stream* at *epoch*
    (with *keys* = :data:`JOB_LOCK_KEYS`, of the kind named *stream*).

    Takes the lock exclusively and lets it go in one statement, without waiting: a
    publisher queued behind a waiting run would wait with it. (A session lock, so that
    a caller inside a transaction does not keep it.)
    """
    keys = keys.format(stream="%s", kind="%s", epoch="%s")
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT CASE WHEN pg_try_advisory_lock({keys}) "
            f"THEN pg_advisory_unlock({keys}) ELSE false END",
            [stream, epoch, stream, epoch],
        )
        row = cursor.fetchone()
    return bool(row and row[0])
