"""Table health and autovacuum tuning for the tables the app owns or is bound to.

Buffer tables are written like a queue: rows are inserted, stamped and deleted in bulk,
all day. PostgreSQL's default autovacuum trigger is a fraction of the table's size
(20 % dead tuples), which a table that is small on average but churns millions of rows
reaches late and at random. The recommendation for such tables is a fixed threshold and
a zero scale factor, so autovacuum follows the churn, not the size. Tables that only
grow and are pruned (archive, idempotency keys) keep PostgreSQL's defaults.

Each table is reported on every database that holds it: a stream's buffer on the
stream's database, the library's stream tables (groups, state, archive, staged jobs) on
every stream database and the router's, the other tables where the router sends them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db import connections, models, router

from django_outbox.archive.sql import tune as sql
from django_outbox.base.dialect import dialect_of
from django_outbox.conf import outbox_settings, stream_databases
from django_outbox.models.archive import ArchivedEvent
from django_outbox.models.groups import OutboxGroup
from django_outbox.models.keys import IdempotencyKey
from django_outbox.models.staged import StagedJob
from django_outbox.models.state import StreamState
from django_outbox.models.unique import all_kinds
from django_outbox.streams.sql import stream_buffer
from django_outbox.streams.sql.base import Move

#: Storage parameters of queue-like tables: vacuum and analyze after a fixed number of
#: changed rows, whatever the table's size.
CHURN_PARAMETERS = {
    "autovacuum_vacuum_scale_factor": "0",
    "autovacuum_vacuum_threshold": "5000",
    "autovacuum_vacuum_insert_scale_factor": "0",
    "autovacuum_vacuum_insert_threshold": "5000",
    "autovacuum_analyze_scale_factor": "0",
    "autovacuum_analyze_threshold": "5000",
}
#: Tables with few rows that change often: a lower threshold.
SMALL_CHURN_PARAMETERS = {
    **CHURN_PARAMETERS,
    "autovacuum_vacuum_threshold": "500",
    "autovacuum_vacuum_insert_threshold": "500",
    "autovacuum_analyze_threshold": "500",
}
#: ``autovacuum_vacuum_insert_*`` exist from PostgreSQL 13 on.
INSERT_PARAMETERS_SINCE = 130000


@dataclass(frozen=True)
class OwnedTable:
    role: str
    model: type[models.Model]
    recommended: dict[str, str] = field(default_factory=dict)
    database: str = "default"

    @property
    def table(self) -> str:
        return self.model._meta.db_table


def owned_tables(database: str | None = None) -> list[OwnedTable]:
    """Every table the app owns or is bound to, once on each database that holds it, with
    its recommendation (on *database* only, when given)."""
    tables: dict[tuple[str, str], OwnedTable] = {}
    stream_aliases = list(stream_databases())

    def add(
        role: str,
        model: type[models.Model],
        recommended: dict[str, str],
        aliases: list[str] | None = None,
    ) -> None:
        for alias in dict.fromkeys(aliases or [router.db_for_write(model)]):
            if alias not in connections.settings or database not in (None, alias):
                continue  # an alias DATABASES lacks is check E025
            key = (alias, model._meta.label)
            if key in tables:
                role_of = f"{tables[key].role}, {role}"
                tables[key] = OwnedTable(role_of, model, recommended, alias)
            else:
                tables[key] = OwnedTable(role, model, recommended, alias)

    for stream in outbox_settings().streams.values():
        add(f"buffer of {stream.name}", stream.model_class, CHURN_PARAMETERS, [stream.alias])
    # The library's stream tables: on every stream database, and the router's.
    library: list[tuple[str, type[models.Model], dict[str, str]]] = [
        ("groups", OutboxGroup, SMALL_CHURN_PARAMETERS),
        ("stream state", StreamState, {}),
        ("archive", ArchivedEvent, {}),
        ("staged jobs", StagedJob, CHURN_PARAMETERS),
    ]
    for role, model, recommended in library:
        add(role, model, recommended, [*stream_aliases, router.db_for_write(model)])
    add("idempotency keys", IdempotencyKey, {})
    for kind in all_kinds():
        add(f"unique jobs {kind._meta.label}", kind, SMALL_CHURN_PARAMETERS)
    order = {alias: n for n, alias in enumerate(connections)}
    return sorted(tables.values(), key=lambda t: order.get(t.database, len(order)))


@dataclass
class TableReport:
    role: str
    table: str
    database: str
    total_bytes: int
    live_tuples: int
    dead_tuples: int
    dead_ratio: float
    last_autovacuum: str | None
    last_autoanalyze: str | None
    options: dict[str, str]
    recommended: dict[str, str]
    missing: dict[str, str]

    @property
    def label(self) -> str:
        """The table, its role and its database, as problem lines name it."""
        return f"{self.table} ({self.role}) on database {self.database!r}"

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _recommended(owned: OwnedTable, version: int) -> dict[str, str]:
    if version >= INSERT_PARAMETERS_SINCE:
        return dict(owned.recommended)
    return {k: v for k, v in owned.recommended.items() if "_insert_" not in k}


def postgres_tables(database: str | None = None) -> list[OwnedTable]:
    return [t for t in owned_tables(database) if dialect_of(connections[t.database]).tunable]


def report(database: str | None = None) -> list[TableReport]:
    """The health of every PostgreSQL table of the app on every database that holds it
    (on *database* only, when given; tables not yet created are left out)."""
    reports = []
    for owned in postgres_tables(database):
        connection = connections[owned.database]
        stats = sql.table_stats(connection, owned.table)
        if stats is None:
            continue
        recommended = _recommended(owned, sql.server_version(connection))
        total = stats.live_tuples + stats.dead_tuples
        reports.append(
            TableReport(
                role=owned.role,
                table=owned.table,
                database=connection.alias,
                total_bytes=stats.total_bytes,
                live_tuples=stats.live_tuples,
                dead_tuples=stats.dead_tuples,
                dead_ratio=round(stats.dead_tuples / total, 4) if total else 0.0,
                last_autovacuum=_iso(stats.last_autovacuum),
                last_autoanalyze=_iso(stats.last_autoanalyze),
                options=stats.options,
                recommended=recommended,
                missing={k: v for k, v in recommended.items() if stats.options.get(k) != v},
            )
        )
    return reports


@dataclass
class ServerReport:
    database: str
    settings: dict[str, str]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def servers(database: str | None = None) -> list[ServerReport]:
    """The autovacuum settings of every PostgreSQL database that holds a table of the app
    (of *database* only, when given)."""
    aliases = dict.fromkeys(t.database for t in postgres_tables(database))
    return [ServerReport(alias, sql.server_settings(connections[alias])) for alias in aliases]


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def apply(database: str | None = None) -> list[str]:
    """Set the missing recommended parameters (on *database* only, when given); return
    one line per table changed."""
    changes = []
    for table in report(database):
        if table.missing:
            sql.set_parameters(connections[table.database], table.table, table.missing)
            settings = ", ".join(f"{k}={v}" for k, v in table.missing.items())
            changes.append(f"{table.table} on database {table.database!r}: set {settings}")
    return changes


def problems(
    reports: list[TableReport],
    *,
    max_dead_ratio: float,
    min_dead: int,
    server_reports: Sequence[ServerReport] = (),
) -> list[str]:
    """One line per problem: autovacuum off (server or table), too many dead tuples,
    recommended parameters missing.
    """
    lines = []
    for server in server_reports:
        if server.settings.get("autovacuum") == "off":
            lines.append(
                f"database {server.database!r}: autovacuum is off on this server, so dead "
                "tuples are never removed automatically and the tables' autovacuum "
                "parameters have no effect; set autovacuum = on in postgresql.conf."
            )
        if server.settings.get("track_counts") == "off":
            lines.append(
                f"database {server.database!r}: track_counts is off, so autovacuum cannot "
                "see dead tuples and the counts above are not maintained; set "
                "track_counts = on in postgresql.conf."
            )
    for table in reports:
        if table.options.get("autovacuum_enabled") in ("false", "off", "0"):
            lines.append(
                f"{table.label}: autovacuum is disabled for this table "
                "(autovacuum_enabled=false); run ALTER TABLE "
                f"{table.table} RESET (autovacuum_enabled)."
            )
        if table.dead_tuples >= min_dead and table.dead_ratio > max_dead_ratio:
            lines.append(
                f"{table.label}: {table.dead_ratio:.0%} dead tuples "
                f"({table.dead_tuples:,} dead, {table.live_tuples:,} live), above "
                f"{max_dead_ratio:.0%}; autovacuum is not keeping up."
            )
        if table.missing:
            lines.append(
                f"{table.label}: autovacuum parameters not tuned, missing "
                + ", ".join(f"{k}={v}" for k, v in table.missing.items())
                + "; run manage.py outbox_tune --apply."
            )
    return lines


# -- query plans -----------------------------------------------------------------------


@dataclass(frozen=True)
class Statement:
    stream: str
    name: str
    table: str
    sql: str
    params: list[Any]
    database: str = "default"


def pipeline_statements(database: str | None = None) -> list[Statement]:
    """The claim, group-fetch and finalize statements of every PostgreSQL stream (of the
    streams on *database* only, when given), each on its stream's database."""
    statements = []
    for stream in outbox_settings().streams.values():
        model = stream.model_class
        alias = stream.alias
        if (database is not None and alias != database) or not dialect_of(
            connections[alias]
        ).tunable:
            continue
        ops = stream_buffer(stream)
        group = uuid.uuid4()
        claim_sql, claim_params = ops.claim_sql()
        table = model._meta.db_table
        statements += [
            Statement(
                stream.name,
                "claim",
                table,
                claim_sql,
                [ops.group_param(group), *claim_params, stream.batch_size],
                alias,
            ),
            Statement(stream.name, "group fetch", table, *ops.group_fetch_sql(group), alias),
            Statement(
                stream.name,
                "finalize",
                table,
                *ops.move_statements(group, Move(stream.name, "done", 1, archive=stream.archive))[
                    -1
                ],
                alias,
            ),
        ]
    return statements


def plan(statement: Statement) -> dict[str, Any]:
    """The JSON plan of *statement* (EXPLAIN without ANALYZE: nothing is executed)."""
    return sql.explain(connections[statement.database], statement.sql, statement.params)


def plan_text(statement: Statement) -> str:
    return sql.explain_text(connections[statement.database], statement.sql, statement.params)


def scans(node: dict[str, Any]) -> Iterator[tuple[str, str, str | None]]:
    """(node type, relation, index) of every scan in a JSON plan tree."""
    if "Relation Name" in node:
        yield node["Node Type"], node["Relation Name"], node.get("Index Name")
    for child in node.get("Plans", ()):
        yield from scans(child)
