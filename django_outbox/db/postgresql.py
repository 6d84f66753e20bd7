"""PostgreSQL: SKIP LOCKED claims and single-statement ``DELETE … RETURNING`` moves."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping

from django_outbox.db.base import ARCHIVE_COLUMNS, BufferOps


class PostgresBufferOps(BufferOps):
    """A group moves into the archive in one statement: ``DELETE … RETURNING`` in a CTE."""

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
        delete = f"DELETE FROM {self.table} WHERE group_id = %s"
        delete_params: list[object] = [self.group_param(group_id)]
        if keep:
            keep_clause, keep_params = self.dialect.in_ids(keep, negate=True)
            delete, delete_params = f"{delete} AND {keep_clause}", [*delete_params, *keep_params]
        if not archive:
            return delete, delete_params
        sql = (
            f"WITH moved AS ({delete} RETURNING {self.table}.*) "
            f"INSERT INTO {self.archive_table} ({ARCHIVE_COLUMNS}) "
            "SELECT %s, moved.id, moved.group_id, to_jsonb(moved), moved.created_at, "
            f"{self.dialect.now}, %s, %s, COALESCE(%s::jsonb ->> moved.id::text, %s) FROM moved"
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
