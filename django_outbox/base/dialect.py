"""One dialect per supported database: the SQL pieces that differ, in one place.

Raw statements are built from these pieces: code asks the dialect what the database
can do rather than which database it is.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model
from django.utils import timezone

from django_outbox.base.routing import connection_for


@dataclass(frozen=True)
class Dialect:
    vendor: str
    #: The database's clock in raw statements, the same as Django's ``Now()``, so
    #: timestamps written by the ORM and by our SQL compare consistently.
    now: str
    #: Appended to a JSON parameter placeholder (``%s{json_cast}``).
    json_cast: str
    #: Appended to a SELECT that picks rows to change: concurrent pickers take disjoint
    #: rows (PostgreSQL); SQLite serializes writers with its database lock instead.
    skip_locked: str
    #: Whether writers wait for each other's whole transaction (SQLite): such a database
    #: needs ``IMMEDIATE`` transactions for concurrent workers (check W001).
    serializes_writers: bool
    #: Whether the tables carry storage parameters and statistics worth tuning
    #: (``outbox_tune``: autovacuum, fillfactor, plans).
    tunable: bool
    #: Appended to the RETURNING list of a statement that is its own transaction: its
    #: commit does not wait for the write-ahead log to reach the disk (PostgreSQL's
    #: ``synchronous_commit = off`` for that transaction alone). A later synchronous
    #: commit on the server flushes it; only a server crash before then can lose it.
    no_flush_wait: str
    #: Appended like :attr:`no_flush_wait`: the rest of the transaction reads its rows in
    #: index order (no bitmap scan, no sort where an index gives the order). Picking the
    #: next n rows of a backlog then costs n index entries, not a sort of the whole
    #: backlog, whatever the planner believes of the table (it has no statistics until
    #: the first ANALYZE, and old ones after a burst).
    index_order: str

    def seconds_from_now(self, seconds: float) -> tuple[str, list[Any]]:
        """SQL for the database's time *seconds* from now, and its parameters."""
        if self.vendor == "postgresql":
            return f"{self.now} + %s * interval '1 second'", [seconds]
        # A signed fixed-point modifier: SQLite reads neither "+-5 seconds" nor "1e+30".
        return "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW', %s)", [f"{seconds:+.6f} seconds"]

    def id_pick(self, select: str) -> str:
        """A WHERE clause matching the ids *select* returns, found by primary key.

        PostgreSQL evaluates an ``ARRAY(…)`` sub-select once; a plain ``IN (SELECT …)``
        may be re-run per outer row or hash-joined with a scan of the whole table.
        """
        return f"id = ANY(ARRAY({select}))" if self.vendor == "postgresql" else f"id IN ({select})"

    def in_ids(self, ids: Sequence[int], *, negate: bool = False) -> tuple[str, list[Any]]:
        """``id IN`` a list given as one parameter, whatever its length."""
        if self.vendor == "postgresql":
            return ("NOT (id = ANY(%s))" if negate else "id = ANY(%s)"), [list(ids)]
        clause = "id NOT IN" if negate else "id IN"
        return f"{clause} (SELECT value FROM json_each(%s))", [json.dumps(list(ids))]


POSTGRESQL = Dialect(
    vendor="postgresql",
    now="statement_timestamp()",
    json_cast="::jsonb",
    skip_locked=" FOR UPDATE SKIP LOCKED",
    serializes_writers=False,
    tunable=True,
    no_flush_wait=", set_config('synchronous_commit', 'off', true)",
    index_order=(
        ", set_config('enable_bitmapscan', 'off', true), set_config('enable_sort', 'off', true)"
    ),
)
SQLITE = Dialect(
    vendor="sqlite",
    now="STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')",
    json_cast="",
    skip_locked="",
    serializes_writers=True,
    tunable=False,
    no_flush_wait="",
    index_order="",
)
DIALECTS = {d.vendor: d for d in (POSTGRESQL, SQLITE)}


def dialect_of(connection: BaseDatabaseWrapper) -> Dialect:
    """The dialect of *connection*; NotImplementedError for an unsupported database."""
    try:
        return DIALECTS[connection.vendor]
    except KeyError:
        raise NotImplementedError(
            f"django_outbox supports PostgreSQL and SQLite, not {connection.vendor!r}."
        ) from None


def supported(connection: BaseDatabaseWrapper) -> Dialect | None:
    """The dialect of *connection*, or None for a database we do not run on."""
    return DIALECTS.get(connection.vendor)


def dialect_for(model: type[Model]) -> Dialect:
    """The dialect of the database that holds *model*."""
    return dialect_of(connection_for(model))


def database_now(alias: str = "default") -> datetime:
    """Return the database's current time as an aware UTC datetime."""
    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {dialect_of(connection).now}".replace("%%", "%"))
        value = cursor.fetchone()[0]
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if timezone.is_aware(value) else value.replace(tzinfo=UTC)


def concrete_field(model: type[Model], name: str) -> Field[Any, Any]:
    """The field *name* of *model* that is a column of its table."""
    field = model._meta.get_field(name)
    if not isinstance(field, Field) or field.column is None:
        raise FieldDoesNotExist(f"{model._meta.label}.{name} is not a column of its table")
    return field


def column_name(field: Field[Any, Any]) -> str:
    """The column of a concrete field (a field without one has no place in a statement)."""
    if field.column is None:
        raise FieldDoesNotExist(f"{field} has no column")
    return field.column
