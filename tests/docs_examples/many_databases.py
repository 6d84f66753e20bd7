"""The guide to streams on many databases: a sharded application's router, streams and
publish (docs/how-to/many-databases.md).

``tests/streams/test_many_databases.py`` runs it with the test databases as the shards.
"""

from __future__ import annotations

from typing import Any

from django_outbox.streams.batch import Batch

#: What the handler delivered, by stream (the test reads it).
SENT: dict[str, list[Any]] = {}


def sync_orders(batch: Batch) -> None:
    """One handler for the streams of every shard: ``batch.stream`` says which."""
    SENT.setdefault(batch.stream, []).extend(row["payload"] for row in batch.rows("payload"))


# --8<-- [start:router]
class ShardRouter:
    """The application picks a tenant's shard with ``.using(shard)``. Every app is
    migrated on every shard: django_outbox's tables hold each shard's streams."""

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        return None  # None: the default, migrate here


# --8<-- [end:router]


# --8<-- [start:streams]
def shard_streams(shards: list[str]) -> dict[str, dict[str, Any]]:
    """One stream of orders per shard, living on it."""
    return {
        f"orders-{shard}": {
            "HANDLER": "tests.docs_examples.many_databases.sync_orders",
            "DATABASE": shard,
        }
        for shard in shards
    }


# --8<-- [end:streams]


# --8<-- [start:publish]
from django.db import transaction  # noqa: E402

from django_outbox import publish  # noqa: E402


def place_order(shard: str, order: dict[str, Any]) -> None:
    with transaction.atomic(using=shard):
        # ... the order's rows written with .using(shard) ...
        publish(f"orders-{shard}", order)  # on the stream's database: the shard


# --8<-- [end:publish]
