"""PostgreSQL: SKIP LOCKED claims and single-statement ``DELETE … RETURNING`` moves."""

from __future__ import annotations

import uuid
from typing import Any

from django_outbox.db.base import ARCHIVE_COLUMNS, BufferOps, Move


class PostgresBufferOps(BufferOps):
    """A group moves into the archive in one statement: ``DELETE … RETURNING`` in a CTE."""

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
