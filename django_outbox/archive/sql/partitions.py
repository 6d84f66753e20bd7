"""The SQL of the partitioned archive (PostgreSQL): convert, create ahead, retire, revert.

A partitioned archive is a tree of two levels::

    <table>                  PARTITION BY LIST (outcome), primary key (id, outcome, archived_at)
      <table>_done           PARTITION BY RANGE (archived_at)
        <table>_done_legacy      FROM (MINVALUE) TO (t0): the rows the table held before
        <table>_done_p<start>    one interval each, aligned on the Unix epoch (UTC)
      <table>_failed         PARTITION BY RANGE (archived_at), the same

Done rows and dead letters have retentions of their own, so each outcome has its own
partitions. The interval is recorded as the comment of the parent table, where the
pruner and the system checks read it. Every name and statement is built here; the
migration operation, the pruner and the checks call these functions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.backends.base.base import BaseDatabaseWrapper

#: The outcomes, each with its own range-partitioned subtree.
OUTCOMES = ("done", "failed")
#: The prefix of the parent table's comment that records the interval.
COMMENT_PREFIX = "django_outbox partitioned archive, interval "
#: Units an interval may be given in, in seconds.
UNITS = {"hour": 3600, "day": 86400, "week": 7 * 86400}
_INTERVAL = re.compile(r"^\s*(\d+)\s*(hour|day|week)s?\s*$", re.IGNORECASE)
#: A lock key that serializes partition maintenance of one database ("outbox_p").
_MAINTENANCE_LOCK = 0x6F7574626F785F70


def parse_interval(text: object) -> timedelta:
    """``"1 day"``, ``"6 hours"``, ``"2 weeks"`` as a timedelta; ValueError for anything else."""
    match = _INTERVAL.match(text) if isinstance(text, str) else None
    if match is None or int(match.group(1)) < 1:
        raise ValueError(
            f"{text!r} is not a partition interval: give a whole number of hours, days or "
            'weeks, for example "1 day" or "6 hours".'
        )
    return timedelta(seconds=int(match.group(1)) * UNITS[match.group(2).lower()])


def format_interval(interval: timedelta) -> str:
    seconds = int(interval.total_seconds())
    for unit in ("week", "day", "hour"):
        if seconds % UNITS[unit] == 0:
            count = seconds // UNITS[unit]
            return f"{count} {unit}{'s' if count != 1 else ''}"
    raise ValueError(f"{interval} is not a whole number of hours")


def interval_start(moment: datetime, interval: timedelta) -> datetime:
    """The start of the interval that holds *moment* (intervals aligned on the epoch, UTC)."""
    width = int(interval.total_seconds())
    seconds = int(moment.timestamp()) // width * width
    return datetime.fromtimestamp(seconds, tz=UTC)


def horizon(interval: timedelta, prune_every_minutes: int) -> timedelta:
    """How far ahead partitions are kept: two prune periods and one interval more."""
    return 2 * timedelta(minutes=prune_every_minutes) + interval


@dataclass(frozen=True)
class Partition:
    """One leaf of the tree: its table, outcome and range (``lower`` None for MINVALUE)."""

    name: str
    outcome: str
    lower: datetime | None
    upper: datetime
    detach_pending: bool = False

    @property
    def is_legacy(self) -> bool:
        return self.lower is None


def _qn(connection: BaseDatabaseWrapper, name: str) -> str:
    return connection.ops.quote_name(name)


def subtree(table: str, outcome: str) -> str:
    return f"{table}_{outcome}"


def partition_name(table: str, outcome: str, start: datetime) -> str:
    return f"{table}_{outcome}_p{start:%Y%m%d_%H%M}"


def legacy_name(table: str, outcome: str) -> str:
    return f"{table}_{outcome}_legacy"


def recorded_interval(connection: BaseDatabaseWrapper, table: str) -> str | None:
    """The interval text the parent's comment records; None when *table* is not ours partitioned.

    Returns ``""`` for a partitioned table whose comment records no interval.
    """
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT obj_description(c.oid, 'pg_class') FROM pg_class c "
            "JOIN pg_partitioned_table p ON p.partrelid = c.oid "
            "WHERE c.oid = to_regclass(%s)",
            [_qn(connection, table)],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    comment = row[0] or ""
    return comment[len(COMMENT_PREFIX) :] if comment.startswith(COMMENT_PREFIX) else ""


def is_partitioned(connection: BaseDatabaseWrapper, table: str) -> bool:
    return recorded_interval(connection, table) is not None


def partitions(connection: BaseDatabaseWrapper, table: str) -> list[Partition]:
    """The leaves of both outcomes, oldest first."""
    found = []
    with connection.cursor() as cursor:
        for outcome in OUTCOMES:
            cursor.execute(
                "SELECT c.relname, i.inhdetachpending, "
                "substring(pg_get_expr(c.relpartbound, c.oid) "
                "  FROM 'FROM \\(''([^'']+)''\\)')::timestamptz, "
                "substring(pg_get_expr(c.relpartbound, c.oid) "
                "  FROM 'TO \\(''([^'']+)''\\)')::timestamptz "
                "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = to_regclass(%s)",
                [_qn(connection, subtree(table, outcome))],
            )
            for name, pending, lower, upper in cursor.fetchall():
                found.append(Partition(name, outcome, lower, upper, pending))
    return sorted(found, key=lambda p: (p.outcome, p.upper))


def _indexes(connection: BaseDatabaseWrapper, table: str) -> list[tuple[str, str, bool]]:
    """``(name, definition, is_unique)`` of *table*'s indexes but its primary key."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisunique FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = to_regclass(%s) AND NOT i.indisprimary ORDER BY c.relname",
            [_qn(connection, table)],
        )
        return cursor.fetchall()


