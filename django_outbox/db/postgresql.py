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
        keep = list(keep_ids)
        keep_clause = "AND NOT (id = ANY(%s))" if keep else ""
        delete = f"DELETE FROM {self.table} WHERE group_id = %s {keep_clause}"
        delete_params: list[object] = [self.group_param(group_id)] + ([keep] if keep else [])
        if not archive:
            return self.execute(delete, delete_params)
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
        return self.execute(sql, params)
