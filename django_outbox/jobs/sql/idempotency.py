"""SQL of idempotency keys: claim a key in one statement, complete it in another.

``INSERT … ON CONFLICT (scope, key) DO UPDATE … WHERE <expired> RETURNING id`` serves
PostgreSQL and SQLite alike: it inserts a new key, reclaims an expired one, or returns
nothing when a live key exists. On PostgreSQL a concurrent insert of the same key waits
on the unique index until the first transaction ends, then sees its outcome.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django_outbox.base.dialect import dialect_of
from django_outbox.base.routing import connection_for
from django_outbox.models.keys import IdempotencyKey


@dataclass(frozen=True)
class StoredKey:
    id: int
    completed: bool
    result: Any


def _model() -> type[IdempotencyKey]:

    return IdempotencyKey


def claim(scope: str, key: str) -> int | None:
    """Insert (or reclaim an expired) key in the current transaction; its id, or None."""
    model = _model()
    connection = connection_for(model)
    now = dialect_of(connection).now
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (scope, key, created_at) VALUES (%s, %s, {now}) "
            f"ON CONFLICT (scope, key) DO UPDATE SET created_at = {now}, completed_at = NULL, "
            f"expires_at = NULL, result = NULL "
            f"WHERE {table}.expires_at IS NOT NULL AND {table}.expires_at <= {now} "
            "RETURNING id",
            [scope, key],
        )
        row = cursor.fetchone()
    return int(row[0]) if row else None


def stored(scope: str, key: str) -> StoredKey | None:
    """The live key *scope*/*key* as committed by another transaction, if any."""
    model = _model()
    row = (
        model._default_manager.using(connection_for(model).alias)
        .filter(scope=scope, key=key)
        .values_list("id", "completed_at", "result")
        .first()
    )
    if row is None:
        return None
    return StoredKey(id=row[0], completed=row[1] is not None, result=row[2])


def complete(key_id: int, result: Any, ttl_seconds: float) -> None:
    """Mark the key completed with its JSON *result*, expiring *ttl_seconds* from now."""
    model = _model()
    connection = connection_for(model)
    dialect = dialect_of(connection)
    expiry, expiry_params = dialect.seconds_from_now(ttl_seconds)
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET completed_at = {dialect.now}, expires_at = {expiry}, "
            f"result = %s{dialect.json_cast} WHERE id = %s",
            [*expiry_params, json.dumps(result, allow_nan=False), key_id],
        )


def delete_expired_batch(limit: int) -> int:
    """Delete up to *limit* expired keys (by the ``expires_at`` index); how many."""
    model = _model()
    connection = connection_for(model)
    dialect = dialect_of(connection)
    table = connection.ops.quote_name(model._meta.db_table)
    where = dialect.id_pick(
        f"SELECT id FROM {table} WHERE expires_at <= {dialect.now} ORDER BY expires_at LIMIT %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE {where}", [limit])
        return cursor.rowcount


def expires(key_id: int) -> datetime | None:
    model = _model()
    return (
        model._default_manager.using(connection_for(model).alias)
        .filter(id=key_id)
        .values_list("expires_at", flat=True)
        .first()
    )