def _on_table(definition: str, table: str, connection: BaseDatabaseWrapper) -> str:
    """An index definition of ``pg_get_indexdef`` moved onto *table*."""
    on = f" ON {_qn(connection, table)} USING "
    return re.sub(r" ON (ONLY )?\S+ USING ", on, definition, count=1)


def _next_id(connection: BaseDatabaseWrapper, table: str) -> int | None:
    """The id *table*'s identity would give next; None when it has none."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [_qn(connection, table)])
        sequence = cursor.fetchone()[0]
        if not sequence:
            return None
        cursor.execute(
            f"SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM {sequence}"
        )
        return int(cursor.fetchone()[0])


def _primary_key(connection: BaseDatabaseWrapper, table: str) -> str | None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(%s) AND contype = 'p'",
            [_qn(connection, table)],
        )
        row = cursor.fetchone()
    return row[0] if row else None


def convert_statements(
    connection: BaseDatabaseWrapper, table: str, interval: timedelta, now: datetime
) -> list[str]:
    """The statements that turn the plain *table* into a partitioned one, keeping its rows.

    The table is renamed and becomes the done outcome's legacy partition (its dead
    letters are copied into the failed outcome's legacy partition): no row of the
    usual outcome is rewritten, only the new primary key's index is built and the range
    is validated by one scan. Both legacy partitions end where the interval after *now*
    starts; partitions from there on are created by :func:`ensure_statements`. An empty
    table is simply replaced: no legacy partitions.
    """
    qn = _qn
    old = f"{table}_unpartitioned"
    t0 = interval_start(now, interval) + interval
    indexes = _indexes(connection, table)
    unique = [name for name, _, is_unique in indexes if is_unique]
    if unique:
        raise ValueError(
            f"{table} has unique indexes {unique}: a partitioned table can only enforce "
            "uniqueness over keys that include archived_at and outcome."
        )
    pkey = _primary_key(connection, table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {qn(connection, table)})")
        has_rows = cursor.fetchone()[0]
    next_id = _next_id(connection, table)
    statements = [
        f"LOCK TABLE {qn(connection, table)} IN ACCESS EXCLUSIVE MODE",
        f"ALTER TABLE {qn(connection, table)} RENAME TO {qn(connection, old)}",
    ]
    if pkey:
        statements.append(
            f"ALTER TABLE {qn(connection, old)} DROP CONSTRAINT {qn(connection, pkey)}"
        )
    if next_id is not None:
        statements.append(f"ALTER TABLE {qn(connection, old)} ALTER COLUMN id DROP IDENTITY")
    for name, _, _ in indexes:
        statements.append(
            f"ALTER INDEX {qn(connection, name)} RENAME TO {qn(connection, name[:55] + '_legacy')}"
        )
    statements += [
        f"CREATE TABLE {qn(connection, table)} (LIKE {qn(connection, old)} INCLUDING DEFAULTS "
        "INCLUDING CONSTRAINTS) PARTITION BY LIST (outcome)",
        f"ALTER TABLE {qn(connection, table)} ALTER COLUMN id ADD GENERATED BY DEFAULT AS "
        f"IDENTITY (START WITH {next_id or 1})",
        f"ALTER TABLE {qn(connection, table)} ADD CONSTRAINT {qn(connection, table + '_pkey')} "
        "PRIMARY KEY (id, outcome, archived_at)",
    ]
    statements += [_on_table(definition, table, connection) for _, definition, _ in indexes]
    bound = f"'{t0.isoformat()}'"
    for outcome in OUTCOMES:
        statements.append(
            f"CREATE TABLE {qn(connection, subtree(table, outcome))} PARTITION OF "
            f"{qn(connection, table)} FOR VALUES IN ('{outcome}') PARTITION BY RANGE (archived_at)"
        )
    comment = (
        f"COMMENT ON TABLE {qn(connection, table)} IS '{COMMENT_PREFIX}{format_interval(interval)}'"
    )
    if not has_rows:
        return [*statements, f"DROP TABLE {qn(connection, old)}", comment]
    statements += [
        f"CREATE TABLE {qn(connection, legacy_name(table, 'failed'))} PARTITION OF "
        f"{qn(connection, subtree(table, 'failed'))} FOR VALUES FROM (MINVALUE) TO ({bound})",
        f"INSERT INTO {qn(connection, legacy_name(table, 'failed'))} "
        f"SELECT * FROM {qn(connection, old)} WHERE outcome = 'failed'",
        f"DELETE FROM {qn(connection, old)} WHERE outcome = 'failed'",
        f"ALTER TABLE {qn(connection, subtree(table, 'done'))} ATTACH PARTITION "
        f"{qn(connection, old)} FOR VALUES FROM (MINVALUE) TO ({bound})",
        f"ALTER TABLE {qn(connection, old)} RENAME TO {qn(connection, legacy_name(table, 'done'))}",
        comment,
    ]
    return statements


def revert_statements(connection: BaseDatabaseWrapper, table: str) -> list[str]:
    """The statements that turn the partitioned *table* back into a plain one (copies every row)."""
    qn = _qn
    plain = f"{table}_plain"
    indexes = _indexes(connection, table)
    next_id = _next_id(connection, table) or 1
    statements = [
        f"LOCK TABLE {qn(connection, table)} IN ACCESS EXCLUSIVE MODE",
        f"CREATE TABLE {qn(connection, plain)} (LIKE {qn(connection, table)} INCLUDING DEFAULTS "
        "INCLUDING CONSTRAINTS)",
        f"INSERT INTO {qn(connection, plain)} SELECT * FROM {qn(connection, table)}",
        f"DROP TABLE {qn(connection, table)} CASCADE",
        f"ALTER TABLE {qn(connection, plain)} RENAME TO {qn(connection, table)}",
        f"ALTER TABLE {qn(connection, table)} ALTER COLUMN id ADD GENERATED BY DEFAULT AS "
        f"IDENTITY (START WITH {int(next_id)})",
        f"ALTER TABLE {qn(connection, table)} ADD CONSTRAINT {qn(connection, table + '_pkey')} "
        "PRIMARY KEY (id)",
    ]
    statements += [_on_table(definition, table, connection) for _, definition, _ in indexes]
    return statements


def lock_maintenance(connection: BaseDatabaseWrapper) -> None:
    """Serialize partition maintenance (call inside a transaction)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_MAINTENANCE_LOCK])


