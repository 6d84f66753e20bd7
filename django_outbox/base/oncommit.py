"""After-commit actions that run once per transaction, whatever the number of requests."""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Any

from django.db import connections, transaction

logger = logging.getLogger(__name__)

_NOTHING = object()


class _Once:
    """An on-commit callback remembered by *key*, so a transaction registers it once.

    With *collect*, the action is called with the items every registration of the
    transaction brought (in order).
    """

    def __init__(self, key: Hashable, action: Callable[..., object], collect: bool) -> None:
        self.key = key
        self.action = action
        self.collect = collect
        self.items: list[Any] = []

    def __call__(self) -> None:
        try:
            self.action(self.items) if self.collect else self.action()
        except Exception:
            # Whatever the action did not do is picked up by the schedules; a failing
            # action must neither break the caller's commit nor the callbacks after it.
            logger.exception("After-commit action %r failed", self.key)


def on_commit_once(
    key: Hashable, action: Callable[..., object], *, using: str, item: Any = _NOTHING
) -> None:
    """Run *action* once the current transaction on *using* commits, once per *key*.

    Within one transaction, later calls with the same *key* add nothing but their
    *item*: with items, the action gets the list of them all. A rolled-back transaction
    runs nothing (its items are dropped with it). Outside a transaction the action runs
    at once. An action that raises is logged and does not stop the callbacks registered
    after it.
    """
    connection = connections[using]
    collect = item is not _NOTHING
    if connection.in_atomic_block:
        for entry in connection.run_on_commit:
            callback = entry[1]
            if isinstance(callback, _Once) and callback.key == key:
                if collect:
                    callback.items.append(item)
                return
    once = _Once(key, action, collect)
    if collect:
        once.items.append(item)
    transaction.on_commit(once, using=using)


def registered(key: Hashable, *, using: str) -> bool:
    """Whether the current transaction on *using* has an action registered by
    :func:`on_commit_once` under *key* (False outside a transaction)."""
    connection = connections[using]
    return connection.in_atomic_block and any(
        isinstance(entry[1], _Once) and entry[1].key == key for entry in connection.run_on_commit
    )
