"""The interface of the per-vendor buffer operations, and the SQL they share."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model


class BufferOps:
    """Set-based statements over one buffer table (one instance per model and connection).

    Every method runs a constant number of statements whatever the group or backlog
    size. *stream* filters the shared ``OutboxEvent`` table; it is ``None`` for a
    custom buffer model bound to a single stream.
    """

    #: Whether the claim can skip rows locked by a concurrent claim.
    skip_locked = False

    def __init__(self, connection: BaseDatabaseWrapper, model: type[Model]) -> None:
        self.connection = connection
        self.model = model
        qn = connection.ops.quote_name
        self.table = qn(model._meta.db_table)
        self.archive_table = qn(_archive_model()._meta.db_table)
        self.qn = qn
        self.group_field = model._meta.get_field("group_id")

    # -- helpers ---------------------------------------------------------------------

    def group_param(self, group_id: uuid.UUID) -> Any:
        return self.group_field.get_db_prep_value(group_id, self.connection)

    def stream_clause(self, stream: str | None) -> tuple[str, list[Any]]:
        return ("AND stream = %s", [stream]) if stream is not None else ("", [])

    def execute(self, sql: str, params: Iterable[Any]) -> int:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, list(params))
            return cursor.rowcount

    def fetchone(self, sql: str, params: Iterable[Any]) -> tuple[Any, ...] | None:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, list(params))
            return cursor.fetchone()

    # -- the interface ---------------------------------------------------------------

    def claim_sql(self, stream: str | None) -> tuple[str, list[Any]]:
        """Return the single statement that stamps up to n unclaimed rows with a group."""
        where, params = self.stream_clause(stream)
        lock = " FOR UPDATE SKIP LOCKED" if self.skip_locked else ""
        sql = (
            f"UPDATE {self.table} SET group_id = %s WHERE id IN ("
            f"SELECT id FROM {self.table} WHERE group_id IS NULL {where} "
            f"ORDER BY id LIMIT %s{lock})"
        )
        return sql, params

    def claim(self, group_id: uuid.UUID, limit: int, stream: str | None = None) -> int:
        """Stamp up to *limit* unclaimed rows, oldest first, with *group_id*; return how many.

        Must run inside a transaction. Rows another transaction is claiming are skipped
        (PostgreSQL) or wait for it (SQLite, serialized by its write lock).
        """
        sql, where_params = self.claim_sql(stream)
        return self.execute(sql, [self.group_param(group_id), *where_params, limit])

    def count_unclaimed(self, cap: int, stream: str | None = None) -> int:
        """Count unclaimed rows, stopping at *cap*, so the cost never grows past it."""
        where, params = self.stream_clause(stream)
        row = self.fetchone(
            f"SELECT COUNT(*) FROM (SELECT 1 FROM {self.table} "
            f"WHERE group_id IS NULL {where} LIMIT %s) AS backlog",
            [*params, cap],
        )
        return int(row[0]) if row else 0

    def insert_event(self, stream: str, payload_json: str) -> int:
        """Insert one row into the generic buffer; return its id. One statement."""
        raise NotImplementedError

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
        """Archive (when *archive*) and delete the group's rows except *keep_ids*.

        Each archived row gets *error*, or its own entry in *row_errors* (keyed by the
        row id as a string). Returns the number of rows deleted.
        """
        raise NotImplementedError


def _archive_model() -> type[Model]:
    from django_outbox.models import ArchivedEvent

    return ArchivedEvent


ARCHIVE_COLUMNS = (
    "stream, event_id, group_id, data, created_at, archived_at, outcome, attempts, error"
)
