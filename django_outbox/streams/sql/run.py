"""The reads of the run loop: whether a stream is paused, wanted, busy; its runs in flight."""

from __future__ import annotations

from django.db.backends.base.base import BaseDatabaseWrapper

from django_outbox.base.dialect import dialect_of
from django_outbox.base.routing import connection_for
from django_outbox.models.groups import GroupState, OutboxGroup
from django_outbox.models.state import StreamState
from django_outbox.streams.sql import wake_guard


def _tables(connection: BaseDatabaseWrapper) -> tuple[str, str]:

    qn = connection.ops.quote_name
    return qn(OutboxGroup._meta.db_table), qn(StreamState._meta.db_table)


def _live_groups_clause(connection: BaseDatabaseWrapper) -> tuple[str, list[str]]:

    group_table, _ = _tables(connection)
    sql = (
        f"SELECT 1 FROM {group_table} g WHERE g.stream = s.stream AND g.state IN (%s, %s) "
        f"AND g.lease_expires_at > {dialect_of(connection).now}"
    )
    return sql, [GroupState.CLAIMED, GroupState.RUNNING]


def wake_state(stream: str) -> tuple[bool, bool, bool] | None:
    """Return (paused, wanted, busy) of *stream* in one statement; None without a state row.

    *busy* means a group of the stream is claimed or running under a live lease: a run
    is in flight.
    """

    connection = connection_for(StreamState)
    _, state_table = _tables(connection)
    live, params = _live_groups_clause(connection)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT s.paused, s.wanted, EXISTS({live}) FROM {state_table} s WHERE s.stream = %s",
            [*params, stream],
        )
        row = cursor.fetchone()
    return None if row is None else (bool(row[0]), bool(row[1]), bool(row[2]))


def runs_in_flight(stream: str) -> int:
    """Count the stream's groups claimed or running under a live lease: its runs in flight."""

    connection = connection_for(OutboxGroup)
    group_table, _ = _tables(connection)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT COUNT(*) FROM {group_table} g WHERE g.stream = %s AND g.state IN (%s, %s) "
            f"AND g.lease_expires_at > {dialect_of(connection).now}",
            [stream, GroupState.CLAIMED, GroupState.RUNNING],
        )
        return int(cursor.fetchone()[0])


def raise_wake_epoch(stream: str) -> int | None:
    """Raise the stream's ``wake_epoch``; return the value publishers relied on.

    None where publishers never skip their wake (:func:`wake_guard.guarded` is false,
    or the buffer and the state live on different databases): nothing to wait for.
    """

    connection = connection_for(StreamState)
    if not wake_guard.guarded(connection):
        return None
    _, state_table = _tables(connection)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {state_table} SET wake_epoch = wake_epoch + 1 WHERE stream = %s "
            "RETURNING wake_epoch - 1",
            [stream],
        )
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def publishers_done(stream: str, epoch: int) -> bool:
    """Whether every publisher that skipped its wake under *epoch* has ended."""

    return wake_guard.publishers_done(connection_for(StreamState), stream, epoch)


def ask_wake_guard(
    connection: BaseDatabaseWrapper, stream: str, wake: tuple[str, str] | None
) -> int:
    """Ask the wake guard in a statement of its own, for rows of *stream* the ORM wrote
    in the current transaction on *connection* (PostgreSQL); its answer
    (:mod:`django_outbox.streams.sql.wake_guard`)."""
    call, params, key = wake_guard.stream_call(connection.alias, stream, wake)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {call}", params)
        row = cursor.fetchone()
    return wake_guard.answered(key, int(row[0]), wake)
