"""Publish triggers: a row written to an application table publishes an event by itself.

The trigger inserts into the generic buffer inside the statement that wrote the row, so
the event commits or rolls back with it and costs no extra round trip. One trigger per
operation (insert, update, delete); an update publishes only when a listed column
changed.

Key guards: an ordered stream's buffer refuses an UPDATE that changes the key of a row
in a group (:func:`key_guard_statements`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.db.backends.base.base import BaseDatabaseWrapper

from django_outbox.base.dialect import POSTGRESQL, SQLITE, dialect_of

OPERATIONS = ("insert", "update", "delete")


@dataclass(frozen=True)
class TriggerSpec:
    """What a publish trigger writes: from *table*'s *columns* into *buffer* for *stream*."""

    table: str
    buffer: str
    stream: str
    keys: Sequence[str]  # payload keys, the model's field names
    columns: Sequence[str]  # their columns, in the same order
    on: Sequence[str]

    @property
    def base_name(self) -> str:
        """Return a stable identifier of at most 40 characters for this table and stream."""
        digest = hashlib.sha1(f"{self.table}\0{self.stream}".encode()).hexdigest()[:10]
        return f"outbox_pub_{self.table[:18]}_{digest}"

    def trigger_name(self, operation: str) -> str:
        return f"{self.base_name}_{operation[:3]}"


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _payload_pairs(spec: TriggerSpec, qn: Callable[[str], str], row: str, operation: str) -> str:
    pairs = [f"'op', {_literal(operation)}"]
    pairs += [f"{_literal(k)}, {row}.{qn(c)}" for k, c in zip(spec.keys, spec.columns, strict=True)]
    return ", ".join(pairs)


def _changed(spec: TriggerSpec, qn: Callable[[str], str], distinct: str) -> str:
    return " OR ".join(f"OLD.{qn(c)} {distinct} NEW.{qn(c)}" for c in spec.columns)


def _event(spec: TriggerSpec, qn: Callable[[str], str], op: str) -> tuple[str, str]:
    """The trigger's event clause for *op*, and the row its payload is built from."""
    if op == "update":
        return "UPDATE OF " + ", ".join(qn(c) for c in spec.columns), "NEW"
    return op.upper(), "OLD" if op == "delete" else "NEW"


def _vendor(connection: BaseDatabaseWrapper) -> str:
    try:
        return dialect_of(connection).vendor
    except NotImplementedError:
        raise NotImplementedError(
            f"publish triggers support PostgreSQL and SQLite, not {connection.vendor!r}."
        ) from None


def create_statements(connection: BaseDatabaseWrapper, spec: TriggerSpec) -> list[str]:
    """Return the statements that install *spec*'s triggers on *connection*'s database."""
    create = _postgres_create if _vendor(connection) == "postgresql" else _sqlite_create
    return create(spec, connection.ops.quote_name)


def drop_statements(connection: BaseDatabaseWrapper, spec: TriggerSpec) -> list[str]:
    """Return the statements that remove *spec*'s triggers (and function) again."""
    qn = connection.ops.quote_name
    if _vendor(connection) == "sqlite":
        return [f"DROP TRIGGER IF EXISTS {qn(spec.trigger_name(op))}" for op in spec.on]
    return [
        f"DROP TRIGGER IF EXISTS {qn(spec.trigger_name(op))} ON {qn(spec.table)}" for op in spec.on
    ] + [f"DROP FUNCTION IF EXISTS {qn(spec.base_name)}()"]


def _postgres_create(spec: TriggerSpec, qn: Callable[[str], str]) -> list[str]:
    insert = (
        f"INSERT INTO {qn(spec.buffer)} (created_at, stream, payload) "
        f"VALUES ({POSTGRESQL.now}, {_literal(spec.stream)}, "
    )
    branches = []
    for op in spec.on:
        _, row = _event(spec, qn, op)
        branches.append(
            f"IF TG_OP = {_literal(op.upper())} THEN\n"
            f"    {insert}jsonb_build_object({_payload_pairs(spec, qn, row, op)}));\n"
            f"    RETURN NULL;\n  END IF;"
        )
    function = (
        f"CREATE OR REPLACE FUNCTION {qn(spec.base_name)}() RETURNS trigger "
        "LANGUAGE plpgsql AS $outbox$\nBEGIN\n  "
        + "\n  ".join(branches)
        + "\n  RETURN NULL;\nEND\n$outbox$"
    )
    statements = [function]
    for op in spec.on:
        event, _ = _event(spec, qn, op)
        when = f" WHEN ({_changed(spec, qn, 'IS DISTINCT FROM')})" if op == "update" else ""
        statements.append(
            f"CREATE TRIGGER {qn(spec.trigger_name(op))} AFTER {event} ON {qn(spec.table)} "
            f"FOR EACH ROW{when} EXECUTE FUNCTION {qn(spec.base_name)}()"
        )
    return statements


