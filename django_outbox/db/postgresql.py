"""PostgreSQL: SKIP LOCKED claims and single-statement ``DELETE … RETURNING`` moves."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping

from django_outbox.db.base import ARCHIVE_COLUMNS, BufferOps

#: The clock of every raw statement: the same as Django's ``Now()`` on PostgreSQL, so
#: timestamps written by the ORM and by our SQL compare consistently inside a transaction.
NOW_SQL = "statement_timestamp()"


def seconds_from_now(seconds: float) -> tuple[str, list[object]]:
    """SQL for the database's time *seconds* from now, and its parameters."""
    return f"{NOW_SQL} + %s * interval '1 second'", [seconds]


class PostgresBufferOps(BufferOps):
    skip_locked = True

    def claim_sql(self, stream: str | None) -> tuple[str, list[object]]:
        """The claim as one statement whose plan never scans the whole buffer.

        The ids come from an ``ARRAY(…)`` sub-select, evaluated once, so the UPDATE finds
        its rows by primary key (a plain ``IN (SELECT …)`` lets the planner hash-join a
        sequential scan of the buffer at mid sizes). For the shared table the sub-select
        orders by ``stream, id`` (the same order, the stream being fixed), which only the
        partial ``(stream, id)`` index of unclaimed rows provides without a sort.
        """
        where, params = self.stream_clause(stream)
        order = "stream, id" if stream is not None else "id"
        sql = (
            f"UPDATE {self.table} SET group_id = %s WHERE id = ANY(ARRAY("
            f"SELECT id FROM {self.table} WHERE group_id IS NULL {where} "
            f"ORDER BY {order} LIMIT %s FOR UPDATE SKIP LOCKED))"
        )
        return sql, params

    def insert_event(self, stream: str, payload_json: str) -> int:
        row = self.fetchone(
            f"INSERT INTO {self.table} (created_at, stream, payload) "
            f"VALUES ({NOW_SQL}, %s, %s::jsonb) RETURNING id",
            [stream, payload_json],
        )
        assert row is not None
        return int(row[0])

    def archive_group(
        self,
        group_id: uuid.UUID,
        *,
        stream: str,
        outcome: str,
        attempts: int,
        error: str = "",
        keep_ids: Iterable[int] = (),
        row_errors: Mapping[str, str] | None = None,
        archive: bool = True,
    ) -> int:
        return self.execute(
            *self.archive_sql(
                group_id,
                stream=stream,
                outcome=outcome,
                attempts=attempts,
                error=error,
                keep_ids=keep_ids,
                row_errors=row_errors,
                archive=archive,
            )
        )

    def archive_sql(
        self,
        group_id: uuid.UUID,
        *,
        stream: str,
        outcome: str,
        attempts: int,
        error: str = "",
        keep_ids: Iterable[int] = (),
        row_errors: Mapping[str, str] | None = None,
        archive: bool = True,
    ) -> tuple[str, list[object]]:
        """The finalize statement: delete the group's rows, moving them into the archive."""
        keep = list(keep_ids)
        keep_clause = "AND NOT (id = ANY(%s))" if keep else ""
        delete = f"DELETE FROM {self.table} WHERE group_id = %s {keep_clause}"
        delete_params: list[object] = [self.group_param(group_id)] + ([keep] if keep else [])
        if not archive:
            return delete, delete_params
        sql = (
            f"WITH moved AS ({delete} RETURNING {self.table}.*) "
            f"INSERT INTO {self.archive_table} ({ARCHIVE_COLUMNS}) "
            f"SELECT %s, moved.id, moved.group_id, to_jsonb(moved), moved.created_at, {NOW_SQL}, "
            "%s, %s, COALESCE(%s::jsonb ->> moved.id::text, %s) FROM moved"
        )
        params = [
            *delete_params,
            stream,
            outcome,
            attempts,
            json.dumps(dict(row_errors or {})),
            error,
        ]
        return sql, params
