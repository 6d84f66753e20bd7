"""PostgreSQL: SKIP LOCKED claims above the claim floor, ``DELETE … RETURNING`` moves."""

from __future__ import annotations

import uuid
from functools import cached_property
from typing import Any

from django.db.models import QuerySet

from django_outbox.base.routing import connection_for
from django_outbox.models.state import FloorHole, StreamState
from django_outbox.streams.sql import claim_floor, wake_guard
from django_outbox.streams.sql.base import (
    ARCHIVE_COLUMNS,
    Backlog,
    BufferOps,
    Claimed,
    Move,
    delete_sql,
)


class PostgresBufferOps(BufferOps):
    """A group moves into the archive in one statement: ``DELETE … RETURNING`` in a CTE.

    A claim starts above the stream's claim floor and reports the highest id it took,
    from which the floor advances (:mod:`django_outbox.streams.claim_floor`).
    """

    keeps_claim_floor = True

    def floor_start(self, floor: int) -> tuple[str, list[Any]]:
        """*floor*, or below the stream's lowest hole (a row written at or below the
        floor), read by the claim's own statement."""
        if self.floor_stream is None:
            return super().floor_start(floor)
        return claim_floor.claim_start(self.qn(FloorHole._meta.db_table), floor, self.floor_stream)

    def _order(self) -> str:
        return "stream, id" if self.stream is not None else "id"

    def claim_sql(self, floor: int = 0) -> tuple[str, list[Any]]:
        if self.ordered is not None:
            return self.ordered_claim_sql(floor)
        where, params = self.stream_clause()
        start, start_params = self.floor_start(floor)
        pick = self.dialect.id_pick(
            f"SELECT id FROM {self.table} WHERE group_id IS NULL {where} AND id > {start} "
            f"ORDER BY {self._order()} LIMIT %s{self.dialect.skip_locked}"
        )
        update, update_params = self.claim_update(pick, [*params, *start_params])
        return (
            f"WITH claimed AS ({update} RETURNING id) SELECT COUNT(*), MAX(id) FROM claimed",
            update_params,
        )

    @cached_property
    def wake_guarded(self) -> bool:
        return connection_for(StreamState) is self.connection

    def insert_event_guarded(
        self,
        stream: str,
        payload_json: str,
        trace_context: str | None = None,
        order_key: str | None = None,
        wake: tuple[str, str] | None = None,
    ) -> tuple[int, int]:
        if not self.wake_guarded:
            return super().insert_event_guarded(stream, payload_json, trace_context, order_key)
        call, call_params, key = wake_guard.stream_call(self.connection.alias, stream, wake)
        row = self.fetchone(
            self.insert_sql(trace_context is not None, order_key is not None, f"id, {call}"),
            [*self.insert_params(stream, payload_json, trace_context, order_key), *call_params],
        )
        assert row is not None
        return int(row[0]), wake_guard.answered(key, int(row[1]), wake)

    def ordered_claim_sql(self, floor: int) -> tuple[str, list[Any]]:
        update, params = super().ordered_claim_sql(floor)
        sql = f"WITH claimed AS ({update} RETURNING id) SELECT COUNT(*), MAX(id) FROM claimed"
        return sql, params

    def claim(self, group_id: uuid.UUID, limit: int, floor: int = 0) -> Claimed:
        if self.ordered is not None and (lock := self.ordered.lock_statement()):
            self.execute(*lock)  # a statement of its own: the claim's snapshot follows it
        sql, where_params = self.claim_sql(floor)
        row = self.fetchone(sql, [self.group_param(group_id), *where_params, limit])
        assert row is not None
        return Claimed(int(row[0]), row[1])

    def backlog(self, cap: int) -> Backlog:
        """One statement: the count from the index's oldest end, whose first row is the
        lowest unclaimed id (what the floor's safety net compares with the floor)."""
        where, params = self.stream_clause()
        row = self.fetchone(
            f"SELECT COUNT(*), MIN(id) FROM (SELECT id FROM {self.table} "
            f"WHERE group_id IS NULL {where} ORDER BY {self._order()} LIMIT %s) AS backlog",
            [*params, cap],
        )
        return Backlog(int(row[0]), row[1]) if row else Backlog(0)

    def move_statements(self, group_id: uuid.UUID, move: Move) -> list[tuple[str, list[Any]]]:
        where, params = self.group_where(group_id, move)
        delete = f"DELETE FROM {self.table} WHERE {where}"
        if not move.archive:
            return [(delete, params)]
        sql = f"WITH moved AS ({delete} RETURNING {self.table}.*) {self._archive_moved()}"
        return [(sql, [*params, *move.archive_params()])]

    def _archive_moved(self) -> str:
        """The INSERT of the CTE ``moved``'s rows into the archive (``archive_params()``)."""
        return (
            f"INSERT INTO {self.archive_table} ({ARCHIVE_COLUMNS}) "
            "SELECT %s, moved.id, moved.group_id, to_jsonb(moved), moved.created_at, "
            f"{self.dialect.now}, %s, %s, COALESCE(%s::jsonb ->> moved.id::text, %s) FROM moved"
        )

    def archive_group_fenced(self, group_id: uuid.UUID, move: Move, fence: QuerySet) -> int | None:
        """One statement: the fence's DELETE, and only if it deleted the group row, the
        move of its rows (a round trip and a statement fewer per group than two)."""
        if fence.db != self.connection.alias:
            return super().archive_group_fenced(group_id, move, fence)
        fence_sql, fence_params = delete_sql(fence)
        where, params = self.group_where(group_id, move)
        moved = (
            f"DELETE FROM {self.table} WHERE {where} AND EXISTS (SELECT FROM fence) "
            f"RETURNING {self.table}.*"
        )
        archive = f", archived AS ({self._archive_moved()})" if move.archive else ""
        archive_params = move.archive_params() if move.archive else []
        row = self.fetchone(
            f"WITH fence AS ({fence_sql} RETURNING 1), moved AS ({moved}){archive} "
            "SELECT (SELECT COUNT(*) FROM fence), (SELECT COUNT(*) FROM moved)",
            [*fence_params, *params, *archive_params],
        )
        assert row is not None
        return int(row[1]) if row[0] else None
