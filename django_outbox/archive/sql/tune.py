"""PostgreSQL catalog queries of ``outbox_tune``: table health, storage parameters, plans."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from django.db.backends.base.base import BaseDatabaseWrapper

if TYPE_CHECKING:
    from django.db.backends.postgresql.base import DatabaseWrapper as PostgresWrapper

PARAMETER = re.compile(r"^autovacuum_[a-z_]+$")


@dataclass(frozen=True)
class TableStats:
    table: str
    total_bytes: int
    live_tuples: int
    dead_tuples: int
    last_autovacuum: datetime | None
    last_autoanalyze: datetime | None
    options: dict[str, str]


def table_stats(connection: BaseDatabaseWrapper, table: str) -> TableStats | None:
    """Size, tuple counts, autovacuum times and storage parameters of *table*."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_total_relation_size(c.oid), COALESCE(s.n_live_tup, 0), "
            "COALESCE(s.n_dead_tup, 0), s.last_autovacuum, s.last_autoanalyze, c.reloptions "
            "FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid "
            "WHERE c.oid = to_regclass(%s)",
            [connection.ops.quote_name(table)],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    size, live, dead, vacuumed, analyzed, options = row
    return TableStats(
        table=table,
        total_bytes=int(size),
        live_tuples=int(live),
        dead_tuples=int(dead),
        last_autovacuum=vacuumed,
        last_autoanalyze=analyzed,
        options=dict(option.split("=", 1) for option in options or ()),
    )


def set_parameters(
    connection: BaseDatabaseWrapper, table: str, parameters: Mapping[str, str]
) -> None:
    """``ALTER TABLE … SET (…)``: names are checked, values are numbers we chose."""
    for name, value in parameters.items():
        if not PARAMETER.match(name) or not re.match(r"^[0-9.]+$", value):
            raise ValueError(f"Refusing storage parameter {name}={value}.")
    assignments = ", ".join(f"{name} = {value}" for name, value in parameters.items())
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {connection.ops.quote_name(table)} SET ({assignments})")


#: Server settings that decide whether autovacuum runs at all, and how often it looks.
SERVER_SETTINGS = ("autovacuum", "track_counts", "autovacuum_naptime", "autovacuum_max_workers")


def server_settings(connection: BaseDatabaseWrapper) -> dict[str, str]:
    """The server's autovacuum settings (``SERVER_SETTINGS``) as PostgreSQL reports them."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", [list(SERVER_SETTINGS)]
        )
        return {name: setting for name, setting in cursor.fetchall()}


def server_version(connection: BaseDatabaseWrapper) -> int:
    """The server's version number, e.g. 160004."""
    connection.ensure_connection()
    return int(cast("PostgresWrapper", connection).pg_version)


def explain(connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any]) -> dict[str, Any]:
    """The planner's plan of *sql* (not executed) as PostgreSQL's JSON tree."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", list(params))
        value = cursor.fetchone()[0]
    plan = json.loads(value) if isinstance(value, (str, bytes)) else value
    return plan[0]["Plan"]


def explain_text(connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any]) -> str:
    """The planner's plan of *sql* (not executed) as text, the way psql shows it."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}", list(params))
        return "\n".join(row[0] for row in cursor.fetchall())
