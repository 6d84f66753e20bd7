"""PostgreSQL: SKIP LOCKED claims above the claim floor, ``DELETE … RETURNING`` moves."""

from __future__ import annotations

import uuid
from typing import Any

from django_outbox.db import wake_guard
from django_outbox.db.base import ARCHIVE_COLUMNS, Backlog, BufferOps, Claimed, Move
from django_outbox.models import StreamState
from django_outbox.routing import connection_for


class PostgresBufferOps(BufferOps):
    """A group moves into the archive in one statement: ``DELETE … RETURNING`` in a CTE.

    A claim starts above the stream's claim floor and reports the highest id it took,
    from which the floor advances (:mod:`django_outbox.claim_floor`).
    """

    keeps_claim_floor = True

    def _order(self) -> str:
        return "stream, id" if self.stream is not None else "id"

    def claim_sql(self, floor: int = 0) -> tuple[str, list[Any]]:
        if self.ordered is not None:
            return self.ordered_claim_sql(floor)
        where, params = self.stream_clause()
        pick = self.dialect.id_pick(
            f"SELECT id FROM {self.table} WHERE group_id IS NULL {where} AND id > %s "
            f"ORDER BY {self._order()} LIMIT %s{self.dialect.skip_locked}"
        )
        return (
            f"WITH claimed AS (UPDATE {self.table} SET group_id = %s WHERE {pick} "
            "RETURNING id) SELECT COUNT(*), MAX(id) FROM claimed",
            [*params, floor],
        )

    def insert_event_guarded(
        self,
        stream: str,
        payload_json: str,
        trace_context: str | None = None,
        order_key: str | None = None,
    ) -> tuple[int, bool]:
        if connection_for(StreamState) is not self.connection:
            return super().insert_event_guarded(stream, payload_json, trace_context, order_key)
        columns, values, params = self.event_columns(trace_context, order_key)
        row = self.fetchone(
            f"INSERT INTO {self.table} (created_at, stream, payload{columns}) "
            f"VALUES ({self.dialect.now}, %s, %s{self.dialect.json_cast}{values}) "
            f"RETURNING id, {wake_guard.FUNCTION}(%s)",
            [stream, payload_json, *params, stream],
        )
        assert row is not None
        return int(row[0]), bool(row[1])

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
        sql = (
            f"WITH moved AS ({delete} RETURNING {self.table}.*) "
            f"INSERT INTO {self.archive_table} ({ARCHIVE_COLUMNS}) "
            "SELECT %s, moved.id, moved.group_id, to_jsonb(moved), moved.created_at, "
            f"{self.dialect.now}, %s, %s, COALESCE(%s::jsonb ->> moved.id::text, %s) FROM moved"
        )
        return [(sql, [*params, *move.archive_params()])]