def _sqlite_create(spec: TriggerSpec, qn: Callable[[str], str]) -> list[str]:
    now = SQLITE.now.replace("%%", "%")
    statements = []
    for op in spec.on:
        event, row = _event(spec, qn, op)
        when = f" WHEN {_changed(spec, qn, 'IS NOT')}" if op == "update" else ""
        statements.append(
            f"CREATE TRIGGER {qn(spec.trigger_name(op))} AFTER {event} ON {qn(spec.table)} "
            f"FOR EACH ROW{when} BEGIN "
            f"INSERT INTO {qn(spec.buffer)} (created_at, stream, payload) VALUES ({now}, "
            f"{_literal(spec.stream)}, json_object({_payload_pairs(spec, qn, row, op)})); END"
        )
    return statements


# -- the key guard of ordered streams -------------------------------------------------

#: Why an UPDATE of an ordered row's key is refused (the error's text).
KEY_IN_GROUP = (
    "django_outbox: the ORDER_KEY of a buffer row in a group (claimed, running or "
    "waiting for a retry) cannot change: the claim holds back the key's later rows by "
    "the key's value. Change the key before the row is claimed, or publish a new row."
)


@dataclass(frozen=True)
class KeyGuardSpec:
    """The guard of *table*'s ordered key column *key*: refused while *group* is set."""

    table: str
    key: str
    group: str = "group_id"

    @property
    def name(self) -> str:
        digest = hashlib.sha1(f"{self.table}\0{self.key}".encode()).hexdigest()[:10]
        return f"outbox_key_{self.table[:18]}_{digest}"


def key_guard_statements(connection: BaseDatabaseWrapper, spec: KeyGuardSpec) -> list[str]:
    """The statements that install *spec*'s trigger: an UPDATE that changes the key of a
    row in a group fails (``IntegrityError``). It fires only for an UPDATE that sets the
    key column: the claim, which sets the group, and the archive's DELETE never run it."""
    qn = connection.ops.quote_name
    name, table, key, group = qn(spec.name), qn(spec.table), qn(spec.key), qn(spec.group)
    if _vendor(connection) == "sqlite":
        return [
            f"CREATE TRIGGER {name} BEFORE UPDATE OF {key} ON {table} FOR EACH ROW "
            f"WHEN OLD.{group} IS NOT NULL AND OLD.{key} IS NOT NEW.{key} "
            f"BEGIN SELECT RAISE(ABORT, {_literal(KEY_IN_GROUP)}); END"
        ]
    return [
        f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $outbox$\n"
        f"BEGIN\n  RAISE EXCEPTION USING ERRCODE = 'check_violation', "
        f"MESSAGE = {_literal(KEY_IN_GROUP)}, "
        f"DETAIL = format('The row''s key is %s, its group %s.', OLD.{key}, OLD.{group});"
        "\nEND\n$outbox$",
        f"CREATE TRIGGER {name} BEFORE UPDATE OF {key} ON {table} FOR EACH ROW "
        f"WHEN (OLD.{group} IS NOT NULL AND OLD.{key} IS DISTINCT FROM NEW.{key}) "
        f"EXECUTE FUNCTION {name}()",
    ]


def key_guard_drop_statements(connection: BaseDatabaseWrapper, spec: KeyGuardSpec) -> list[str]:
    """The statements that remove *spec*'s trigger (and function) again."""
    qn = connection.ops.quote_name
    if _vendor(connection) == "sqlite":
        return [f"DROP TRIGGER IF EXISTS {qn(spec.name)}"]
    return [
        f"DROP TRIGGER IF EXISTS {qn(spec.name)} ON {qn(spec.table)}",
        f"DROP FUNCTION IF EXISTS {qn(spec.name)}()",
    ]
