"""SQLite: the same statements, serialized by the database's write lock.

Use ``"OPTIONS": {"transaction_mode": "IMMEDIATE"}`` so every transaction takes the
write lock when it begins; then concurrent processes claim disjoint groups.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import models

from django_outbox.base.dialect import column_name
from django_outbox.streams.sql.base import ARCHIVE_COLUMNS, BufferOps, Move


class SQLiteBufferOps(BufferOps):
    """A group moves into the archive in two statements: INSERT … SELECT, then DELETE."""

    def snapshot_sql(self) -> str:
        """Return a ``json_object(...)`` expression over the row's concrete columns."""
        parts = []
        for field in self.model._meta.concrete_fields:
            name = column_name(field)
            quoted = self.qn(name)
            if isinstance(field, models.JSONField):
                value = f"json({quoted})"
            elif isinstance(field, models.BinaryField):
                # json_object() takes no blob: the hex form PostgreSQL's to_jsonb() gives.
                value = (
                    f"CASE WHEN {quoted} IS NULL THEN NULL ELSE '\\x' || lower(hex({quoted})) END"
                )
            else:
                value = quoted
            key = name.replace("'", "''")
            parts.append(f"'{key}', {value}")
        return f"json_object({', '.join(parts)})"

    def move_statements(self, group_id: uuid.UUID, move: Move) -> list[tuple[str, list[Any]]]:
        where, params = self.group_where(group_id, move)
        delete = (f"DELETE FROM {self.table} WHERE {where}", params)
        if not move.archive:
            return [delete]
        insert = (
            f"INSERT INTO {self.archive_table} ({ARCHIVE_COLUMNS}) "
            f"SELECT %s, id, group_id, {self.snapshot_sql()}, created_at, "
            f"{self.dialect.now}, %s, %s, COALESCE(json_extract(%s, '$.\"' || id || '\"'), %s) "
            f"FROM {self.table} WHERE {where}",
            [*move.archive_params(), *params],
        )
        return [insert, delete]