def ensure_statements(
    connection: BaseDatabaseWrapper,
    table: str,
    interval: timedelta,
    start: datetime,
    until: datetime,
    existing: list[Partition],
) -> tuple[list[str], list[str]]:
    """Create the partitions of both outcomes from the interval holding *start* to *until*.

    A partition is created as a plain table and attached, which locks the parent only in
    SHARE UPDATE EXCLUSIVE mode (inserts go on). Ranges already covered are skipped.
    Returns the new partitions' names and the statements.
    """
    qn = _qn
    names: list[str] = []
    statements: list[str] = []
    for outcome in OUTCOMES:
        covered = [(p.lower, p.upper) for p in existing if p.outcome == outcome]
        moment = interval_start(start, interval)
        while moment < until:
            end = moment + interval
            overlaps = any(
                (lower is None or lower < end) and moment < upper for lower, upper in covered
            )
            if not overlaps:
                name = partition_name(table, outcome, moment)
                names.append(name)
                statements += [
                    f"CREATE TABLE {qn(connection, name)} (LIKE "
                    f"{qn(connection, subtree(table, outcome))} INCLUDING DEFAULTS "
                    "INCLUDING CONSTRAINTS)",
                    f"ALTER TABLE {qn(connection, subtree(table, outcome))} ATTACH PARTITION "
                    f"{qn(connection, name)} FOR VALUES FROM ('{moment.isoformat()}') "
                    f"TO ('{end.isoformat()}')",
                ]
            moment = end
    return names, statements


def detach_statements(
    connection: BaseDatabaseWrapper, table: str, partition: Partition
) -> list[str]:
    """Detach *partition* without blocking the archive's readers and writers, then drop it.

    ``DETACH … CONCURRENTLY`` runs outside a transaction; one interrupted before its end
    leaves the partition pending, which ``FINALIZE`` completes.
    """
    parent = _qn(connection, subtree(table, partition.outcome))
    name = _qn(connection, partition.name)
    mode = "FINALIZE" if partition.detach_pending else "CONCURRENTLY"
    return [f"ALTER TABLE {parent} DETACH PARTITION {name} {mode}", f"DROP TABLE {name}"]


def execute(connection: BaseDatabaseWrapper, statements: list[str]) -> None:
    with connection.cursor() as cursor:
        for sql in statements:
            cursor.execute(sql)


def delete_due_batch(
    connection: BaseDatabaseWrapper,
    partition: Partition,
    stream: str,
    before: datetime,
    batch_size: int,
) -> int:
    """Delete up to *batch_size* rows of *stream* archived before *before* from one partition."""
    name = _qn(connection, partition.name)
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {name} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {name} "
            "WHERE stream = %s AND archived_at < %s LIMIT %s))",
            [stream, before, batch_size],
        )
        return cursor.rowcount
