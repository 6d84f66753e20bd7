"""SQLite: the same statements, serialized by the database's write lock.

Use ``"OPTIONS": {"transaction_mode": "IMMEDIATE"}`` so every transaction takes the
write lock when it begins; then concurrent processes claim disjoint groups.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping

from django.db import models

from django_outbox.db.base import ARCHIVE_COLUMNS, BufferOps


class SQLiteBufferOps(BufferOps):
    """A group moves into the archive in two statements: INSERT … SELECT, then DELETE."""

    def snapshot_sql(self) -> str:
        """Return a ``json_object(...)`` expression over the row's concrete columns."""
        parts = []
        for field in self.model._meta.concrete_fields:
            column = self.qn(field.column)
            if isinstance(field, models.JSONField):
                value = f"json({column})"
            elif isinstance(field, models.BinaryField):
                # json_object() takes no blob: the hex form PostgreSQL's to_jsonb() gives.
                value = (
                    f"CASE WHEN {column} IS NULL THEN NULL ELSE '\\x' || lower(hex({column})) END"
                )
            else:
                value = column
            key = field.column.replace("'", "''")
            parts.append(f"'{key}', {value}")
        return f"json_object({', '.join(parts)})"

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
        where, where_params = "group_id = %s", [self.group_param(group_id)]
        if keep:
            keep_clause, keep_params = self.dialect.in_ids(keep, negate=True)
            where, where_params = f"{where} AND {keep_clause}", [*where_params, *keep_params]
        if archive:
            self.execute(
                f"INSERT INTO {self.archive_table} ({ARCHIVE_COLUMNS}) "
                f"SELECT %s, id, group_id, {self.snapshot_sql()}, created_at, "
                f"{self.dialect.now}, %s, %s, COALESCE(json_extract(%s, '$.\"' || id || '\"'), %s) "
                f"FROM {self.table} WHERE {where}",
                [
                    stream,
                    outcome,
                    attempts,
                    json.dumps(dict(row_errors or {})),
                    error,
                    *where_params,
                ],
            )
        return self.execute(f"DELETE FROM {self.table} WHERE {where}", where_params)
